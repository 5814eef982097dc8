"""Vector fields over weights, all called as ``field(t, x)`` with ``x`` a population ``[B, D]`` in the spec's
flat weight layout and ``t`` a scalar or ``[B]``; they return one number per weight and bias ``[B, D]``.

* :func:`gnn_field` (:class:`GNNField`): the time-conditioned, equivariant weight-space GNN over the sparse
  neural graph (:class:`wsbook.graphs.WeightSpaceField`, Relational Transformer layers by default: at equal
  width it trains faster per step than PNA on the book's networks, ``benchmarks/bench_weightflow.py``).
  None of its parameters depends on the hidden widths, so :meth:`GNNField.with_spec` evaluates the same
  trained module on networks of another width.
* :class:`FlatField`: the plain baseline, an MLP on the flat vector and time features (no symmetry, one
  width only).
* :class:`NeuronField`: a DeepSets field over the hidden neurons of a one-hidden-layer MLP: one MLP reads
  each neuron's incoming weights, bias and outgoing weights whole, beside the mean over all neurons.
  Equivariant and width-agnostic like the GNN, with a flat MLP's reach on each neuron.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from wsbook.flows.models import TimeMLP, time_features
from wsbook.graphs import WeightSpaceField
from wsbook.nets import MLPSpec


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
        self.net = nn.Sequential(nn.Linear(17, dim), nn.SiLU(), nn.Linear(dim, n_layers))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, t: Tensor, x: Tensor, layer_of: Tensor) -> Tensor:
        c = self.net(time_features(t, 16, x.shape[0]).to(x))                          # [B, n_layers]
        return c[:, layer_of] * x


class _Anchored:
    """``set_anchor`` of the fields that can read an anchor network (``anchored=True``)."""

    @torch.no_grad()
    def set_anchor(self, anchor: Tensor) -> None:
        """Set the anchor network ``[D]`` or ``[1, D]`` (in the units the field reads)."""
        if not self.anchored:
            raise ValueError("set_anchor: this field was built with anchored=False")
        self.anchor.copy_(self.spec.check(anchor.reshape(1, -1), "anchor"))


class GNNField(_Anchored, nn.Module):
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

    def config(self) -> dict:
        return {"kind": "gnn", "widths": list(self.spec.widths), "activation": self.spec.activation, **self.kwargs}

    def with_spec(self, spec: MLPSpec) -> "GNNField":
        """The same trained module on networks of ``spec`` (another hidden width, same depth, inputs and
        outputs): every parameter is shared over nodes and edges, and the positional ids depend only on the
        input and output neurons and the roles of the hidden layers."""
        if len(spec.widths) != len(self.spec.widths) or spec.widths[0] != self.spec.widths[0] \
                or spec.widths[-1] != self.spec.widths[-1]:
            raise ValueError(f"gnn_field.with_spec: {spec} must keep the depth, inputs and outputs of {self.spec}")
        if self.anchored:
            if spec == self.spec:
                return self
            raise ValueError(f"gnn_field.with_spec: an anchored field reads an anchor network of {self.spec} and "
                             f"exists for that width only; train an unanchored gnn_field for width transfer to {spec}")
        return GNNField(spec, **self.kwargs, core=(self.net, self.skip)).to(self.layer_of.device)


class FlatField(TimeMLP):
    """The plain baseline ``field(t, x)``: an MLP on ``[x, time features]`` (:class:`wsbook.flows.TimeMLP`).
    It ignores the symmetries and exists for one width only.

    With ``diagonal=True`` the field adds a per-weight linear term ``(a + b t) * x`` (``a``, ``b`` learned,
    zero at the start). An MLP narrower than the weight vector (``hidden < D``) cannot represent a
    full-rank linear map of ``x``, so it cannot contract every weight by its own factor, which is what
    turns a broad source into a posterior whose constrained directions are narrow (breast cancer, reverse
    KL on the posterior: the term takes the reverse KL from about 254 to 159 nats in the same 3,000 steps,
    below mean-field VI's 184; :func:`wsbook.experiments.posterior_flows.posterior_flow_kl`).
    :meth:`with_diagonal` adds the term to a trained field.
    """

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

    def config(self) -> dict:
        return {"kind": "flat", "widths": list(self.spec.widths), "activation": self.spec.activation, **self.kwargs}

    def with_spec(self, spec: MLPSpec) -> "FlatField":
        if spec == self.spec:
            return self
        raise ValueError(f"FlatField: an MLP on flat weight vectors exists for one architecture ({self.spec}); "
                         f"it cannot read {spec}. Use gnn_field for width transfer")


class NeuronField(_Anchored, nn.Module):
    """``field(t, x)`` for networks with one hidden layer (``in-H-out``), whose hidden neurons are
    exchangeable and whose inputs and outputs are not. Neuron ``j`` is the vector
    ``u_j = [W1[j, :], b1[j], W2[:, j]]`` (``in + 1 + out`` numbers); a DeepSets model (Zaheer et al.,
    2017) maps the set of neurons to their velocities:

    ``h_j = enc(u_j)``, ``c = mean_j h_j``, ``v_j = dec(h_j + ctx(c, b2, t))``, ``v_b2 = head(c, b2, t)``,

    plus a per-coordinate linear term ``(a + b t) * u_j`` shared by all neurons (zero at the start). The
    field is equivariant to permutations of the hidden neurons, and no parameter depends on ``H``, so
    :meth:`with_spec` samples networks of another hidden width (the mean keeps the context's scale). With
    ``attention_layers > 0`` the neurons' encodings pass through self-attention layers without positions
    (a Set Transformer-style encoder, still equivariant), so that neurons can divide the work between
    them. Unlike the message-passing GNN, which sees each weight through small edge features, the encoder
    reads a neuron's input weights at once: on MNIST 784-10-10 it learns at CPU budgets where an unanchored
    GNN stays at chance, and it transfers to 784-32-10 (chapter 8, Table 7.4).

    Args:
        spec: an MLP with exactly one hidden layer and biases.
        hidden: width of the encoder, decoder, attention and context.
        depth: hidden layers of the decoder.
        attention_layers: self-attention layers among the neurons (0: plain DeepSets).
        heads: attention heads.
        anchored: every neuron is read beside the same neuron of an anchor network (as
            :class:`GNNField`'s ``anchored``; :meth:`WeightFlow.fit` sets the mean aligned training
            network): equivariant in the pair, for the anchor's width only.
    """

    def __init__(self, spec: MLPSpec, hidden: int = 256, depth: int = 2, attention_layers: int = 0, heads: int = 4,
                 anchored: bool = False):
        super().__init__()
        if not isinstance(spec, MLPSpec) or len(spec.widths) != 3 or not spec.bias:
            raise ValueError(f"NeuronField needs an MLPSpec with one hidden layer and biases (in-H-out); got {spec}")
        self.spec, self.anchored = spec, bool(anchored)
        self.kwargs = dict(hidden=hidden, depth=depth, attention_layers=attention_layers, heads=heads) | (
            {"anchored": True} if anchored else {})
        n_in, _, n_out = spec.widths
        size = n_in + 1 + n_out
        if self.anchored:
            self.register_buffer("anchor", torch.zeros(1, spec.n_params))
        self.enc = nn.Sequential(nn.Linear(size * (2 if anchored else 1), hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        # self-attention among the neurons (no positions: equivariant), so that neurons can divide the work;
        # they read the time through their encodings (without attention it enters through the context only)
        self.time = nn.Linear(17, hidden) if attention_layers else None
        self.mix = nn.ModuleList(nn.TransformerEncoderLayer(hidden, heads, 2 * hidden, dropout=0.0, activation="gelu",
                                                            batch_first=True, norm_first=True)
                                 for _ in range(attention_layers))
        self.ctx = nn.Sequential(nn.Linear(hidden + n_out + 17, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.SiLU(), nn.Linear(hidden, hidden)]
        self.dec = nn.Sequential(*layers, nn.SiLU(), nn.Linear(hidden, size))
        self.head = nn.Sequential(nn.Linear(hidden + n_out + 17, hidden), nn.SiLU(), nn.Linear(hidden, n_out))
        self.linear = nn.Parameter(torch.zeros(2, size))

    def forward(self, t: Tensor | float, x: Tensor) -> Tensor:
        x = self.spec.check(x, "x")
        t = _times(t, x)
        u, b2 = self._neurons(x)                                                     # [B, H, in + 1 + out]
        tf = time_features(t, 16, x.shape[0]).to(x)
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

    def _neurons(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Each hidden neuron's ``[W1[j, :], b1[j], W2[:, j]]`` as ``[B, H, in + 1 + out]``, and ``b2``."""
        (w1, w2), (b1, b2) = self.spec.weights(x), self.spec.biases(x)
        return torch.cat([w1, b1[..., None], w2.transpose(1, 2)], -1), b2

    def config(self) -> dict:
        return {"kind": "neuron", "widths": list(self.spec.widths), "activation": self.spec.activation,
                **self.kwargs}

    def with_spec(self, spec: MLPSpec) -> "NeuronField":
        """The same trained module on networks of another hidden width (same inputs and outputs)."""
        if not isinstance(spec, MLPSpec) or len(spec.widths) != 3 or spec.widths[0] != self.spec.widths[0] \
                or spec.widths[-1] != self.spec.widths[-1]:
            raise ValueError(f"NeuronField.with_spec: {spec} must keep the one hidden layer, inputs and outputs "
                             f"of {self.spec}")
        if self.anchored and spec != self.spec:
            raise ValueError(f"NeuronField.with_spec: an anchored field reads an anchor network of {self.spec} and "
                             f"exists for that width only")
        new = NeuronField(spec, **self.kwargs).to(self.linear)
        new.load_state_dict(self.state_dict())
        return new


def gnn_field(spec: MLPSpec, layer: str = "relational_transformer", dim: int = 32, n_layers: int = 3,
              heads: int = 1, attention: str = "neighbours", skip: bool = True, anchored: bool = False,
              global_context: bool = False) -> nn.Module:
    """The book's vector field over weights: ``field(t, x)``, an equivariant, time-conditioned GNN on the
    neural graph of ``spec`` (arguments as in :class:`GNNField`), with ``with_spec`` for width transfer
    (unanchored fields)."""
    return GNNField(spec, layer=layer, dim=dim, n_layers=n_layers, heads=heads, attention=attention, skip=skip,
                    anchored=anchored, global_context=global_context)


FIELDS = {"gnn": GNNField, "flat": FlatField, "neuron": NeuronField}


def field_from_config(cfg: dict) -> nn.Module:
    """Rebuild an (untrained) field from its ``config()``."""
    cfg = dict(cfg)
    kind = cfg.pop("kind")
    if kind not in FIELDS:
        raise ValueError(f"field_from_config: unknown field kind {kind!r}; expected one of {tuple(FIELDS)}")
    spec = MLPSpec(tuple(cfg.pop("widths")), cfg.pop("activation"))
    return FIELDS[kind](spec, **cfg)
