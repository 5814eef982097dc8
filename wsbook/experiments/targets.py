"""The targets of the results chapter: checkpoint zoos as in the thesis, a long HMC reference posterior,
and the metrics every generated set of networks is scored with.

* :func:`zoo`: independent optimiser runs trained as one population, one checkpoint every few iterations
  after a discarded burn-in (thesis 000, sec. 7.2-7.3): breast cancer 30-16-16-2 (Adam), MNIST 784-10-10
  (SGD with momentum) and MNIST 784-32-10 (the same, for width transfer), all on the bundled data; and,
  optionally (:data:`OPTIONAL_ZOOS`), the 784-10-10 zoo on the full MNIST when its files are on disk.
  :func:`split_runs` holds out whole runs, since the checkpoints of one run are near-copies of each other.
* :func:`hmc_reference`: HMC on the task's posterior (prior ``N(0, 1)``) with a trajectory length set from
  the prior scale, ``pi/2 * prior_std`` (Izmailov et al., 2021), capped by a per-scale leapfrog budget;
  function-space split-R-hat and ESS of the test predictive. Two seeds give the noise floor.
* :func:`evaluate`, :func:`compare_to_reference`, :func:`methods_against_reference`,
  :func:`zoo_barriers`: per-network and model-averaged accuracy / NLL / ECE, agreement and total variation
  to the reference predictive, function-space MMD with its noise floor, and pairwise loss barriers.

Everything expensive is cached with :mod:`wsbook.cache`; sizes come from :func:`wsbook.config.by_scale`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from wsbook import config, data
from wsbook.bayes import metrics as M
from wsbook.bayes.metrics import predictive_probs  # also the chapters' targets.predictive_probs
from wsbook.bayes.distances import median_bandwidth, mmd2
from wsbook.bayes.mcmc import hmc
from wsbook.bayes.optim import deep_ensemble
from wsbook.cache import cached
from wsbook.nets import CNNSpec, MLPSpec, train_population


# ---------------------------------------------------------------------------------------------- zoos
@dataclass(frozen=True)
class ZooConfig:
    """How a zoo is trained (the thesis's settings; the number of runs is set per scale by :func:`zoo`).

    Attributes:
        dataset: a :mod:`wsbook.data` name (its seeded train / validation / test split is used).
        widths: the MLP's layer widths (ReLU hidden layers).
        optimizer, lr, momentum, weight_decay, batch_size: the optimiser of every run.
        epochs: epochs per run; ``discard_epochs`` at the start contribute no checkpoints.
        every: one checkpoint every ``every`` iterations.
        init_std: runs start from ``N(0, init_std^2)`` weights and biases.
    """

    dataset: str
    widths: tuple[int, ...]
    optimizer: str
    lr: float
    epochs: int
    discard_epochs: int
    every: int
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_size: int = 64
    init_std: float = 0.1

    @property
    def spec(self) -> MLPSpec:
        return MLPSpec(self.widths, activation="relu")

    def load_data(self, device: torch.device | str | None = None) -> data.Dataset:
        """The data set's seeded train / validation / test split, as the networks read it
        (:func:`wsbook.data.load`)."""
        return data.load(self.dataset, device=device)


@dataclass(frozen=True)
class CNNZooConfig(ZooConfig):
    """A zoo of small CNNs (:class:`~wsbook.nets.CNNSpec`: ReLU convolutions with same padding, global
    average pooling, a linear head): ``widths`` are ``(in_channels, *channels, n_classes)`` and the data
    set's flat inputs are read as ``in_channels x side x side`` images."""

    kernel_size: int = 3

    @property
    def spec(self) -> CNNSpec:
        return CNNSpec(self.widths[0], self.widths[1:-1], kernel_size=self.kernel_size, n_classes=self.widths[-1])

    def load_data(self, device: torch.device | str | None = None) -> data.Dataset:
        ds = data.load(self.dataset, device=device)
        side = math.isqrt(ds.n_features // self.widths[0])
        if self.widths[0] * side * side != ds.n_features:
            raise ValueError(f"{self.dataset!r} has {ds.n_features} features: not {self.widths[0]} square images")

        def images(x: Tensor) -> Tensor:
            return x.reshape(-1, self.widths[0], side, side)

        return replace(ds, x_train=images(ds.x_train), x_val=images(ds.x_val), x_test=images(ds.x_test))


ZOOS: dict[str, ZooConfig] = {
    # thesis sec. 7.2: 100 Adam runs from N(0, 0.1^2), 50 epochs, first 10 discarded, a checkpoint every 4
    # iterations (Adam's learning rate and the batch size are not stated; 1e-3 and 64 are the defaults)
    "breast_cancer": ZooConfig("breast_cancer", (30, 16, 16, 2), "adam", 1e-3, epochs=50, discard_epochs=10,
                               every=4),
    # thesis appendix: SGD momentum 0.9, lr 0.1, weight decay 1e-5, 25 epochs, first 5 discarded, every 10
    "mnist5k": ZooConfig("mnist5k", (784, 10, 10), "sgd", 0.1, epochs=25, discard_epochs=5, every=10,
                         momentum=0.9, weight_decay=1e-5),
    "mnist5k_w32": ZooConfig("mnist5k", (784, 32, 10), "sgd", 0.1, epochs=25, discard_epochs=5, every=10,
                             momentum=0.9, weight_decay=1e-5),
    # small CNNs on the 8x8 digits (754 parameters): Adam from N(0, 0.3^2) at the learning rate with the
    # better validation accuracy of 3e-3 and 1e-2; the first half of each run discarded
    "cnn_digits": CNNZooConfig("digits", (1, 8, 8, 10), "adam", 1e-2, epochs=60, discard_epochs=30, every=8,
                               init_std=0.3),
    # the same recipe with twice the hidden channels (1-16-16-10): chapter 8d's reference for width transfer
    "cnn_digits_w16": CNNZooConfig("digits", (1, 16, 16, 10), "adam", 1e-2, epochs=60, discard_epochs=30, every=8,
                                   init_std=0.3),
}


#: the zoos of MLPs (chapters 8 and 8b); the others hold CNNs (:class:`CNNZooConfig`)
MLP_ZOOS = tuple(name for name, cfg in ZOOS.items() if not isinstance(cfg, CNNZooConfig))

#: zoos over data the user may have on disk (:func:`wsbook.data.missing` says whether it is there); no chapter
#: reads them. ``"mnist"``: the ``mnist5k`` recipe on the full MNIST (``WSBOOK_MNIST_DIR``: 50,000 training
#: images, 781 iterations an epoch, so 1,562 kept checkpoints per run, 50 MB of float32 weights; training
#: holds all 1,953 checkpoints of every run at once, 3.1 GB for the 50 runs of ``full``)
OPTIONAL_ZOOS: dict[str, ZooConfig] = {"mnist": replace(ZOOS["mnist5k"], dataset="mnist")}


def zoo_config(name: str) -> ZooConfig:
    """The recipe zoo ``name`` trains with at the current scale: its entry of :data:`ZOOS` or
    :data:`OPTIONAL_ZOOS`, except that at ``ci`` the full-MNIST zoo trains 2 epochs and discards 1."""
    if name in ZOOS:
        return ZOOS[name]
    if name not in OPTIONAL_ZOOS:
        raise ValueError(f"unknown zoo {name!r}; available: {', '.join([*ZOOS, *OPTIONAL_ZOOS])}")
    cfg = OPTIONAL_ZOOS[name]
    epochs, discard = config.by_scale(ci=(2, 1), default=(cfg.epochs, cfg.discard_epochs),
                                      full=(cfg.epochs, cfg.discard_epochs))
    return replace(cfg, epochs=epochs, discard_epochs=discard)


def zoo_runs(name: str) -> int:
    """The number of runs of zoo ``name`` at the current scale."""
    return {"breast_cancer": config.by_scale(ci=8, default=100, full=100),
            "mnist5k": config.by_scale(ci=4, default=20, full=50),
            "mnist5k_w32": config.by_scale(ci=3, default=8, full=50),
            "cnn_digits": config.by_scale(ci=8, default=60, full=200),
            "cnn_digits_w16": config.by_scale(ci=2, default=8, full=20),
            "mnist": config.by_scale(ci=2, default=20, full=50)}[name]


@dataclass
class Zoo:
    """Checkpoints of independent optimiser runs: ``theta [n, D]`` with the run and iteration of every row.

    Attributes:
        name: the zoo's name (a key of :data:`ZOOS` or :data:`OPTIONAL_ZOOS`).
        spec: the architecture.
        theta: the checkpoints ``[n, D]``, run-major (all checkpoints of run 0, then run 1, ...).
        run: the run of every checkpoint ``[n]``.
        step: the optimiser iteration of every checkpoint ``[n]`` (1-based).
        config: how the runs were trained.
        seconds: wall time to train all runs (when the zoo was computed, not when read from the cache).
    """

    name: str
    spec: MLPSpec
    theta: Tensor
    run: Tensor
    step: Tensor
    config: ZooConfig
    seconds: float

    def __len__(self) -> int:
        return self.theta.shape[0]

    @property
    def data(self) -> data.Dataset:
        """The data set's seeded train / validation / test split (images for a CNN zoo)."""
        return self.config.load_data()

    @property
    def runs(self) -> Tensor:
        """The distinct runs in this zoo (sorted)."""
        return torch.unique(self.run)

    def select(self, rows: Tensor) -> "Zoo":
        """The sub-zoo of the given rows (a boolean mask or indices)."""
        rows = rows.to(self.theta.device)
        return replace(self, theta=self.theta[rows], run=self.run[rows], step=self.step[rows])

    def final(self) -> "Zoo":
        """The last checkpoint of every run."""
        order = self.run * (int(self.step.max()) + 1) + self.step
        ends = torch.full((int(self.run.max()) + 1,), -1, dtype=order.dtype, device=order.device)
        ends = ends.scatter_reduce(0, self.run, order, reduce="amax")
        last = order == ends[self.run]
        return self.select(last)


@cached("targets/zoo", version=1)
def _train_zoo(cfg: ZooConfig, n_runs: int, seed: int) -> dict:
    ds = cfg.load_data()
    spec = cfg.spec
    gen = torch.Generator().manual_seed(seed)
    theta0 = (torch.randn(n_runs, spec.n_params, generator=gen) * cfg.init_std).to(ds.x_train)
    per_epoch = max(ds.x_train.shape[0] // cfg.batch_size, 1)        # as train_population: full batches only
    steps = cfg.epochs * per_epoch
    start = time.perf_counter()
    res = train_population(spec, theta0, ds.x_train, ds.y_train, steps=steps, lr=cfg.lr, optimizer=cfg.optimizer,
                           batch_size=cfg.batch_size, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                           checkpoint_every=cfg.every, generator=gen, desc=f"zoo {cfg.dataset}")
    seconds = time.perf_counter() - start
    steps_t = torch.tensor(res.checkpoint_steps)
    keep = steps_t > cfg.discard_epochs * per_epoch
    ck = res.checkpoints[keep.to(res.checkpoints.device)]                  # [K, R, D]
    K = ck.shape[0]
    return {"theta": ck.transpose(0, 1).reshape(K * n_runs, -1).contiguous(),
            "run": torch.arange(n_runs).repeat_interleave(K),
            "step": steps_t[keep].repeat(n_runs),
            "seconds": seconds}


def zoo(name: str, n_runs: int | None = None, seed: int = 0) -> Zoo:
    """The checkpoint zoo ``name`` (one of :data:`ZOOS` or :data:`OPTIONAL_ZOOS`), cached.

    Args:
        name: ``"breast_cancer"``, ``"mnist5k"`` (784-10-10), ``"mnist5k_w32"`` (784-32-10), ``"cnn_digits"``
            (1-8-8-10 CNNs), ``"cnn_digits_w16"`` (1-16-16-10), or ``"mnist"`` (784-10-10 on the full MNIST;
            needs its IDX files in ``WSBOOK_MNIST_DIR``).
        n_runs: independent runs (default: :func:`zoo_runs` at the current scale).
        seed: seeds the initialisations and every run's minibatch order.
    """
    cfg = zoo_config(name)
    n_runs = zoo_runs(name) if n_runs is None else int(n_runs)
    if n_runs < 1:
        raise ValueError(f"n_runs must be positive; got {n_runs}")
    out = _train_zoo(cfg, n_runs, seed)
    dev = out["theta"].device
    return Zoo(name, cfg.spec, out["theta"], out["run"].to(dev), out["step"].to(dev), cfg, float(out["seconds"]))


def split_runs(z: Zoo, n_holdout: int, generator: torch.Generator | None = None) -> tuple[Zoo, Zoo]:
    """Split a zoo by whole runs: ``(training, held_out)``, ``n_holdout`` runs drawn at random held out with
    all their checkpoints (the checkpoints of one run are near-copies, so a split by rows would leak)."""
    runs = z.runs
    if not 1 <= n_holdout < len(runs):
        raise ValueError(f"n_holdout must be in [1, {len(runs) - 1}] for a zoo of {len(runs)} runs; got {n_holdout}")
    gen = generator if generator is not None else config.generator()
    held = runs[torch.randperm(len(runs), generator=gen)[:n_holdout].to(runs.device)]
    is_held = torch.isin(z.run, held)
    return z.select(~is_held), z.select(is_held)


# ------------------------------------------------------------------------------------ HMC reference
@dataclass(frozen=True)
class HMCSettings:
    """Sizes of one reference HMC run.

    Attributes:
        chains: independent chains, started from short MAP runs (``map_steps`` Adam steps).
        pilot: warm-up iterations with ``pilot_leapfrog`` steps that set the step size.
        warmup: further warm-up iterations (step size re-adapted) at the final trajectory length.
        draws: retained draws per chain, every ``thin``-th iteration after warm-up.
        max_leapfrog: cap on the leapfrog steps per iteration (the trajectory length ``pi/2 * prior_std``
            divided by the step size, where the budget allows).
    """

    chains: int
    pilot: int
    pilot_leapfrog: int
    warmup: int
    draws: int
    thin: int
    max_leapfrog: int
    map_steps: int


def hmc_settings(task: str) -> HMCSettings:
    """The reference HMC's sizes for ``task`` at the current scale (the one place they are chosen)."""
    s = config.by_scale
    if task == "breast_cancer":
        return HMCSettings(chains=s(8, 8, 16), pilot=s(15, 60, 200), pilot_leapfrog=20, warmup=s(5, 40, 200),
                           draws=s(24, 200, 1000), thin=1, max_leapfrog=s(40, 250, 2000), map_steps=s(150, 300, 1000))
    if task == "mnist5k":
        # max_leapfrog caps the prior-scale trajectory at `ci` and `default` (cost); five warm-up iterations left
        # `ci`'s step size to the thread count's rounding, with divergent runs (measurements: docs/tuning-log.md)
        return HMCSettings(chains=s(4, 8, 16), pilot=s(10, 40, 200), pilot_leapfrog=10, warmup=s(10, 20, 200),
                           draws=s(8, 200, 1000), thin=1, max_leapfrog=s(8, 40, 1000), map_steps=s(100, 300, 1000))
    raise ValueError(f"no reference HMC for task {task!r}; available: breast_cancer, mnist5k")


@dataclass
class Reference:
    """A reference HMC run: ``theta [S * C, D]`` draw-major (row ``s * C + c``) and its diagnostics.

    ``probs`` (``[S * C, N_test, C]``, test-set class probabilities) is computed on first use.
    """

    task: str
    spec: MLPSpec
    theta: Tensor
    n_chains: int
    draws_per_chain: int
    diagnostics: dict
    _probs: Tensor | None = field(default=None, repr=False)

    @property
    def probs(self) -> Tensor:
        if self._probs is None:
            from wsbook.experiments.tasks import get_task

            ds = get_task(self.task).data()
            self._probs = predictive_probs(self.spec, self.theta, ds.x_test)
        return self._probs

    @property
    def predictive(self) -> Tensor:
        """The model average over all draws, ``[N_test, C]``."""
        return self.probs.mean(0)

    @property
    def seconds(self) -> float:
        return float(self.diagnostics["seconds"])

    def thinned(self, n: int) -> Tensor:
        """``n`` draws spread evenly over the run, all chains alike (rows of :attr:`theta`)."""
        total = self.theta.shape[0]
        if not 1 <= n <= total:
            raise ValueError(f"n must be in [1, {total}]; got {n}")
        return torch.linspace(0, total - 1, n).round().long()


@cached("targets/hmc_reference", version=1)
def _hmc_reference(task: str, settings: HMCSettings, seed: int) -> dict:
    from wsbook.experiments.tasks import get_task

    t = get_task(task)
    lp = t.log_posterior()
    ds = t.data()
    gen = torch.Generator().manual_seed(10_007 * seed + 17)
    start = time.perf_counter()
    init = deep_ensemble(lp, settings.chains, steps=settings.map_steps, lr=1e-2, batch_size=t.batch_size,
                         generator=gen).theta
    # network in float32, positions, momenta and energies in float64
    kw = dict(generator=gen, compute_dtype=torch.float32, dtype=torch.float64)
    pilot = hmc(lp, init, n_samples=1, n_warmup=settings.pilot, n_leapfrog=settings.pilot_leapfrog,
                step_size=0.1 / math.sqrt(lp.n_data), **kw)
    eps = float(pilot.step_size.median())
    target_length = math.pi / 2 * float(t.prior_std)
    n_leapfrog = int(min(settings.max_leapfrog, max(1, math.ceil(target_length / eps))))
    run = hmc(lp, pilot.by_chain()[-1].float(), n_samples=settings.draws, n_warmup=settings.warmup,
              n_leapfrog=n_leapfrog, step_size=eps, thin=settings.thin, **kw)
    seconds = time.perf_counter() - start
    draws = run.by_chain()                                  # [S, C, D]
    S, C = draws.shape[:2]
    theta = draws.reshape(S * C, -1).float()
    probs = predictive_probs(t.spec, theta, ds.x_test).view(S, C, *ds.y_test.shape, -1)
    rhat = M.split_rhat(probs)
    return {"theta": theta, "n_chains": C, "draws_per_chain": S,
            "diagnostics": {"seconds": seconds, "rhat_median": float(rhat.median()),
                            "rhat_p90": float(rhat.flatten().quantile(0.9)), "rhat_max": float(rhat.max()),
                            "ess_median": float(M.ess(probs).median()),
                            "accept_rate": float(run.accept_rate.mean()), "step_size": float(run.step_size.mean()),
                            "n_leapfrog": n_leapfrog, "trajectory_length": n_leapfrog * float(run.step_size.mean()),
                            "target_trajectory_length": target_length,
                            "n_divergent_after_warmup": int(run.info["n_divergent_after_warmup"]),
                            "gradient_evaluations": C * (settings.pilot * settings.pilot_leapfrog +
                                                         (settings.warmup + S * settings.thin) * n_leapfrog),
                            "seed": seed}}


def hmc_reference(task: str, seed: int = 0) -> Reference:
    """The reference HMC posterior of ``task`` (``"breast_cancer"`` or ``"mnist5k"``), cached. A second
    ``seed`` gives an independent run, whose distance to the first is the noise floor of every distance to HMC.

    The trajectory length is ``pi/2 * prior_std`` (Izmailov et al., 2021) over the step size found in a pilot
    warm-up, capped at :class:`HMCSettings` ``.max_leapfrog`` steps; ``diagnostics`` reports the length used,
    the target, acceptance, divergences, the function-space split-R-hat (median, 90th percentile, max over
    test points and classes) and ESS of the test predictive, gradient evaluations and wall time.
    """
    settings = hmc_settings(task)
    out = _hmc_reference(task, settings, seed)
    from wsbook.experiments.tasks import get_task

    return Reference(task, get_task(task).spec, out["theta"], int(out["n_chains"]), int(out["draws_per_chain"]),
                     dict(out["diagnostics"]))


# ------------------------------------------------------------------------------------------ metrics
@dataclass
class Evaluation:
    """Scores of a set of networks on one split.

    Attributes:
        n: networks scored individually.
        accuracy, accuracy_std, nll, nll_std, ece: per-network test accuracy and NLL (mean and std over
            networks) and the mean per-network expected calibration error.
        bma_k: networks in the model average; ``bma_accuracy``, ``bma_nll``, ``bma_ece`` score it.
    """

    n: int
    accuracy: float
    accuracy_std: float
    nll: float
    nll_std: float
    ece: float
    bma_k: int
    bma_accuracy: float
    bma_nll: float
    bma_ece: float

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def evaluate_probs(probs: Tensor, y: Tensor, bma_k: int = 64, generator: torch.Generator | None = None) -> Evaluation:
    """:class:`Evaluation` of a set given by its class probabilities ``probs [n, N, C]`` and labels ``y [N]``;
    the model average is over ``bma_k`` members drawn without replacement (all when ``n <= bma_k``)."""
    if probs.dim() != 3 or probs.shape[1] != y.shape[0]:
        raise ValueError(f"probs must be [n, N={y.shape[0]}, C]; got {tuple(probs.shape)}")
    n = probs.shape[0]
    acc, nl = M.accuracy(probs, y), M.nll(probs, y)
    k = min(bma_k, n)
    gen = generator if generator is not None else config.generator()
    pick = torch.randperm(n, generator=gen)[:k].to(probs.device)
    p = probs[pick].mean(0)
    std = (lambda v: float(v.std()) if n > 1 else 0.0)
    return Evaluation(n=n, accuracy=float(acc.mean()), accuracy_std=std(acc), nll=float(nl.mean()), nll_std=std(nl),
                      ece=float(M.ece(probs, y).mean()), bma_k=k, bma_accuracy=float(M.accuracy(p, y)),
                      bma_nll=float(M.nll(p, y)), bma_ece=float(M.ece(p, y)))


def evaluate(spec: MLPSpec, theta: Tensor, ds: data.Dataset, bma_k: int = 64, split: str = "test",
             generator: torch.Generator | None = None) -> Evaluation:
    """Score networks ``theta [n, D]`` on a split of ``ds``: per-network accuracy / NLL (mean +- std) and ECE,
    and the model average of ``bma_k`` of them (see :func:`evaluate_probs`).

    Args:
        spec: the architecture of ``theta``.
        theta: the networks.
        ds: the data set (``zoo.data`` or ``wsbook.data.load(name)``).
        bma_k: members in the model average.
        split: ``"test"`` or ``"val"``.
        generator: picks the model-average members.
    """
    if split not in ("test", "val"):
        raise ValueError(f"split must be 'test' or 'val'; got {split!r}")
    x, y = getattr(ds, f"x_{split}"), getattr(ds, f"y_{split}")
    return evaluate_probs(predictive_probs(spec, spec.check(theta), x), y, bma_k=bma_k, generator=generator)


@dataclass
class Comparison:
    """A set of networks against a reference set, in function space.

    Attributes:
        agreement, tv: of the set's model average against the reference's (Izmailov et al., 2021).
        mmd2: unbiased squared MMD between the networks' test probabilities and the reference's.
        mmd2_floor: the same between the reference and an independent second set of its kind (another HMC
            run, or other held-out runs): what sampling noise alone gives.
        tv_floor: total variation between the two reference model averages.
        bandwidth: the kernel bandwidth shared by both MMDs (median heuristic on the two reference sets).
    """

    agreement: float
    tv: float
    mmd2: float
    mmd2_floor: float
    tv_floor: float
    bandwidth: float

    @property
    def mmd_ratio(self) -> float:
        """``sqrt(mmd2 / mmd2_floor)`` (clamped at zero): how many noise floors away, in MMD units."""
        return math.sqrt(max(self.mmd2, 0.0) / self.mmd2_floor) if self.mmd2_floor > 0 else math.inf


def _subsample(probs: Tensor, k: int, gen: torch.Generator) -> Tensor:
    return probs if probs.shape[0] <= k else probs[torch.randperm(probs.shape[0], generator=gen)[:k].to(probs.device)]


def compare_to_reference(probs: Tensor, reference: Tensor, second: Tensor, *, max_networks: int = 1000,
                         bandwidth: float | None = None, generator: torch.Generator | None = None) -> Comparison:
    """Compare a set of networks with a reference set, each given by test probabilities ``[n, N, C]``.

    Args:
        probs: the set to score (generated networks, another method's samples).
        reference: the reference set (HMC draws, or held-out runs of a zoo).
        second: an independent set of the reference's kind (a second HMC run, other runs of the zoo); the
            distances between ``second`` and ``reference`` are the noise floor.
        max_networks: each set is subsampled to at most this many networks for the MMD.
        bandwidth: kernel bandwidth (default: median heuristic on ``reference`` and ``second``).
        generator: for the subsampling.
    """
    gen = generator if generator is not None else config.generator()
    for name, p in (("probs", probs), ("second", second)):
        if p.shape[1:] != reference.shape[1:]:
            raise ValueError(f"{name} must be [n, {reference.shape[1]}, {reference.shape[2]}] like the reference; "
                             f"got {tuple(p.shape)}")
    ref, sec, own = (_subsample(p, max_networks, gen) for p in (reference, second, probs))
    h = median_bandwidth(ref, sec, generator=gen) if bandwidth is None else float(bandwidth)
    p_ref = reference.mean(0)
    p_own = probs.mean(0)
    return Comparison(agreement=float(M.agreement(p_own, p_ref)), tv=float(M.total_variation(p_own, p_ref)),
                      mmd2=float(mmd2(own, ref, bandwidth=h)), mmd2_floor=float(mmd2(sec, ref, bandwidth=h)),
                      tv_floor=float(M.total_variation(second.mean(0), p_ref)), bandwidth=h)


#: the approximate posterior methods chapters 8 and 8c set beside the HMC reference
COMPARED_TO_HMC = ("sgld", "sghmc", "vi", "laplace", "ensemble")


def method_probs(task: str, n: int, seed: int = 0, methods: tuple[str, ...] = COMPARED_TO_HMC) -> dict[str, tuple]:
    """Test probabilities ``[n, N, C]`` and wall seconds of every posterior method of :mod:`wsbook.bayes.tasks`
    (the book's cached runs, shared with chapter 2), of the second reference HMC run (``n`` evenly spaced
    draws) and of the task's checkpoint zoo (``n`` random checkpoints): ``{name: (probs, seconds)}``."""
    from wsbook.experiments.tasks import posterior_run

    out = {}
    second = hmc_reference(task, seed=1)
    out["hmc"] = (second.probs[second.thinned(n)], second.seconds)
    for m in methods:
        run = posterior_run(task, m, n, seed)
        out[m] = (torch.softmax(run["f_test"].float(), -1), float(run["seconds"]))
    if task in ZOOS:
        z = zoo(task)
        gen = torch.Generator().manual_seed(seed)
        pick = torch.randperm(len(z), generator=gen)[:n].to(z.theta.device)
        out["sgd_trajectory"] = (predictive_probs(z.spec, z.theta[pick], z.data.x_test), z.seconds)
    return out


def methods_against_reference(task: str, n: int, seed: int = 0, bma_k: int | None = None,
                              extra: dict[str, tuple] | None = None):
    """The table of the results chapter: every posterior method (and ``extra`` rows ``{name: (probs,
    seconds)}``, e.g. flows) against the reference HMC run of ``task`` (seed 0). Columns: agreement and total
    variation of the model average to HMC's, test accuracy, NLL and ECE of the model average of all ``n``
    networks (``bma_k``), the unbiased function-space MMD^2 to the HMC draws and seconds. The row ``hmc`` is the
    independent second run (the noise floor). Returns a pandas DataFrame indexed by method.

    Args:
        task: ``"breast_cancer"`` or ``"mnist5k"`` (a task with a reference and, for the zoo row, a zoo).
        n: networks per method (the chapters' cached posterior runs of this size are reused).
        seed: seed of the methods' runs, of the zoo subsample and of the MMD subsampling.
        bma_k: members of each model average (default: all ``n``).
        extra: further rows, ``{name: (test probabilities [m, N, C], seconds)}``.
    """
    import pandas as pd

    ref = hmc_reference(task, seed=0)
    second = hmc_reference(task, seed=1)
    y = data.load(task).y_test
    rows = []
    sets = {**method_probs(task, n, seed), **(extra or {})}
    gen = torch.Generator().manual_seed(seed)
    h = median_bandwidth(ref.probs, second.probs, generator=gen)
    for name, (probs, seconds) in sets.items():
        ev = evaluate_probs(probs, y, bma_k=bma_k or probs.shape[0], generator=gen)
        cmp = compare_to_reference(probs, ref.probs, second.probs, bandwidth=h, generator=gen)
        rows.append(dict(method=name, agreement=cmp.agreement, tv=cmp.tv, accuracy=ev.bma_accuracy, nll=ev.bma_nll,
                         ece=ev.bma_ece, mmd2=cmp.mmd2, seconds=seconds))
    return pd.DataFrame(rows).set_index("method")


# ------------------------------------------------------------------------------------------ barriers
def zoo_barriers(z: Zoo, n_networks: int, generator: torch.Generator | None = None,
                 split: str = "train") -> dict[str, Tensor]:
    """Pairwise midpoint loss barriers among ``n_networks`` checkpoints of distinct runs of a zoo, before and
    after aligning all of them to the first by weight matching (thesis 000, Fig. 7.2).

    The barrier of a pair is ``L((a + b) / 2) - (L(a) + L(b)) / 2`` (cross-entropy on ``split``). Returns
    ``{"unaligned": [k, k], "aligned": [k, k]}`` symmetric matrices with a zero diagonal, and ``"runs" [k]``.

    Args:
        z: the zoo.
        n_networks: how many runs (one random checkpoint each) enter the matrices.
        generator: picks the runs, the checkpoints and the weight-matching layer order.
        split: the data split whose loss is interpolated (``"train"``, ``"val"`` or ``"test"``).
    """
    from wsbook.symmetry import interpolation_curve, weight_matching

    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be 'train', 'val' or 'test'; got {split!r}")
    gen = generator if generator is not None else config.generator()
    runs = z.runs
    if not 2 <= n_networks <= len(runs):
        raise ValueError(f"n_networks must be in [2, {len(runs)}] (one per run); got {n_networks}")
    chosen = runs[torch.randperm(len(runs), generator=gen)[:n_networks].to(runs.device)]
    # one random retained checkpoint of every chosen run: sort by (run, random key), take each run's first row
    key = z.run.to(torch.float64) * 2 + torch.rand(len(z), generator=gen, dtype=torch.float64).to(z.run.device)
    order = key.argsort()
    first = torch.ones(len(z), dtype=torch.bool, device=z.run.device)
    first[1:] = z.run[order][1:] != z.run[order][:-1]
    per_run = torch.full((int(z.run.max()) + 1,), -1, dtype=torch.long, device=z.run.device)
    per_run[z.run[order][first]] = order[first]
    theta = z.theta[per_run[chosen]]
    aligned = weight_matching(z.spec, theta[0], theta, generator=gen).aligned
    ds = z.data
    x, y = getattr(ds, f"x_{split}"), getattr(ds, f"y_{split}")
    i, j = torch.triu_indices(n_networks, n_networks, 1)
    out = {"runs": chosen}
    for key, t in (("unaligned", theta), ("aligned", aligned)):
        loss = interpolation_curve(z.spec, t[i], t[j], x, y, n_points=3)["loss"]      # [pairs, 3]
        b = loss[:, 1] - 0.5 * (loss[:, 0] + loss[:, 2])
        mat = torch.zeros(n_networks, n_networks, dtype=b.dtype, device=b.device)
        mat[i, j] = b
        mat[j, i] = b
        out[key] = mat
    return out
