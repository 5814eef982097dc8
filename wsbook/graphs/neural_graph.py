"""Neural graphs: a network's computational graph with its parameters as node and edge features.

Following Kofinas et al. (2024) and thesis ``000`` §5.1.2: every neuron (or CNN channel) is a node whose
feature is its bias (input nodes get a constant 0); every weight (or flattened, zero-padded kernel) is
an edge from layer ``l-1`` to layer ``l``. Each input and output neuron has its own positional id; the
neurons of a hidden layer share one id given by the layer's *role* (first, middle, last or only hidden
layer), so a GNN over the graph is equivariant to exactly the hidden-neuron permutations that leave the
network's function unchanged, and the ids do not depend on hidden widths or on depth. Those permutations
(and sign flips) act on populations through :mod:`wsbook.symmetry`; :meth:`NeuralGraph.node_permutation`
maps a symmetry element to the node relabelling it induces.

The graphs of one *family* (same kind, input size, output size and edge feature size) differ only in
hidden widths and depth: a GNN built for one member evaluates any other (:attr:`NeuralGraph.family`).

The index structure is built **once per spec** (:meth:`NeuralGraph.of` caches it). A population
``[B, D]`` becomes a batched graph by one gather, and per-edge / per-node outputs go back to ``[B, D]``
by the inverse scatter: no loop over networks. :meth:`GraphBatch.from_populations` joins populations of
different specs of one family into one batch.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence, Union

import torch
from torch import Tensor

from wsbook.nets import CNNSpec, MLPSpec
from wsbook.symmetry import check_permutations, symmetry_spec

Spec = Union[MLPSpec, CNNSpec]

#: Layer roles of a neural graph's nodes (edges take the role of their target layer).
ROLES = ("input", "first hidden", "middle hidden", "last hidden", "only hidden", "output")
N_ROLES = len(ROLES)


def layer_roles(n_layers: int) -> list[int]:
    """Role id (index into :data:`ROLES`) of each of the ``n_layers + 1`` node layers of a network with
    ``n_layers`` weight layers: input, then first / middle ... / last hidden (or "only hidden" when there
    is one hidden layer), then output."""
    n_hidden = n_layers - 1
    if n_hidden == 0:
        hidden = []
    elif n_hidden == 1:
        hidden = [4]
    else:
        hidden = [1] + [2] * (n_hidden - 2) + [3]
    return [0, *hidden, 5]


@dataclass
class GraphBatch:
    """Neural graphs batched as one disjoint graph (torch-geometric conventions), possibly of several
    specs of one family.

    ``x [N, 1]`` biases, ``edge_attr [E, F]`` weights, ``edge_index [2, E]`` (source in layer ``l-1``,
    target in layer ``l``), ``batch [N]`` graph id of each node, ``pos [N]`` positional ids, ``role [N]``
    layer role of each node (:data:`ROLES`). ``parts`` lists consecutive blocks ``(graph, count)``: the
    first ``count`` graphs are networks of ``parts[0][0]``, and so on. Build one with
    :meth:`NeuralGraph.to_graph` (one spec) or :meth:`from_populations` (several).
    """

    x: Tensor
    edge_attr: Tensor
    edge_index: Tensor
    batch: Tensor
    pos: Tensor
    role: Tensor
    num_graphs: int
    parts: tuple[tuple["NeuralGraph", int], ...]

    @property
    def edge_batch(self) -> Tensor:
        """Graph id of every edge ``[E]``."""
        return self.batch[self.edge_index[1]]

    @property
    def edge_role(self) -> Tensor:
        """Role of every edge ``[E]``: the role of its target layer."""
        return self.role[self.edge_index[1]]

    @property
    def graph(self) -> "NeuralGraph":
        """The one :class:`NeuralGraph` of a single-spec batch (raises for a mixed batch)."""
        if len(self.parts) != 1:
            raise ValueError(f"this batch mixes {len(self.parts)} specs; use .parts")
        return self.parts[0][0]

    @property
    def family(self) -> tuple:
        return self.parts[0][0].family

    @classmethod
    def from_populations(cls, populations: Sequence[tuple[Union[Spec, "NeuralGraph"], Tensor]]) -> "GraphBatch":
        """One batch from populations of different specs of one family, e.g.
        ``GraphBatch.from_populations([(spec_a, theta_a), (spec_b, theta_b)])``: the graphs of ``theta_a``
        come first. Raises if the specs belong to different families."""
        populations = list(populations)
        if not populations:
            raise ValueError("from_populations needs at least one (spec, theta) pair")
        batches = []
        for item in populations:
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise TypeError(f"from_populations takes (spec, theta) pairs; got {type(item).__name__}")
            spec, theta = item
            graph = spec if isinstance(spec, NeuralGraph) else NeuralGraph.of(spec)
            batches.append(graph.to_graph(theta))
        return cls.cat(batches)

    @classmethod
    def cat(cls, batches: Sequence["GraphBatch"]) -> "GraphBatch":
        """Join batches of one family into one (node and graph ids are shifted)."""
        batches = list(batches)
        families = {b.family for b in batches}
        if len(families) != 1:
            raise ValueError(f"a batch must hold graphs of one family (kind, inputs, outputs, edge size); got {sorted(families)}")
        if len(batches) == 1:
            return batches[0]
        node_off, graph_off, edge_index, batch = 0, 0, [], []
        for b in batches:
            edge_index.append(b.edge_index + node_off)
            batch.append(b.batch + graph_off)
            node_off += b.x.shape[0]
            graph_off += b.num_graphs
        return cls(x=torch.cat([b.x for b in batches]), edge_attr=torch.cat([b.edge_attr for b in batches]),
                   edge_index=torch.cat(edge_index, 1), batch=torch.cat(batch),
                   pos=torch.cat([b.pos for b in batches]), role=torch.cat([b.role for b in batches]),
                   num_graphs=graph_off, parts=tuple(p for b in batches for p in b.parts))

    def to_populations(self, node_values: Tensor, edge_values: Tensor) -> list[Tensor]:
        """Per-node ``[N]`` (or ``[N, 1]``) and per-edge ``[E, F]`` values -> one population ``[count, D]``
        per part, in the order of :attr:`parts` (inverse of the gather that built the batch)."""
        out, n0, e0 = [], 0, 0
        for graph, count in self.parts:
            n1, e1 = n0 + count * graph.n_nodes, e0 + count * graph.n_edges
            out.append(graph.to_population(node_values[n0:n1], edge_values[e0:e1]))
            n0, e0 = n1, e1
        if n0 != node_values.shape[0] or e0 != edge_values.shape[0]:
            raise ValueError(f"expected {n0} node and {e0} edge values for this batch; got "
                             f"{node_values.shape[0]} and {edge_values.shape[0]}")
        return out


@functools.lru_cache(maxsize=64)
def _cached_graph(spec: Spec) -> "NeuralGraph":
    return NeuralGraph(spec)


class NeuralGraph:
    """The graph structure of one architecture (:class:`~wsbook.nets.MLPSpec` or :class:`CNNSpec`).

    Use :meth:`of` to get a cached instance. Index tensors live on the CPU; :meth:`to_graph` keeps one
    copy per device it has seen.
    """

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
        self.node_role = torch.tensor(layer_roles(spec.n_layers))[layer_of]  # [N], see ROLES
        n_in, n_out = widths[0], widths[-1]
        # inputs and outputs: one id per neuron; hidden neurons: one id per layer role (width- and depth-free)
        pos = n_in + n_out + self.node_role - 1
        pos[:n_in] = torch.arange(n_in)
        pos[-n_out:] = n_in + torch.arange(n_out)
        self.node_pos = pos
        self.n_pos = n_in + n_out + 4
        self.family = ("cnn" if isinstance(spec, CNNSpec) else "mlp", n_in, n_out, kk)
        self.hidden_mask = (layer_of > 0) & (layer_of < len(widths) - 1)
        # the parameter each output slot writes (for the inverse map), without the zero padding
        self._edge_valid = self.edge_param != D
        self._node_valid = self.node_param != D
        self._on_device: dict[torch.device, dict[str, Tensor]] = {}

    @staticmethod
    def of(spec: Union[Spec, "NeuralGraph"]) -> "NeuralGraph":
        """The (cached) graph of ``spec``; a :class:`NeuralGraph` is returned as it is."""
        return spec if isinstance(spec, NeuralGraph) else _cached_graph(spec)

    def __repr__(self) -> str:
        return f"NeuralGraph({self.spec}, nodes={self.n_nodes}, edges={self.n_edges}, edge_dim={self.edge_dim})"

    def _index(self, device: torch.device) -> dict[str, Tensor]:
        """The index tensors on ``device`` (copied once per device)."""
        device = torch.device(device)
        if device not in self._on_device:
            names = ("node_param", "edge_param", "edge_index", "node_pos", "node_role", "_edge_valid", "_node_valid")
            self._on_device[device] = {n: getattr(self, n).to(device) for n in names}
        return self._on_device[device]

    # ------------------------------------------------------------------ degrees
    def degrees(self) -> Tensor:
        """Degree of every node ``[N]`` counting edges in both directions (messages flow both ways)."""
        return torch.bincount(self.edge_index.flatten(), minlength=self.n_nodes)

    def mean_log_degree(self) -> float:
        """``mean_i log(d_i + 1)``: PNA's reference ``delta`` for the degree scalers (Corso et al., 2020)."""
        return float(torch.log(self.degrees().clamp_min(1).double() + 1).mean())

    # ------------------------------------------------------------- conversions
    def _padded(self, theta: Tensor) -> Tensor:
        theta = self.spec.check(theta)
        return torch.cat([theta, theta.new_zeros(theta.shape[0], 1)], 1)

    def to_graph(self, theta: Tensor) -> GraphBatch:
        """Population ``[B, D]`` -> one batched graph, by gathering (no loop over networks)."""
        padded = self._padded(theta)
        B, N, E = padded.shape[0], self.n_nodes, self.n_edges
        dev = padded.device
        idx = self._index(dev)
        x = padded[:, idx["node_param"]].reshape(B * N, 1)
        edge_attr = padded[:, idx["edge_param"]].reshape(B * E, self.edge_dim)
        offsets = (torch.arange(B, device=dev) * N).repeat_interleave(E)
        edge_index = idx["edge_index"].repeat(1, B) + offsets
        batch = torch.arange(B, device=dev).repeat_interleave(N)
        return GraphBatch(x=x, edge_attr=edge_attr, edge_index=edge_index, batch=batch,
                          pos=idx["node_pos"].repeat(B), role=idx["node_role"].repeat(B), num_graphs=B,
                          parts=((self, B),))

    def to_population(self, node_values: Tensor, edge_values: Tensor) -> Tensor:
        """Inverse of :meth:`to_graph`: per-node ``[B*N]`` (or ``[B*N, 1]``) and per-edge ``[B*E, F]`` values
        back to a population ``[B, D]`` (input-node values and kernel padding are dropped)."""
        N, E, F = self.n_nodes, self.n_edges, self.edge_dim
        if node_values.numel() % N != 0 or node_values.dim() > 2 or (node_values.dim() == 2 and node_values.shape[1] != 1):
            raise ValueError(f"node_values must be [B*{N}] or [B*{N}, 1]; got {tuple(node_values.shape)}")
        B = node_values.numel() // N
        if edge_values.shape != (B * E, F) and not (F == 1 and edge_values.shape == (B * E,)):
            raise ValueError(f"edge_values must be [{B * E}, {F}] for {B} graphs; got {tuple(edge_values.shape)}")
        idx = self._index(node_values.device)
        ev, nv = idx["_edge_valid"], idx["_node_valid"]
        theta = node_values.new_zeros(B, self.spec.n_params)
        theta[:, idx["edge_param"][ev]] = edge_values.reshape(B, E, F)[:, ev]
        theta[:, idx["node_param"][nv]] = node_values.reshape(B, N)[:, nv]
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
