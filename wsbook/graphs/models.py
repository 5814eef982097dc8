"""Models over populations of networks: equivariant GNNs on neural graphs, a GNN vector field, and a
flat-MLP baseline.

* :class:`WeightSpaceGNN` embeds biases, weights and positional ids (Kofinas et al., 2024), applies
  :class:`~wsbook.graphs.layers.PNAEdgeLayer` or :class:`~wsbook.graphs.layers.RelationalTransformerLayer`
  blocks (optionally conditioned on a time ``t`` by FiLM on every node and every edge), and reads out
  either one vector per network (``head="invariant"``: unchanged by hidden-neuron permutations) or one
  value per weight and bias (``head="equivariant"``: a ``[B, D]`` population that permutes with the
  input). Called as ``model(theta)`` (``t`` and ``spec`` are keywords).
* :class:`WeightSpaceField`: the time-conditioned equivariant GNN as a vector field over weights, called
  ``field(t, x)`` like every vector field in ``wsbook`` (see chapter 3, "Flow matching").
* :class:`FlatMLP`: an MLP on the flattened parameter vector (no symmetry built in). A flat *field* over
  weights is :class:`wsbook.flows.TimeMLP` with ``dim = D``.

**Not tied to one architecture.** A model holds no per-node or per-edge tensor of the spec it was built
for: positional ids exist per input neuron, per output neuron and per hidden-layer *role* (first, middle,
last, only hidden layer), input scales are one scalar per role, and PNA's degree scalers read the degrees
of the graph they process. The same trained module therefore evaluates networks of any hidden widths and
depth of its family (same kind, inputs, outputs and edge size), also in one batch of mixed specs: pass
``spec=`` to :meth:`WeightSpaceGNN.forward`, or a :class:`~wsbook.graphs.GraphBatch` built by
:meth:`~wsbook.graphs.GraphBatch.from_populations` to :meth:`WeightSpaceGNN.forward_graph`.
"""
from __future__ import annotations

import torch
from dataclasses import replace

from torch import Tensor, nn
from torch_geometric.nn import global_max_pool, global_mean_pool
from torch_geometric.utils import scatter

from wsbook.flows.models import TimeEmbedding
from wsbook.graphs.layers import LayeredLayout, PNAEdgeLayer, RelationalTransformerLayer, mlp, mlp_grid
from wsbook.graphs.neural_graph import N_ROLES, GraphBatch, NeuralGraph, Spec, layer_roles

