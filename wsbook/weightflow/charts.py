"""Charts: how a population of networks becomes points of a space that a flow runs on, and back.

A chart fixes four things for one architecture (an :class:`~wsbook.nets.MLPSpec` or a
:class:`~wsbook.nets.CNNSpec`):

* ``to_points(theta)`` / ``to_weights(points)``: networks ``[B, D]`` (the spec's flat layout) to points of
  the chart's manifold ``[B, D]`` and back;
* ``layout(points)`` / ``unlayout(theta)``: the *linear* re-indexing between point coordinates and the flat
  weight layout (no projection, no check; differentiable), which is what a vector field over weights reads
  and writes;
* the manifold (:mod:`wsbook.manifolds`), with the source distribution and its exact log-density;
* ``to_tangent(points, v)`` and ``gradient_to_tangent(points, g)``: a weight-space vector (a field's output)
  or a weight-space gradient (a task loss's) as a tangent vector at ``points``.

Three charts, as in the thesis (chapter 6, "Building flows in weight space"); see chapter 7 of the book:

* :class:`EuclideanChart`: the weights as they are, optionally aligned to a reference first.
* :class:`NormalizedChart`: canonical networks (every hidden neuron's ``[w_in, b]`` on its unit sphere),
  but the flow runs in the ambient Euclidean space; its end points are mapped back to canonical networks
  by the function-preserving rescaling (:func:`wsbook.symmetry.normalize_neurons`).
* :class:`GeometricChart`: the product of spheres of canonical networks, one sphere per hidden neuron.
  The last layer stays Euclidean (``last_layer="euclidean"``), so a chart point computes *exactly* the
  function of the network it came from; ``last_layer="sphere"`` puts the whole last layer on a sphere of
  radius ``sqrt(C)`` (the thesis's choice, which rescales the logits) for comparisons with its tables.

Every chart reads the architecture through the symmetry module's description of its hidden *units*
(:func:`wsbook.symmetry.symmetry_spec`): a hidden neuron of an MLP, a hidden channel of a CNN. For a CNN a
channel's sphere factor is its flattened kernel and bias (``in_channels * k * k + 1`` numbers), and the
weights that absorb its norm are the next convolution's kernels reading that channel, or the head's column
reading its pooled feature; alignment permutes channels as it permutes neurons. One code path serves both.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from wsbook.manifolds import Euclidean, Manifold, Sphere
from wsbook.nets import CNNSpec, MLPSpec, NetSpec, check_other_widths, repeat_units
from wsbook.symmetry import canonicalize, from_spheres, normalize_neurons, product_manifold, sphere_blocks, to_spheres
from wsbook.symmetry import weight_matching

LAST_LAYERS = ("euclidean", "sphere")
#: the architectures a chart (and a field's saved config) describes
SPECS = (MLPSpec, CNNSpec)
#: the keys of a chart's or field's config that describe its architecture (:func:`spec_config`)
SPEC_KEYS = ("widths", "activation", "architecture", "kernel_size")


def check_spec(spec: object, who: str) -> NetSpec:
    """``spec`` if it is an :class:`~wsbook.nets.MLPSpec` or a :class:`~wsbook.nets.CNNSpec`; ``TypeError``
    naming ``who`` otherwise."""
    if not isinstance(spec, SPECS):
        raise TypeError(f"{who} needs an MLPSpec or a CNNSpec; got {type(spec).__name__}")
    return spec


def spec_config(spec: NetSpec) -> dict:
    """The architecture as config entries: ``{"widths", "activation"}`` for an MLP (the keys saved configs
    have always had), plus ``"architecture": "cnn"`` and ``"kernel_size"`` for a CNN (whose ``widths`` are
    ``(in_channels, *channels, n_classes)``). :func:`split_spec_config` reads them back."""
    cfg = {"widths": list(spec.widths), "activation": spec.activation}
    if isinstance(spec, CNNSpec):
        cfg |= {"architecture": "cnn", "kernel_size": spec.kernel_size}
    return cfg


def split_spec_config(cfg: dict) -> tuple[NetSpec, dict]:
    """``(spec, rest)``: the architecture described by a config's :data:`SPEC_KEYS` (written by
    :func:`spec_config`; without ``"architecture"`` an MLP) and the config's other entries."""
    rest = {k: v for k, v in cfg.items() if k not in SPEC_KEYS}
    architecture = cfg.get("architecture", "mlp")
    widths = tuple(cfg["widths"])
    if architecture == "mlp":
        return MLPSpec(widths, cfg["activation"]), rest
    if architecture == "cnn":
        return CNNSpec(widths[0], widths[1:-1], cfg["kernel_size"], widths[-1], cfg["activation"]), rest
    raise ValueError(f"unknown architecture {architecture!r} in a config; expected 'mlp' or 'cnn'")


