"""Vector fields over weights, all called as ``field(t, x)`` with ``x`` a population ``[B, D]`` in the spec's
flat weight layout and ``t`` a scalar or ``[B]``; they return one number per weight and bias ``[B, D]``.
Every one is a :class:`WeightField` (the protocol :class:`~wsbook.weightflow.WeightFlow` relies on to save,
transfer, anchor and zero a field). Which one to use:

* the neuron field (:class:`NeuronField`) is the first choice for MLPs of any depth: each node reads a whole
  hidden neuron, so a step is cheap and learns much; the results chapters' headline flows use it (chapters 8
  and 8b);
* :func:`gnn_field` is the general equivariant field over the neural graph, for architectures and widths the
  neuron fields do not cover, and for transfer between widths without an anchor;
* :class:`FlatField` is the baseline every table holds the others to.

* :func:`gnn_field` (:class:`GNNField`): the time-conditioned, equivariant weight-space GNN over the sparse
  neural graph (:class:`wsbook.graphs.WeightSpaceField`, Relational Transformer layers by default; the
  two layers' cost per step: ``benchmarks/bench_weightflow.py``).
  None of its parameters depends on the hidden widths, so :meth:`GNNField.with_spec` evaluates the same
  trained module on networks of another width.
* :class:`FlatField`: the plain baseline, an MLP on the flat vector and time features (no symmetry, one
  width only).
* :class:`NeuronField`: a field over the hidden neurons whose nodes read their input or output weights
  whole: with one hidden layer a DeepSets field over the set of neurons, with more a graph network whose
  edges are the weights between hidden layers. Equivariant and width-agnostic like the GNN, with a flat
  MLP's reach on each neuron.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from wsbook.flows.models import TimeMLP, time_features
from wsbook.graphs import WeightSpaceField
from wsbook.nets import MLPSpec, check_other_widths, repeat_units
from wsbook.weightflow.charts import spec_config, split_spec_config

#: Width of the fields' time embedding: ``t`` itself and ``TIME_FEATURES - 1`` sinusoids of it
#: (:func:`wsbook.flows.time_features`).
TIME_FEATURES = 17


def _times(t: Tensor | float, x: Tensor) -> Tensor:
    t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
    if t.dim() == 0:
        return t.expand(x.shape[0])
    if t.shape != (x.shape[0],):
        raise ValueError(f"t must be a scalar or [{x.shape[0]}]; got {tuple(t.shape)}")
    return t


class _Skip(nn.Module):
    """``c_l(t) x``: one learned function of time per linear layer ``l`` times the input (zero at start)."""

    def __init__(self, n_layers: int, dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(TIME_FEATURES, dim), nn.SiLU(), nn.Linear(dim, n_layers))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, t: Tensor, x: Tensor, layer_of: Tensor) -> Tensor:
        c = self.net(time_features(t, TIME_FEATURES - 1, x.shape[0]).to(x))             # [B, n_layers]
        return c[:, layer_of] * x


def _zero_last_linear(module: nn.Module) -> None:
    last = [m for m in module.modules() if isinstance(m, nn.Linear)][-1]
    nn.init.zeros_(last.weight)
    nn.init.zeros_(last.bias)


class WeightField(nn.Module):
    """The protocol of a vector field over the weights of networks of ``spec``.

    A subclass sets ``kind`` (its name in :data:`FIELDS`), ``spec``, ``kwargs`` (the constructor's arguments
    besides the spec, so that :meth:`config` rebuilds it) and ``anchored``, and implements ``forward(t, x)``
    and :meth:`zero_`. :class:`~wsbook.weightflow.WeightFlow` checks the spec against its chart's, sets the
    anchor of an anchored field before training, saves the field by :meth:`config` and moves it to other
    widths by :meth:`with_spec`. A field of your own subclasses this and adds itself to :data:`FIELDS`.
    """

    kind: str = "field"
    spec: MLPSpec
    kwargs: dict
    anchored: bool = False

    def config(self) -> dict:
        """Everything :func:`field_from_config` needs to rebuild the untrained field (the architecture as
        :func:`~wsbook.weightflow.charts.spec_config` writes it: an MLP's or a CNN's)."""
        return {"kind": self.kind, **spec_config(self.spec), **self.kwargs}

    def with_spec(self, spec: MLPSpec) -> "WeightField":
        """The same trained field on networks of ``spec`` (itself when ``spec`` is its own)."""
        if spec == self.spec:
            return self
        raise ValueError(f"{type(self).__name__} exists for one architecture ({self.spec}); it cannot read {spec}")

    def zero_(self) -> "WeightField":
        """Make the field zero everywhere, in place (a flow then starts as its source; training corrects it)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement zero_")

    @torch.no_grad()
    def set_anchor(self, anchor: Tensor) -> None:
        """Set the anchor network ``[D]`` or ``[1, D]`` (in the units the field reads)."""
        if not self.anchored:
            raise ValueError("set_anchor: this field was built with anchored=False")
        self.anchor.copy_(self.spec.check(anchor.reshape(1, -1), "anchor"))


