"""Flows as posterior samplers (book chapter 8, "Flows as posterior samplers" page).

A flow is trained on the draws of the reference HMC run (:func:`wsbook.experiments.targets.hmc_reference`,
seed 0) and scored like every other approximate-inference method against independent runs it never saw
(:data:`HMC_RUNS`): the validation run (seed 1), on which every choice is made, and the test run (seed 3),
which only :func:`verdict_table` reads:

* :func:`train_posterior_flow`: the four flows of :data:`FLOWS`, trained and cached (chapters reach them
  through :mod:`wsbook.experiments.pipeline`): flow matching on the training run's draws on the Euclidean
  or the Geometric chart (sizes per scale in :func:`flow_settings`), the Euclidean one trained further on
  the task's unnormalised posterior by reverse KL (sizes in :func:`kl_settings`), and a flow started at a
  mixture of mean-field VI fits and trained on the draws' likelihood and the posterior together (sizes in
  :func:`joint_settings`).
* :func:`sample_flow`: networks of a trained flow, their chart points and the sampling seconds.
* :func:`gaussian_fits`: a full-covariance Gaussian fit of the HMC draws and a mixture of one per chain, the
  yardsticks of what a density estimate of the draws must capture.
* :func:`methods_table`: the results chapter's methods table (:func:`targets.methods_against_reference`)
  with the flows as extra rows, plus the distances to the held-out HMC run and a memorisation check.
* :func:`verdict_table`: the protocol. :func:`validation_scores` (:func:`repeated_distances` over several
  independent sets, :func:`summarise_repeats`) scores every :func:`candidates` sampler (each flow, and the
  flow trained on draws and density with each task-loss guidance weight) on the validation run,
  :func:`select_flow` chooses, and the chosen flow, trained over fresh seeds, is judged on the test run
  beside mean-field VI, the per-chain Gaussians and its own source; :func:`polished_comparison`
  (:func:`hmc_polish`): samples of the flow, VI and the prior as starting points of a few exact HMC
  transitions; :func:`posterior_terms`, where a set of networks sits in
  training log-likelihood and log prior against HMC's draws.
* :func:`importance_sampling`: self-normalised importance weights ``p(theta | D) / q(theta)`` of the samples of
  a Euclidean flow (trained on draws, or further on the density; its exact log-density by the change of
  variables), their effective sample size and the reweighted predictive; :func:`elbos`, the flows' and
  mean-field VI's evidence lower bounds (their reverse KLs to the posterior, up to one constant), over the
  verdict's training seeds, the flows' log-densities from a converged RK4 solve with Hutchinson's divergence
  (:func:`flow_with_log_q`; its probes' noise measured) beside those of the Euler steps they train with.
* :func:`detection_sets`, :func:`detection_table`: the flow's log-likelihood of held-out posterior draws and
  of networks that are not from the posterior (another task, random initialisations, prior draws,
  perturbed draws, optimiser checkpoints), with the AUROC of the log-likelihood as a detector;
  :func:`density_check`, whether a flow's scores of its training draws against held-out draws are
  numerical error (rescored exactly, with twice the steps) or memorisation, before any AUROC is read.

Everything expensive is cached with :mod:`wsbook.cache`; sizes come from :func:`wsbook.config.by_scale`.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from wsbook import config
from wsbook.bayes import metrics as M
from wsbook.bayes.distances import median_bandwidth, median_nn_distance, mmd2
from wsbook.cache import cached
from wsbook.experiments import protocol, targets
from wsbook.flows.likelihood import divergence, rademacher
from wsbook.symmetry import neuron_norms, weight_matching
from wsbook.weightflow import EuclideanChart, FlatField, GeometricChart, NeuronField, WeightFlow, gnn_field
from wsbook.weightflow.variational import fit_reverse_kl

CHARTS = ("euclidean", "geometric")


@dataclass(frozen=True)
class FlowSettings:
    """Sizes of one posterior flow (set per scale by :func:`flow_settings`).

    Attributes:
        field: ``"flat"`` (an MLP on the aligned weight vector) or ``"gnn"`` (the equivariant weight-space GNN).
        width, depth: hidden width and depth of the flat MLP, or node/edge width and layers of the GNN.
        steps, batch_size, lr, ema_decay: training (exact minibatch OT pairs, velocity parametrisation).
        sample_steps: midpoint steps of the sampler.
        lik_steps, n_probes: RK4 steps and Hutchinson probes of the log-likelihood.
    """

    field: str
    width: int
    depth: int
    steps: int
    batch_size: int
    lr: float
    ema_decay: float
    sample_steps: int
    lik_steps: int
    n_probes: int


def flow_settings() -> FlowSettings:
    """The posterior flows' sizes at the current scale (the one place they are chosen). The GNN field is
    slow on a CPU, so `ci` and `default` use the flat field on aligned weights; `full` (a GPU) uses the GNN
    (timing: docs/tuning-log.md)."""
    s = config.by_scale
    return FlowSettings(field=s("flat", "flat", "gnn"), width=s(256, 512, 32), depth=s(3, 3, 3),
                        steps=s(400, 3000, 20000), batch_size=s(64, 128, 256), lr=s(2e-3, 1e-3, 1e-3),
                        ema_decay=s(0.99, 0.995, 0.999), sample_steps=s(16, 32, 64), lik_steps=s(8, 16, 32),
                        n_probes=s(2, 4, 8))


@dataclass(frozen=True)
class KLSettings:
    """Sizes of the reverse-KL training of the Euclidean posterior flow on the unnormalised posterior
    (``"euclidean flow + reverse KL"`` of :func:`train_posterior_flow`; set per scale by
    :func:`kl_settings`): Adam ``steps``, samples per step ``batch_size``, learning rate ``lr``, EMA decay
    ``ema_decay``, Euler steps of the path during training ``solver_steps``."""

    steps: int
    batch_size: int
    lr: float
    ema_decay: float
    solver_steps: int


def kl_settings() -> KLSettings:
    """The reverse-KL training's sizes at the current scale (a step: ``batch_size`` samples through
    ``solver_steps`` Euler steps with a divergence probe, backpropagated; timing: docs/tuning-log.md)."""
    s = config.by_scale
    return KLSettings(steps=s(150, 3000, 10000), batch_size=s(32, 64, 256), lr=1e-3, ema_decay=s(0.9, 0.99, 0.995),
                      solver_steps=s(8, 8, 16))


def _chart(kind: str, task: str, train: Tensor):
    """The chart of ``kind`` for ``task``'s networks, without a reference network (see :func:`alignment_spread`:
    aligning every HMC draw on its own to one reference scatters the draws of a chain); the Gaussian source
    has the prior's scale (Euclidean) or the training points' root-mean-square last layer (Geometric)."""
    from wsbook.experiments.tasks import get_task

    t = get_task(task)
    if kind == "euclidean":
        return EuclideanChart(t.spec, sigma=float(t.prior_std), reference=None)
    if kind == "geometric":
        last = GeometricChart(t.spec).to_points(train)[:, slice(GeometricChart(t.spec).last.start, None)]
        return GeometricChart(t.spec, sigma=float(last.pow(2).mean().sqrt()))
    raise ValueError(f"chart must be one of {CHARTS}; got {kind!r}")


def posterior_field(spec, st: FlowSettings | None = None):
    """The untrained vector field of the posterior flows for networks of ``spec`` (sizes from
    :func:`flow_settings` unless ``st`` is given)."""
    st = flow_settings() if st is None else st
    if st.field == "flat":
        return FlatField(spec, hidden=st.width, depth=st.depth)
    if st.field == "gnn":
        return gnn_field(spec, dim=st.width, n_layers=st.depth)
    raise ValueError(f"field must be 'flat' or 'gnn'; got {st.field!r}")


@cached("flows/posterior", version=4)   # 4: loss weighted per layer
def _train(task: str, chart: str, settings: FlowSettings, seed: int) -> dict:
    ref = targets.hmc_reference(task, seed=0)
    train = ref.theta
    gen = torch.Generator().manual_seed(1_000 + seed)
    start = time.perf_counter()
    ch = _chart(chart, task, train)
    with config.seeded(1_000 + seed):
        flow = WeightFlow(ch, posterior_field(ref.spec, settings), coupling="ot")
    fit = flow.fit(train, steps=settings.steps, batch_size=settings.batch_size, lr=settings.lr,
                   ema_decay=settings.ema_decay, generator=gen, desc=f"posterior flow {chart}")
    return {"state": flow.state_dict(), "seconds": time.perf_counter() - start, "losses": fit.losses}


@cached("flows/posterior_kl", version=2)   # 2: flat fields get a per-weight linear term
def _train_kl(task: str, settings: FlowSettings, kl: KLSettings, seed: int) -> dict:
    from wsbook.experiments.tasks import get_task

    draws_flow = train_posterior_flow(task, "euclidean flow", seed)[0]
    field = copy.deepcopy(draws_flow.ema).requires_grad_(True)     # continue from the sampling weights
    if isinstance(field, FlatField):                  # see FlatField: contract every weight on its own
        field = field.with_diagonal()
    flow = draws_flow.with_field(field)
    gen = torch.Generator().manual_seed(6_000 + seed)
    fit = fit_reverse_kl(flow, get_task(task).log_posterior(), steps=kl.steps, batch_size=kl.batch_size,
                         lr=kl.lr, ema_decay=kl.ema_decay, solver_steps=kl.solver_steps, generator=gen,
                         desc="posterior flow, reverse KL")
    return {"state": flow.state_dict(), "seconds": fit.seconds, "losses": fit.losses}


@dataclass(frozen=True)
class JointSettings:
    """Sizes of the flow trained on HMC draws and the posterior density (``"flow, draws + density"`` of
    :func:`train_posterior_flow`; set per scale by :func:`joint_settings`): a source of ``components``
    mean-field VI fits, ``density_steps`` Adam steps of reverse KL alone at learning rate ``density_lr``, then
    ``steps`` of reverse KL plus ``forward_weight`` times the draws' negative log-likelihood at ``lr``; samples
    and draws per step ``batch_size``, EMA decay ``ema_decay``, Euler steps of the path ``solver_steps``. The
    field (:func:`joint_field`) is ``"neuron"`` (:class:`~wsbook.weightflow.NeuronField` with node width
    ``width``, edge width ``edge_dim`` and ``rounds`` rounds of message passing) or ``"flat"`` (the flat MLP
    of :func:`flow_settings` with a per-weight linear term; the sizes here are then unused);
    ``jacobian_penalty`` is that of :func:`~wsbook.weightflow.variational.fit_reverse_kl`."""

    components: int
    density_steps: int
    density_lr: float
    steps: int
    lr: float
    batch_size: int
    ema_decay: float
    solver_steps: int
    forward_weight: float
    field: str = "neuron"
    width: int = 32
    edge_dim: int = 8
    rounds: int = 1
    jacobian_penalty: float = 1.0


def joint_settings() -> JointSettings:
    """The sizes at the current scale (a joint step costs about two reverse-KL steps: the draws' path back to
    the source doubles the work)."""
    # the forward weight, the number of VI fits, the budget and (JointSettings' defaults) the small neuron
    # field with a high Jacobian penalty are what the sweeps kept (tuned against HMC run 1; measurements:
    # docs/tuning-log.md)
    s = config.by_scale
    return JointSettings(components=s(2, 4, 4), density_steps=s(100, 750, 6000), density_lr=1e-3,
                         steps=s(50, 300, 2400), lr=3e-4, batch_size=s(32, 64, 256), ema_decay=s(0.9, 0.99, 0.995),
                         solver_steps=s(8, 8, 16), forward_weight=3.0)


def joint_field(spec, joint: JointSettings, settings: FlowSettings | None = None):
    """The untrained field of the joint flow (:func:`train_posterior_flow`) for networks of ``spec``: zero
    everywhere, so the flow starts as its source (sizes from ``joint``; the flat field's from ``settings``,
    default :func:`flow_settings`)."""
    if joint.field == "neuron":
        return NeuronField(spec, hidden=joint.width, edge_dim=joint.edge_dim, rounds=joint.rounds).zero_()
    if joint.field == "flat":
        return posterior_field(spec, settings).with_diagonal().zero_()
    raise ValueError(f"JointSettings.field must be 'neuron' or 'flat'; got {joint.field!r}")


@cached("flows/posterior_joint", version=3)   # 2: a mixture of VI fits as the source; 3: the neuron field
def _train_joint(task: str, settings: FlowSettings, joint: JointSettings, seed: int) -> dict:
    from wsbook.experiments.tasks import get_task, vi_posterior

    t, ref = get_task(task), targets.hmc_reference(task, seed=0)
    start = time.perf_counter()
    vi = vi_posterior(task, seed, members=joint.components)
    mean, std = vi.mean.detach(), vi.std.detach()
    # the source is the equal mixture of the VI fits and every draw is aligned to the nearest fit's mean: a
    # zero field is that mixture itself
    chart = EuclideanChart(t.spec, sigma=std, loc=mean, reference=mean)
    with config.seeded(7_000 + seed):
        field = joint_field(t.spec, joint, settings)
    flow = WeightFlow(chart, field, coupling="ot")
    flow.set_scale(chart.to_points(ref.theta))
    gen = torch.Generator().manual_seed(8_000 + seed)
    kw = dict(batch_size=joint.batch_size, ema_decay=joint.ema_decay, solver_steps=joint.solver_steps,
              jacobian_penalty=joint.jacobian_penalty, generator=gen)
    first = fit_reverse_kl(flow, t.log_posterior(), steps=joint.density_steps, lr=joint.density_lr,
                           desc="posterior flow from VI fits, density", **kw)
    flow = flow.with_field(copy.deepcopy(flow.ema).requires_grad_(True))   # continue from the sampling weights
    second = fit_reverse_kl(flow, t.log_posterior(), steps=joint.steps, lr=joint.lr, networks=ref.theta,
                            forward_weight=joint.forward_weight, desc="posterior flow, density and draws", **kw)
    return {"state": flow.state_dict(), "seconds": time.perf_counter() - start, "density_losses": first.losses,
            "losses": second.losses}


#: the rows of the flows trained on the density: draws and density together, and reverse KL after the draws
DENSITY_FLOWS = ("flow, draws + density", "euclidean flow + reverse KL")
#: every posterior flow by its table name (the recipes of :mod:`wsbook.experiments.pipeline`)
FLOWS = (*(f"{chart} flow" for chart in CHARTS), DENSITY_FLOWS[1], DENSITY_FLOWS[0])


def train_posterior_flow(task: str, name: str, seed: int = 0) -> tuple[WeightFlow, float, Tensor]:
    """The posterior flow ``name`` (one of :data:`FLOWS`) trained with seed ``seed``, cached:
    ``(flow, seconds of its whole training, per-step losses)``. Chapters reach it through
    :func:`wsbook.experiments.pipeline.train` (target ``"posterior/<task>"``).

    * ``"euclidean flow"``, ``"geometric flow"``: flow matching on the draws of the training HMC run
      (:data:`HMC_RUNS`) on the Euclidean chart (aligned weights, a Gaussian source with the prior's scale; a
      density on ``R^D``) or the Geometric chart (canonical networks on the product of neuron spheres); sizes
      from :func:`flow_settings`.
    * ``"euclidean flow + reverse KL"``: the Euclidean flow trained further on the task's unnormalised
      posterior by reverse KL (:func:`~wsbook.weightflow.variational.fit_reverse_kl`, sizes from
      :func:`kl_settings`); its seconds include the draws flow's. The draws teach the flow where the
      posterior's mass roughly is; the density teaches it the correlations between weights that a few
      thousand draws of an 802-dimensional posterior do not pin down. A flat field first gets a per-weight
      linear term (:meth:`FlatField.with_diagonal`, zero at the start: the same flow); the GNN field of the
      `full` scale is trained as it is (a per-weight term would break its permutation equivariance).
    * ``"flow, draws + density"``: a Euclidean flow started at a mixture of mean-field VI fits
      (:func:`tasks.vi_posterior` with ``components`` members, each in a mode of its own): the chart's source
      is their equal mixture, the field (:func:`joint_field`) starts at zero, and every draw is aligned by
      weight matching to the fit's mean it lies nearest to. Reverse KL alone trains it first, then a shorter
      phase at a lower learning rate adds the draws' likelihood: ``KL(q || p) + w * E_draws[-log q]`` (sizes
      and ``w`` from :func:`joint_settings`); its losses are that phase's ``[steps, 2]``. The field's Jacobian
      penalty is high: with a small one the neuron field learns to exploit the error of the few Euler steps
      it is trained with. The seconds include the VI fits.
    """
    if name in FLOWS[:len(CHARTS)]:
        out = _train(task, name.removesuffix(" flow"), flow_settings(), seed)
    elif name == DENSITY_FLOWS[1]:
        out = _train_kl(task, flow_settings(), kl_settings(), seed)
        out = out | {"seconds": out["seconds"] + _train(task, "euclidean", flow_settings(), seed)["seconds"]}
    elif name == DENSITY_FLOWS[0]:
        out = _train_joint(task, flow_settings(), joint_settings(), seed)
    else:
        raise ValueError(f"unknown posterior flow {name!r}; available: {', '.join(FLOWS)}")
    return WeightFlow.from_state(out["state"]), float(out["seconds"]), out["losses"]


def sample_flow(flow: WeightFlow, n: int, generator: torch.Generator | None = None,
                steps: int | None = None) -> tuple[Tensor, Tensor, float]:
    """``n`` networks of a flow: ``(theta [n, D], chart points [n, D], seconds)`` (midpoint solver)."""
    steps = flow_settings().sample_steps if steps is None else steps
    gen = generator if generator is not None else config.generator()
    x0 = flow.chart.sample_source(n, gen)
    start = time.perf_counter()
    with torch.no_grad():
        points = flow.integrate(x0, steps=steps, method="midpoint").x
        theta = flow.chart.to_weights(points)
    return theta, points, time.perf_counter() - start


def alignment_spread(task: str = "breast_cancer") -> dict:
    """Mean distance between draws of the same chain, of different chains and over all pairs of
    ``hmc_reference(task, 0)``, as drawn and after weight matching every draw to the first (as an aligned
    chart would). On a posterior as broad as the prior, matching finds little to match."""
    ref = targets.hmc_reference(task, 0)
    chain = torch.arange(ref.theta.shape[0]) % ref.n_chains            # draw-major rows
    same = chain[:, None] == chain[None]
    off = ~torch.eye(len(chain), dtype=torch.bool)
    out = {}
    aligned = weight_matching(ref.spec, ref.theta[:1], ref.theta).aligned
    for name, theta in (("as drawn", ref.theta), ("aligned", aligned)):
        d = torch.cdist(theta.double(), theta.double())
        out[name] = {"within chains": float(d[same & off].mean()), "between chains": float(d[~same].mean()),
                     "all pairs": float(d[off].mean())}
    return out


def prior_draws(task: str, n: int, generator: torch.Generator | None = None) -> Tensor:
    """``n`` networks from the task's prior ``N(0, prior_std^2)``: the baseline of a sampler that learned
    nothing about the data."""
    from wsbook.bayes.model import GaussianPrior
    from wsbook.experiments.tasks import get_task

    t = get_task(task)
    return GaussianPrior(t.prior_std).sample(t.spec, n, generator=generator, device="cpu").float()


def gaussian_fits(task: str, n: int, generator: torch.Generator | None = None,
                  jitter: float = 1e-3) -> dict[str, tuple[Tensor, float]]:
    """Two density estimates of the HMC draws (run 0) that know only their first two moments, as yardsticks
    for a flow trained on the same draws: ``{name: (n networks, seconds)}``.

    * ``"gaussian fit"``: one Gaussian with the draws' mean and full covariance;
    * ``"per-chain gaussians"``: one such Gaussian per chain, an equal mixture (``n`` split over the chains).

    A sampler that learns the draws' correlations but not their division into modes does about as well as
    the first; the second knows which draws belong together. ``jitter`` (times the identity) keeps the
    covariances of few draws positive definite.
    """
    ref = targets.hmc_reference(task, 0)
    gen = generator if generator is not None else config.generator()
    theta = ref.theta.double()
    d, k = theta.shape[1], ref.n_chains
    chains = theta.reshape(-1, k, d).transpose(0, 1)                     # [K, S, D]: rows are draw-major
    out = {}
    for name, groups in (("gaussian fit", theta[None]), ("per-chain gaussians", chains)):
        start = time.perf_counter()
        out[name] = (_gaussian_mixture_draws(groups, n, gen, jitter).float(), time.perf_counter() - start)
    return out


def _gaussian_mixture_draws(groups: Tensor, n: int, gen: torch.Generator, jitter: float) -> Tensor:
    """``n`` draws of the equal mixture of one full-covariance Gaussian per group of ``groups [K, S, D]``
    (``n`` split over the groups in turn)."""
    k, s, d = groups.shape
    mean = groups.mean(1)
    centred = groups - mean[:, None]
    cov = centred.transpose(1, 2) @ centred / (s - 1) + jitter * torch.eye(d, dtype=groups.dtype)
    chol = torch.linalg.cholesky(cov)
    which = torch.arange(n) % k
    z = torch.randn(n, d, generator=gen, dtype=groups.dtype)
    # every z through its group's factor (K x the work of picking factors per row, without [n, D, D])
    return mean[which] + torch.einsum("kij,nj->kni", chol, z)[which, torch.arange(n)]


def task_guidance(task: str = "breast_cancer", weight: float = 2.0):
    """The thesis's task-loss guidance on ``task`` (:class:`~wsbook.weightflow.Guidance`: ``-lambda t^2 grad L``
    added to the velocity, ``L`` the mean loss on the whole training split), ``lambda = weight``."""
    from wsbook.weightflow import Guidance
    from wsbook.experiments.tasks import get_task

    t = get_task(task)
    ds = t.data()
    return Guidance(ds.x_train, ds.y_train, weight=weight, schedule="quadratic", task=t.task, batch_size=None)


def sample_guided(flow: WeightFlow, n: int, guide, generator: torch.Generator | None = None,
                  steps: int | None = None) -> Tensor:
    """``n`` networks of ``flow`` drawn with the guidance ``guide`` (:func:`task_guidance`) added to its
    velocity, with the midpoint solver of :func:`sample_flow`. ``steps`` default to :func:`flow_settings`
    ``.sample_steps``: guidance acts like gradient descent along the path, and a few large steps overshoot
    (measurements: docs/tuning-log.md)."""
    steps = flow_settings().sample_steps if steps is None else int(steps)
    gen = generator if generator is not None else config.generator()
    return flow.sample(n, steps=steps, method="midpoint", generator=gen, guidance=guide).detach()


def guided_prior(flow: WeightFlow, n: int, guide, task: str = "breast_cancer",
                 generator: torch.Generator | None = None, steps: int | None = None) -> Tensor:
    """The control of :func:`sample_guided`: ``n`` prior draws moved by the same guidance alone, with the same
    solver and steps on ``flow``'s chart (a flow whose field is zero). If its networks score like the guided
    flow's, the guidance, not the flow, does the work."""
    from wsbook.flows import solve_ode

    steps = flow_settings().sample_steps if steps is None else int(steps)
    gen = generator if generator is not None else config.generator()
    x0 = flow.chart.to_points(prior_draws(task, n, gen))
    with torch.no_grad():
        moved = solve_ode(lambda s, x: guide.vector(flow.chart, x, float(s)), x0, method="midpoint", steps=steps,
                          manifold=None if flow.euclidean else flow.chart.manifold).x
    return flow.chart.to_weights(moved)


