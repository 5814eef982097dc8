"""Learned alignment: an equivariant network that maps a pair of networks to permutations (DEEP-ALIGN,
Navon et al., 2024, paper ``001``), in a compact form.

A shared equivariant GNN embeds the hidden neurons of both networks; for every hidden layer the score
``S_l[i, j] = <u(h^a_i), u(h^b_j)>`` compares neuron ``i`` of network ``a`` with neuron ``j`` of ``b``.
Training relaxes ``S_l`` to a doubly stochastic matrix with Sinkhorn; at test time the Hungarian method
hardens it. Because the embedding is equivariant, permuting ``b``'s neurons permutes the columns of
``S_l``, so the predicted alignment follows the planted permutation exactly.

Nothing here is specific to MLPs: the neural graph (:class:`wsbook.graphs.NeuralGraph`) and the symmetry
spec (:func:`wsbook.symmetry.symmetry_spec`) describe an :class:`~wsbook.nets.MLPSpec` and a
:class:`~wsbook.nets.CNNSpec` alike, so for a CNN the nodes are channels, the edges carry whole kernels,
the scores match the hidden channels of the two networks, and the interpolation loss runs the
convolutions (see chapter 6, "Convolutional networks").

Training combines the two losses of paper ``001``: recovering planted permutations of noisy copies
(supervised), and the task loss at the midpoint of ``a`` and the softly aligned ``b`` (the
interpolation / LMC loss, unsupervised); either can be switched off to train on the other alone.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from wsbook.graphs.models import WeightSpaceGNN
from wsbook.graphs.neural_graph import Spec
from wsbook.nets import per_member_loss


class LearnedAligner(nn.Module):
    """Pairs ``(theta_a, theta_b)`` ``[B, D]`` -> per hidden layer scores ``[B, w, w]`` (row: neuron, or
    channel of a CNN, of ``a``), for any spec with a neural graph (:class:`~wsbook.nets.MLPSpec`,
    :class:`~wsbook.nets.CNNSpec`)."""

    def __init__(self, spec: Spec, dim: int = 32, n_layers: int = 2, layer: str = "pna"):
        super().__init__()
        self.spec = spec
        self.gnn = WeightSpaceGNN(spec, layer, dim=dim, n_layers=n_layers, head="invariant", out_dim=1)
        self.graph = self.gnn.graph
        self.proj = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.log_temperature = nn.Parameter(torch.zeros(()))

    def scores(self, theta_a: Tensor, theta_b: Tensor) -> list[Tensor]:
        a, b = self.spec.check(theta_a, "theta_a"), self.spec.check(theta_b, "theta_b")
        if a.shape != b.shape:
            raise ValueError(f"theta_a and theta_b must both be [B, {self.spec.n_params}]; got {tuple(a.shape)} and {tuple(b.shape)}")
        B, N = a.shape[0], self.graph.n_nodes
        h, _, _ = self.gnn.embed(torch.cat([a, b]))
        u = self.proj(h).view(2 * B, N, -1)
        out = []
        for layer in range(1, len(self.spec.widths) - 1):
            s, w = self.graph.layer_start[layer], self.spec.widths[layer]
            ua, ub = u[:B, s:s + w], u[B:, s:s + w]
            out.append(ua @ ub.transpose(1, 2) / math.sqrt(u.shape[-1]) * self.log_temperature.exp() * 10)
        return out

    @torch.no_grad()
    def align(self, theta_a: Tensor, theta_b: Tensor) -> tuple[list[Tensor], Tensor]:
        """Hard alignment of ``b`` to ``a``: permutations (Hungarian on the scores) and the permuted ``b``."""
        from wsbook.symmetry import hungarian, permute

        self.eval()
        perms = [hungarian(s) for s in self.scores(theta_a, theta_b)]
        return perms, permute(self.spec, self.spec.check(theta_b), perms)


def fit_aligner(model: LearnedAligner, zoo: Tensor, x: Tensor, y: Tensor, *, steps: int = 300, batch_size: int = 16,
                lr: float = 1e-3, noise: float | tuple[float, float] = 0.02, lmc_weight: float = 1.0,
                supervised_weight: float = 1.0, lmc_at: str = "midpoint", n_iter: int = 20,
                data_batch: int = 256, seed: int = 0) -> Tensor:
    """Train on random pairs of ``zoo`` networks: ``supervised_weight`` times the cross-entropy of the
    Sinkhorn matrix against the planted permutation of a noisy copy, plus ``lmc_weight`` times the task loss
    of ``(1 - lam) a + lam P(b)`` on a data batch (paper ``001``, eq. 6-7). Returns the per-step losses
    ``[steps, 2]`` (supervised, interpolation); a loss whose weight is 0 is not computed and reads ``nan``.

    Args:
        lmc_weight, supervised_weight: weights of the two objectives, each ``>= 0`` and not both 0; setting
            one to 0 trains on the other alone (the objectives ablation of paper ``001``, Table 6). The
            random pairs, copies and data batches drawn do not depend on the weights.
        noise: std of the Gaussian noise added to a network before planting a permutation: one number, or
            ``(low, high)`` to draw every copy's std uniformly from that range. Copies far from the original
            (noise comparable to the weights) make the planted task resemble aligning independently
            trained networks, which the equivariance alone does not solve.
        lmc_at: ``"midpoint"`` (``lam = 1/2``) or ``"uniform"`` (``lam ~ U(0, 1)`` per pair, as in the paper).
        data_batch: inputs drawn for the interpolation loss at every step (at most all of ``x``); for CNNs
            the convolutions of this batch dominate a step's cost.
    """
    if lmc_at not in ("midpoint", "uniform"):
        raise ValueError(f"lmc_at must be 'midpoint' or 'uniform'; got {lmc_at!r}")
    if min(lmc_weight, supervised_weight) < 0 or lmc_weight == supervised_weight == 0:
        raise ValueError(f"lmc_weight and supervised_weight must be >= 0 and not both 0; got {lmc_weight} "
                         f"and {supervised_weight}")
    if data_batch < 1:
        raise ValueError(f"data_batch must be a positive number of inputs; got {data_batch}")
    low, high = (noise, noise) if isinstance(noise, (int, float)) else noise
    if not 0 <= low <= high:
        raise ValueError(f"noise must be a std >= 0 or a range (low, high) with 0 <= low <= high; got {noise!r}")
    from wsbook.symmetry import inverse_permutation, permute, permute_soft, random_permutation, sinkhorn

    spec = model.spec
    zoo = spec.check(zoo)
    gen = torch.Generator().manual_seed(seed)
    model.gnn.set_normalization(zoo)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    history = torch.empty(steps, 2)
    model.train()
    for step in range(steps):
        idx = torch.randint(0, zoo.shape[0], (2, batch_size), generator=gen).to(zoo.device)
        a, b = zoo[idx[0]], zoo[idx[1]]
        # supervised: b' = g(a + noise); the alignment of b' to a is g^{-1}
        g = random_permutation(spec, batch_size, gen, device=zoo.device)
        std = low + (high - low) * torch.rand(batch_size, 1, generator=gen)
        planted = permute(spec, a + (std * torch.randn(a.shape, generator=gen)).to(a), g)
        target = inverse_permutation(g)
        nan = torch.full((), float("nan"))
        ce = nan if supervised_weight == 0 else sum(
            -torch.log(sinkhorn(s, n_iter).gather(2, t.unsqueeze(2)).clamp_min(1e-9)).mean()
            for s, t in zip(model.scores(a, planted), target))
        # unsupervised: the midpoint of a and the softly aligned b should fit the data
        lam = torch.rand(batch_size, 1, generator=gen) if lmc_at == "uniform" else torch.full((batch_size, 1), 0.5)
        rows = torch.randint(0, x.shape[0], (min(data_batch, x.shape[0]),), generator=gen).to(x.device)
        lmc = nan
        if lmc_weight > 0:
            P = [sinkhorn(s, n_iter) for s in model.scores(a, b)]
            mid = (1 - lam.to(a)) * a + lam.to(a) * permute_soft(spec, b, P)
            lmc = per_member_loss(spec, mid, x[rows], y[rows]).mean()
        loss = (supervised_weight * ce if supervised_weight > 0 else 0) + (lmc_weight * lmc if lmc_weight > 0 else 0)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"aligner loss became {loss.item()} at step {step}; lower lr")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        history[step, 0], history[step, 1] = ce.item(), lmc.item()
    model.eval()
    return history


def planted_recovery(aligner: LearnedAligner, theta: Tensor, moved: Tensor, truth: list[Tensor]) -> float:
    """Fraction of hidden neurons whose predicted match equals the planted one: ``aligner.align(theta, moved)``
    against ``truth`` (the permutations that map ``moved`` back onto ``theta``)."""
    found, _ = aligner.align(theta, moved)
    if len(found) != len(truth):
        raise ValueError(f"expected {len(found)} permutation tensors in truth; got {len(truth)}")
    return torch.cat([(f == t.to(f.device)).float().flatten() for f, t in zip(found, truth)]).mean().item()
