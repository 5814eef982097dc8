"""Group actions on whole populations ``[B, D]``: permutations, positive scalings, sign flips.

A *group element* is a list with one entry per hidden layer: a permutation is a LongTensor ``[B, width]``
(new neuron ``i`` takes old neuron ``perm[i]``); a scaling or sign flip is a float tensor ``[B, width]``.
A leading batch of 1 (or no batch axis) broadcasts over the population. All actions are batched over
the population; the only Python loops run over layers. The axes each element acts on come from
:func:`wsbook.symmetry.spec.symmetry_spec`, so the same code acts on MLPs and CNNs.

:func:`act_on_layer_` is the one primitive: it applies one hidden layer's permutation and/or scaling in
place, touching only the slices of the tensors that group acts on. :func:`permute`, :func:`scale`,
:func:`flip_signs` copy the population once and apply it layer by layer. See chapter 5, "The symmetry
group of a network".
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from wsbook.nets import NetSpec
from wsbook.symmetry.spec import Axis, symmetry_spec

Element = Sequence[Tensor]


def _axis_shape(ndim: int, axis: int, batch: int, width: int) -> list[int]:
    """``[batch, 1, ..., width (at axis), ..., 1]``: how a ``[B, width]`` entry broadcasts along ``axis``."""
    shape = [1] * ndim
    shape[0], shape[axis] = batch, width
    return shape


def _param_view(spec: NetSpec, theta: Tensor, ax: Axis) -> Tensor:
    """The view of ``theta [B, D]`` holding the tensor ``ax`` refers to: ``[B, *weight shape]`` or ``[B, out]``."""
    w_sl, b_sl = spec.slices(ax.layer)
    if ax.kind == "b":
        return theta[:, b_sl]
    return theta[:, w_sl].view(theta.shape[0], *spec.layer_shapes[ax.layer])


def check_permutations(perms: Element, widths: Sequence[int], name: str = "perms") -> None:
    """Raise unless every entry is an integer ``[B, width]`` tensor whose rows are permutations of
    ``0..width-1`` (one batched sort per layer), naming the hidden layer and the first bad member."""
    for h, (p, w) in enumerate(zip(perms, widths)):
        if p.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise TypeError(f"{name} for hidden layer {h} must be an integer tensor; got {p.dtype}")
        ok = (p.sort(-1).values == torch.arange(w, device=p.device)).all(-1)
        if not bool(ok.all()):
            bad = int((~ok).nonzero()[0, 0]) if ok.dim() else 0
            row = p[bad] if p.dim() == 2 else p
            shown = row.tolist() if w <= 12 else row[:12].tolist() + ["..."]
            raise ValueError(f"{name} for hidden layer {h} is not a permutation of 0..{w - 1}: "
                             f"member {bad} is {shown}")


def _batch(spec: NetSpec, theta: Tensor, element: Element, name: str, dtype=None) -> tuple[Tensor, list[Tensor]]:
    """Validate an element against the spec and broadcast it and ``theta`` to one batch size."""
    theta = spec.check(theta)
    sym = symmetry_spec(spec)
    if len(element) != len(sym.groups):
        raise ValueError(f"{name} needs one entry per hidden layer ({len(sym.groups)} for {spec}); got {len(element)}")
    out = []
    for g, e in zip(sym.groups, element):
        e = torch.as_tensor(e, device=theta.device)
        if e.dim() == 1:
            e = e.unsqueeze(0)
        if e.dim() != 2 or e.shape[1] != g.width:
            raise ValueError(f"{name} for hidden layer {g.index} must be [B, {g.width}]; got {tuple(e.shape)}")
        out.append(e if dtype is None else e.to(dtype))
    B = max([theta.shape[0]] + [e.shape[0] for e in out])
    for e in out + [theta]:
        if e.shape[0] not in (1, B):
            raise ValueError(f"batch sizes do not broadcast: theta has {theta.shape[0]} networks, "
                             f"{name} has entries with {[e.shape[0] for e in out]}")
    return theta.expand(B, -1), [e.expand(B, -1) for e in out]


def act_on_layer_(spec: NetSpec, theta: Tensor, layer: int, *, perm: Tensor | None = None,
                  scale: Tensor | None = None) -> Tensor:
    """Apply hidden layer ``layer``'s permutation ``perm [B, w]`` and/or scaling ``scale [B, w]`` to the
    population ``theta [B, D]`` **in place** and return it.

    Only the tensors that group acts on are touched (``W_l`` rows, ``b_l``, ``W_{l+1}`` columns), so
    applying one layer's element costs the size of those tensors, not of the whole population. The
    permutation is applied before the scaling (``scale`` is indexed by the new neuron order). No
    validation: ``theta`` must be a writable ``[B, D]`` tensor (not an expanded view) and the entries
    ``[B, w]`` valid elements (see :func:`permute` and :func:`scale`, which check and then call this).

    Args:
        spec: the architecture.
        theta: population ``[B, D]``, modified in place.
        layer: index of the hidden layer (0 = the first hidden layer).
        perm: new neuron ``i`` takes old neuron ``perm[:, i]``; ``None`` for no permutation.
        scale: per-neuron factors: incoming weights and bias are multiplied, outgoing weights divided.
    """
    g = symmetry_spec(spec).groups[layer]
    B = theta.shape[0]
    for ax in g.axes:
        t = _param_view(spec, theta, ax)
        axis = ax.dim + 1
        shape = _axis_shape(t.dim(), axis, B, g.width)
        if perm is not None:
            t.copy_(t.gather(axis, perm.reshape(shape).expand(t.shape)))
        if scale is not None:
            t.mul_((scale if ax.side == "in" else 1.0 / scale).reshape(shape))
    return theta


def random_permutation(spec: NetSpec, n: int, generator: torch.Generator | None = None,
                       device: torch.device | str | None = None) -> list[Tensor]:
    """``n`` uniformly random elements of the permutation group ``prod_l S_{width_l}`` (argsort of uniforms).

    ``generator=None`` draws from torch's global generator (seeded by :func:`wsbook.seed_everything`)."""
    return [torch.rand(n, w, generator=generator).argsort(1).to(device or "cpu") for w in symmetry_spec(spec).widths]