def guided(flow: WeightFlow, n: int, weight: float = 2.0, task: str = "breast_cancer",
           generator: torch.Generator | None = None, steps: int | None = None) -> dict[str, tuple[Tensor, float]]:
    """A posterior flow sampled with task-loss guidance (:func:`sample_guided`) and its control
    (:func:`guided_prior`), both with the guidance :func:`task_guidance` ``(task, weight)`` and one
    generator: ``{name: (networks [n, D], seconds)}`` with keys ``"<chart> flow + guidance"`` and
    ``"prior + guidance"``."""
    guide = task_guidance(task, weight)
    gen = generator if generator is not None else config.generator()
    start = time.perf_counter()
    theta = sample_guided(flow, n, guide, gen, steps)
    out = {f"{flow.chart.kind} flow + guidance": (theta, time.perf_counter() - start)}
    start = time.perf_counter()
    theta = guided_prior(flow, n, guide, task, gen, steps)
    out["prior + guidance"] = (theta, time.perf_counter() - start)
    return out


# ------------------------------------------------------------------------------------ the table
def methods_table(task: str, n: int, flows: dict[str, tuple[Tensor, float]], seed: int = 0):
    """Every posterior method and the ``flows`` (``{name: (networks [n, D], seconds)}``) against the HMC
    reference (seed 0, the flows' training set) with :func:`targets.methods_against_reference`, plus two
    columns against the independent run (seed 1), which no method saw: ``tv_run1`` and ``mmd2_run1`` (for the
    row ``hmc``, the second run itself, they compare ``n`` draws of run 0 with run 1). Returns a DataFrame.

    Args:
        task: ``"breast_cancer"`` (or ``"mnist5k"``).
        n: networks per method (as the main results page, so the cached posterior runs are shared).
        flows: extra rows, networks and seconds.
        seed: as in :func:`targets.methods_against_reference`.
    """
    from wsbook.experiments.tasks import get_task

    ref0 = targets.hmc_reference(task, HMC_RUNS["training"])
    x = get_task(task).data().x_test
    spec = ref0.spec
    extra = {name: (targets.predictive_probs(spec, theta, x), s) for name, (theta, s) in flows.items()}
    table = targets.methods_against_reference(task, n, seed=seed, extra=extra)
    sets = {**targets.method_probs(task, n, seed), **extra}
    sets["hmc"] = (ref0.probs[ref0.thinned(n)], ref0.seconds)
    to_run1 = _distances_to_run1(task, seed)
    rows = [to_run1(sets[m][0]) for m in table.index]
    for col in rows[0]:
        table[col] = [r[col] for r in rows]
    return table


