"""Small time-conditioned vector-field networks v_theta(t, x) for the toy flows (points, not weights)."""
from __future__ import annotations

import math

import torch
from torch import nn

from wsbook.manifolds import Manifold

Tensor = torch.Tensor


def time_features(t: Tensor, n: int, batch: int) -> Tensor:
    """Sinusoidal embedding [cos(2 pi k t), sin(2 pi k t)]_{k=1..n/2} plus t itself, ``[batch, n + 1]``."""
    t = torch.as_tensor(t, dtype=torch.float32)
    t = t.expand(batch) if t.dim() == 0 else t.reshape(batch)
    k = torch.arange(1, n // 2 + 1, device=t.device, dtype=t.dtype)
    ang = 2 * math.pi * t[:, None] * k
    return torch.cat([t[:, None], torch.cos(ang), torch.sin(ang)], -1)


class TimeMLP(nn.Module):
    """v_theta(t, x): an MLP on [x, features(t)]; with a ``manifold`` its output is projected onto the
    tangent space at x (so the field is tangent by construction, as RFM requires)."""

    def __init__(self, dim: int, hidden: int = 128, depth: int = 3, n_time: int = 8,
                 manifold: Manifold | None = None, activation: type[nn.Module] = nn.SiLU):
        super().__init__()
        if manifold is not None and manifold.dim != dim:
            raise ValueError(f"TimeMLP: dim={dim} but the manifold's ambient dimension is {manifold.dim}")
        self.dim, self.n_time, self.manifold = dim, n_time, manifold
        layers: list[nn.Module] = []
        width = dim + n_time // 2 * 2 + 1
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), activation()]
            width = hidden
        layers.append(nn.Linear(width, dim))
        self.net = nn.Sequential(*layers)

    def forward(self, t: Tensor, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != self.dim:
            raise ValueError(f"TimeMLP: expected x of shape [B, {self.dim}], got {tuple(x.shape)}")
        h = torch.cat([x, time_features(torch.as_tensor(t).to(x), self.n_time, x.shape[0])], -1)
        out = self.net(h)
        if self.manifold is not None:
            out = self.manifold.proju(x, out)
        return out


class TimeEmbedding(nn.Module):
    """A learned time embedding ``t -> [batch, dim]``: :func:`time_features` followed by a two-layer MLP.

    The one time embedding of the library: models that condition on time through a vector (the
    weight-space GNN fields of :mod:`wsbook.graphs`, FiLM on every node and edge) use it, so every
    time-conditioned model sees the same features of ``t``.

    Args:
        dim: size of the embedding.
        n_time: number of sinusoidal features (``n_time // 2`` frequencies, as in :class:`TimeMLP`).
        activation: activation between the two linear layers.
    """

    def __init__(self, dim: int, n_time: int = 8, activation: type[nn.Module] = nn.SiLU):
        super().__init__()
        self.dim, self.n_time = dim, n_time
        self.net = nn.Sequential(nn.Linear(n_time // 2 * 2 + 1, dim), activation(), nn.Linear(dim, dim))

    def forward(self, t: Tensor, batch: int) -> Tensor:
        """``t`` a scalar (shared by the batch) or ``[batch]`` -> ``[batch, dim]``."""
        w = self.net[0].weight
        t = torch.as_tensor(t, device=w.device)
        if t.numel() not in (1, batch):
            raise ValueError(f"TimeEmbedding: t must be a scalar or have {batch} entries; got shape {tuple(t.shape)}")
        t = t.reshape(()) if t.numel() == 1 else t.reshape(batch)
        return self.net(time_features(t, self.n_time, batch).to(w.dtype))
