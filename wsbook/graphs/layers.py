"""Message-passing layers over neural graphs (Kofinas et al., 2024; thesis ``000`` §5.1).

* :class:`PNAEdgeLayer`: principal neighbourhood aggregation (Corso et al., 2020; eq. 5.3-5.4) built on
  torch-geometric's ``MessagePassing``, with messages modulated by the edge features (FiLM, Brockschmidt
  2020) and an edge update (eq. 5.2). Its degree scalers (:class:`DegreeScaledAggregation`) read the
  degrees of the graph being processed and one fixed reference, so a layer is not tied to one architecture.
* :class:`PNALayer`: node-only PNA (no edge update, no FiLM), the function of torch-geometric's ``PNAConv``
  computed with per-node projections (the benchmark against ``PNAConv`` and an ablation of the edge update).
* :class:`RelationalTransformerLayer`: attention whose queries, keys and values mix node and edge
  features (Diao & Loynd, 2023; eq. 5.6), over graph neighbours or over all nodes of each graph (graphs
  of different sizes in one batch are padded and masked).

Every layer has the signature ``layer(h, edge_index, e, batch=None) -> (h, e)``. Messages flow in both
directions of every edge; a learned direction embedding tells them apart. The time embedding of
time-conditioned models is :class:`wsbook.flows.TimeEmbedding` (one for the whole library).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.aggr import Aggregation
from torch_geometric.utils import degree, scatter, softmax, to_dense_batch

#: bytes of one block's ``[graphs, n, n, 3 * dim]`` edge projections in all-pairs attention (about a core's L2)
ALL_PAIRS_BLOCK_BYTES = 2 ** 21


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


def _edge_update(net: nn.Sequential, h: Tensor, e: Tensor, edge_index: Tensor) -> Tensor:
    """``net([h_dst, h_src, e])`` without materialising the concatenation per edge: the first linear
    layer is applied to the node features once per node and gathered (the same function, fewer FLOPs)."""
    first, d = net[0], h.shape[-1]
    w = first.weight
    src, dst = edge_index
    z = F.linear(h, w[:, :d], first.bias)[dst] + F.linear(h, w[:, d:2 * d])[src] + F.linear(e, w[:, 2 * d:])
    return net[1:](z)


class DegreeScaledAggregation(Aggregation):
    """PNA's aggregation ``[identity, amplification, attenuation] x [mean, std, max, min]`` (eq. 5.3) with
    the scalers ``S(d, alpha) = (log(d + 1) / delta)^alpha`` computed from the degrees of the graph being
    aggregated and one fixed reference ``delta`` (``mean_log_degree``), instead of a degree histogram of
    one architecture. The same layer therefore aggregates graphs of any width and depth.

    Mean and standard deviation come from one sum and one sum of squares per node (as torch-geometric's
    ``StdAggregation`` computes them, without computing the mean twice); nodes without incoming
    messages aggregate to zero.
    """

    def __init__(self, mean_log_degree: float):
        super().__init__()
        if not mean_log_degree > 0:
            raise ValueError(f"mean_log_degree must be positive; got {mean_log_degree}")
        self.mean_log_degree = float(mean_log_degree)

    def forward(self, x: Tensor, index: Tensor | None = None, ptr: Tensor | None = None,
                dim_size: int | None = None, dim: int = -2) -> Tensor:
        self.assert_index_present(index)
        if x.dim() != 2 or dim not in (0, -2):
            raise ValueError(f"DegreeScaledAggregation expects messages [M, d] aggregated over dim 0; got {tuple(x.shape)}")
        n = int(index.max()) + 1 if dim_size is None else dim_size
        deg = degree(index, num_nodes=n, dtype=x.dtype).clamp(min=1).unsqueeze(-1)
        mean = scatter(x, index, 0, dim_size=n, reduce="sum") / deg
        var = scatter(x * x, index, 0, dim_size=n, reduce="sum") / deg - mean * mean
        std = var.clamp(min=1e-5).sqrt()
        std = std.masked_fill(std <= math.sqrt(1e-5), 0.0)
        out = torch.cat([mean, std, scatter(x, index, 0, dim_size=n, reduce="max"),
                         scatter(x, index, 0, dim_size=n, reduce="min")], -1)
        log_deg = torch.log(deg + 1)
        return torch.cat([out, out * (log_deg / self.mean_log_degree), out * (self.mean_log_degree / log_deg)], -1)

    def extra_repr(self) -> str:
        return f"mean_log_degree={self.mean_log_degree:.4f}"


class PNAEdgeLayer(MessagePassing):
    """PNA with FiLM edge modulation and an edge update.

    Message ``m_ij = MLP(gamma(e_ij) * (W [h_i, h_j]) + beta(e_ij))``; aggregation
    ``[identity, amplification, attenuation] x [mean, std, max, min]`` (eq. 5.3, degrees from the input
    graph, ``mean_log_degree`` the reference ``delta``); node update ``h_i <- h_i + U([h_i, agg_i])``; edge
    update ``e_ij <- e_ij + V([h_i, h_j, e_ij])`` (eq. 5.2).

    Args:
        dim: node and edge feature size.
        mean_log_degree: the degree scalers' reference ``delta = mean log(d + 1)`` (for example
            :meth:`~wsbook.graphs.NeuralGraph.mean_log_degree` of the architecture the model is built for).
    """

    def __init__(self, dim: int, mean_log_degree: float):
        super().__init__(aggr=DegreeScaledAggregation(mean_log_degree))
        self.direction = nn.Embedding(2, dim)
        self.pre = nn.Linear(2 * dim, dim)
        self.film = nn.Linear(dim, 2 * dim)
        self.post = mlp([dim, dim, dim])
        self.update_node = mlp([dim + 12 * dim, dim, dim])
        self.update_edge = mlp([3 * dim, dim, dim])
        self.norm_node, self.norm_edge = nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, h: Tensor, edge_index: Tensor, e: Tensor, batch: Tensor | None = None) -> tuple[Tensor, Tensor]:
        d = h.shape[-1]
        ei = torch.cat([edge_index, edge_index.flip(0)], 1)
        # W [h_i, h_j] = W_1 h_i + W_2 h_j: project once per node, gather per message
        w = self.pre.weight
        target, source = F.linear(h, w[:, :d], self.pre.bias), F.linear(h, w[:, d:])
        # film(e + direction_k) = film_W e + film(direction_k): project each edge once for both directions
        fe, fd = F.linear(e, self.film.weight), self.film(self.direction.weight)
        f = (fe.unsqueeze(0) + fd.unsqueeze(1)).reshape(-1, fe.shape[-1])          # [2E, 2d]: both directions
        agg = self.propagate(ei, target=target, source=source, f=f, size=(h.shape[0], h.shape[0]))
        h = self.norm_node(h + self.update_node(torch.cat([h, agg], -1)))
        e = self.norm_edge(e + _edge_update(self.update_edge, h, e, edge_index))
        return h, e

    def message(self, target_i: Tensor, source_j: Tensor, f: Tensor) -> Tensor:
        gamma, beta = f.chunk(2, -1)
        return self.post(torch.addcmul(beta, gamma, target_i + source_j))


class PNALayer(MessagePassing):
    """Node-only principal neighbourhood aggregation (Corso et al., 2020): PNA with the edge update and the
    FiLM modulation of :class:`PNAEdgeLayer` switched off; edges are read, never updated.

    Message ``m_ij = W_M [h_i, h_j, W_E e_ij + b_E] + b_M``; the same aggregation as :class:`PNAEdgeLayer`
    (:class:`DegreeScaledAggregation`); node update ``h_i <- W_O (W_U [h_i, agg_i] + b_U) + b_O``. This is
    the function of torch-geometric's ``PNAConv(dim, dim, ["mean", "std", "max", "min"], ["identity",
    "amplification", "attenuation"], deg, edge_dim=dim)`` (one tower, one pre- and one post-layer) applied to
    both directions of every edge (:func:`bidirectional`); parameters carry the same names (``edge_encoder``,
    ``pre``, ``post``, ``lin``), so weights can be copied between the two. It is computed differently:
    ``W_M`` is split by input, so every node and every edge is projected once and the projections are
    gathered per message, instead of a linear layer over a concatenated ``[h_i, h_j, e_ij]`` per message.

    Args:
        dim: node and edge feature size.
        mean_log_degree: the degree scalers' reference ``delta = mean log(d + 1)`` (as for :class:`PNAEdgeLayer`).
    """

    def __init__(self, dim: int, mean_log_degree: float):
        super().__init__(aggr=DegreeScaledAggregation(mean_log_degree))
        self.direction = nn.Embedding(2, dim)
        self.edge_encoder = nn.Linear(dim, dim)
        self.pre = nn.Linear(3 * dim, dim)
        self.post = nn.Linear(13 * dim, dim)
        self.lin = nn.Linear(dim, dim)

    def forward(self, h: Tensor, edge_index: Tensor, e: Tensor, batch: Tensor | None = None) -> tuple[Tensor, Tensor]:
        d = h.shape[-1]
        ei = torch.cat([edge_index, edge_index.flip(0)], 1)
        w = self.pre.weight
        target, source = F.linear(h, w[:, :d], self.pre.bias), F.linear(h, w[:, d:2 * d])
        # W_C (W_E (e + direction_k) + b_E) = (W_C W_E) e + W_C (W_E direction_k + b_E): each edge once
        w_edge = w[:, 2 * d:]
        fe = F.linear(e, w_edge @ self.edge_encoder.weight)
        fd = F.linear(self.edge_encoder(self.direction.weight), w_edge)
        f = (fe.unsqueeze(0) + fd.unsqueeze(1)).reshape(-1, d)                     # [2E, d]: both directions
        agg = self.propagate(ei, target=target, source=source, f=f, size=(h.shape[0], h.shape[0]))
        return self.lin(self.post(torch.cat([h, agg], -1))), e

    def message(self, target_i: Tensor, source_j: Tensor, f: Tensor) -> Tensor:
        return target_i + source_j + f


class RelationalTransformerLayer(nn.Module):
    """Relational attention: ``q_ij = h_i W_N^Q + e_ij W_E^Q``, ``k_ij = h_j W_N^K + e_ij W_E^K``,
    ``v_ij = h_j W_N^V + e_ij W_E^V`` (Diao & Loynd, 2023; thesis eq. 5.6), then a feed-forward block and
    an edge update. ``attention="neighbours"`` attends over graph neighbours (softmax per target node,
    torch-geometric ``softmax``); ``"all"`` attends over every node of the same graph, non-edges carrying
    a learned "no edge" feature. With ``"all"`` the graphs of a batch may have different sizes: they are
    padded to the largest (``to_dense_batch``) and the padding is masked out of every softmax, so each
    node attends exactly to the nodes of its own graph.

    Args:
        dim: node and edge feature size.
        heads: number of attention heads (must divide ``dim``).
        attention: ``"neighbours"`` or ``"all"``.
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
        ei = torch.cat([edge_index, edge_index.flip(0)], 1)
        src, dst = ei
        H, dh = self.heads, self.dim // self.heads
        nq, nk, nv = self.node_qkv(h).chunk(3, -1)
        # edge_qkv is linear without bias: edge_qkv(e + direction_k) = edge_qkv(e) + edge_qkv(direction_k)
        fe, fd = self.edge_qkv(e), self.edge_qkv(self.direction.weight)
        eq, ek, ev = (fe.unsqueeze(0) + fd.unsqueeze(1)).reshape(-1, fe.shape[-1]).chunk(3, -1)
        q = (nq[dst] + eq).view(-1, H, dh)
        k = (nk[src] + ek).view(-1, H, dh)
        v = (nv[src] + ev).view(-1, H, dh)
        alpha = softmax((q * k).sum(-1) / math.sqrt(dh), dst, num_nodes=h.shape[0])     # [2E, H]
        return scatter(alpha.unsqueeze(-1) * v, dst, dim=0, dim_size=h.shape[0], reduce="sum").reshape(-1, self.dim)

    def _attend_all(self, h: Tensor, edge_index: Tensor, e: Tensor, batch: Tensor | None) -> Tensor:
        if batch is None:
            batch = h.new_zeros(h.shape[0], dtype=torch.long)
        dense_h, mask = to_dense_batch(h, batch)                                        # [G, n, d], [G, n]
        G, n = mask.shape
        first = torch.cumsum(mask.sum(1), 0) - mask.sum(1)                              # first node of each graph
        local = torch.arange(h.shape[0], device=h.device) - first[batch]                # index within its graph
        ei, ea = bidirectional(edge_index, e, self.direction)
        src, dst = ei
        dense = self.no_edge.expand(G, n, n, self.dim).clone()
        dense[batch[dst], local[dst], local[src]] = ea                                  # [G, N(target), N(source), d]
        # a few graphs at a time: a block's [g, n, n, 3d] tensors then stay in cache, where those of a whole
        # batch would stream through memory at every elementwise step
        g = max(1, ALL_PAIRS_BLOCK_BYTES // (n * n * 3 * self.dim * dense.element_size()))
        out = [self._attend_dense(dense_h[s:s + g], dense[s:s + g], mask[s:s + g]) for s in range(0, G, g)]
        return torch.cat(out).reshape(G, n, self.dim)[mask]

    def _attend_dense(self, dense_h: Tensor, dense: Tensor, mask: Tensor) -> Tensor:
        """All-pairs attention of ``G`` padded graphs: nodes ``[G, n, d]``, edges ``[G, n, n, d]``."""
        G, n = mask.shape
        H, dh = self.heads, self.dim // self.heads
        nq, nk, nv = (t.view(G, n, H, dh) for t in self.node_qkv(dense_h).chunk(3, -1))
        eq, ek, ev = (t.view(G, n, n, H, dh) for t in self.edge_qkv(dense).chunk(3, -1))
        q = nq.unsqueeze(2) + eq                                                        # [G, i, j, H, dh]
        k = nk.unsqueeze(1) + ek
        v = nv.unsqueeze(1) + ev
        logits = (q * k).sum(-1) / math.sqrt(dh)                                        # [G, i, j, H]
        logits = logits.masked_fill(~mask[:, None, :, None], float("-inf"))             # padded sources j
        alpha = torch.softmax(logits, dim=2)
        return (alpha.unsqueeze(-1) * v).sum(2)

    def forward_grid(self, h: Tensor, e: Tensor, layout: "LayeredLayout") -> tuple[Tensor, Tensor]:
        """:meth:`forward` (neighbour attention) for ``B`` graphs of one layered architecture, with the edge
        features *feature-major*: ``h [B*N, d]`` (nodes as usual), ``e [d, B*E]`` (column ``b*E + k`` is edge
        ``k`` of graph ``b``, edges block by block ``[out, in]``) -> ``(h, e)`` in the same layouts.

        Same function as the edge-list route. Every block of edges is a dense ``[B, out, in]`` grid: queries,
        keys and values of nodes are broadcast over it instead of gathered per edge, the softmax over a
        node's incoming edges is a reduction over an axis of the grid instead of a scatter, and the node
        part of every value is summed by a batched product ``[out, in] @ [in, dh]``. Feature-major edge
        tensors make every per-edge linear layer one ``[o, d] @ [d, B*E]`` product (at ``d = 8`` about six
        times faster on a CPU than ``[B*E, d] @ [d, o]``, whose output rows are 8 numbers wide) and keep
        each feature a contiguous row, so the reductions over ``in`` run along memory."""
        att = self._attend_grid(h, e, layout)
        h = self.norm1(h + self.out(att))
        h = self.norm2(h + self.ffn(h))
        update = mlp_grid(self.update_edge, _edge_first_layer_grid(self.update_edge[0], h, e, layout), skip_first=True)
        e = grid_layer_norm(e + update, self.norm_edge)
        return h, e

    def _attend_grid(self, h: Tensor, e: Tensor, layout: "LayeredLayout") -> Tensor:
        """Neighbour attention on dense blocks, edges feature-major (see :meth:`forward_grid`): ``[B*N, d]``."""
        B, H, d = layout.batch, self.heads, self.dim
        dh = d // H
        sizes, N, E = layout.widths, layout.n_nodes, layout.n_edges
        scale = 1.0 / math.sqrt(dh)
        fd = self.edge_qkv(self.direction.weight).view(2, 3, H, dh)      # direction terms: forward, reverse
        # node terms with the direction terms added (small tensors), feature-major like the edges so that
        # broadcasting them over a block runs along memory: per direction and layer [3 (q, k, v), H, dh, B, n]
        nodes = torch.addmm(self.node_qkv.bias[:, None], self.node_qkv.weight, h.t()).view(3, H, dh, B, N)
        fwd, rev = ([t.unbind(0) for t in (nodes + fd[k].view(3, H, dh, 1, 1)).split(sizes, -1)] for k in (0, 1))
        # one product for every edge of the batch, then [H, dh, B, out, in] views of its blocks
        qkv = torch.mm(self.edge_qkv.weight, e).view(3, H, dh, B, E)
        inbox: list[list[tuple[Tensor, Tensor, Tensor, int]]] = [[] for _ in sizes]
        for l, (eq, ek, ev) in enumerate(grid_views(qkv, layout)):
            # forward messages: target an out node o, source an in node i (softmax over i, the last axis)
            q, k = eq + fwd[l + 1][0].unsqueeze(-1), ek + fwd[l][1].unsqueeze(-2)
            inbox[l + 1].append(((q * k).sum(1) * scale, ev, fwd[l][2], -1))             # [H, B, out, in]
            # reverse messages: target an in node i, source an out node o (softmax over o)
            q, k = eq + rev[l][0].unsqueeze(-2), ek + rev[l + 1][1].unsqueeze(-1)
            inbox[l].append(((q * k).sum(1) * scale, ev, rev[l + 1][2], -2))
        out = []
        for msgs in inbox:
            top = torch.stack([lg.detach().amax(ax) for lg, _, _, ax in msgs]).amax(0)    # [H, B, n]
            num = den = 0
            for lg, ev, vn, ax in msgs:
                w = torch.exp(lg - top.unsqueeze(ax))
                den = den + w.sum(ax)
                # sum_src w (ev + v_src) = sum_src w ev + w @ v_src: the node part is a batched product
                if ax == -1:      # [H, dh, B, in] -> [H, B, out, dh]
                    node_part = torch.matmul(w, vn.permute(0, 2, 3, 1))
                else:
                    node_part = torch.matmul(w.transpose(-1, -2), vn.permute(0, 2, 3, 1))
                num = num + (w.unsqueeze(1) * ev).sum(ax) + node_part.permute(0, 3, 1, 2)
            out.append(num / den.unsqueeze(1))                                            # [H, dh, B, n]
        return torch.cat(out, -1).permute(2, 3, 0, 1).reshape(B * N, d)

    def forward(self, h: Tensor, edge_index: Tensor, e: Tensor, batch: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``batch [N]`` (graph id of every node, sorted) is needed by ``attention="all"`` for a batch of
        several graphs; ``None`` means one graph. (Batches of one layered architecture can run
        :meth:`forward_grid` instead: same function on dense blocks.)"""
        if self.attention == "neighbours":
            att = self._attend_neighbours(h, edge_index, e)
        else:
            att = self._attend_all(h, edge_index, e, batch)
        h = self.norm1(h + self.out(att))
        h = self.norm2(h + self.ffn(h))
        e = self.norm_edge(e + _edge_update(self.update_edge, h, e, edge_index))
        return h, e


class LayeredLayout:
    """``batch`` graphs of one layered architecture with layer ``widths``, in the order of
    :meth:`~wsbook.graphs.NeuralGraph.to_graph`: nodes layer by layer, the edges of layer ``l`` as an
    ``[out, in]`` grid, graph after graph. Layers that know it replace gathers by broadcasting
    (:meth:`RelationalTransformerLayer.forward_grid`)."""

    def __init__(self, batch: int, widths: tuple[int, ...]):
        self.batch, self.widths = int(batch), tuple(int(w) for w in widths)
        self.node_start = [sum(self.widths[:l]) for l in range(len(self.widths))]
        self.edge_start = [sum(self.block_sizes[:l]) for l in range(len(self.block_sizes))]

    @property
    def block_sizes(self) -> list[int]:
        """Edges of every block (within one graph)."""
        return [i * o for i, o in zip(self.widths[:-1], self.widths[1:])]

    @property
    def n_nodes(self) -> int:
        return sum(self.widths)

    @property
    def n_edges(self) -> int:
        return sum(self.block_sizes)

    def block(self, x: Tensor, l: int) -> Tensor:
        """The ``[..., B, out, in]`` view of block ``l`` of edge values ``x [..., B, E]``."""
        n_in, n_out, s = self.widths[l], self.widths[l + 1], self.edge_start[l]
        return x[..., s:s + n_in * n_out].unflatten(-1, (n_out, n_in))

    def nodes(self, x: Tensor, l: int) -> Tensor:
        """The ``[..., B, n_l]`` slice of layer ``l`` of node values ``x [..., B, N]``."""
        return x[..., self.node_start[l]:self.node_start[l] + self.widths[l]]


class _GridViews(torch.autograd.Function):
    """``qkv [3, H, dh, B, E]`` -> per block ``(q, k, v)`` views ``[H, dh, B, out, in]``. Backward writes
    every block's gradient once into one buffer (the gradients of ``split``/``unbind`` would be
    concatenated twice, those of slices filled into a zero tensor each)."""

    @staticmethod
    def forward(ctx, qkv: Tensor, layout: LayeredLayout) -> tuple[Tensor, ...]:
        ctx.layout = layout
        ctx.set_materialize_grads(False)
        return tuple(layout.block(qkv[j], l) for l in range(len(layout.block_sizes)) for j in range(3))

    @staticmethod
    def backward(ctx, *grads: Tensor | None):
        layout = ctx.layout
        out = None
        for n, g in enumerate(grads):
            if out is None:
                ref = next(x for x in grads if x is not None)
                out = ref.new_empty((3, *ref.shape[:3], layout.n_edges))
            slot = layout.block(out[n % 3], n // 3)
            slot.zero_() if g is None else slot.copy_(g)
        return out, None


def grid_views(qkv: Tensor, layout: LayeredLayout) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Per block ``(q, k, v)``, each ``[H, dh, B, out, in]``, of edge projections ``qkv [3, H, dh, B, E]``."""
    flat = _GridViews.apply(qkv, layout)
    return [flat[3 * l:3 * l + 3] for l in range(len(layout.block_sizes))]


class _GridAdd(torch.autograd.Function):
    """``z [c, B, E]`` plus, on every block, a term of its out node and a term of its in node
    (``out [c, B, N]``, ``inn [c, B, N]``): one output tensor, no concatenation; the backward passes the
    gradient of ``z`` through and reduces it over the grid's axes for the node terms."""

    @staticmethod
    def forward(ctx, z: Tensor, out_term: Tensor, in_term: Tensor, layout: LayeredLayout) -> Tensor:
        ctx.layout = layout
        res = torch.empty_like(z, memory_format=torch.contiguous_format)
        for l in range(len(layout.block_sizes)):
            r = layout.block(res, l)
            torch.add(layout.block(z, l), layout.nodes(out_term, l + 1).unsqueeze(-1), out=r)
            r.add_(layout.nodes(in_term, l).unsqueeze(-2))
        return res

    @staticmethod
    def backward(ctx, g: Tensor):
        layout = ctx.layout
        c, B = g.shape[:2]
        g_out = g.new_zeros(c, B, layout.n_nodes)
        g_in = g.new_zeros(c, B, layout.n_nodes)
        for l in range(len(layout.block_sizes)):
            gb = layout.block(g, l)
            layout.nodes(g_out, l + 1).add_(gb.sum(-1))
            layout.nodes(g_in, l).add_(gb.sum(-2))
        return g, g_out, g_in, None


def _edge_first_layer_grid(first: nn.Linear, h: Tensor, e: Tensor, layout: LayeredLayout) -> Tensor:
    """The first layer of :func:`_edge_update`, ``W [h_out, h_in, e] + b``, on feature-major edges
    ``e [d, B*E]`` -> ``[o, B*E]``: nodes projected once, broadcast over every block."""
    d, B = h.shape[-1], layout.batch
    w = first.weight
    # node terms feature-major [o, B, N] (contiguous: broadcast over a block along memory)
    hd = torch.addmm(first.bias[:, None], w[:, :d], h.t()).view(-1, B, layout.n_nodes)   # as target (out node)
    hs = torch.mm(w[:, d:2 * d], h.t()).view(-1, B, layout.n_nodes)                       # as source (in node)
    z = torch.mm(w[:, 2 * d:], e).view(w.shape[0], B, -1)
    return _GridAdd.apply(z, hd, hs, layout).view(w.shape[0], -1)


def mlp_grid(net: nn.Sequential, x: Tensor, skip_first: bool = False) -> Tensor:
    """An :func:`mlp` (``nn.Linear`` and activations) on feature-major inputs ``x [in, M]`` -> ``[out, M]``:
    every linear layer is ``W @ x + b``. ``skip_first``: ``x`` already is the first linear layer's output."""
    for k, module in enumerate(net):
        if skip_first and k == 0:
            continue
        if isinstance(module, nn.Linear):
            x = (torch.mm(module.weight, x) if module.bias is None
                 else torch.addmm(module.bias[:, None], module.weight, x))
        else:
            x = module(x)
    return x


class _FeatureMajorLayerNorm(torch.autograd.Function):
    """Layer norm over axis 0 of ``x [d, M]`` (one column one feature vector), forward and backward each
    a few passes along the rows."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
        # torch.var_mean over axis 0 runs at a small fraction of the speed of these passes along the rows
        xc = x - x.mean(0)
        rstd = (xc * xc).mean(0).add_(eps).rsqrt_()
        xhat = xc.mul_(rstd)
        ctx.save_for_backward(xhat, rstd, weight)
        return torch.addcmul(bias[:, None], xhat, weight[:, None])

    @staticmethod
    def backward(ctx, g: Tensor):
        xhat, rstd, weight = ctx.saved_tensors
        gx = g * weight[:, None]
        a, b = gx.mean(0), (gx * xhat).mean(0)
        dx = torch.addcmul(gx.sub_(a), xhat, b, value=-1).mul_(rstd)
        return dx, (g * xhat).sum(1), g.sum(1), None


def grid_layer_norm(x: Tensor, norm: nn.LayerNorm) -> Tensor:
    """``norm`` (an ``nn.LayerNorm`` over the feature axis) on feature-major ``x [d, M]``."""
    return _FeatureMajorLayerNorm.apply(x, norm.weight, norm.bias, norm.eps)