def _distances_to(task: str, other: "targets.Reference", seed: int = 0):
    """``probs [n, N, C] -> (tv, mmd2)``: the distances of a set of networks' test predictions to the HMC run
    ``other``: TV of the model average and function-space MMD² with the median bandwidth of the training run
    and ``other`` (drawn with ``seed``)."""
    ref0 = targets.hmc_reference(task, HMC_RUNS["training"])
    h = median_bandwidth(ref0.probs, other.probs, generator=torch.Generator().manual_seed(seed))
    mean = other.probs.mean(0)
    return lambda probs: (float(M.total_variation(probs.mean(0), mean)), float(mmd2(probs, other.probs, bandwidth=h)))


def _distances_to_run1(task: str, seed: int = 0):
    """``probs [n, N, C] -> {"tv_run1", "mmd2_run1"}``: :func:`_distances_to` the validation run (seed 1),
    as :func:`methods_table` and :func:`repeated_distances` report them."""
    to = _distances_to(task, targets.hmc_reference(task, HMC_RUNS["validation"]), seed)
    return lambda probs: dict(zip(("tv_run1", "mmd2_run1"), to(probs)))


def validation_distances(task: str, theta: Tensor, seed: int = 0, probs: Tensor | None = None) -> dict[str, float]:
    """How close networks ``theta [n, D]`` of ``task``'s posterior are to the validation HMC run (the run
    every choice reads; the test run is read only by :func:`verdict_table`): ``tv`` (total variation of
    their model average to the run's on the test inputs) and ``mmd2`` (function-space MMD², the bandwidth
    of :func:`methods_table`). ``probs``: the networks' predictive probabilities on the test inputs, when
    the caller has them already."""
    from wsbook.experiments.tasks import get_task

    if probs is None:
        spec, x = targets.hmc_reference(task, HMC_RUNS["training"]).spec, get_task(task).data().x_test
        with torch.no_grad():
            probs = targets.predictive_probs(spec, spec.check(theta, "theta"), x)
    tv, mm = _distances_to(task, targets.hmc_reference(task, HMC_RUNS["validation"]), seed)(probs)
    return {"tv": tv, "mmd2": mm}


def repeated_distances(task: str, samplers: dict, n: int, repeats: int, seed: int = 0):
    """The two distances of :func:`methods_table` to the held-out HMC run (TV of the model average,
    ``tv_run1``; function-space MMD², ``mmd2_run1``, with the same bandwidth) for ``repeats`` independent sets
    of ``n`` networks from each sampler. One set decides nothing when two methods are close: the distances
    of ``n`` networks scatter by about as much as they differ.

    Args:
        task: the task of the HMC reference.
        samplers: ``{name: draw}`` with ``draw(n, generator) -> networks [n, D]``.
        n, repeats: networks per set and sets per sampler (set ``i`` of every sampler from seed ``i``).
        seed: the bandwidth's seed, as in :func:`methods_table`.

    Returns:
        A DataFrame with one row per sampler and set (index ``(name, i)``) and columns ``tv_run1`` and
        ``mmd2_run1``; :func:`summarise_repeats` gives means and standard errors.
    """
    import pandas as pd
    from wsbook.experiments.tasks import get_task

    if repeats < 2 or n < 2:
        raise ValueError(f"repeated_distances: needs at least 2 sets of 2 networks; got {repeats} of {n}")
    spec, x = targets.hmc_reference(task, 0).spec, get_task(task).data().x_test
    to_run1 = _distances_to_run1(task, seed)
    rows = {}
    for name, draw in samplers.items():
        for i in range(repeats):
            with torch.no_grad():
                networks = draw(n, torch.Generator().manual_seed(i))
                rows[(name, i)] = to_run1(targets.predictive_probs(spec, networks, x))
    return pd.DataFrame(rows).T


def summarise_repeats(per_set):
    """Mean, standard deviation and standard error over the sets of :func:`repeated_distances`, one row per
    sampler and one column per ``(distance, statistic)``."""
    g = per_set.astype(float).groupby(level=0, sort=False)
    out = g.agg(["mean", "std"])
    for col in per_set.columns:
        out[(col, "se")] = out[(col, "std")] / math.sqrt(g.size().iloc[0])
    return out.sort_index(axis=1)


def repeat_count() -> int:
    """Sets per sampler in :func:`validation_scores` and :func:`polished_comparison` at the current scale."""
    return config.by_scale(3, 8, 8)


def hmc_polish(task: str, networks: Tensor, trajectories: int, generator: torch.Generator | None = None) -> Tensor:
    """``networks [n, D]`` each moved by ``trajectories`` Metropolis-corrected HMC transitions on the task's
    posterior (one chain per network, no warm-up), with the step size and leapfrog count of the reference run
    (``hmc_reference(task, 0)``): a sampler's draws used as starting points of short exact chains."""
    from wsbook.bayes.mcmc import hmc
    from wsbook.experiments.tasks import get_task

    if trajectories < 0:
        raise ValueError(f"hmc_polish: trajectories must be >= 0; got {trajectories}")
    if trajectories == 0:
        return networks
    d = targets.hmc_reference(task, 0).diagnostics
    run = hmc(get_task(task).log_posterior(), networks, n_samples=1, n_warmup=0, n_leapfrog=int(d["n_leapfrog"]),
              step_size=float(d["step_size"]), thin=trajectories, compute_dtype=torch.float32, generator=generator,
              progress=False)
    return run.samples.to(networks.dtype)


def polished_comparison(task: str = "breast_cancer", trajectories: tuple[int, ...] = (0, 1, 3),
                        n: int | None = None, repeats: int | None = None):
    """:func:`repeated_distances` for the flow trained on draws and density, mean-field VI and the
    prior, each followed by ``k`` HMC transitions (:func:`hmc_polish`) for every ``k`` in ``trajectories``
    (rows ``"<start> +k"``), with a column ``gradients`` (full-data gradient evaluations per network) beside
    HMC's per effective sample (row ``"hmc per effective sample"``)."""
    from wsbook.experiments.tasks import posterior_sample_size

    n = posterior_sample_size() if n is None else n
    from wsbook.experiments.tasks import vi_posterior

    joint, vi = train_posterior_flow(task, DENSITY_FLOWS[0])[0], vi_posterior(task)
    starts = {DENSITY_FLOWS[0]: lambda m, g: sample_flow(joint, m, g)[0],
              "vi": lambda m, g: vi.sample(m, g).samples.detach(),
              "prior draws": lambda m, g: prior_draws(task, m, g)}
    samplers = {f"{name} +{k}": (lambda m, g, s=start, k=k: hmc_polish(task, s(m, g), k, g))
                for name, start in starts.items() for k in trajectories}
    out = summarise_repeats(repeated_distances(task, samplers, n, repeat_count() if repeats is None else repeats))
    d = targets.hmc_reference(task, 0).diagnostics
    out[("gradients", "per network")] = [int(name.rsplit("+", 1)[1]) * int(d["n_leapfrog"]) for name in out.index]
    out.loc["hmc per effective sample", ("gradients", "per network")] = d["gradient_evaluations"] / d["ess_median"]
    return out


def compare_means(summary, a: str, b: str, column: str) -> str:
    """:func:`~wsbook.experiments.protocol.versus` of row ``a`` of a :func:`summarise_repeats` table against
    row ``b`` in ``column``: ``"met"`` (closer to HMC) when ``a`` is below ``b`` by more than two standard
    errors of the difference, ``"missed"`` when above by as much, ``"level"`` otherwise."""
    a_, b_ = ((summary.loc[r, (column, "mean")], summary.loc[r, (column, "se")]) for r in (a, b))
    return protocol.versus(*a_, *b_)


