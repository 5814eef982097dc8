"""A vector field over the weights of convolutional networks (:class:`~wsbook.nets.CNNSpec`), of the neuron-field
family (:class:`~wsbook.weightflow.fields.NeuronField`):
every hidden *channel* is one node that reads its fixed-order weights whole.

A CNN ``in_channels -> c_1 -> ... -> c_L -> (global average pool) -> head`` has exchangeable hidden channels
within each convolution and fixed input channels and classes. Hence, for channel ``j`` of hidden layer ``h``:

* its fixed-order vector holds its bias, and, in the first hidden layer, its kernel over the input channels
  ``W_1[j]`` (``in_channels * k * k`` numbers), and, in the last hidden layer, the head's column reading its
  pooled feature ``W_head[:, j]`` (``n_classes`` numbers). With one convolution a channel is thus
  ``[W_1[j], b_1[j], W_head[:, j]]``, its incoming kernel, bias and outgoing weights in one vector, as a hidden
  neuron is for :class:`~wsbook.weightflow.fields.NeuronField`;
* the kernels between two hidden convolutions, ``W_{h+1}[i, j]`` (``k * k`` numbers), are indexed by
  exchangeable channels on both sides, so no node may read them in a fixed order: each is an *edge* with a
  feature of its own, and a channel reads its incoming and outgoing kernels as a set (the mean of their
  messages).

The field is equivariant to permutations of every hidden convolution's channels (test: permuting the channels
of the input network permutes the output velocity the same way), and no parameter depends on a hidden
width, so :meth:`ChannelField.with_spec` evaluates the same trained module on CNNs with other channel counts
(same depth, input channels, kernel size and classes).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from wsbook.flows.models import time_features
from wsbook.nets import CNNSpec, check_other_widths, repeat_units
from wsbook.weightflow.fields import (FIELDS, TIME_FEATURES, WeightField, _build_edge_readout, _build_rounds,
                                     _edge_reads, _message_rounds, _mlp, _summary, _times)


class ChannelField(WeightField):
    """``field(t, x)`` for CNNs: a DeepSets / attention field over the hidden channels (see the module docstring).

    With ``s_h`` the size of hidden layer ``h``'s fixed-order channel vectors ``u`` (``[B, c_h, s_h]``) and
    ``e`` the kernels between hidden layers (``[B, c_{h+1}, c_h, k * k]``):

    * encode: ``n_j = enc_h(u_j) + time(t)``; every edge ``e_ij = edge_enc(kernel_ij)``;
    * ``rounds`` times: every edge from its two end channels, ``e += msg(e + P n_dst + Q n_src)``; every channel
      from the mean message of its incoming and outgoing edges; then every channel from a context of the
      mean channel of every hidden layer, the head's bias and the time (``n += node(norm(n + ctx))``);
    * ``attention_layers`` self-attention layers among the channels of each hidden layer (no positions:
      equivariant; a Set Transformer-style encoder, so that the channels can divide the work);
    * decode: each channel's vector ``dec_h(n_j)``, each kernel ``edge_dec(e_ij + P' n_i + Q' n_j)``, the
      head's bias from the context; plus a per-coordinate linear term ``(a + b t) x`` (shared by the channels
      of a layer and by the kernels between two layers), zero at the start.

    Args:
        spec: the CNN architecture (any activation: the permutation symmetry does not depend on it).
        hidden: width of the channel features, encoders, decoders and context.
        edge_dim: width of the kernel (edge) features; unused with one convolution.
        rounds: rounds of message passing and context updates.
        attention_layers: self-attention layers among each hidden layer's channels (0: DeepSets only).
        heads: attention heads (must divide ``hidden``).
        anchored: every channel and kernel is read beside the same channel and kernel of an anchor network (as
            :class:`~wsbook.weightflow.NeuronField`'s ``anchored``; :meth:`WeightFlow.fit` sets the mean
            aligned training network): equivariant in the pair; :meth:`with_spec` widens the anchor by
            repeating its channels.

    Shapes: ``x`` is ``[B, D]`` in the spec's flat layout, ``t`` a number or ``[B]``; the output is ``[B, D]``.
    """

    kind = "channel"

    def __init__(self, spec: CNNSpec, hidden: int = 64, edge_dim: int = 16, rounds: int = 1,
                 attention_layers: int = 0, heads: int = 4, anchored: bool = False):
        super().__init__()
        if not isinstance(spec, CNNSpec):
            raise TypeError(f"ChannelField needs a CNNSpec; got {type(spec).__name__} (for MLPs use "
                            "NeuronField)")
        if min(hidden, edge_dim, rounds) < 1 or attention_layers < 0:
            raise ValueError(f"ChannelField: hidden, edge_dim and rounds must be positive and attention_layers "
                             f"non-negative; got {hidden}, {edge_dim}, {rounds}, {attention_layers}")
        if attention_layers and hidden % heads:
            raise ValueError(f"ChannelField: heads ({heads}) must divide hidden ({hidden})")
        self.spec, self.anchored = spec, bool(anchored)
        self.kwargs = dict(hidden=hidden, edge_dim=edge_dim, rounds=rounds, attention_layers=attention_layers,
                           heads=heads) | ({"anchored": True} if anchored else {})
        c = 2 if anchored else 1
        if anchored:
            self.register_buffer("anchor", torch.zeros(1, spec.n_params))
        n_hidden, kk, n_out = len(spec.channels), spec.kernel_size ** 2, spec.n_classes
        self.n_first = spec.in_channels * kk          # a first-layer channel's kernel over the input channels
        sizes = [(self.n_first if h == 0 else 0) + 1 + (n_out if h == n_hidden - 1 else 0) for h in range(n_hidden)]
        summary = n_hidden * hidden + n_out + TIME_FEATURES
        self.enc = nn.ModuleList(_mlp(c * k, hidden, hidden) for k in sizes)
        self.time = nn.Linear(TIME_FEATURES, hidden)
        self.edge_enc = nn.ModuleList(_mlp(c * kk, edge_dim, edge_dim) for _ in range(n_hidden - 1))
        _build_rounds(self, n_hidden, hidden, edge_dim, rounds, summary)
        self.mix = nn.ModuleList(
            nn.ModuleList(nn.TransformerEncoderLayer(hidden, heads, 2 * hidden, dropout=0.0, activation="gelu",
                                                     batch_first=True, norm_first=True)
                          for _ in range(attention_layers))
            for _ in range(n_hidden))
        self.dec = nn.ModuleList(nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, k))
                                 for k in sizes)
        _build_edge_readout(self, n_hidden, hidden, edge_dim, kk)
        self.head = _mlp(summary, hidden, n_out)
        self.linear_nodes = nn.ParameterList(nn.Parameter(torch.zeros(2, k)) for k in sizes)
        self.linear_edges = nn.ParameterList(nn.Parameter(torch.zeros(2, kk)) for _ in range(n_hidden - 1))

    def channels(self, x: Tensor) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """The network's parts as the field reads them: per hidden layer ``h`` its channels' fixed-order
        vectors ``[B, c_h, s_h]``, per pair of consecutive hidden layers the kernels between them
        ``[B, c_{h+1}, c_h, k * k]``, and the head's bias ``[B, n_classes]``."""
        ws, bs = self.spec.weights(x), self.spec.biases(x)
        n_hidden = len(self.spec.channels)
        nodes = []
        for h in range(n_hidden):
            parts = ([ws[0].flatten(2)] if h == 0 else []) + [bs[h][..., None]] + (
                [ws[-1].transpose(1, 2)] if h == n_hidden - 1 else [])
            nodes.append(torch.cat(parts, -1))
        return nodes, [w.flatten(3) for w in ws[1:-1]], bs[-1]

    def forward(self, t: Tensor | float, x: Tensor) -> Tensor:
        x = self.spec.check(x, "x")
        t = _times(t, x)
        tf = time_features(t, TIME_FEATURES - 1, x.shape[0]).to(x)
        nodes, edges, b_out = self.channels(x)
        node_in, edge_in = nodes, edges
        if self.anchored:
            a_nodes, a_edges, _ = self.channels(self.anchor)
            node_in = [torch.cat([u, a.expand_as(u)], -1) for u, a in zip(nodes, a_nodes)]
            edge_in = [torch.cat([k, a.expand_as(k)], -1) for k, a in zip(edges, a_edges)]
        h = [enc(u) + self.time(tf)[:, None] for enc, u in zip(self.enc, node_in)]
        e = [enc(k) for enc, k in zip(self.edge_enc, edge_in)]           # [B, c_{h+1}, c_h, edge_dim]
        h, e = _message_rounds(self, h, e, b_out, tf)
        h = [self._attend(hl, mix) for hl, mix in zip(h, self.mix)]
        tt = t[:, None, None]
        v_nodes = [dec(hl) + (lin[0] + tt * lin[1]) * u
                   for dec, hl, lin, u in zip(self.dec, h, self.linear_nodes, nodes)]
        v_edges = [read + (lin[0] + t[:, None, None, None] * lin[1]) * kernels
                   for read, lin, kernels in zip(_edge_reads(self, h, e), self.linear_edges, edges)]
        B, n_out, shapes = x.shape[0], self.spec.n_classes, self.spec.layer_shapes
        weights = [v_nodes[0][..., :self.n_first].reshape(B, *shapes[0]),
                   *(v.reshape(B, *s) for v, s in zip(v_edges, shapes[1:-1])),
                   v_nodes[-1][..., -n_out:].transpose(1, 2)]
        biases = [v[..., self.n_first if h_ == 0 else 0] for h_, v in enumerate(v_nodes)]
        return self.spec.pack(weights, biases + [self.head(_summary(h, b_out, tf))])

    @staticmethod
    def _attend(h: Tensor, layers: nn.ModuleList) -> Tensor:
        for layer in layers:
            h = layer(h)
        return h

    def zero_(self) -> "ChannelField":
        """Zero every decoder's output layer and the linear terms, in place: the field is zero everywhere."""
        for last in [*(d[-1] for d in self.dec), *(d[-1] for d in self.edge_dec), self.head[-1]]:
            nn.init.zeros_(last.weight)
            nn.init.zeros_(last.bias)
        for p in [*self.linear_nodes, *self.linear_edges]:
            nn.init.zeros_(p)
        return self

    def with_spec(self, spec: CNNSpec) -> "ChannelField":
        """The same trained module on CNNs with other hidden channel counts (same depth, input channels,
        kernel size and classes): no parameter depends on a hidden width.

        An anchored field can only widen: its anchor is widened by repeating its channels
        (:func:`~wsbook.nets.repeat_units`), so that every channel of the wider network is read beside an anchor
        channel the field knows, each copy with outgoing weights sized for the old width (divide every layer
        that reads hidden channels by the width ratio to read their sums as averages)."""
        check_other_widths(self.spec, spec, "ChannelField.with_spec")
        if spec == self.spec:
            return self
        state = self.state_dict()
        if self.anchored:
            if any(w < c for w, c in zip(spec.channels, self.spec.channels)):
                raise ValueError(f"ChannelField.with_spec: an anchored field of {self.spec.channels} channels can "
                                 f"widen its anchor (by repeating its channels) but not narrow it to {spec.channels}")
            state["anchor"] = repeat_units(self.spec, self.anchor, spec)
        new = ChannelField(spec, **self.kwargs).to(self.time.weight)
        new.load_state_dict(state)
        return new


# registration (the WeightField protocol: a field of its own adds itself to FIELDS), so that
# field_from_config rebuilds a saved ChannelField
FIELDS[ChannelField.kind] = ChannelField

__all__ = ["ChannelField"]
