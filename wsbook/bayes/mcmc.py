"""Chain-based samplers, every chain of a batch advanced at once: HMC, SGLD, SGHMC.

* HMC (Duane et al., 1987; Neal, 2011): full-batch leapfrog trajectories, a Metropolis-Hastings correction
  with energies accumulated in float64, per-chain step sizes adapted in warm-up by dual averaging
  (Hoffman & Gelman, 2014), and non-finite or exploding energies counted as divergences and rejected.
* SGLD (Welling & Teh, 2011): ``theta += (eps/2) grad log p_hat + N(0, eps)`` with a decaying step size.
* SGHMC (Chen et al., 2014): momentum with friction ``alpha`` and matching injected noise.

All take a :class:`~wsbook.bayes.model.LogPosterior` (or any callable ``log_posterior(theta[B, D], batch) -> [B]``)
and a ``[C, D]`` batch of starting points, and return a :class:`~wsbook.bayes.samples.SampleResult`: samples
``[S * C, D]`` draw-major (row ``s * C + c``), with the chain of every row in ``.chain`` and
``.by_chain()`` giving ``[S, C, D]`` for the chain diagnostics.
"""
from __future__ import annotations

import math
import time
import warnings
from typing import Callable

import torch
from torch import Tensor

from wsbook import config, distributed
from wsbook.bayes.samples import SampleResult
from wsbook.loop import Minibatches

LogDensity = Callable[..., Tensor]


def _value_and_grad(log_posterior: LogDensity, theta: Tensor, batch=None) -> tuple[Tensor, Tensor]:
    """``log p [C]`` and its gradient ``[C, D]``, checking the log density's shape."""
    with torch.enable_grad():
        t = theta.detach().requires_grad_(True)
        lp = log_posterior(t, batch) if batch is not None else log_posterior(t)
        if not isinstance(lp, Tensor) or lp.shape != (theta.shape[0],):
            got = tuple(lp.shape) if isinstance(lp, Tensor) else type(lp).__name__
            raise ValueError(f"log_posterior must map theta [C, D] = {tuple(theta.shape)} to [C] = "
                             f"[{theta.shape[0]}]; got {got}")
        (g,) = torch.autograd.grad(lp.sum(), t)
    return lp.detach(), g


class DualAveraging:
    """Per-chain step-size adaptation towards a target acceptance rate (Hoffman & Gelman, 2014, alg. 5)."""

    def __init__(self, step_size: Tensor, target: float = 0.8, gamma: float = 0.05, t0: float = 10.0,
                 kappa: float = 0.75):
        self.mu = torch.log(10 * step_size)
        self.target, self.gamma, self.t0, self.kappa = target, gamma, t0, kappa
        self.h_bar = torch.zeros_like(step_size)
        self.log_eps_bar = torch.zeros_like(step_size)
        self.t = 0

    def update(self, accept_prob: Tensor) -> Tensor:
        """Feed one acceptance probability per chain; return the next step sizes."""
        self.t += 1
        t = self.t
        w = 1.0 / (t + self.t0)
        self.h_bar = (1 - w) * self.h_bar + w * (self.target - accept_prob)
        log_eps = self.mu - math.sqrt(t) / self.gamma * self.h_bar
        eta = t ** (-self.kappa)
        self.log_eps_bar = eta * log_eps + (1 - eta) * self.log_eps_bar
        return log_eps.exp()

    def final(self) -> Tensor:
        return self.log_eps_bar.exp()


