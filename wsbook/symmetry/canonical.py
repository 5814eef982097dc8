"""Canonical representatives of ReLU networks (Pittorino et al., 2022): break the scaling symmetry by
putting every hidden neuron's ``[incoming weights, bias]`` on the unit sphere (compensating the outgoing
weights), and the permutation symmetry by aligning to a reference (or by sorting). The result lives on a
product of spheres; :func:`sphere_blocks` describes it for :class:`wsbook.manifolds.Product`.

For classifiers the last layer ``[W_L, b_L]`` is scaled to Frobenius norm ``sqrt(C)``: this changes the
logits by a positive factor and keeps every predicted label; for regression it is left as it is, and the
canonical network computes exactly the same function.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from wsbook.nets import MLPSpec
from wsbook.symmetry.actions import permute, scale
from wsbook.symmetry.spec import symmetry_spec

TASKS = ("classification", "regression")


def _check(spec: MLPSpec, task: str) -> None:
    if symmetry_spec(spec).scaling != "positive":
        raise ValueError(f"sphere canonicalization needs a positively homogeneous activation (relu); got {spec.activation}")
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}; got {task!r}")


def _rows(spec: MLPSpec, theta: Tensor, layer: int) -> Tensor:
    """``[B, out, in (+1)]``: each neuron's incoming weights with its bias appended."""
    w = spec.weights(theta)[layer]
    if not spec.bias:
        return w
    return torch.cat([w, spec.biases(theta)[layer].unsqueeze(2)], 2)


def normalize_neurons(spec: MLPSpec, theta: Tensor, task: str = "classification") -> Tensor:
    """Scale every hidden neuron's ``[w_in, b]`` to unit norm, layer by layer, multiplying its outgoing
    weights by the old norm (a ReLU scaling symmetry); then the last layer to norm ``sqrt(C)`` for
    classifiers (Pittorino et al., 2022). Dead neurons (zero incoming weights) are left as they are."""
    _check(spec, task)
    theta = spec.check(theta)
    widths = symmetry_spec(spec).widths
    B = theta.shape[0]
    for h in range(len(widths)):
        norms = _rows(spec, theta, h).norm(dim=2)
        s = torch.where(norms > 0, 1.0 / norms.clamp_min(1e-30), torch.ones_like(norms))
        theta = scale(spec, theta, [s if k == h else torch.ones(B, w, dtype=theta.dtype, device=theta.device)
                                    for k, w in enumerate(widths)])
    if task == "classification":
        w_sl, b_sl = spec.slices(spec.n_layers - 1)
        last = slice(w_sl.start, b_sl.stop if b_sl is not None else w_sl.stop)
        norm = theta[:, last].norm(dim=1, keepdim=True).clamp_min(1e-30)
        theta = theta.clone()
        theta[:, last] = theta[:, last] * (math.sqrt(spec.widths[-1]) / norm)
    return theta


def sort_neurons(spec: MLPSpec, theta: Tensor) -> tuple[list[Tensor], Tensor]:
    """A reference-free permutation canonical form: order each hidden layer's neurons by decreasing norm of
    their outgoing weights (applied to normalized networks this norm is the neuron's scale). Returns
    ``(perms, sorted)``."""
    theta = spec.check(theta)
    perms = []
    for h in range(len(symmetry_spec(spec).widths)):
        current = permute(spec, theta, perms + [torch.arange(w).expand(theta.shape[0], w).to(theta.device)
                                                for w in symmetry_spec(spec).widths[h:]])
        out_norm = spec.weights(current)[h + 1].norm(dim=1)                     # [B, w_h]
        perms.append(torch.argsort(out_norm, dim=1, descending=True, stable=True))
    return perms, permute(spec, theta, perms)


def canonicalize(spec: MLPSpec, theta: Tensor, reference: Tensor | None = None, *, task: str = "classification",
                 max_iter: int = 100) -> Tensor:
    """The canonical representative of every network of ``theta`` (Pittorino et al., 2022; thesis ch. 4):
    normalize the neurons (:func:`normalize_neurons`), then fix the permutation by weight matching to the
    normalized ``reference`` or, without one, by :func:`sort_neurons`. Idempotent; for ``regression`` the
    function is unchanged, for ``classification`` the predicted labels are."""
    from wsbook.symmetry.matching import weight_matching

    normed = normalize_neurons(spec, theta, task)
    if reference is None:
        return sort_neurons(spec, normed)[1]
    ref = normalize_neurons(spec, spec.check(reference, "reference"), task)
    return weight_matching(spec, ref, normed, max_iter=max_iter)[1]