class GNNField(WeightField):
    """``field(t, x)``: the weight-space GNN :class:`wsbook.graphs.WeightSpaceField` (equivariant head,
    time on every node and edge) on networks of ``spec``, plus an optional skip term.

    Args:
        spec: the architecture whose neural graph the GNN reads.
        layer: ``"relational_transformer"`` (default) or ``"pna"``.
        dim: width of node and edge features.
        n_layers: message-passing layers.
        heads: attention heads (Relational Transformer).
        attention: ``"neighbours"`` (the sparse neural graph) or ``"all"`` (dense all-pairs attention, the
            reference code's design; only for benchmarks).
        skip: add ``c_l(t) x`` to the output, one learned function of time per linear layer ``l`` (a
            preconditioning in the spirit of Karras et al. 2022's ``c_skip``; equivariant and width-agnostic).
            Many fields over weights are close to a time-dependent rescaling of their input, which a GNN
            whose edge features pass through layer norms represents only approximately.
        anchored: read an anchor network (:meth:`set_anchor`; :meth:`WeightFlow.fit` sets the mean of the
            aligned training networks) beside ``x`` as a second channel of every node and edge. In an
            aligned chart every hidden neuron has an identity (the reference neuron it was matched to);
            a purely equivariant field cannot see it and must learn the permutation-symmetrized target,
            breaking the symmetry from the noise alone. The anchor's neuron tells the field which neuron
            it is looking at, while the field stays equivariant in the pair (x, anchor). An anchored
            field exists for the width of its anchor (no :meth:`with_spec` to another width).
        global_context: every layer also reads the mean node and edge feature of its network (a virtual
            node, :class:`~wsbook.graphs.WeightSpaceGNN`): a global summary such as how far the whole
            network is trained, which local message passing can only average from many local guesses.
        core: an existing trained :class:`WeightSpaceField` and skip to share (used by :meth:`with_spec`).
    """

    kind = "gnn"

    def __init__(self, spec: MLPSpec, layer: str = "relational_transformer", dim: int = 32, n_layers: int = 3,
                 heads: int = 1, attention: str = "neighbours", skip: bool = True, anchored: bool = False,
                 global_context: bool = False, *, core: tuple[WeightSpaceField, nn.Module | None] | None = None):
        super().__init__()
        if not isinstance(spec, MLPSpec):
            raise TypeError(f"gnn_field needs an MLPSpec; got {type(spec).__name__}")
        self.spec, self.anchored = spec, bool(anchored)
        self.kwargs = dict(layer=layer, dim=dim, n_layers=n_layers, heads=heads, attention=attention, skip=skip,
                           anchored=self.anchored, global_context=bool(global_context))
        if core is None:
            core = (WeightSpaceField(spec, layer, dim=dim, n_layers=n_layers, attention=attention, heads=heads,
                                     channels=2 if anchored else 1, global_context=global_context),
                    _Skip(spec.n_layers, dim) if skip else None)
        self.net, self.skip = core
        if self.anchored:       # in the units the field reads (WeightFlow divides by its per-layer scale)
            self.register_buffer("anchor", torch.zeros(1, spec.n_params))
        idx = torch.empty(spec.n_params, dtype=torch.long)
        for layer_k in range(spec.n_layers):
            w, b = spec.slices(layer_k)
            idx[w.start:(b.stop if b is not None else w.stop)] = layer_k
        self.register_buffer("layer_of", idx, persistent=False)   # [D]: the linear layer of every coordinate

    def forward(self, t: Tensor | float, x: Tensor) -> Tensor:
        x = self.spec.check(x, "x")
        t = _times(t, x)
        out = self.net(t, x, spec=self.spec, context=self.anchor if self.anchored else None)
        if self.skip is not None:
            out = out + self.skip(t, x, self.layer_of)
        return out

    def zero_(self) -> "GNNField":
        """Zero the node and edge read-outs and the skip term, in place: the field is zero everywhere."""
        for head in (self.net.gnn.node_head, self.net.gnn.edge_head, *([self.skip.net] if self.skip else [])):
            _zero_last_linear(head)
        return self

    def with_spec(self, spec: MLPSpec) -> "GNNField":
        """The same trained module on networks of ``spec`` (another hidden width, same depth, inputs and
        outputs): every parameter is shared over nodes and edges, and the positional ids depend only on the
        input and output neurons and the roles of the hidden layers."""
        check_other_widths(self.spec, spec, "gnn_field.with_spec")
        if spec == self.spec:
            return self
        if self.anchored:
            raise ValueError(f"gnn_field.with_spec: an anchored field reads an anchor network of {self.spec} and "
                             f"exists for that width only; train an unanchored gnn_field for width transfer to {spec}")
        return GNNField(spec, **self.kwargs, core=(self.net, self.skip)).to(self.layer_of.device)


