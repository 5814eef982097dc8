"""Priors, likelihoods and the one signature every inference method uses.

``log_posterior(theta[B, D], batch) -> [B]`` is the unnormalised log density (thesis 000, eq. 2.2)

    log p_T(theta | D) = (1/T) [ log p(theta) + (N / |batch|) sum_{(x, y) in batch} log p(y | x, theta) ] + const,

for a population of ``B`` networks laid out by an :class:`~wsbook.nets.MLPSpec`. ``T`` is the posterior
temperature (``T < 1``: a cold posterior, Wenzel et al., 2020): prior and likelihood are tempered together,
and every inference method (HMC, SGLD/SGHMC, MAP, Laplace, mean-field VI) targets this same ``p_T``.
Swapping inference methods never touches it. See chapter 2, "Inference".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from wsbook import config
from wsbook.nets import MLPSpec, check_task

#: The likelihood family of each task kind.
LIKELIHOODS = {"classification": "categorical", "regression": "gaussian"}


@dataclass(frozen=True)
class GaussianPrior:
    """Isotropic Gaussian prior ``N(0, std^2 I)``; ``std`` may be one value or one per layer.

    With ``per_layer=True`` a layer's standard deviation is ``std / sqrt(fan_in)`` (a "scaled" prior whose
    function-space behaviour does not change with width, Neal 1996).
    """

    std: float | tuple[float, ...] = 1.0
    per_layer_scaled: bool = False

    def stds(self, spec: MLPSpec, device: torch.device | str | None = None,
             dtype: torch.dtype = torch.float32) -> Tensor:
        """Prior standard deviation of every coordinate, ``[D]``."""
        values = self.std if isinstance(self.std, (tuple, list)) else (self.std,) * spec.n_layers
        if len(values) != spec.n_layers:
            raise ValueError(f"prior std needs one value or {spec.n_layers} (one per layer); got {len(values)}")
        if any(float(v) <= 0 for v in values):
            raise ValueError(f"prior standard deviations must be positive; got {values}")
        out = torch.empty(spec.n_params, dtype=dtype)
        for layer, (_, fan_in) in enumerate(spec.layer_shapes):
            s = float(values[layer]) / (math.sqrt(fan_in) if self.per_layer_scaled else 1.0)
            w, b = spec.slices(layer)
            out[w] = s
            if b is not None:
                out[b] = s
        return out.to(device) if device is not None else out

    def log_prob(self, spec: MLPSpec, theta: Tensor) -> Tensor:
        """``log N(theta; 0, diag(stds^2))`` per member: ``[B]``."""
        s = self.stds(spec, theta.device, theta.dtype)
        z = theta / s
        return -0.5 * (z * z).sum(-1) - torch.log(s).sum() - 0.5 * spec.n_params * math.log(2 * math.pi)

    def sample(self, spec: MLPSpec, n: int, generator: torch.Generator | None = None,
               device: torch.device | str | None = None) -> Tensor:
        """``n`` draws from the prior, ``[n, D]``, on ``device`` (default :func:`wsbook.config.device`, as
        :meth:`MLPSpec.init`); drawn on the CPU from ``generator`` so a seed gives the same draws everywhere."""
        s = self.stds(spec)
        return (torch.randn(n, spec.n_params, generator=generator) * s).to(device or config.device())


def as_prior(prior: GaussianPrior | float | Sequence[float]) -> GaussianPrior:
    """Accept a prior object, one standard deviation, or one per layer."""
    if isinstance(prior, GaussianPrior):
        return prior
    if isinstance(prior, (int, float)):
        return GaussianPrior(float(prior))
    if isinstance(prior, (list, tuple)):
        return GaussianPrior(tuple(float(v) for v in prior))
    raise TypeError(f"prior must be a GaussianPrior, a float or a sequence of per-layer stds; got {type(prior).__name__}")


def log_likelihood(spec: MLPSpec, theta: Tensor, x: Tensor, y: Tensor, task: str = "classification",
                   noise_std: float | Tensor = 1.0) -> Tensor:
    """Summed log-likelihood of a batch for every member, ``[B]``.

    ``classification`` (categorical likelihood): ``sum_n log softmax(f(x_n))[y_n]``; ``regression`` (Gaussian
    likelihood): ``sum_n log N(y_n; f(x_n), sigma^2 I)``. ``x`` is ``[N, in]`` (shared) or ``[B, N, in]`` (one
    batch per member); ``y`` is ``[N]``/``[B, N]`` labels or ``[N, out]``/``[B, N, out]`` targets.
    ``noise_std`` may be a ``[B]`` tensor (learned noise).
    """
    task = check_task(task)
    out = spec.forward(theta, x)                       # [B, N, out]
    B, N = out.shape[0], out.shape[1]
    if task == "classification":
        if y.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"categorical likelihood needs integer labels; got dtype {y.dtype}")
        if y.shape[-1] != N:
            raise ValueError(f"y must hold {N} labels to match x; got shape {tuple(y.shape)}")
        # classes along dim 1 of the [B, C, N] tensor behind the forward's view: contiguous softmax
        logp = torch.log_softmax(out.transpose(1, 2), 1)
        target = y.expand(B, N) if y.dim() == 1 else y
        return torch.gather(logp, 1, target.unsqueeze(1).long()).squeeze(1).sum(-1)
    target = y.reshape(N, -1) if y.dim() <= 2 else y
    if target.shape[-2] != N or target.shape[-1] != out.shape[-1]:
        raise ValueError(f"regression likelihood: targets must be [N={N}, {out.shape[-1]}]; got {tuple(y.shape)}")
    sigma = torch.as_tensor(noise_std, dtype=out.dtype, device=out.device)
    sigma = sigma.view(-1, 1, 1) if sigma.dim() == 1 else sigma
    resid = (out - target) / sigma
    return (-0.5 * resid.pow(2) - torch.log(sigma).expand_as(resid) - 0.5 * math.log(2 * math.pi)).sum((-1, -2))


@dataclass
class LogPosterior:
    """``log_posterior(theta[B, D], batch=None) -> [B]`` for one spec, data set, prior, task and temperature.

    ``batch`` is ``None`` (full data), a ``LongTensor`` of indices ``[n]`` shared by all members or ``[B, n]``
    (one minibatch per member), or a pair ``(x, y)``. Minibatch log-likelihoods are scaled by ``N / n`` so
    they are unbiased for the full-data value. With ``learn_noise`` (regression) ``theta`` carries one
    extra last column, ``log sigma``, with a ``N(log noise_std, 1)`` prior.

    Args:
        spec: the architecture.
        x, y: training inputs ``[N, in]`` and labels ``[N]`` (classification) or targets ``[N, out]`` (regression).
        prior: a :class:`GaussianPrior`, one prior standard deviation, or one per layer.
        task: ``"classification"`` (categorical likelihood) or ``"regression"`` (Gaussian likelihood).
        noise_std: observation noise of the Gaussian likelihood.
        temperature: ``T`` in ``p_T = exp((log prior + log lik) / T)`` (the prior is tempered too).
        learn_noise: regression with ``log sigma`` as an extra parameter.
    """

    spec: MLPSpec
    x: Tensor
    y: Tensor
    prior: GaussianPrior | float = 1.0
    task: str = "classification"
    noise_std: float = 1.0
    temperature: float = 1.0
    learn_noise: bool = False

    def __post_init__(self) -> None:
        self.prior = as_prior(self.prior)
        self.task = check_task(self.task)
        if self.x.dim() != 2 or self.x.shape[1] != self.spec.widths[0]:
            raise ValueError(f"x must be [N, {self.spec.widths[0]}] for {self.spec}; got {tuple(self.x.shape)}")
        if self.y.shape[0] != self.x.shape[0]:
            raise ValueError(f"x has {self.x.shape[0]} examples but y has {self.y.shape[0]}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive; got {self.temperature}")
        if self.learn_noise and self.task != "regression":
            raise ValueError("learn_noise needs task='regression' (a Gaussian likelihood)")
        if self.task == "classification" and self.y.max() >= self.spec.widths[-1]:
            raise ValueError(f"labels go up to {int(self.y.max())} but the network has {self.spec.widths[-1]} outputs")

    @property
    def n_data(self) -> int:
        """``N``, the number of training examples."""
        return self.x.shape[0]

    @property
    def likelihood(self) -> str:
        """The likelihood family of the task: ``"categorical"`` or ``"gaussian"``."""
        return LIKELIHOODS[self.task]

    @property
    def dim(self) -> int:
        """Width of ``theta``: the spec's ``D`` plus one with learned noise."""
        return self.spec.n_params + int(self.learn_noise)

    def check(self, theta: Tensor) -> Tensor:
        """Validate ``theta`` as ``[B, dim]``."""
        if not isinstance(theta, Tensor) or theta.dim() != 2 or theta.shape[1] != self.dim:
            got = tuple(theta.shape) if isinstance(theta, Tensor) else type(theta).__name__
            raise ValueError(f"log_posterior expects theta of shape [B, {self.dim}] for {self.spec}; got {got}")
        return theta

    def batch(self, batch=None) -> tuple[Tensor, Tensor]:
        """The ``(x, y)`` of a batch given as ``None`` (all data), indices ``[n]`` / ``[B, n]`` or a pair."""
        if batch is None:
            return self.x, self.y
        if isinstance(batch, (tuple, list)):
            xb, yb = batch
            return xb, yb
        if isinstance(batch, Tensor) and batch.dtype in (torch.int64, torch.int32):
            return self.x[batch], self.y[batch]
        raise TypeError(f"batch must be None, an index tensor or an (x, y) pair; got {type(batch).__name__}")

    def split(self, theta: Tensor) -> tuple[Tensor, Tensor | float]:
        """Network weights ``[B, D]`` and the noise std (``[B]`` when learned)."""
        if self.learn_noise:
            return theta[:, :-1], theta[:, -1].exp()
        return theta, self.noise_std

    def log_likelihood(self, theta: Tensor, batch=None) -> Tensor:
        """Full-data-scaled log-likelihood ``(N/n) sum log p(y|x, theta)``, ``[B]``."""
        theta = self.check(theta)
        xb, yb = self.batch(batch)
        w, sigma = self.split(theta)
        n = xb.shape[-2]
        ll = log_likelihood(self.spec, w, xb, yb, self.task, sigma)
        return ll * (self.n_data / n)

    def log_prior(self, theta: Tensor) -> Tensor:
        """``log p(theta)``, ``[B]``."""
        theta = self.check(theta)
        w, _ = self.split(theta)
        lp = self.prior.log_prob(self.spec, w)
        if self.learn_noise:
            lp = lp - 0.5 * (theta[:, -1] - math.log(self.noise_std)) ** 2 - 0.5 * math.log(2 * math.pi)
        return lp

    def prior_stds(self) -> Tensor:
        """Prior standard deviation of every network weight, ``[D]`` (on the data's device and dtype)."""
        return self.prior.stds(self.spec, self.x.device, self.x.dtype)

    def kl_to_prior(self, mean: Tensor, std: Tensor) -> Tensor:
        """``KL(N(mean, diag(std^2)) || prior)`` per row of ``mean, std [M, D]``, in closed form: ``[M]``."""
        if self.learn_noise:
            raise ValueError("kl_to_prior covers the network weights only; fix noise_std (learn_noise=False)")
        return gaussian_kl(mean, std, self.prior.stds(self.spec, mean.device, mean.dtype))

    def __call__(self, theta: Tensor, batch=None) -> Tensor:
        """Tempered unnormalised log posterior ``(log p(theta) + log p(D | theta)) / T``, ``[B]``."""
        return (self.log_likelihood(theta, batch) + self.log_prior(theta)) / self.temperature

    def grad(self, theta: Tensor, batch=None) -> tuple[Tensor, Tensor]:
        """``(log_posterior [B], d log_posterior / d theta [B, D])`` by autograd."""
        with torch.enable_grad():
            t = theta.detach().requires_grad_(True)
            lp = self(t, batch)
            (g,) = torch.autograd.grad(lp.sum(), t)
        return lp.detach(), g

    def init(self, n: int, scheme: str = "kaiming", generator: torch.Generator | None = None,
             dtype: torch.dtype | None = None) -> Tensor:
        """``n`` starting points (the spec's initialiser; learned noise starts at ``log noise_std``)."""
        theta = self.spec.init(n, scheme, generator=generator, device=self.x.device, dtype=dtype or self.x.dtype)
        if self.learn_noise:
            theta = torch.cat([theta, torch.full((n, 1), math.log(self.noise_std), dtype=theta.dtype,
                                                 device=theta.device)], 1)
        return theta

    def to(self, dtype: torch.dtype) -> "LogPosterior":
        """The same posterior with data in ``dtype`` (e.g. float64 for HMC energies)."""
        y = self.y.to(dtype) if self.y.is_floating_point() else self.y
        return LogPosterior(self.spec, self.x.to(dtype), y, self.prior, self.task, self.noise_std,
                            self.temperature, self.learn_noise)


def gaussian_kl(mean: Tensor, std: Tensor, prior_std: Tensor) -> Tensor:
    """Closed-form ``KL(N(mean, std^2) || N(0, prior_std^2))`` summed over the last axis."""
    ratio = (std / prior_std) ** 2
    return 0.5 * (ratio + (mean / prior_std) ** 2 - 1.0 - torch.log(ratio)).sum(-1)
