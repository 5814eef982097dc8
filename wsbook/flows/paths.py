"""Conditional probability paths p_t(x | x0, x1) and their conditional vector fields u_t(x | x0, x1).

* :class:`LinearPath`: x_t = (1 - t) x0 + t x1 + sigma eps, u_t = x1 - x0 (Lipman et al. 2023; Tong et al. 2023).
* :class:`GeodesicPath`: x_t = exp_{x0}(t log_{x0} x1), u_t = log_{x_t}(x1) / (1 - t) (Chen & Lipman 2024).
"""
from __future__ import annotations

import torch

from wsbook.loop import to_device
from wsbook.manifolds import Manifold

Tensor = torch.Tensor


def check_time(t: Tensor, batch: int | None = None, name: str = "t") -> Tensor:
    """Validate times: finite, in [0, 1], and either a scalar or one per batch member."""
    t = torch.as_tensor(t)
    if not torch.isfinite(t).all() or (t < 0).any() or (t > 1).any():
        raise ValueError(f"{name}: expected times in [0, 1], got values in [{t.min().item():.4g}, {t.max().item():.4g}]")
    if batch is not None and t.dim() > 0 and t.shape != (batch,):
        raise ValueError(f"{name}: expected a scalar or shape ({batch},), got {tuple(t.shape)}")
    return t


class LinearPath:
    """Straight-line (rectified / OT-CFM) path with optional Gaussian width ``sigma``."""

    def __init__(self, sigma: float = 0.0):
        if sigma < 0:
            raise ValueError(f"LinearPath: sigma must be >= 0, got {sigma}")
        self.sigma = float(sigma)

    def sample(self, x0: Tensor, x1: Tensor, t: Tensor, generator: torch.Generator | None = None,
               check: bool = True) -> tuple[Tensor, Tensor]:
        """(x_t, u_t(x_t | x0, x1)) for a batch of pairs and times ``t`` ([B] or scalar). ``check=False``
        skips the validation of the values of ``t`` (it reads them on the host: on a GPU, a synchronisation;
        training loops that draw their own times pass ``False``)."""
        if x0.shape != x1.shape:
            raise ValueError(f"LinearPath: x0 and x1 must have equal shapes, got {tuple(x0.shape)}, {tuple(x1.shape)}")
        t = (check_time(t, x0.shape[0]) if check else torch.as_tensor(t)).to(x0)
        tt = t.reshape(-1, *([1] * (x0.dim() - 1))) if t.dim() else t
        xt = (1 - tt) * x0 + tt * x1
        if self.sigma > 0:
            xt = xt + self.sigma * to_device(torch.randn(x0.shape, generator=generator, dtype=x0.dtype), x0.device)
        return xt, x1 - x0


class GeodesicPath:
    """Geodesic path on a manifold; the conditional field log_{x_t}(x1)/(1 - t) with t clipped to
    ``1 - eps`` (the field is singular at t = 1, where every path has arrived)."""

    def __init__(self, manifold: Manifold, eps: float = 1e-3):
        self.manifold = manifold
        self.eps = float(eps)

    def sample(self, x0: Tensor, x1: Tensor, t: Tensor, generator: torch.Generator | None = None,
               check: bool = True) -> tuple[Tensor, Tensor]:
        """(x_t, u_t(x_t | x0, x1)); ``check=False`` skips the validation of the points and times (as in
        :meth:`LinearPath.sample`)."""
        m = self.manifold
        if x0.shape != x1.shape:
            raise ValueError(f"GeodesicPath: x0 and x1 must have equal shapes, got {tuple(x0.shape)}, {tuple(x1.shape)}")
        if check:
            m.check_point(x0, name="x0")
            m.check_point(x1, name="x1")
        t = (check_time(t, x0.shape[0]) if check else torch.as_tensor(t)).to(x0).clamp(max=1 - self.eps)
        tt = t.reshape(-1, *([1] * (x0.dim() - 1))) if t.dim() else t
        xt = m.expmap(x0, tt * m.logmap(x0, x1))
        ut = m.logmap(xt, x1) / (1 - tt)
        return xt, ut
