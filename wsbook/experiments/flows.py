"""Flows over the networks of a checkpoint zoo, trained, sampled and scored the one way the results chapter
uses (book chapter 8; thesis 000, sec. 7.2-7.3).

* :class:`FlowConfig`: which flow (chart, field, coupling, alignment) and how long it trains; its
  :attr:`~FlowConfig.name` is the row name of the chapter's tables (``"geometric_aligned_ot"``, the key of
  :mod:`wsbook.experiments.published`). :func:`flow_config` fills in the per-scale sizes.
* :func:`zoo_split`: the one seeded split of a zoo by whole runs into training, validation and (sealed)
  test runs (:mod:`wsbook.experiments.protocol`), plus the reference network the aligned charts match every
  network to.
* :func:`train_flow`: a cached :class:`~wsbook.weightflow.WeightFlow` (state dict and seconds under
  ``"flows/trained"``).
* :func:`sample_flow`: cached samples (``"flows/samples"``), with or without task-loss guidance.
* :func:`references` and :func:`score`: every generated set scored the same way against the validation
  runs: accuracy and NLL (mean +- std over networks), the model average of 64, the function-space MMD^2 over
  the perfect generator's floor, the median nearest-neighbour distance to the training zoo in the aligned,
  canonical weight space over the reference runs' (memorisation), and the weight-space W2 with its floor.
  :func:`target_rows` scores the control rows (:data:`CONTROLS`).
* :func:`test_report`: the verdict on the test runs, mean +- standard error over training seeds, with a
  verdict column per goal; the only reader of the test runs.
* :func:`nn_ratio_interval`: the memorisation ratio against all reference networks, with a bootstrap
  interval over whole runs.
* :func:`steps_curve` and :func:`adam_curve`: sample quality against solver steps, and the optimiser after
  as many steps (thesis Fig. 7.3).

Sizes come from :func:`wsbook.config.by_scale`; everything expensive goes through :mod:`wsbook.cache`.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from wsbook import config
from wsbook.bayes import distances
from wsbook.cache import KEYLESS_DEFAULT, cached
from wsbook.experiments import protocol, targets
from wsbook.nets import CNNSpec, train_population
from wsbook.weightflow import (ChannelField, FitResult, FlatField, GeometricChart, Guidance, NeuronField, WeightFlow,
                               gnn_field, make_chart)
from wsbook.weightflow.charts import DEFAULT_SIGMA

CHARTS = ("euclidean", "normalized", "geometric")
FIELDS = ("gnn", "flat", "neuron", "channel")
#: where a Euclidean flow's Gaussian source is centred (:attr:`FlowConfig.source`)
SOURCES = ("zero", "mean")
#: the extended budget of :func:`extended_config`, in multiples of the table's training steps
EXTENDED_STEPS = 10
#: the thesis's three design variants of Table 7.1: (chart aligned to a reference, coupling)
VARIANTS = {"plain": (False, "independent"), "aligned": (True, "independent"), "aligned_ot": (True, "ot")}


# ------------------------------------------------------------------------------------------ configuration
@dataclass(frozen=True)
class FlowConfig:
    """One flow over a zoo and its training budget (every field is part of the cache key).

    Attributes:
        chart: ``"euclidean"``, ``"normalized"`` or ``"geometric"`` (:mod:`wsbook.weightflow.charts`).
        field: ``"gnn"`` (the equivariant :func:`~wsbook.weightflow.gnn_field`), ``"neuron"`` (the field
            whose nodes read whole neurons, :class:`~wsbook.weightflow.NeuronField`), ``"channel"`` (its
            counterpart over a CNN's channels, :class:`~wsbook.weightflow.ChannelField`) or ``"flat"`` (the
            plain :class:`~wsbook.weightflow.FlatField` baseline).
        aligned: the chart aligns every network to the split's reference network by weight matching.
        coupling: ``"independent"`` or ``"ot"`` (exact minibatch OT in the chart's metric).
        align_pairs: also permute every target to its source partner (see :class:`WeightFlow`).
        anchored: the GNN field reads the mean aligned training network beside ``x`` (see
            :class:`~wsbook.weightflow.GNNField`); needs ``align_pairs=False``.
        global_context: every GNN layer also reads the mean node and edge feature of its network (a
            virtual node, see :class:`~wsbook.weightflow.GNNField`).
        parametrization: ``"velocity"`` or ``"endpoint"``.
        time_distribution: ``"uniform"`` or ``"beta(1,2)"``.
        sigma: the source's scale on Euclidean coordinates (``None``: the chart's default, 0.1 for the
            Euclidean chart as in the thesis, 1 on the last layer of the canonical charts).
        source: where the Euclidean chart's Gaussian source is centred: ``"zero"`` (the thesis's
            ``N(0, sigma^2 I)``) or ``"mean"`` (``N(m, sigma^2 I)`` with ``m`` the mean of the training
            networks on the chart, aligned ones on an aligned chart), so every path starts among the networks
            instead of at the origin.
        last_layer: ``"euclidean"`` (canonical networks compute exactly the function of their preimage) or
            ``"sphere"`` (the thesis's ``sqrt(C)`` last layer, which rescales the logits).
        loss_weighting: ``"chart"`` or ``"layer"`` (see :class:`~wsbook.weightflow.WeightFlow`).
        dim, n_layers, heads: GNN size; hidden, depth: flat MLP size. The neuron field reads ``hidden`` (its
            node width) and ``n_layers`` (message-passing rounds; attention layers for one hidden layer); the
            channel field ``hidden``, ``n_layers`` (rounds), ``edge_dim`` (kernel features) and
            ``attention_layers`` (self-attention among each convolution's channels). ``heads`` is the GNN's
            only: the neuron and channel fields attend with their own default of 4 heads.
        steps, batch_size, lr, ema_decay: training.
    """

    chart: str
    field: str = "gnn"
    aligned: bool = True
    coupling: str = "ot"
    align_pairs: bool = False
    anchored: bool = False
    global_context: bool = False
    parametrization: str = "velocity"
    time_distribution: str = "uniform"
    sigma: float | None = None
    # left out of the cache key at its default, so the flows trained before it existed keep their entries
    source: str = dataclasses.field(default="zero", metadata={KEYLESS_DEFAULT: True})
    last_layer: str = "euclidean"
    loss_weighting: str = "layer"
    dim: int = 16
    n_layers: int = 2
    heads: int = 1
    hidden: int = 256
    depth: int = 3
    steps: int = 1000
    batch_size: int = 32
    lr: float = 3e-3
    ema_decay: float = 0.99
    # the channel field's; left out of the cache key at their defaults, as ``source``
    edge_dim: int = dataclasses.field(default=16, metadata={KEYLESS_DEFAULT: True})
    attention_layers: int = dataclasses.field(default=0, metadata={KEYLESS_DEFAULT: True})

    @property
    def source_label(self) -> str:
        """The source in words, for tables: ``"N(0, 0.1²)"``, ``"N(mean network, 0.03²)"`` or ``"uniform on
        the spheres"`` (the canonical charts' hidden layers)."""
        if self.chart != "euclidean":
            return "uniform on the spheres"
        sigma = DEFAULT_SIGMA if self.sigma is None else self.sigma
        return f"N({'mean network' if self.source == 'mean' else 0}, {sigma:g}²)"

    def __post_init__(self) -> None:
        if self.chart not in CHARTS:
            raise ValueError(f"FlowConfig: chart must be one of {CHARTS}; got {self.chart!r}")
        if self.field not in FIELDS:
            raise ValueError(f"FlowConfig: field must be one of {FIELDS}; got {self.field!r}")
        if self.source not in SOURCES:
            raise ValueError(f"FlowConfig: source must be one of {SOURCES}; got {self.source!r}")
        if self.source != "zero" and self.chart != "euclidean":
            raise ValueError(f"FlowConfig: source={self.source!r} needs the Euclidean chart; got {self.chart!r}")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"FlowConfig: steps and batch_size must be positive; got {self.steps}, {self.batch_size}")

    @property
    def variant(self) -> str:
        """``"plain"``, ``"aligned"``, ``"aligned_ot"`` (or ``"ot"`` for OT pairs without alignment)."""
        return ("aligned" if self.aligned else "") + ("_ot" if self.coupling == "ot" else "") or "plain"

    @property
    def name(self) -> str:
        """The table row: ``"<chart>[_aligned][_ot]"`` (the published tables' names), ``"flat_..."`` for the
        flat-MLP field, ``"neuron_..."`` for the neuron field, ``"..._from_mean"`` for a source centred on
        the training networks."""
        variant = self.variant.lstrip("_")
        base = self.chart if variant == "plain" else f"{self.chart}_{variant}"
        base = base if self.source == "zero" else f"{base}_from_{self.source}"
        return base if self.field == "gnn" else f"{self.field}_{base}"


def solver_steps() -> int:
    """Midpoint steps with which chapter 8 samples its breast-cancer flows at the current scale (few: the OT
    paths are nearly straight; measurements: docs/tuning-log.md)."""
    return config.by_scale(4, 16, 64)


def flow_config(chart: str, variant: str = "aligned_ot", field: str = "gnn", **overrides) -> FlowConfig:
    """The book's flow ``chart`` x ``variant`` (a key of :data:`VARIANTS`) with the per-scale training sizes.

    The GNN is what costs on a CPU, so ``default`` gives it a few hundred steps; ``full`` is sized for a GPU
    (the thesis's 250,000 iterations for breast cancer). The neuron field is cheaper per step and learns
    more per step, so it gets a thousand steps at ``default``. The flat baseline is cheap and gets more
    steps, as a user would give it. Timings and measurements: docs/tuning-log.md.

    Args:
        chart: ``"euclidean"``, ``"normalized"`` or ``"geometric"``.
        variant: ``"plain"``, ``"aligned"`` or ``"aligned_ot"``.
        field: ``"gnn"``, ``"neuron"``, ``"channel"`` (CNNs) or ``"flat"``.
        overrides: any other :class:`FlowConfig` field.
    """
    if variant not in VARIANTS:
        raise ValueError(f"flow_config: variant must be one of {tuple(VARIANTS)}; got {variant!r}")
    aligned, coupling = VARIANTS[variant]
    s = config.by_scale
    if field == "gnn":
        # on an aligned chart the field reads the mean aligned network as an anchor, so it knows which
        # aligned neuron it looks at (GNNField); without alignment the mean identifies no neuron, so the field
        # stays equivariant and every target is aligned to its source partner (measurements: docs/tuning-log.md)
        sizes = dict(dim=s(8, 16, 32), n_layers=s(1, 2, 3), steps=s(40, 400, 250_000), batch_size=s(16, 32, 64),
                     lr=3e-3, anchored=aligned, align_pairs=not aligned)
    elif field == "channel":
        # anchored on aligned charts, as the neuron field; as many steps as the flat baseline below (of the CNN
        # page's flows only the larger field of attention_channel_settings trains longer; docs/tuning-log.md)
        sizes = dict(hidden=s(32, 64, 128), n_layers=1, steps=s(300, 3000, 50_000), batch_size=s(16, 64, 64),
                     lr=3e-3, anchored=aligned, align_pairs=not aligned)
    elif field == "neuron":
        # the field that reads whole neurons, anchored on aligned charts like the GNN; its steps and learning
        # rate were chosen by MMD and memorisation (measurements: docs/tuning-log.md)
        sizes = dict(hidden=s(32, 128, 256), n_layers=s(1, 2, 3), steps=s(150, 1000, 50_000),
                     batch_size=s(16, 64, 64), lr=3e-3, anchored=aligned, align_pairs=not aligned)
    else:
        sizes = dict(hidden=s(128, 256, 512), depth=3, steps=s(300, 3000, 20_000), batch_size=s(32, 64, 64), lr=3e-3)
    return FlowConfig(chart=chart, field=field, aligned=aligned, coupling=coupling, **{**sizes, **overrides})


def extended_config(**overrides) -> FlowConfig:
    """The headline flow (Euclidean chart, aligned + OT, graph-network field) with the longer budget and
    the settings kept for it on a CPU (chosen against the runs that are now the validation runs, before
    the results protocol; see docs/tuning-log.md): :data:`EXTENDED_STEPS` times the steps of
    :func:`flow_config`, batches of 64 networks, a learning rate of ``1e-2`` (cosine-decayed to 5 % as
    always), three message-passing layers (at ``ci``: the table's field and batch), and a field whose
    layers also read a global summary of the network (``global_context``, a virtual node).

    The global summary is there because most of the zoo's spread in function space is how far a run had
    trained, a property of the whole network that a purely local field would decide neuron by neuron. The
    measurements behind these settings, one change at a time: docs/tuning-log.md.
    """
    s = config.by_scale    # `ci` keeps the table's small field and batch: a check, not a measurement
    return flow_config("euclidean", "aligned_ot", **{"steps": EXTENDED_STEPS * flow_config("euclidean").steps,
                                                    "lr": 1e-2, "global_context": True, "n_layers": s(1, 3, 3),
                                                    "batch_size": s(16, 64, 64), **overrides})


def neuron_config(chart: str = "euclidean", variant: str = "aligned_ot", **overrides) -> FlowConfig:
    """A table flow with the field that reads whole neurons (:class:`~wsbook.weightflow.NeuronField`,
    anchored on the aligned charts), by default the headline flow (Euclidean chart, aligned + OT)."""
    return flow_config(chart, variant, field="neuron", **overrides)


def baseline_config(**overrides) -> FlowConfig:
    """The plain baseline of every table: a flat MLP field on the aligned weight vector (Euclidean chart)
    with OT pairs, the simplest flow a user would try."""
    return flow_config("euclidean", "aligned_ot", field="flat", **overrides)


#: the task-loss guidance weights the breast-cancer verdict also draws every flow with (a candidate each,
#: :func:`with_guidance`; the grid was read on the validation runs, see docs/tuning-log.md)
BREAST_CANCER_GUIDANCE = (0.3, 1.0)


def breast_cancer_verdict_candidates() -> dict[str, "FlowConfig | Guided"]:
    """What chapter 8's verdict chooses from: every flow of :func:`breast_cancer_candidates`, as drawn and
    drawn with each guidance weight of :data:`BREAST_CANCER_GUIDANCE` (the plain baseline unguided)."""
    return with_guidance(breast_cancer_candidates(), BREAST_CANCER_GUIDANCE)


def breast_cancer_candidates() -> dict[str, FlowConfig]:
    """Every flow chapter 8 trains on the breast-cancer zoo, by its table label: the nine chart x variant
    flows of the thesis's Table 7.1 with the field that reads whole neurons (:func:`neuron_config`), the
    ``"plain baseline"`` (:func:`baseline_config`), and the message-passing graph network on the Euclidean
    aligned + OT flow at the table's budget (:func:`flow_config`) and extended (:func:`extended_config`,
    labelled ``"<name>, extended"``). The command line precomputes the same set."""
    cfgs = {c.name: c for c in (neuron_config(chart, v) for chart in CHARTS for v in VARIANTS)}
    cfgs["plain baseline"] = baseline_config()
    head = flow_config("euclidean", "aligned_ot")
    cfgs[head.name] = head
    cfgs[f"{head.name}, extended"] = extended_config()
    return cfgs


#: the source scale of the CNN flows whose source is centred on the training networks (chosen on validation:
#: docs/tuning-log.md)
CNN_MEAN_SOURCE_SIGMA = 0.3


def cnn_candidates() -> dict[str, FlowConfig]:
    """Every flow the CNN page trains on the ``"cnn_digits"`` zoo, by its table label: the channel field
    (:class:`~wsbook.weightflow.ChannelField`, anchored) on the Euclidean and the Geometric chart, aligned + OT;
    the channel field (the larger one of :func:`attention_channel_settings`) and a flat field on the Euclidean
    chart from a source centred on the mean aligned training network (scale :data:`CNN_MEAN_SOURCE_SIGMA`)
    that predict each path's endpoint; and the ``"plain baseline"``, a flat field on the aligned weight vector
    (the DeepWeightFlow recipe without its PCA and normalisation recalibration).

    Each flow's training times are drawn as chosen for it on the validation runs: from Beta(1, 2) (more of
    them near the source) for the larger channel field and the plain baseline, uniformly for the others
    (measurements: docs/tuning-log.md)."""
    cfgs = {c.name: c for c in (flow_config(chart, "aligned_ot", field="channel") for chart in ("euclidean",
                                                                                                "geometric"))}
    centred = dict(source="mean", sigma=CNN_MEAN_SOURCE_SIGMA, parametrization="endpoint")
    for field, settings in (("channel", attention_channel_settings()), ("flat", {})):
        cfg = flow_config("euclidean", "aligned_ot", field=field, **centred, **settings)
        cfgs[cfg.name] = cfg
    cfgs["plain baseline"] = baseline_config(time_distribution="beta(1,2)")
    return cfgs


def attention_channel_settings() -> dict:
    """The larger channel field of the CNN flow from the mean network and how it trains: two rounds of
    message passing, wider kernel features and two self-attention layers among each convolution's channels,
    so that the channels can settle together which training network they move towards; more steps than the
    other CNN flows at every scale, and training times from Beta(1, 2) (both chosen on the validation runs;
    measurements: docs/tuning-log.md)."""
    s = config.by_scale
    return dict(hidden=s(32, 128, 128), n_layers=2, edge_dim=s(16, 64, 64), attention_layers=s(1, 2, 2),
                steps=s(600, 10_000, 100_000), time_distribution="beta(1,2)")


def cnn_sizes() -> tuple[int, int]:
    """``(generated networks, midpoint steps)`` per flow of the CNN page's table."""
    return config.by_scale(ci=64, default=128, full=512), solver_steps()


def cnn_verdict_table(field: str | None = None):
    """The CNN page's verdict (:func:`verdict_table` over :func:`cnn_candidates` at :func:`cnn_sizes`, with
    the accuracy goal :data:`ACCURACY_GAP`): the best flow of every candidate, or with ``field`` (e.g.
    ``"channel"``) the best flow of that field, chosen on validation runs, beside the plain baseline."""
    return verdict_table("cnn_digits", cnn_verdict_candidates(field), *cnn_sizes(), accuracy_gap=ACCURACY_GAP)


#: the CNN page's verdict tables, by the field their candidates are limited to: every flow, the channel
#: (equivariant) fields, the flat fields
CNN_VERDICT_FIELDS = (None, "channel", "flat")


def equivariant_against_flat():
    """Chapter 8d's like-for-like reading of the equivariant field: the channel-field flow chosen on validation
    runs against the flat-field flow chosen so (not the plain baseline, which is also flat but starts from a
    plain source), both from their own :func:`cnn_verdict_table` on the same test runs and floor. Returns a
    DataFrame with the two chosen rows (``field`` ``"channel"`` and ``"flat"``) and, on the channel row, the
    verdict ``"MMD² vs flat"`` (:func:`~wsbook.experiments.protocol.versus`: the two rows' floors are the same
    estimate, so the difference's standard error counts its share twice, on the safe side)."""
    import pandas as pd

    fields = ("channel", "flat")
    rows = {}
    for field in fields:
        table = cnn_verdict_table(field)
        rows[table.attrs["selected"]] = table.loc[table.attrs["selected"]]
    out = pd.DataFrame(rows).T
    out.insert(0, "field", fields)
    protocol.versus_column(out, "MMD² vs flat", "mmd_ratio", [out.index[0]], out.index[1])
    return out


def cnn_verdict_candidates(field: str | None = None) -> dict[str, FlowConfig]:
    """The candidates of :func:`cnn_verdict_table`: every CNN flow, or those of ``field`` and the plain
    baseline."""
    cands = cnn_candidates()
    if field is None:
        return cands
    if field not in FIELDS:
        raise ValueError(f"cnn_verdict_table: field must be one of {FIELDS}; got {field!r}")
    return {k: c for k, c in cands.items() if c.field == field or k == "plain baseline"}


#: the trained wider CNNs chapter 8d's width transfer is read against (the recipe of ``"cnn_digits"`` with
#: twice the hidden channels)
CNN_WIDE_ZOO = "cnn_digits_w16"
#: checkpoints of each run of the wider zoo that :func:`transfer_rows` scores (evenly spaced over the run)
WIDE_CHECKPOINTS = 16
#: the rows of :func:`cnn_width_transfer`, in order
TRANSFER_ROWS = ("trained wide zoo", "flow at the new width", "packed ensemble", "probability average",
                 "flow at its training width")


def cnn_width_transfer(chosen: str | None = None, *, seeds: tuple[int, ...] = protocol.SEEDS):
    """Chapter 8d's width transfer: the channel flow chosen on validation runs (``chosen``, default the best by
    the validation scores of ``cnn_verdict_table("channel")`` among the flows that can change width, the
    channel fields), as trained on the 8-channel zoo for the verdict with each seed of ``seeds``, samples
    16-channel CNNs (its anchor, and a source centred on the mean 8-channel network, widened by repeating
    channels: :func:`~wsbook.nets.repeat_units`), read against the trained 16-channel zoo
    :data:`CNN_WIDE_ZOO` and against two baselines built from ``k`` (the ratio of the widths) independent
    8-channel samples of the same flow: packed side by side into one wide network
    (:func:`~wsbook.nets.pack_cnns`) and their probability average. Every row is scored by
    :func:`probability_scores` on the digits test split.

    A flow sample at the new width has every layer that reads the hidden channels (the second convolution,
    the head) divided by the width ratio, so that its sums over channels stay averages (as the MLP pages'
    transfer scales its outgoing weights).

    Returns a DataFrame, one row per :data:`TRANSFER_ROWS`: ``seeds`` (the units of the standard error:
    training seeds for the flow rows, runs for the trained zoo), the mean and standard error (``*_se``) of
    ``accuracy``, ``nll`` and ``bma_accuracy``, and two verdict columns for the flow at the new width: its
    accuracy within :data:`ACCURACY_GAP` of the trained zoo's (``gap verdict``) and above both ensembles of
    its own narrow samples, the packed one and the probability average (``vs packed ensemble``: met when
    above both, missed when below either), each beyond two standard errors (:func:`protocol.verdict`,
    :func:`protocol.versus`); ``transfer verdict`` is ``"met"`` when both are, ``"missed"`` when either is,
    ``"level"`` otherwise. ``attrs`` holds the flow's label, the widths, ``k``, ``n`` and the seeds.
    """
    import pandas as pd

    chosen = width_transfer_choice(chosen)
    cfg = cnn_candidates()[chosen]
    n, steps = cnn_sizes()
    out = _cnn_width_transfer("cnn_digits", targets.ZOOS["cnn_digits"], CNN_WIDE_ZOO, targets.ZOOS[CNN_WIDE_ZOO],
                              targets.zoo_runs(CNN_WIDE_ZOO), cfg, int(n), int(steps), tuple(int(s) for s in seeds),
                              ACCURACY_GAP)
    table = pd.DataFrame(out["rows"]).T.loc[list(TRANSFER_ROWS)]
    table.attrs.update({k: v for k, v in out.items() if k != "rows"}, chosen=chosen)
    return table


def width_transfer_choice(chosen: str | None = None) -> str:
    """The flow of :func:`cnn_width_transfer`: ``chosen``, checked, or the channel flow chosen on the validation
    runs among the flows that can change width."""
    candidates = cnn_candidates()
    if chosen is None:
        validation = verdict_choice("cnn_digits", cnn_verdict_candidates("channel"), *cnn_sizes())[1]
        return choose({k: v for k, v in validation.items() if _transferable(candidates[k])})
    if chosen not in candidates:
        raise ValueError(f"cnn_width_transfer: {chosen!r} is not a CNN flow; one of {sorted(candidates)}")
    if not _transferable(candidates[chosen]):
        raise ValueError(f"cnn_width_transfer: {chosen!r} cannot change width (a flat field reads a weight vector "
                         "of one length)")
    return chosen


def _transferable(cfg: FlowConfig) -> bool:
    """Whether a CNN flow can be sampled at another width: a channel field (a flat field reads a weight vector
    of one length). Its anchor and a source centred on the mean training network go to the new width with
    it, widened by repeating their channels (:meth:`~wsbook.weightflow.ChannelField.with_spec`,
    :meth:`~wsbook.weightflow.EuclideanChart.with_spec`)."""
    return cfg.field == "channel"


def transfer_rows(split: protocol.RunSplit, wide: targets.Zoo, trained: dict[int, WeightFlow], n: int, steps: int,
                  accuracy_gap: float, widening: WidthChange | None = None) -> dict:
    """The computation of a width-transfer verdict (:func:`cnn_width_transfer`,
    :func:`wsbook.experiments.mnist_flows.width_transfer_verdict`; uncached): the flows ``trained`` (one per
    seed, trained on the networks of ``split``) against the trained wider zoo ``wide``, every set drawn with
    ``n`` networks and ``steps`` midpoint steps from the source points of seed ``seed + 1``. ``widening`` says
    how ``k`` narrow networks make one wide one and how a sample at the new width is rescaled (default: CNNs',
    :func:`cnn_widening`). Returns ``{"rows": {row: columns}, "k", "n", "seeds", ...}`` (the columns of
    :func:`cnn_width_transfer`)."""
    if len(trained) < 2:
        raise ValueError("transfer_rows: a standard error needs flows of at least 2 seeds")
    spec, wide_spec, ds = split.spec, wide.spec, split.data
    widening = widening or cnn_widening(spec, wide_spec)
    k, y = widening.k, ds.y_test

    def probs(s, theta):
        return targets.predictive_probs(s, theta, ds.x_test)

    def scores(p, seed):
        return probability_scores(p, y, generator=torch.Generator().manual_seed(seed), diversity=False)

    def draw(flow, size, seed):
        with torch.no_grad():
            return flow.sample(size, steps=steps, method="midpoint", generator=torch.Generator().manual_seed(seed))

    per: dict[str, list[dict]] = {r: [] for r in TRANSFER_ROWS}
    for run in wide.runs.tolist():    # the trained zoo: one unit per run, WIDE_CHECKPOINTS of it evenly spaced
        theta = wide.theta[wide.run == run]
        pick = torch.linspace(0, len(theta) - 1, min(WIDE_CHECKPOINTS, len(theta))).round().long()
        per["trained wide zoo"].append(scores(probs(wide_spec, theta[pick.to(theta.device)]), run))
    for seed, flow in trained.items():
        theta = widening.rescale(draw(flow.with_spec(wide_spec), n, seed + 1))
        per["flow at the new width"].append(scores(probs(wide_spec, theta), seed))
        narrow = draw(flow, n * k, seed + 1)                                 # k independent members per network
        per["packed ensemble"].append(scores(probs(wide_spec, widening.pack(narrow, seed)), seed))
        members = probs(spec, narrow)
        per["probability average"].append(scores(members.reshape(n, k, *members.shape[1:]).mean(1), seed))
        per["flow at its training width"].append(scores(members[::k], seed))
    rows = {}
    for label, units in per.items():
        rows[label] = {"seeds": len(units)}
        for col in ("accuracy", "nll", "bma_accuracy"):
            rows[label][col], rows[label][f"{col}_se"] = protocol.mean_se([u[col] for u in units])
    new, zoo_row = rows["flow at the new width"], rows["trained wide zoo"]
    gap = protocol.within(new["accuracy"], new["accuracy_se"], zoo_row["accuracy"], zoo_row["accuracy_se"],
                          accuracy_gap)
    # above both forms of the ensemble of k narrow samples: packed into one layer, and averaged
    above = _both(*(protocol.versus(new["accuracy"], new["accuracy_se"], rows[r]["accuracy"], rows[r]["accuracy_se"],
                                    "higher") for r in ("packed ensemble", "probability average")))
    verdicts = {"gap verdict": gap, "vs packed ensemble": above, "transfer verdict": _both(gap, above)}
    for label in rows:
        rows[label].update({c: (v if label == "flow at the new width" else "—") for c, v in verdicts.items()})
    return {"rows": rows, "k": k, "n": n, "seeds": list(trained), "wide_runs": len(wide.runs),
            "accuracy_gap": accuracy_gap, **widening.attrs}


def _both(*verdicts: str) -> str:
    """The verdict of criteria that must all hold: met when all are, missed when one is, level otherwise."""
    return "met" if all(v == "met" for v in verdicts) else "missed" if "missed" in verdicts else "level"


#: how a sentence says a verdict of a goal
GOAL_WORDS = {"met": "meets", "level": "is level with", "missed": "misses"}


def transfer_readings(table, wide: str) -> dict[str, str]:
    """The sentences that read a width-transfer verdict table (:func:`cnn_width_transfer`,
    :func:`wsbook.experiments.mnist_flows.width_transfer_verdict`); ``wide`` names the wider networks
    (``"16-channel CNNs"``). Returns ``{"accuracy": {row: "mean ± se"}, "reading": the flow at the new width
    against the trained wider networks and the packed ensemble with the verdicts, "context": the same flow at
    its training width, "goal": how the transfer stands to its goal ("meets", "is level with", "misses")}``."""
    gap = table.attrs["accuracy_gap"]
    new, own = table.loc["flow at the new width"], table.loc["flow at its training width"]
    acc = {r: f"{table.loc[r, 'accuracy']:.3f} ± {table.loc[r, 'accuracy_se']:.3f}" for r in table.index}
    gap_words = {"met": f"within {gap:g} of the trained networks",
                 "level": f"neither clearly within nor clearly beyond {gap:g} of the trained networks",
                 "missed": f"more than {gap:g} below the trained networks"}[new["gap verdict"]]
    packed_words = {"met": "more accurate than both",
                    "level": "not clearly more accurate than both",
                    "missed": "less accurate than one of them"}[new["vs packed ensemble"]]
    goal = GOAL_WORDS[new["transfer verdict"]]
    reading = (f"Sampled as {wide}, the flow's networks score {acc['flow at the new width']} against "
               f"{acc['trained wide zoo']} for trained {wide}, and {acc['packed ensemble']} and "
               f"{acc['probability average']} for the ensembles of its own narrow samples, packed into one layer "
               f"and averaged: {gap_words} and {packed_words} (beyond two standard errors where not level), so the "
               f"transfer {goal} its goal.")
    own_verdict = protocol.versus(new["accuracy"], new["accuracy_se"], own["accuracy"], own["accuracy_se"], "higher")
    context = {"met": "They are more accurate than the same flow's networks at its training width "
                      f"({acc['flow at its training width']}): widening adds to what the flow learned.",
               "level": f"At its training width the same flow's networks score {acc['flow at its training width']}: "
                        "the wider networks are about as accurate as the flow's own.",
               "missed": f"At its training width the same flow's networks score {acc['flow at its training width']}: "
                         "widening loses part of what the flow learned."}[own_verdict]
    return {"accuracy": acc, "reading": reading, "context": context, "goal": goal}


@dataclass(frozen=True)
class WidthChange:
    """How a width transfer widens networks: ``k`` narrow networks make one wide one (``pack(narrow [n * k, D],
    seed)`` -> ``[n, D_wide]``), and ``rescale(theta)`` divides the layers that read the new units of a sample at
    the new width so that their sums stay averages; ``attrs`` describes both widths for the table."""

    k: int
    pack: Callable[[Tensor, int], Tensor]
    rescale: Callable[[Tensor], Tensor]
    attrs: dict


def cnn_widening(spec: CNNSpec, wide_spec: CNNSpec) -> WidthChange:
    """:class:`WidthChange` for CNNs whose every layer has ``k`` times the channels: ``k`` networks packed side by
    side (:func:`~wsbook.nets.pack_cnns`), every layer after the first divided by ``k``."""
    from wsbook.nets import pack_cnns

    k = wide_spec.channels[0] // spec.channels[0]
    if tuple(c * k for c in spec.channels) != wide_spec.channels:
        raise ValueError(f"transfer_rows: {wide_spec} does not have {k} times the channels of {spec}")

    def rescale(theta: Tensor) -> Tensor:
        ws, bs = wide_spec.weights(theta), wide_spec.biases(theta)
        return wide_spec.pack([ws[0], *(w / k for w in ws[1:])], bs)

    return WidthChange(k, lambda narrow, seed: pack_cnns(spec, narrow, k)[1], rescale,
                       {"narrow_channels": list(spec.channels), "wide_channels": list(wide_spec.channels)})


@cached("flows/cnn_width_transfer", version=2)   # 2: above both packed ensembles
def _cnn_width_transfer(zoo_name: str, zoo: targets.ZooConfig, wide_name: str, wide: targets.ZooConfig,
                        wide_runs: int, cfg: FlowConfig, n: int, steps: int, seeds: tuple[int, ...],
                        accuracy_gap: float) -> dict:
    """:func:`cnn_width_transfer`, cached under both zoos' settings, the flow, the sizes and the seeds (the
    flows themselves are the verdict's: :func:`verdict_seed` trains them)."""
    trained = {seed: train_flow(zoo_name, cfg, seed=seed).flow for seed in seeds}
    return transfer_rows(zoo_split(zoo_name), targets.zoo(wide_name, n_runs=wide_runs), trained, n, steps,
                         accuracy_gap)


# ---------------------------------------------------------------------------------------------- splits
def zoo_split(name: str, n_holdout: int | None = None, seed: int = 0) -> protocol.RunSplit:
    """The seeded split of zoo ``name`` (:func:`wsbook.experiments.targets.zoo`) used by every flow
    experiment: ``n_holdout`` test runs (sealed), as many validation runs, the rest for training
    (:func:`wsbook.experiments.protocol.split_runs`).

    Args:
        name: the zoo (``"breast_cancer"``, ``"mnist5k"``, ``"mnist5k_w32"``).
        n_holdout: test runs, and as many validation runs (default: a fifth of the runs each, at least 2
            where the zoo has enough runs).
        seed: seeds the choice of runs.
    """
    z = targets.zoo(name)
    n_runs = len(z.runs)
    n_holdout = min((n_runs - 1) // 3, max(2, n_runs // 5)) if n_holdout is None else int(n_holdout)
    return protocol.split_runs(z, n_holdout, seed)


def build_field(spec, cfg: FlowConfig):
    """The untrained vector field of ``cfg`` for networks of ``spec``."""
    if cfg.field == "gnn":
        return gnn_field(spec, dim=cfg.dim, n_layers=cfg.n_layers, heads=cfg.heads, anchored=cfg.anchored,
                         global_context=cfg.global_context)
    if cfg.field == "channel":
        return ChannelField(spec, hidden=cfg.hidden, edge_dim=cfg.edge_dim, rounds=cfg.n_layers,
                            attention_layers=cfg.attention_layers, anchored=cfg.anchored)
    if cfg.field == "neuron":       # n_layers: attention layers of one hidden layer's set, or message-passing rounds
        layers = {"attention_layers" if len(spec.widths) == 3 else "rounds": cfg.n_layers}
        return NeuronField(spec, hidden=cfg.hidden, anchored=cfg.anchored, **layers)
    return FlatField(spec, hidden=cfg.hidden, depth=cfg.depth)


def build_flow(spec, cfg: FlowConfig, reference: Tensor | None = None, train: Tensor | None = None) -> WeightFlow:
    """The untrained :class:`~wsbook.weightflow.WeightFlow` of ``cfg`` for networks of ``spec``; an aligned
    chart matches every network to ``reference`` (one network, e.g. a split's ``reference``). A source
    centred on the training networks (``cfg.source == "mean"``) needs them: ``train [n, D]``."""
    kw = {} if cfg.sigma is None else {"sigma": cfg.sigma}
    if cfg.aligned:
        if reference is None:
            raise ValueError(f"build_flow: the aligned flow {cfg.name} needs a reference network")
        kw["reference"] = reference.reshape(-1).cpu()
    if cfg.chart != "euclidean":
        kw["last_layer"] = cfg.last_layer
    chart = make_chart(cfg.chart, spec, **kw)
    if cfg.source == "mean":
        if train is None:
            raise ValueError(f"build_flow: the flow {cfg.name} centres its source on the training networks; "
                             "pass them as train")
        chart = make_chart(cfg.chart, spec, **kw, loc=chart.to_points(train.cpu()).mean(0))
    return WeightFlow(chart, build_field(spec, cfg), coupling=cfg.coupling, align_pairs=cfg.align_pairs,
                      parametrization=cfg.parametrization, time_distribution=cfg.time_distribution,
                      loss_weighting=cfg.loss_weighting)


# -------------------------------------------------------------------------------------------- training
@dataclass
class TrainedFlow:
    """A trained flow with what it was trained by (a :class:`FlowConfig`, or the posterior flows' settings),
    its training seconds and per-step losses."""

    flow: WeightFlow
    config: object
    seconds: float
    losses: Tensor

    @property
    def field_parameters(self) -> int:
        """Trainable parameters of the vector field."""
        return sum(p.numel() for p in self.flow.field.parameters())


def fit_recipe(zoo_name: str, n_holdout: int | None, split_seed: int, cfg: FlowConfig, seed: int,
               **fit_kwargs) -> tuple[WeightFlow, FitResult]:
    """The flow ``cfg`` built under ``seed`` and fitted on the training runs of :func:`zoo_split` (not cached):
    the one training run of every flow of a table (:func:`train_flow`); ``fit_kwargs`` go to
    :meth:`WeightFlow.fit` (e.g. ``snapshot_steps``). Returns the flow and its fit."""
    split = zoo_split(zoo_name, n_holdout, split_seed)
    with config.seeded(seed):
        flow = build_flow(split.spec, cfg, split.reference, split.train.theta)
    fit = flow.fit(split.train.theta.cpu(), steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr,
                   ema_decay=cfg.ema_decay, generator=torch.Generator().manual_seed(seed),
                   **{"desc": f"flow {cfg.name}", **fit_kwargs})
    return flow, fit


@cached("flows/trained", version=8)   # 8: training runs exclude validation and test runs
def _train_flow(zoo_name: str, n_holdout: int | None, split_seed: int, cfg: FlowConfig, seed: int) -> dict:
    flow, fit = fit_recipe(zoo_name, n_holdout, split_seed, cfg, seed)
    return {"state": flow.state_dict(), "seconds": fit.seconds, "losses": fit.losses}


def train_flow(zoo_name: str, cfg: FlowConfig, *, n_holdout: int | None = None, split_seed: int = 0,
               seed: int = 0) -> TrainedFlow:
    """Train (or read from the cache) the flow ``cfg`` on the training runs of :func:`zoo_split`.

    Args:
        zoo_name: the zoo (``"breast_cancer"``, ``"mnist5k"``, ...).
        cfg: the flow and its budget (:func:`flow_config`, :func:`baseline_config`).
        n_holdout, split_seed: the split (:func:`zoo_split`).
        seed: the training run's randomness (source draws, minibatches, times).
    """
    out = _train_flow(zoo_name, n_holdout, split_seed, cfg, seed)
    return TrainedFlow(WeightFlow.from_state(out["state"]), cfg, float(out["seconds"]), out["losses"].cpu())


# -------------------------------------------------------------------------------------------- sampling
@cached("flows/samples", version=8)   # 8: flows of the three-way split
def _sample_flow(zoo_name: str, n_holdout: int | None, split_seed: int, cfg: FlowConfig, seed: int, n: int,
                 steps: int, method: str, guidance: float, guidance_schedule: str, sample_seed: int) -> dict:
    trained = train_flow(zoo_name, cfg, n_holdout=n_holdout, split_seed=split_seed, seed=seed)
    return _draw_networks(zoo_name, trained.flow, n, steps, method, guidance, guidance_schedule, sample_seed)


def _draw_networks(zoo_name: str, flow: WeightFlow, n: int, steps: int, method: str, guidance: float,
                   guidance_schedule: str, sample_seed: int, field: bool = True) -> dict:
    gen = torch.Generator().manual_seed(sample_seed)
    guide = None
    if guidance > 0:
        ds = targets.ZOOS[zoo_name].load_data(device="cpu")
        guide = Guidance(ds.x_train, ds.y_train, weight=guidance, schedule=guidance_schedule, batch_size=None,
                         generator=gen)
    start = time.perf_counter()
    with torch.no_grad():
        theta = flow.sample(n, steps=steps, method=method, generator=gen, guidance=guide, field=field)
    return {"theta": theta, "seconds": time.perf_counter() - start}


@cached("flows/guided_source", version=1)
def _guided_source(zoo_name: str, cfg: FlowConfig, seed: int, n: int, steps: int, guidance: float,
                   sample_seed: int) -> dict:
    flow = train_flow(zoo_name, cfg, seed=seed).flow
    return _draw_networks(zoo_name, flow, n, steps, "midpoint", guidance, "linear", sample_seed, field=False)


def guided_source(zoo_name: str, candidate: "Guided", n: int, steps: int, *, seed: int = 0,
                  sample_seed: int = 1) -> Tensor:
    """The control of a guided draw (cached): ``n`` points of the source of ``candidate``'s flow (trained with
    ``seed``), moved by the same guidance alone with the same solver, the learned field left out
    (:meth:`WeightFlow.sample` with ``field=False``); the same source points as :func:`draw` with the same
    ``sample_seed``, and :func:`draw`'s solver (midpoint) and schedule (linear). If these networks scored
    like the guided flow's, the guidance would be doing the work."""
    if not isinstance(candidate, Guided):
        raise TypeError(f"guided_source: needs a Guided candidate; got {type(candidate).__name__}")
    return _guided_source(zoo_name, candidate.config, seed, n, steps, candidate.weight, sample_seed)["theta"]


def sample_flow(zoo_name: str, cfg: FlowConfig, n: int, *, steps: int = 16, method: str = "midpoint",
                guidance: float = 0.0, guidance_schedule: str = "linear", n_holdout: int | None = None,
                split_seed: int = 0, seed: int = 0, sample_seed: int = 1) -> tuple[Tensor, float]:
    """``n`` networks from the trained flow ``cfg`` (cached): ``(theta [n, D], seconds)``.

    Args:
        zoo_name, cfg, n_holdout, split_seed, seed: the flow, as in :func:`train_flow`.
        n: networks to draw.
        steps, method: the ODE solver (``"euler"``, ``"midpoint"``, ``"rk4"``).
        guidance: the weight lambda of task-loss guidance on the full training set (0: none).
        guidance_schedule: ``"constant"``, ``"linear"`` or ``"quadratic"`` (see :class:`Guidance`).
        sample_seed: draws the source points and guidance minibatches.
    """
    if n < 1 or steps < 1:
        raise ValueError(f"sample_flow: n and steps must be positive; got {n}, {steps}")
    if guidance < 0:
        raise ValueError(f"sample_flow: guidance must be >= 0; got {guidance}")
    out = _sample_flow(zoo_name, n_holdout, split_seed, cfg, seed, n, steps, method, float(guidance),
                       guidance_schedule, sample_seed)
    return out["theta"], float(out["seconds"])


# ------------------------------------------------------------------------------------------------ scoring
@dataclass
class References:
    """What every generated set is compared with: one group of held-out runs (validation or test).

    Attributes:
        split: the zoo split.
        on: ``"validation"`` or ``"test"``: which runs are the reference.
        n: networks per generated set (the floor draws as many).
        held, probs_held: the reference runs and their test-split probabilities ``[k, N, C]``.
        source: the perfect generator's runs (the ``other`` training runs against validation; the validation
            runs against test) and ``probs_source``, their probabilities.
        bandwidth: the MMD kernel bandwidth shared by all rows (median heuristic on reference and source).
        floor: the perfect generator's MMD^2 (:func:`~wsbook.experiments.protocol.perfect_generator_floor`).
        canonical: the chart that puts networks in the aligned, canonical weight space (weight matching
            to the split's reference, every hidden neuron normalised): distances there ignore both symmetries.
        train_points, held_points: the training zoo and the reference runs in that space; nn_held: median
            nearest-neighbour distance from ``w2_n`` reference networks to the training zoo (the memorisation
            yardstick); d_held: every reference network's nearest-neighbour distance to the training zoo
            (:func:`nn_ratio_interval` resamples it); nn_held_se: the yardstick's standard error over reference
            runs resampled whole
            (:func:`~wsbook.experiments.protocol.run_bootstrap_medians`: a run's checkpoints are alike, so the
            run is the independent unit; with a handful of reference runs it reads the spread low).
        w2_n: networks per set in the W2 distances; w2_floor: W2 between ``w2_n`` source and reference
            networks.
    """

    split: protocol.RunSplit
    on: str
    n: int
    held: targets.Zoo
    probs_held: Tensor
    source: targets.Zoo
    probs_source: Tensor
    bandwidth: float
    floor: protocol.Floor
    canonical: GeometricChart
    train_points: Tensor
    held_points: Tensor
    nn_held: float
    d_held: Tensor
    nn_held_se: float
    w2_n: int
    w2_floor: float

    @property
    def mmd2_floor(self) -> float:
        return self.floor.mean


def _rows(n_total: int, k: int, gen: torch.Generator) -> Tensor:
    return protocol.iid_rows(n_total, k, gen)


def _references(split: protocol.RunSplit, held: targets.Zoo, source: targets.Zoo, on: str, n: int, w2_n: int,
                max_train: int, seed: int) -> References:
    gen = torch.Generator().manual_seed(seed)
    x_test = split.data.x_test
    p_held = targets.predictive_probs(split.spec, held.theta, x_test)
    p_source = targets.predictive_probs(split.spec, source.theta, x_test)
    h = distances.median_bandwidth(p_held, p_source, generator=gen)
    floor = protocol.perfect_generator_floor(p_source, source.run, p_held, n, h, seed=seed)
    canon = GeometricChart(split.spec, reference=split.reference[0].cpu())
    train = split.train.theta[_rows(len(split.train), max_train, gen)].cpu()
    train_pts, held_pts, source_pts = (canon.to_points(t) for t in (train, held.theta.cpu(), source.theta.cpu()))
    held_q = held_pts[_rows(len(held_pts), w2_n, gen)]
    nn_held = float(distances.median_nn_distance(held_q, train_pts))
    w2_floor = float(distances.wasserstein2(source_pts[_rows(len(source_pts), w2_n, gen)], held_q))
    # the yardstick's spread over other reference runs, each replicate subsampled as nn_held was
    d_held = distances.nearest_neighbour_distances(held_pts, train_pts)
    spread = protocol.run_bootstrap_medians(d_held, held.run.cpu(), size=w2_n, seed=seed + 1)
    nn_held_se = float(spread.std())
    return References(split, on, n, held, p_held, source, p_source, h, floor, canon, train_pts, held_pts, nn_held,
                      d_held, nn_held_se, w2_n, w2_floor)


def references(split: protocol.RunSplit, n: int, w2_n: int = 128, max_train: int = 4000,
               seed: int = 0) -> References:
    """The validation references of a split (see :class:`References`): every distance to the validation
    runs, the floor drawn from as many training runs. Everything a chapter chooses is read from these; the
    test runs are reached only by :func:`test_report`.

    Args:
        split: from :func:`zoo_split`.
        n: networks per generated set (the perfect generator draws as many).
        w2_n: networks per set in every W2 (W2 between finite sets depends on their size, so one size for all).
        max_train: the training zoo is subsampled to this many networks for nearest-neighbour distances.
        seed: the subsamples.
    """
    return _references(split, split.validation, split.other, "validation", n, w2_n, max_train, seed)


#: networks of a set that enter its diversity (pairwise, so quadratic in the set's size)
DIVERSITY_MAX = 256


def probability_scores(probs: Tensor, y: Tensor, *, bma_k: int = 64,
                       generator: torch.Generator | None = None, diversity: bool = True) -> dict:
    """The function columns of every results table from a set's test probabilities ``probs [n, N, C]`` and
    labels ``y [N]``: ``n``, ``accuracy``, ``accuracy_std``, ``nll``, ``nll_std`` (over networks),
    ``bma_accuracy`` and ``bma_nll`` (the model average of ``bma_k`` members drawn with ``generator``) and,
    unless ``diversity`` is false, ``diversity`` (mean pairwise Jensen-Shannon divergence of the predictive
    distributions of at most :data:`DIVERSITY_MAX` networks; quadratic in their number)."""
    ev = targets.evaluate_probs(probs, y, bma_k=bma_k, generator=generator)
    row = dict(n=ev.n, accuracy=ev.accuracy, accuracy_std=ev.accuracy_std, nll=ev.nll, nll_std=ev.nll_std,
               bma_accuracy=ev.bma_accuracy, bma_nll=ev.bma_nll)
    if diversity:
        row["diversity"] = float(distances.diversity(probs[:DIVERSITY_MAX]))
    return row


def score(theta: Tensor, refs: References, *, bma_k: int = 64, seed: int = 0) -> dict:
    """Score generated networks ``theta [n, D]`` against the references.

    Returns a dict: the :func:`probability_scores` on the data's test split (``accuracy``, ``accuracy_std``,
    ``nll``, ``nll_std``, ``bma_accuracy``, ``bma_nll``, ``diversity``), ``mmd2`` (to the reference runs)
    and ``mmd2_floor`` (the perfect generator's), ``mmd_ratio`` (``mmd2 / floor``: a perfect generator reads
    1), ``nn_train`` (median nearest-neighbour distance to the training zoo in the aligned canonical space),
    ``nn_held`` (the same for the reference runs) and ``nn_ratio`` (their ratio: below 1, nearer the
    training checkpoints than new runs), ``w2`` and ``w2_floor`` (to ``w2_n`` reference networks).

    Args:
        theta: the networks (ordinary weights of the split's architecture).
        refs: from :func:`references` (or inside :func:`test_report`).
        bma_k: members of the model average.
        seed: the subsamples (model average, W2 sets).
    """
    split = refs.split
    theta = split.spec.check(theta, "theta")
    gen = torch.Generator().manual_seed(seed)
    probs = targets.predictive_probs(split.spec, theta, split.data.x_test)
    row = probability_scores(probs, split.data.y_test, bma_k=bma_k, generator=gen)
    mmd = float(distances.mmd2(probs, refs.probs_held, bandwidth=refs.bandwidth))
    pts = refs.canonical.to_points(theta.cpu())
    q = pts[_rows(len(pts), refs.w2_n, gen)]
    held_q = refs.held_points[_rows(len(refs.held_points), refs.w2_n, torch.Generator().manual_seed(seed + 1))]
    nn_train = float(distances.median_nn_distance(q, refs.train_points))
    return row | dict(mmd2=mmd, mmd2_floor=refs.floor.mean, mmd_ratio=mmd / refs.floor.mean, nn_train=nn_train,
                      nn_held=refs.nn_held, nn_ratio=nn_train / refs.nn_held,
                      w2=float(distances.wasserstein2(q, held_q)), w2_floor=refs.w2_floor)


def score_draws(zoo_name: str, cfg: FlowConfig, refs: References, n: int, *, steps: int = 16,
                sample_seeds: tuple[int, ...] = (1, 2, 3, 4), **kwargs):
    """:func:`score` of several sets of ``n`` networks from one trained flow, each from other source points
    (``sample_seeds``; seed 1 is :func:`sample_flow`'s default, the tables' set). One set of networks is one
    draw: its MMD ratio varies with the source points alone (by how much: docs/tuning-log.md). Returns a
    DataFrame with one row per sample seed; ``kwargs`` go to :func:`sample_flow`."""
    import pandas as pd

    if not sample_seeds:
        raise ValueError("score_draws: needs at least one sample seed")
    return pd.DataFrame({k: score(sample_flow(zoo_name, cfg, n, steps=steps, sample_seed=k, **kwargs)[0], refs)
                         for k in sample_seeds}).T.rename_axis("sample_seed")


def nn_ratio_interval(theta: Tensor, refs: References, *, level: float = 0.95, n_boot: int = 1000,
                      seed: int = 0) -> dict:
    """How much nearer to the training zoo generated networks are than the reference runs, with its
    uncertainty.

    The ratio is the median nearest-neighbour distance (aligned canonical space) of ``theta`` to the
    training zoo over the same median for *all* reference networks. The bootstrap interval resamples the
    generated networks and the reference runs as whole runs: a run's checkpoints are near-copies, so the run,
    not the checkpoint, is the independent unit. Returns ``{"ratio", "low", "high"}``.
    """
    if not 0 < level < 1 or n_boot < 2:
        raise ValueError(f"nn_ratio_interval: level must be in (0, 1) and n_boot at least 2; got {level}, {n_boot}")
    gen = torch.Generator().manual_seed(seed)
    train = refs.train_points
    d_gen = distances.nearest_neighbour_distances(refs.canonical.to_points(theta.cpu()), train)
    held = protocol.run_bootstrap_medians(refs.d_held, refs.held.run.cpu(), n_boot=n_boot, seed=seed + 1)
    rows = torch.randint(len(d_gen), (n_boot, len(d_gen)), generator=gen)
    ratios = d_gen[rows].median(dim=1).values / held
    tail = (1 - level) / 2
    return {"ratio": float(d_gen.median() / refs.d_held.median()), "low": float(ratios.quantile(tail)),
            "high": float(ratios.quantile(1 - tail))}


#: the control rows of every table, in order: a perfect generator (iid across runs that are not the
#: reference runs: reads 1 by construction of the floor), copies of the zoo (iid training checkpoints) and a
#: collapsed generator (the checkpoints of a single training run)
CONTROLS = ("perfect generator", "iid training checkpoints", "one run")


def control_sets(refs: References, n: int, seed: int = 0) -> dict[str, Tensor]:
    """The networks of the :data:`CONTROLS` rows, ``n`` each (the one run: all its checkpoints, at most
    ``n``); ``seed`` picks the networks and the run."""
    gen = torch.Generator().manual_seed(seed)
    source, train = refs.source.theta, refs.split.train.theta
    runs = refs.split.train.runs
    one = refs.split.train.select(refs.split.train.run == runs[int(torch.randint(len(runs), (1,), generator=gen))])
    return {"perfect generator": source[_rows(len(source), n, gen).to(source.device)],
            "iid training checkpoints": train[_rows(len(train), n, gen).to(train.device)],
            "one run": one.theta[_rows(len(one), n, gen).to(one.theta.device)]}


def target_rows(refs: References, n: int, *, bma_k: int = 64, seed: int = 0) -> dict[str, dict]:
    """The :data:`CONTROLS` rows scored by :func:`score` (see :func:`control_sets`)."""
    return {k: score(theta, refs, bma_k=bma_k, seed=seed) for k, theta in control_sets(refs, n, seed).items()}


# ------------------------------------------------------------------------------------------ the verdict
#: the columns of :func:`test_report` read as mean +- standard error over seeds
REPORT_COLUMNS = ("accuracy", "bma_nll", "mmd_ratio", "nn_ratio")

#: the accuracy goal of the MNIST and CNN pages: a generated network's mean accuracy within this of the
#: target's
ACCURACY_GAP = 0.03


def _test_table(test: targets.Zoo, *, split: protocol.RunSplit, sets: dict[str, list[Tensor]], n: int,
                seeds: int, mmd_goal: float, nn_goal: tuple[float, float], anchor: str, accuracy_gap: float | None):
    import pandas as pd

    refs = _references(split, test, split.validation, "test", n, w2_n=128, max_train=4000, seed=0)
    scored = {k: [score(t, refs) for t in thetas] for k, thetas in sets.items()}
    for s in range(seeds):
        for k, theta in control_sets(refs, n, seed=1000 + s).items():
            scored.setdefault(k, []).append(score(theta, refs, seed=s))
    rows = {}
    for label, runs in scored.items():
        row = {"seeds": len(runs)}
        for col in REPORT_COLUMNS:
            if col == "mmd_ratio":
                row[col], row[f"{col}_se"] = refs.floor.ratio([r["mmd2"] for r in runs])
            elif col == "nn_ratio":      # the yardstick is an estimate too: its spread enters the error
                row[col], row[f"{col}_se"] = protocol.ratio([r["nn_train"] for r in runs], refs.nn_held,
                                                            refs.nn_held_se)
            else:
                row[col], row[f"{col}_se"] = protocol.mean_se([r[col] for r in runs])
        rows[label] = row
    table = pd.DataFrame(rows).T
    table["MMD² verdict"] = [protocol.verdict(r.mmd_ratio, r.mmd_ratio_se, mmd_goal) for r in table.itertuples()]
    table["memorisation verdict"] = [protocol.bound_verdict(r.nn_ratio, r.nn_ratio_se, *nn_goal)
                                     for r in table.itertuples()]
    others = [r for r in table.index if r != anchor]
    protocol.versus_column(table, "accuracy verdict", "accuracy", others, anchor, better="higher")
    protocol.versus_column(table, "BMA-64 NLL verdict", "bma_nll", others, anchor)
    if accuracy_gap is not None:
        a = table.loc[anchor]
        table["gap verdict"] = [protocol.within(table.loc[r, "accuracy"], table.loc[r, "accuracy_se"], a["accuracy"],
                                                a["accuracy_se"], accuracy_gap) if r in sets else "—"
                                for r in table.index]
    table.attrs.update(floor=refs.floor, on="test", runs=split.run_counts(), n=n, mmd_goal=mmd_goal,
                       nn_goal=nn_goal, nn_held=(refs.nn_held, refs.nn_held_se), anchor=anchor,
                       accuracy_gap=accuracy_gap)
    return table


def test_report(split: protocol.RunSplit, sets: dict[str, list[Tensor]], n: int, *, seeds: int = 3,
                mmd_goal: float = protocol.MMD_GOAL, nn_goal: tuple[float, float] = protocol.NN_GOAL,
                anchor: str = "iid training checkpoints", accuracy_gap: float | None = None):
    """The verdict table on the test runs (:func:`wsbook.experiments.protocol.final_report`): the only
    function that reads them.

    Every generated set of ``sets`` (one tensor of ``n`` networks per training seed of its flow) and
    ``seeds`` draws of each :data:`CONTROLS` row are scored against the test runs with the perfect
    generator's floor drawn from the validation runs. Returns a DataFrame, one row per set: ``seeds``, the
    mean and standard error (``*_se``) of :data:`REPORT_COLUMNS`, and the verdict columns (see
    :func:`wsbook.experiments.protocol.verdict`): MMD^2 ratio at most ``mmd_goal``; nearest-neighbour ratio
    at least ``nn_goal[0]`` with its lower 2-se bound at least ``nn_goal[1]``
    (:func:`~wsbook.experiments.protocol.bound_verdict`); accuracy and BMA-64 NLL against the ``anchor``
    row (no worse: *level* or *met*); with ``accuracy_gap``, a ``gap verdict`` for every set of ``sets``:
    the ``anchor`` row's accuracy minus the set's at most ``accuracy_gap``. ``table.attrs`` holds the floor,
    the run counts, the goals and ``nn_held`` (the test runs' yardstick and its standard error). Both ratios
    divide by estimates whose standard errors enter the ratios' (:func:`~wsbook.experiments.protocol.ratio`):
    the floor's spread over its draws from the validation runs, and the spread of the test runs' median
    distance to the training zoo over those runs resampled whole.
    """
    if not sets or any(len(v) < 2 for v in sets.values()):
        raise ValueError("test_report: every set needs at least 2 seeds (a mean and a standard error)")
    clash = set(sets) & set(CONTROLS)
    if clash:
        raise ValueError(f"test_report: {sorted(clash)} name control rows")
    return protocol.final_report(_test_table, split.test, split=split, sets=sets, n=n, seeds=seeds,
                                 mmd_goal=mmd_goal, nn_goal=nn_goal, anchor=anchor, accuracy_gap=accuracy_gap)




@dataclass(frozen=True)
class Guided:
    """A candidate of a verdict table: the flow ``config``, trained as it is, drawn with task-loss guidance
    of weight ``weight`` on the full training set (:func:`sample_flow`'s ``guidance``, linear schedule).
    Guidance is a way of drawing, not of training, so a weight costs no training."""

    config: FlowConfig
    weight: float

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError(f"Guided: the guidance weight must be positive; got {self.weight}")


#: the row of a verdict table whose chosen flow is guided: its source moved by the same guidance alone
GUIDANCE_CONTROL = "the flow's source + the same guidance"


def guided_label(label: str, weight: float) -> str:
    """The table label of flow ``label`` drawn with guidance ``weight``: ``"<label>, guided λ=<weight>"``."""
    return f"{label}, guided λ={weight:g}"


def with_guidance(candidates: dict[str, FlowConfig], weights: tuple[float, ...],
                  unguided: tuple[str, ...] = ("plain baseline",)) -> dict[str, "FlowConfig | Guided"]:
    """``candidates`` and, for every one not in ``unguided``, the same flow drawn with each guidance weight
    of ``weights`` (:class:`Guided`, labelled by :func:`guided_label`): the choice of a verdict table then
    reads the weight on the validation runs with the flow."""
    out: dict[str, FlowConfig | Guided] = dict(candidates)
    for label, cfg in candidates.items():
        if label not in unguided:
            out.update({guided_label(label, w): Guided(cfg, float(w)) for w in weights})
    return out


def trained_as(candidate: "FlowConfig | Guided") -> FlowConfig:
    """The flow a verdict candidate draws from (a :class:`Guided` one draws from its unguided flow)."""
    return candidate.config if isinstance(candidate, Guided) else candidate


def draw(zoo_name: str, candidate: "FlowConfig | Guided", n: int, steps: int, **kwargs) -> tuple[Tensor, float]:
    """``n`` networks of a verdict candidate (a flow, or a :class:`Guided` one) with ``steps`` solver steps:
    ``(theta [n, D], seconds)`` as :func:`sample_flow` (``kwargs`` pick the training seed and the source
    points)."""
    weight = candidate.weight if isinstance(candidate, Guided) else 0.0
    return sample_flow(zoo_name, trained_as(candidate), n, steps=steps, guidance=weight, **kwargs)


def draw_cost(zoo_name: str, candidate: "FlowConfig | Guided", n: int, steps: int) -> tuple[Tensor, float]:
    """A candidate's seed-0 draw (:func:`draw`) and what it cost end to end: ``(theta [n, D], seconds of the
    flow's training plus that draw)``; both cached."""
    theta, seconds = draw(zoo_name, candidate, n, steps)
    return theta, train_flow(zoo_name, trained_as(candidate)).seconds + seconds


def choose(validation: dict[str, dict]) -> str:
    """The flow the tables choose from its candidates' validation scores (:func:`score` against the validation
    runs): the lowest MMD^2 among those no nearer the training zoo than validation runs are (nearest-neighbour
    ratio at least 1; all candidates when none is)."""
    return protocol.select_best(validation, "mmd2", admissible=lambda s: s["nn_ratio"] >= 1)


def verdict_table(zoo_name: str, candidates: dict[str, FlowConfig | Guided], n: int, steps: int, *,
                  baselines: tuple[str, ...] = ("plain baseline",), seeds: tuple[int, ...] = protocol.SEEDS, **goals):
    """The protocol end to end: choose on validation runs, train the chosen flow over ``seeds``, judge on
    test runs.

    Every candidate's seed-0 sample (``n`` networks, ``steps`` midpoint steps, :func:`draw`: a flow, or a
    :class:`Guided` one) is scored
    against the validation runs; the chosen flow is the one with the lowest MMD^2 among those no nearer to
    the training zoo than validation runs are (nearest-neighbour ratio at least 1; all candidates when none
    is). The chosen flow and every ``baselines`` label are then trained once per seed of ``seeds`` (fresh
    seeds: the draw the choice read is not reused), each seed sampled with its own source points, and
    :func:`test_report` scores them on the test runs; when the chosen candidate is :class:`Guided`, two rows
    are scored beside it, from the same trained flows and source points: the flow drawn without guidance
    (its unguided candidate's label) and :data:`GUIDANCE_CONTROL` (the source moved by the same guidance
    alone, :func:`guided_source`). ``goals`` go to :func:`test_report`.

    Returns the table of :func:`test_report` with ``attrs["selected"]`` (the chosen label) and
    ``attrs["validation"]`` (every candidate's validation scores).
    """
    missing = [b for b in baselines if b not in candidates]
    if missing:
        raise ValueError(f"verdict_table: baselines {missing} are not among the candidates")
    return with_floor(_verdict_table(zoo_name, targets.ZOOS[zoo_name], dict(candidates), int(n), int(steps),
                                     tuple(baselines), tuple(seeds), goals))


def floor_as_fields(table):
    """``table`` with its ``attrs["floor"]`` as a dict of the floor's fields (what a cache entry can hold)."""
    table.attrs["floor"] = dataclasses.asdict(table.attrs["floor"])
    return table


def with_floor(table):
    """The inverse of :func:`floor_as_fields`."""
    table.attrs["floor"] = protocol.Floor(**table.attrs["floor"])
    return table


def verdict_choice(zoo_name: str, candidates: dict[str, FlowConfig | Guided], n: int, steps: int,
                   baselines: tuple[str, ...] = ("plain baseline",)) -> tuple[str, dict[str, dict]]:
    """The choice of :func:`verdict_table`: ``(chosen label, every candidate's validation scores)``, each
    candidate's seed-0 sample scored against the validation runs by :func:`score`, the baselines left out of
    the choice by :func:`choose`."""
    return _verdict_choice(zoo_name, targets.ZOOS[zoo_name], dict(candidates), int(n), int(steps), tuple(baselines))


@cached("flows/zoo_choice", version=1)
def _verdict_choice(zoo_name: str, zoo: targets.ZooConfig, candidates: dict[str, FlowConfig | Guided], n: int,
                    steps: int, baselines: tuple[str, ...]) -> tuple[str, dict[str, dict]]:
    """:func:`verdict_choice`, cached under the zoo's and the candidates' settings (every training seed of a
    table reads it)."""
    refs = references(zoo_split(zoo_name), n)
    validation = {label: score(draw(zoo_name, cfg, n, steps)[0], refs) for label, cfg in candidates.items()}
    return choose({k: v for k, v in validation.items() if k not in baselines}), validation


def verdict_seed(zoo_name: str, candidates: dict[str, FlowConfig | Guided], n: int, steps: int, seed: int,
                 baselines: tuple[str, ...] = ("plain baseline",)) -> dict[str, Tensor]:
    """One training seed of :func:`verdict_table`: the chosen flow (:func:`verdict_choice`) and every baseline
    trained with ``seed`` and sampled from the source points of ``seed + 1`` (both cached), ``{label: theta}``.
    The command line computes each seed on its own (``verdict/<zoo>/seed/<seed>``), so that ``--jobs`` trains
    the seeds side by side."""
    chosen, _ = verdict_choice(zoo_name, candidates, n, steps, baselines)
    return {label: draw(zoo_name, candidates[label], n, steps, seed=seed, sample_seed=seed + 1)[0]
            for label in (chosen, *baselines)}


@cached("flows/zoo_verdict", version=5)   # 5: the yardstick's spread in the nn ratio's error
def _verdict_table(zoo_name: str, zoo: targets.ZooConfig, candidates: dict[str, FlowConfig | Guided], n: int,
                   steps: int, baselines: tuple[str, ...], seeds: tuple[int, ...], goals: dict):
    """:func:`verdict_table`, cached under the zoo's and the candidates' settings."""
    chosen, validation = verdict_choice(zoo_name, candidates, n, steps, baselines)
    per_seed = [verdict_seed(zoo_name, candidates, n, steps, s, baselines) for s in seeds]
    sets = {label: [drawn[label] for drawn in per_seed] for label in (chosen, *baselines)}
    if isinstance(candidates[chosen], Guided):
        # what the guidance bought: the same flows and source points without it, and without the field
        unguided = next((label for label, c in candidates.items() if c == candidates[chosen].config), None)
        if unguided is not None and unguided not in sets:
            sets[unguided] = [draw(zoo_name, candidates[unguided], n, steps, seed=s, sample_seed=s + 1)[0]
                              for s in seeds]
        sets[GUIDANCE_CONTROL] = [guided_source(zoo_name, candidates[chosen], n, steps, seed=s, sample_seed=s + 1)
                                  for s in seeds]
    table = test_report(zoo_split(zoo_name), sets, n, **goals)
    protocol.versus_column(table, "MMD² vs baseline", "mmd_ratio", [chosen], baselines[0])
    table.attrs.update(selected=chosen, validation=validation)
    return floor_as_fields(table)


# ---------------------------------------------------------------------------------------- steps and Adam
def steps_curve(zoo_name: str, cfg: FlowConfig, steps_list: tuple[int, ...], n: int, *,
                guidance: tuple[float, ...] = (0.0,), method: str = "euler", **kwargs) -> list[dict]:
    """Test accuracy and NLL of ``n`` samples of the flow ``cfg`` for every number of solver steps in
    ``steps_list`` and every guidance weight (thesis Fig. 7.3): one dict per (steps, guidance) with
    ``flow``, ``steps``, ``guidance``, ``accuracy``, ``nll`` (means over networks) and ``seconds``.
    Further keyword arguments go to :func:`sample_flow`."""
    ds = targets.ZOOS[zoo_name].load_data()
    spec = targets.ZOOS[zoo_name].spec
    rows = []
    for lam in guidance:
        for k in steps_list:
            theta, seconds = sample_flow(zoo_name, cfg, n, steps=int(k), method=method, guidance=lam, **kwargs)
            ev = targets.evaluate(spec, theta, ds, bma_k=1)
            rows.append(dict(flow=cfg.name, steps=int(k), guidance=float(lam), accuracy=ev.accuracy, nll=ev.nll,
                             seconds=seconds))
    return rows


@cached("flows/adam_curve", version=1)
def _adam_curve(cfg: targets.ZooConfig, steps_list: tuple[int, ...], n: int, seed: int) -> dict:
    ds = cfg.load_data()
    spec = cfg.spec
    gen = torch.Generator().manual_seed(seed)
    theta0 = (torch.randn(n, spec.n_params, generator=gen) * cfg.init_std).to(ds.x_train)
    every = math.gcd(*steps_list)
    res = train_population(spec, theta0, ds.x_train, ds.y_train, steps=max(steps_list), lr=cfg.lr,
                           optimizer=cfg.optimizer, batch_size=cfg.batch_size, momentum=cfg.momentum,
                           weight_decay=cfg.weight_decay, checkpoint_every=every, generator=gen, progress=False)
    at = {s: i for i, s in enumerate(res.checkpoint_steps)}
    return {"theta": torch.stack([res.checkpoints[at[k]] for k in steps_list])}       # [len(steps), n, D]


def adam_curve(zoo_name: str, steps_list: tuple[int, ...], n: int, seed: int = 0) -> list[dict]:
    """``n`` fresh runs of the zoo's own optimiser from its initialisation, scored after every number of
    optimisation steps in ``steps_list`` (the thesis's "Target (Adam)" curve of Fig. 7.3): one dict per
    step count with ``flow`` (the optimiser's name), ``steps``, ``accuracy``, ``nll``."""
    cfg = targets.ZOOS[zoo_name]
    steps_list = tuple(int(k) for k in steps_list)
    if not steps_list or min(steps_list) < 1:
        raise ValueError(f"adam_curve: steps_list must hold positive step counts; got {steps_list}")
    thetas = _adam_curve(cfg, steps_list, n, seed)["theta"]
    ds = cfg.load_data()
    rows = []
    for k, theta in zip(steps_list, thetas):
        ev = targets.evaluate(cfg.spec, theta, ds, bma_k=1)
        rows.append(dict(flow=cfg.optimizer, steps=k, guidance=0.0, accuracy=ev.accuracy, nll=ev.nll, seconds=0.0))
    return rows


__all__ = ["FlowConfig", "fit_recipe", "flow_config", "extended_config", "EXTENDED_STEPS", "baseline_config",
           "VARIANTS", "solver_steps", "zoo_split", "build_field", "build_flow",
           "TrainedFlow", "train_flow", "sample_flow", "References", "references", "probability_scores", "score",
           "score_draws",
           "target_rows", "CONTROLS", "control_sets", "test_report", "choose", "verdict_choice",
           "verdict_seed", "verdict_table", "breast_cancer_candidates", "cnn_candidates", "cnn_sizes",
           "cnn_verdict_table", "cnn_verdict_candidates", "CNN_VERDICT_FIELDS", "equivariant_against_flat",
           "ACCURACY_GAP", "SOURCES",
           "CNN_MEAN_SOURCE_SIGMA",
           "CNN_WIDE_ZOO", "TRANSFER_ROWS", "cnn_width_transfer", "transfer_rows", "WidthChange", "cnn_widening",
           "GOAL_WORDS", "transfer_readings",
           "nn_ratio_interval", "steps_curve", "adam_curve"]