class FlatField(TimeMLP, WeightField):
    """The plain baseline ``field(t, x)``: an MLP on ``[x, time features]`` (:class:`wsbook.flows.TimeMLP`).
    It ignores the symmetries and exists for one width only. ``spec`` is an MLP's or a CNN's: the field
    reads the flat (aligned) weight vector either way.

    With ``diagonal=True`` the field adds a per-weight linear term ``(a + b t) * x`` (``a``, ``b`` learned,
    zero at the start). An MLP narrower than the weight vector (``hidden < D``) cannot represent a
    full-rank linear map of ``x``, so it cannot contract every weight by its own factor, which is what
    turns a broad source into a posterior whose constrained directions are narrow. Chapter 8c trains its
    reverse-KL posterior flow with the term (:func:`wsbook.experiments.posterior_flows.train_posterior_flow`)
    and compares it with mean-field VI. :meth:`with_diagonal` adds the term to a trained field.
    """

    kind = "flat"

    def __init__(self, spec: MLPSpec, hidden: int = 256, depth: int = 3, diagonal: bool = False):
        super().__init__(spec.n_params, hidden=hidden, depth=depth)
        self.spec = spec
        self.kwargs = dict(hidden=hidden, depth=depth) | ({"diagonal": True} if diagonal else {})
        self.diagonal = nn.Parameter(torch.zeros(2, spec.n_params)) if diagonal else None

    def forward(self, t: Tensor, x: Tensor) -> Tensor:
        out = super().forward(t, x)
        if self.diagonal is None:
            return out
        return out + (self.diagonal[0] + _times(t, x)[:, None] * self.diagonal[1]) * x

    def with_diagonal(self) -> "FlatField":
        """This field with a per-weight linear term added, zero at first (the same function as this one)."""
        new = FlatField(self.spec, **{**self.kwargs, "diagonal": True}).to(next(self.parameters()))
        new.load_state_dict({k: v for k, v in self.state_dict().items() if k != "diagonal"}, strict=False)
        return new

    def zero_(self) -> "FlatField":
        """Zero the output layer (and the per-weight term, if any), in place: the field is then zero
        everywhere, so a flow starts as its source (e.g. a variational fit) and training only corrects it."""
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)
        if self.diagonal is not None:
            nn.init.zeros_(self.diagonal)
        return self

    def with_spec(self, spec: MLPSpec) -> "FlatField":
        if spec == self.spec:
            return self
        raise ValueError(f"FlatField: an MLP on flat weight vectors exists for one architecture ({self.spec}); "
                         f"it cannot read {spec}. Use gnn_field for width transfer")


