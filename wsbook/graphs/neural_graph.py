"""Neural graphs: a network's computational graph with its parameters as node and edge features.

Following Kofinas et al. (2024) and thesis ``000`` §5.1.2: every neuron (or CNN channel) is a node whose
feature is its bias (input nodes get a constant 0); every weight (or flattened, zero-padded kernel) is
an edge from layer ``l-1`` to layer ``l``. Each input and output neuron has its own positional id and all
neurons of one hidden layer share one id, so a GNN over the graph is equivariant to exactly the
hidden-neuron permutations that leave the network's function unchanged. Those permutations (and sign
flips) act on populations through :mod:`wsbook.symmetry`; :meth:`NeuralGraph.node_permutation` maps a
symmetry element to the node relabelling it induces.

The index structure is built **once per spec**. A population ``[B, D]`` becomes a batched graph by one
gather, and per-edge / per-node outputs go back to ``[B, D]`` by the inverse scatter: no loop over
networks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch
from torch import Tensor

from wsbook.nets import CNNSpec, MLPSpec
from wsbook.symmetry import check_permutations, symmetry_spec

Spec = Union[MLPSpec, CNNSpec]


@dataclass
class GraphBatch:
    """``B`` neural graphs of one spec batched as one disjoint graph (torch-geometric conventions).

    ``x [B*N, 1]`` biases, ``edge_attr [B*E, F]`` weights, ``edge_index [2, B*E]`` (source in layer
    ``l-1``, target in layer ``l``), ``batch [B*N]`` graph id of each node, ``pos [B*N]`` positional ids.
    """

    x: Tensor
    edge_attr: Tensor
    edge_index: Tensor
    batch: Tensor
    pos: Tensor
    num_graphs: int
    graph: "NeuralGraph"

    @property
    def edge_batch(self) -> Tensor:
        return self.batch[self.edge_index[1]]


class NeuralGraph:
    """The graph structure of one architecture (:class:`~wsbook.nets.MLPSpec` or :class:`CNNSpec`)."""

    def __init__(self, spec: Spec):
        if not isinstance(spec, (MLPSpec, CNNSpec)):
            raise TypeError(f"NeuralGraph needs an MLPSpec or CNNSpec; got {type(spec).__name__}")
        if isinstance(spec, MLPSpec) and not spec.bias:
            raise ValueError("neural graphs need biases as node features; got an MLPSpec with bias=False")
        self.spec = spec
        widths = spec.widths
        self.widths = widths
        starts = torch.tensor([0, *widths]).cumsum(0)
        self.layer_start = starts[:-1].tolist()
        self.n_nodes = int(starts[-1])
        D = spec.n_params
        self.pad = D                                  # index of an always-zero column
        kk = spec.kernel_size ** 2 if isinstance(spec, CNNSpec) else 1
        self.edge_dim = kk
        src, dst, eparam, nparam = [], [], [], torch.full((self.n_nodes,), D, dtype=torch.long)
        for layer in range(spec.n_layers):
            fan_in, fan_out = widths[layer], widths[layer + 1]
            w_sl, b_sl = spec.slices(layer)
            s0, d0 = self.layer_start[layer], self.layer_start[layer + 1]
            out_idx, in_idx = torch.meshgrid(torch.arange(fan_out), torch.arange(fan_in), indexing="ij")
            src.append(s0 + in_idx.flatten())
            dst.append(d0 + out_idx.flatten())
            ids = torch.arange(w_sl.start, w_sl.stop)
            per_edge = (w_sl.stop - w_sl.start) // (fan_in * fan_out)
            ids = ids.view(fan_out * fan_in, per_edge)
            if per_edge < kk:                         # linear head of a CNN: weight first, zeros after
                ids = torch.cat([ids, torch.full((ids.shape[0], kk - per_edge), D)], 1)
            eparam.append(ids)
            nparam[d0:d0 + fan_out] = torch.arange(b_sl.start, b_sl.stop)
        self.edge_index = torch.stack([torch.cat(src), torch.cat(dst)])      # [2, E]
        self.edge_param = torch.cat(eparam)                                  # [E, F]
        self.node_param = nparam                                             # [N]
        self.n_edges = self.edge_index.shape[1]
        layer_of = torch.repeat_interleave(torch.arange(len(widths)), torch.tensor(widths))
        self.node_layer = layer_of
        pos = torch.empty(self.n_nodes, dtype=torch.long)
        n_in, n_out = widths[0], widths[-1]
        pos[:n_in] = torch.arange(n_in)
        pos[-n_out:] = n_in + torch.arange(n_out)
        for layer in range(1, len(widths) - 1):
            s = self.layer_start[layer]
            pos[s:s + widths[layer]] = n_in + n_out + layer - 1
        self.node_pos = pos
        self.n_pos = n_in + n_out + max(len(widths) - 2, 0)
        self.hidden_mask = (layer_of > 0) & (layer_of < len(widths) - 1)
        # the parameter each output slot writes (for the inverse map), without the zero padding
        self._edge_valid = self.edge_param != D
        self._node_valid = self.node_param != D

    def __repr__(self) -> str:
        return f"NeuralGraph({self.spec}, nodes={self.n_nodes}, edges={self.n_edges}, edge_dim={self.edge_dim})"

    # ------------------------------------------------------------------ degrees
    def degree_histogram(self) -> Tensor:
        """Histogram of node degrees with edges in both directions (PNA's degree scalers need it)."""
        deg = torch.bincount(self.edge_index.flatten(), minlength=self.n_nodes)
        return torch.bincount(deg)

    # ------------------------------------------------------------- conversions
    def _padded(self, theta: Tensor) -> Tensor:
        theta = self.spec.check(theta)
        return torch.cat([theta, theta.new_zeros(theta.shape[0], 1)], 1)

    def to_graph(self, theta: Tensor) -> GraphBatch:
        """Population ``[B, D]`` -> one batched graph, by gathering (no loop over networks)."""
        padded = self._padded(theta)
        B, N, E = padded.shape[0], self.n_nodes, self.n_edges
        dev = padded.device
        x = padded[:, self.node_param.to(dev)].reshape(B * N, 1)
        edge_attr = padded[:, self.edge_param.to(dev)].reshape(B * E, self.edge_dim)
        offsets = (torch.arange(B, device=dev) * N).repeat_interleave(E)
        edge_index = self.edge_index.to(dev).repeat(1, B) + offsets
        batch = torch.arange(B, device=dev).repeat_interleave(N)
        return GraphBatch(x=x, edge_attr=edge_attr, edge_index=edge_index, batch=batch,
                          pos=self.node_pos.to(dev).repeat(B), num_graphs=B, graph=self)

    def to_population(self, node_values: Tensor, edge_values: Tensor) -> Tensor:
        """Inverse of :meth:`to_graph`: per-node ``[B*N]`` (or ``[B*N, 1]``) and per-edge ``[B*E, F]`` values
        back to a population ``[B, D]`` (input-node values and kernel padding are dropped)."""
        N, E, F = self.n_nodes, self.n_edges, self.edge_dim
        if node_values.numel() % N != 0 or node_values.dim() > 2 or (node_values.dim() == 2 and node_values.shape[1] != 1):
            raise ValueError(f"node_values must be [B*{N}] or [B*{N}, 1]; got {tuple(node_values.shape)}")
        B = node_values.numel() // N
        if edge_values.shape != (B * E, F) and not (F == 1 and edge_values.shape == (B * E,)):
            raise ValueError(f"edge_values must be [{B * E}, {F}] for {B} graphs; got {tuple(edge_values.shape)}")
        dev = node_values.device
        theta = node_values.new_zeros(B, self.spec.n_params)
        ev, nv = self._edge_valid.to(dev), self._node_valid.to(dev)
        theta[:, self.edge_param.to(dev)[ev]] = edge_values.reshape(B, E, F)[:, ev]
        theta[:, self.node_param.to(dev)[nv]] = node_values.reshape(B, N)[:, nv]
        return theta

    # ------------------------------------------------------------- symmetries
    def node_permutation(self, perms: list[Tensor]) -> Tensor:
        """The node relabelling ``[B, N]`` induced by a permutation element of :mod:`wsbook.symmetry` (one
        ``[B, width]`` permutation per hidden layer): new node ``i`` is old node ``out[:, i]``. Input and
        output nodes stay in place. The hidden layers come from the symmetry spec's groups, so graph and
        weights are permuted by the same element: ``to_graph(permute(spec, theta, perms))`` carries the node
        features of ``to_graph(theta)`` gathered with this relabelling."""
        groups = symmetry_spec(self.spec).groups
        if len(perms) != len(groups):
            raise ValueError(f"perms needs one entry per hidden layer ({len(groups)}); got {len(perms)}")
        perms = [p.reshape(-1, g.width) if p.dim() == 1 else p for p, g in zip(perms, groups)]
        check_permutations(perms, [g.width for g in groups])
        B = max(p.shape[0] for p in perms)
        out = torch.arange(self.n_nodes, device=perms[0].device).repeat(B, 1)
        for g, p in zip(groups, perms):
            start = self.layer_start[g.index + 1]
            out[:, start:start + g.width] = p.long() + start
        return out
