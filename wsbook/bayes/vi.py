"""Mean-field Gaussian variational inference for populations (Blundell et al., 2015; paper 003, sec. 2).

``q(theta) = N(mu, diag(sigma^2))`` per member, fitted by minimising ``KL(q || p_T)`` to the tempered
posterior ``p_T ∝ exp((log p(theta) + log p(D | theta)) / T)`` of the :class:`~wsbook.bayes.model.LogPosterior`
-- the same target as HMC, MAP and Laplace -- that is, by maximising

    ELBO_T(mu, sigma) = E_q[ (log p(D | theta) + log p(theta)) / T ] + H[q]
                      = (E_q[ log p(D | theta) ] - KL(q || p)) / T + (1 - 1/T) H[q]

(``T = 1``: the usual evidence lower bound). The reparameterisation ``theta = mu + sigma * eps`` (Kingma &
Welling, 2014) estimates the likelihood term, with minibatch log-likelihoods scaled by ``N / n``; the KL to
the Gaussian prior and the entropy are in closed form. All members (independent VI runs, each from its own
initialisation) are one ``[M, D]`` tensor and one Adam optimiser in :func:`wsbook.loop.descend`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from wsbook.bayes.model import GaussianPrior, LogPosterior, gaussian_kl
from wsbook.bayes.samples import SampleResult, member_draws
from wsbook.loop import Minibatches, descend, make_optimizer
from wsbook.nets import MLPSpec


@dataclass
class MeanFieldPosterior:
    """``M`` independent diagonal Gaussians: ``mean`` and ``std`` are ``[M, D]``; ``elbo`` is ``[steps, M]``
    (per-step single-sample estimates of the tempered ELBO, divided by ``N``)."""

    mean: Tensor
    std: Tensor
    spec: MLPSpec | None = None
    elbo: Tensor | None = field(default=None, repr=False)

    @property
    def n_members(self) -> int:
        return self.mean.shape[0]

    def sample(self, n: int, generator: torch.Generator | None = None) -> SampleResult:
        """``n`` weight draws spread over the members, draw-major: ``.samples [n, D]`` with row ``i`` from
        member ``.chain[i] = i % M``."""
        eps, member = member_draws(n, self.n_members, generator, self.mean.dtype, self.mean.shape[1],
                                   self.mean.device)
        draws = (self.mean + self.std * eps).reshape(-1, self.mean.shape[1])[:n]
        return SampleResult(samples=draws, chain=member, n_chains=self.n_members)

    def kl_to_prior(self, prior_std: Tensor | float) -> Tensor:
        """``KL(q_m || N(0, prior_std^2))`` per member, ``[M]``."""
        return gaussian_kl(self.mean, self.std, torch.as_tensor(prior_std, dtype=self.mean.dtype,
                                                                device=self.mean.device))


def gaussian_entropy(std: Tensor) -> Tensor:
    """Entropy of ``N(mean, diag(std^2))`` summed over the last axis."""
    return torch.log(std).sum(-1) + 0.5 * std.shape[-1] * (1.0 + math.log(2 * math.pi))


def fit_vi(log_posterior: LogPosterior, *, n_members: int, steps: int, lr: float = 1e-2,
           batch_size: int | None = None, init_std: float = 1e-3, init_mean: Tensor | None = None,
           n_mc: int = 1, anneal: bool = True, generator: torch.Generator | None = None,
           progress: bool | None = None) -> MeanFieldPosterior:
    """Mean-field VI on a :class:`LogPosterior`: ``n_members`` independent fits of its tempered posterior
    (see the module docstring), all batched. See chapter 2, "Inference".

    Args:
        log_posterior: the target; its public ``log_likelihood``, ``kl_to_prior`` and ``temperature`` are used.
        n_members: independent fits, each from its own initialisation.
        steps: Adam steps; lr: learning rate (with ``anneal`` a cosine decay to zero, so the noisy ELBO
            gradients settle).
        batch_size: minibatch per member (``None``: full batch).
        init_std: initial posterior standard deviation; init_mean: initial means ``[n_members, D]``
            (default: the spec's initialiser).
        n_mc: reparameterised samples per member and step.
        generator: random stream of initialisation, minibatches and noise (``None``: torch's global one).
        progress: show a progress bar.

    Returns:
        :class:`MeanFieldPosterior` with ``.mean``, ``.std`` ``[n_members, D]`` and the ELBO history.
    """
    if n_members < 1 or n_mc < 1:
        raise ValueError(f"n_members and n_mc must be positive; got {n_members}, {n_mc}")
    if init_std <= 0:
        raise ValueError(f"init_std must be positive; got {init_std}")
    if log_posterior.learn_noise:
        raise ValueError("fit_vi does not support learned noise; fix noise_std")
    lp = log_posterior
    gen = generator
    mu0 = lp.init(n_members, generator=gen) if init_mean is None else lp.check(init_mean.to(lp.x))
    if mu0.shape[0] != n_members:
        raise ValueError(f"init_mean has {mu0.shape[0]} rows but n_members={n_members}")
    mu = mu0.detach().clone().requires_grad_(True)
    rho = torch.full_like(mu, math.log(math.expm1(init_std))).requires_grad_(True)
    T = float(lp.temperature)
    opt = make_optimizer([mu, rho], "adam", lr=lr)
    batches = Minibatches(lp.n_data, batch_size, members=n_members, generator=gen, device=lp.x.device)

    def step_fn(step: int) -> Tensor:
        idx = batches(step)
        std = F.softplus(rho)
        eps = torch.randn(n_members, n_mc, mu.shape[1], generator=gen, dtype=mu.dtype).to(mu.device)
        theta = (mu.unsqueeze(1) + std.unsqueeze(1) * eps).reshape(n_members * n_mc, -1)
        batch = None if idx is None else idx.repeat_interleave(n_mc, 0)
        ll = lp.log_likelihood(theta, batch).view(n_members, n_mc).mean(1)
        elbo = (ll - lp.kl_to_prior(mu, std)) / T + (1.0 - 1.0 / T) * gaussian_entropy(std)
        return -elbo / lp.n_data

    run = descend(step_fn, opt, steps, schedule="cosine" if anneal else None, progress=progress,
                  desc="mean-field VI")
    return MeanFieldPosterior(mean=mu.detach(), std=F.softplus(rho).detach(), spec=lp.spec, elbo=-run.losses.cpu())


def fit_mean_field(spec: MLPSpec, x: Tensor, y: Tensor, *, n_members: int, steps: int, lr: float = 1e-2,
                   prior_std: float = 1.0, task: str = "classification", batch_size: int | None = None,
                   init_std: float = 1e-3, generator: torch.Generator | None = None, progress: bool | None = None,
                   noise_std: float = 1.0, temperature: float = 1.0, n_mc: int = 1,
                   anneal: bool = True) -> MeanFieldPosterior:
    """Fit ``n_members`` independent mean-field Gaussian posteriors (Bayes by backprop, Blundell et al., 2015)
    to an MLP on ``(x, y)``, all batched: :func:`fit_vi` on ``LogPosterior(spec, x, y, prior_std, task,
    noise_std, temperature)``. Result: ``.mean``, ``.std`` ``[n_members, D]``, ``.sample(n)``."""
    lp = LogPosterior(spec, x, y, GaussianPrior(prior_std), task, noise_std=noise_std, temperature=temperature)
    return fit_vi(lp, n_members=n_members, steps=steps, lr=lr, batch_size=batch_size, init_std=init_std,
                  n_mc=n_mc, anneal=anneal, generator=generator, progress=progress)
