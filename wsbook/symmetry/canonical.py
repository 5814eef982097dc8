"""Canonical representatives of networks (Pittorino et al., 2022): break the scaling symmetry of ReLU
networks by putting every hidden neuron's ``[incoming weights, bias]`` on the unit sphere (compensating the
outgoing weights), and the permutation symmetry by aligning to a reference (or by sorting). The result
lives on a product of spheres; :func:`sphere_blocks` describes it for :class:`wsbook.manifolds.Product`.
For odd activations (tanh, sine), :func:`sign_canonicalize` picks one member of every sign orbit.

Everything reads the axes of :func:`wsbook.symmetry.symmetry_spec`, so MLPs and CNNs (a hidden channel's
filter and bias form one sphere factor) are handled by the same code.

For classifiers the last layer ``[W_L, b_L]`` is scaled to Frobenius norm ``sqrt(C)``: this changes the
logits by a positive factor and keeps every predicted label; for regression it is left as it is, and the
canonical network computes exactly the same function. See chapter 5, "Canonical representatives".
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from wsbook.manifolds import Product
from wsbook.nets import NetSpec, check_task
from wsbook.symmetry.actions import act_on_layer_, permute
from wsbook.symmetry.spec import symmetry_spec


def _check(spec: NetSpec, task: str) -> None:
    if symmetry_spec(spec).scaling != "positive":
        raise ValueError(f"sphere canonicalization needs a positively homogeneous activation (relu); got {spec.activation}")
    check_task(task)


def _group_rows(spec: NetSpec, tensors: dict, h: int, side: str) -> Tensor:
    """``[B, w, K]``: for hidden group ``h``, each neuron's entries on the axes of ``side`` ("in": its filter or
    incoming weights followed by its bias; "out": its outgoing weights), flattened. ``tensors[(kind, layer)]``
    holds the per-layer tensors ``[B, ...]`` (weights, biases or flat index maps)."""
    parts = []
    for ax in symmetry_spec(spec).groups[h].axes:
        if ax.side != side:
            continue
        t = tensors[(ax.kind, ax.layer)].movedim(ax.dim + 1, 1)
        parts.append(t.reshape(t.shape[0], t.shape[1], -1))
    return torch.cat(parts, 2) if len(parts) > 1 else parts[0]


def _views(spec: NetSpec, theta: Tensor) -> dict:
    ws, bs = spec.weights(theta), spec.biases(theta)
    out = {("W", l): w for l, w in enumerate(ws)}
    out.update({("b", l): b for l, b in enumerate(bs) if b is not None})
    return out


def _last_layer(spec: NetSpec) -> slice:
    w_sl, b_sl = spec.slices(spec.n_layers - 1)
    return slice(w_sl.start, b_sl.stop if b_sl is not None else w_sl.stop)


def neuron_norms(spec: NetSpec, theta: Tensor) -> list[Tensor]:
    """The norm of every hidden neuron's ``[w_in, b]`` (for a CNN channel: its filter and bias), one ``[B, width]``
    tensor per hidden layer: the scale that the ReLU scaling symmetry moves freely between a neuron's incoming
    and outgoing weights."""
    views = _views(spec, spec.check(theta))
    return [_group_rows(spec, views, h, "in").norm(dim=2) for h in range(len(symmetry_spec(spec).groups))]


def rescale_neurons(spec: NetSpec, theta: Tensor, norms: float | Tensor | list) -> Tensor:
    """The same networks with every hidden neuron's ``[w_in, b]`` scaled to norm ``norms`` and its outgoing
    weights scaled inversely (a ReLU scaling symmetry: the function is unchanged), layer by layer.

    ``norms``: one number for all neurons, or one per hidden layer (numbers or tensors broadcasting to
    ``[B, width]``, e.g. the mean of :func:`neuron_norms` over a population whose scale convention is wanted:
    canonical networks have unit incoming norms, which plain SGD handles badly). Dead neurons (zero incoming
    weights) are left as they are. The population is copied once and rescaled in place."""
    _check(spec, "classification")
    out = spec.check(theta).clone(memory_format=torch.contiguous_format)
    n_groups = len(symmetry_spec(spec).groups)
    per_layer = list(norms) if isinstance(norms, (list, tuple)) else [norms] * n_groups
    if len(per_layer) != n_groups:
        raise ValueError(f"rescale_neurons: {len(per_layer)} norms for {n_groups} hidden layers of {spec}")
    for h, target in enumerate(per_layer):
        current = _group_rows(spec, _views(spec, out), h, "in").norm(dim=2)
        s = torch.where(current > 0, torch.as_tensor(target).to(current) / current.clamp_min(1e-30),
                        torch.ones_like(current))
        if not torch.isfinite(s).all() or (s <= 0).any():
            raise ValueError("rescale_neurons: norms must be positive and finite")
        act_on_layer_(spec, out, h, scale=s)
    return out


def normalize_neurons(spec: NetSpec, theta: Tensor, task: str = "classification") -> Tensor:
    """Scale every hidden neuron's ``[w_in, b]`` to unit norm, layer by layer, multiplying its outgoing
    weights by the old norm (a ReLU scaling symmetry, :func:`rescale_neurons`); then the last layer to norm
    ``sqrt(C)`` for classifiers (Pittorino et al., 2022). Dead neurons (zero incoming weights) are left as
    they are."""
    _check(spec, task)
    out = rescale_neurons(spec, theta, 1.0)
    if task == "classification":
        last = _last_layer(spec)
        norm = out[:, last].norm(dim=1, keepdim=True).clamp_min(1e-30)
        out[:, last] *= math.sqrt(spec.widths[-1]) / norm
    return out


def sort_neurons(spec: NetSpec, theta: Tensor) -> tuple[list[Tensor], Tensor]:
    """A reference-free permutation canonical form: order each hidden layer's neurons by decreasing norm of
    their outgoing weights (applied to normalized networks this norm is the neuron's scale). Returns
    ``(perms, sorted)``.

    The norm of a neuron's outgoing weights does not depend on how the next layer is ordered, so all
    layers are sorted from the input population at once and the permutation is applied in one pass."""
    theta = spec.check(theta)
    views = _views(spec, theta)
    perms = [torch.argsort(_group_rows(spec, views, h, "out").norm(dim=2), dim=1, descending=True, stable=True)
             for h in range(len(symmetry_spec(spec).groups))]
    return perms, permute(spec, theta, perms)


def sign_canonicalize(spec: NetSpec, theta: Tensor) -> Tensor:
    """Flip every hidden neuron whose bias is negative, so that all hidden biases become ``>= 0``: one
    representative per sign orbit of an odd-activation network (tanh, sine), for nonzero biases. A network
    and any sign-flipped copy map to the same weights, so any function of the result is exactly
    sign-invariant (used by the INR encoder of chapter 6). The function is unchanged."""
    if symmetry_spec(spec).scaling != "sign":
        raise ValueError(f"sign canonicalization is for odd activations (tanh, sine); {spec} uses {spec.activation}")
    if not spec.bias:
        raise ValueError(f"sign canonicalization reads the hidden biases; {spec} has none")
    out = spec.check(theta).clone(memory_format=torch.contiguous_format)
    biases = spec.biases(theta)
    for h in range(len(symmetry_spec(spec).groups)):   # a layer's flips do not touch another layer's biases
        act_on_layer_(spec, out, h, scale=torch.where(biases[h] < 0, -1.0, 1.0).to(out))
    return out


def canonicalize(spec: NetSpec, theta: Tensor, reference: Tensor | None = None, *, task: str = "classification",
                 max_iter: int = 100, restarts: int = 0, generator: torch.Generator | None = None) -> Tensor:
    """The canonical representative of every network of ``theta`` (Pittorino et al., 2022; thesis ch. 4).

    Normalize the neurons (:func:`normalize_neurons`), then fix the permutation by weight matching to the
    normalized ``reference`` or, without one, by :func:`sort_neurons`. Idempotent; for ``regression`` the
    function is unchanged, for ``classification`` the predicted labels are.

    Args:
        spec: the architecture (ReLU MLP or CNN).
        theta: population ``[B, D]``.
        reference: one network ``[D]`` / ``[1, D]`` (or one per member) to align to; ``None`` sorts neurons.
        task: ``"classification"`` or ``"regression"`` (how the last layer is treated).
        max_iter: most sweeps of weight matching.
        restarts: random restarts of weight matching; with the default 0 weight matching is deterministic,
            so the canonical form is a function of the network alone (any permuted copy, and the canonical
            form itself, map to the same point).
        generator: randomness of weight matching's restarts (``None``: torch's global generator).
    """
    from wsbook.symmetry.matching import weight_matching

    normed = normalize_neurons(spec, theta, task)
    if reference is None:
        return sort_neurons(spec, normed)[1]
    ref = normalize_neurons(spec, spec.check(reference, "reference"), task)
    return weight_matching(spec, ref, normed, max_iter=max_iter, restarts=restarts, generator=generator).aligned


# ---------------------------------------------------------- product of spheres
def sphere_blocks(spec: NetSpec, task: str = "classification") -> tuple[list[tuple[str, int, int]], Tensor]:
    """The product-of-spheres structure of canonical networks, for ``wsbook.manifolds.Product.from_blocks``.

    Blocks: per hidden layer ``("sphere", width, fan_in + 1)`` (one unit sphere per neuron's ``[w_in, b]``;
    for a CNN channel, its flattened filter and bias), then the output layer as ``("sphere", 1, size)`` for
    classifiers (radius ``sqrt(C)`` rescaled to 1 by :func:`to_spheres`) or ``("euclidean", 1, size)`` for
    regression. Also returns ``index [D]``, the permutation of coordinates with ``blocked = theta[:, index]``
    (inverse: ``index.argsort()``). The rows are read from the symmetry spec's incoming axes.
    """
    _check(spec, task)
    flat = spec.weights(torch.arange(spec.n_params).unsqueeze(0))     # the flat index of every entry
    biases = spec.biases(torch.arange(spec.n_params).unsqueeze(0))
    views = {("W", l): w for l, w in enumerate(flat)}
    views.update({("b", l): b for l, b in enumerate(biases) if b is not None})
    blocks, index = [], []
    for h, g in enumerate(symmetry_spec(spec).groups):
        rows = _group_rows(spec, views, h, "in")[0]                    # [w, fan_in (+1)]
        blocks.append(("sphere", g.width, rows.shape[1]))
        index.append(rows.reshape(-1))
    last = _last_layer(spec)
    blocks.append(("sphere" if task == "classification" else "euclidean", 1, last.stop - last.start))
    index.append(torch.arange(last.start, last.stop))
    index = torch.cat(index)
    if index.numel() != spec.n_params or not torch.equal(index.sort().values, torch.arange(spec.n_params)):
        raise ValueError(f"the hidden layers' incoming axes and the last layer do not tile the parameters of {spec}")
    return blocks, index


def to_spheres(spec: NetSpec, theta: Tensor, task: str = "classification", atol: float = 1e-4) -> Tensor:
    """Coordinates of canonical (normalized) networks on the product of unit spheres, ``[B, D]`` in the block
    layout of :func:`sphere_blocks`. Raises ``ValueError`` for a network that is not normalized."""
    blocks, index = sphere_blocks(spec, task)
    theta = spec.check(theta)
    out = theta[:, index.to(theta.device)].clone()
    C = spec.widths[-1]
    start = 0
    for kind, n, d in blocks[:-1]:
        norms = out[:, start:start + n * d].view(-1, n, d).norm(dim=2)
        if not torch.allclose(norms, torch.ones_like(norms), atol=atol):
            raise ValueError(f"theta is not canonical: hidden neuron norms range over [{norms.min():.4g}, "
                             f"{norms.max():.4g}], expected 1 (call normalize_neurons or canonicalize first)")
        start += n * d
    if task == "classification":
        norms = out[:, start:].norm(dim=1)
        if not torch.allclose(norms, torch.full_like(norms, math.sqrt(C)), atol=atol * math.sqrt(C)):
            raise ValueError(f"theta is not canonical: last-layer norms in [{norms.min():.4g}, {norms.max():.4g}], "
                             f"expected sqrt(C) = {math.sqrt(C):.4g}")
        out[:, start:] = out[:, start:] / math.sqrt(C)
    return out


def from_spheres(spec: NetSpec, points: Tensor, task: str = "classification") -> Tensor:
    """The inverse of :func:`to_spheres`: ordinary flat weights ``[B, D]`` of the network at each point."""
    blocks, index = sphere_blocks(spec, task)
    points = spec.check(points, "points")
    out = points.clone()
    if task == "classification":
        start = sum(n * d for _, n, d in blocks[:-1])
        out[:, start:] = out[:, start:] * math.sqrt(spec.widths[-1])
    return out[:, index.argsort().to(points.device)]


def sphere_distance(spec: NetSpec, theta_a: Tensor, theta_b: Tensor, task: str = "classification") -> Tensor:
    """Geodesic distance on the product of spheres between canonical networks (``[B]``): the distance of
    :func:`product_manifold`, ``sqrt(sum_factors arccos(<u, v>)^2)`` (plus the Euclidean part for regression)."""
    a, b = torch.broadcast_tensors(to_spheres(spec, theta_a, task), to_spheres(spec, theta_b, task))
    return product_manifold(spec, task).dist(a, b)


def product_manifold(spec: NetSpec, task: str = "classification") -> Product:
    """The :class:`wsbook.manifolds.Product` of spheres that canonical networks of ``spec`` live on
    (coordinates as produced by :func:`to_spheres`)."""
    return Product.from_blocks(sphere_blocks(spec, task)[0])