def random_signs(spec: NetSpec, n: int, generator: torch.Generator | None = None,
                 device: torch.device | str | None = None) -> list[Tensor]:
    """``n`` random sign-flip elements (each neuron flipped with probability 1/2), ``[n, width]`` of +-1."""
    return [((torch.rand(n, w, generator=generator) < 0.5).float() * 2 - 1).to(device or "cpu")
            for w in symmetry_spec(spec).widths]


def random_scales(spec: NetSpec, n: int, generator: torch.Generator | None = None,
                  low: float = 0.25, high: float = 4.0, device: torch.device | str | None = None) -> list[Tensor]:
    """``n`` random positive scalings, log-uniform in ``[low, high]`` (the ReLU scaling group).

    Args:
        spec: the architecture.
        n: number of elements.
        generator: randomness (``None``: torch's global generator).
        low, high: range of the factors.
        device: where the elements live (default CPU).
    """
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high; got low={low}, high={high}")
    lo, hi = torch.log(torch.tensor(low)), torch.log(torch.tensor(high))
    return [torch.exp(lo + (hi - lo) * torch.rand(n, w, generator=generator)).to(device or "cpu")
            for w in symmetry_spec(spec).widths]


def inverse_permutation(perms: Element) -> list[Tensor]:
    """The inverse element: ``inv[perm[i]] = i`` for every layer."""
    return [p.argsort(-1) for p in perms]


def compose(first: Element, second: Element) -> list[Tensor]:
    """The permutation that applies ``first`` and then ``second``: ``permute(permute(t, first), second)``."""
    return [torch.gather(f.expand(max(f.shape[0], s.shape[0]), -1), -1,
                         s.expand(max(f.shape[0], s.shape[0]), -1)) for f, s in zip(first, second)]


def permute(spec: NetSpec, theta: Tensor, perms: Element) -> Tensor:
    """Apply a permutation element to a population (Ainsworth et al., 2023, eq. 1): for every hidden
    layer, ``W_l <- P W_l``, ``b_l <- P b_l``, ``W_{l+1} <- W_{l+1} P^T`` with ``P[i, perm[i]] = 1``
    (for a CNN, ``W_l``'s filters and ``W_{l+1}``'s input channels). Raises ``ValueError`` naming the
    layer when an entry is not a permutation."""
    theta, perms = _batch(spec, theta, perms, "perms")
    check_permutations(perms, symmetry_spec(spec).widths)
    out = theta.clone(memory_format=torch.contiguous_format)
    for h, p in enumerate(perms):
        act_on_layer_(spec, out, h, perm=p.long())
    return out


