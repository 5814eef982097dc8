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

    def _attend_layered(self, h: Tensor, e: Tensor, layout: "LayeredLayout") -> Tensor:
        """:meth:`_attend_neighbours` for ``B`` graphs of one layered architecture (nodes layer by layer,
        edges block by block ``[out, in]``, graphs one after another): every block of edges is a dense
        ``[B, out, in]`` grid, so queries, keys and values are broadcast instead of gathered and the
        per-node softmax is a reduction over an axis instead of a scatter. Same function."""
        B, H, d = layout.batch, self.heads, self.dim
        dh = d // H
        nq, nk, nv = (t.reshape(B, -1, H, dh) for t in self.node_qkv(h).chunk(3, -1))    # [B, N, H, dh]
        fe = self.edge_qkv(e).reshape(B, -1, 3 * d)                                         # [B, E, 3d]
        fd = self.edge_qkv(self.direction.weight)                       # [2, 3d]: forward (in -> out), reverse
        scale = 1.0 / math.sqrt(dh)
        dq, dk, dv = (t.reshape(2, 1, 1, 1, H, dh) for t in fd.chunk(3, -1))
        # split, not sliced: the backward of a split concatenates, that of a slice fills a zero tensor per slice
        sizes = layout.widths
        nodes = [t.split(sizes, 1) for t in (nq, nk, nv)]                                 # per layer [B, n, H, dh]
        edges = fe.split(layout.block_sizes, 1)
        inbox: list[list[tuple[Tensor, Tensor, int]]] = [[] for _ in sizes]    # per node layer: messages in
        for l, block in enumerate(edges):
            n_in, n_out = sizes[l], sizes[l + 1]
            eq, ek, ev = (t.reshape(B, n_out, n_in, H, dh) for t in block.chunk(3, -1))
            qi, ki, vi = (t[l].unsqueeze(1) for t in nodes)                                  # [B, 1, in, H, dh]
            qo, ko, vo = (t[l + 1].unsqueeze(2) for t in nodes)                              # [B, out, 1, H, dh]
            # the direction terms join the small node tensors first: one full-size add per term, not two
            # forward messages: target an out node j, source an in node i (reduce over i, axis 2)
            logit = ((eq + (qo + dq[0])) * (ek + (ki + dk[0]))).sum(-1) * scale            # [B, out, in, H]
            inbox[l + 1].append((logit, ev + (vi + dv[0]), 2))
            # reverse messages: target an in node i, source an out node j (reduce over j, axis 1)
            logit = ((eq + (qi + dq[1])) * (ek + (ko + dk[1]))).sum(-1) * scale
            inbox[l].append((logit, ev + (vo + dv[1]), 1))
        out = []
        for msgs in inbox:
            top = torch.stack([lg.amax(ax).detach() for lg, _, ax in msgs]).amax(0)        # [B, n, H]
            num = den = 0
            for lg, v, ax in msgs:
                w = torch.exp(lg - top.unsqueeze(ax))
                den = den + w.sum(ax)
                num = num + (w.unsqueeze(-1) * v).sum(ax)
            out.append(num / den.unsqueeze(-1))
        return torch.cat(out, 1).reshape(-1, d)

    def forward(self, h: Tensor, edge_index: Tensor, e: Tensor, batch: Tensor | None = None,
                layout: "LayeredLayout | None" = None) -> tuple[Tensor, Tensor]:
        """``batch [N]`` (graph id of every node, sorted) is needed by ``attention="all"`` for a batch of
        several graphs; ``None`` means one graph. ``layout``: the batch is ``B`` graphs of one layered
        architecture (:class:`LayeredLayout`); neighbour attention and the edge update then run on dense
        blocks (same function, no gathers or scatters)."""
        if self.attention == "neighbours":
            att = self._attend_neighbours(h, edge_index, e) if layout is None else self._attend_layered(h, e, layout)
        else:
            att = self._attend_all(h, edge_index, e, batch)
        h = self.norm1(h + self.out(att))
        h = self.norm2(h + self.ffn(h))
        update = (_edge_update(self.update_edge, h, e, edge_index) if layout is None
                  else _edge_update_layered(self.update_edge, h, e, layout))
        e = self.norm_edge(e + update)
        return h, e


class LayeredLayout:
    """``batch`` graphs of one layered architecture with layer ``widths``, in the order of
    :meth:`~wsbook.graphs.NeuralGraph.to_graph`: nodes layer by layer, the edges of layer ``l`` as an
    ``[out, in]`` grid, graph after graph. Layers that know it replace gathers by broadcasting."""

    def __init__(self, batch: int, widths: tuple[int, ...]):
        self.batch, self.widths = int(batch), tuple(int(w) for w in widths)

    @property
    def block_sizes(self) -> list[int]:
        """Edges of every block (within one graph)."""
        return [i * o for i, o in zip(self.widths[:-1], self.widths[1:])]


def _edge_update_layered(net: nn.Sequential, h: Tensor, e: Tensor, layout: LayeredLayout) -> Tensor:
    """:func:`_edge_update` on dense blocks: ``W [h_out, h_in, e]`` as a broadcast sum per block."""
    first, d, B = net[0], h.shape[-1], layout.batch
    w = first.weight
    sizes = layout.widths
    hd = F.linear(h, w[:, :d], first.bias).reshape(B, -1, w.shape[0]).split(sizes, 1)   # as target (out node)
    hs = F.linear(h, w[:, d:2 * d]).reshape(B, -1, w.shape[0]).split(sizes, 1)          # as source (in node)
    z = F.linear(e, w[:, 2 * d:]).reshape(B, -1, w.shape[0]).split(layout.block_sizes, 1)
    parts = []
    for l, zl in enumerate(z):
        zb = zl.reshape(B, sizes[l + 1], sizes[l], -1) + hd[l + 1].unsqueeze(2) + hs[l].unsqueeze(1)
        parts.append(zb.reshape(B, sizes[l + 1] * sizes[l], -1))
    return net[1:](torch.cat(parts, 1).reshape(-1, w.shape[0]))