def _mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.SiLU(), nn.Linear(hidden, n_out))


# The message passing of the fields whose nodes are hidden units and whose edges are the weights between two
# hidden layers (NeuronField over neurons, ChannelField over a CNN's channels, whose edges are kernels).
def _build_rounds(field: nn.Module, n_hidden: int, hidden: int, edge_dim: int, rounds: int, summary: int) -> None:
    """Per round and per pair of consecutive hidden layers the edge message and its end-node projections
    (``msg``, ``dst``, ``src``, ``down``, ``up``), and per round the context and node updates."""
    def per_edge_set(make):
        return nn.ModuleList(make() for _ in range(n_hidden - 1))

    def per_round(make):
        return nn.ModuleList(make() for _ in range(rounds))

    field.msg = per_round(lambda: per_edge_set(lambda: _mlp(edge_dim, edge_dim, edge_dim)))
    field.dst = per_round(lambda: per_edge_set(lambda: nn.Linear(hidden, edge_dim)))
    field.src = per_round(lambda: per_edge_set(lambda: nn.Linear(hidden, edge_dim)))
    field.down = per_round(lambda: per_edge_set(lambda: nn.Linear(edge_dim, hidden)))
    field.up = per_round(lambda: per_edge_set(lambda: nn.Linear(edge_dim, hidden)))
    field.ctx = per_round(lambda: _mlp(summary, hidden, n_hidden * hidden))
    field.norm = per_round(lambda: nn.ModuleList(nn.LayerNorm(hidden) for _ in range(n_hidden)))
    field.node = per_round(lambda: nn.ModuleList(_mlp(hidden, hidden, hidden) for _ in range(n_hidden)))


def _build_edge_readout(field: nn.Module, n_hidden: int, hidden: int, edge_dim: int, edge_out: int) -> None:
    """The decoders of the edges from their features and their two end nodes (``edge_out`` numbers each)."""
    field.edge_dst = nn.ModuleList(nn.Linear(hidden, edge_dim) for _ in range(n_hidden - 1))
    field.edge_src = nn.ModuleList(nn.Linear(hidden, edge_dim) for _ in range(n_hidden - 1))
    field.edge_dec = nn.ModuleList(_mlp(edge_dim, edge_dim, edge_out) for _ in range(n_hidden - 1))


def _summary(h: list[Tensor], b_out: Tensor, tf: Tensor) -> Tensor:
    """The virtual node: every hidden layer's mean node, the output bias and the time features."""
    return torch.cat([hl.mean(1) for hl in h] + [b_out, tf], -1)