def permute_soft(spec: NetSpec, theta: Tensor, matrices: Sequence[Tensor]) -> Tensor:
    """Apply (soft) permutation matrices ``[B, w, w]`` by batched products: ``W_l <- P_l W_l P_{l-1}^T``, ``b_l <- P_l b_l``
    (the relaxed action used by Sinkhorn re-basin, Pena et al., 2023). Hard one-hot matrices give :func:`permute`.
    Differentiable in ``theta`` and the matrices."""
    theta = spec.check(theta)
    sym = symmetry_spec(spec)
    if len(matrices) != len(sym.groups):
        raise ValueError(f"need {len(sym.groups)} matrices; got {len(matrices)}")
    B = max([theta.shape[0]] + [P.shape[0] if P.dim() == 3 else 1 for P in matrices])
    ws, bs = list(spec.weights(theta.expand(B, -1))), list(spec.biases(theta.expand(B, -1)))
    for g, P in zip(sym.groups, matrices):
        if P.shape[-2:] != (g.width, g.width):
            raise ValueError(f"matrix for hidden layer {g.index} must be [B, {g.width}, {g.width}]; got {tuple(P.shape)}")
        for ax in g.axes:
            if ax.kind == "b":
                bs[ax.layer] = (P @ bs[ax.layer].unsqueeze(2)).squeeze(2)            # einsum bij,bj->bi
                continue
            # the acted-on axis first, then P on it: rows give P W, columns W P^T (input channels alike)
            w = ws[ax.layer].movedim(ax.dim + 1, 1)                                   # [B, w, ...]
            moved = P @ w.reshape(w.shape[0], g.width, -1)
            ws[ax.layer] = moved.reshape(moved.shape[0], *w.shape[1:]).movedim(1, ax.dim + 1)
    return spec.pack(ws, bs)


def scale(spec: NetSpec, theta: Tensor, scales: Element, check: bool = True) -> Tensor:
    """Apply a per-neuron scaling: incoming weights and bias times ``s``, outgoing weights divided by ``s``.

    For ReLU any ``s > 0`` keeps the function (positive homogeneity); for tanh and sine only ``s = +-1``
    (odd activations). With ``check`` a scaling that is not a symmetry of ``spec`` raises ``ValueError``.

    Args:
        spec: the architecture.
        theta: population ``[B, D]`` (or ``[1, D]``, broadcast over the element's batch).
        scales: one ``[B, width]`` (or ``[width]``) float tensor per hidden layer.
        check: refuse scalings that change the function.
    """
    theta, scales = _batch(spec, theta, scales, "scales", dtype=theta.dtype)
    kind = symmetry_spec(spec).scaling
    if check:
        for s in scales:
            if kind == "positive" and not bool((s > 0).all()):
                raise ValueError("ReLU networks are invariant only to positive scalings; got a scale <= 0")
            if kind == "sign" and not bool((s.abs() == 1).all()):
                raise ValueError(f"{spec.activation} networks are invariant only to sign flips (+-1); got other scales")
            if kind is None:
                raise ValueError(f"{spec.activation} networks have no per-neuron scaling symmetry")
    out = theta.clone(memory_format=torch.contiguous_format)
    for h, s in enumerate(scales):
        act_on_layer_(spec, out, h, scale=s)
    return out


def flip_signs(spec: NetSpec, theta: Tensor, signs: Element) -> Tensor:
    """Apply sign flips ``s in {-1, +1}`` (the symmetry of odd activations: tanh, sine)."""
    if symmetry_spec(spec).scaling != "sign":
        raise ValueError(f"sign flips are a symmetry of tanh and sine networks, not of {spec.activation}")
    return scale(spec, theta, signs)


def function_difference(spec: NetSpec, theta_a: Tensor, theta_b: Tensor, x: Tensor) -> Tensor:
    """Per-member relative output difference ``max |f_a(x) - f_b(x)| / max |f_a(x)|``, ``[B]``
    (zero, up to rounding, when the two populations compute the same functions)."""
    a, b = spec.check(theta_a, "theta_a"), spec.check(theta_b, "theta_b")
    with torch.no_grad():
        fa, fb = spec.forward(a, x), spec.forward(b, x)
    if fa.shape != fb.shape:
        fa, fb = torch.broadcast_tensors(fa, fb)
    return (fa - fb).abs().flatten(1).amax(1) / fa.abs().flatten(1).amax(1).clamp_min(1e-12)
