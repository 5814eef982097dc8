"""Models over populations of networks: equivariant GNNs on neural graphs and a flat-MLP baseline.

:class:`WeightSpaceGNN` embeds biases, weights and positional ids (Kofinas et al., 2024), applies
:class:`~wsbook.graphs.layers.PNAEdgeLayer` or
:class:`~wsbook.graphs.layers.RelationalTransformerLayer` blocks (optionally conditioned on a time
``t`` through FiLM), and reads out either one vector per network (``head="invariant"``: unchanged by
hidden-neuron permutations) or one value per weight and bias (``head="equivariant"``: a ``[B, D]``
population that permutes with the input).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn import global_max_pool, global_mean_pool
from torch_geometric.utils import scatter

from wsbook.graphs.layers import FourierTime, PNAEdgeLayer, RelationalTransformerLayer, mlp
from wsbook.graphs.neural_graph import NeuralGraph, Spec

LAYERS = ("pna", "relational_transformer")
HEADS = ("invariant", "equivariant")


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class WeightSpaceGNN(nn.Module):
    """A GNN over the neural graphs of ``spec`` mapping a population ``[B, D]`` to ``[B, out_dim]``
    (invariant head) or ``[B, D]`` (equivariant head)."""

    def __init__(self, spec: Spec | NeuralGraph, layer: str = "pna", dim: int = 32, n_layers: int = 3,
                 head: str = "invariant", out_dim: int = 1, time: bool = False, attention: str = "neighbours",
                 heads: int = 4):
        super().__init__()
        if layer not in LAYERS:
            raise ValueError(f"layer must be one of {LAYERS}; got {layer!r}")
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}; got {head!r}")
        self.graph = spec if isinstance(spec, NeuralGraph) else NeuralGraph(spec)
        self.layer_kind, self.head, self.dim = layer, head, dim
        g = self.graph
        self.pos = nn.Embedding(g.n_pos, dim)
        self.node_in = nn.Linear(1, dim)
        self.edge_in = mlp([g.edge_dim, dim, dim])
        if layer == "pna":
            self.layers = nn.ModuleList(PNAEdgeLayer(dim, g.degree_histogram()) for _ in range(n_layers))
        else:
            self.layers = nn.ModuleList(RelationalTransformerLayer(dim, heads, attention) for _ in range(n_layers))
        self.time = FourierTime(dim) if time else None
        self.time_film = nn.ModuleList(nn.Linear(dim, 2 * dim) for _ in range(n_layers)) if time else None
        self.register_buffer("edge_scale", torch.ones(g.n_edges))
        self.register_buffer("node_scale", torch.ones(g.n_nodes))
        if head == "invariant":
            self.readout = mlp([3 * dim, dim, out_dim])
        else:
            self.edge_head = mlp([dim, dim, g.edge_dim])
            self.node_head = mlp([dim, dim, 1])

    @torch.no_grad()
    def set_normalization(self, theta: Tensor) -> None:
        """Scale each layer's weights and biases to unit standard deviation over the population ``theta``
        (one scalar per layer, as in Kofinas et al. 2024, so equivariance is untouched)."""
        g = self.graph
        gb = g.to_graph(g.spec.check(theta).detach())
        B = gb.num_graphs
        edges, nodes = gb.edge_attr.view(B, g.n_edges, -1), gb.x.view(B, g.n_nodes)
        edge_layer = g.node_layer[g.edge_index[1]].to(theta.device)
        node_layer = g.node_layer.to(theta.device)
        for layer in range(1, len(g.widths)):
            e_sel, n_sel = edge_layer == layer, node_layer == layer
            self.edge_scale[e_sel] = 1.0 / edges[:, e_sel].std().clamp_min(1e-6)
            self.node_scale[n_sel] = 1.0 / nodes[:, n_sel].std().clamp_min(1e-6)

    def embed(self, theta: Tensor, t: Tensor | None = None) -> tuple[Tensor, Tensor, "object"]:
        """Node and edge features ``[B*N, dim]``, ``[B*E, dim]`` after all layers, and the graph batch."""
        gb = self.graph.to_graph(theta)
        if (self.time is None) != (t is None):
            raise ValueError("pass t exactly when the model was built with time=True")
        B = gb.num_graphs
        h = self.node_in(gb.x * self.node_scale.repeat(B).unsqueeze(-1)) + self.pos(gb.pos)
        e = self.edge_in(gb.edge_attr * self.edge_scale.repeat(B).unsqueeze(-1))
        cond = self.time(t.expand(gb.num_graphs) if t.dim() == 0 else t) if self.time is not None else None
        for k, layer in enumerate(self.layers):
            if cond is not None:
                gamma, beta = self.time_film[k](cond).chunk(2, -1)
                h = h * (1 + gamma[gb.batch]) + beta[gb.batch]
            if self.layer_kind == "pna":
                h, e = layer(h, gb.edge_index, e)
            else:
                h, e = layer(h, gb.edge_index, e, gb.num_graphs)
        return h, e, gb

    def forward(self, theta: Tensor, t: Tensor | None = None) -> Tensor:
        h, e, gb = self.embed(theta, t)
        if self.head == "invariant":
            pooled = torch.cat([global_mean_pool(h, gb.batch, gb.num_graphs),
                                global_max_pool(h, gb.batch, gb.num_graphs),
                                scatter(e, gb.edge_batch, 0, dim_size=gb.num_graphs, reduce="mean")], -1)
            return self.readout(pooled)
        return self.graph.to_population(self.node_head(h).squeeze(-1), self.edge_head(e))


class FlatMLP(nn.Module):
    """Baseline: an MLP on the flattened parameter vector ``[B, D]`` (no symmetry built in)."""

    def __init__(self, n_params: int, hidden: int = 128, out_dim: int = 1, n_layers: int = 2):
        super().__init__()
        self.n_params = n_params
        self.net = mlp([n_params] + [hidden] * n_layers + [out_dim])

    def forward(self, theta: Tensor, t: Tensor | None = None) -> Tensor:
        if theta.dim() != 2 or theta.shape[1] != self.n_params:
            raise ValueError(f"theta must be [B, {self.n_params}]; got {tuple(theta.shape)}")
        return self.net(theta)