def hmc(log_posterior: LogDensity, theta0: Tensor, *, n_samples: int, n_warmup: int = 100, n_leapfrog: int = 20,
        step_size: float = 1e-3, target_accept: float = 0.8, thin: int = 1, jitter: float = 0.2,
        max_energy_error: float = 1000.0, dtype: torch.dtype = torch.float64,
        compute_dtype: torch.dtype | None = None, generator: torch.Generator | None = None,
        progress: bool | None = None, shard: bool | None = None) -> SampleResult:
    """Hamiltonian Monte Carlo for ``C`` chains at once (Neal, 2011), identity mass matrix.

    Each iteration draws momenta, runs ``n_leapfrog`` leapfrog steps (the step size jittered by ``+-jitter``
    per chain and iteration), and accepts with probability ``min(1, exp(H_0 - H_1))``; ``H`` is computed in
    ``dtype`` (float64 by default; positions and momenta are kept in ``dtype`` too). With ``compute_dtype``
    (e.g. float32, much faster on GPUs) the network and its gradient are evaluated in that precision and
    cast back, while positions, momenta and the Hamiltonian stay in ``dtype``. Step sizes adapt per chain by dual
    averaging during ``n_warmup`` iterations and are then frozen. A proposal whose energy is non-finite or
    whose energy error exceeds ``max_energy_error`` is rejected and counted in ``n_divergent`` (never accepted).
    ``n_samples`` draws per chain are kept after warm-up, every ``thin``-th iteration; the result holds them
    as ``[n_samples * C, D]`` draw-major (see :class:`~wsbook.bayes.samples.SampleResult`).
    See chapter 2, "Inference".

    Args:
        log_posterior: ``log_posterior(theta [C, D]) -> [C]``, e.g. a :class:`~wsbook.bayes.model.LogPosterior`.
        theta0: starting points ``[C, D]``, one per chain.
        n_samples: draws kept per chain; n_warmup: adaptation iterations; thin: keep every ``thin``-th.
        n_leapfrog: leapfrog steps per trajectory; step_size: initial step size; jitter: relative jitter.
        target_accept: acceptance rate the dual averaging aims at.
        max_energy_error: energy errors above this count as divergences.
        dtype: precision of positions, momenta and energies; compute_dtype: precision of the network.
        generator: random stream of momenta, jitter and acceptance (``None``: torch's global generator).
        progress: show a progress bar.
        shard: under ``torchrun`` (:mod:`wsbook.distributed`), split the chains over the processes: every
            process draws all chains' random numbers and advances its own block, and the blocks are gathered,
            so the result equals the single-process run (bit for bit on CPUs). ``None``: whenever a process
            group is running and every process gets a block (:func:`wsbook.distributed.splits`).
    """
    if theta0.dim() != 2:
        raise ValueError(f"theta0 must be [C, D] (one row per chain); got {tuple(theta0.shape)}")
    if n_samples < 1 or n_leapfrog < 1 or n_warmup < 0 or thin < 1:
        raise ValueError(f"need n_samples>=1, n_leapfrog>=1, n_warmup>=0, thin>=1; got "
                         f"{n_samples}, {n_leapfrog}, {n_warmup}, {thin}")
    if step_size <= 0:
        raise ValueError(f"step_size must be positive; got {step_size}")
    gen = generator
    C_all = theta0.shape[0]
    split = shard is not False and distributed.splits(C_all)
    rows = distributed.shard(C_all) if split else slice(0, C_all)   # this process's chains
    theta = theta0[rows].detach().to(dtype).clone()
    C, D = theta.shape
    dev = theta.device
    eps = torch.full((C,), float(step_size), dtype=dtype, device=dev)

    def value_and_grad(q: Tensor) -> tuple[Tensor, Tensor]:
        if compute_dtype is None:
            return _value_and_grad(log_posterior, q)
        v, g = _value_and_grad(log_posterior, q.to(compute_dtype))
        return v.to(dtype), g.to(dtype)

    adapt = DualAveraging(eps, target=target_accept)
    lp, grad = value_and_grad(theta)
    if not torch.isfinite(lp).all():
        raise ValueError("log_posterior is not finite at the initial state of chains "
                         f"{(~torch.isfinite(lp)).nonzero().flatten().tolist()[:10]}")
    total = n_warmup + n_samples * thin
    samples, logps = [], []
    accepted = torch.zeros(C, dtype=dtype, device=dev)
    divergent = torch.zeros(C, dtype=torch.long, device=dev)
    divergent_warmup = torch.zeros_like(divergent)
    from tqdm.auto import trange

    show = config.progress_enabled() if progress is None else progress
    start = time.perf_counter()
    for it in trange(total, desc="HMC", disable=not show, leave=False):
        u = torch.rand(C_all, generator=gen, dtype=dtype)[rows].to(dev)     # all chains' draws, own block kept
        h = eps * (1 + jitter * (2 * u - 1))
        p = torch.randn(C_all, D, generator=gen, dtype=dtype)[rows].to(dev)
        h0 = -lp + 0.5 * (p * p).sum(1)
        q, g = theta, grad
        p = p + 0.5 * h[:, None] * g
        for k in range(n_leapfrog):
            q = q + h[:, None] * p
            lp_new, g = value_and_grad(q)
            if k < n_leapfrog - 1:
                p = p + h[:, None] * g
        p = p + 0.5 * h[:, None] * g
        h1 = -lp_new + 0.5 * (p * p).sum(1)
        delta = h0 - h1
        finite = torch.isfinite(delta) & torch.isfinite(q).all(1) & torch.isfinite(g).all(1)
        diverged = ~finite | (-delta > max_energy_error)
        accept_prob = torch.where(diverged, torch.zeros_like(delta), torch.exp(torch.clamp(delta, max=0.0)))
        accept = (torch.rand(C_all, generator=gen, dtype=dtype)[rows].to(dev) < accept_prob) & ~diverged
        theta = torch.where(accept[:, None], q, theta)
        lp = torch.where(accept, lp_new, lp)
        grad = torch.where(accept[:, None], g, grad)
        divergent += diverged.long()
        if it < n_warmup:
            eps = adapt.update(accept_prob)
            if it == n_warmup - 1:
                eps = adapt.final()
                divergent_warmup = divergent.clone()
        else:
            accepted += accept.to(dtype)
            if (it - n_warmup + 1) % thin == 0:    # torch.where gave fresh tensors: kept without a copy
                samples.append(theta)
                logps.append(lp)
    seconds = time.perf_counter() - start
    n_kept_iters = total - n_warmup
    draws, draw_logps = torch.stack(samples), torch.stack(logps)
    if split:                                                   # every process's block of chains, in order
        gather = distributed.all_gather_rows
        draws, draw_logps = gather(draws, 1), gather(draw_logps, 1)
        accepted, eps, divergent, divergent_warmup = (gather(v) for v in (accepted, eps, divergent, divergent_warmup))
    n_div = divergent.cpu()
    n_after = int((divergent - divergent_warmup).sum())
    if n_after > 0:
        warnings.warn(f"HMC: {n_after} divergent transitions after warm-up (rejected); "
                      "consider a smaller step size or a higher target_accept", RuntimeWarning, stacklevel=2)
    return SampleResult.from_draws(draws, draw_logps,
                                   accept_rate=(accepted / n_kept_iters).cpu(), step_size=eps.cpu(), n_divergent=n_div,
                                   seconds=seconds, info={"n_leapfrog": n_leapfrog, "n_warmup": n_warmup, "thin": thin,
                                                          "n_divergent_after_warmup": n_after})


