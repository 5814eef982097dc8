"""Distances between *sets* of networks: in function space (MMD, predictive diversity) and in weight space
(nearest-neighbour distances, the 2-Wasserstein distance).

A set of networks is represented either by its weights ``[n, D]`` or by its predicted class probabilities
on shared inputs ``[n, N, C]`` (flattened per network to ``[n, N * C]`` for kernel distances). Every function
works on whole sets at once; large pairwise matrices are built in chunks of rows.

* :func:`mmd2`: the squared maximum mean discrepancy with a Gaussian kernel (Gretton et al., 2012), unbiased
  by default, bandwidth from the median heuristic unless given.
* :func:`pairwise_jsd`, :func:`diversity`: the Jensen-Shannon divergence between the predictive distributions
  of two networks, averaged over inputs, for every pair (the "diversity" of the thesis, Table 7.2).
* :func:`nearest_neighbour_distances`, :func:`median_nn_distance`: how close a set lies to another one
  (a generator that replays its training set sits closer to it than held-out samples do).
* :func:`wasserstein2`: the exact 2-Wasserstein distance between two empirical distributions (POT's ``emd2``).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from wsbook import config


def as_features(x: Tensor, name: str = "x") -> Tensor:
    """A set of networks as feature rows: ``[n, F]`` stays, ``[n, N, C]`` (probabilities) becomes ``[n, N * C]``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [n, F] or [n, N, C]; got {type(x).__name__}")
    if x.dim() == 3:
        return x.reshape(x.shape[0], -1)
    if x.dim() != 2:
        raise ValueError(f"{name} must be [n, F] (weights) or [n, N, C] (probabilities); got {tuple(x.shape)}")
    return x


def _pair(x: Tensor, y: Tensor, min_rows: int = 1) -> tuple[Tensor, Tensor]:
    x, y = as_features(x, "x"), as_features(y, "y")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"the two sets have different feature sizes: {tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[0] < min_rows or y.shape[0] < min_rows:
        raise ValueError(f"need at least {min_rows} members in each set; got {x.shape[0]} and {y.shape[0]}")
    return x, y.to(x)


def _sq_dists(x: Tensor, y: Tensor) -> Tensor:
    """Squared Euclidean distances ``[n, m]`` (float64 accumulation, clamped at zero)."""
    x64, y64 = x.to(torch.float64), y.to(torch.float64)
    d = (x64 * x64).sum(1)[:, None] + (y64 * y64).sum(1)[None, :] - 2 * x64 @ y64.T
    return d.clamp_min_(0.0)


def median_bandwidth(x: Tensor, y: Tensor | None = None, max_points: int = 2000,
                     generator: torch.Generator | None = None) -> float:
    """The median heuristic: the median Euclidean distance between distinct members of the pooled set
    ``x`` (and ``y``). Sets larger than ``max_points`` are subsampled (``generator`` picks the rows)."""
    z = as_features(x, "x") if y is None else torch.cat(_pair(x, y))
    if z.shape[0] < 2:
        raise ValueError(f"the median heuristic needs at least 2 members; got {z.shape[0]}")
    if z.shape[0] > max_points:
        gen = generator if generator is not None else config.generator()
        z = z[torch.randperm(z.shape[0], generator=gen)[:max_points].to(z.device)]
    d = _sq_dists(z, z)
    off = ~torch.eye(z.shape[0], dtype=torch.bool, device=z.device)
    h = float(d[off].median().sqrt())
    if not h > 0:
        raise ValueError("all members are identical: the median bandwidth is zero; pass bandwidth explicitly")
    return h


def gaussian_kernel(x: Tensor, y: Tensor, bandwidth: float) -> Tensor:
    """``k(x_i, y_j) = exp(-||x_i - y_j||^2 / (2 h^2))`` for all pairs: ``[n, m]`` (float64)."""
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be positive; got {bandwidth}")
    x, y = _pair(x, y)
    return torch.exp(-_sq_dists(x, y) / (2.0 * bandwidth ** 2))


def mmd2(x: Tensor, y: Tensor, bandwidth: float | None = None, unbiased: bool = True) -> Tensor:
    """Squared maximum mean discrepancy between the sets ``x [n, F]`` and ``y [m, F]`` (or ``[n, N, C]``
    predictive probabilities, flattened per network) with a Gaussian kernel (Gretton et al., 2012).

    Args:
        x, y: the two sets (one member per row).
        bandwidth: kernel bandwidth ``h``; ``None`` uses the median heuristic on the pooled set. To compare
            several MMDs with each other, fix one bandwidth for all of them.
        unbiased: the U-statistic (diagonal terms left out; zero in expectation when both sets come from one
            distribution, so it can be slightly negative) instead of the biased V-statistic.

    Returns a float64 scalar tensor.
    """
    x, y = _pair(x, y, min_rows=2 if unbiased else 1)
    h = median_bandwidth(x, y) if bandwidth is None else float(bandwidth)
    kxx, kyy, kxy = gaussian_kernel(x, x, h), gaussian_kernel(y, y, h), gaussian_kernel(x, y, h)
    n, m = x.shape[0], y.shape[0]
    if unbiased:
        xx = (kxx.sum() - kxx.diagonal().sum()) / (n * (n - 1))
        yy = (kyy.sum() - kyy.diagonal().sum()) / (m * (m - 1))
    else:
        xx, yy = kxx.mean(), kyy.mean()
    return xx + yy - 2 * kxy.mean()


def _entropy(p: Tensor) -> Tensor:
    return -torch.special.xlogy(p, p).sum(-1)