def _finite(x: Tensor, what: str) -> Tensor:
    if not torch.isfinite(x).all():
        bad = int((~torch.isfinite(x)).any(-1).sum()) if x.dim() > 1 else 1
        raise ValueError(f"{what}: expected finite values, got NaN or inf in {bad} of {x.shape[0]} rows")
    return x


def _align(spec: NetSpec, reference: Tensor, theta: Tensor, max_iter: int = 100) -> Tensor:
    """Weight matching of every network to ``reference`` (one network, or one per member); returns the
    aligned population."""
    return weight_matching(spec, reference, theta, max_iter=max_iter).aligned


def _align_nearest(spec: NetSpec, references: Tensor, theta: Tensor) -> Tensor:
    """Every network of ``theta [B, D]`` weight-matched to each of ``references [K, D]`` (one batched matching of
    ``K x B`` pairs), keeping the alignment that ends nearest its reference; one reference: :func:`_align`."""
    k, b = references.shape[0], theta.shape[0]
    if k == 1:
        return _align(spec, references, theta)
    aligned = _align(spec, references.repeat_interleave(b, 0), theta.repeat(k, 1)).reshape(k, b, -1)
    nearest = (aligned - references[:, None]).norm(dim=-1).argmin(0)
    return aligned[nearest, torch.arange(b)]