LAYERS = ("pna", "relational_transformer")
HEADS = ("invariant", "equivariant")


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class WeightSpaceGNN(nn.Module):
    """A GNN over neural graphs mapping a population ``[B, D]`` to ``[B, out_dim]`` (invariant head) or
    ``[B, D]`` (equivariant head). See chapter 6, "Two message-passing layers".

    Args:
        spec: the architecture (or its :class:`NeuralGraph`) the model is built for; it fixes the family
            (kind, input and output sizes, edge size) and is the default spec of :meth:`forward`.
        layer: ``"pna"`` or ``"relational_transformer"``.
        dim: width of node and edge features.
        n_layers: number of message-passing layers.
        head: ``"invariant"`` (one ``out_dim`` vector per network) or ``"equivariant"`` (one value per
            weight and bias, in the units of the input).
        out_dim: output size of the invariant head.
        time: condition on a time ``t`` (FiLM of every node and every edge feature before each layer).
        attention: Relational Transformer only: ``"neighbours"`` or ``"all"``.
        heads: Relational Transformer only: number of attention heads.
        mean_log_degree: PNA only: the degree scalers' reference ``delta``; default: the mean of
            ``log(d + 1)`` over the nodes of ``spec``'s graph.
        n_time: number of sinusoidal time features (:class:`wsbook.flows.TimeEmbedding`).
        channels: values read per weight and bias: 1 (the network), or 2 (the network and a context
            network of the same spec passed as ``context=``, e.g. an anchor; permuting both together
            permutes the output, so the model stays equivariant in the pair).
        global_context: before every layer, add to every node and edge a learned linear function of the
            mean node and mean edge feature of its graph (a virtual node; invariant to hidden-neuron
            permutations, so the model stays equivariant). Message passing over a few layers sees only a
            neighbourhood; a global summary (e.g. how far a whole network is trained, its overall scale)
            otherwise reaches a neuron only as the average of many local guesses.
    """

    def __init__(self, spec: Spec | NeuralGraph, layer: str = "pna", dim: int = 32, n_layers: int = 3,
                 head: str = "invariant", out_dim: int = 1, time: bool = False, attention: str = "neighbours",
                 heads: int = 4, mean_log_degree: float | None = None, n_time: int = 8, channels: int = 1,
                 global_context: bool = False):
        super().__init__()
        if layer not in LAYERS:
            raise ValueError(f"layer must be one of {LAYERS}; got {layer!r}")
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}; got {head!r}")
        self.graph = NeuralGraph.of(spec)
        self.family = self.graph.family
        if channels not in (1, 2):
            raise ValueError(f"channels must be 1 (the network) or 2 (network and context); got {channels!r}")
        self.layer_kind, self.head, self.dim, self.channels = layer, head, dim, channels
        g = self.graph
        self.pos = nn.Embedding(g.n_pos, dim)
        self.node_in = nn.Linear(channels, dim)
        self.edge_in = mlp([g.edge_dim * channels, dim, dim])
        if layer == "pna":
            self.mean_log_degree = g.mean_log_degree() if mean_log_degree is None else float(mean_log_degree)
            self.layers = nn.ModuleList(PNAEdgeLayer(dim, self.mean_log_degree) for _ in range(n_layers))
        else:
            self.layers = nn.ModuleList(RelationalTransformerLayer(dim, heads, attention) for _ in range(n_layers))
        self.time = TimeEmbedding(dim, n_time) if time else None
        self.time_film = nn.ModuleList(nn.Linear(dim, 4 * dim) for _ in range(n_layers)) if time else None
        self.global_context = bool(global_context)
        self.global_in = nn.ModuleList(nn.Linear(2 * dim, 2 * dim) for _ in range(n_layers)) if global_context else None
        if self.global_in is not None:      # zero at start: the model begins as the purely local one
            for lin in self.global_in:
                nn.init.zeros_(lin.weight)
                nn.init.zeros_(lin.bias)
        # one input scale per layer role (ROLES), not per node or edge: width- and depth-free
        self.register_buffer("node_scale", torch.ones(N_ROLES))
        self.register_buffer("edge_scale", torch.ones(N_ROLES))
        if head == "invariant":
            self.readout = mlp([3 * dim, dim, out_dim])
        else:
            self.edge_head = mlp([dim, dim, g.edge_dim])
            self.node_head = mlp([dim, dim, 1])

    @property
    def spec(self) -> Spec:
        """The spec the model was built for (the default of :meth:`forward`)."""
        return self.graph.spec

    def _graph_batch(self, theta: Tensor | GraphBatch, spec: Spec | NeuralGraph | None,
                     context: Tensor | None = None) -> GraphBatch:
        if isinstance(theta, GraphBatch):
            if spec is not None or context is not None:
                raise ValueError("pass spec and context only with a population tensor, not with a GraphBatch")
            batch = theta
        else:
            graph = NeuralGraph.of(self.graph if spec is None else spec)
            batch = graph.to_graph(theta)
            if (context is None) != (self.channels == 1):
                raise ValueError(f"this model reads {self.channels} channel(s): pass context= exactly when it was "
                                 "built with channels=2")
            if context is not None:      # the context network's values as a second channel of every node and edge
                ctx = graph.to_graph(context.expand(theta.shape[0], -1))
                batch = replace(batch, x=torch.cat([batch.x, ctx.x], -1),
                                edge_attr=torch.cat([batch.edge_attr, ctx.edge_attr], -1))
        if batch.family != self.family:
            raise ValueError(f"this model reads networks of family {self.family} (kind, inputs, outputs, edge size); "
                             f"got {batch.family} from {batch.parts[0][0].spec}")
        return batch

    @torch.no_grad()
    def set_normalization(self, theta: Tensor | GraphBatch, spec: Spec | NeuralGraph | None = None) -> None:
        """Scale the weights and the biases of each layer role to unit standard deviation over the
        population ``theta`` (of ``spec``, default the model's; or a mixed :class:`GraphBatch`). One scalar
        per role (as Kofinas et al. 2024 use one per layer), so equivariance is untouched; roles that do
        not occur in ``theta`` keep their scale."""
        if isinstance(theta, Tensor):      # the network channel only (a context keeps the scales of its role)
            theta = NeuralGraph.of(self.graph if spec is None else spec).to_graph(theta.detach())
            spec = None
        gb = self._graph_batch(theta, spec)
        edge_role, node_role = gb.edge_role, gb.role
        for role in range(1, N_ROLES):
            e_sel, n_sel = edge_role == role, node_role == role
            if e_sel.any():
                self.edge_scale[role] = 1.0 / gb.edge_attr[e_sel].std().clamp_min(1e-6)
            if n_sel.any():
                self.node_scale[role] = 1.0 / gb.x[n_sel].std().clamp_min(1e-6)

    def _times(self, t: Tensor | float | None, n: int) -> Tensor | None:
        if (self.time is None) != (t is None):
            raise ValueError("pass t exactly when the model was built with time=True")
        if t is None:
            return None
        return self.time(t, n)

    def embed_graph(self, batch: GraphBatch, t: Tensor | float | None = None) -> tuple[Tensor, Tensor]:
        """Node and edge features ``[N, dim]``, ``[E, dim]`` of a graph batch after all layers. ``t``: a
        scalar or one time per graph ``[num_graphs]`` (only for ``time=True``)."""
        batch = self._graph_batch(batch, None)
        if self._grid(batch):
            h, e = self._embed_grid(batch, t)
            return h, e.t().contiguous()
        return self._embed_edges(batch, t)

    def _grid(self, batch: GraphBatch) -> bool:
        """Whether ``batch`` runs on dense blocks (:meth:`_embed_grid`): one architecture (every layered
        graph, MLP or CNN, is complete between consecutive layers) and neighbour attention."""
        return len(batch.parts) == 1 and all(isinstance(layer, RelationalTransformerLayer)
                                             and layer.attention == "neighbours" for layer in self.layers)

    def _embed_grid(self, batch: GraphBatch, t: Tensor | float | None) -> tuple[Tensor, Tensor]:
        """:meth:`embed_graph` of a batch of ``G`` graphs of one architecture with every edge tensor
        feature-major: nodes ``[G*N, dim]``, edges ``[dim, G*E]`` (see
        :meth:`~wsbook.graphs.layers.RelationalTransformerLayer.forward_grid`). Same function as the
        edge-list route; per-graph terms (time FiLM, the virtual node) broadcast over ``[dim, G, E]``."""
        graph, G, d = batch.graph, batch.num_graphs, self.dim
        layout = LayeredLayout(G, graph.widths)
        E = layout.n_edges
        h = self.node_in(batch.x * self.node_scale[batch.role].unsqueeze(-1)) + self.pos(batch.pos)
        # one input scale per block (the role of its target layer), broadcast over the graphs
        edge_scale = self._edge_scale_per_edge(layout)
        C = batch.edge_attr.shape[-1]
        attr = (batch.edge_attr.view(G, E, C).permute(2, 0, 1) * edge_scale).reshape(C, G * E)
        e = mlp_grid(self.edge_in, attr)                                                  # [d, G*E]
        cond = self._times(t, G)
        for k, layer in enumerate(self.layers):
            scale, shift = None, None
            if cond is not None:
                gamma_h, beta_h, gamma_e, beta_e = self.time_film[k](cond).chunk(4, -1)
                h = (h.view(G, -1, d) * (1 + gamma_h[:, None]) + beta_h[:, None]).view(h.shape)
                scale, shift = (1 + gamma_e).t().contiguous(), beta_e.t().contiguous()    # [d, G]
            if self.global_in is not None:          # the virtual node: every node and edge reads its graph's means
                mean_e = e.view(d, G, E).mean(-1)                                         # of e before the FiLM:
                if scale is not None:                                                     # the mean is affine in e
                    mean_e = mean_e * scale + shift
                pooled = torch.cat([h.view(G, -1, d).mean(1), mean_e.t()], -1)
                add_h, add_e = self.global_in[k](pooled).chunk(2, -1)
                h = (h.view(G, -1, d) + add_h[:, None]).view(h.shape)
                shift = add_e.t() if shift is None else shift + add_e.t()
            if scale is not None:                   # FiLM and shifts of the edges in one pass
                e = torch.addcmul(shift.unsqueeze(-1), e.view(d, G, E), scale.unsqueeze(-1)).view(d, -1)
            elif shift is not None:
                e = (e.view(d, G, E) + shift.unsqueeze(-1)).view(d, -1)
            h, e = layer.forward_grid(h, e, layout)
        return h, e

    def _edge_scale_per_edge(self, layout: LayeredLayout) -> Tensor:
        """The input scale of every edge of one graph ``[E]``: that of its block's target-layer role."""
        # one block per pair of layers (a loop over layers; repeat_interleave would read its sizes on the host)
        roles = layer_roles(len(layout.widths) - 1)[1:]
        return torch.cat([self.edge_scale[r].expand(n) for r, n in zip(roles, layout.block_sizes)])

    def _embed_edges(self, batch: GraphBatch, t: Tensor | float | None) -> tuple[Tensor, Tensor]:
        """:meth:`embed_graph` on edge lists (gathers and scatters): any batch, any layer."""
        node_role, edge_role = batch.role, batch.edge_role
        h = self.node_in(batch.x * self.node_scale[node_role].unsqueeze(-1)) + self.pos(batch.pos)
        e = self.edge_in(batch.edge_attr * self.edge_scale[edge_role].unsqueeze(-1))
        cond = self._times(t, batch.num_graphs)
        # one architecture: nodes and edges are [graphs, per graph] grids, so per-graph terms broadcast
        G = batch.num_graphs
        layout = LayeredLayout(G, batch.graph.widths) if len(batch.parts) == 1 else None
        need_edge_batch = layout is None and (cond is not None or self.global_in is not None)
        edge_batch = batch.edge_batch if need_edge_batch else None

        def affine(x: Tensor, index: Tensor | None, scale: Tensor | None, shift: Tensor) -> Tensor:
            """``x * (1 + scale) + shift`` with the rows of ``scale`` and ``shift`` per graph."""
            if layout is None:
                return (x if scale is None else x * (1 + scale[index])) + shift[index]
            v = x.view(G, -1, x.shape[-1])
            return ((v if scale is None else v * (1 + scale[:, None])) + shift[:, None]).view(x.shape)

        def graph_mean(x: Tensor, index: Tensor | None) -> Tensor:
            return global_mean_pool(x, index, G) if layout is None else x.view(G, -1, x.shape[-1]).mean(1)

        for k, layer in enumerate(self.layers):
            if cond is not None:
                gamma_h, beta_h, gamma_e, beta_e = self.time_film[k](cond).chunk(4, -1)
                h, e = affine(h, batch.batch, gamma_h, beta_h), affine(e, edge_batch, gamma_e, beta_e)
            if self.global_in is not None:          # the virtual node: every node and edge reads its graph's means
                pooled = torch.cat([graph_mean(h, batch.batch), graph_mean(e, edge_batch)], -1)
                add_h, add_e = self.global_in[k](pooled).chunk(2, -1)
                h, e = affine(h, batch.batch, None, add_h), affine(e, edge_batch, None, add_e)
            h, e = layer(h, batch.edge_index, e, batch.batch)
        return h, e

    def embed(self, theta: Tensor, *, t: Tensor | float | None = None, spec: Spec | NeuralGraph | None = None,
              context: Tensor | None = None) -> tuple[Tensor, Tensor, GraphBatch]:
        """Node and edge features ``[B*N, dim]``, ``[B*E, dim]`` after all layers, and the graph batch."""
        gb = self._graph_batch(theta, spec, context)
        h, e = self.embed_graph(gb, t)
        return h, e, gb

    def forward_graph(self, batch: GraphBatch, t: Tensor | float | None = None) -> Tensor | list[Tensor]:
        """Outputs for a (possibly mixed) graph batch: invariant head ``[num_graphs, out_dim]`` (rows in
        the batch's graph order); equivariant head one population ``[count, D_k]`` per part of the batch."""
        batch = self._graph_batch(batch, None)
        G = batch.num_graphs
        if self._grid(batch):          # edges feature-major [dim, G*E] (see _embed_grid)
            h, e = self._embed_grid(batch, t)
            layout = LayeredLayout(G, batch.graph.widths)
            if self.head == "invariant":
                pooled = torch.cat([h.view(G, -1, self.dim).mean(1), h.view(G, -1, self.dim).amax(1),
                                    e.view(self.dim, G, -1).mean(-1).t()], -1)
                return self.readout(pooled)
            edges = mlp_grid(self.edge_head, e).view(-1, G, layout.n_edges) / self._edge_scale_per_edge(layout)
            edges = edges.permute(1, 2, 0).reshape(G * layout.n_edges, -1)
        else:
            h, e = self._embed_edges(batch, t)
            if self.head == "invariant":
                pooled = torch.cat([global_mean_pool(h, batch.batch, G), global_max_pool(h, batch.batch, G),
                                    scatter(e, batch.edge_batch, 0, dim_size=G, reduce="mean")], -1)
                return self.readout(pooled)
            edges = self.edge_head(e) / self.edge_scale[batch.edge_role].unsqueeze(-1)
        # outputs in the units of the input: undo the role's input scale
        nodes = self.node_head(h).squeeze(-1) / self.node_scale[batch.role]
        return batch.to_populations(nodes, edges)

    def forward(self, theta: Tensor, *, t: Tensor | float | None = None,
                spec: Spec | NeuralGraph | None = None, context: Tensor | None = None) -> Tensor:
        """``theta [B, D]`` networks of ``spec`` (default: the spec the model was built for) ->
        ``[B, out_dim]`` (invariant head) or ``[B, D]`` (equivariant head). ``context``: ``[B, D]`` or
        ``[1, D]`` networks of the same spec read as a second channel (models with ``channels=2``)."""
        if isinstance(theta, GraphBatch):
            raise TypeError("forward takes a population tensor [B, D]; call forward_graph for a GraphBatch")
        out = self.forward_graph(self._graph_batch(theta, spec, context), t)
        return out[0] if self.head == "equivariant" else out