def pairwise_jsd(probs: Tensor, other: Tensor | None = None, max_elements: int = 2 ** 24) -> Tensor:
    """Jensen-Shannon divergence (natural log) between the predictive distributions of every pair of
    networks, averaged over the inputs: ``[n, m]`` for ``probs [n, N, C]`` and ``other [m, N, C]``
    (default: ``probs`` itself). ``JSD(p, q) = H((p + q) / 2) - (H(p) + H(q)) / 2``, in ``[0, log 2]``."""
    if probs.dim() != 3:
        raise ValueError(f"probs must be [n, N, C] class probabilities; got {tuple(probs.shape)}")
    q = probs if other is None else other
    if q.dim() != 3 or q.shape[1:] != probs.shape[1:]:
        raise ValueError(f"other must be [m, {probs.shape[1]}, {probs.shape[2]}]; got {tuple(q.shape)}")
    p64, q64 = probs.to(torch.float64), q.to(torch.float64)
    h_p, h_q = _entropy(p64), _entropy(q64)                                      # [n, N], [m, N]
    rows = max(1, max_elements // max(1, q64.numel()))
    out = []
    for s in range(0, p64.shape[0], rows):                                       # chunks of rows, not networks
        mix = 0.5 * (p64[s:s + rows, None] + q64[None])                          # [r, m, N, C]
        jsd = _entropy(mix) - 0.5 * (h_p[s:s + rows, None] + h_q[None])
        out.append(jsd.mean(-1))
    return torch.cat(out).clamp_min_(0.0)


def diversity(probs: Tensor) -> Tensor:
    """Mean Jensen-Shannon divergence between the predictive distributions of distinct members of a set
    ``probs [n, N, C]`` (thesis 000, Table 7.2, here computed exactly on the class probabilities instead of
    through kernel density estimates): a float64 scalar."""
    n = probs.shape[0] if probs.dim() == 3 else 0
    if n < 2:
        raise ValueError(f"diversity needs probs [n >= 2, N, C]; got {tuple(probs.shape)}")
    d = pairwise_jsd(probs)
    return (d.sum() - d.diagonal().sum()) / (n * (n - 1))


def distances_to_mean(x: Tensor, reference: Tensor) -> Tensor:
    """Euclidean distance of every member of ``x`` to the mean of ``reference`` (networks as feature rows, see
    :func:`as_features`; for probabilities ``[n, N, C]``: the distance of each network's predictions to the
    reference set's mean prediction): ``[n]`` in float64. Its quantiles show the shape that one MMD number
    hides: a sampler with the reference's spread on average can still put too many members near the mean
    and too many far out."""
    x, y = _pair(x, reference)
    return (x.to(torch.float64) - y.to(torch.float64).mean(0)).norm(dim=1)


def nearest_neighbour_distances(query: Tensor, reference: Tensor, exclude_self: bool = False,
                                max_elements: int = 2 ** 24) -> Tensor:
    """Euclidean distance from every row of ``query [n, D]`` to its nearest row of ``reference [m, D]``:
    ``[n]``. With ``exclude_self`` (``query`` is ``reference``) a member's distance to itself is skipped.

    Args:
        query, reference: the two sets (``[n, D]`` and ``[m, D]``).
        exclude_self: skip each member's distance to itself (``query`` and ``reference`` the same set).
        max_elements: size of one chunk of the distance matrix.
    """
    x, y = _pair(query, reference)
    if exclude_self and x.shape != y.shape:
        raise ValueError("exclude_self needs query and reference to be the same set")
    if exclude_self and y.shape[0] < 2:
        raise ValueError("exclude_self needs at least 2 members")
    rows = max(1, max_elements // max(1, y.shape[0]))
    out = []
    for s in range(0, x.shape[0], rows):
        d = _sq_dists(x[s:s + rows], y)
        if exclude_self:
            idx = torch.arange(s, s + d.shape[0], device=d.device)
            d[torch.arange(d.shape[0], device=d.device), idx] = math.inf
        out.append(d.amin(1))
    return torch.cat(out).sqrt()


def median_nn_distance(query: Tensor, reference: Tensor, exclude_self: bool = False) -> Tensor:
    """Median over ``query`` of the distance to the nearest member of ``reference`` (a memorisation check:
    compare generated-to-training with held-out-to-training)."""
    return nearest_neighbour_distances(query, reference, exclude_self=exclude_self).median()


def wasserstein2(x: Tensor, y: Tensor, a: Tensor | None = None, b: Tensor | None = None,
                 max_iter: int = 10_000_000) -> Tensor:
    """Exact 2-Wasserstein distance between the empirical distributions of ``x [n, D]`` and ``y [m, D]``
    (uniform weights unless ``a [n]`` / ``b [m]`` are given), by the network simplex of POT
    (``ot.emd2`` on squared Euclidean costs). Raises if the solver does not converge. A float64 scalar.

    Args:
        x, y: the two point clouds (e.g. aligned weight vectors).
        a, b: probability weights of the points (non-negative, summing to 1).
        max_iter: iteration limit of the network simplex.

    The transport solve is :func:`wsbook.flows.metrics.wasserstein2_from_costs`; :func:`wsbook.flows.wasserstein2`
    is the same distance for point clouds of a flow (costs in the points' dtype, or geodesic on a manifold).
    """
    from wsbook.flows.metrics import wasserstein2_from_costs

    x, y = _pair(x, y)
    value = wasserstein2_from_costs(_sq_dists(x, y), a, b, max_iter=max_iter)
    return torch.tensor(value, dtype=torch.float64)