def _message_rounds(field: nn.Module, h: list[Tensor], e: list[Tensor], b_out: Tensor,
                    tf: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """The rounds of :func:`_build_rounds` on node features ``h`` (``[B, width, hidden]`` per layer) and edge
    features ``e`` (``[B, width_next, width, edge_dim]`` per pair of layers)."""
    for r in range(len(field.msg)):
        for k in range(len(e)):                                     # edges from layer k to layer k + 1
            m = field.msg[r][k](e[k] + field.dst[r][k](h[k + 1])[:, :, None] + field.src[r][k](h[k])[:, None])
            e[k] = e[k] + m
            h[k + 1] = h[k + 1] + field.down[r][k](m.mean(2))
            h[k] = h[k] + field.up[r][k](m.mean(1))
        g = field.ctx[r](_summary(h, b_out, tf)).chunk(len(h), -1)
        h = [hl + node(norm(hl + gl[:, None])) for hl, gl, node, norm in zip(h, g, field.node[r], field.norm[r])]
    return h, e


def _edge_reads(field: nn.Module, h: list[Tensor], e: list[Tensor]) -> list[Tensor]:
    """Every edge's decoded velocity ``[B, width_next, width, edge_out]`` (before the linear term)."""
    return [field.edge_dec[k](e[k] + field.edge_dst[k](h[k + 1])[:, :, None] + field.edge_src[k](h[k])[:, None])
            for k in range(len(e))]


class NeuronField(WeightField):
    """``field(t, x)`` for MLPs with biases, of any depth: every hidden neuron is a node that reads its
    fixed-order weights whole; the field is equivariant to permutations of every hidden layer.

    The input and output neurons of an MLP are not exchangeable, so the weights that touch them belong to a
    hidden neuron in a fixed order: a first-hidden-layer neuron ``j`` reads ``[W1[j, :], b1[j]]`` (all its
    input weights at once), a last-hidden-layer neuron ``[b_L[j], W_out[:, j]]``, a neuron in between its
    bias. Unlike the message-passing GNN (:func:`gnn_field`), which sees each weight through a small edge
    feature and sums over hundreds of input edges, a node here reads its input weights as one vector.

    * **One hidden layer** (``in-H-out``): neuron ``j`` is ``u_j = [W1[j, :], b1[j], W2[:, j]]`` and the
      neurons form a set. A DeepSets model (Zaheer et al., 2017) gives ``h_j = enc(u_j)``,
      ``c = mean_j h_j``, ``v_j = dec(h_j + ctx(c, b2, t))``, ``v_b2 = head(c, b2, t)``. With
      ``attention_layers > 0`` the encodings pass through self-attention among the neurons without positions
      (a Set Transformer-style encoder, still equivariant), so that neurons can divide the work.
    * **Two or more hidden layers**: the weights between two hidden layers are indexed by exchangeable
      neurons on both sides; they are the edges of a graph over the hidden neurons, each with a feature of
      its own. ``rounds`` message-passing rounds update every edge from its two end nodes
      (``e += mlp(e + P h_dst + Q h_src)``), every node from the mean of its incoming and outgoing edges'
      messages, and every node from a context that reads the mean node of every hidden layer, the output
      bias and the time (a virtual node: how far a network has trained is a property of the whole network).
      Decoders give each node's weights and bias their velocity, each edge its weight's, and the context the
      output bias's.

    Either way a per-coordinate linear term ``(a + b t) x``, shared by the neurons of a layer, starts at
    zero, and no parameter depends on a hidden width, so :meth:`with_spec` samples networks of other hidden
    widths. Chapter 8 compares the field with the message-passing GNN on breast cancer; Chapter 8b on MNIST
    784-10-10 (and its transfer to 784-32-10).

    Args:
        spec: an MLP with at least one hidden layer and biases.
        hidden: width of the node features, encoders and decoders (default 256 for one hidden layer, 128 for
            more).
        depth: hidden layers of the node decoder (one hidden layer only; default 2).
        attention_layers: self-attention layers among the neurons (one hidden layer only; default 0: plain
            DeepSets).
        heads: attention heads (one hidden layer only; default 4).
        edge_dim: width of the edge features (two or more hidden layers; default 32).
        rounds: message-passing rounds (two or more hidden layers; default 2).
        anchored: every neuron (and edge) is read beside the same neuron of an anchor network (as
            :class:`GNNField`'s ``anchored``; :meth:`WeightFlow.fit` sets the mean aligned training
            network): equivariant in the pair. With one hidden layer :meth:`with_spec` widens the anchor by
            repeating its neurons; with more an anchored field exists for the anchor's widths only.
    """

    kind = "neuron"
    #: the arguments that shape the field for one hidden layer, and for two or more, with their defaults
    SET_ARGS = dict(hidden=256, depth=2, attention_layers=0, heads=4)
    GRAPH_ARGS = dict(hidden=128, edge_dim=32, rounds=2)

    def __init__(self, spec: MLPSpec, hidden: int | None = None, *, depth: int | None = None,
                 attention_layers: int | None = None, heads: int | None = None, edge_dim: int | None = None,
                 rounds: int | None = None, anchored: bool = False):
        super().__init__()
        if not isinstance(spec, MLPSpec) or len(spec.widths) < 3 or not spec.bias:
            raise ValueError(f"NeuronField needs an MLPSpec with at least one hidden layer and biases; got {spec}")
        given = dict(hidden=hidden, depth=depth, attention_layers=attention_layers, heads=heads,
                     edge_dim=edge_dim, rounds=rounds)
        defaults = self.SET_ARGS if len(spec.widths) == 3 else self.GRAPH_ARGS
        stray = sorted(k for k, v in given.items() if v is not None and k not in defaults)
        if stray:
            raise ValueError(f"NeuronField on {spec}: {', '.join(stray)} shape(s) the field for "
                             f"{'two or more hidden layers' if len(spec.widths) == 3 else 'one hidden layer'} "
                             f"only; this spec takes {', '.join(defaults)}")
        args = {k: defaults[k] if given[k] is None else given[k] for k in defaults}
        least = {"attention_layers": 0, "depth": 0}
        if not all(isinstance(v, int) and v >= least.get(k, 1) for k, v in args.items()):
            raise ValueError(f"NeuronField: {', '.join(args)} must be positive integers (attention_layers and depth "
                             f"may be 0); got {args}")
        self.spec, self.anchored = spec, bool(anchored)
        self.kwargs = args | ({"anchored": True} if anchored else {})
        if self.anchored:
            self.register_buffer("anchor", torch.zeros(1, spec.n_params))
        if len(spec.widths) == 3:
            self._build_set(**args)
        else:
            self._build_graph(**args)

    @property
    def is_set(self) -> bool:
        """Whether the spec has one hidden layer (the neurons form a set; no edges)."""
        return len(self.spec.widths) == 3

    # ---- one hidden layer: a set of neurons -------------------------------------------------------------
    def _build_set(self, hidden: int, depth: int, attention_layers: int, heads: int) -> None:
        n_in, _, n_out = self.spec.widths
        size = n_in + 1 + n_out
        # modules in this order: it fixes their initialisation from the global generator
        self.enc = nn.Sequential(nn.Linear(size * (2 if self.anchored else 1), hidden), nn.SiLU(),
                                 nn.Linear(hidden, hidden))
        # without attention the time enters through the context only
        self.time = nn.Linear(TIME_FEATURES, hidden) if attention_layers else None
        self.mix = nn.ModuleList(nn.TransformerEncoderLayer(hidden, heads, 2 * hidden, dropout=0.0, activation="gelu",
                                                            batch_first=True, norm_first=True)
                                 for _ in range(attention_layers))
        self.ctx = nn.Sequential(nn.Linear(hidden + n_out + TIME_FEATURES, hidden), nn.SiLU(),
                                 nn.Linear(hidden, hidden))
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.SiLU(), nn.Linear(hidden, hidden)]
        self.dec = nn.Sequential(*layers, nn.SiLU(), nn.Linear(hidden, size))
        self.head = nn.Sequential(nn.Linear(hidden + n_out + TIME_FEATURES, hidden), nn.SiLU(),
                                  nn.Linear(hidden, n_out))
        self.linear = nn.Parameter(torch.zeros(2, size))

    def _neurons(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """One hidden layer: each neuron's ``[W1[j, :], b1[j], W2[:, j]]`` as ``[B, H, in + 1 + out]``, and
        ``b2``."""
        (w1, w2), (b1, b2) = self.spec.weights(x), self.spec.biases(x)
        return torch.cat([w1, b1[..., None], w2.transpose(1, 2)], -1), b2

    def _forward_set(self, t: Tensor, x: Tensor, tf: Tensor) -> Tensor:
        u, b2 = self._neurons(x)                                                     # [B, H, in + 1 + out]
        h = self.enc(torch.cat([u, self._neurons(self.anchor)[0].expand_as(u)], -1) if self.anchored else u)
        if self.time is not None:
            h = h + self.time(tf)[:, None]
            for layer in self.mix:
                h = layer(h)
        summary = torch.cat([h.mean(1), b2, tf], -1)
        v = self.dec(h + self.ctx(summary)[:, None]) + (self.linear[0] + t[:, None, None] * self.linear[1]) * u
        n_in = self.spec.widths[0]
        vw1, vb1, vw2 = v[..., :n_in], v[..., n_in], v[..., n_in + 1:]
        return self.spec.pack([vw1, vw2.transpose(1, 2)], [vb1, self.head(summary)])

    # ---- two or more hidden layers: a graph over the hidden neurons ---------------------------------------
    def _build_graph(self, hidden: int, edge_dim: int, rounds: int) -> None:
        n_in, n_out, n_hidden = self.spec.widths[0], self.spec.widths[-1], len(self.spec.widths) - 2
        sizes = [1 + (n_in if l == 0 else 0) + (n_out if l == n_hidden - 1 else 0) for l in range(n_hidden)]
        c = 2 if self.anchored else 1
        summary = n_hidden * hidden + n_out + TIME_FEATURES
        # modules in this order: it fixes their initialisation from the global generator
        self.enc = nn.ModuleList(_mlp(c * k, hidden, hidden) for k in sizes)
        self.edge_enc = nn.ModuleList(_mlp(c, edge_dim, edge_dim) for _ in range(n_hidden - 1))
        self.time = nn.Linear(TIME_FEATURES, hidden)
        _build_rounds(self, n_hidden, hidden, edge_dim, rounds, summary)
        self.dec = nn.ModuleList(nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, k))
                                 for k in sizes)
        _build_edge_readout(self, n_hidden, hidden, edge_dim, 1)
        self.head = _mlp(summary, hidden, n_out)
        self.linear_nodes = nn.ParameterList(nn.Parameter(torch.zeros(2, k)) for k in sizes)
        self.linear_edges = nn.Parameter(torch.zeros(2, n_hidden - 1))

    def _parts(self, x: Tensor) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """Two or more hidden layers: per hidden layer its nodes' fixed-order vectors ``[B, width, size]``, per
        pair of consecutive hidden layers the weights between them ``[B, width_next, width]``, and the output
        bias ``[B, out]``."""
        ws, bs = self.spec.weights(x), self.spec.biases(x)
        n_hidden = len(self.spec.widths) - 2
        nodes = []
        for l in range(n_hidden):
            parts = ([ws[0]] if l == 0 else []) + [bs[l][..., None]] + (
                [ws[-1].transpose(1, 2)] if l == n_hidden - 1 else [])
            nodes.append(torch.cat(parts, -1))
        return nodes, list(ws[1:-1]), bs[-1]

    def _forward_graph(self, t: Tensor, x: Tensor, tf: Tensor) -> Tensor:
        nodes, edges, b_out = self._parts(x)
        if self.anchored:
            a_nodes, a_edges, _ = self._parts(self.anchor)
            node_in = [torch.cat([u, a.expand_as(u)], -1) for u, a in zip(nodes, a_nodes)]
            edge_in = [torch.stack([e, a.expand_as(e)], -1) for e, a in zip(edges, a_edges)]
        else:
            node_in, edge_in = nodes, [e[..., None] for e in edges]
        h = [enc(u) + self.time(tf)[:, None] for enc, u in zip(self.enc, node_in)]
        e = [enc(u) for enc, u in zip(self.edge_enc, edge_in)]          # [B, width_next, width, edge_dim]
        h, e = _message_rounds(self, h, e, b_out, tf)
        tt = t[:, None, None]
        v_nodes = [dec(hl) + (lin[0] + tt * lin[1]) * u
                   for dec, hl, lin, u in zip(self.dec, h, self.linear_nodes, nodes)]
        v_edges = [read[..., 0] + (self.linear_edges[0, k] + tt * self.linear_edges[1, k]) * edges[k]
                   for k, read in enumerate(_edge_reads(self, h, e))]
        n_in, n_out = self.spec.widths[0], self.spec.widths[-1]
        weights = [v_nodes[0][..., :n_in], *v_edges, v_nodes[-1][..., -n_out:].transpose(1, 2)]
        biases = [v[..., n_in if l == 0 else 0] for l, v in enumerate(v_nodes)]
        b_head = self.head(_summary(h, b_out, tf))
        return self.spec.pack(weights, biases + [b_head])

    def forward(self, t: Tensor | float, x: Tensor) -> Tensor:
        x = self.spec.check(x, "x")
        t = _times(t, x)
        tf = time_features(t, TIME_FEATURES - 1, x.shape[0]).to(x)
        return self._forward_set(t, x, tf) if self.is_set else self._forward_graph(t, x, tf)

    def zero_(self) -> "NeuronField":
        """Zero every decoder's output layer and the linear terms, in place: the field is then zero everywhere
        (as :meth:`FlatField.zero_`), so a flow starts as its source and training only corrects it."""
        if self.is_set:
            lasts, linear = [self.dec[-1], self.head[-1]], [self.linear]
        else:
            lasts = [*(d[-1] for d in self.dec), *(d[-1] for d in self.edge_dec), self.head[-1]]
            linear = [*self.linear_nodes, self.linear_edges]
        for last in lasts:
            nn.init.zeros_(last.weight)
            nn.init.zeros_(last.bias)
        for p in linear:
            nn.init.zeros_(p)
        return self

    def with_spec(self, spec: MLPSpec) -> "NeuronField":
        """The same trained module on networks of other hidden widths (same depth, inputs and outputs).

        An anchored field with one hidden layer can only widen: its anchor is widened by repeating its neurons
        (neuron ``j`` of the new anchor is neuron ``j mod H`` of the old one), so every hidden neuron of the
        wider network is read beside an anchor neuron the field knows, and the copies of one anchor neuron are
        separate draws of that kind of neuron. Each of them gets outgoing weights sized for the old width, so
        the logits of a network ``k`` times wider are about ``k`` times larger (scale its outgoing weights by
        the width ratio to read them as an average). An anchored field over two or more hidden layers exists
        for its anchor's widths only."""
        check_other_widths(self.spec, spec, "NeuronField.with_spec")
        if spec == self.spec:
            return self
        state = self.state_dict()
        if self.anchored and not self.is_set:
            raise ValueError(f"NeuronField.with_spec: an anchored field reads an anchor network of {self.spec} "
                             f"and, with two or more hidden layers, exists for those widths only")
        if self.anchored:
            h, wide = self.spec.widths[1], spec.widths[1]
            if wide < h:
                raise ValueError(f"NeuronField.with_spec: an anchored field of width {h} can widen its anchor (by "
                                 f"repeating its neurons) but not narrow it to {wide}")
            state["anchor"] = repeat_units(self.spec, self.anchor, spec)
        new = NeuronField(spec, **self.kwargs).to(self.head[-1].weight)
        new.load_state_dict(state)
        return new


