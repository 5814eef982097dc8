"""Sample-quality and path measures for flows: exact 2-Wasserstein distance between point clouds
(POT's network simplex) and straightness of sampled trajectories (Tong et al. 2023; Liu et al. 2022)."""
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
    m = cost.detach().to("cpu", torch.float64).numpy()
    a, b = np.full(x.shape[0], 1.0 / x.shape[0]), np.full(y.shape[0], 1.0 / y.shape[0])
    value, log = ot.emd2(a, b, m, numItermax=2_000_000, log=True)
    if log.get("warning"):
        raise RuntimeError(f"wasserstein2: POT did not converge: {log['warning']}")
    return float(np.sqrt(max(value, 0.0)))


def straightness(trajectory: Tensor, manifold: Manifold | None = None) -> dict[str, Tensor]:
    """Per-trajectory straightness of ``trajectory`` [T+1, B, D] sampled on a uniform time grid on [0, 1]:

    * ``ratio`` = d(x_0, x_1) / length of the polygonal path (1 for a straight line / geodesic);
    * ``energy_excess`` = int_0^1 |dx/dt|^2 dt - d(x_0, x_1)^2 (>= 0, 0 iff the path is straight and
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
