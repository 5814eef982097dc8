"""``WeightFlow``: (Riemannian) conditional flow matching over populations of networks.

A flow is a chart (:mod:`wsbook.weightflow.charts`), a vector field over weights ``field(t, x)``
(:mod:`wsbook.weightflow.fields`) and a few choices:

* the **parametrisation** of the field's output: ``"velocity"`` (the output is a weight-space velocity,
  mapped to a tangent vector by the chart), or ``"endpoint"`` (the output is a guess ``x1_hat`` of where the
  path ends, turned into the velocity ``(x1_hat - x_t) / (1 - t)`` in Euclidean charts and
  ``log_{x_t}(x1_hat) / (1 - t)`` on the spheres, the conditional field of the straight or geodesic path
  evaluated at the guess);
* the **coupling** of source and target minibatches: ``"independent"`` or ``"ot"`` (exact minibatch OT with
  the squared distance of the chart's own manifold: geodesic on the spheres; a permutation, no pairs drawn
  with replacement);
* the **time distribution** of training: ``"uniform"`` or ``"beta(1,2)"`` (the thesis's choice, more
  weight on early times).

Training regresses the field onto the conditional velocity of the path (Lipman et al. 2023; Chen & Lipman
2024 on manifolds), each layer's error in units of its scale; sampling integrates with
:func:`wsbook.flows.solve_ode` (Euler, midpoint, RK4; exponential-map steps on the spheres); likelihoods
use :func:`wsbook.flows.log_likelihood` (the instantaneous change of variables with the divergence of the
tangent-projected field). Book chapter 7.
"""
from __future__ import annotations

import copy
import numbers
from dataclasses import dataclass, field as dataclass_field
from typing import Iterable

import torch
from torch import Tensor, nn

from wsbook import distributed
from wsbook.flows import (GeodesicPath, LinearPath, LikelihoodResult, ODEResult, log_likelihood, make_coupling,
                          solve_ode)
from wsbook.loop import EMA, Minibatches, descend, make_optimizer, to_device
from wsbook.manifolds import Euclidean
from wsbook.nets import NetSpec
from wsbook.weightflow.charts import Chart, _align, chart_from_config
from wsbook.weightflow.fields import WeightField, field_from_config
from wsbook.weightflow.guidance import Guidance

PARAMETRIZATIONS = ("velocity", "endpoint")
TIME_DISTRIBUTIONS = ("uniform", "beta(1,2)")
COUPLINGS = ("independent", "ot")
LOSS_WEIGHTINGS = ("chart", "layer")
#: latest training time: the geodesic path's field is singular at t = 1
T_MAX = 1.0 - 1e-3


def sample_times(n: int, distribution: str = "uniform", generator: torch.Generator | None = None) -> Tensor:
    """``n`` training times: ``"uniform"`` on [0, 1] or ``"beta(1,2)"`` (density 2 (1 - t), drawn by the
    inverse CDF ``t = 1 - sqrt(1 - u)``)."""
    u = torch.rand(n, generator=generator)
    if distribution == "uniform":
        return u
    if distribution == "beta(1,2)":
        return 1 - torch.sqrt(1 - u)
    raise ValueError(f"sample_times: distribution must be one of {TIME_DISTRIBUTIONS}; got {distribution!r}")


def _check_snapshot_steps(steps: Iterable[int] | None, total: int) -> tuple[int, ...]:
    """The sorted distinct step counts of ``steps`` (``()`` for ``None``), each an integer in
    ``[1, total]``; raises ``ValueError`` naming the first one that is not."""
    if steps is None:
        return ()
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Iterable):
        raise ValueError(f"WeightFlow.fit: snapshot_steps must be a sequence of step counts; got {steps!r}")
    out = set()
    for s in steps:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 1 <= s <= total:
            raise ValueError(f"WeightFlow.fit: every snapshot step must be an integer from 1 to steps = {total} "
                             f"(the number of steps done when the copy is kept); got {s!r}")
        out.add(int(s))
    return tuple(sorted(out))