# How the pages word a distance verdict of one row against another (the other's name follows).
COMPARE_PHRASES = {"met": "closer to HMC than", "level": "level with", "missed": "farther from HMC than"}


def _names(names: list[str]) -> str:
    """``["a"]`` -> ``"a"``, ``["a", "b"]`` -> ``"both a and b"``, more -> ``"each of a, b and c"``."""
    if len(names) == 1:
        return names[0]
    head = ", ".join(names[:-1])
    return f"{'both' if len(names) == 2 else 'each of'} {head} and {names[-1]}"


def standing(distance: float, rivals: dict[str, float]) -> str:
    """Where a distance to HMC stands against the ``rivals``' distances (``{shown name: distance}``), in
    words: "closer to HMC than both mean-field VI and Laplace", "no closer to HMC than both ...", or "closer
    to HMC than Laplace but not than mean-field VI". A tie counts as not closer."""
    if not rivals:
        raise ValueError("standing needs at least one rival")
    beaten = [k for k, v in rivals.items() if distance < v]
    rest = [k for k in rivals if k not in beaten]
    if not rest:
        return f"closer to HMC than {_names(beaten)}"
    if not beaten:
        return f"no closer to HMC than {_names(rest)}"
    return f"closer to HMC than {' and '.join(beaten)} but not than {' and '.join(rest)}"


def share_closed(distance: float, start: float, floor: float) -> float:
    """How much of the way from ``start`` (a sampler that learned nothing, e.g. prior draws) to ``floor``
    (another HMC run) a sampler at ``distance`` has come: 1 at the floor, 0 at the start, below 0 beyond
    the start."""
    if start <= floor:
        raise ValueError(f"the start ({start}) must be farther from HMC than the floor ({floor})")
    return (start - distance) / (start - floor)


# ------------------------------------------------------------------------------------ the protocol
#: the reference HMC runs (seeds of :func:`targets.hmc_reference`) of the posterior protocol: the flows learn
#: the training run's draws; every choice reads the validation run (the run the recipes were tuned against);
#: the verdict reads the test run, which no choice has read. Seed 2 is retired: it was read while the choice
#: rule of :func:`select_flow` was being settled (docs/tuning-log.md), so the test run is a fresh one
HMC_RUNS = {"training": 0, "validation": 1, "test": 3}
#: the rows of :func:`verdict_table` beside the chosen flow
HMC_ROW, VI_ROW, MIXTURE_ROW, FLOW_SOURCE_ROW = ("HMC, training run", "mean-field VI", "per-chain gaussians",
                                                  "the flow's source")
#: the row beside a chosen guided flow: prior draws moved by the same guidance (:func:`guided_prior`)
GUIDANCE_CONTROL_ROW = "prior + the same guidance"
#: the guidance weights ``lambda`` the verdict tries on the flow trained on draws and density: each is a
#: candidate of its own, so the weight is chosen on the validation run with the flows
GUIDANCE_WEIGHTS = (0.2, 0.5, 1.0)
#: the guided candidates by row name: ``{name: lambda}``
GUIDED_FLOWS = {f"{DENSITY_FLOWS[0]}, guided λ={w:g}": w for w in GUIDANCE_WEIGHTS}


@dataclass(frozen=True)
class Candidate:
    """A posterior sampler the verdict chooses among: a trained flow, drawn plainly or with task-loss
    guidance (``guide``, :func:`task_guidance`)."""

    flow: WeightFlow
    guide: object | None = None
    task: str = "breast_cancer"

    def draw(self, n: int, generator: torch.Generator) -> Tensor:
        """``n`` networks ``[n, D]``."""
        if self.guide is None:
            return sample_flow(self.flow, n, generator)[0]
        return sample_guided(self.flow, n, self.guide, generator)

    def source(self, n: int, generator: torch.Generator) -> Tensor:
        """``n`` networks of the flow's source (the flow with a zero field)."""
        return self.flow.chart.to_weights(self.flow.chart.sample_source(n, generator))

    def control(self, n: int, generator: torch.Generator) -> Tensor:
        """``n`` prior draws moved by the same guidance alone (:func:`guided_prior`); only for a guided one."""
        if self.guide is None:
            raise ValueError("an unguided flow has no guidance control")
        return guided_prior(self.flow, n, self.guide, self.task, generator)


def candidates(task: str = "breast_cancer") -> dict:
    """The posterior samplers :func:`verdict_table` chooses among, by row name: ``{name: seed -> Candidate}``:
    every flow of :data:`FLOWS`, and the flow trained on draws and density with each guidance weight of
    :data:`GUIDANCE_WEIGHTS` (:data:`GUIDED_FLOWS`; the same trained flow, so a weight costs no training)."""
    out = {name: (lambda s, name=name: Candidate(train_posterior_flow(task, name, s)[0], task=task))
           for name in FLOWS}
    for name, w in GUIDED_FLOWS.items():
        out[name] = lambda s, w=w: Candidate(train_posterior_flow(task, DENSITY_FLOWS[0], s)[0],
                                                       task_guidance(task, w), task)
    return out


#: the prefix of the rows of :func:`validation_scores` for the VI fits, one per seed (:func:`vi_row`)
VI_FIT_ROW = f"{VI_ROW}, seed "


def vi_row(seed: int) -> str:
    """The row of :func:`validation_scores` for the mean-field VI fit of ``seed``."""
    return f"{VI_FIT_ROW}{seed}"


def validation_scores(task: str = "breast_cancer", n: int | None = None, repeats: int | None = None,
                      vi_seeds: tuple[int, ...] = protocol.SEEDS):
    """:func:`summarise_repeats` of every candidate of seed 0 (:func:`candidates`) and of the mean-field VI fit
    of every seed of ``vi_seeds`` (rows :func:`vi_row`: by default the fits :func:`verdict_table` compares
    against) against the validation run, over ``repeats`` sets of ``n`` networks (defaults as
    :func:`polished_comparison`)."""
    from wsbook.experiments.tasks import posterior_sample_size, vi_posterior

    if not vi_seeds:
        raise ValueError("validation_scores: needs at least one VI seed (the yardstick of select_flow)")
    n = posterior_sample_size() if n is None else n
    samplers = {name: (lambda m, g, c=make(0): c.draw(m, g)) for name, make in candidates(task).items()}
    for s in vi_seeds:
        samplers[vi_row(s)] = lambda m, g, vi=vi_posterior(task, s): vi.sample(m, g).samples.detach()
    return summarise_repeats(repeated_distances(task, samplers, n, repeat_count() if repeats is None else repeats))


def select_flow(validation) -> str:
    """The candidate whose worse ratio to VI on the validation run is lowest, from a :func:`validation_scores`
    table: for each candidate the larger of its mean TV over VI's and its mean MMD² over VI's, VI's being the
    mean over its fits (the rows :func:`vi_row`; one fit's distances scatter from seed to seed by as much as
    the candidates differ). The goal asks for a sampler closer to HMC than VI in both measures, so the choice
    is the one with the widest margin in the measure where its margin is narrower."""
    mean = validation.xs("mean", axis=1, level=1)
    vi = [name for name in mean.index if name.startswith(VI_FIT_ROW)]
    if not vi:
        raise ValueError(f"select_flow: the table has no VI rows ({vi_row(0)!r}, ...); rows: {list(mean.index)}")
    vi_tv, vi_mmd = mean.loc[vi, "tv_run1"].mean(), mean.loc[vi, "mmd2_run1"].mean()
    scores = {name: {"ratio": max(mean.loc[name, "tv_run1"] / vi_tv, mean.loc[name, "mmd2_run1"] / vi_mmd)}
              for name in mean.index if name not in vi}
    return protocol.select_best(scores, "ratio")


def _test_table(test: "targets.Reference", *, task: str, sets: dict[str, list[list[Tensor]]], chosen: str):
    import pandas as pd
    from wsbook.experiments.tasks import get_task

    to_test = _distances_to(task, test)
    spec, x = test.spec, get_task(task).data().x_test
    rows = {}
    for name, per_seed in sets.items():
        # a seed's score is the mean over its sets, so the error bar measures seeds, not one set's luck
        scores = torch.tensor([[to_test(targets.predictive_probs(spec, t, x)) for t in thetas] for thetas in per_seed],
                              dtype=torch.float64).mean(1)                                  # [seeds, (tv, mmd2)]
        (tv_mean, tv_se), (mm_mean, mm_se) = protocol.mean_se(scores[:, 0]), protocol.mean_se(scores[:, 1])
        rows[name] = {"seeds": len(per_seed), "tv": tv_mean, "tv_se": tv_se, "mmd2": mm_mean, "mmd2_se": mm_se}
    table = pd.DataFrame(rows).T
    for other, against in ((VI_ROW, "VI"), (MIXTURE_ROW, "per-chain gaussians")):
        for col, measure in (("tv", "TV"), ("mmd2", "MMD²")):
            protocol.versus_column(table, f"{measure} vs {against}", col,
                                   [r for r in (chosen, FLOW_SOURCE_ROW, GUIDANCE_CONTROL_ROW) if r in sets], other)
    return table


def verdict_table(task: str = "breast_cancer", n: int | None = None, seeds: tuple[int, ...] = protocol.SEEDS):
    """The posterior protocol end to end: choose on the validation run, train over fresh seeds, judge on the
    test run.

    The flow (a :func:`candidates` sampler: a trained flow, perhaps with task-loss guidance) is chosen by
    :func:`select_flow` from :func:`validation_scores` (seed-0 flows). It is then trained once per seed of
    ``seeds`` (not seed 0, whose sample the choice read), and from each seed :func:`repeat_count` sets of
    ``n`` networks of every row are scored against the test run (as the validation scores are): the flow's,
    its source's (the flow with a zero field), those of a mean-field VI fit of that seed, of the mixture of
    per-chain Gaussians fitted to the training run's draws (:func:`gaussian_fits`), draws of the training
    run itself (the row a perfect sampler would match) and, for a guided flow, prior draws moved by the same
    guidance (:data:`GUIDANCE_CONTROL_ROW`).
    A seed's score is the mean over its sets; :func:`wsbook.experiments.protocol.final_report` computes the
    total variation of the model average (``tv``) and function-space MMD² (``mmd2``) against the test run,
    their mean and standard error over the seeds (the training seed's spread, with one set's sampling noise
    averaged down), and verdict columns
    (:func:`~wsbook.experiments.protocol.versus`: *met* = closer beyond two standard errors) of the flow,
    its source (and the guidance control) against VI and against the per-chain Gaussians.

    Returns the DataFrame with ``attrs``: ``selected``, ``validation`` (the table the choice read), ``n``,
    ``runs`` (:data:`HMC_RUNS`) and ``goal`` (*met* when the flow is closer than VI in both measures).
    """
    n, recipes, methods = _verdict_settings(n)
    return _verdict_table(task, n, tuple(seeds), recipes, methods, repeat_count(), GUIDANCE_WEIGHTS)


def verdict_seed(task: str = "breast_cancer", seed: int = 1, n: int | None = None) -> WeightFlow:
    """One training seed of :func:`verdict_table`: the chosen candidate's flow trained with ``seed`` (cached).
    The command line computes each seed on its own (``verdict/posterior/seed/<seed>``), so that ``--jobs``
    trains them side by side."""
    n, recipes, methods = _verdict_settings(n)
    chosen, _ = _choice(task, n, recipes, methods, repeat_count(), GUIDANCE_WEIGHTS)
    return candidates(task)[chosen](seed).flow


