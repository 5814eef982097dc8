"""Sample-quality and path measures for flows: exact 2-Wasserstein distance between point clouds
(POT's network simplex), an unbiased squared maximum mean discrepancy, and straightness of sampled
trajectories (Tong et al. 2023; Liu et al. 2022)."""
from __future__ import annotations

import numpy as np
import ot
import torch

from wsbook.manifolds import Manifold

Tensor = torch.Tensor


def wasserstein2(x: Tensor, y: Tensor, manifold: Manifold | None = None) -> float:
    """Exact W2 between the empirical distributions of ``x`` [N, D] and ``y`` [M, D] (uniform weights),
    with the squared Euclidean (or geodesic, given ``manifold``) ground cost."""
    if x.dim() != 2 or y.dim() != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"wasserstein2: expected [N, D] and [M, D], got {tuple(x.shape)} and {tuple(y.shape)}")
    for name, pts in (("x", x), ("y", y)):
        finite = torch.isfinite(pts).all(-1)
        if not bool(finite.all()):
            rows = (~finite).nonzero().flatten().tolist()
            raise ValueError(f"wasserstein2: {name} contains NaN or inf (rows {rows[:10]}"
                             f"{' ...' if len(rows) > 10 else ''}); the distance is undefined")
    cost = torch.cdist(x, y) ** 2 if manifold is None else manifold.pairwise_sqdist(x, y)
    return wasserstein2_from_costs(cost)


def wasserstein2_from_costs(cost: Tensor, a: Tensor | None = None, b: Tensor | None = None,
                            max_iter: int = 2_000_000) -> float:
    """Exact W2 between two empirical distributions given the squared ground costs ``cost [N, M]`` between
    their points: the square root of the optimal transport cost, by the network simplex of POT (``ot.emd2``,
    costs and weights in float64). The one transport solve behind :func:`wasserstein2` and
    :func:`wsbook.bayes.distances.wasserstein2`.

    Args:
        cost: squared distances from each of the ``N`` points to each of the ``M`` points.
        a, b: probability weights of the points (non-negative, summing to 1); default uniform.
        max_iter: iteration limit of the network simplex.

    Raises:
        ValueError: for weights of the wrong size, negative, or not summing to 1.
        RuntimeError: when the solver does not solve the problem within ``max_iter`` iterations.
    """
    n, m = cost.shape
    a = np.full(n, 1.0 / n) if a is None else a.detach().to("cpu", torch.float64).numpy()
    b = np.full(m, 1.0 / m) if b is None else b.detach().to("cpu", torch.float64).numpy()
    if a.shape != (n,) or b.shape != (m,):
        raise ValueError(f"weights must be [{n}] and [{m}]; got {tuple(a.shape)} and {tuple(b.shape)}")
    if (a < 0).any() or (b < 0).any() or abs(float(a.sum()) - 1) > 1e-6 or abs(float(b.sum()) - 1) > 1e-6:
        raise ValueError("weights must be non-negative and sum to 1")
    costs = cost.detach().to("cpu", torch.float64).numpy()
    value, log = ot.emd2(a, b, costs, numItermax=int(max_iter), log=True)
    if log.get("warning"):
        raise RuntimeError(f"wasserstein2: POT's network simplex did not solve the transport problem: "
                           f"{log['warning']}")
    return float(np.sqrt(max(value, 0.0)))


def mmd2(x: Tensor, y: Tensor, bandwidths: Tensor | list[float] | None = None) -> float:
    """Unbiased estimate of the squared maximum mean discrepancy between the distributions of ``x`` [N, D]
    and ``y`` [M, D] (Gretton et al., 2012), with a sum of Gaussian kernels ``exp(-|a-b|^2 / (2 h^2))``.

    Unlike the empirical W2, whose value for two finite samples of the *same* distribution is a positive
    floor that shrinks slowly with the sample size, this U-statistic has expectation exactly zero when the
    two distributions agree, so its value for two target samples is sampling noise around 0 and a model
    can be compared with 0 directly (it can come out slightly negative). Points on a sphere embedded in
    R^n are compared with the chordal distance, for which the Gaussian kernel is still positive definite.

    Args:
        x: samples ``[N, D]``, N >= 2.
        y: reference samples ``[M, D]``, M >= 2.
        bandwidths: kernel widths ``h``; default: the median pairwise distance within ``y`` times
            (0.25, 0.5, 1, 2), so that every comparison against the same ``y`` uses the same kernel.
    """
    if x.dim() != 2 or y.dim() != 2 or x.shape[1] != y.shape[1] or min(x.shape[0], y.shape[0]) < 2:
        raise ValueError(f"mmd2: expected [N, D] and [M, D] with N, M >= 2; got {tuple(x.shape)} and "
                         f"{tuple(y.shape)}")
    for name, pts in (("x", x), ("y", y)):
        if not bool(torch.isfinite(pts).all()):
            raise ValueError(f"mmd2: {name} contains NaN or inf; the discrepancy is undefined")
    x, y = x.detach().to(torch.float64), y.detach().to(x.device, torch.float64)
    if bandwidths is None:
        d = torch.pdist(y)
        h = d.median() * torch.tensor([0.25, 0.5, 1.0, 2.0], dtype=torch.float64, device=y.device)
    else:
        h = torch.as_tensor(bandwidths, dtype=torch.float64, device=y.device).reshape(-1)
    if not bool((h > 0).all()):
        raise ValueError(f"mmd2: bandwidths must be positive; got {h.tolist()}")

    def kernel(a: Tensor, b: Tensor) -> Tensor:
        sq = torch.cdist(a, b).pow(2).unsqueeze(-1)                    # [n, m, 1]
        return torch.exp(-sq / (2 * h**2)).sum(-1)                     # [n, m]

    n, m = x.shape[0], y.shape[0]
    kxx, kyy, kxy = kernel(x, x), kernel(y, y), kernel(x, y)
    value = ((kxx.sum() - kxx.diagonal().sum()) / (n * (n - 1)) + (kyy.sum() - kyy.diagonal().sum()) / (m * (m - 1))
             - 2 * kxy.mean())
    return float(value)


def straightness(trajectory: Tensor, manifold: Manifold | None = None) -> dict[str, Tensor]:
    """Per-trajectory straightness of ``trajectory`` [T+1, B, D] sampled on a uniform time grid on [0, 1]:

    * ``ratio`` = d(x_0, x_1) / length of the polygonal path (1 for a straight line / geodesic);
    * ``energy_excess`` = ``int_0^1 |dx/dt|^2 dt - d(x_0, x_1)^2`` (>= 0, 0 iff the path is straight and
      traversed at constant speed; Tong et al.'s normalized path energy before normalization).
    """
    if trajectory.dim() != 3 or trajectory.shape[0] < 2:
        raise ValueError(f"straightness: expected [T+1, B, D] with T >= 1, got {tuple(trajectory.shape)}")
    n_steps = trajectory.shape[0] - 1
    a, b = trajectory[:-1], trajectory[1:]
    if manifold is None:
        seg = (b - a).norm(dim=-1)
        chord = (trajectory[-1] - trajectory[0]).norm(dim=-1)
    else:
        seg = manifold.dist(a, b)
        chord = manifold.dist(trajectory[0], trajectory[-1])
    length = seg.sum(0)
    energy = (seg ** 2).sum(0) * n_steps            # sum_k (|dx_k| / dt)^2 dt
    return {"ratio": chord / length.clamp_min(1e-12), "energy_excess": energy - chord ** 2,
            "length": length, "chord": chord}
