"""Predictive distributions of populations and the metrics that compare them.

Shapes: a population's class probabilities are ``[B, N, C]``; a single predictive is ``[N, C]``.
Every metric also accepts leading batch dimensions (``[..., N, C]`` -> ``[...]``).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from wsbook.nets import MLPSpec, output_accuracy


def predictive_probs(spec: MLPSpec, theta: Tensor, x: Tensor, chunk: int = 4096,
                     max_elements: int = 2 ** 25) -> Tensor:
    """Class probabilities of every member on the shared inputs ``x [N, ...]``, ``[B, N, C]`` (softmax of the
    logits), computed without grad.

    The members are evaluated in blocks of about ``max_elements // (N * widest layer)`` networks (each block
    moved to ``x``'s device and dtype), every block on ``chunk`` inputs at a time, so that a large population
    on many inputs never holds all its activations at once.
    """
    theta = spec.check(theta)
    rows = max(1, max_elements // max(1, x.shape[0] * max(spec.widths[1:])))
    with torch.no_grad():
        return torch.cat([torch.cat([torch.softmax(spec.forward(block, x[i:i + chunk]), -1)
                                     for i in range(0, x.shape[0], chunk)], dim=1)
                          for block in (theta[s:s + rows].to(x) for s in range(0, theta.shape[0], rows))])


def bma(probs: Tensor, weights: Tensor | None = None) -> Tensor:
    """Bayesian model average ``p(y|x, D) ~ (1/B) sum_b p(y|x, theta_b)`` over the first axis (eq. 2.1)."""
    if weights is None:
        return probs.mean(0)
    w = weights / weights.sum()
    return torch.einsum("b,b...->...", w, probs)


def _check(p: Tensor, y: Tensor | None = None) -> None:
    if p.dim() < 2:
        raise ValueError(f"predictive must be [..., N, C]; got {tuple(p.shape)}")
    if y is not None and y.shape[-1] != p.shape[-2]:
        raise ValueError(f"labels have {y.shape[-1]} entries but the predictive has {p.shape[-2]} points")


def pointwise_nll(p: Tensor, y: Tensor, eps: float = 1e-12) -> Tensor:
    """Negative log predictive density of every point, ``-log p(y_n | x_n)`` (``[..., N]``): paired over the
    same points, two predictives' difference has a standard error (:func:`nll` is its mean)."""
    _check(p, y)
    picked = torch.gather(p, -1, y.expand(p.shape[:-1]).unsqueeze(-1)).squeeze(-1)
    return -picked.clamp_min(eps).log()


def nll(p: Tensor, y: Tensor, eps: float = 1e-12) -> Tensor:
    """Mean negative log predictive density ``-(1/N) sum_n log p(y_n | x_n)``."""
    return pointwise_nll(p, y, eps).mean(-1)


def accuracy(p: Tensor, y: Tensor) -> Tensor:
    """Fraction of points whose most probable class is the label (:func:`wsbook.nets.output_accuracy`)."""
    _check(p, y)
    return output_accuracy(p, y)


def brier(p: Tensor, y: Tensor) -> Tensor:
    """Brier score ``(1/N) sum_n ||p_n - onehot(y_n)||^2``."""
    _check(p, y)
    onehot = torch.nn.functional.one_hot(y, p.shape[-1]).to(p.dtype)
    return ((p - onehot) ** 2).sum(-1).mean(-1)


def ece(p: Tensor, y: Tensor, n_bins: int = 15) -> Tensor:
    """Expected calibration error with ``n_bins`` equal-width confidence bins (Guo et al., 2017).

    ``sum_bins (|bin| / N) * |accuracy(bin) - confidence(bin)|``.
    """
    _check(p, y)
    confidence, predicted = p.max(-1)
    correct = (predicted == y).to(p.dtype)
    bins = (confidence * n_bins).long().clamp_(0, n_bins - 1)
    shape = (*confidence.shape[:-1], n_bins)
    conf_sum = torch.zeros(shape, dtype=p.dtype, device=p.device).scatter_add_(-1, bins, confidence)
    acc_sum = torch.zeros(shape, dtype=p.dtype, device=p.device).scatter_add_(-1, bins, correct)
    return (acc_sum - conf_sum).abs().sum(-1) / confidence.shape[-1]


def agreement(p: Tensor, q: Tensor) -> Tensor:
    """Fraction of points where two predictives pick the same class (Izmailov et al., 2021)."""
    _check(p)
    return (p.argmax(-1) == q.argmax(-1)).float().mean(-1)


def total_variation(p: Tensor, q: Tensor) -> Tensor:
    """Mean total variation ``(1/N) sum_n (1/2) sum_c |p_nc - q_nc|`` (Izmailov et al., 2021)."""
    _check(p)
    return 0.5 * (p - q).abs().sum(-1).mean(-1)


