"""The conditional flow-matching loss and its trainer (one :func:`wsbook.loop.descend`: AdamW, cosine decay,
EMA weights, NaN check, progress bar, loss history).

L_CFM(theta) = E_{t ~ U(0,1), (x0, x1) ~ q, x_t ~ p_t(. | x0, x1)} |v_theta(t, x_t) - u_t(x_t | x0, x1)|^2
(Lipman et al. 2023, eq. 9; Tong et al. 2023): its gradient equals the gradient of the intractable FM loss.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import torch
from torch import nn

from wsbook.loop import EMA, descend, make_optimizer, to_device
from wsbook.manifolds import Manifold

Tensor = torch.Tensor
Sampler = Union[Tensor, Manifold, Callable[[int, torch.Generator], Tensor]]


def cfm_loss(field: Callable[[Tensor, Tensor], Tensor], x0: Tensor, x1: Tensor, t: Tensor, path,
             generator: torch.Generator | None = None, check: bool = True) -> Tensor:
    """Mean squared regression error of v(t, x_t) onto the conditional field u_t(x_t | x0, x1).

    ``check=False`` skips the validation of the points and times and the NaN / inf check of the loss (each
    reads values on the host: on a GPU, a host-device synchronisation); :func:`train_flow` checks its first
    step only and leaves the loss's NaN check to :func:`wsbook.loop.descend`.
    """
    xt, ut = path.sample(x0, x1, t, generator=generator, check=check)
    loss = ((field(t, xt) - ut) ** 2).sum(-1).mean()
    if check and not torch.isfinite(loss):
        raise FloatingPointError(f"cfm_loss: the loss is {loss.item()} (NaN or inf); check inputs and learning rate")
    return loss


def _draw(source: Sampler, n: int, generator: torch.Generator, device: torch.device) -> Tensor:
    """``n`` points of ``source`` on ``device`` (a copy from the CPU does not make the host wait)."""
    if isinstance(source, Tensor):
        idx = torch.randint(0, source.shape[0], (n,), generator=generator)
        return to_device(source[to_device(idx, source.device)], device)
    if isinstance(source, Manifold):
        return to_device(source.random_base(n, generator=generator), device)
    return to_device(source(n, generator), device)


@dataclass
class FlowTrainResult:
    """The trained model, its exponential moving average (use this one for sampling) and the loss history."""

    model: nn.Module
    ema: nn.Module
    losses: Tensor


def train_flow(model: nn.Module, target: Sampler, source: Sampler, *, path, coupling, steps: int,
               batch_size: int = 256, lr: float = 1e-3, ema_decay: float = 0.99, weight_decay: float = 0.0,
               generator: torch.Generator | None = None, progress: bool | None = None,
               check_every: int | None = None) -> FlowTrainResult:
    """Train ``model`` = v_theta(t, x) with CFM (see chapter 3, "Training, couplings and conditional paths").

    Every step draws x0 from ``source`` and x1 from ``target``, pairs them with ``coupling``, draws
    t ~ U(0, 1) and takes an AdamW step (cosine learning-rate decay to ``0.05 lr``) in
    :func:`wsbook.loop.descend`, which also keeps the EMA weights and checks every loss for NaN / inf.

    Args:
        model: the vector field ``field(t, x)`` (an ``nn.Module``).
        target, source: a tensor of data to resample, a manifold's base distribution, or a
            ``callable(n, generator)``.
        path: a conditional path (:class:`LinearPath`, :class:`GeodesicPath`); coupling: how x0, x1 are paired.
        steps: optimizer steps; batch_size: pairs per step; lr, weight_decay: AdamW settings.
        ema_decay: decay of the exponential moving average of the weights.
        generator: random stream of data, pairs and times (``None``: torch's global generator).
        progress: show a progress bar.
        check_every: steps between the loss's NaN / inf checks (:func:`wsbook.loop.descend`; default 1 on the
            CPU, 25 on accelerators).

    On a GPU a step does not make the host wait for the device (no ``.item()``, no check of a value on the
    host, no blocking copy: samples and times drawn on the CPU go through pinned memory), except for the
    NaN check every ``check_every`` steps, the validation of the first step's points and times, and what
    the pairing itself needs (``OTCoupling`` solves an assignment on the CPU every step).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"train_flow: batch_size must be a positive int, got {batch_size!r}")
    device = next(model.parameters()).device
    ema = EMA(model, ema_decay)
    opt = make_optimizer(model.parameters(), "adamw", lr=lr, weight_decay=weight_decay)

    def step_fn(step: int) -> Tensor:
        x0, x1 = coupling(_draw(source, batch_size, generator, device), _draw(target, batch_size, generator, device))
        t = to_device(torch.rand(batch_size, generator=generator), device)
        return cfm_loss(model, x0, x1, t, path, generator=generator, check=step == 0)

    run = descend(step_fn, opt, steps, schedule="cosine", min_lr=lr * 0.05, ema=ema, progress=progress,
                  desc="flow matching", check_every=check_every)
    return FlowTrainResult(model=model, ema=ema.module, losses=run.losses.cpu())