def _verdict_settings(n: int | None) -> tuple[int, dict, tuple]:
    """What the verdict's entries are keyed by besides the task: the set size (default
    :func:`~wsbook.experiments.tasks.posterior_sample_size`), every candidate flow's training settings, and
    VI's and HMC's settings."""
    from wsbook.experiments.tasks import posterior_sample_size, settings

    n = posterior_sample_size() if n is None else int(n)
    return n, {name: _recipe(name) for name in FLOWS}, (settings("vi"), settings("hmc"))


@cached("flows/posterior_choice", version=1)
def _choice(task: str, n: int, recipes: dict, methods: tuple, repeats: int, guidance: tuple[float, ...]):
    """``(chosen, validation table)``: :func:`select_flow` of :func:`validation_scores`, cached under what
    :func:`verdict_table`'s entry is (every training seed of the verdict reads it)."""
    validation = validation_scores(task, n, repeats)
    return select_flow(validation), validation


@cached("flows/posterior_verdict", version=4)   # 4: VI's mean over the verdict's fits as the yardstick, test run 3
def _verdict_table(task: str, n: int, seeds: tuple[int, ...], recipes: dict, methods: tuple, repeats: int,
                   guidance: tuple[float, ...]):
    """:func:`verdict_table`, cached under everything it reads besides the HMC runs' own entries: the
    candidates' training settings (``recipes``) and guidance weights, VI's and HMC's settings (``methods``),
    the validation repeats."""
    from wsbook.experiments.tasks import vi_posterior

    chosen, validation = _choice(task, n, recipes, methods, repeats, guidance)
    make, train = candidates(task)[chosen], targets.hmc_reference(task, HMC_RUNS["training"])
    rows = [HMC_ROW, chosen, FLOW_SOURCE_ROW, VI_ROW, MIXTURE_ROW]
    sets: dict[str, list[list[Tensor]]] = {row: [] for row in rows}
    for s in seeds:
        gen = torch.Generator().manual_seed(s)
        candidate, vi = make(s), vi_posterior(task, s)
        if candidate.guide is not None:
            sets.setdefault(GUIDANCE_CONTROL_ROW, [])
        for per_seed in sets.values():
            per_seed.append([])
        for _ in range(repeats):
            with torch.no_grad():
                sets[chosen][-1].append(candidate.draw(n, gen))
                sets[FLOW_SOURCE_ROW][-1].append(candidate.source(n, gen))
                sets[VI_ROW][-1].append(vi.sample(n, gen).samples)
            sets[MIXTURE_ROW][-1].append(gaussian_fits(task, n, gen)[MIXTURE_ROW][0])
            sets[HMC_ROW][-1].append(train.theta[protocol.iid_rows(len(train.theta), n, gen)])
            if candidate.guide is not None:
                sets[GUIDANCE_CONTROL_ROW][-1].append(candidate.control(n, gen))
    test = protocol.Sealed(targets.hmc_reference(task, HMC_RUNS["test"]), f"{task}: the test HMC run")
    table = protocol.final_report(_test_table, test, task=task, sets=sets, chosen=chosen)
    goal = [table.loc[chosen, f"{m} vs VI"] for m in ("TV", "MMD²")]
    table.attrs.update(selected=chosen, validation=validation, n=n, runs=dict(HMC_RUNS),
                       goal="met" if goal == ["met", "met"] else "missed" if "missed" in goal else "level")
    return table


def posterior_terms(task: str, sets: dict[str, Tensor]):
    """The two terms of the unnormalised log posterior of every network in ``sets`` (``{name: [n, D]}``): the
    training log-likelihood (summed over the training set) and the log prior. Where a sampler's networks sit
    on these two axes against HMC's says which term it misses: the posterior's typical set is where HMC's
    draws are. Returns a long DataFrame with columns ``set``, ``log_likelihood`` and ``log_prior``, one row
    per network."""
    import pandas as pd
    from wsbook.experiments.tasks import get_task

    lp = get_task(task).log_posterior()
    parts = []
    with torch.no_grad():
        for name, theta in sets.items():
            theta = theta.to(lp.x)
            parts.append(pd.DataFrame({"set": name, "log_likelihood": lp.log_likelihood(theta).double().cpu(),
                                       "log_prior": lp.log_prior(theta).double().cpu()}))
    return pd.concat(parts, ignore_index=True)


def memorisation(flow: WeightFlow, theta: Tensor, task: str = "breast_cancer") -> dict:
    """Median nearest-neighbour distance (in the flow's chart) from the flow's samples ``theta`` to its
    training draws (HMC run 0), beside the same for as many draws of the independent run 1: a flow that
    replays its training draws sits much closer than run 1 does."""
    ref0, ref1 = targets.hmc_reference(task, 0), targets.hmc_reference(task, 1)
    with torch.no_grad():
        points = flow.chart.to_points(theta)
        train = flow.chart.to_points(ref0.theta)
        other = flow.chart.to_points(ref1.theta[ref1.thinned(points.shape[0])])
    return {"flow_to_train": float(median_nn_distance(points, train)),
            "run1_to_train": float(median_nn_distance(other, train))}


# ----------------------------------------------------------------------------- end-to-end cost
#: a function of the HMC reference counts as converged below this split-R-hat ...
RHAT_LIMIT = 1.05
#: ... and the reference as converged when this share of its functions (test points and classes) is
RHAT_SHARE = 0.95
#: the cost goal: a flow sample at least this many times cheaper than an effective HMC sample, training
#: included
COST_GOAL = 10.0
#: the flows are also priced with their training spread over this many times the samples a page draws
COST_MORE = 10
#: the cost verdict of a flow that meets the goal only over :data:`COST_MORE` times the page's samples
MET_AT_MORE = f"met only over {COST_MORE}x the samples"
#: how the cost sentences name a task
TASK_LABELS = {"breast_cancer": "breast-cancer", "mnist5k": "MNIST"}


class NoCost(ValueError):
    """A cost that cannot be measured: the task's HMC reference has not converged (the message says how
    far, :func:`cost_refusal`)."""


def rhat_quantile(ref: "targets.Reference", q: float = RHAT_SHARE) -> float:
    """The ``q`` quantile of the function-space split-R-hat of HMC reference ``ref`` over its test points and
    classes (the statistic of :func:`targets.hmc_reference`'s diagnostics, which report the median, the 90th
    percentile and the maximum)."""
    probs = ref.probs
    draws = probs.view(ref.draws_per_chain, ref.n_chains, *probs.shape[1:])     # rows are draw-major
    return float(M.split_rhat(draws).flatten().quantile(q))


def cost_refusal(task: str) -> str | None:
    """``None`` when ``task``'s HMC reference (run 0) has converged, a split-R-hat below
    :data:`RHAT_LIMIT` for :data:`RHAT_SHARE` of its functions; otherwise the sentence that says no cost
    can be measured against it, with the quantile computed."""
    return _refusal(task, rhat_quantile(targets.hmc_reference(task, 0)))


def _refusal(task: str, p: float) -> str | None:
    if p < RHAT_LIMIT:
        return None
    shown = f"{p:.3f}" if p < 10 else f"{p:.0f}"
    return (f"no {TASK_LABELS.get(task, task)} cost can be measured: the HMC reference has not converged "
            f"(R-hat p{100 * RHAT_SHARE:.0f} = {shown})")


def cost_verdict(ratio_n: float, ratio_more: float, goal: float = COST_GOAL) -> str:
    """The cost goal's word: ``"met"`` when a flow sample is at least ``goal`` times cheaper than an
    effective HMC sample with its training spread over the samples the page draws (``ratio_n``),
    :data:`MET_AT_MORE` when it is only once the training is spread over :data:`COST_MORE` times as many
    (``ratio_more``), ``"missed"`` when not even then. (A cost is one measured ratio, not a mean over seeds,
    so the protocol's *level*, within two standard errors, does not apply.)"""
    if ratio_n >= goal:
        return "met"
    return MET_AT_MORE if ratio_more >= goal else "missed"


def amortised_cost(train_seconds: float, sample_seconds: float, n: int, hmc_seconds: float, hmc_ess: float,
                   reference_seconds: float = 0.0, more: int = COST_MORE) -> dict:
    """The end-to-end cost arithmetic of a flow sample against an effective HMC sample.

    A flow pays ``train_seconds`` once (and ``reference_seconds``, the HMC run whose draws it learned, if
    any), then ``sample_seconds`` for ``n`` independent networks; HMC pays ``hmc_seconds`` (the whole run,
    its initialisation and warm-up included) for ``hmc_ess`` effective samples. Returns the seconds per
    flow sample with the one-off cost spread over ``n`` and over ``more * n`` samples, HMC's seconds per
    effective sample and the ratios (HMC over flow, above 1: the flow is cheaper), with the goal's verdict
    (:func:`cost_verdict`) and ``n_for_goal``, the fewest samples over which the one-off cost must be spread
    for a flow sample to be :data:`COST_GOAL` times cheaper (``inf`` when sampling alone is too slow)."""
    if n < 1 or more < 1:
        raise ValueError(f"amortised_cost: n and more must be >= 1; got n={n}, more={more}")
    if not (hmc_seconds > 0 and hmc_ess > 0):
        raise ValueError(f"amortised_cost: HMC needs positive seconds and ESS; got {hmc_seconds}, {hmc_ess}")
    if min(train_seconds, sample_seconds, reference_seconds) < 0:
        raise ValueError("amortised_cost: seconds must be >= 0")
    once = train_seconds + reference_seconds
    per_sample = sample_seconds / n
    per_n, per_more = once / n + per_sample, once / (more * n) + per_sample
    hmc_per_ess = hmc_seconds / hmc_ess
    ratio_n, ratio_more = hmc_per_ess / per_n, hmc_per_ess / per_more
    room = hmc_per_ess / COST_GOAL - per_sample          # what the one-off cost may add per sample
    n_for_goal = math.inf if room <= 0 else max(1, math.ceil(once / room))
    return {"train_seconds": train_seconds, "reference_seconds": reference_seconds,
            "sample_seconds_per_sample": per_sample, "n": n, "seconds_per_sample_n": per_n,
            "n_more": more * n, "seconds_per_sample_more": per_more, "hmc_seconds": hmc_seconds,
            "hmc_ess": hmc_ess, "hmc_seconds_per_ess": hmc_per_ess,
            "ratio_sampling": hmc_per_ess / per_sample if per_sample > 0 else math.inf,
            "ratio_n": ratio_n, "ratio_more": ratio_more, "n_for_goal": n_for_goal,
            "verdict": cost_verdict(ratio_n, ratio_more)}


