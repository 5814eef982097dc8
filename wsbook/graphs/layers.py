"""Message-passing layers over neural graphs (Kofinas et al., 2024; thesis ``000`` §5.1).

* :class:`PNAEdgeLayer`: principal neighbourhood aggregation (Corso et al., 2020; eq. 5.3-5.4) built on
  torch-geometric's ``MessagePassing`` and ``DegreeScalerAggregation``, with messages modulated by the
  edge features (FiLM, Brockschmidt 2020) and an edge update (eq. 5.2).
* :class:`RelationalTransformerLayer`: attention whose queries, keys and values mix node and edge
  features (Diao & Loynd, 2023; eq. 5.6), over graph neighbours or over all nodes of a graph.
* :class:`FourierTime`: Fourier features of a time ``t`` in [0, 1] for flow vector fields.

Messages flow in both directions of every edge; a learned direction embedding tells them apart.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.aggr import DegreeScalerAggregation
from torch_geometric.utils import scatter, softmax


def mlp(dims: list[int], act: type[nn.Module] = nn.SiLU) -> nn.Sequential:
    """Linear layers with an activation between them (none after the last)."""
    layers: list[nn.Module] = []
    for k, (i, o) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(nn.Linear(i, o))
        if k < len(dims) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


def bidirectional(edge_index: Tensor, edge_attr: Tensor, direction: nn.Embedding) -> tuple[Tensor, Tensor]:
    """Both directions of every edge: ``[2, 2E]`` indices and ``[2E, d]`` features with a direction embedding."""
    ei = torch.cat([edge_index, edge_index.flip(0)], 1)
    ea = torch.cat([edge_attr + direction.weight[0], edge_attr + direction.weight[1]], 0)
    return ei, ea


class FourierTime(nn.Module):
    """Fourier features ``[sin(2 pi f t), cos(2 pi f t)]`` of ``t [B]`` with log-spaced frequencies, then an MLP."""

    def __init__(self, dim: int, n_frequencies: int = 8):
        super().__init__()
        self.register_buffer("freqs", 2 * math.pi * 2.0 ** torch.arange(n_frequencies).float())
        self.net = mlp([2 * n_frequencies, dim, dim])

    def forward(self, t: Tensor) -> Tensor:
        angles = t.reshape(-1, 1).float() * self.freqs
        return self.net(torch.cat([angles.sin(), angles.cos()], -1))


class PNAEdgeLayer(MessagePassing):
    """PNA with FiLM edge modulation and an edge update.

    Message ``m_ij = gamma(e_ij) * (W [h_i, h_j]) + beta(e_ij)`` passed through an MLP; aggregation is
    ``[identity, amplification, attenuation] x [mean, std, max, min]`` (eq. 5.3); node update
    ``h_i <- h_i + U([h_i, agg_i])``; edge update ``e_ij <- e_ij + V([h_i, h_j, e_ij])`` (eq. 5.2).
    """

    def __init__(self, dim: int, degree_histogram: Tensor):
        aggr = DegreeScalerAggregation(["mean", "std", "max", "min"], ["identity", "amplification", "attenuation"],
                                       deg=degree_histogram)
        super().__init__(aggr=aggr)
        self.direction = nn.Embedding(2, dim)
        self.pre = nn.Linear(2 * dim, dim)
        self.film = nn.Linear(dim, 2 * dim)
        self.post = mlp([dim, dim, dim])
        self.update_node = mlp([dim + 12 * dim, dim, dim])
        self.update_edge = mlp([3 * dim, dim, dim])
        self.norm_node, self.norm_edge = nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, h: Tensor, edge_index: Tensor, e: Tensor) -> tuple[Tensor, Tensor]:
        ei, ea = bidirectional(edge_index, e, self.direction)
        agg = self.propagate(ei, h=h, e=ea)
        h = self.norm_node(h + self.update_node(torch.cat([h, agg], -1)))
        src, dst = edge_index
        e = self.norm_edge(e + self.update_edge(torch.cat([h[dst], h[src], e], -1)))
        return h, e

    def message(self, h_i: Tensor, h_j: Tensor, e: Tensor) -> Tensor:
        gamma, beta = self.film(e).chunk(2, -1)
        return self.post(gamma * self.pre(torch.cat([h_i, h_j], -1)) + beta)


class RelationalTransformerLayer(nn.Module):
    """Relational attention: ``q_ij = h_i W_N^Q + e_ij W_E^Q``, ``k_ij = h_j W_N^K + e_ij W_E^K``,
    ``v_ij = h_j W_N^V + e_ij W_E^V`` (Diao & Loynd, 2023; thesis eq. 5.6), then a feed-forward block and
    an edge update. ``attention="neighbours"`` attends over graph neighbours (softmax per target node,
    torch-geometric ``softmax``); ``"all"`` attends over every node of the same graph, non-edges carrying
    a learned "no edge" feature.
    """

    def __init__(self, dim: int, heads: int = 4, attention: str = "neighbours"):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        if attention not in ("neighbours", "all"):
            raise ValueError(f"attention must be 'neighbours' or 'all'; got {attention!r}")
        self.dim, self.heads, self.attention = dim, heads, attention
        self.direction = nn.Embedding(2, dim)
        self.no_edge = nn.Parameter(torch.zeros(dim))
        self.node_qkv = nn.Linear(dim, 3 * dim)
        self.edge_qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim)
        self.ffn = mlp([dim, 2 * dim, dim])
        self.update_edge = mlp([3 * dim, dim, dim])
        self.norm1, self.norm2, self.norm_edge = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)

    def _attend_neighbours(self, h: Tensor, edge_index: Tensor, e: Tensor) -> Tensor:
        ei, ea = bidirectional(edge_index, e, self.direction)
        src, dst = ei
        H, dh = self.heads, self.dim // self.heads
        nq, nk, nv = self.node_qkv(h).chunk(3, -1)
        eq, ek, ev = self.edge_qkv(ea).chunk(3, -1)
        q = (nq[dst] + eq).view(-1, H, dh)
        k = (nk[src] + ek).view(-1, H, dh)
        v = (nv[src] + ev).view(-1, H, dh)
        alpha = softmax((q * k).sum(-1) / math.sqrt(dh), dst, num_nodes=h.shape[0])     # [2E, H]
        return scatter(alpha.unsqueeze(-1) * v, dst, dim=0, dim_size=h.shape[0], reduce="sum").reshape(-1, self.dim)

    def _attend_all(self, h: Tensor, edge_index: Tensor, e: Tensor, n_graphs: int) -> Tensor:
        n = h.shape[0] // n_graphs                   # all graphs of a batch share one spec, hence one size
        ei, ea = bidirectional(edge_index, e, self.direction)
        src, dst = ei
        dense = self.no_edge.expand(n_graphs, n, n, self.dim).clone()
        g = dst // n
        dense[g, dst % n, src % n] = ea                                                # [G, N(target), N(source), d]
        H, dh = self.heads, self.dim // self.heads
        nq, nk, nv = (t.view(n_graphs, n, H, dh) for t in self.node_qkv(h).chunk(3, -1))
        eq, ek, ev = (t.view(n_graphs, n, n, H, dh) for t in self.edge_qkv(dense).chunk(3, -1))
        q = nq.unsqueeze(2) + eq                                                       # [G, i, j, H, dh]
        k = nk.unsqueeze(1) + ek
        v = nv.unsqueeze(1) + ev
        alpha = torch.softmax((q * k).sum(-1) / math.sqrt(dh), dim=2)                 # over sources j
        return (alpha.unsqueeze(-1) * v).sum(2).reshape(-1, self.dim)

    def forward(self, h: Tensor, edge_index: Tensor, e: Tensor, n_graphs: int = 1) -> tuple[Tensor, Tensor]:
        att = (self._attend_neighbours(h, edge_index, e) if self.attention == "neighbours"
               else self._attend_all(h, edge_index, e, n_graphs))
        h = self.norm1(h + self.out(att))
        h = self.norm2(h + self.ffn(h))
        src, dst = edge_index
        e = self.norm_edge(e + self.update_edge(torch.cat([h[dst], h[src], e], -1)))
        return h, e