# ---------------------------------------------------------- product of spheres
def sphere_blocks(spec: MLPSpec, task: str = "classification") -> tuple[list[tuple[str, int, int]], Tensor]:
    """The product-of-spheres structure of canonical networks, for ``wsbook.manifolds.Product.from_blocks``.

    Blocks: per hidden layer ``("sphere", width, fan_in + 1)`` (one unit sphere per neuron's ``[w_in, b]``),
    then the output layer as ``("sphere", 1, C (fan_in + 1))`` for classifiers (radius ``sqrt(C)`` rescaled
    to 1 by :func:`to_spheres`) or ``("euclidean", 1, ...)`` for regression. Also returns ``index [D]``, the
    permutation of coordinates with ``blocked = theta[:, index]`` (inverse: ``index.argsort()``).
    """
    _check(spec, task)
    blocks, index = [], []
    for layer, (o, i) in enumerate(spec.layer_shapes):
        w_sl, b_sl = spec.slices(layer)
        w_idx = torch.arange(w_sl.start, w_sl.stop).view(o, i)
        rows = torch.cat([w_idx, torch.arange(b_sl.start, b_sl.stop).view(o, 1)], 1) if b_sl is not None else w_idx
        if layer < spec.n_layers - 1:
            blocks.append(("sphere", o, rows.shape[1]))
            index.append(rows.reshape(-1))
        else:
            end = b_sl.stop if b_sl is not None else w_sl.stop
            blocks.append(("sphere" if task == "classification" else "euclidean", 1, end - w_sl.start))
            index.append(torch.arange(w_sl.start, end))
    return blocks, torch.cat(index)


def to_spheres(spec: MLPSpec, theta: Tensor, task: str = "classification", atol: float = 1e-4) -> Tensor:
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


def from_spheres(spec: MLPSpec, points: Tensor, task: str = "classification") -> Tensor:
    """The inverse of :func:`to_spheres`: ordinary flat weights ``[B, D]`` of the network at each point."""
    blocks, index = sphere_blocks(spec, task)
    points = spec.check(points, "points")
    out = points.clone()
    if task == "classification":
        start = sum(n * d for _, n, d in blocks[:-1])
        out[:, start:] = out[:, start:] * math.sqrt(spec.widths[-1])
    return out[:, index.argsort().to(points.device)]


def sphere_distance(spec: MLPSpec, theta_a: Tensor, theta_b: Tensor, task: str = "classification") -> Tensor:
    """Geodesic distance on the product of spheres between canonical networks (``[B]``):
    ``sqrt(sum_factors arccos(<u, v>)^2)``, with the angle computed as ``2 atan2(|u - v|, |u + v|)`` (plus the Euclidean part for regression)."""
    blocks, _ = sphere_blocks(spec, task)
    a, b = to_spheres(spec, theta_a, task), to_spheres(spec, theta_b, task)
    a, b = torch.broadcast_tensors(a, b)
    total, start = torch.zeros(a.shape[0], dtype=a.dtype, device=a.device), 0
    for kind, n, d in blocks:
        ua, ub = a[:, start:start + n * d].view(-1, n, d), b[:, start:start + n * d].view(-1, n, d)
        if kind == "sphere":
            angle = 2 * torch.atan2((ua - ub).norm(dim=2), (ua + ub).norm(dim=2))   # stable arccos<u, v>
            total = total + angle.pow(2).sum(1)
        else:
            total = total + (ua - ub).pow(2).sum((1, 2))
        start += n * d
    return total.sqrt()


def product_manifold(spec: MLPSpec, task: str = "classification"):
    """The :class:`wsbook.manifolds.Product` of spheres that canonical networks of ``spec`` live on
    (coordinates as produced by :func:`to_spheres`)."""
    from wsbook.manifolds import Product   # imported lazily: manifolds does not depend on symmetry

    return Product.from_blocks(sphere_blocks(spec, task)[0])
