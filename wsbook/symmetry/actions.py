"""Group actions on whole populations ``[B, D]``: permutations, positive scalings, sign flips.

A *group element* is a list with one entry per hidden layer: a permutation is a LongTensor ``[B, width]``
(new neuron ``i`` takes old neuron ``perm[i]``); a scaling or sign flip is a float tensor ``[B, width]``.
A leading batch of 1 (or no batch axis) broadcasts over the population. All actions are batched over
the population; the only Python loops run over layers. The axes each element acts on come from
:func:`wsbook.symmetry.spec.symmetry_spec`.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from wsbook.nets import MLPSpec
from wsbook.symmetry.spec import symmetry_spec

Element = Sequence[Tensor]


def _unpack(spec: MLPSpec, theta: Tensor) -> tuple[list[Tensor], list[Tensor | None]]:
    return list(spec.weights(theta)), list(spec.biases(theta))


def _batch(spec: MLPSpec, theta: Tensor, element: Element, name: str, dtype=None) -> tuple[Tensor, list[Tensor]]:
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


def random_permutation(spec: MLPSpec, n: int, generator: torch.Generator | None = None,
                       device: torch.device | str | None = None) -> list[Tensor]:
    """``n`` uniformly random elements of the permutation group ``prod_l S_{width_l}`` (argsort of uniforms)."""
    return [torch.rand(n, w, generator=generator).argsort(1).to(device or "cpu") for w in symmetry_spec(spec).widths]


def random_signs(spec: MLPSpec, n: int, generator: torch.Generator | None = None) -> list[Tensor]:
    """``n`` random sign-flip elements (each neuron flipped with probability 1/2), ``[n, width]`` of +-1."""
    return [(torch.rand(n, w, generator=generator) < 0.5).float() * 2 - 1 for w in symmetry_spec(spec).widths]


def random_scales(spec: MLPSpec, n: int, generator: torch.Generator | None = None,
                  low: float = 0.25, high: float = 4.0) -> list[Tensor]:
    """``n`` random positive scalings, log-uniform in ``[low, high]`` (the ReLU scaling group)."""
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high; got low={low}, high={high}")
    lo, hi = torch.log(torch.tensor(low)), torch.log(torch.tensor(high))
    return [torch.exp(lo + (hi - lo) * torch.rand(n, w, generator=generator)) for w in symmetry_spec(spec).widths]


def inverse_permutation(perms: Element) -> list[Tensor]:
    """The inverse element: ``inv[perm[i]] = i`` for every layer."""
    return [p.argsort(-1) for p in perms]


def compose(first: Element, second: Element) -> list[Tensor]:
    """The permutation that applies ``first`` and then ``second``: ``permute(permute(t, first), second)``."""
    return [torch.gather(f.expand(max(f.shape[0], s.shape[0]), -1), -1,
                         s.expand(max(f.shape[0], s.shape[0]), -1)) for f, s in zip(first, second)]


def permute(spec: MLPSpec, theta: Tensor, perms: Element) -> Tensor:
    """Apply a permutation element to a population (Ainsworth et al., 2023, eq. 1): for every hidden
    layer, ``W_l <- P W_l``, ``b_l <- P b_l``, ``W_{l+1} <- W_{l+1} P^T`` with ``P[i, perm[i]] = 1``."""
    theta, perms = _batch(spec, theta, perms, "perms")
    for p in perms:
        if p.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"permutations must be integer tensors; got {p.dtype}")
    ws, bs = _unpack(spec, theta)
    for g, p in zip(symmetry_spec(spec).groups, perms):
        p = p.long()
        for ax in g.axes:
            if ax.kind == "b":
                bs[ax.layer] = bs[ax.layer].gather(1, p)
            elif ax.dim == 0:
                w = ws[ax.layer]
                ws[ax.layer] = w.gather(1, p.unsqueeze(2).expand(-1, -1, w.shape[2]))
            else:
                w = ws[ax.layer]
                ws[ax.layer] = w.gather(2, p.unsqueeze(1).expand(-1, w.shape[1], -1))
    return spec.pack(ws, bs)


def permute_soft(spec: MLPSpec, theta: Tensor, matrices: Sequence[Tensor]) -> Tensor:
    """Apply (soft) permutation matrices ``[B, w, w]`` by batched products: ``W_l <- P_l W_l P_{l-1}^T``, ``b_l <- P_l b_l``
    (the relaxed action used by Sinkhorn re-basin, Pena et al., 2023). Hard one-hot matrices give :func:`permute`."""
    theta = spec.check(theta)
    sym = symmetry_spec(spec)
    if len(matrices) != len(sym.groups):
        raise ValueError(f"need {len(sym.groups)} matrices; got {len(matrices)}")
    ws, bs = _unpack(spec, theta)
    for g, P in zip(sym.groups, matrices):
        if P.shape[-2:] != (g.width, g.width):
            raise ValueError(f"matrix for hidden layer {g.index} must be [B, {g.width}, {g.width}]; got {tuple(P.shape)}")
        for ax in g.axes:
            if ax.kind == "b":
                bs[ax.layer] = (P @ bs[ax.layer].unsqueeze(2)).squeeze(2)        # einsum bij,bj->bi
            elif ax.dim == 0:
                ws[ax.layer] = P @ ws[ax.layer]                                   # einsum bij,bjk->bik
            else:
                ws[ax.layer] = ws[ax.layer] @ P.transpose(1, 2)                   # einsum bkj,bij->bki
    return spec.pack(ws, bs)


def scale(spec: MLPSpec, theta: Tensor, scales: Element, check: bool = True) -> Tensor:
    """Apply a per-neuron scaling: incoming weights and bias times ``s``, outgoing weights divided by ``s``.

    For ReLU any ``s > 0`` keeps the function (positive homogeneity); for tanh and sine only ``s = +-1``
    (odd activations). With ``check`` a scaling that is not a symmetry of ``spec`` raises ``ValueError``.
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
    ws, bs = _unpack(spec, theta)
    for g, s in zip(symmetry_spec(spec).groups, scales):
        for ax in g.axes:
            factor = s if ax.side == "in" else 1.0 / s
            if ax.kind == "b":
                bs[ax.layer] = bs[ax.layer] * factor
            elif ax.dim == 0:
                ws[ax.layer] = ws[ax.layer] * factor.unsqueeze(2)
            else:
                ws[ax.layer] = ws[ax.layer] * factor.unsqueeze(1)
    return spec.pack(ws, bs)


def flip_signs(spec: MLPSpec, theta: Tensor, signs: Element) -> Tensor:
    """Apply sign flips ``s in {-1, +1}`` (the symmetry of odd activations: tanh, sine)."""
    if symmetry_spec(spec).scaling != "sign":
        raise ValueError(f"sign flips are a symmetry of tanh and sine networks, not of {spec.activation}")
    return scale(spec, theta, signs)


def function_difference(spec: MLPSpec, theta_a: Tensor, theta_b: Tensor, x: Tensor) -> Tensor:
    """Per-member relative output difference ``max |f_a(x) - f_b(x)| / max |f_a(x)|``, ``[B]``
    (zero, up to rounding, when the two populations compute the same functions)."""
    a, b = spec.check(theta_a, "theta_a"), spec.check(theta_b, "theta_b")
    with torch.no_grad():
        fa, fb = spec.forward(a, x), spec.forward(b, x)
    if fa.shape != fb.shape:
        fa, fb = torch.broadcast_tensors(fa, fb)
    return (fa - fb).abs().flatten(1).amax(1) / fa.abs().flatten(1).amax(1).clamp_min(1e-12)
