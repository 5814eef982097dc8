"""Variational training of a :class:`~wsbook.weightflow.WeightFlow`: the flow as the family of variational
inference over networks, trained on an unnormalised log-density instead of on samples (book chapter 8c).

* :func:`fit_reverse_kl`: reverse KL to the density, optionally plus the negative log-likelihood of samples
  of the target (the two objectives of a Boltzmann generator).
* :func:`euler_path`: the differentiable Euler path with the log-density change (Hutchinson) and the
  Jacobian penalty it is trained through.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from wsbook.flows import rademacher
from wsbook.loop import EMA, descend, make_optimizer, to_device
from wsbook.weightflow.flow import FitResult, WeightFlow


def euler_path(flow: WeightFlow, x: Tensor, grid: Tensor,
               generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
    """Euler steps of the training field along a per-sample time ``grid [B, K + 1]`` (increasing: from the
    source; decreasing: back to it), differentiable. Returns the end points, ``sum dt * div v`` along the
    way (the divergence by one fresh Rademacher probe per step, Hutchinson) and the Jacobian penalty
    ``sum |dt| |eps^T J|^2`` (batch mean)."""
    integral, penalty = x.new_zeros(x.shape[0]), x.new_zeros(())
    eps = min(flow.t_eps, 0.5 / (grid.shape[1] - 1))
    for k in range(grid.shape[1] - 1):          # the whole batch at once
        t, dt = grid[:, k], (grid[:, k + 1] - grid[:, k])[:, None]
        v = flow.velocity(t, x, flow.field, eps)
        probe = to_device(rademacher(tuple(x.shape), generator, x.dtype), x.device)
        vjp = torch.autograd.grad((v * probe).sum(), x, create_graph=True)[0]
        integral = integral + dt[:, 0] * (vjp * probe).sum(-1)
        penalty = penalty + (dt[:, 0].abs() * vjp.pow(2).sum(-1)).mean()
        x = x + dt * v
    return x, integral, penalty


def fit_reverse_kl(flow: WeightFlow, log_density: Callable[[Tensor], Tensor], *, steps: int, batch_size: int = 64,
                   solver_steps: int = 8, lr: float = 1e-3, ema_decay: float = 0.99, max_grad_norm: float = 10.0,
                   jacobian_penalty: float = 0.01, networks: Tensor | None = None, forward_weight: float = 0.0,
                   generator: torch.Generator | None = None,
                   progress: bool | None = None, desc: str = "weight flow (reverse KL)") -> FitResult:
    """Train the field on an unnormalised log-density of networks instead of on samples: minimise
    ``KL(q || p) = E_q[log q(theta) - log p(theta)] + log Z`` over the flow's distribution ``q`` (variational
    inference with the flow as the family; Rezende & Mohamed 2015, Chen et al. 2018). Each step draws
    ``batch_size`` source points, pushes them through ``solver_steps`` Euler steps of the field on a time grid
    of its own (the regular grid, inner points moved by up to half a step, so that the field is trained at
    every time) and carries ``log q`` along by the instantaneous change of variables, the divergence
    estimated with one fresh Rademacher probe per step (Hutchinson); the loss is backpropagated through
    the whole path. Start from a flow already fitted to samples (:meth:`WeightFlow.fit`): the density then only has to
    correct it.

    Args:
        log_density: ``theta [B, D] -> [B]``, the unnormalised log-density of ordinary weights (e.g. a
            :class:`wsbook.bayes.LogPosterior`), differentiable.
        steps: optimizer steps (Adam, cosine-decayed to 5 % of ``lr``).
        batch_size: samples per step.
        solver_steps: Euler steps of the path during training. Sample and score the trained flow with a
            finer solver (``WeightFlow.sample``, ``WeightFlow.likelihood``) and check that it agrees with the training
            solver (``sample(n, steps=solver_steps, method="euler")``); see ``jacobian_penalty``.
        lr, ema_decay: learning rate and decay of the sampling EMA.
        max_grad_norm: gradient clipping (a sample far out in the tails has a huge ``-log p`` gradient).
        jacobian_penalty: weight of ``int |eps^T J|^2 dt`` (Hutchinson's estimate of the field's squared
            Jacobian norm along the path, free from the divergence's probe; Finlay et al. 2020). A fixed
            number of Euler steps misstates ``log q`` (``h tr J`` for ``log det(I + h J)``) and a free field
            learns to exploit the error: the reverse KL drops below its minimum while the ODE that
            ``WeightFlow.sample`` and ``WeightFlow.likelihood`` integrate drifts away from what was trained. A smooth
            field keeps the two one flow.
        networks, forward_weight: samples of the target (e.g. HMC draws) and the weight of their negative
            log-likelihood under the flow, the forward KL up to a constant: the loss becomes
            ``KL(q || p) + forward_weight * E_data[-log q]``, the two objectives of a Boltzmann generator
            (Noe et al., 2019). Reverse KL alone seeks modes and settles on too narrow a spread; the
            samples' likelihood pays for every draw ``q`` leaves uncovered. ``log q`` of a batch of
            ``networks`` (as chart points, so aligned to the chart's reference if it has one) comes from
            the same number of Euler steps run backwards to the source, on a jittered grid of its own.
        generator: source points, probes and minibatches of ``networks``.
        progress, desc: the progress bar.

    Returns:
        :class:`~wsbook.weightflow.FitResult` with the per-step loss, the reverse KL up to ``log Z`` (in nats), and with
        ``networks`` a second column, their mean negative log-likelihood under the flow.
    """
    if not flow.euclidean:
        raise ValueError("fit_reverse_kl: needs a chart whose density lives on the weights themselves "
                         f"(Euclidean); the {flow.chart.kind} chart's density is that of canonical representatives")
    if steps < 1 or batch_size < 1 or solver_steps < 1:
        raise ValueError(f"fit_reverse_kl: steps, batch_size and solver_steps must be positive; got {steps}, "
                         f"{batch_size}, {solver_steps}")
    if not forward_weight >= 0 or (forward_weight > 0) != (networks is not None):
        raise ValueError("fit_reverse_kl: give networks together with a forward_weight > 0 (or neither); got "
                         f"forward_weight={forward_weight} and {'no ' if networks is None else ''}networks")
    device = next(flow.field.parameters()).device
    data = None if networks is None else to_device(flow.chart.to_points(networks), device)
    ema = EMA(flow.field, ema_decay)
    flow.ema = ema.module
    params = [p for p in flow.field.parameters() if p.requires_grad]
    opt = make_optimizer(params, "adam", lr=lr)

    def time_grid(dtype: torch.dtype) -> Tensor:
        # every sample its own time grid: the regular one with the inner points moved by up to half a
        # step, so that the field is trained at every time, not only at the K the sampler would visit
        jitter = torch.rand(batch_size, solver_steps + 1, generator=generator, dtype=dtype)
        grid = (torch.arange(solver_steps + 1, dtype=dtype) + jitter - 0.5) * (1.0 / solver_steps)
        grid[:, 0], grid[:, -1] = 0.0, 1.0
        return to_device(grid, device)

    def step_fn(step: int) -> Tensor:
        x = to_device(flow.chart.sample_source(batch_size, generator), device)
        log_q0 = flow.chart.source_log_prob(x)
        x, div, penalty = euler_path(flow, x.requires_grad_(True), time_grid(x.dtype), generator)
        loss = (log_q0 - div - log_density(flow.chart.to_weights(x))).mean()
        total, out = loss + jacobian_penalty * penalty, [loss.detach()]
        if data is not None:                     # log q of draws: back along the path to the source
            rows = torch.randint(0, data.shape[0], (batch_size,), generator=generator)
            x0, div_back, penalty_back = euler_path(flow, data[to_device(rows, device)].requires_grad_(True),
                                                          time_grid(data.dtype).flip(1), generator)
            nll = -(flow.chart.source_log_prob(x0) + div_back).mean()
            total = total + forward_weight * nll + jacobian_penalty * penalty_back
            out.append(nll.detach())
        if not torch.isfinite(total):
            return torch.stack(out) if len(out) > 1 else out[0]      # descend names the step
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        return torch.stack(out) if len(out) > 1 else out[0]

    run = descend(step_fn, opt, steps, schedule="cosine", min_lr=0.05 * lr, backward=False, ema=ema,
                  progress=progress, desc=desc)
    return FitResult(losses=run.losses.detach().cpu(), seconds=run.seconds)


__all__ = ["fit_reverse_kl", "euler_path"]
