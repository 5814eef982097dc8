"""Point estimates of populations: MAP training, deep ensembles, and checkpoints along SGD/Adam runs.

A deep ensemble (Lakshminarayanan et al., 2017) is a population of MAP solutions from independent
initialisations; maximising ``log_posterior`` is training with weight decay ``1 / (prior_std^2 N)``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from wsbook import config
from wsbook.bayes.model import LogPosterior, minibatch_indices


@dataclass
class MAPResult:
    """Final weights ``[B, D]``, the per-step negative log posterior per datum ``[steps, B]``, and optional
    checkpoints ``[K, B, D]`` taken every ``checkpoint_every`` steps."""

    theta: Tensor
    loss_history: Tensor
    checkpoints: Tensor | None = None
    seconds: float = 0.0


def fit_map(log_posterior: LogPosterior, theta0: Tensor, *, steps: int, lr: float = 1e-2, optimizer: str = "adam",
            batch_size: int | None = None, checkpoint_every: int | None = None,
            generator: torch.Generator | None = None, progress: bool | None = None) -> MAPResult:
    """Maximise ``log_posterior`` for every member of ``theta0 [B, D]`` at once (one optimiser, one leaf;
    each member draws its own minibatches). Raises ``FloatingPointError`` on a non-finite loss."""
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd'; got {optimizer!r}")
    if steps < 1:
        raise ValueError(f"steps must be positive; got {steps}")
    theta = log_posterior.check(theta0).detach().clone().requires_grad_(True)
    opt = torch.optim.Adam([theta], lr=lr) if optimizer == "adam" else torch.optim.SGD([theta], lr=lr, momentum=0.9)
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    B, N = theta.shape[0], log_posterior.n_data
    history = torch.empty(steps, B)
    checkpoints, state = [], {}
    from tqdm.auto import trange

    show = config.progress_enabled() if progress is None else progress
    start = time.perf_counter()
    for step in trange(steps, desc="MAP", disable=not show, leave=False):
        idx = minibatch_indices(N, batch_size, B, step, gen, state)
        loss = -log_posterior(theta, None if idx is None else idx.to(theta.device)) / N
        if not torch.isfinite(loss).all():
            raise FloatingPointError(f"MAP training diverged at step {step}: non-finite loss; lower lr (given {lr})")
        opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        opt.step()
        history[step] = loss.detach().cpu()
        if checkpoint_every and (step + 1) % checkpoint_every == 0:
            checkpoints.append(theta.detach().clone())
    return MAPResult(theta.detach(), history, torch.stack(checkpoints) if checkpoints else None,
                     time.perf_counter() - start)


def deep_ensemble(log_posterior: LogPosterior, n_members: int, *, steps: int, lr: float = 1e-2,
                  batch_size: int | None = None, generator: torch.Generator | None = None,
                  progress: bool | None = None) -> MAPResult:
    """``n_members`` MAP networks from independent initialisations (Lakshminarayanan et al., 2017)."""
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    theta0 = log_posterior.init(n_members, generator=gen)
    return fit_map(log_posterior, theta0, steps=steps, lr=lr, batch_size=batch_size, generator=gen,
                   progress=progress)


def sgd_trajectory(log_posterior: LogPosterior, n_runs: int, n_per_run: int, *, steps: int, lr: float = 1e-2,
                   optimizer: str = "adam", batch_size: int | None = None, burnin_fraction: float = 0.5,
                   generator: torch.Generator | None = None, progress: bool | None = None) -> Tensor:
    """Checkpoints along ``n_runs`` independent optimiser runs, ``n_per_run`` each, evenly spaced over the last
    ``1 - burnin_fraction`` of training (the target set of the published flow method): ``[n_runs * n_per_run, D]``."""
    if not 0 <= burnin_fraction < 1:
        raise ValueError(f"burnin_fraction must be in [0, 1); got {burnin_fraction}")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    every = max(int(steps * (1 - burnin_fraction)) // n_per_run, 1)
    run = fit_map(log_posterior, log_posterior.init(n_runs, generator=gen), steps=steps, lr=lr,
                  optimizer=optimizer, batch_size=batch_size, checkpoint_every=every, generator=gen,
                  progress=progress)
    ck = run.checkpoints[-n_per_run:]                                     # [K, R, D]
    return ck.transpose(0, 1).reshape(-1, ck.shape[-1])
