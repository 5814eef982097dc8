"""Couplings q(x0, x1) for conditional flow matching: independent pairs and minibatch exact optimal
transport (Tong et al. 2023, "Improving and generalizing flow-based generative models with minibatch
optimal transport"; Fatras et al. 2021), solved exactly: by SciPy's Hungarian method
(``linear_sum_assignment``) for small batches, by POT's network simplex (``ot.emd``) above.
"""
from __future__ import annotations

import numpy as np
import ot
import torch
from scipy.optimize import linear_sum_assignment

from wsbook.manifolds import Manifold

Tensor = torch.Tensor


def _check_pair(x0: Tensor, x1: Tensor) -> None:
    if not (isinstance(x0, Tensor) and isinstance(x1, Tensor)):
        raise TypeError(f"coupling: expected two tensors, got {type(x0).__name__} and {type(x1).__name__}")
    if x0.dim() != 2 or x1.dim() != 2 or x0.shape != x1.shape:
        raise ValueError(f"coupling: expected two batches of equal shape [B, D], got {tuple(x0.shape)} and "
                         f"{tuple(x1.shape)}")


class IndependentCoupling:
    """q(x0, x1) = p0(x0) p1(x1): pairs the two minibatches as they come (both are i.i.d. draws)."""

    name = "independent"

    def __call__(self, x0: Tensor, x1: Tensor) -> tuple[Tensor, Tensor]:
        _check_pair(x0, x1)
        return x0, x1


#: largest batch assigned by SciPy's Hungarian method: up to about 64 points it is as fast as or faster than
#: the network simplex, whose set-up over all n^2 arcs dominates there (benchmarks/bench_ot.py)
HUNGARIAN_MAX_BATCH = 64


def ot_assignment(cost: Tensor, numitermax: int = 1_000_000) -> Tensor:
    """Exact OT assignment between two equal-size uniform batches: the permutation ``perm`` minimising
    sum_i cost[i, perm[i]] (a vertex of the Birkhoff polytope), found by SciPy's Hungarian method for up to
    ``HUNGARIAN_MAX_BATCH`` points and by POT's network simplex above. Both are exact, so they return the
    same permutation whenever the optimum is unique.

    Raises ``RuntimeError`` if the solver does not reach an optimal permutation (never falls back).
    """
    if cost.dim() != 2 or cost.shape[0] != cost.shape[1]:
        raise ValueError(f"ot_assignment: expected a square cost matrix, got shape {tuple(cost.shape)}")
    n = cost.shape[0]
    m = cost.detach().to("cpu", torch.float64).numpy()
    if not np.isfinite(m).all():
        raise ValueError("ot_assignment: the cost matrix contains NaN or inf")
    if n <= HUNGARIAN_MAX_BATCH:
        return torch.as_tensor(linear_sum_assignment(m)[1], device=cost.device)
    # POT's network simplex reports an infeasible problem when every cost is far below zero (the inner
    # products of OTCoupling between batches away from the origin); subtracting each row's minimum makes the
    # costs nonnegative and changes every assignment's total by the same amount
    m = m - m.min(1, keepdims=True)
    a = np.full(n, 1.0 / n)
    # the marginals are equal by construction and the dual potentials are not used, so POT's marginal check
    # and dual centring (more than the solve itself costs at small batches) are skipped; the plan is the same
    plan, log = ot.emd(a, a, m, numItermax=numitermax, log=True, center_dual=False, check_marginals=False)
    if log.get("result_code", 1) != 1 or log.get("warning"):
        raise RuntimeError(f"ot_assignment: POT's exact solver failed (code {log.get('result_code')}: "
                           f"{log.get('warning')}); refusing to fall back to the independent coupling")
    perm = plan.argmax(1)
    # a permutation: every column taken once, each with mass 1/n (np.allclose's tolerance, written out)
    mass = plan[np.arange(n), perm]
    if np.bincount(perm, minlength=n).max(initial=0) > 1 or np.abs(mass - 1.0 / n).max(initial=0.0) > 1e-9 + 1e-5 / n:
        raise RuntimeError("ot_assignment: the optimal plan is not a permutation (degenerate solve)")
    return torch.as_tensor(perm, device=cost.device, dtype=torch.long)


class OTCoupling:
    """Minibatch exact OT coupling: re-pairs x1 to x0 by the assignment minimising the summed squared
    distance (on ``manifold``'s geodesic distance when one is given, else squared Euclidean)."""

    name = "ot"

    def __init__(self, manifold: Manifold | None = None):
        self.manifold = manifold

    def cost(self, x0: Tensor, x1: Tensor) -> Tensor:
        """``[B, B]`` squared-distance cost matrix."""
        if self.manifold is None:
            return torch.cdist(x0, x1) ** 2
        return self.manifold.pairwise_sqdist(x0, x1)

    def __call__(self, x0: Tensor, x1: Tensor) -> tuple[Tensor, Tensor]:
        _check_pair(x0, x1)
        with torch.no_grad():
            if self.manifold is None:
                # sum_i |x0_i - x1_perm(i)|^2 = (sum of all squared norms) - 2 sum_i <x0_i, x1_perm(i)>, so the
                # inner products alone have the same optimal assignment, and without the norms both solvers
                # reach it sooner (benchmarks/bench_ot.py); at least float32, as half precision would round them
                dtype = torch.promote_types(x0.dtype, torch.float32)
                cost = -(x0.to(dtype) @ x1.to(dtype).T)
            else:
                cost = self.manifold.pairwise_sqdist(x0, x1)
            perm = ot_assignment(cost)
        return x0, x1[perm]


def coupling_cost(x0: Tensor, x1: Tensor, manifold: Manifold | None = None) -> Tensor:
    """Mean squared distance of paired points, (1/B) sum_i d(x0_i, x1_i)^2."""
    _check_pair(x0, x1)
    if manifold is None:
        return ((x1 - x0) ** 2).sum(-1).mean()
    return (manifold.dist(x0, x1) ** 2).mean()


def make_coupling(name: str, manifold: Manifold | None = None):
    """``"independent"`` or ``"ot"`` by name."""
    if name == "independent":
        return IndependentCoupling()
    if name == "ot":
        return OTCoupling(manifold)
    raise ValueError(f"make_coupling: expected 'independent' or 'ot', got {name!r}")