def cost(train_seconds: float, sample_seconds: float, n: int, task: str = "breast_cancer",
         trained_on_draws: bool = True) -> dict:
    """The end-to-end cost of a flow sample on ``task`` against HMC's whole cost per effective sample
    (:func:`amortised_cost`): the flow trained for ``train_seconds`` and drew ``n`` networks in
    ``sample_seconds``; HMC is the reference run 0, its wall time (warm-up included) over the median
    function-space ESS of its test predictive. A flow ``trained_on_draws`` of that run is also charged the
    run itself (its training set). The row adds the reference's split-R-hat quantile (``hmc_rhat_p95``).

    Raises:
        NoCost: the reference has not converged (:func:`cost_refusal`): its ESS prices nothing.
    """
    ref = targets.hmc_reference(task, 0)
    p = rhat_quantile(ref)
    refusal = _refusal(task, p)
    if refusal is not None:
        raise NoCost(refusal)
    out = amortised_cost(train_seconds, sample_seconds, n, ref.seconds, float(ref.diagnostics["ess_median"]),
                         reference_seconds=ref.seconds if trained_on_draws else 0.0)
    return out | {"hmc_rhat_p95": p}


def cost_inputs(task: str = "breast_cancer", n: int | None = None, generator: torch.Generator | None = None,
                flows: tuple[str, ...] = FLOWS) -> dict[str, tuple[float, float]]:
    """``{flow: (training seconds, seconds to draw n networks)}`` of ``flows`` (names from :data:`FLOWS`;
    cached trainings, the sampling timed now). The reverse-KL flow's training includes that of the draws
    flow it continues. ``n`` defaults to :func:`tasks.posterior_sample_size`."""
    from wsbook.experiments import tasks

    n = tasks.posterior_sample_size() if n is None else int(n)
    gen = generator if generator is not None else config.generator()
    out = {}
    for name in flows:
        flow, seconds, _ = train_posterior_flow(task, name)
        out[name] = (seconds, sample_flow(flow, n, gen)[2])
    return out


def cost_table(inputs: dict[str, tuple[float, float]], n: int, task: str = "breast_cancer"):
    """The :func:`cost` rows of flows given as ``{name: (training seconds, seconds to draw n networks)}``
    (every flow trained on the reference's draws), one per flow, as a DataFrame.

    Raises:
        NoCost: the task's HMC reference has not converged.
    """
    import pandas as pd

    rows = {name: cost(train, sample, n, task) for name, (train, sample) in inputs.items()}
    return pd.DataFrame.from_dict(rows, orient="index")


def task_cost(task: str = "breast_cancer", n: int | None = None, generator: torch.Generator | None = None,
              inputs: dict[str, tuple[float, float]] | None = None):
    """The cost of ``task``'s posterior flows (:func:`cost_table`) or, where its HMC reference has not
    converged, the sentence that says why none can be measured (:func:`cost_refusal`; nothing is trained
    then). ``inputs`` as for :func:`cost_table`; by default :func:`cost_inputs` of every flow of
    :data:`FLOWS` on breast cancer and of the Euclidean flow trained on draws elsewhere."""
    from wsbook.experiments import tasks

    refusal = cost_refusal(task)
    if refusal is not None:
        return refusal
    n = tasks.posterior_sample_size() if n is None else int(n)
    if inputs is None:
        flows = FLOWS if task == "breast_cancer" else ("euclidean flow",)
        inputs = cost_inputs(task, n, generator, flows)
    return cost_table(inputs, n, task)


# ----------------------------------------------------------------------------- importance weights
PROPOSALS = ("draws", "reverse kl", "joint")


@cached("flows/posterior_is", version=6)   # 5: the proposal is an argument; 6: reverse-KL flow v2
def _importance(task: str, settings: FlowSettings, kl: KLSettings | JointSettings | None, n: int, seed: int) -> dict:
    from wsbook.experiments.tasks import get_task

    name = "euclidean flow" if kl is None else DENSITY_FLOWS[0 if isinstance(kl, JointSettings) else 1]
    flow = train_posterior_flow(task, name)[0]
    gen = torch.Generator().manual_seed(2_000 + seed)
    theta, points, _ = sample_flow(flow, n, gen)
    start = time.perf_counter()
    lq = torch.stack([flow.likelihood(points, steps=settings.lik_steps, method="rk4", estimator="hutchinson",
                                      n_probes=settings.n_probes, generator=gen).logp for _ in range(2)])
    seconds = time.perf_counter() - start
    lp = get_task(task).log_posterior()
    with torch.no_grad():
        log_p = lp(theta)
    return {"theta": theta, "log_p": log_p, "log_q": lq.mean(0), "log_q_probe_se": (lq[0] - lq[1]).abs() / 2,
            "likelihood_seconds": seconds}


def importance_sampling(task: str = "breast_cancer", n: int | None = None, seed: int = 0,
                        proposal: str = "draws") -> dict:
    """Self-normalised importance sampling with a Euclidean posterior flow as proposal, cached.

    ``n`` flow samples get weights ``w_i ∝ p(theta_i, D) / q(theta_i)`` (the task's unnormalised log
    posterior; ``log q`` from the flow's change of variables, Hutchinson-estimated with the mean of two
    independent probe sets). Returns the samples, ``log_p``, ``log_q``, the normalised ``weights``, the
    effective sample size ``ess = 1 / sum w_i^2`` and ``ess_fraction = ess / n``, the probe standard error of
    ``log q`` and the seconds spent on the likelihoods.

    Args:
        task: the task of :func:`train_posterior_flow`.
        n: samples (default: 64 at `ci`, 512 at `default`, 2048 at `full`).
        seed: seeds the samples and the probes.
        proposal: ``"draws"`` (the Euclidean flow trained on HMC draws), ``"reverse kl"`` (that flow trained
            further on the posterior density) or ``"joint"`` (the flow trained on draws and density together;
            :func:`train_posterior_flow`).
    """
    n = config.by_scale(64, 512, 2048) if n is None else int(n)
    if n < 2:
        raise ValueError(f"importance_sampling needs at least 2 samples; got {n}")
    if proposal not in PROPOSALS:
        raise ValueError(f"proposal must be one of {PROPOSALS}; got {proposal!r}")
    kl = {"draws": None, "reverse kl": kl_settings(), "joint": joint_settings()}[proposal]
    out = dict(_importance(task, flow_settings(), kl, n, seed))
    log_w = (out["log_p"] - out["log_q"]).double()
    w = torch.softmax(log_w, 0)
    out.update(log_w=log_w, weights=w, ess=float(1.0 / (w * w).sum()), ess_fraction=float(1.0 / (w * w).sum()) / n,
               max_weight=float(w.max()), log_q_probe_se_median=float(out["log_q_probe_se"].median()))
    return out





# ------------------------------------------------------------------- exact log-densities, fine solvers
LOG_Q_METHODS = ("euler", "rk4")