def step_schedule(step: int, total: int, lr: float, schedule: str = "polynomial", gamma: float = 0.55,
                  n_cycles: int = 1) -> float:
    """Step size at ``step``: ``constant``; ``polynomial`` ``lr (1 + step/b)^-gamma`` with ``b = total/10``
    (Welling & Teh, 2011); ``cosine`` cyclical, restarting ``n_cycles`` times (Zhang et al., 2020)."""
    if schedule == "constant":
        return lr
    if schedule == "polynomial":
        return lr * (1 + step / max(total / 10, 1)) ** (-gamma)
    if schedule == "cosine":
        period = math.ceil(total / n_cycles)
        return lr * 0.5 * (math.cos(math.pi * (step % period) / period) + 1)
    raise ValueError(f"unknown schedule {schedule!r}; use constant, polynomial or cosine")


def _sg_sampler(kind: str, log_posterior, theta0: Tensor, *, n_samples: int, n_burnin: int, lr: float,
                batch_size: int | None, thin: int, schedule: str, friction: float, n_cycles: int,
                generator: torch.Generator | None, progress: bool | None) -> SampleResult:
    if theta0.dim() != 2:
        raise ValueError(f"theta0 must be [C, D] (one row per chain); got {tuple(theta0.shape)}")
    if n_samples < 1 or n_burnin < 0 or thin < 1 or lr <= 0:
        raise ValueError(f"need n_samples>=1, n_burnin>=0, thin>=1, lr>0; got {n_samples}, {n_burnin}, {thin}, {lr}")
    gen = generator
    theta = theta0.detach().clone()
    C, D = theta.shape
    n_data = getattr(log_posterior, "n_data", None)
    if batch_size is not None and n_data is None:
        raise ValueError("minibatches need a log_posterior with n_data (a LogPosterior)")
    batches = Minibatches(n_data, batch_size, members=C, generator=gen, device=theta.device) \
        if batch_size is not None else None
    v = torch.zeros_like(theta)
    total = n_burnin + n_samples * thin
    samples, logps = [], []
    from tqdm.auto import trange

    show = config.progress_enabled() if progress is None else progress
    start = time.perf_counter()
    for it in trange(total, desc=kind.upper(), disable=not show, leave=False):
        idx = batches(it) if batches is not None else None
        lp, g = _value_and_grad(log_posterior, theta, idx)
        if not torch.isfinite(g).all():
            raise FloatingPointError(f"{kind}: non-finite gradient at iteration {it}; lower lr (given {lr})")
        h = step_schedule(it, total, lr, schedule, n_cycles=n_cycles)
        noise = torch.randn(C, D, generator=gen, dtype=theta.dtype).to(theta.device)
        if kind == "sgld":
            theta = theta + 0.5 * h * g + math.sqrt(h) * noise
        else:  # SGHMC with v = momentum * step: v <- (1 - a) v + h grad + N(0, 2 a h)
            v = (1 - friction) * v + h * g + math.sqrt(2 * friction * h) * noise
            theta = theta + v
        if it >= n_burnin and (it - n_burnin + 1) % thin == 0:
            samples.append(theta.clone())
            logps.append(lp)
    return SampleResult.from_draws(torch.stack(samples), torch.stack(logps), seconds=time.perf_counter() - start,
                                   info={"lr": lr, "schedule": schedule, "batch_size": batch_size})