def gnn_field(spec: MLPSpec, layer: str = "relational_transformer", dim: int = 32, n_layers: int = 3,
              heads: int = 1, attention: str = "neighbours", skip: bool = True, anchored: bool = False,
              global_context: bool = False) -> GNNField:
    """The equivariant message-passing field: ``field(t, x)``, a time-conditioned GNN on the neural graph of
    ``spec`` (arguments as in :class:`GNNField`), with ``with_spec`` for width transfer (unanchored fields).
    For MLPs the neuron fields are cheaper per step (see the module docstring)."""
    return GNNField(spec, layer=layer, dim=dim, n_layers=n_layers, heads=heads, attention=attention, skip=skip,
                    anchored=anchored, global_context=global_context)


#: every field class by its ``kind`` (what :func:`field_from_config` rebuilds from a saved config)
FIELDS = {"gnn": GNNField, "flat": FlatField, "neuron": NeuronField}
#: kinds that older saved flows carry, and the field that reads them now
FIELD_ALIASES = {"neuron_graph": "neuron"}


def field_from_config(cfg: dict) -> WeightField:
    """Rebuild an (untrained) field from its ``config()``."""
    cfg = dict(cfg)
    kind = cfg.pop("kind")
    kind = FIELD_ALIASES.get(kind, kind)
    if kind not in FIELDS:
        raise ValueError(f"field_from_config: unknown field kind {kind!r}; expected one of {tuple(FIELDS)}")
    spec, cfg = split_spec_config(cfg)
    return FIELDS[kind](spec, **cfg)