def flow_with_log_q(flow: WeightFlow, x0: Tensor, steps: int, method: str = "rk4",
                    chunk: int = 256, probes: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Source points ``x0 [B, D]`` of a Euclidean flow carried to ``t = 1`` by ``steps`` fixed steps of
    ``method`` (``"euler"``, the solver the density flows train with, or ``"rk4"``), with ``log q`` carried
    along by the instantaneous change of variables, ``d log q / dt = -div v``
    (:func:`wsbook.flows.likelihood.divergence`): the exact trace (``chunk`` unit vectors per backward pass),
    or, given ``probes [P, B, D]``, Hutchinson's estimate with each sample's ``P`` probes held fixed along
    its path. Returns ``(chart points [B, D], log q)``, ``log q`` of shape ``[B]`` (exact) or ``[P, B]``
    (one estimate per probe, each unbiased: their mean is the estimate, their spread its noise): a sample
    and its log-density under the flow that this solver defines, from one solve (no second solve back to
    the source, whose error would add to the first one's). Doubling ``steps`` until the values stop
    changing gives the density of the flow's ODE itself."""
    if not flow.euclidean:
        raise ValueError("flow_with_log_q: Euclidean charts only (the density flows); use WeightFlow.log_prob "
                         "with estimator='exact' on the spheres")
    if method not in LOG_Q_METHODS:
        raise ValueError(f"flow_with_log_q: method must be one of {LOG_Q_METHODS}; got {method!r}")
    if isinstance(steps, bool) or int(steps) != steps or steps < 1:
        raise ValueError(f"flow_with_log_q: steps must be a positive integer; got {steps!r}")
    eps, h = min(flow.t_eps, 0.5 / steps), 1.0 / steps
    x = flow.chart.check_points(x0, "x0")
    if probes is not None and (probes.dim() != 3 or probes.shape[1:] != x.shape):
        raise ValueError(f"flow_with_log_q: probes must have shape [P, {x.shape[0]}, {x.shape[1]}]; got "
                         f"{tuple(probes.shape)}")
    estimator = "exact" if probes is None else "hutchinson"
    log_q = flow.chart.source_log_prob(x).to(x.dtype)
    if probes is not None:
        log_q = log_q.expand(probes.shape[0], -1)

    def f(t: float, y: Tensor) -> tuple[Tensor, Tensor]:
        return divergence(lambda z: flow.velocity(t, z, None, eps), y, estimator, probes, chunk, per_probe=True)

    for k in range(int(steps)):
        t = k * h
        v1, d1 = f(t, x)
        if method == "euler":
            x, log_q = x + h * v1, log_q - h * d1
            continue
        v2, d2 = f(t + h / 2, x + (h / 2) * v1)
        v3, d3 = f(t + h / 2, x + (h / 2) * v2)
        v4, d4 = f(t + h, x + h * v3)
        x = x + h * (v1 + 2 * v2 + 2 * v3 + v4) / 6
        log_q = log_q - h * (d1 + 2 * d2 + 2 * d3 + d4) / 6
    return x, log_q


#: the rows of :func:`elbos`: the three Euclidean flows by their :data:`FLOWS` name
ELBO_FLOWS = {"flow (draws)": "euclidean flow", "flow (reverse KL)": DENSITY_FLOWS[1],
              "flow (draws + density)": DENSITY_FLOWS[0]}
ELBO_VI = "mean-field VI"


@dataclass(frozen=True)
class ELBOSettings:
    """Sizes of :func:`elbos` (set per scale by :func:`elbo_settings`): ``n`` samples per training seed,
    ``steps`` the RK4 step counts (the estimate at the last, each the double of the one before: the
    change between the last two says whether the solver has converged), ``euler_steps`` the Euler steps
    the density flows train with (the coarse solver shown beside), ``vi_samples`` samples of each VI fit
    (its entropy is exact, its samples cheap), ``probes`` Rademacher probes per sample of Hutchinson's
    divergence (0: the exact trace, ``chunk`` unit vectors per backward pass)."""

    n: int
    steps: tuple[int, ...]
    euler_steps: int
    vi_samples: int
    probes: int = 0
    chunk: int = 256


def elbo_settings() -> ELBOSettings:
    """:func:`elbos`' sizes at the current scale. The exact trace costs ``D`` = 802 vector-Jacobian products
    per field evaluation, Hutchinson's ``probes``; the probes' noise is measured beside the bound
    (``probe_se``). The step counts are where the bound stopped changing (docs/tuning-log.md)."""
    s = config.by_scale
    return ELBOSettings(n=s(4, 32, 128), steps=s((4, 8), (16, 32), (32, 64)),
                        euler_steps=kl_settings().solver_steps, vi_samples=s(256, 512, 2048),
                        probes=s(8, 16, 32))


@cached("flows/posterior_elbo", version=2)
def _elbo_samples(task: str, name: str, recipe: tuple, es: ELBOSettings, seed: int) -> dict:
    from wsbook.experiments.tasks import get_task

    flow = train_posterior_flow(task, name, seed)[0]
    gen = torch.Generator().manual_seed(9_000 + seed)
    x0 = flow.chart.sample_source(es.n, gen)
    probes = rademacher((es.probes, *x0.shape), gen, x0.dtype).to(x0.device) if es.probes else None
    lp = get_task(task).log_posterior()
    out = {}
    for method, k in (("euler", es.euler_steps), *(("rk4", k) for k in es.steps)):
        start = time.perf_counter()
        points, log_q = flow_with_log_q(flow, x0, k, method, es.chunk, probes)
        log_q = log_q.double()
        # the probes' noise on each sample's estimate (their mean): variance over probes / P
        noise = log_q.var(0) / es.probes if es.probes > 1 else torch.zeros(es.n, dtype=torch.float64)
        with torch.no_grad():
            log_w = lp(flow.chart.to_weights(points)).double() - (log_q.mean(0) if es.probes else log_q)
        out[f"{method} {k}"] = {"log_w": log_w.cpu(), "probe_var": noise.cpu(),
                                "seconds": time.perf_counter() - start}
    return out


def _recipe(name: str) -> tuple:
    """The settings a posterior flow's training reads (the cache key of :func:`elbos`' entries)."""
    if name == DENSITY_FLOWS[0]:
        return (flow_settings(), joint_settings())
    if name == DENSITY_FLOWS[1]:
        return (flow_settings(), kl_settings())
    return (flow_settings(),)


@cached("flows/vi_elbo_samples", version=1)
def _vi_elbo_samples(task: str, seed: int, n: int, vi: dict) -> Tensor:
    """``log p(theta, D) - log q(theta)`` of ``n`` draws of mean-field VI fitted with ``seed`` (``vi``: its
    settings, so that they key the entry): float64 ``[n]``, the entropy exact."""
    from wsbook.bayes.vi import gaussian_entropy
    from wsbook.experiments.tasks import get_task, vi_posterior

    q = vi_posterior(task, seed)
    with torch.no_grad():
        theta = q.sample(n, torch.Generator().manual_seed(3_000 + seed)).samples
        return get_task(task).log_posterior()(theta).double() + float(gaussian_entropy(q.std[0]))


def elbos(task: str = "breast_cancer", seeds: tuple[int, ...] = protocol.SEEDS,
          settings: ELBOSettings | None = None):
    """The evidence lower bound ``E_q[log p(theta, D) - log q(theta)] = log p(D) - KL(q || p)`` of the three
    Euclidean flows (:data:`ELBO_FLOWS`) and of mean-field VI, each trained once per seed of ``seeds``: mean
    and standard error over the seeds. All share the unknown ``log p(D)``, so a difference of bounds is a
    difference of reverse KLs to the posterior, the objective that VI and the density flows minimise.

    A flow's ``log q`` is that of its ODE: every sample is carried from the source by RK4 with its
    log-density (:func:`flow_with_log_q`, no second solve back), the divergence by Hutchinson's estimator
    with ``settings.probes`` probes per sample (unbiased, so the bound is too; 0: the exact trace), at each
    step count of ``settings.steps``; the bound at the last count is the estimate, and its change from the
    count before (``doubling``, the same source points: a paired difference) shows whether the solver has
    converged. Beside it the bound that the Euler steps the density flows train with report
    (``euler``): a field trained through a few Euler steps can learn to exploit their error, and
    ``euler - elbo`` is how much it would overstate the bound. VI's entropy is exact. ``probe_se`` is the
    part of a seed's standard error that the probes add (from each sample's spread over its probes).

    Returns a DataFrame indexed by method with columns ``elbo``, ``se`` (over seeds), ``doubling``,
    ``doubling_se`` (the change of the bound when the RK4 steps were last doubled), ``euler``,
    ``euler_se`` (the bound from the training solver), ``euler_gap``, ``euler_gap_se`` (training solver
    minus fine, paired per seed), ``within_se`` (the mean over seeds of a seed's standard error over its
    samples, probe noise included), ``probe_se`` (the probes' share of it) and ``seeds``; NaN where a
    column does not apply (VI). ``attrs``: ``settings``, ``seconds`` (of the flows' solves, all seeds).
    """
    import pandas as pd
    from wsbook.experiments.tasks import settings as method_settings

    es = elbo_settings() if settings is None else settings
    if len(seeds) < 2 or len(es.steps) < 2:
        raise ValueError(f"elbos: needs at least 2 seeds and 2 step counts; got {seeds}, {es.steps}")
    if es.probes == 1 or es.probes < 0:
        raise ValueError(f"elbos: probes must be 0 (exact trace) or at least 2 (so their noise is measured); "
                         f"got {es.probes}")
    fine, coarse, euler = f"rk4 {es.steps[-1]}", f"rk4 {es.steps[-2]}", f"euler {es.euler_steps}"
    rows, seconds = {}, 0.0
    for row, name in ELBO_FLOWS.items():
        per_seed = [_elbo_samples(task, name, _recipe(name), es, s) for s in seeds]
        seconds += sum(float(v["seconds"]) for out in per_seed for v in out.values())
        w = {k: torch.stack([out[k]["log_w"] for out in per_seed]) for k in (fine, coarse, euler)}  # [seeds, n]
        elbo, se = protocol.mean_se(w[fine].mean(1))
        dbl, dbl_se = protocol.mean_se((w[fine] - w[coarse]).mean(1))
        eu, eu_se = protocol.mean_se(w[euler].mean(1))
        gap, gap_se = protocol.mean_se((w[euler] - w[fine]).mean(1))
        within = float((w[fine].std(1) / math.sqrt(es.n)).mean())
        noise = torch.stack([out[fine]["probe_var"] for out in per_seed])           # [seeds, n]
        probe_se = float((noise.sum(1).sqrt() / es.n).mean())
        rows[row] = {"elbo": elbo, "se": se, "doubling": dbl, "doubling_se": dbl_se, "euler": eu,
                     "euler_se": eu_se, "euler_gap": gap, "euler_gap_se": gap_se, "within_se": within,
                     "probe_se": probe_se, "seeds": len(seeds)}
    w_vi = torch.stack([_vi_elbo_samples(task, s, es.vi_samples, method_settings("vi")) for s in seeds])
    elbo, se = protocol.mean_se(w_vi.mean(1))
    nan = float("nan")
    rows[ELBO_VI] = {"elbo": elbo, "se": se, "doubling": nan, "doubling_se": nan, "euler": nan, "euler_se": nan,
                     "euler_gap": nan, "euler_gap_se": nan,
                     "within_se": float((w_vi.std(1) / math.sqrt(es.vi_samples)).mean()), "probe_se": 0.0,
                     "seeds": len(seeds)}
    table = pd.DataFrame(rows).T
    table.attrs.update(settings=es, seconds=seconds)
    return table


def reweighted(probs: Tensor, weights: Tensor, y: Tensor, task: str = "breast_cancer") -> dict:
    """The model average of ``probs [n, N, C]`` with and without ``weights [n]``: accuracy, NLL, ECE and total
    variation to both reference runs' predictives. Returns ``{"uniform": {...}, "importance": {...}}``."""
    ref0, ref1 = targets.hmc_reference(task, 0), targets.hmc_reference(task, 1)
    out = {}
    for name, w in (("uniform", None), ("importance", weights.to(probs.dtype))):
        p = M.bma(probs, w)
        out[name] = {"accuracy": float(M.accuracy(p, y)), "nll": float(M.nll(p, y)), "ece": float(M.ece(p, y)),
                     "tv_run0": float(M.total_variation(p, ref0.predictive)),
                     "tv_run1": float(M.total_variation(p, ref1.predictive))}
    return out


# -------------------------------------------------------------------------------------- detection
@cached("flows/detection_sets", version=1)
def _other_task_networks(task: str, n: int, steps: int, seed: int) -> Tensor:
    """MAP networks (independent initialisations, the task's prior) of the *same* architecture trained on the
    task's data with a fixed random permutation of the input features: another task for the same weights."""
    from wsbook.bayes.model import LogPosterior
    from wsbook.bayes.optim import deep_ensemble
    from wsbook.experiments.tasks import get_task

    t = get_task(task)
    ds = t.data()
    gen = torch.Generator().manual_seed(3_000 + seed)
    perm = torch.randperm(ds.x_train.shape[1], generator=gen)
    lp = LogPosterior(t.spec, ds.x_train[:, perm], ds.y_train, t.prior_std, t.task)
    return deep_ensemble(lp, n, steps=steps, lr=1e-2, batch_size=t.batch_size, generator=gen).theta.float()


def detection_sets(task: str = "breast_cancer", n: int | None = None, seed: int = 0) -> dict[str, Tensor]:
    """Networks ``{name: [n, D]}`` to score with a flow trained on HMC run 0: ``n`` of its training draws, the
    positives, ``n`` draws of the independent HMC run 1 (``"held-out HMC draws"``), and the negatives: MAP
    networks of another task (the same data with permuted input features), random initialisations
    (Kaiming; and ``N(0, 0.1^2)`` as the zoo's runs start), draws from the prior, held-out draws perturbed by Gaussian noise of 0.3 and 1 times
    the posterior's per-coordinate standard deviation (run 0), the thesis's Adam checkpoints (the zoo) and
    deep-ensemble members.

    Args:
        task: ``"breast_cancer"``.
        n: networks per set (default 32 at `ci`, 128 at `default`, 256 at `full`).
        seed: seeds the draws.
    """
    from wsbook.bayes.model import GaussianPrior
    from wsbook.experiments.tasks import get_task, posterior_run

    n = config.by_scale(32, 128, 256) if n is None else int(n)
    t = get_task(task)
    spec = t.spec
    ref0, ref1 = targets.hmc_reference(task, 0), targets.hmc_reference(task, 1)
    gen = torch.Generator().manual_seed(4_000 + seed)
    held = ref1.theta[ref1.thinned(n)]
    post_std = ref0.theta.std(0)
    z = targets.zoo(task)
    sets = {"training draws (HMC run 0)": ref0.theta[ref0.thinned(n)], "held-out HMC draws": held,
            "another task (permuted features)": _other_task_networks(task, n, config.by_scale(300, 1000, 2000), seed),
            "random init (Kaiming)": spec.init(n, "kaiming", generator=gen),
            "random init N(0, 0.1^2)": 0.1 * torch.randn(n, spec.n_params, generator=gen),
            "prior draws": GaussianPrior(t.prior_std).sample(spec, n, generator=gen).float(),
            "held-out + 0.3 sd noise": held + 0.3 * post_std * torch.randn(n, spec.n_params, generator=gen),
            "held-out + 1 sd noise": held + post_std * torch.randn(n, spec.n_params, generator=gen),
            "Adam checkpoints (zoo)": z.theta[torch.randperm(len(z), generator=gen)[:n]],
            "deep-ensemble members": posterior_run(task, "ensemble", n, seed)["theta"]}
    return {k: v.float().cpu() for k, v in sets.items()}


OWN_SAMPLES = "the flow's own samples"


def off_chart(spec, theta: Tensor, atol: float = 1e-6) -> Tensor:
    """``[n]`` bool: networks with a hidden neuron whose incoming weights and bias are all (near) zero. Such a
    neuron has no direction, so the network has no point on the Geometric chart's product of spheres."""
    dead = [(norms < atol).any(1) for norms in neuron_norms(spec, theta)]
    return torch.stack(dead).any(0).cpu()


@cached("flows/detection", version=6)   # 6: flows trained with the loss weighted per layer
def _log_likelihoods(task: str, chart: str, settings: FlowSettings, sets: dict, seed: int) -> dict:
    flow = train_posterior_flow(task, f"{chart} flow")[0]
    gen = torch.Generator().manual_seed(5_000 + seed)
    n = max(v.shape[0] for v in sets.values())
    own, _, _ = sample_flow(flow, n, gen)
    scored = {**sets, OWN_SAMPLES: own}
    names = list(scored)
    theta = torch.cat([scored[k] for k in names])
    # the Geometric flow's density lives on the product of spheres: a network with a dead neuron is off it
    # (density zero, log q = -inf); the Euclidean flow's density covers every network
    off = off_chart(flow.spec, theta) if chart == "geometric" else torch.zeros(theta.shape[0], dtype=torch.bool)
    lq = torch.full((theta.shape[0],), -math.inf)
    lq[~off] = flow.log_prob(theta[~off], steps=settings.lik_steps, method="rk4", estimator="hutchinson",
                             n_probes=settings.n_probes, generator=gen).cpu()
    return dict(zip(names, lq.split([scored[k].shape[0] for k in names])))


def auroc(positive: Tensor, negative: Tensor) -> float:
    """Area under the ROC curve of a score that should be higher on ``positive`` (scikit-learn)."""
    from sklearn.metrics import roc_auc_score

    y = torch.cat([torch.ones(len(positive)), torch.zeros(len(negative))]).numpy()
    s = torch.cat([positive, negative]).double()
    s = torch.nan_to_num(s, nan=-math.inf).clamp_min(-1e300).numpy()
    return float(roc_auc_score(y, s))


def detection_table(task: str = "breast_cancer", charts: tuple[str, ...] = CHARTS,
                    sets: dict[str, Tensor] | None = None, positive: str = "held-out HMC draws",
                    typical: str = "training draws (HMC run 0)", seed: int = 0):
    """The flows' log-likelihood of every set of :func:`detection_sets` (median over networks) and the AUROC
    of two scores separating ``positive`` from each set: the log-likelihood itself (high = in), and the
    typicality score ``-|log q - m|`` (Nalisnick et al. 2019 on why likelihood alone fails in high
    dimension) with ``m`` the median log-likelihood of the flow's own samples (row ``OWN_SAMPLES``; no data
    needed). Beside them the same two AUROCs for the task's unnormalised log posterior, the oracle that
    knows the data, centred on the ``typical`` set (HMC draws). Returns a DataFrame indexed by set; the
    likelihoods are cached per chart. Where ``sets`` holds both :data:`CHECK_SETS`, ``attrs["check"]`` is
    :func:`density_check` of the same scores: read a chart's AUROCs only where it ``passes``.

    Args:
        task: ``"breast_cancer"``.
        charts: the posterior flows to score with.
        sets: networks to score (default: :func:`detection_sets`).
        positive: the key of the in-distribution set.
        typical: the key of the set whose median log posterior centres the oracle's typicality score.
        seed: seeds the Hutchinson probes.
    """
    import pandas as pd
    from wsbook.experiments.tasks import get_task

    sets = detection_sets(task, seed=seed) if sets is None else sets
    for key in (positive, typical):
        if key not in sets:
            raise ValueError(f"set {key!r} not among {list(sets)}")
    lp = get_task(task).log_posterior()
    with torch.no_grad():
        oracle = {k: lp(v) for k, v in sets.items()}
    scores = {chart: _log_likelihoods(task, chart, flow_settings(), sets, seed) for chart in charts}
    scores["log posterior"] = oracle                   # no row OWN_SAMPLES (NaN in the table)
    cols = {}
    for name, ll in scores.items():
        m = ll[typical if name == "log posterior" else OWN_SAMPLES].median()
        cols[f"median ({name})"] = {k: float(v.median()) for k, v in ll.items()}
        cols[f"AUROC ({name})"] = {k: auroc(ll[positive], v) for k, v in ll.items()}
        cols[f"AUROC typicality ({name})"] = {k: auroc(-(ll[positive] - m).abs(), -(v - m).abs())
                                              for k, v in ll.items()}
    table = pd.DataFrame(cols)
    if all(k in sets for k in CHECK_SETS):      # the check its AUROCs must pass before they are read
        table.attrs["check"] = density_check(task, charts, sets, seed=seed)
    return table


#: the two sets of :func:`detection_sets` that :func:`density_check` rescores
CHECK_SETS = ("training draws (HMC run 0)", "held-out HMC draws")
#: a density passes :func:`density_check`'s numerical test when its scores are within this many nats of
#: the exact trace with twice the solver steps (median over the checked networks) ...
DENSITY_TOLERANCE = 5.0
#: ... and is read as a detector only while it does not tell its own training draws from held-out draws of
#: the same posterior better than this AUROC (a density that does has learned the draws, not the posterior)
MEMORISATION_AUROC = 0.9


@cached("flows/density_check", version=1)
def _exact_log_likelihoods(task: str, chart: str, settings: FlowSettings, sets: dict, steps: tuple,
                           seed: int) -> dict:
    flow = train_posterior_flow(task, f"{chart} flow")[0]
    out = {}
    for name, theta in sets.items():
        start = time.perf_counter()
        out[name] = {f"rk4 {k}": flow.log_prob(theta, steps=k, method="rk4", estimator="exact").cpu()
                     for k in steps}
        out[name]["seconds"] = time.perf_counter() - start
    return out


def check_size() -> int:
    """Networks per set that :func:`density_check` rescores at the current scale (each costs the exact trace,
    ``D`` vector-Jacobian products per field evaluation, at the detection table's RK4 steps and at twice as
    many; `default`'s wider field and twice the steps cost several times `ci`'s)."""
    return config.by_scale(2, 4, 16)


def density_check(task: str = "breast_cancer", charts: tuple[str, ...] = CHARTS,
                  sets: dict[str, Tensor] | None = None, n: int | None = None, seed: int = 0):
    """Is the flows' log-density of their training draws against held-out HMC draws (:func:`detection_table`)
    a numerical artefact, a property of the chart, or memorisation? For each chart: ``n`` networks of each
    of :data:`CHECK_SETS` (spread evenly over :func:`detection_sets`' rows) rescored with the exact trace
    (no probe noise) at the detection table's RK4 steps and at twice as many, beside the table's own
    Hutchinson scores of the same networks, and their median nearest-neighbour distance in the chart to the
    training draws (a training draw's to the others; a repeat of the same draw does not count). Returns a DataFrame indexed by ``(chart, set)``:

    * ``hutchinson`` / ``exact`` / ``exact, 2x steps``: median log-density over the ``n`` networks;
    * ``error``: median over the networks of ``|table's score - exact, 2x steps|`` (nats), the numerical
      error of the table's scores, and ``steps error`` the part due to the steps alone (exact at the
      table's steps against twice as many);
    * ``nn distance``: median distance to the nearest training draw;
    * ``AUROC train vs held-out`` (the chart's rows, from all networks of the two sets): how well the
      table's log-density tells its training draws (high) from held-out draws;
    * ``passes``: ``error`` below :data:`DENSITY_TOLERANCE` for both sets and the AUROC below
      :data:`MEMORISATION_AUROC`; :func:`detection_table`'s AUROCs are read only for charts that pass.

    ``attrs``: ``steps`` (the two RK4 step counts), ``n``, ``seconds`` (of the exact rescoring, per chart).
    """
    import pandas as pd

    sets = detection_sets(task, seed=seed) if sets is None else sets
    st = flow_settings()
    n = check_size() if n is None else int(n)
    steps = (st.lik_steps, 2 * st.lik_steps)
    train = targets.hmc_reference(task, HMC_RUNS["training"]).theta
    picks = {k: torch.linspace(0, len(sets[k]) - 1, min(n, len(sets[k]))).round().long() for k in CHECK_SETS}
    chosen = {k: sets[k][picks[k]] for k in CHECK_SETS}
    rows, seconds = {}, {}
    for chart in charts:
        coarse = _log_likelihoods(task, chart, st, sets, seed)
        exact = _exact_log_likelihoods(task, chart, st, chosen, steps, seed)
        seconds[chart] = sum(float(exact[k]["seconds"]) for k in CHECK_SETS)
        flow = train_posterior_flow(task, f"{chart} flow")[0]
        with torch.no_grad():
            ref = flow.chart.to_points(train)
        sep = auroc(coarse[CHECK_SETS[0]], coarse[CHECK_SETS[1]])
        for k in CHECK_SETS:
            table, lo, hi = coarse[k][picks[k]], exact[k][f"rk4 {steps[0]}"], exact[k][f"rk4 {steps[1]}"]
            with torch.no_grad():
                points = flow.chart.to_points(chosen[k])
            d = torch.cdist(points.double(), ref.double())
            # a training draw is not its own neighbour (nor a repeat of it, a rejected HMC proposal): the
            # distances between distinct draws are many orders of magnitude above cdist's rounding
            d[d < 1e-4 * d.median()] = math.inf
            rows[(chart, k)] = {"hutchinson": float(table.median()), "exact": float(lo.median()),
                                "exact, 2x steps": float(hi.median()),
                                "error": float((table - hi).abs().median()),
                                "steps error": float((lo - hi).abs().median()),
                                "nn distance": float(d.min(1).values.median()),
                                "AUROC train vs held-out": sep}
        ok = all(rows[(chart, k)]["error"] < DENSITY_TOLERANCE for k in CHECK_SETS)
        for k in CHECK_SETS:
            rows[(chart, k)]["passes"] = bool(ok and sep < MEMORISATION_AUROC)
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index = pd.MultiIndex.from_tuples(out.index, names=["chart", "set"])
    out.attrs.update(steps=steps, n=n, seconds=seconds)
    return out


__all__ = ["CHARTS", "FlowSettings", "flow_settings", "KLSettings", "kl_settings", "posterior_field", "FLOWS",
           "train_posterior_flow", "JointSettings", "joint_settings", "sample_flow",
           "methods_table", "HMC_RUNS", "Candidate", "candidates", "GUIDANCE_WEIGHTS", "GUIDED_FLOWS",
           "GUIDANCE_CONTROL_ROW", "VI_FIT_ROW", "vi_row", "validation_scores", "select_flow", "verdict_table",
           "alignment_spread", "prior_draws", "gaussian_fits",
           "task_guidance", "sample_guided", "guided_prior", "guided",
           "posterior_terms", "memorisation", "RHAT_LIMIT", "RHAT_SHARE", "COST_GOAL",
           "COST_MORE", "MET_AT_MORE", "NoCost", "rhat_quantile", "cost_refusal", "cost_verdict", "amortised_cost", "cost",
           "cost_inputs", "cost_table", "task_cost", "importance_sampling", "PROPOSALS", "elbos",
           "ELBO_FLOWS", "ELBO_VI", "ELBOSettings", "elbo_settings", "flow_with_log_q",
           "CHECK_SETS", "DENSITY_TOLERANCE", "MEMORISATION_AUROC", "check_size", "density_check",
           "reweighted",
           "detection_sets", "detection_table", "auroc", "OWN_SAMPLES", "off_chart"]
