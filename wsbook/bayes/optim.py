"""Point estimates of populations: MAP training, deep ensembles, and checkpoints along SGD/Adam runs.

A deep ensemble (Lakshminarayanan et al., 2017) is a population of MAP solutions from independent
initialisations; maximising ``log_posterior`` is training with weight decay ``1 / (prior_std^2 N)``.
Every run is one :func:`wsbook.loop.descend` over one ``[B, D]`` leaf, each member with its own minibatches.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from wsbook.bayes.model import LogPosterior
from wsbook.bayes.samples import SampleResult
from wsbook.loop import Minibatches, descend, make_optimizer


@dataclass
class MAPResult:
    """Final weights ``[B, D]`` (one row per member), the per-step negative log posterior per datum
    ``[steps, B]``, and optional checkpoints ``[K, B, D]`` taken every ``checkpoint_every`` steps."""

    theta: Tensor
    loss_history: Tensor
    checkpoints: Tensor | None = None
    seconds: float = 0.0


def fit_map(log_posterior: LogPosterior, theta0: Tensor, *, steps: int, lr: float = 1e-2, optimizer: str = "adam",
            batch_size: int | None = None, checkpoint_every: int | None = None,
            generator: torch.Generator | None = None, progress: bool | None = None) -> MAPResult:
    """Maximise ``log_posterior`` for every member of ``theta0 [B, D]`` at once (one optimiser, one leaf;
    each member draws its own minibatches). See chapter 2, "Inference".

    Args:
        log_posterior: the tempered log posterior (its maximiser does not depend on the temperature).
        theta0: starting points ``[B, D]``.
        steps: optimizer steps; lr: learning rate; optimizer: ``"adam"``, ``"adamw"`` or ``"sgd"`` (momentum 0.9).
        batch_size: minibatch per member (``None``: full batch).
        checkpoint_every: keep the weights every this many steps.
        generator: random stream of the minibatches (``None``: torch's global generator).
        progress: show a progress bar.

    Raises:
        FloatingPointError: on a non-finite loss (naming the step).
    """
    theta = log_posterior.check(theta0).detach().clone().requires_grad_(True)
    opt = make_optimizer([theta], optimizer, lr=lr, momentum=0.9 if optimizer == "sgd" else 0.0)
    B, N = theta.shape[0], log_posterior.n_data
    batches = Minibatches(N, batch_size, members=B, generator=generator, device=theta.device)
    checkpoints = []

    def step_fn(step: int) -> Tensor:
        return -log_posterior(theta, batches(step)) / N

    def keep(step: int) -> None:
        if checkpoint_every and (step + 1) % checkpoint_every == 0:
            checkpoints.append(theta.detach().clone())

    run = descend(step_fn, opt, steps, on_step=keep, progress=progress, desc="MAP")
    return MAPResult(theta.detach(), run.losses, torch.stack(checkpoints) if checkpoints else None, run.seconds)


def deep_ensemble(log_posterior: LogPosterior, n_members: int, *, steps: int, lr: float = 1e-2,
                  batch_size: int | None = None, generator: torch.Generator | None = None,
                  progress: bool | None = None) -> MAPResult:
    """``n_members`` MAP networks from independent initialisations (Lakshminarayanan et al., 2017); the
    members are the rows of ``.theta [n_members, D]``. Arguments as :func:`fit_map`."""
    theta0 = log_posterior.init(n_members, generator=generator)
    return fit_map(log_posterior, theta0, steps=steps, lr=lr, batch_size=batch_size, generator=generator,
                   progress=progress)


def sgd_trajectory(log_posterior: LogPosterior, n_runs: int, n_per_run: int, *, steps: int, lr: float = 1e-2,
                   optimizer: str = "adam", batch_size: int | None = None, burnin_fraction: float = 0.5,
                   generator: torch.Generator | None = None, progress: bool | None = None) -> SampleResult:
    """Checkpoints along ``n_runs`` independent optimiser runs, ``n_per_run`` each, evenly spaced over the last
    ``1 - burnin_fraction`` of training (the target set of the published flow method).

    Returns:
        :class:`~wsbook.bayes.samples.SampleResult` with ``samples [n_runs * n_per_run, D]`` draw-major (row
        ``k * n_runs + r`` is checkpoint ``k`` of run ``r``; ``chain`` holds the run).
    """
    if not 0 <= burnin_fraction < 1:
        raise ValueError(f"burnin_fraction must be in [0, 1); got {burnin_fraction}")
    if isinstance(n_per_run, bool) or not isinstance(n_per_run, int) or n_per_run < 1:
        raise ValueError(f"n_per_run must be a positive int; got {n_per_run!r}")
    every = max(int(steps * (1 - burnin_fraction)) // n_per_run, 1)
    run = fit_map(log_posterior, log_posterior.init(n_runs, generator=generator), steps=steps, lr=lr,
                  optimizer=optimizer, batch_size=batch_size, checkpoint_every=every, generator=generator,
                  progress=progress)
    if run.checkpoints is None or run.checkpoints.shape[0] < n_per_run:
        raise ValueError(f"{steps} steps give fewer than n_per_run={n_per_run} checkpoints; use more steps")
    ck = run.checkpoints[-n_per_run:]                                     # [K, R, D]
    return SampleResult.from_draws(ck, seconds=run.seconds, info={"checkpoint_every": every})