def _check_count(value: int, name: str, where: str, minimum: int = 1) -> int:
    """``value`` as an ``int`` if it is an integer of at least ``minimum``; raises ``ValueError`` naming the
    argument and its value otherwise (checked where the public methods start, before any work)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        kind = "a positive integer" if minimum == 1 else "a non-negative integer"
        raise ValueError(f"{where}: {name} must be {kind}; got {value!r}")
    return int(value)


@dataclass
class FitResult:
    """Per-step training losses (mean squared error per coordinate, weighted as the flow's
    ``loss_weighting`` says) and wall time; ``snapshots``: the sampling EMA's ``state_dict`` (CPU copies)
    after each of the steps :meth:`WeightFlow.fit` was asked to keep, as ``(completed steps, state)`` pairs
    in increasing order (empty unless asked)."""

    losses: Tensor
    seconds: float
    snapshots: list[tuple[int, dict[str, Tensor]]] = dataclass_field(default_factory=list)


class WeightFlow:
    """A flow over the networks of ``chart.spec`` (an :class:`~wsbook.nets.MLPSpec` or a
    :class:`~wsbook.nets.CNNSpec`: everything below reads the architecture through the chart, the field and
    the spec's per-layer slices, so MLPs and CNNs share this one flow).

    Args:
        chart: where the flow runs (:class:`EuclideanChart`, :class:`NormalizedChart`, :class:`GeometricChart`).
        field: a :class:`~wsbook.weightflow.fields.WeightField` ``field(t, x) -> [B, D]`` over the flat weight
            layout (:func:`gnn_field`, :class:`FlatField`, :class:`NeuronField`;
            for CNNs :class:`~wsbook.weightflow.cnn_fields.ChannelField` or :class:`FlatField`), built for the
            chart's spec: two architectures with the same number of parameters read each
            other's weights as garbage, so another spec raises ``ValueError``. Any other module
            ``field(t, x)`` (an analytic field, say) samples and scores too, but cannot be saved
            (:meth:`state_dict`), anchored or moved to another width.
        parametrization: ``"velocity"`` (default) or ``"endpoint"`` (x1-prediction, the thesis's choice; its
            loss ``|x1_hat - x1|^2`` is the velocity loss weighted by ``(1 - t)^2``, so it spends little effort
            late in the path, where the sampler divides the guess's error by ``1 - t``).
        coupling: ``"independent"`` or ``"ot"``.
        align_pairs: after coupling, permute the hidden neurons of every target network to match its source
            partner (weight matching; the target's function is unchanged). An equivariant field maps a
            permutation-invariant source to a permutation-invariant distribution, so it can only learn the
            symmetrized target; aligning each pair removes the part of the regression target that no
            equivariant field can fit and shortens the paths (equivariant flow matching, Klein et al. 2023).
        time_distribution: ``"uniform"`` or ``"beta(1,2)"``.
        path_sigma: width of the Gaussian straight-line path (Euclidean charts only; 0 = deterministic).
        t_eps: smallest ``1 - t`` the endpoint velocity divides by (the solvers use at most half a step).
        loss_weighting: ``"layer"`` (default): each coordinate's error in units of its layer's scale (the
            units the field reads and writes), so that no layer is neglected for having small coordinates;
            ``"chart"``: squared error per coordinate in the chart's metric. Both have the same minimiser
            (the conditional expectation of the velocity, coordinate by coordinate); they differ in where a
            field of finite size spends its capacity. On canonical charts the hidden neurons' unit-norm rows
            have coordinates of about ``1/sqrt(fan_in)`` while the last layer absorbs their norms, so the
            chart's metric lets the last layer dominate the loss, and the first layer, which decides what a
            network computes, is barely fitted (chapter 7 compares the layers' scales).
    """

    def __init__(self, chart: Chart, field: WeightField | nn.Module, *, parametrization: str = "velocity",
                 coupling: str = "independent", align_pairs: bool = False, time_distribution: str = "uniform",
                 path_sigma: float = 0.0, t_eps: float = 1e-3, loss_weighting: str = "layer"):
        if not isinstance(chart, Chart):
            raise TypeError(f"WeightFlow: chart must be a weightflow Chart; got {type(chart).__name__}")
        if parametrization not in PARAMETRIZATIONS:
            raise ValueError(f"WeightFlow: parametrization must be one of {PARAMETRIZATIONS}; got {parametrization!r}")
        if coupling not in COUPLINGS:
            raise ValueError(f"WeightFlow: coupling must be one of {COUPLINGS}; got {coupling!r}")
        if time_distribution not in TIME_DISTRIBUTIONS:
            raise ValueError(f"WeightFlow: time_distribution must be one of {TIME_DISTRIBUTIONS}; "
                             f"got {time_distribution!r}")
        if loss_weighting not in LOSS_WEIGHTINGS:
            raise ValueError(f"WeightFlow: loss_weighting must be one of {LOSS_WEIGHTINGS}; got {loss_weighting!r}")
        if not isinstance(field, nn.Module):
            raise TypeError(f"WeightFlow: field must be a torch module field(t, x); got {type(field).__name__}")
        field_spec = getattr(field, "spec", None)
        if field_spec is not None and field_spec != chart.spec:
            raise ValueError(f"WeightFlow: the field is built for another architecture ({field_spec}) than the "
                             f"chart ({chart.spec}); build both for the same spec")
        if align_pairs and isinstance(field, WeightField) and field.anchored:
            raise ValueError("WeightFlow: align_pairs permutes targets away from the anchor's neuron order; an "
                             "anchored field needs align_pairs=False")
        self.chart, self.field = chart, field
        self.parametrization, self.coupling_name, self.align_pairs = parametrization, coupling, bool(align_pairs)
        self.time_distribution, self.path_sigma, self.t_eps = time_distribution, float(path_sigma), float(t_eps)
        self.loss_weighting = loss_weighting
        self.ema = copy.deepcopy(field).requires_grad_(False)
        m = chart.manifold
        self.euclidean = isinstance(m, Euclidean)
        if not self.euclidean and path_sigma > 0:
            raise ValueError("WeightFlow: path_sigma > 0 is only defined for Euclidean charts")
        self.coupling = make_coupling(coupling, None if self.euclidean else m)
        self.path = LinearPath(path_sigma) if self.euclidean else GeodesicPath(m, eps=1.0 - T_MAX)
        #: one scale per linear layer (weights and bias): the field reads x / scale and writes scale * output
        self.layer_scale = torch.ones(chart.spec.n_layers)
        self._autocast = False      # bfloat16 autocast of the field, on only inside fit (see fit's autocast)
        self._fit_scale: Tensor | None = None     # _scale's vector, fixed while fit runs (see fit)

    def __repr__(self) -> str:
        return (f"WeightFlow({self.chart!r}, {type(self.field).__name__}, {self.parametrization}, "
                f"{self.coupling_name} coupling, t ~ {self.time_distribution})")

    @property
    def spec(self) -> NetSpec:
        return self.chart.spec

    def _scale(self, like: Tensor) -> Tensor:
        fixed = self._fit_scale
        if fixed is not None and fixed.device == like.device and fixed.dtype == like.dtype:
            return fixed
        s = like.new_empty(self.spec.n_params)
        for layer in range(self.spec.n_layers):
            w, b = self.spec.slices(layer)
            s[w] = float(self.layer_scale[layer])
            if b is not None:
                s[b] = float(self.layer_scale[layer])
        return s

    # ----------------------------------------------------------------------------------- the field
    def raw(self, t: Tensor | float, points: Tensor, model: nn.Module | None = None) -> Tensor:
        """The field's output at ``points`` in the flat weight layout (rescaled per layer)."""
        model = self.ema if model is None else model
        s = self._scale(points)
        if self._autocast:          # bfloat16 for the field only (set by fit on CUDA); the rest stays float32
            with torch.autocast(points.device.type, dtype=torch.bfloat16):
                out = model(t, self.chart.layout(points) / s)
            return out.to(points.dtype) * s
        return model(t, self.chart.layout(points) / s) * s

    def predict_endpoint(self, t: Tensor | float, points: Tensor, model: nn.Module | None = None) -> Tensor:
        """``x1_hat``, the field's guess of where the path through ``points`` at time ``t`` ends, on the
        manifold: the output itself (endpoint parametrisation) or ``exp_{x_t}((1 - t) v)`` (velocity)."""
        if self.parametrization == "endpoint":
            return self.chart.manifold.projx(self.chart.unlayout(self.raw(t, points, model)))
        tt = torch.as_tensor(t, dtype=points.dtype, device=points.device)
        tt = tt.reshape(-1, 1) if tt.dim() else tt
        return self.chart.manifold.expmap(points, (1 - tt) * self.velocity(t, points, model))

    def velocity(self, t: Tensor | float, points: Tensor, model: nn.Module | None = None,
                 t_eps: float | None = None) -> Tensor:
        """The flow's velocity, a tangent vector at every point ``[B, D]`` (``model`` defaults to the EMA)."""
        if self.parametrization == "velocity":
            return self.chart.to_tangent(points, self.raw(t, points, model))
        eps = self.t_eps if t_eps is None else t_eps
        tt = torch.as_tensor(t, dtype=points.dtype, device=points.device)
        tt = tt.reshape(-1, 1) if tt.dim() else tt
        x1_hat = self.chart.manifold.projx(self.chart.unlayout(self.raw(t, points, model)))
        return self.chart.manifold.logmap(points, x1_hat) / (1 - tt).clamp_min(eps)

    # ------------------------------------------------------------------------------------ training
    def set_scale(self, points: Tensor) -> None:
        """Per-layer root-mean-square of the target networks' coordinates (the field's input scale)."""
        w = self.chart.layout(points)
        for layer in range(self.spec.n_layers):
            ws, bs = self.spec.slices(layer)
            part = torch.cat([w[:, ws], w[:, bs]], 1) if bs is not None else w[:, ws]
            self.layer_scale[layer] = part.pow(2).mean().sqrt().clamp_min(1e-3).item()

    def loss(self, x0: Tensor, x1: Tensor, t: Tensor, model: nn.Module | None = None,
             generator: torch.Generator | None = None, rows: slice | None = None, check: bool = True) -> Tensor:
        """The conditional flow-matching loss on paired points (mean squared error per coordinate, in the
        chart's metric, each layer divided by its scale with ``loss_weighting="layer"``). Endpoint mode
        regresses ``log_{x_t}(x1_hat)`` onto ``(1 - t) u_t``: the velocity loss weighted by ``(1 - t)^2``
        (on a straight path exactly ``|x1_hat - x1|^2``). With ``rows`` the path points are drawn for the
        whole batch and the loss is that of those rows only (one process's block of a batch shared by
        several). ``check=False`` skips the validation of the points and times (a host-device
        synchronisation on a GPU; :meth:`fit` draws them itself and passes ``False``)."""
        model = self.field if model is None else model
        t = t.clamp(max=T_MAX)
        xt, ut = self.path.sample(x0, x1, t, generator=generator, check=check)
        if rows is not None:
            xt, ut, t = xt[rows], ut[rows], t[rows]
        if self.parametrization == "velocity":
            err = self.chart.to_tangent(xt, self.raw(t, xt, model)) - ut
        else:
            disp = self.chart.manifold.logmap(xt, self.predict_endpoint(t, xt, model))
            err = disp - (1 - t).unsqueeze(1) * ut
        if self.loss_weighting == "layer":
            err = err / self.chart.unlayout(self._scale(err).unsqueeze(0))
        return (err * err).mean()

    def pair(self, x0: Tensor, x1: Tensor) -> tuple[Tensor, Tensor]:
        """Couple source and target points (and align each target's neurons to its partner, if set)."""
        x0, x1 = self.coupling(x0, x1)
        if self.align_pairs:
            with torch.no_grad():
                x1 = self.chart.unlayout(_align(self.spec, self.chart.layout(x0), self.chart.layout(x1), max_iter=20))
        return x0, x1

    def fit(self, networks: Tensor, *, steps: int, batch_size: int = 256, lr: float = 1e-3, ema_decay: float = 0.999,
            weight_decay: float = 0.0, generator: torch.Generator | None = None, progress: bool | None = None,
            desc: str = "weight flow", autocast: bool | None = None, ddp: bool | None = None,
            check_every: int | None = None, snapshot_steps: Iterable[int] | None = None) -> FitResult:
        """Train the field on a population ``networks [N, D]`` (mapped to the chart once).

        Args:
            networks: the target population (ordinary weights of ``chart.spec``).
            steps: optimizer steps; each draws ``batch_size`` target networks (shuffled per epoch, without
                replacement), as many source points, couples them and draws times.
            batch_size: networks per step (one batched graph).
            lr: Adam(W) learning rate, cosine-decayed to 5 % over the run.
            ema_decay: decay of the exponential moving average used for sampling.
            weight_decay: AdamW weight decay.
            generator: all randomness of the run (``None``: torch's global generator).
            progress: tqdm bar (default: :func:`wsbook.config.progress_enabled`, off under ``WSBOOK_PROGRESS=0``).
            desc: name of the run in the progress bar and in errors.
            autocast: evaluate the field under bfloat16 autocast (default: on for CUDA, off on the CPU);
                the paths, the loss and the optimizer stay in float32.
            ddp: under ``torchrun`` (:mod:`wsbook.distributed`), train with DistributedDataParallel over
                the global batch: every process draws the same batch, source points, pairs and times, runs
                the field on its own block of the batch, and the gradients are averaged, so the step is
                the single-process step on ``batch_size`` networks. ``None``: whenever a process group runs.
            check_every: steps between the loss's NaN / inf checks (:func:`wsbook.loop.descend`; default 1
                on the CPU, 25 on accelerators).
            snapshot_steps: keep a copy of the sampling EMA's weights after each of these numbers of steps
                (integers from 1 to ``steps``; order and repeats do not matter), returned in
                :attr:`FitResult.snapshots` to sample the flow as it was part-way through training
                (``flow.ema.load_state_dict(state)``). Keeping them draws no random numbers and changes
                nothing else: the losses and the final EMA are those of a run without them, and a copy
                after ``steps`` steps is the final EMA. Under DDP every process keeps the same copies.

        On a GPU a step does not make the host wait for the device (no ``.item()``, no check of a value on
        the host, no blocking copy: the source points and times are drawn on the CPU and copied through
        pinned memory), except for the NaN check every ``check_every`` steps and what the pairing itself
        needs: ``coupling="ot"`` and ``align_pairs`` solve assignment problems on the CPU every step.

        Raises ``ValueError`` for a population of no networks or a snapshot step outside ``[1, steps]``, before
        any state (scales, anchor, EMA) changes.
        """
        keep = _check_snapshot_steps(snapshot_steps, _check_count(steps, "steps", "WeightFlow.fit"))
        if self.chart.check_weights(networks, "networks").shape[0] == 0:
            raise ValueError(f"WeightFlow.fit: networks holds no networks (shape {tuple(networks.shape)}); "
                             "a flow needs at least one network to learn from")
        with torch.no_grad():
            points = self.chart.to_points(networks)
        self.set_scale(points)
        if isinstance(self.field, WeightField) and self.field.anchored:   # the mean training network, in its units
            with torch.no_grad():
                self.field.set_anchor((self.chart.layout(points) / self._scale(points)).mean(0))
        device = next(self.field.parameters()).device
        points = points.to(device)
        batches = Minibatches(points.shape[0], batch_size, generator=generator, device=device)
        ema = EMA(self.field, ema_decay)
        self.ema = ema.module
        world = distributed.world_size()
        use_ddp = distributed.active() if ddp is None else bool(ddp)
        if use_ddp and not distributed.active():
            raise RuntimeError("WeightFlow.fit: ddp=True needs a process group (launch with torchrun)")
        if use_ddp and min(batch_size, points.shape[0]) < world:
            raise ValueError(f"WeightFlow.fit: a batch of {min(batch_size, points.shape[0])} networks cannot be "
                             f"split over {world} processes")
        model: nn.Module = self.field
        if use_ddp:
            from torch.nn.parallel import DistributedDataParallel

            # static graph: the same parameters are used every step (some fields never use a few of theirs)
            model = DistributedDataParallel(self.field, device_ids=[device] if device.type == "cuda" else None,
                                            static_graph=True)

        def step_loss(step: int) -> Tensor:
            idx = batches(step)
            x1 = points if idx is None else points[idx]
            x0 = to_device(self.chart.sample_source(x1.shape[0], generator), device)
            x0, x1 = self.pair(x0, x1)
            t = to_device(sample_times(x1.shape[0], self.time_distribution, generator), device)
            if not use_ddp:
                return self.loss(x0, x1, t, model, generator, check=False)
            rows = distributed.shard(x1.shape[0], granule=1)
            # DDP averages gradients over processes: weight each block's mean by its share of the batch
            share = world * (rows.stop - rows.start) / x1.shape[0]
            return self.loss(x0, x1, t, model, generator, rows=rows, check=False) * share

        snapshots: list[tuple[int, dict[str, Tensor]]] = []
        wanted = set(keep)

        def snapshot(step: int) -> None:
            if step + 1 in wanted:          # descend's step is 0-based: step + 1 steps are done
                snapshots.append((step + 1, {k: v.detach().to("cpu", copy=True)
                                             for k, v in ema.module.state_dict().items()}))

        opt = make_optimizer(self.field.parameters(), "adamw", lr=lr, weight_decay=weight_decay)
        self._autocast = device.type == "cuda" if autocast is None else bool(autocast)
        self._fit_scale = self._scale(points)          # layer_scale is fixed during the run: build it once
        try:
            run = descend(step_loss, opt, steps, schedule="cosine", min_lr=0.05 * lr, ema=ema, progress=progress,
                          desc=desc, check_every=check_every, on_step=snapshot if keep else None)
        finally:
            self._autocast, self._fit_scale = False, None
        losses = run.losses.detach()
        if use_ddp:                     # the whole batch's loss per step: the blocks' weighted means, summed
            losses = distributed.all_sum(losses) / world
        return FitResult(losses=losses.cpu(), seconds=run.seconds, snapshots=snapshots)

    @torch.no_grad()
    def evaluate(self, networks: Tensor, *, batch_size: int = 64, repeats: int = 4,
                 generator: torch.Generator | None = None) -> float:
        """The flow-matching loss of the trained field (its EMA, the model that samples) on ``networks``,
        paired and timed as in :meth:`fit` in batches of ``batch_size``, averaged over ``repeats`` draws of
        source points and times. Read on networks the flow never saw (held-out runs) beside the same number
        of its training networks, at the same ``batch_size`` (OT pairs are closer in larger batches), it
        tells generalisation from memorisation: a field that fits its training set much better than held-out
        networks has learned those networks rather than their distribution. Raises ``ValueError`` for a
        population of no networks (the mean over none is undefined)."""
        if repeats < 1 or batch_size < 1:
            raise ValueError(f"evaluate: repeats and batch_size must be positive; got {repeats}, {batch_size}")
        if self.chart.check_weights(networks, "networks").shape[0] == 0:
            raise ValueError(f"WeightFlow.evaluate: networks holds no networks (shape {tuple(networks.shape)})")
        device = next(self.field.parameters()).device
        points = self.chart.to_points(networks).to(device)
        total = 0.0
        for _ in range(repeats):      # a handful of batches: not a hot path
            for x1 in points.split(batch_size):
                x0, x1 = self.pair(to_device(self.chart.sample_source(x1.shape[0], generator), device), x1)
                t = to_device(sample_times(x1.shape[0], self.time_distribution, generator), device)
                total += float(self.loss(x0, x1, t, self.ema, generator)) * x1.shape[0]
        return total / (repeats * points.shape[0])

    # ------------------------------------------------------------------------------------ sampling
    def integrate(self, x0: Tensor, *, steps: int = 100, method: str = "euler", guidance: Guidance | None = None,
                  return_trajectory: bool = False, model: nn.Module | None = None, field: bool = True) -> ODEResult:
        """Integrate the flow from source points ``x0 [B, D]`` (on the chart's manifold) to ``t = 1``.
        ``field=False`` leaves the learned field out, so ``guidance`` alone moves the points: the control that
        tells what a guided draw owes to the guidance.

        ``steps`` (solver steps; with ``"dopri5"`` they set only the endpoint parametrisation's ``t_eps``) must be
        a positive integer, else ``ValueError``. Points that leave the chart's domain raise ``ValueError``, a
        non-finite result ``FloatingPointError``. An empty batch ``[0, D]`` gives an empty result without
        evaluating the field."""
        steps = _check_count(steps, "steps", "WeightFlow.integrate")
        x0 = self.chart.check_points(x0, "x0")
        eps = min(self.t_eps, 0.5 / steps)

        def fn(t, x):
            if x.shape[0] == 0:         # no networks: the fields need at least one
                return torch.zeros_like(x)
            v = self.velocity(t, x, model, eps) if field else torch.zeros_like(x)
            if guidance is not None:
                v = v + guidance.vector(self.chart, x, float(t))
            return v

        res = solve_ode(fn, x0, method=method, steps=steps, manifold=None if self.euclidean else self.chart.manifold,
                        return_trajectory=return_trajectory)
        if not torch.isfinite(res.x).all():
            raise FloatingPointError("WeightFlow: the sampled points contain NaN or inf (check the field and t_eps)")
        return res

    def sample(self, n: int, *, steps: int = 100, method: str = "euler", generator: torch.Generator | None = None,
               x0: Tensor | None = None, guidance: Guidance | None = None, batch_size: int | None = None,
               field: bool = True) -> Tensor:
        """``n`` new networks ``[n, D]`` (ordinary weights of ``chart.spec``).

        Args:
            n: number of networks.
            steps: solver steps from t = 0 to 1.
            method: ``"euler"``, ``"midpoint"`` or ``"rk4"`` (exp-map steps on the spheres).
            generator: draws the source points.
            x0: source points to start from instead (``[n, D]`` on the chart's manifold).
            guidance: task-loss guidance (:class:`Guidance`) or ``None``.
            batch_size: integrate in chunks of this many networks (memory), ``None`` = all at once.
            field: ``False``: the source points moved by ``guidance`` alone (see :meth:`integrate`).

        Raises ``ValueError`` for a negative ``n``, a ``steps`` or ``batch_size`` below 1, or an ``x0`` of
        another length, before drawing anything. ``n = 0`` gives an empty ``[0, D]`` tensor.
        """
        n = _check_count(n, "n", "WeightFlow.sample", minimum=0)
        steps = _check_count(steps, "steps", "WeightFlow.sample")
        if batch_size is not None:
            batch_size = _check_count(batch_size, "batch_size", "WeightFlow.sample")
        x0 = self.chart.sample_source(n, generator) if x0 is None else x0
        if x0.shape[0] != n:
            raise ValueError(f"sample: x0 has {x0.shape[0]} points but n = {n}")
        device = next(self.field.parameters()).device
        x0 = x0.to(device)
        if n == 0:                      # nothing to integrate (and no points to map back to weights)
            return self.chart.check_points(x0, "x0").new_zeros(0, self.spec.n_params)
        chunks = [x0] if batch_size is None else list(x0.split(batch_size))
        points = torch.cat([self.integrate(c, steps=steps, method=method, guidance=guidance, field=field).x
                            for c in chunks])
        return self.chart.to_weights(points)

    # ---------------------------------------------------------------------------------- likelihood
    def likelihood(self, points: Tensor, *, steps: int = 20, method: str = "rk4", estimator: str = "auto",
                   n_probes: int = 4, generator: torch.Generator | None = None,
                   model: nn.Module | None = None) -> LikelihoodResult:
        """Log-density of chart points under the flow (w.r.t. the manifold's volume): the source log-density
        of the point the reversed flow reaches minus the integrated divergence. ``estimator``: ``"exact"``
        (one backward pass per coordinate), ``"hutchinson"`` (``n_probes`` fixed Rademacher probes) or
        ``"auto"`` (exact up to 64 coordinates).

        Raises ``ValueError`` for a ``steps`` below 1 and on the Normalized chart (no density). An empty batch
        ``[0, D]`` gives empty results (``logp`` of shape ``[0]``) without evaluating the field."""
        self._check_density("likelihood")
        steps = _check_count(steps, "steps", "WeightFlow.likelihood")
        points = self.chart.check_points(points)
        if points.shape[0] == 0:        # no networks: the fields need at least one
            none = points.new_zeros(0)
            return LikelihoodResult(logp=none, x0=points.clone(), base_logp=none.clone(), int_div=none.clone(), nfe=0)
        if estimator == "auto":
            estimator = "exact" if self.chart.dim <= 64 else "hutchinson"
        eps = min(self.t_eps, 0.5 / steps)
        return log_likelihood(lambda t, x: self.velocity(t, x, model, eps), points, manifold=self.chart.manifold,
                              base_logprob=self.chart.source_log_prob, method=method, steps=steps,
                              estimator=estimator, n_probes=n_probes, generator=generator)

    def log_prob(self, networks: Tensor, **kwargs) -> Tensor:
        """``log p(networks)`` ``[B]``: the networks are mapped to the chart (canonicalized for the Geometric
        chart: the density of a network is that of its canonical representative) and passed to
        :meth:`likelihood` (keyword arguments as there). Raises ``ValueError`` as :meth:`likelihood` does,
        checked before the networks are mapped to the chart; no networks ``[0, D]`` give an empty ``[0]``."""
        self._check_density("log_prob")
        if "steps" in kwargs:
            kwargs["steps"] = _check_count(kwargs["steps"], "steps", "WeightFlow.log_prob")
        if self.chart.check_weights(networks, "networks").shape[0] == 0:
            points = networks.new_zeros(0, self.chart.dim)
        else:
            with torch.no_grad():
                points = self.chart.to_points(networks)
        return self.likelihood(points, **kwargs).logp

    def _check_density(self, where: str) -> None:
        if self.chart.kind == "normalized":
            raise ValueError(f"WeightFlow.{where}: a Normalized flow runs in R^D from a source on the spheres and "
                             "has no density; use a Geometric (or Euclidean) chart for likelihoods")

    # ------------------------------------------------------------------------ transfer, persistence
    def settings(self) -> dict:
        return {"parametrization": self.parametrization, "coupling": self.coupling_name, "align_pairs": self.align_pairs,
                "time_distribution": self.time_distribution, "path_sigma": self.path_sigma, "t_eps": self.t_eps,
                "loss_weighting": self.loss_weighting}

    def with_spec(self, spec: NetSpec) -> "WeightFlow":
        """This trained flow on networks of another hidden width (same depth, inputs and outputs): the chart
        for ``spec`` and the same field weights on the new neural graph."""
        self._check_protocol("with_spec")
        new = WeightFlow(self.chart.with_spec(spec), self.field.with_spec(spec), **self.settings())
        new.ema = self.ema.with_spec(spec).requires_grad_(False)
        new.layer_scale = self.layer_scale.clone()
        return new

    def with_field(self, field: WeightField | nn.Module) -> "WeightFlow":
        """This flow (chart, settings and per-layer scales) with ``field`` in place of its own, used as given:
        e.g. its sampling EMA, to train further from, or a trained field extended by a term
        (:meth:`FlatField.with_diagonal`)."""
        new = WeightFlow(self.chart, field, **self.settings())
        new.layer_scale = self.layer_scale.clone()
        return new

    def _check_protocol(self, where: str) -> None:
        if not isinstance(self.field, WeightField):
            raise TypeError(f"{where}: the field {type(self.field).__name__} is not a WeightField (spec, config, "
                            "with_spec); use gnn_field, FlatField, NeuronField or ChannelField, "
                            "or subclass wsbook.weightflow.WeightField")

    def state_dict(self) -> dict:
        """Everything needed to rebuild the flow, as tensors, numbers, strings and dicts (cacheable with
        :mod:`wsbook.cache`)."""
        self._check_protocol("state_dict")
        return {"chart": self.chart.config(), "field_config": self.field.config(), "settings": self.settings(),
                "field": {k: v.detach().cpu() for k, v in self.field.state_dict().items()},
                "ema": {k: v.detach().cpu() for k, v in self.ema.state_dict().items()},
                "layer_scale": self.layer_scale.clone()}

    @classmethod
    def from_state(cls, state: dict, device: torch.device | str | None = None) -> "WeightFlow":
        """Rebuild a flow saved by :meth:`state_dict`."""
        chart = chart_from_config(state["chart"])
        field = field_from_config(state["field_config"])
        field.load_state_dict(state["field"])
        flow = cls(chart, field.to(device or "cpu"), **state["settings"])
        flow.ema.load_state_dict(state["ema"])
        flow.layer_scale = state["layer_scale"].detach().cpu().clone()
        return flow


def reference_sample(flow: WeightFlow, n: int, *, steps: int = 100, generator: torch.Generator | None = None,
                     x0: Tensor | None = None) -> Tensor:
    """The reference code's sampler, reproduced to measure its error (``ege-erdogan/weightflow``,
    ``CFM.vector_field``): Euler steps along ``x1_hat(x_t, t) - x0`` instead of ``(x1_hat - x_t) / (1 - t)``.
    Integrating it gives ``x_1 = integral_0^1 x1_hat(x_t, t) dt``, a time average of the field's guesses,
    which early on sit near the target's mean: the samples lose spread. Euclidean charts
    only (a velocity field's guess is ``x_t + (1 - t) v``); returns networks ``[n, D]``. Raises ``ValueError``
    for another chart, a negative ``n`` or a ``steps`` below 1."""
    if not flow.euclidean:
        raise ValueError("reference_sample: reproduced for Euclidean charts only")
    n = _check_count(n, "n", "reference_sample", minimum=0)
    steps = _check_count(steps, "steps", "reference_sample")
    x0 = flow.chart.sample_source(n, generator) if x0 is None else flow.chart.check_points(x0, "x0")
    if x0.shape[0] == 0:                # no networks: the fields need at least one
        return flow.chart.to_weights(x0)
    x, h = x0.clone(), 1.0 / steps
    with torch.no_grad():
        for k in range(steps):
            x = x + h * (flow.predict_endpoint(k * h, x) - x0)
    return flow.chart.to_weights(x)


__all__ = ["WeightFlow", "FitResult", "reference_sample", "sample_times", "PARAMETRIZATIONS", "TIME_DISTRIBUTIONS",
           "COUPLINGS"]
