"""Sampling by integrating dx/dt = v(t, x): Euclidean ODEs through torchdiffeq (euler, midpoint, rk4,
dopri5) and, on manifolds, exp-map steps that keep the iterates on M (Chen & Lipman 2024):

* ``euler``: ``x <- exp_x(h v(t, x))`` (order 1);
* ``midpoint``: the midpoint stage's velocity projected onto the tangent space at ``x`` (order 2);
* ``rk4``: classical Runge-Kutta in normal coordinates around ``x`` (Runge-Kutta-Munthe-Kaas with the
  Riemannian exponential; Munthe-Kaas 1999): every stage velocity ``v`` at ``y = exp_x(z)`` is pulled back
  to the tangent space at ``x`` by the inverse differential of the exponential, ``dexpinv_x(z, v)``, so the
  four stages are those of RK4 on the smooth ODE ``dz/dt = dexpinv_x(z, v(t, exp_x(z)))`` and the step
  ``exp_x(h (k1 + 2 k2 + 2 k3 + k4) / 6)`` keeps fourth order. Projecting the stage velocities instead
  (or transporting them in parallel) loses O(|z|^2) curvature terms and leaves a second-order method.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torchdiffeq import odeint

from wsbook.manifolds import Euclidean, Manifold

Tensor = torch.Tensor
FIXED = ("euler", "midpoint", "rk4")
METHODS = FIXED + ("dopri5",)


@dataclass
class ODEResult:
    """Final state ``x``, the states at ``times`` (``trajectory[k]``, when requested) and the number of
    vector-field evaluations ``nfe``."""

    x: Tensor
    trajectory: Tensor | None
    times: Tensor | None
    nfe: int


class _Counted:
    def __init__(self, fn):
        self.fn, self.nfe = fn, 0

    def __call__(self, t, x):
        self.nfe += 1
        return self.fn(t, x)


def _check(method: str, steps: int, t0: float, t1: float) -> None:
    if method not in METHODS:
        raise ValueError(f"solve_ode: method must be one of {METHODS}, got {method!r}")
    if method in FIXED and (not isinstance(steps, int) or steps < 1):
        raise ValueError(f"solve_ode: fixed-step method {method!r} needs steps >= 1, got {steps!r}")
    for name, v in (("t0", t0), ("t1", t1)):
        if not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"solve_ode: {name} must lie in [0, 1], got {v}")


def manifold_step(manifold: Manifold, fn: Callable, t: float, x: Tensor, h: float, method: str):
    """One step of size ``h`` (may be negative) on ``manifold``. ``fn(t, x)`` returns ``(v, extra)``
    where ``extra`` is a per-sample scalar rate (e.g. the divergence) integrated alongside, or ``None``.
    Returns ``(x_next, integral of extra over the step)``."""
    m = manifold
    if method == "euler":
        v, e = fn(t, x)
        return m.expmap(x, h * v), (None if e is None else h * e)
    if method == "midpoint":
        v1, _ = fn(t, x)
        v2, e2 = fn(t + h / 2, m.expmap(x, (h / 2) * v1))
        return m.expmap(x, h * m.proju(x, v2)), (None if e2 is None else h * e2)
    if method == "rk4":
        # RK4 in normal coordinates z around x: the stages live in T_x M (see the module docstring)
        def stage(tt: float, z: Tensor):
            v, e = fn(tt, m.expmap(x, z))
            return m.dexpinv(x, z, v), e

        k1, e1 = fn(t, x)
        k1 = m.proju(x, k1)
        k2, e2 = stage(t + h / 2, (h / 2) * k1)
        k3, e3 = stage(t + h / 2, (h / 2) * k2)
        k4, e4 = stage(t + h, h * k3)
        v = (k1 + 2 * k2 + 2 * k3 + k4) / 6
        e = None if e1 is None else h * (e1 + 2 * e2 + 2 * e3 + e4) / 6
        return m.expmap(x, h * v), e
    raise ValueError(f"manifold_step: method must be one of {FIXED}, got {method!r}")


@torch.no_grad()
def solve_ode(field: Callable[[Tensor, Tensor], Tensor], x0: Tensor, *, t0: float = 0.0, t1: float = 1.0,
              method: str = "euler", steps: int = 20, manifold: Manifold | None = None,
              return_trajectory: bool = False, rtol: float = 1e-5, atol: float = 1e-5) -> ODEResult:
    """Integrate dx/dt = field(t, x) from ``t0`` to ``t1`` in ``steps`` equal steps (or adaptively for
    ``dopri5``, Euclidean only). On a non-Euclidean ``manifold`` the steps are exp-map steps and the
    starting points are checked to lie on it."""
    _check(method, steps, t0, t1)
    if x0.dim() != 2:
        raise ValueError(f"solve_ode: expected x0 of shape [B, D], got {tuple(x0.shape)}")
    counted = _Counted(field)
    if manifold is None or isinstance(manifold, Euclidean):
        if manifold is not None and x0.shape[1] != manifold.dim:
            raise ValueError(f"solve_ode: x0 has {x0.shape[1]} coordinates, manifold has {manifold.dim}")
        n_out = steps + 1 if (return_trajectory and method in FIXED) else 2
        times = torch.linspace(t0, t1, n_out, dtype=x0.dtype, device=x0.device)
        options = {"step_size": (t1 - t0) / steps} if method in FIXED else None
        kwargs = dict(rtol=rtol, atol=atol) if method == "dopri5" else {}
        traj = odeint(counted, x0, times, method=method, options=options, **kwargs)
        keep = return_trajectory
        return ODEResult(traj[-1], traj if keep else None, times if keep else None, counted.nfe)
    if method == "dopri5":
        raise ValueError("solve_ode: adaptive dopri5 is only available in Euclidean space; use euler/midpoint/rk4")
    x = manifold.check_point(x0, name="x0")
    h = (t1 - t0) / steps
    states = [x] if return_trajectory else None
    fn = lambda t, y: (manifold.proju(y, counted(t, y)), None)  # noqa: E731
    for k in range(steps):
        x, _ = manifold_step(manifold, fn, t0 + k * h, x, h, method)
        if states is not None:
            states.append(x)
    times = torch.linspace(t0, t1, steps + 1) if return_trajectory else None
    return ODEResult(x, torch.stack(states) if states is not None else None, times, counted.nfe)
