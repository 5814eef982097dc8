"""One gradient-descent loop and one minibatch sampler for every trainer of the library.

Every trainer in ``wsbook`` (population training, MAP and ensembles, mean-field VI, the flow trainer; the
graph-network trainers and Sinkhorn matching switch to it the same way) is the same loop::

    opt = make_optimizer(params, "adam", lr=1e-3)              # fused kernels where the device has them
    batches = Minibatches(n, batch_size, members=B, generator=g)  # or members=None for one shared batch
    def step_fn(step):
        idx = batches(step)                                     # [B, batch] (or [batch], or None: full batch)
        return per_member_loss(...)                             # a scalar, or one loss per member [B]
    run = descend(step_fn, opt, steps, schedule="cosine")     # run.losses: [steps] or [steps, B]

:func:`descend` zeroes the gradients, calls ``step_fn(step)``, checks the loss for NaN / inf (raising
``FloatingPointError`` that names the step), backpropagates ``loss.sum()`` (so a per-member loss gives
every member exactly the gradient of its own loss), steps the optimizer and the learning-rate schedule,
updates an optional :class:`EMA`, calls ``on_step(step)`` (checkpoints), shows a progress bar (hidden per
:func:`wsbook.config.progress_enabled`) and keeps the loss history. A ``step_fn`` that backpropagates by
itself (e.g. gradient accumulation over chunks) passes ``backward=False`` and returns the detached loss.

How to switch an epoch-based trainer (``for epoch: for batch in shuffled(n): ...``): use
``Minibatches(n, batch_size, members=None, drop_last=False, generator=g)`` and
``steps = epochs * batches.per_epoch``; ``batches.epoch(step)`` gives the epoch, and a per-epoch schedule
is a callable ``schedule=lambda step: factor`` (applied through ``LambdaLR``). Sinkhorn-style objectives
over a list of leaves need nothing special: ``make_optimizer(list_of_leaves, "adam", lr=...)``.

This module sits on the ground floor: it imports only torch, tqdm and :mod:`wsbook.config`.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Union

import torch
from torch import Tensor, nn

from wsbook import config

OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("constant", "cosine")
Schedule = Union[str, Callable[[int], float], None]


def make_optimizer(params: Iterable[Tensor] | Iterable[dict], name: str = "adam", *, lr: float,
                   weight_decay: float = 0.0, momentum: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                   fused: bool | None = None) -> torch.optim.Optimizer:
    """An Adam, AdamW or SGD optimizer, with fused kernels where the parameters' device supports them.

    A fused optimizer updates a whole leaf in one pass instead of one pass per elementwise operation,
    which matters for one large ``[B, D]`` population leaf.

    Args:
        params: tensors (leaves with ``requires_grad``) or parameter groups, e.g. ``model.parameters()``.
        name: ``"adam"``, ``"adamw"`` or ``"sgd"``.
        lr: learning rate.
        weight_decay: L2 penalty (Adam, SGD) or decoupled weight decay (AdamW).
        momentum: SGD momentum (ignored by Adam / AdamW).
        betas: Adam / AdamW moment decay rates.
        fused: ``None`` tries fused kernels and falls back to the default implementation when the
            parameters' device or dtype has none; ``True`` requires them; ``False`` never uses them.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}; got {name!r}")
    if not lr > 0:
        raise ValueError(f"lr must be positive; got {lr}")
    params = list(params)
    if not params:
        raise ValueError("make_optimizer got no parameters")

    def build(use_fused: bool | None) -> torch.optim.Optimizer:
        kw = {} if use_fused is None else {"fused": use_fused}
        if name == "adam":
            return torch.optim.Adam(params, lr=lr, betas=betas, weight_decay=weight_decay, **kw)
        if name == "adamw":
            return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, **kw)
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, **kw)

    if fused is None:
        try:
            return build(True)
        except (RuntimeError, ValueError, TypeError):
            return build(None)
    return build(fused)


def make_schedule(optimizer: torch.optim.Optimizer, schedule: Schedule, steps: int,
                  min_lr: float = 0.0) -> torch.optim.lr_scheduler.LRScheduler | None:
    """A per-step learning-rate schedule over ``steps`` steps: ``None`` / ``"constant"`` (none), ``"cosine"``
    (cosine decay from the optimizer's lr to ``min_lr``, torch's ``CosineAnnealingLR``), or a callable
    ``step -> factor`` multiplying the base lr (torch's ``LambdaLR``)."""
    if schedule is None or schedule == "constant":
        return None
    if schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps, eta_min=min_lr)
    if callable(schedule):
        return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    raise ValueError(f"schedule must be one of {SCHEDULES} or a callable step -> factor; got {schedule!r}")


