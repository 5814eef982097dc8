"""The one result type of every inference method's draws: ``[n, D]``, draw-major, with the chain of each row.

HMC, SGLD and SGHMC chains, checkpoints along independent optimiser runs, and draws from the members of a
mean-field VI or Laplace fit all come back as a :class:`SampleResult`: ``samples[i]`` is one network, rows
are ordered draw-major (row ``s * n_chains + c`` is draw ``s`` of chain ``c``), and ``chain[i]`` says which
chain, run or member row ``i`` came from. The first ``n`` rows are therefore spread evenly over the chains.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class SampleResult:
    """Draws ``samples [n, D]`` (draw-major), the chain / run / member of every row ``chain [n]``, optional
    log densities ``log_prob [n]`` and per-chain diagnostics (``[n_chains]``)."""

    samples: Tensor
    chain: Tensor
    n_chains: int
    log_prob: Tensor | None = None
    accept_rate: Tensor | None = None          # [C]  (HMC)
    step_size: Tensor | None = None            # [C]  final step size
    n_divergent: Tensor | None = None          # [C]  rejected non-finite / exploding energies
    seconds: float = 0.0
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.samples.dim() != 2 or self.chain.shape != self.samples.shape[:1]:
            raise ValueError(f"SampleResult needs samples [n, D] and chain [n]; got {tuple(self.samples.shape)} "
                             f"and {tuple(self.chain.shape)}")

    def __len__(self) -> int:
        return self.samples.shape[0]

    @property
    def n_draws(self) -> int:
        """Complete draws per chain (rows of :meth:`by_chain`)."""
        return self.samples.shape[0] // self.n_chains

    def by_chain(self, values: Tensor | None = None) -> Tensor:
        """``values [n, ...]`` (default: the samples) as ``[n_draws, n_chains, ...]`` for chain diagnostics
        (:func:`~wsbook.bayes.split_rhat`, :func:`~wsbook.bayes.ess`); needs complete draws."""
        values = self.samples if values is None else values
        if values.shape[0] != len(self) or len(self) % self.n_chains:
            raise ValueError(f"by_chain needs [n={len(self)}, ...] values with n a multiple of n_chains="
                             f"{self.n_chains}; got {tuple(values.shape)}")
        return values.reshape(len(self) // self.n_chains, self.n_chains, *values.shape[1:])

    @classmethod
    def from_draws(cls, draws: Tensor, log_prob: Tensor | None = None, **kwargs) -> "SampleResult":
        """Build from stacked draws ``[S, C, D]`` (and log densities ``[S, C]``)."""
        if draws.dim() != 3:
            raise ValueError(f"draws must be [S, C, D]; got {tuple(draws.shape)}")
        S, C, D = draws.shape
        chain = torch.arange(C, device=draws.device).repeat(S)
        return cls(samples=draws.reshape(S * C, D), chain=chain, n_chains=C,
                   log_prob=None if log_prob is None else log_prob.reshape(S * C), **kwargs)


def member_draws(n: int, n_members: int, generator: torch.Generator | None, dtype: torch.dtype,
                 dim: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Standard normals for ``n`` draw-major rows spread over ``n_members`` members: ``eps [R, n_members, dim]``
    for ``R = ceil(n / n_members)`` complete rounds (row ``i`` of ``eps.reshape(-1, dim)[:n]`` belongs to member
    ``i % n_members``) and that member index ``[n]``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive number of samples; got {n!r}")
    rounds = -(-n // n_members)
    eps = torch.randn(rounds, n_members, dim, generator=generator, dtype=dtype)
    member = torch.arange(n_members).repeat(rounds)[:n]
    return eps.to(device), member.to(device)