# ------------------------------------------------------------------ regression
def rmse(mean: Tensor, y: Tensor) -> Tensor:
    """Root mean squared error of a predictive mean ``[..., N]`` (or ``[..., N, 1]``) against targets ``[N]``."""
    if mean.dim() >= 2 and mean.shape[-1] == 1 and mean.shape[-2] == y.reshape(-1).shape[0]:
        mean = mean.squeeze(-1)
    y = y.reshape(-1)
    if mean.shape[-1] != y.shape[0]:
        raise ValueError(f"predictive mean has {mean.shape[-1]} points but y has {y.shape[0]}")
    return ((mean - y) ** 2).mean(-1).sqrt()


def gaussian_nll(means: Tensor, y: Tensor, noise_std: float | Tensor, variances: Tensor | None = None) -> Tensor:
    """Negative log predictive density of the equal-weight Gaussian mixture
    ``(1/B) sum_b N(y; mu_b(x), sigma^2 + v_b(x))``, averaged over points: ``means`` is ``[B, N]`` (or
    ``[B, N, 1]``), ``variances`` optional per-member function variances (e.g. a linearized Laplace)."""
    if means.dim() == 3 and means.shape[-1] == 1:
        means = means.squeeze(-1)
    if variances is not None and variances.dim() == 3 and variances.shape[-1] == 1:
        variances = variances.squeeze(-1)
    y = y.reshape(-1)
    if means.dim() != 2 or means.shape[1] != y.shape[0]:
        raise ValueError(f"means must be [B, N={y.shape[0]}]; got {tuple(means.shape)}")
    var = torch.as_tensor(noise_std, dtype=means.dtype, device=means.device) ** 2
    var = var.reshape(-1, 1) if var.dim() == 1 else var
    if variances is not None:
        var = var + variances
    var = var.expand_as(means)
    logp = -0.5 * ((y - means) ** 2 / var + torch.log(2 * math.pi * var))
    # log B as a Python float: it takes the dtype of ``logp`` (a float32 tensor constant would cost float64
    # results about 1e-8)
    return -(torch.logsumexp(logp, 0) - math.log(means.shape[0])).mean()


# ------------------------------------------------------------- chain diagnostics
def _split(draws: Tensor) -> Tensor:
    """``[S, C, ...] -> [S//2, 2C, ...]``: each chain's two halves as separate chains (Gelman et al., 2013)."""
    if draws.dim() < 2 or draws.shape[0] < 4:
        raise ValueError(f"draws must be [S >= 4, C, ...] (draws, chains, ...); got {tuple(draws.shape)}")
    half = draws.shape[0] // 2
    return torch.cat([draws[:half], draws[draws.shape[0] - half:]], dim=1)


def split_rhat(draws: Tensor) -> Tensor:
    """Split-R-hat of every scalar in ``draws [S, C, ...]`` (draws, chains, then any shape): ``[...]``.

    Applied to network outputs ``f(x)`` this is the function-space R-hat of Izmailov et al. (2021).
    """
    x = _split(draws.to(torch.float64))
    n = x.shape[0]
    chain_mean = x.mean(0)
    w = x.var(0, unbiased=True).mean(0)
    b = n * chain_mean.var(0, unbiased=True)
    var_plus = (n - 1) / n * w + b / n
    return torch.sqrt(var_plus / w.clamp_min(1e-300))


def ess(draws: Tensor) -> Tensor:
    """Effective sample size of every scalar in ``draws [S, C, ...]`` across split chains, from the
    multi-chain autocorrelation truncated at the first negative sum of consecutive pairs (Geyer, 1992;
    Gelman et al., 2013, sec. 11.5): ``[...]``."""
    x = _split(draws.to(torch.float64))
    n, m = x.shape[0], x.shape[1]
    centered = x - x.mean(0)
    fft = torch.fft.rfft(centered, n=2 * n, dim=0)
    acov = torch.fft.irfft(fft * fft.conj(), n=2 * n, dim=0)[:n] / n          # [n, m, ...] biased autocov
    w = x.var(0, unbiased=True).mean(0)
    var_plus = (n - 1) / n * w + x.mean(0).var(0, unbiased=True)
    rho = 1 - (w - acov.mean(1)) / var_plus.clamp_min(1e-300)               # [n, ...]
    rho[0] = 1.0
    n_pairs = n // 2
    pairs = rho[:2 * n_pairs].reshape(n_pairs, 2, *rho.shape[1:]).sum(1)     # [n_pairs, ...]
    keep = torch.cumprod((pairs > 0).to(pairs.dtype), 0)
    tau = -1 + 2 * (pairs * keep).sum(0)
    return (m * n / tau.clamp_min(1.0 / (m * n))).clamp_max(m * n * math.log10(m * n))


def predictive_entropy(p: Tensor) -> Tensor:
    """Entropy ``-sum_c p_c log p_c`` of class probabilities ``[..., C]`` (at most ``log C``)."""
    return -(p * torch.log(p.clamp_min(1e-12))).sum(-1)
