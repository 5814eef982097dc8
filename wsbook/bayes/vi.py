"""Mean-field Gaussian variational inference for populations (Blundell et al., 2015; paper 003, sec. 2).

``q(theta) = N(mu, diag(sigma^2))`` per member, fitted by maximising the evidence lower bound

    ELBO(mu, sigma) = E_q[ log p(D | theta) ] - T * KL(q || p),

with the reparameterisation ``theta = mu + sigma * eps`` (Kingma & Welling, 2014), the KL to the Gaussian
prior in closed form, and minibatch log-likelihoods scaled by ``N / n``. All members (independent VI runs,
each from its own initialisation) are one ``[M, D]`` tensor and one Adam optimiser.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from wsbook import config
from wsbook.bayes.model import GaussianPrior, LogPosterior, minibatch_indices
from wsbook.nets import MLPSpec


@dataclass
class MeanFieldPosterior:
    """``M`` independent diagonal Gaussians: ``mean`` and ``std`` are ``[M, D]``; ``elbo`` is ``[steps, M]``
    (per-step single-sample estimates, divided by ``N``)."""

    mean: Tensor
    std: Tensor
    spec: MLPSpec | None = None
    elbo: Tensor | None = field(default=None, repr=False)

    @property
    def n_members(self) -> int:
        return self.mean.shape[0]

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` draws from every member: ``[M, n, D]``."""
        if n < 1:
            raise ValueError(f"n must be a positive number of samples; got {n}")
        eps = torch.randn(self.mean.shape[0], n, self.mean.shape[1], generator=generator, dtype=self.mean.dtype)
        return self.mean.unsqueeze(1) + self.std.unsqueeze(1) * eps.to(self.mean.device)

    def kl_to_prior(self, prior_std: Tensor | float) -> Tensor:
        """``KL(q_m || N(0, prior_std^2))`` per member, ``[M]``."""
        return gaussian_kl(self.mean, self.std, torch.as_tensor(prior_std, dtype=self.mean.dtype,
                                                                device=self.mean.device))


def gaussian_kl(mean: Tensor, std: Tensor, prior_std: Tensor) -> Tensor:
    """Closed-form ``KL(N(mean, std^2) || N(0, prior_std^2))`` summed over the last axis."""
    ratio = (std / prior_std) ** 2
    return 0.5 * (ratio + (mean / prior_std) ** 2 - 1.0 - torch.log(ratio)).sum(-1)


def fit_vi(log_posterior: LogPosterior, *, n_members: int, steps: int, lr: float = 1e-2,
           batch_size: int | None = None, init_std: float = 1e-3, init_mean: Tensor | None = None,
           n_mc: int = 1, anneal: bool = True, generator: torch.Generator | None = None,
           progress: bool | None = None) -> MeanFieldPosterior:
    """Mean-field VI on a :class:`LogPosterior` (its Gaussian prior gives the analytic KL; its temperature
    weights the KL). ``n_mc`` reparameterised samples per member and step; with ``anneal`` the learning rate
    follows a cosine schedule to zero, so the noisy ELBO gradients settle. Returns a :class:`MeanFieldPosterior`.
    """
    if n_members < 1 or steps < 1 or n_mc < 1:
        raise ValueError(f"n_members, steps and n_mc must be positive; got {n_members}, {steps}, {n_mc}")
    if init_std <= 0:
        raise ValueError(f"init_std must be positive; got {init_std}")
    if log_posterior.learn_noise:
        raise ValueError("fit_vi does not support learned noise; fix noise_std")
    lp = log_posterior
    spec = lp.spec
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    mu0 = lp.init(n_members, generator=gen) if init_mean is None else spec.check(init_mean).to(lp.x)
    if mu0.shape[0] != n_members:
        raise ValueError(f"init_mean has {mu0.shape[0]} rows but n_members={n_members}")
    mu = mu0.detach().clone().requires_grad_(True)
    rho = torch.full_like(mu, math.log(math.expm1(init_std))).requires_grad_(True)
    prior_std = lp.prior.stds(spec, mu.device, mu.dtype)
    opt = torch.optim.Adam([mu, rho], lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps) if anneal else None
    history = torch.empty(steps, n_members)
    state: dict = {}
    from tqdm.auto import trange

    show = config.progress_enabled() if progress is None else progress
    for step in trange(steps, desc="mean-field VI", disable=not show, leave=False):
        idx = minibatch_indices(lp.n_data, batch_size, n_members, step, gen, state)
        std = F.softplus(rho)
        eps = torch.randn(n_members, n_mc, mu.shape[1], generator=gen, dtype=mu.dtype).to(mu.device)
        theta = (mu.unsqueeze(1) + std.unsqueeze(1) * eps).reshape(n_members * n_mc, -1)
        if idx is None:
            batch = None
        else:
            idx = idx.to(lp.x.device).repeat_interleave(n_mc, 0)
            batch = (lp.x[idx], lp.y[idx])
        ll = lp.log_likelihood(theta, batch).view(n_members, n_mc).mean(1)
        elbo = ll - lp.temperature * gaussian_kl(mu, std, prior_std)
        if not torch.isfinite(elbo).all():
            raise FloatingPointError(f"VI diverged at step {step}: non-finite ELBO; lower lr (given {lr})")
        opt.zero_grad(set_to_none=True)
        (-elbo.sum() / lp.n_data).backward()
        opt.step()
        if sched is not None:
            sched.step()
        history[step] = elbo.detach().cpu() / lp.n_data
    return MeanFieldPosterior(mean=mu.detach(), std=F.softplus(rho).detach(), spec=spec, elbo=history)


def fit_mean_field(spec: MLPSpec, x: Tensor, y: Tensor, *, n_members: int, steps: int, lr: float = 1e-2,
                   prior_std: float = 1.0, likelihood: str = "categorical", batch_size: int | None = None,
                   init_std: float = 1e-3, generator: torch.Generator | None = None, progress: bool | None = None,
                   noise_std: float = 1.0, temperature: float = 1.0, n_mc: int = 1,
                   anneal: bool = True) -> MeanFieldPosterior:
    """Fit ``n_members`` independent mean-field Gaussian posteriors (Bayes by backprop, Blundell et al., 2015)
    to an MLP on ``(x, y)``, all batched. Result: ``.mean``, ``.std`` ``[n_members, D]``, ``.sample(n)``."""
    lp = LogPosterior(spec, x, y, GaussianPrior(prior_std), likelihood, noise_std=noise_std,
                      temperature=temperature)
    return fit_vi(lp, n_members=n_members, steps=steps, lr=lr, batch_size=batch_size, init_std=init_std,
                  n_mc=n_mc, anneal=anneal, generator=generator, progress=progress)
