"""The conditional flow-matching loss and a small trainer (loss history, EMA weights, progress bar).

L_CFM(theta) = E_{t ~ U(0,1), (x0, x1) ~ q, x_t ~ p_t(. | x0, x1)} |v_theta(t, x_t) - u_t(x_t | x0, x1)|^2
(Lipman et al. 2023, eq. 9; Tong et al. 2023): its gradient equals the gradient of the intractable FM loss.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Union

import torch
from torch import nn

from wsbook import config
from wsbook.manifolds import Manifold

Tensor = torch.Tensor
Sampler = Union[Tensor, Manifold, Callable[[int, torch.Generator], Tensor]]


def cfm_loss(field: Callable[[Tensor, Tensor], Tensor], x0: Tensor, x1: Tensor, t: Tensor, path,
             generator: torch.Generator | None = None) -> Tensor:
    """Mean squared regression error of v(t, x_t) onto the conditional field u_t(x_t | x0, x1)."""
    xt, ut = path.sample(x0, x1, t, generator=generator)
    loss = ((field(t, xt) - ut) ** 2).sum(-1).mean()
    if not torch.isfinite(loss):
        raise FloatingPointError(f"cfm_loss: the loss is {loss.item()} (NaN or inf); check inputs and learning rate")
    return loss


def _draw(source: Sampler, n: int, generator: torch.Generator, device: torch.device) -> Tensor:
    if isinstance(source, Tensor):
        idx = torch.randint(0, source.shape[0], (n,), generator=generator)
        return source[idx.to(source.device)].to(device)
    if isinstance(source, Manifold):
        return source.random_base(n, generator=generator).to(device)
    return source(n, generator).to(device)


@dataclass
class FlowTrainResult:
    """The trained model, its exponential moving average (use this one for sampling) and the loss history."""

    model: nn.Module
    ema: nn.Module
    losses: Tensor


@torch.no_grad()
def _ema_update(ema: nn.Module, model: nn.Module, decay: float) -> None:
    for pe, pm in zip(ema.parameters(), model.parameters()):
        pe.lerp_(pm, 1 - decay)


def train_flow(model: nn.Module, target: Sampler, source: Sampler, *, path, coupling, steps: int,
               batch_size: int = 256, lr: float = 1e-3, ema_decay: float = 0.99, weight_decay: float = 0.0,
               generator: torch.Generator | None = None, progress: bool | None = None) -> FlowTrainResult:
    """Train ``model`` = v_theta(t, x) with CFM: per step draw x0 from ``source`` and x1 from ``target``
    (a tensor of data to resample, a manifold's base distribution, or a ``callable(n, generator)``),
    pair them with ``coupling``, draw t ~ U(0, 1), and take an Adam step (cosine learning-rate decay)."""
    if steps < 1 or batch_size < 1:
        raise ValueError(f"train_flow: steps and batch_size must be positive, got {steps}, {batch_size}")
    generator = generator or torch.Generator().manual_seed(0)
    device = next(model.parameters()).device
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps, eta_min=lr * 0.05)
    losses = torch.empty(steps)
    show = config.progress_enabled() if progress is None else progress
    iterator = range(steps)
    if show:
        from tqdm.auto import tqdm
        iterator = tqdm(iterator, desc="flow matching", leave=False)
    for step in iterator:
        x0, x1 = coupling(_draw(source, batch_size, generator, device), _draw(target, batch_size, generator, device))
        t = torch.rand(batch_size, generator=generator).to(device)
        loss = cfm_loss(model, x0, x1, t, path, generator=generator)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        _ema_update(ema, model, ema_decay)
        losses[step] = loss.detach()
        if show and step % 50 == 0:
            iterator.set_postfix(loss=f"{loss.item():.4f}")
    return FlowTrainResult(model=model, ema=ema, losses=losses)