def sgld(log_posterior, theta0: Tensor, *, n_samples: int, n_burnin: int = 1000, lr: float = 1e-4,
         batch_size: int | None = None, thin: int = 10, schedule: str = "polynomial", n_cycles: int = 1,
         generator: torch.Generator | None = None, progress: bool | None = None) -> SampleResult:
    """Stochastic-gradient Langevin dynamics (Welling & Teh, 2011) for ``C`` chains at once:
    ``theta <- theta + (h_t/2) grad log p_hat(theta) + N(0, h_t I)``, one minibatch per chain.

    Args:
        log_posterior: a :class:`~wsbook.bayes.model.LogPosterior` (or a callable with ``n_data`` for minibatches).
        theta0: starting points ``[C, D]``, one per chain.
        n_samples: draws kept per chain; n_burnin: iterations discarded first; thin: keep every ``thin``-th.
        lr: step size ``h``; schedule, n_cycles: its schedule (:func:`step_schedule`).
        batch_size: minibatch per chain (``None``: full batch).
        generator: random stream of noise and minibatches (``None``: torch's global generator).
        progress: show a progress bar.

    Returns:
        :class:`~wsbook.bayes.samples.SampleResult` with ``[n_samples * C, D]`` draw-major samples.
    """
    return _sg_sampler("sgld", log_posterior, theta0, n_samples=n_samples, n_burnin=n_burnin, lr=lr,
                       batch_size=batch_size, thin=thin, schedule=schedule, friction=0.0, n_cycles=n_cycles,
                       generator=generator, progress=progress)


def sghmc(log_posterior, theta0: Tensor, *, n_samples: int, n_burnin: int = 1000, lr: float = 1e-5,
          friction: float = 0.1, batch_size: int | None = None, thin: int = 10, schedule: str = "constant",
          n_cycles: int = 1, generator: torch.Generator | None = None, progress: bool | None = None) -> SampleResult:
    """Stochastic-gradient HMC (Chen et al., 2014, eq. 15) for ``C`` chains at once:
    ``v <- (1 - alpha) v + h grad log p_hat + N(0, 2 alpha h)``, ``theta <- theta + v``. Arguments as
    :func:`sgld`, plus ``friction`` ``alpha`` in ``(0, 1]``; returns a draw-major :class:`SampleResult`."""
    if not 0 < friction <= 1:
        raise ValueError(f"friction must be in (0, 1]; got {friction}")
    return _sg_sampler("sghmc", log_posterior, theta0, n_samples=n_samples, n_burnin=n_burnin, lr=lr,
                       batch_size=batch_size, thin=thin, schedule=schedule, friction=friction, n_cycles=n_cycles,
                       generator=generator, progress=progress)