class EMA:
    """Exponential moving average of a module's parameters: ``ema <- d_k * ema + (1 - d_k) * current``.

    ``EMA(model, 0.99).module`` is a frozen copy of ``model`` that :func:`descend` updates after every step.
    The decay warms up, ``d_k = min(decay, (1 + k) / (10 + k))`` after ``k`` updates, so a short run's
    average is not dominated by the initial parameters (with a fixed ``d = 0.999``, after 300 steps the
    initialisation would still carry ``0.999^300 = 74 %`` of the weight).
    """

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1); got {decay}")
        self.model, self.decay = model, float(decay)
        self.module = copy.deepcopy(model).requires_grad_(False)
        self.n_updates = 0

    @property
    def current_decay(self) -> float:
        """The decay the next update uses."""
        return min(self.decay, (1 + self.n_updates) / (10 + self.n_updates))

    @torch.no_grad()
    def update(self) -> None:
        d = self.current_decay
        for pe, pm in zip(self.module.parameters(), self.model.parameters()):
            pe.lerp_(pm, 1 - d)
        for be, bm in zip(self.module.buffers(), self.model.buffers()):
            be.copy_(bm)
        self.n_updates += 1


def to_device(t: Tensor, device: torch.device | str | None) -> Tensor:
    """``t`` on ``device`` without making the host wait: a CPU tensor bound for a CUDA device goes through
    pinned memory with ``non_blocking=True`` (a plain ``.to("cuda")`` of pageable memory synchronises the
    stream, which in a training loop means one host-device synchronisation per step). The values are the
    same; the caching host allocator keeps the pinned buffer alive until the copy has run."""
    if device is None:
        return t
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu" and torch.cuda.is_available():
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class Minibatches:
    """Epoch-shuffled minibatch indices, one shuffle per member of a population or one shared shuffle.

    ``batches(step)`` returns the indices of step ``step``: ``[members, batch_size]`` (every member draws
    its own minibatches) or ``[batch_size]`` with ``members=None``; ``None`` when ``batch_size`` is ``None``
    or not smaller than ``n`` (full batch). A fresh shuffle is drawn at the first step of every epoch from
    ``generator`` (``torch.rand(members, n).argsort(1)``: one stream, reproducible on any device). Steps must
    be visited in order, as a training loop does.

    Args:
        n: number of items (data points, networks).
        batch_size: items per minibatch, or ``None`` for the full batch.
        members: number of independent shuffles (population members), or ``None`` for one shared batch.
        generator: random stream of the shuffles (``None``: torch's global generator, seeded by
            :func:`wsbook.config.seed_everything`).
        device: where the returned indices live (the shuffle itself is drawn on the CPU).
        drop_last: drop the incomplete last batch of an epoch (every batch then has ``batch_size`` items);
            with ``False`` the last batch of an epoch is smaller.
        rows: keep only these members' shuffles (a slice of ``range(members)``) while drawing all
            ``members`` of them, so a block of a population split over processes sees exactly the
            minibatches it would see in the whole population (:mod:`wsbook.distributed`).
    """

    def __init__(self, n: int, batch_size: int | None, *, members: int | None = None,
                 generator: torch.Generator | None = None, device: torch.device | str | None = None,
                 drop_last: bool = True, rows: slice | None = None):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive number of items; got {n!r}")
        if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be a positive int or None (full batch); got {batch_size!r}")
        if members is not None and (not isinstance(members, int) or members < 1):
            raise ValueError(f"members must be a positive int or None (one shared batch); got {members!r}")
        if rows is not None and members is None:
            raise ValueError("rows selects members' shuffles; it needs members")
        self.n, self.batch_size, self.members, self.rows = n, batch_size, members, rows
        self.generator, self.device, self.drop_last = generator, device, drop_last
        self.full = batch_size is None or batch_size >= n
        if self.full:
            self.per_epoch = 1
        elif drop_last:
            self.per_epoch = max(n // batch_size, 1)
        else:
            self.per_epoch = math.ceil(n / batch_size)
        self._order: Tensor | None = None

    def epoch(self, step: int) -> int:
        """The epoch that step ``step`` belongs to."""
        return step // self.per_epoch

    def __call__(self, step: int) -> Tensor | None:
        if self.full:
            return None
        k = step % self.per_epoch
        if k == 0 or self._order is None:
            rows = self.members or 1
            order = torch.rand(rows, self.n, generator=self.generator).argsort(1)
            if self.rows is not None:
                order = order[self.rows]
            self._order = to_device(order, self.device)
        idx = self._order[:, k * self.batch_size:(k + 1) * self.batch_size]
        return idx if self.members is not None else idx[0]


@dataclass
class LoopResult:
    """What :func:`descend` returns: the loss of every step (``[steps, *loss_shape]``, on the loss's
    device, detached) and the wall time in seconds."""

    losses: Tensor
    seconds: float

    @property
    def steps(self) -> int:
        return self.losses.shape[0]


def _check_steps(steps: int) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int; got {steps!r}")


def descend(step_fn: Callable[[int], Tensor], optimizer: torch.optim.Optimizer, steps: int, *,
            schedule: Schedule = None, min_lr: float = 0.0, backward: bool = True, ema: EMA | None = None,
            on_step: Callable[[int], None] | None = None, progress: bool | None = None, desc: str = "training",
            check_every: int | None = None) -> LoopResult:
    """Run ``steps`` gradient steps of ``step_fn(step) -> loss`` with ``optimizer`` (see the module docstring).

    Args:
        step_fn: computes the loss of step ``step`` (0-based): a scalar or one loss per member ``[B]``;
            ``loss.sum()`` is backpropagated unless ``backward=False``.
        optimizer: e.g. from :func:`make_optimizer`.
        steps: number of optimizer steps (positive).
        schedule: ``None`` / ``"constant"``, ``"cosine"`` (to ``min_lr``), or a callable ``step -> lr factor``.
        min_lr: final learning rate of the cosine schedule.
        backward: ``False`` when ``step_fn`` has already backpropagated (it returns the detached loss).
        ema: an :class:`EMA` updated after every step.
        on_step: called with the step index after every optimizer step (e.g. to keep checkpoints).
        progress: show a progress bar (default: :func:`wsbook.config.progress_enabled`).
        desc: name of the run in the progress bar and in error messages.
        check_every: steps between NaN / inf checks. Every step's loss is checked; with ``check_every > 1``
            the check (a host-device synchronisation) runs on a block of steps at once and the error still
            names the first bad step. Default: 1 on the CPU, 25 on accelerators.

    Returns:
        :class:`LoopResult` with the loss history ``[steps, *loss_shape]``.

    Raises:
        FloatingPointError: when a loss is NaN or infinite (naming the step).
    """
    _check_steps(steps)
    from tqdm.auto import trange

    sched = make_schedule(optimizer, schedule, steps, min_lr)
    show = config.progress_enabled() if progress is None else progress
    history: Tensor | None = None
    checked = 0                                       # steps [0, checked) are known to be finite

    def check(upto: int) -> None:
        nonlocal checked
        block = history[checked:upto]
        if not bool(torch.isfinite(block).all()):
            bad_rows = (~torch.isfinite(block.reshape(block.shape[0], -1))).any(1).nonzero()
            first = checked + int(bad_rows[0])
            row = history[first].reshape(-1)
            n_bad = int((~torch.isfinite(row)).sum())
            lr = optimizer.param_groups[0]["lr"]
            raise FloatingPointError(f"{desc}: non-finite loss at step {first} of {steps} ({n_bad} of {row.numel()} "
                                     f"values are NaN or inf); lower the learning rate (lr={lr:g}) or check the inputs")
        checked = upto

    start = time.perf_counter()
    bar = trange(steps, desc=desc, disable=not show, leave=False)
    for step in bar:
        optimizer.zero_grad(set_to_none=True)
        loss = step_fn(step)
        if not isinstance(loss, Tensor):
            raise TypeError(f"{desc}: step_fn must return a loss tensor; got {type(loss).__name__}")
        value = loss.detach()
        if history is None:
            history = torch.empty((steps, *value.shape), dtype=value.dtype, device=value.device)
            if check_every is None:
                check_every = 1 if value.device.type == "cpu" else 25
        history[step] = value
        if (step + 1 - checked) >= check_every:
            check(step + 1)               # before the update: a bad step never reaches the parameters on a CPU
        if backward:
            loss.sum().backward()
        optimizer.step()
        if sched is not None:
            sched.step()
        if ema is not None:
            ema.update()
        if on_step is not None:
            on_step(step)
        if show and step % 50 == 0:
            bar.set_postfix(loss=f"{float(value.float().mean()):.4g}")
    check(steps)
    return LoopResult(losses=history, seconds=time.perf_counter() - start)


__all__ = ["OPTIMIZERS", "SCHEDULES", "EMA", "LoopResult", "Minibatches", "descend", "make_optimizer",
           "make_schedule", "to_device"]
