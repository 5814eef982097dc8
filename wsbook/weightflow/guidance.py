"""Guidance by a task loss: while sampling, add ``-lambda(t) grad L`` to the flow's velocity, where ``L`` is a
network's loss on a minibatch of training data (thesis chapter 6, "Guidance"; book chapter 7).

The gradient is computed for the whole population at once through :meth:`MLPSpec.forward` (the summed
per-member loss gives every member the gradient of its own loss; no loop over networks), in the spec's
flat weight layout ``[out, in]`` row-major then bias, the layout of ``torch.nn.Linear``. The chart then
maps it to a Riemannian gradient on its manifold (chain rule through the chart's layout and tangent
projection), so guided samples stay on the spheres. The sign is descent: guidance lowers the loss.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from wsbook.nets import MLPSpec, per_member_loss

SCHEDULES = ("constant", "linear", "quadratic")


def task_gradient(spec: MLPSpec, theta: Tensor, x: Tensor, y: Tensor, task: str = "classification") -> Tensor:
    """``d L_i / d theta_i`` for every member ``i`` of ``theta [B, D]``, with ``L_i`` its mean loss on
    ``(x, y)`` for ``task`` (``"classification"``: cross-entropy, ``"regression"``: squared error); ``[B, D]`` in the spec's flat layout."""
    theta = spec.check(theta)
    with torch.enable_grad():
        th = theta.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(per_member_loss(spec, th, x, y, task).sum(), th)
    return g


@dataclass
class Guidance:
    """Task-loss guidance for :meth:`WeightFlow.sample`.

    Args:
        x, y: the task's training data (a fresh minibatch is drawn at every field evaluation).
        weight: lambda, the guidance strength.
        schedule: ``"constant"`` (lambda), ``"linear"`` (lambda t) or ``"quadratic"`` (lambda t^2), or a
            callable ``t -> factor``: how the strength grows along the path (late guidance acts on nearly
            finished networks).
        task: ``"classification"`` (cross-entropy) or ``"regression"`` (squared error).
        batch_size: minibatch size (``None``: all of ``x``).
        generator: draws the minibatches.
    """

    x: Tensor
    y: Tensor
    weight: float = 0.1
    schedule: str | Callable[[float], float] = "constant"
    task: str = "classification"
    batch_size: int | None = 256
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if not callable(self.schedule) and self.schedule not in SCHEDULES:
            raise ValueError(f"Guidance: schedule must be one of {SCHEDULES} or a callable; got {self.schedule!r}")
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"Guidance: x has {self.x.shape[0]} examples but y has {self.y.shape[0]}")
        if self.weight < 0:
            raise ValueError(f"Guidance: weight must be >= 0 (descent); got {self.weight}")

    def strength(self, t: float) -> float:
        """lambda(t)."""
        if callable(self.schedule):
            return self.weight * float(self.schedule(t))
        return self.weight * {"constant": 1.0, "linear": t, "quadratic": t * t}[self.schedule]

    def batch(self) -> tuple[Tensor, Tensor]:
        n = self.x.shape[0]
        if self.batch_size is None or self.batch_size >= n:
            return self.x, self.y
        idx = torch.randperm(n, generator=self.generator)[:self.batch_size].to(self.x.device)
        return self.x[idx], self.y[idx]

    def vector(self, chart, points: Tensor, t: float) -> Tensor:
        """The guidance term ``-lambda(t) grad_M L`` at ``points`` (tangent vectors of ``chart.manifold``)."""
        lam = self.strength(float(t))
        if lam == 0:
            return torch.zeros_like(points)
        xb, yb = self.batch()
        g = task_gradient(chart.spec, chart.layout(points), xb, yb, self.task)
        return -lam * chart.gradient_to_tangent(points, g)