class WeightSpaceField(nn.Module):
    """A vector field over populations of networks, ``field(t, x) -> [B, D]``: a time-conditioned,
    equivariant :class:`WeightSpaceGNN` (FiLM of time on every node and edge), returning one velocity per
    weight and bias, equivariant to hidden-neuron permutations, for networks of any width and depth of
    its family. See chapter 6, "Two message-passing layers".

    Call it as ``field(t, x)`` (``x`` networks of the spec it was built for), ``field(t, x, spec=other)``
    for another spec of the family, or ``field.forward_graph(t, batch)`` for a mixed
    :class:`~wsbook.graphs.GraphBatch` (one velocity population per part).

    Args:
        spec: the architecture the field is built for (default spec of :meth:`forward`).
        layer, dim, n_layers, attention, heads, mean_log_degree, n_time, channels, global_context: as for
            :class:`WeightSpaceGNN`.
    """

    def __init__(self, spec: Spec | NeuralGraph, layer: str = "pna", dim: int = 32, n_layers: int = 3, *,
                 attention: str = "neighbours", heads: int = 4, mean_log_degree: float | None = None,
                 n_time: int = 8, channels: int = 1, global_context: bool = False):
        super().__init__()
        self.gnn = WeightSpaceGNN(spec, layer, dim=dim, n_layers=n_layers, head="equivariant", time=True,
                                  attention=attention, heads=heads, mean_log_degree=mean_log_degree, n_time=n_time,
                                  channels=channels, global_context=global_context)

    @property
    def graph(self) -> NeuralGraph:
        return self.gnn.graph

    @property
    def spec(self) -> Spec:
        return self.gnn.spec

    def set_normalization(self, x: Tensor | GraphBatch, spec: Spec | NeuralGraph | None = None) -> None:
        """Per-role input scales from a population (see :meth:`WeightSpaceGNN.set_normalization`); the
        velocities come out in the units of the input."""
        self.gnn.set_normalization(x, spec)

    def forward(self, t: Tensor | float, x: Tensor, spec: Spec | NeuralGraph | None = None,
                context: Tensor | None = None) -> Tensor:
        """``t`` a scalar or ``[B]``, ``x [B, D]`` networks of ``spec`` -> velocities ``[B, D]``; ``context``
        a second network channel (fields built with ``channels=2``)."""
        return self.gnn(x, t=t, spec=spec, context=context)

    def forward_graph(self, t: Tensor | float, batch: GraphBatch) -> list[Tensor]:
        """``t`` a scalar or one time per graph, a (mixed) graph batch -> one velocity population per part."""
        return self.gnn.forward_graph(batch, t)


class FlatMLP(nn.Module):
    """Baseline: an MLP on the flattened parameter vector ``[B, D]`` (no symmetry built in), ``model(theta)``.
    For a flat vector field ``field(t, x)`` over weights use :class:`wsbook.flows.TimeMLP`."""

    def __init__(self, n_params: int, hidden: int = 128, out_dim: int = 1, n_layers: int = 2):
        super().__init__()
        self.n_params = n_params
        self.net = mlp([n_params] + [hidden] * n_layers + [out_dim])

    def forward(self, theta: Tensor) -> Tensor:
        if theta.dim() != 2 or theta.shape[1] != self.n_params:
            raise ValueError(f"theta must be [B, {self.n_params}]; got {tuple(theta.shape)}")
        return self.net(theta)
