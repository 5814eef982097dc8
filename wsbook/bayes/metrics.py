"""Predictive distributions of populations and the metrics that compare them.

Shapes: a population's class probabilities are ``[B, N, C]``; a single predictive is ``[N, C]``.
Every metric also accepts leading batch dimensions (``[..., N, C]`` -> ``[...]``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from wsbook.nets import MLPSpec


def predictive_probs(spec: MLPSpec, theta: Tensor, x: Tensor, chunk: int = 4096) -> Tensor:
    """Class probabilities of every member, ``[B, N, C]`` (softmax of the logits), computed without grad."""
    with torch.no_grad():
        return torch.cat([torch.softmax(spec.forward(theta, x[i:i + chunk]), -1)
                          for i in range(0, x.shape[0], chunk)], dim=1)


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


def nll(p: Tensor, y: Tensor, eps: float = 1e-12) -> Tensor:
    """Mean negative log predictive density ``-(1/N) sum_n log p(y_n | x_n)``."""
    _check(p, y)
    picked = torch.gather(p, -1, y.expand(p.shape[:-1]).unsqueeze(-1)).squeeze(-1)
    return -(picked.clamp_min(eps).log()).mean(-1)


def accuracy(p: Tensor, y: Tensor) -> Tensor:
    """Fraction of points whose most probable class is the label."""
    _check(p, y)
    return (p.argmax(-1) == y).float().mean(-1)


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
    count = torch.zeros(shape, dtype=p.dtype, device=p.device).scatter_add_(-1, bins, torch.ones_like(confidence))
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
