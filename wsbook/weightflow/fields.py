"""Vector fields over weights, all called as ``field(t, x)`` with ``x`` a population ``[B, D]`` in the spec's
flat weight layout and ``t`` a scalar or ``[B]``; they return one number per weight and bias ``[B, D]``.

* :func:`gnn_field` (the adapter class ``_GNNField``): a time-conditioned, equivariant weight-space GNN over the sparse neural graph
  (:class:`wsbook.graphs.WeightSpaceGNN`, Relational Transformer layers by default: at equal width it
  trains about 2.5 times faster per step than PNA on the book's networks, ``benchmarks/bench_weightflow.py``).
  Its parameters do not depend on the hidden widths, so its ``with_spec`` evaluates the same
  trained weights on networks of another width.
* :class:`FlatField`: the plain baseline, an MLP on the flat vector and time features (no symmetry, one
  width only).

``_GNNField`` is the one place that adapts today's ``WeightSpaceGNN`` call ``model(theta, t)`` (with its
per-architecture buffers) to the book's ``field(t, x)`` convention; when ``wsbook.graphs`` provides a
width-agnostic ``field(t, x)`` GNN, only this class changes.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from wsbook.flows.models import TimeMLP, time_features
from wsbook.graphs import WeightSpaceGNN
from wsbook.nets import MLPSpec

#: buffers of WeightSpaceGNN that belong to one architecture's graph (rebuilt, not copied, by with_spec)
_GRAPH_BUFFERS = ("edge_scale", "node_scale", "avg_deg_lin", "avg_deg_log")


def _times(t: Tensor | float, x: Tensor) -> Tensor:
    t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
    if t.dim() == 0:
        return t.expand(x.shape[0])
    if t.shape != (x.shape[0],):
        raise ValueError(f"t must be a scalar or [{x.shape[0]}]; got {tuple(t.shape)}")
    return t


class _SmoothTime(nn.Module):
    """``t [B] -> [B, dim]``: an MLP on ``[t, cos(2 pi k t), sin(2 pi k t)]_{k=1..8}`` (:func:`time_features`)."""

    def __init__(self, dim: int, n: int = 16):
        super().__init__()
        self.n = n
        self.net = nn.Sequential(nn.Linear(n + 1, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: Tensor) -> Tensor:
        return self.net(time_features(t, self.n, t.shape[0]).to(self.net[0].weight))


class _GNNField(nn.Module):
    """``field(t, x)``: a weight-space GNN with an equivariant head, conditioned on ``t`` on every layer.

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
    """

    def __init__(self, spec: MLPSpec, layer: str = "relational_transformer", dim: int = 32, n_layers: int = 3,
                 heads: int = 1, attention: str = "neighbours", skip: bool = True):
        super().__init__()
        if not isinstance(spec, MLPSpec):
            raise TypeError(f"gnn_field needs an MLPSpec; got {type(spec).__name__}")
        self.spec = spec
        self.kwargs = dict(layer=layer, dim=dim, n_layers=n_layers, heads=heads, attention=attention, skip=skip)
        self.net = WeightSpaceGNN(spec, layer, dim=dim, n_layers=n_layers, head="equivariant", time=True,
                                  attention=attention, heads=heads)
        # WeightSpaceGNN's FourierTime uses frequencies up to 2 pi 2^7, far too fast for a field that varies
        # smoothly in t; the adapter gives it the flows' low-frequency features (k = 1..8) instead.
        self.net.time = _SmoothTime(dim)
        self.skip = None
        if skip:
            self.skip = nn.Sequential(nn.Linear(17, dim), nn.SiLU(), nn.Linear(dim, spec.n_layers))
            nn.init.zeros_(self.skip[-1].weight)
            nn.init.zeros_(self.skip[-1].bias)
        self._layer_of = None

    def _layer_index(self, device: torch.device) -> Tensor:
        """``[D]``: the linear layer each coordinate of the flat layout belongs to."""
        if self._layer_of is None or self._layer_of.device != device:
            idx = torch.empty(self.spec.n_params, dtype=torch.long)
            for layer in range(self.spec.n_layers):
                w, b = self.spec.slices(layer)
                idx[w.start:(b.stop if b is not None else w.stop)] = layer
            self._layer_of = idx.to(device)
        return self._layer_of

    def forward(self, t: Tensor | float, x: Tensor) -> Tensor:
        x = self.spec.check(x, "x")
        t = _times(t, x)
        out = self.net(x, t)
        if self.skip is not None:
            c = self.skip(time_features(t, 16, x.shape[0]).to(x))                  # [B, n_layers]
            out = out + c[:, self._layer_index(x.device)] * x
        return out

    def config(self) -> dict:
        return {"kind": "gnn", "widths": list(self.spec.widths), "activation": self.spec.activation, **self.kwargs}

    def with_spec(self, spec: MLPSpec) -> "_GNNField":
        """The same trained weights on the neural graph of ``spec`` (another hidden width, same depth, inputs
        and outputs): every parameter is shared over nodes and edges, and the positional ids depend only on
        the input and output neurons and the number of hidden layers."""
        if len(spec.widths) != len(self.spec.widths) or spec.widths[0] != self.spec.widths[0] \
                or spec.widths[-1] != self.spec.widths[-1]:
            raise ValueError(f"gnn_field.with_spec: {spec} must keep the depth, inputs and outputs of {self.spec}")
        new = _GNNField(spec, **self.kwargs).to(next(self.parameters()).device)
        own = new.state_dict()
        state = {k: (own[k] if k.rsplit(".", 1)[-1] in _GRAPH_BUFFERS else v) for k, v in self.state_dict().items()}
        new.load_state_dict(state)
        return new


class FlatField(TimeMLP):
    """The plain baseline ``field(t, x)``: an MLP on ``[x, time features]`` (:class:`wsbook.flows.TimeMLP`).
    It ignores the symmetries and exists for one width only."""

    def __init__(self, spec: MLPSpec, hidden: int = 256, depth: int = 3):
        super().__init__(spec.n_params, hidden=hidden, depth=depth)
        self.spec = spec
        self.kwargs = dict(hidden=hidden, depth=depth)

    def config(self) -> dict:
        return {"kind": "flat", "widths": list(self.spec.widths), "activation": self.spec.activation, **self.kwargs}

    def with_spec(self, spec: MLPSpec) -> "FlatField":
        if spec == self.spec:
            return self
        raise ValueError(f"FlatField: an MLP on flat weight vectors exists for one architecture ({self.spec}); "
                         f"it cannot read {spec}. Use gnn_field for width transfer")


def gnn_field(spec: MLPSpec, layer: str = "relational_transformer", dim: int = 32, n_layers: int = 3,
              heads: int = 1, attention: str = "neighbours", skip: bool = True) -> nn.Module:
    """The book's vector field over weights: ``field(t, x)``, an equivariant, time-conditioned GNN on the
    neural graph of ``spec`` (arguments as in :class:`_GNNField`), with ``with_spec`` for width transfer."""
    return _GNNField(spec, layer=layer, dim=dim, n_layers=n_layers, heads=heads, attention=attention, skip=skip)


FIELDS = {"gnn": _GNNField, "flat": FlatField}


def field_from_config(cfg: dict) -> nn.Module:
    """Rebuild an (untrained) field from its ``config()``."""
    cfg = dict(cfg)
    kind = cfg.pop("kind")
    if kind not in FIELDS:
        raise ValueError(f"field_from_config: unknown field kind {kind!r}; expected one of {tuple(FIELDS)}")
    spec = MLPSpec(tuple(cfg.pop("widths")), cfg.pop("activation"))
    return FIELDS[kind](spec, **cfg)
