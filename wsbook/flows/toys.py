"""Toy source and target distributions for the flow chapters, with samplers and (where known) exact
log-densities: 8 Gaussians, two moons, isotropic Gaussian mixtures in R^d and von Mises-Fisher mixtures
on the sphere S^2."""
from __future__ import annotations

import math

import torch

Tensor = torch.Tensor


class GaussianMixture:
    """sum_k w_k N(mu_k, s_k^2 I) in R^d, with exact ``log_prob``."""

    def __init__(self, means: Tensor, stds: Tensor | float, weights: Tensor | None = None):
        means = torch.as_tensor(means, dtype=torch.float32)
        if means.dim() != 2:
            raise ValueError(f"GaussianMixture: expected means [K, d], got {tuple(means.shape)}")
        k = means.shape[0]
        stds = torch.as_tensor(stds, dtype=torch.float32).expand(k).clone()
        weights = torch.full((k,), 1.0 / k) if weights is None else torch.as_tensor(weights, dtype=torch.float32)
        if (stds <= 0).any() or weights.shape != (k,) or (weights < 0).any():
            raise ValueError("GaussianMixture: stds must be positive and weights a non-negative [K] vector")
        self.means, self.stds, self.weights = means, stds, weights / weights.sum()
        self.dim = means.shape[1]

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        comp = torch.multinomial(self.weights, n, replacement=True, generator=generator)
        return self.means[comp] + self.stds[comp, None] * torch.randn(n, self.dim, generator=generator)

    def log_prob(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"GaussianMixture.log_prob: expected [..., {self.dim}], got {tuple(x.shape)}")
        x = x.to(self.means)
        sq = ((x[..., None, :] - self.means) ** 2).sum(-1)
        comp = (-0.5 * sq / self.stds ** 2 - self.dim * torch.log(self.stds)
                - 0.5 * self.dim * math.log(2 * math.pi) + torch.log(self.weights))
        return torch.logsumexp(comp, -1)

    __call__ = sample


def eight_gaussians(radius: float = 2.0, std: float = 0.15) -> GaussianMixture:
    """Eight equal Gaussians on a circle of ``radius``."""
    ang = torch.arange(8) * (2 * math.pi / 8)
    return GaussianMixture(radius * torch.stack([ang.cos(), ang.sin()], 1), std)


def ring_mixture(n: int = 6, radius: float = 2.5, std: float = 0.35) -> GaussianMixture:
    """``n`` Gaussians on a ring with unequal weights (a target with a known density for likelihood checks)."""
    ang = torch.arange(n) * (2 * math.pi / n) + 0.3
    w = torch.linspace(1.0, 2.0, n)
    return GaussianMixture(radius * torch.stack([ang.cos(), ang.sin()], 1), std, w)


def two_moons(n: int, generator: torch.Generator | None = None, noise: float = 0.08, scale: float = 1.5) -> Tensor:
    """Two interleaved half circles (as sklearn's make_moons), centred and scaled by ``scale``."""
    upper = torch.rand(n, generator=generator) < 0.5
    s = torch.rand(n, generator=generator) * math.pi
    x = torch.where(upper, torch.cos(s), 1 - torch.cos(s))
    y = torch.where(upper, torch.sin(s), 0.5 - torch.sin(s))
    pts = torch.stack([x - 0.5, y - 0.25], 1) * scale
    return pts + noise * scale * torch.randn(n, 2, generator=generator)


def standard_normal(dim: int):
    """Sampler ``(n, generator) -> [n, dim]`` of N(0, I)."""
    return lambda n, generator=None: torch.randn(n, dim, generator=generator)


class VonMisesFisherMixture:
    """sum_k w_k vMF(mu_k, kappa_k) on the unit sphere S^2 in R^3, with exact sampling and ``log_prob``
    (density w.r.t. the area measure: kappa / (4 pi sinh kappa) exp(kappa mu^T x))."""

    def __init__(self, mus: Tensor, kappas: Tensor | float, weights: Tensor | None = None):
        mus = torch.as_tensor(mus, dtype=torch.float32)
        if mus.dim() != 2 or mus.shape[1] != 3:
            raise ValueError(f"VonMisesFisherMixture: expected mean directions [K, 3], got {tuple(mus.shape)}")
        k = mus.shape[0]
        self.mus = mus / mus.norm(dim=1, keepdim=True)
        self.kappas = torch.as_tensor(kappas, dtype=torch.float32).expand(k).clone()
        if (self.kappas <= 0).any():
            raise ValueError("VonMisesFisherMixture: concentrations must be positive")
        w = torch.full((k,), 1.0 / k) if weights is None else torch.as_tensor(weights, dtype=torch.float32)
        self.weights = w / w.sum()
        self.dim = 3

    def log_prob(self, x: Tensor) -> Tensor:
        if x.shape[-1] != 3:
            raise ValueError(f"VonMisesFisherMixture.log_prob: expected [..., 3], got {tuple(x.shape)}")
        k = self.kappas
        # log C(kappa) = log kappa - log(2 pi) - kappa - log(1 - exp(-2 kappa)), stable for large kappa
        log_c = torch.log(k) - math.log(2 * math.pi) - k - torch.log1p(-torch.exp(-2 * k))
        comp = log_c + k * (x.to(self.mus) @ self.mus.T - 0) + torch.log(self.weights)
        return torch.logsumexp(comp, -1)

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        comp = torch.multinomial(self.weights, n, replacement=True, generator=generator)
        k, mu = self.kappas[comp], self.mus[comp]
        u = torch.rand(n, generator=generator)
        w = 1 + torch.log(u + (1 - u) * torch.exp(-2 * k)) / k           # inverse CDF of mu^T x on S^2
        phi = 2 * math.pi * torch.rand(n, generator=generator)
        # orthonormal frame (e1, e2) perpendicular to mu
        helper = torch.where(mu[:, :1].abs() < 0.9, torch.tensor([1.0, 0, 0]), torch.tensor([0, 1.0, 0]))
        e1 = torch.nn.functional.normalize(helper - (helper * mu).sum(1, keepdim=True) * mu, dim=1)
        e2 = torch.cross(mu, e1, dim=1)
        r = torch.sqrt((1 - w * w).clamp_min(0))
        x = w[:, None] * mu + r[:, None] * (torch.cos(phi)[:, None] * e1 + torch.sin(phi)[:, None] * e2)
        return x / x.norm(dim=1, keepdim=True)

    __call__ = sample