class Chart:
    """Interface of the three charts (see the module docstring). Subclasses set ``spec``, ``manifold``,
    ``kind`` and ``sigma`` (the source's scale on Euclidean coordinates)."""

    kind: str = "chart"
    spec: NetSpec
    manifold: Manifold
    sigma: float

    @property
    def dim(self) -> int:
        """``D``: coordinates of a point (equal to the number of weights and biases of the spec)."""
        return self.spec.n_params

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec}, manifold={self.manifold!r})"

    # --- maps between networks and points --------------------------------------------------------------
    def to_points(self, theta: Tensor) -> Tensor:
        """Networks ``[B, D]`` -> points of the chart ``[B, D]``."""
        raise NotImplementedError

    def to_weights(self, points: Tensor) -> Tensor:
        """Points ``[B, D]`` -> ordinary networks ``[B, D]`` in the spec's flat layout."""
        raise NotImplementedError

    def layout(self, points: Tensor) -> Tensor:
        """The linear re-indexing of point coordinates into the flat weight layout (differentiable, unchecked)."""
        return points

    def unlayout(self, theta: Tensor) -> Tensor:
        """Inverse of :meth:`layout` (flat weight layout -> point coordinates)."""
        return theta

    # --- vectors ---------------------------------------------------------------------------------------
    def to_tangent(self, points: Tensor, v: Tensor) -> Tensor:
        """A weight-space vector ``v [B, D]`` (e.g. a GNN's output) as a tangent vector at ``points``:
        the inverse layout (the differential of the linear chart map) followed by the tangent projection."""
        return self.manifold.proju(points, self.unlayout(v))

    def gradient_to_tangent(self, points: Tensor, grad: Tensor) -> Tensor:
        """A weight-space gradient ``grad [B, D]`` (dL/dtheta at ``layout(points)``) as the Riemannian
        gradient at ``points``: the chain rule through :meth:`layout` (a vector-Jacobian product), then the
        tangent projection (the metric is the one induced by the ambient space)."""
        with torch.enable_grad():
            p = points.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(self.layout(p), p, grad_outputs=grad.to(points))
        return self.manifold.proju(points, g)

    # --- checks ----------------------------------------------------------------------------------------
    def check_points(self, points: Tensor, name: str = "points") -> Tensor:
        """Raise ``ValueError`` unless ``points`` is ``[B, D]``, finite and on the chart's manifold."""
        if not isinstance(points, Tensor) or points.dim() != 2 or points.shape[1] != self.dim:
            got = tuple(points.shape) if isinstance(points, Tensor) else type(points).__name__
            raise ValueError(f"{type(self).__name__}: {name} must be [B, {self.dim}] for {self.spec}; got {got}")
        _finite(points, f"{type(self).__name__}: {name}")
        return points

    def check_weights(self, theta: Tensor, name: str = "theta") -> Tensor:
        """Validate a population of the chart's spec (clear error for a population of another width)."""
        if isinstance(theta, Tensor) and theta.dim() == 2 and theta.shape[1] != self.dim:
            raise ValueError(f"{type(self).__name__}: {name} has {theta.shape[1]} parameters per network, but the "
                             f"chart's spec {self.spec} has {self.dim}; build the chart (or call with_spec) for "
                             "the architecture of these networks")
        theta = self.spec.check(theta, name)
        return _finite(theta, f"{type(self).__name__}: {name}")

    # --- source ----------------------------------------------------------------------------------------
    def sample_source(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` points from the source distribution ``p_0``."""
        raise NotImplementedError

    def source_log_prob(self, points: Tensor) -> Tensor:
        """Exact log-density of :meth:`sample_source` w.r.t. the manifold's volume measure, ``[B]``."""
        raise NotImplementedError

    # --- transfer and persistence ----------------------------------------------------------------------
    def config(self) -> dict:
        """A cacheable description (numbers, strings, lists, tensors) from which :func:`chart_from_config`
        rebuilds the chart."""
        raise NotImplementedError

    def with_spec(self, spec: NetSpec) -> "Chart":
        """The same kind of chart for another architecture of the same depth (no reference network), on
        ``spec`` itself (its bias and frequency too: a :class:`WeightFlow` needs its field's spec). A CNN
        keeps its kernel size; only hidden widths (neurons or channels) may change."""
        check_other_widths(self.spec, spec, "with_spec")
        cfg = self.config()
        kind = cfg.pop("kind")
        for key in SPEC_KEYS:
            cfg.pop(key, None)
        return make_chart(kind, spec, **{**cfg, **self._settings_for(spec), "reference": None})

    def _settings_for(self, spec: NetSpec) -> dict:
        """The settings of :meth:`config` that depend on the widths, carried to ``spec`` (none by default)."""
        return {}


#: the Euclidean chart's default source scale (the thesis's choice for classifiers)
DEFAULT_SIGMA = 0.1


class EuclideanChart(Chart):
    """Weights as they are (optionally aligned to a reference by weight matching first); the flow runs in
    ``R^D`` from the source ``N(0, sigma^2 I)``, or from ``N(loc, diag(sigma^2))`` with a per-weight ``sigma``
    and ``loc`` (e.g. a mean-field VI fit, so that a zero field starts the flow at VI's posterior), or from the
    equal mixture of ``K`` such Gaussians (``loc [K, D]``: e.g. ``K`` VI fits from ``K`` initialisations, each
    in a mode of its own; row ``i`` of :meth:`sample_source` comes from component ``i % K``).

    Args:
        spec: the architecture (an :class:`~wsbook.nets.MLPSpec` or a :class:`~wsbook.nets.CNNSpec`).
        sigma: standard deviation of the Gaussian source: a number (the thesis uses 0.1 for classifiers, 1
            for its Gaussian toy), one positive value per weight ``[D]``, or one row per component ``[K, D]``.
        reference: a network ``[D]`` every population is aligned to in :meth:`to_points`, ``K`` networks
            ``[K, D]`` (every network is aligned to each and keeps the alignment that brings it nearest), or
            ``None``.
        loc: the source's mean ``[D]``, or the components' means ``[K, D]`` (default: zero).
    """

    kind = "euclidean"

    def __init__(self, spec: NetSpec, sigma: float | Tensor = DEFAULT_SIGMA, reference: Tensor | None = None,
                 loc: Tensor | None = None):
        check_spec(spec, "EuclideanChart")
        self.loc = None if loc is None else spec.check(loc, "loc").detach().clone()          # [K, D]
        k = 1 if self.loc is None else self.loc.shape[0]
        if isinstance(sigma, Tensor) and sigma.numel() > 1:
            sigma = spec.check(sigma, "sigma").detach().clone()                                # [1 or K, D]
            if sigma.shape[0] not in (1, k):
                raise ValueError(f"EuclideanChart: sigma has {sigma.shape[0]} rows for {k} components")
            if not bool((sigma > 0).all()):
                raise ValueError(f"EuclideanChart: every sigma must be positive; got min {float(sigma.min())}")
        elif not float(sigma) > 0:
            raise ValueError(f"EuclideanChart: sigma must be positive; got {float(sigma)}")
        else:
            sigma = float(sigma)
        self.spec, self.sigma = spec, sigma
        self.reference = None if reference is None else spec.check(reference, "reference").detach().clone()
        self.manifold = Euclidean(spec.n_params)

    @property
    def n_components(self) -> int:
        """``K``, the Gaussians of the source's equal mixture (1 for a single Gaussian)."""
        return 1 if self.loc is None else self.loc.shape[0]

    def to_points(self, theta: Tensor) -> Tensor:
        theta = self.check_weights(theta)
        return _align_nearest(self.spec, self.reference.to(theta), theta) if self.reference is not None \
            else theta.clone()

    def to_weights(self, points: Tensor) -> Tensor:
        return self.check_points(points).clone()

    def sample_source(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        z = self.manifold.random_base(n, generator=generator)
        component = torch.arange(n, device=z.device) % self.n_components
        if isinstance(self.sigma, Tensor):
            z = z * self.sigma.to(z)[component % self.sigma.shape[0]]
        else:
            z = self.sigma * z
        return z if self.loc is None else z + self.loc.to(z)[component]

    def source_log_prob(self, points: Tensor) -> Tensor:
        x = points[:, None] if self.loc is None else points[:, None] - self.loc.to(points)     # [B, K, D]
        if isinstance(self.sigma, Tensor):
            z = x / self.sigma.to(x)
            log_norm = self.sigma.to(x).log().sum(-1) + 0.5 * self.dim * math.log(2 * math.pi)
        else:
            z = x / self.sigma
            log_norm = self.dim * (math.log(self.sigma) + 0.5 * math.log(2 * math.pi))
        per_component = -0.5 * (z * z).sum(-1) - log_norm                                      # [B, K]
        return torch.logsumexp(per_component, 1) - math.log(self.n_components)

    def config(self) -> dict:
        cfg = {"kind": self.kind, **spec_config(self.spec), "sigma": self.sigma, "reference": self.reference}
        return cfg if self.loc is None else cfg | {"loc": self.loc}

    def _settings_for(self, spec: NetSpec) -> dict:
        """A source centred on networks (``loc``) or with a scale per weight goes to other widths by
        :func:`~wsbook.nets.repeat_units`: every hidden unit of the new width is centred on a copy of one of
        the old width's units, its weights sized for the old width."""
        out = {} if self.loc is None else {"loc": repeat_units(self.spec, self.loc, spec)}
        return out | ({"sigma": repeat_units(self.spec, self.sigma, spec)} if isinstance(self.sigma, Tensor) else {})


class _CanonicalChart(Chart):
    """Shared machinery of the Normalized and Geometric charts: canonical networks in the block layout of
    :func:`wsbook.symmetry.sphere_blocks` (each hidden unit's ``[w_in, b]`` contiguous -- a neuron's incoming
    row, a channel's flattened kernel -- then the last layer), with the source uniform on every unit's sphere
    and Gaussian on the Euclidean last layer."""

    def __init__(self, spec: NetSpec, sigma: float = 1.0, reference: Tensor | None = None,
                 last_layer: str = "euclidean"):
        check_spec(spec, type(self).__name__)
        if spec.activation != "relu" or not spec.bias:
            raise ValueError(f"{type(self).__name__}: canonical networks need ReLU and biases; got {spec} (the chart "
                             "scales every hidden unit's incoming weights and bias by 1/norm and its outgoing "
                             "weights by norm, which keeps the function only for a positively homogeneous "
                             "activation)")
        if spec.n_layers < 2:
            raise ValueError(f"{type(self).__name__}: needs at least one hidden layer; got {spec}")
        if last_layer not in LAST_LAYERS:
            raise ValueError(f"{type(self).__name__}: last_layer must be one of {LAST_LAYERS}; got {last_layer!r}")
        if not sigma > 0:
            raise ValueError(f"{type(self).__name__}: sigma must be positive; got {sigma}")
        self.spec, self.sigma, self.last_layer = spec, float(sigma), last_layer
        # symmetry's vocabulary: "regression" keeps the last layer as it is (exact function),
        # "classification" scales it to norm sqrt(C) (same labels, rescaled logits)
        self.task = "regression" if last_layer == "euclidean" else "classification"
        blocks, index = sphere_blocks(spec, self.task)
        self.blocks = blocks
        self.index = index                                   # points = theta[:, index] (then last layer / sqrt(C))
        self.inverse = index.argsort()
        self._on_device: dict[torch.device, tuple[Tensor, Tensor]] = {}     # (index, inverse) per device
        n_hidden = sum(n * d for kind, n, d in blocks[:-1])
        self.last = slice(n_hidden, spec.n_params)           # the last layer's coordinates in point layout
        self.last_scale = math.sqrt(spec.widths[-1]) if last_layer == "sphere" else 1.0
        self.product = product_manifold(spec, self.task)
        self.reference = None if reference is None else spec.check(reference, "reference")[:1].detach().clone()

    def canonical(self, theta: Tensor) -> Tensor:
        """Canonical networks in the flat weight layout (normalized neurons, aligned when a reference is set)."""
        theta = self.check_weights(theta)
        if self.reference is None:
            return normalize_neurons(self.spec, theta, self.task)
        return canonicalize(self.spec, theta, self.reference.to(theta), task=self.task)

    def to_points(self, theta: Tensor) -> Tensor:
        return to_spheres(self.spec, self.canonical(theta), self.task)

    def _indices(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """``(index, inverse)`` on ``device``, copied there once (a copy per call would make the host wait
        for the device at every training step)."""
        if device not in self._on_device:
            self._on_device[device] = (self.index.to(device), self.inverse.to(device))
        return self._on_device[device]

    def layout(self, points: Tensor) -> Tensor:
        if self.last_scale != 1.0:
            points = torch.cat([points[:, :self.last.start], points[:, self.last] * self.last_scale], 1)
        return points[:, self._indices(points.device)[1]]

    def unlayout(self, theta: Tensor) -> Tensor:
        out = theta[:, self._indices(theta.device)[0]]
        if self.last_scale != 1.0:
            out = torch.cat([out[:, :self.last.start], out[:, self.last] / self.last_scale], 1)
        return out

    def sample_source(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        x = self.product.random_base(n, generator=generator)
        if self.last_layer == "euclidean":
            x = torch.cat([x[:, :self.last.start], self.sigma * x[:, self.last]], 1)
        return x

    def source_log_prob(self, points: Tensor) -> Tensor:
        total = points.new_zeros(points.shape[0])
        for b in self.product.blocks:
            if b.kind == "sphere":
                total = total - b.n_factors * Sphere(b.factor_dim).log_volume()
            else:
                z = points[:, b.slice] / self.sigma
                d = b.stop - b.start
                total = total - 0.5 * (z * z).sum(-1) - d * (math.log(self.sigma) + 0.5 * math.log(2 * math.pi))
        return total

    def config(self) -> dict:
        return {"kind": self.kind, **spec_config(self.spec), "sigma": self.sigma, "reference": self.reference,
                "last_layer": self.last_layer}


class NormalizedChart(_CanonicalChart):
    """Canonical networks, flow in the ambient Euclidean space ``R^D`` (the thesis's "Normalized" flow).

    Points are canonical networks in the block layout; the source is uniform on every neuron sphere and
    ``N(0, sigma^2)`` on the Euclidean last layer, but the flow itself does not know the spheres, so its end
    points lie near, not on them. :meth:`to_weights` returns the canonical representative of the network
    an end point *is* (:func:`~wsbook.symmetry.normalize_neurons`, which compensates every rescaling in the
    next layer), so the returned network computes exactly the function of the flow's output. The flow has no
    density on ``R^D`` (its source lives on a lower-dimensional set), hence no ``log_prob``.
    """

    kind = "normalized"

    def __init__(self, spec: NetSpec, sigma: float = 1.0, reference: Tensor | None = None,
                 last_layer: str = "euclidean"):
        super().__init__(spec, sigma, reference, last_layer)
        self.manifold = Euclidean(spec.n_params)

    def to_weights(self, points: Tensor) -> Tensor:
        points = self.check_points(points)
        return normalize_neurons(self.spec, self.layout(points), self.task)

    def source_log_prob(self, points: Tensor) -> Tensor:
        raise ValueError("NormalizedChart: the source lives on the product of spheres inside R^D, so the flow "
                         "has no density w.r.t. the Lebesgue measure of R^D; use a GeometricChart for likelihoods")


class GeometricChart(_CanonicalChart):
    """The product of spheres of canonical networks (the thesis's "Geometric" flow), one unit sphere
    ``S^{fan_in}`` per hidden neuron (its incoming weights and bias) and, by default, the last layer in
    Euclidean space so that every point is a network computing exactly the function of its preimage.
    For a CNN the factors are the hidden channels: ``S^{in_channels * k * k}`` per channel (its kernel and
    bias); the next convolution's kernels reading the channel (or the head's column reading its pooled
    feature) carry its norm.

    Args:
        spec: a ReLU architecture with biases (an :class:`~wsbook.nets.MLPSpec` or a
            :class:`~wsbook.nets.CNNSpec`).
        sigma: standard deviation of the Gaussian source on the Euclidean last layer.
        reference: a network ``[D]`` that canonical networks are aligned to (weight matching), or ``None``.
        last_layer: ``"euclidean"`` (exact function) or ``"sphere"`` (norm ``sqrt(C)``, the thesis variant).
    """

    kind = "geometric"

    def __init__(self, spec: NetSpec, sigma: float = 1.0, reference: Tensor | None = None,
                 last_layer: str = "euclidean"):
        super().__init__(spec, sigma, reference, last_layer)
        self.manifold = self.product

    def check_points(self, points: Tensor, name: str = "points", atol: float = 1e-4) -> Tensor:
        points = super().check_points(points, name)
        dev = self.product.norm_deviation(points)
        bad = dev > atol
        if bool(bad.any()):
            raise ValueError(f"GeometricChart: {name} are not canonical: {int(bad.sum())} of {points.shape[0]} have a "
                             f"neuron whose [w_in, b] is off its unit sphere (largest | |row| - 1 | = "
                             f"{dev.max().item():.3g}, tolerance {atol:g}); map networks with to_points first")
        return points

    def to_weights(self, points: Tensor) -> Tensor:
        points = self.check_points(points)
        return from_spheres(self.spec, points, self.task)


CHARTS = {"euclidean": EuclideanChart, "normalized": NormalizedChart, "geometric": GeometricChart}


def make_chart(kind: str, spec: NetSpec, **kwargs) -> Chart:
    """``"euclidean"``, ``"normalized"`` or ``"geometric"`` by name (keyword arguments go to the class)."""
    if kind not in CHARTS:
        raise ValueError(f"make_chart: kind must be one of {tuple(CHARTS)}; got {kind!r}")
    return CHARTS[kind](spec, **kwargs)


def chart_from_config(cfg: dict) -> Chart:
    """Rebuild a chart from :meth:`Chart.config` (an MLP's or a CNN's, :func:`split_spec_config`)."""
    spec, cfg = split_spec_config(cfg)
    kind = cfg.pop("kind")
    return make_chart(kind, spec, **cfg)
