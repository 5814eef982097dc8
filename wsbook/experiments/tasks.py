"""Named posterior-inference tasks and cached posterior sample sets for every inference method
(chapter 2, "Inference", and the method chapters' targets).

``posterior_samples(task, method, n)`` returns ``[n, D]`` weight samples (cached through :mod:`wsbook.cache`);
``posterior_run(task, method, n)`` returns them with wall time, diagnostics and the network outputs on the
task's test inputs (and plotting grid), computed with the method's own predictive (the linearized one for
Laplace). The flow chapters read their targets from here.
"""
from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass

import torch
from torch import Tensor

from wsbook import config, data
from wsbook.bayes import metrics as M
from wsbook.bayes.laplace import fit_laplace
from wsbook.bayes.mcmc import hmc, sghmc, sgld
from wsbook.bayes.metrics import ess, split_rhat
from wsbook.bayes.model import GaussianPrior, LogPosterior
from wsbook.bayes.optim import deep_ensemble, sgd_trajectory
from wsbook.bayes.vi import fit_vi
from wsbook.cache import cached
from wsbook.experiments.protocol import mean_se
from wsbook.nets import MLPSpec

METHODS = ("hmc", "sgd_trajectory", "ensemble", "vi", "laplace", "sgld", "sghmc", "map")
#: the methods of :data:`METHODS` whose runs are chains (:func:`chain_modes`)
CHAIN_METHODS = ("hmc", "sgld", "sghmc")


@dataclass(frozen=True)
class Task:
    """A data set, an architecture, a prior and a likelihood: everything that defines a posterior."""

    name: str
    dataset: str
    widths: tuple[int, ...]
    activation: str = "relu"
    prior_std: float = 1.0
    task: str = "classification"   # or "regression" (Gaussian likelihood)
    noise_std: float = 1.0        # regression: observation noise in standardized units
    batch_size: int | None = 64   # minibatch of the stochastic methods
    step_scale: float = 1.0       # SGLD / SGHMC step sizes are step_scale * (0.5, 0.02) / N
    leapfrog_scale: float = 1.0   # HMC trajectory length relative to the scale's default (cost control)

    @property
    def spec(self) -> MLPSpec:
        """The task's architecture."""
        return MLPSpec(self.widths, activation=self.activation)

    def data(self) -> data.Dataset:
        """The task's standardized splits."""
        return data.load(self.dataset)

    def log_posterior(self, dtype: torch.dtype = torch.float32, temperature: float = 1.0) -> LogPosterior:
        """The task's :class:`LogPosterior` on its training split."""
        ds = self.data()
        y = ds.y_train if self.task == "classification" else ds.y_train.to(dtype)
        return LogPosterior(self.spec, ds.x_train.to(dtype), y, GaussianPrior(self.prior_std), self.task,
                            noise_std=self.noise_std, temperature=temperature)

    def grid(self) -> Tensor | None:
        """Plotting inputs for 1-D / 2-D tasks (``None`` otherwise)."""
        if self.widths[0] == 1:
            return torch.linspace(-2.6, 2.6, 200).unsqueeze(1)
        if self.widths[0] == 2:
            g = torch.linspace(-3.0, 3.0, 60)
            xx, yy = torch.meshgrid(g, g, indexing="xy")
            return torch.stack([xx.reshape(-1), yy.reshape(-1)], 1)
        return None


TASKS: dict[str, Task] = {
    "breast_cancer": Task("breast_cancer", "breast_cancer", (30, 16, 16, 2)),
    "digits": Task("digits", "digits", (64, 16, 10), batch_size=128, leapfrog_scale=0.5),
    "mnist5k": Task("mnist5k", "mnist5k", (784, 10, 10), batch_size=128),
    "moons": Task("moons", "moons", (2, 16, 16, 2)),
    "gap1d": Task("gap1d", "gap1d", (1, 32, 32, 1), task="regression", noise_std=0.1, batch_size=None,
                  step_scale=0.01),
}


def get_task(task: str | Task) -> Task:
    """Look up a task by name (one of :data:`TASKS`)."""
    if isinstance(task, Task):
        return task
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; available: {', '.join(TASKS)}")
    return TASKS[task]


def settings(method: str) -> dict:
    """The per-scale sizes of every method (the one place they are chosen)."""
    s = config.by_scale
    return {
        "hmc": dict(chains=s(32, 32, 64), warmup=s(60, 200, 1000), leapfrog=s(10, 30, 100), thin=s(1, 2, 5),
                    map_steps=s(150, 300, 1000)),
        "sgld": dict(chains=s(4, 8, 16), burnin=s(300, 2000, 10000), thin=s(5, 20, 50), lr=None),
        "sghmc": dict(chains=s(4, 8, 16), burnin=s(300, 2000, 10000), thin=s(5, 20, 50), lr=None),
        "ensemble": dict(steps=s(400, 2000, 5000), lr=1e-2),
        "map": dict(steps=s(2000, 2000, 5000), lr=1e-2),
        "sgd_trajectory": dict(runs=s(4, 16, 100), steps=s(400, 2000, 5000), lr=1e-2),
        "vi": dict(steps=s(600, 4000, 20000), lr=1e-2, n_mc=s(2, 4, 8)),
        "laplace": dict(steps=s(400, 2000, 5000), lr=1e-2),
    }[method]


def _outputs(spec: MLPSpec, theta: Tensor, x: Tensor, chunk: int = 256) -> Tensor:
    """Network outputs ``[n, N, out]`` for ``n`` weight samples, in chunks of samples."""
    with torch.no_grad():
        return torch.cat([spec.forward(theta[i:i + chunk].to(x.dtype), x) for i in range(0, theta.shape[0], chunk)])


def _method_generator(t: Task, method: str, seed: int) -> torch.Generator:
    """The random stream of one method's run on one task (one place, so a run can be repeated exactly)."""
    return torch.Generator().manual_seed(seed * 1000 + zlib.crc32(f"{t.name}/{method}".encode()) % 1000)


def _fit_vi(t: Task, gen: torch.Generator, members: int = 1):
    """Mean-field VI on ``t``'s posterior at the scale's settings (the one recipe of the "vi" runs)."""
    cfg = settings("vi")
    return fit_vi(t.log_posterior(), n_members=members, steps=cfg["steps"], lr=cfg["lr"], batch_size=t.batch_size,
                  n_mc=cfg["n_mc"], generator=gen)


def vi_posterior(task: str, seed: int = 0, members: int = 1):
    """The mean-field Gaussian behind ``posterior_run(task, "vi", n, seed)``, fitted again with the same random
    stream (the same fit; seconds at the book's sizes): a :class:`wsbook.bayes.vi.MeanFieldPosterior`. With
    ``members > 1``, that many independent fits of the same recipe at once (each from its own initialisation,
    so each settles in a mode of its own; the first is not the single fit's)."""
    t = get_task(task)
    return _fit_vi(t, _method_generator(t, "vi", seed), members)


def _run(t: Task, method: str, n: int, seed: int) -> dict:
    gen = _method_generator(t, method, seed)
    lp = t.log_posterior()
    ds = t.data()
    spec = t.spec
    cfg = settings(method)
    out: dict = {"task": t.name, "method": method}
    start = time.perf_counter()
    f_test = f_grid = None
    if method in ("ensemble", "map"):
        members = n if method == "ensemble" else 1
        res = deep_ensemble(lp, members, steps=cfg["steps"], lr=cfg["lr"], batch_size=t.batch_size, generator=gen)
        theta = res.theta.expand(n, -1).contiguous() if method == "map" else res.theta
    elif method == "sgd_trajectory":
        runs = min(cfg["runs"], n)
        per = math.ceil(n / runs)
        theta = sgd_trajectory(lp, runs, per, steps=cfg["steps"], lr=cfg["lr"], batch_size=t.batch_size,
                               generator=gen).samples[:n]
        out["n_chains"] = runs
    elif method == "vi":
        q = _fit_vi(t, gen)
        theta = q.sample(n, gen).samples
        out["vi_mean_std"] = float(q.std.mean())
    elif method == "laplace":
        res = deep_ensemble(lp, 1, steps=cfg["steps"], lr=cfg["lr"], batch_size=t.batch_size, generator=gen)
        la = fit_laplace(lp, res.theta, kind="full" if spec.n_params <= 3000 else "diag")
        theta = la.sample(n, gen).samples
        f_test = la.glm_function_samples(ds.x_test, n, gen)[0]
        if t.grid() is not None:
            f_grid = la.glm_function_samples(t.grid().to(ds.x_test), n, gen)[0]
        out["prior_precision"] = float(la.prior_precision[0])
        out["kind"] = la.kind
        # directions the data constrain more than the prior does (GGN eigenvalue above the prior precision)
        out["constrained_directions"] = int((la.eigvals[0] > la.prior_precision[0]).sum())
    elif method == "hmc":
        C = cfg["chains"]
        S = math.ceil(n / C)
        S_full = max(S, 16)        # at least 16 draws per chain for the convergence diagnostics
        start_points = deep_ensemble(lp, C, steps=cfg["map_steps"], lr=1e-2, batch_size=t.batch_size,
                                     generator=gen).theta
        step0 = 0.1 / math.sqrt(lp.n_data)
        on_gpu = lp.x.is_cuda      # GPUs: network in float32, positions and energies in float64
        r = hmc(lp if on_gpu else lp.to(torch.float64), start_points, n_samples=S_full, n_warmup=cfg["warmup"],
                n_leapfrog=max(2, round(cfg["leapfrog"] * t.leapfrog_scale)), step_size=step0, thin=cfg["thin"],
                generator=gen,
                compute_dtype=torch.float32 if on_gpu else None)
        with torch.no_grad():
            f_all = _outputs(spec, r.samples.reshape(-1, spec.n_params).float(), ds.x_test)
        f_all = torch.softmax(f_all, -1) if t.task == "classification" else f_all
        f_all = f_all.view(S_full, C, *f_all.shape[1:])
        keep = torch.linspace(0, S_full - 1, S).round().long()         # evenly spaced draws of every chain
        theta = r.by_chain()[keep].reshape(-1, spec.n_params)[:n].float()
        out.update(rhat_median=float(split_rhat(f_all).median()), ess_median=float(ess(f_all).median()),
                   draws_per_chain=S_full)
        out.update(n_chains=C, accept_rate=float(r.accept_rate.mean()), step_size=float(r.step_size.mean()),
                   n_divergent=int(r.n_divergent.sum()),
                   n_divergent_after_warmup=int(r.info["n_divergent_after_warmup"]))
    elif method in ("sgld", "sghmc"):
        C = cfg["chains"]
        S = math.ceil(n / C)
        start_points = lp.init(C, generator=gen)
        base = t.step_scale * (0.5 if method == "sgld" else 0.02) / lp.n_data
        sampler = sgld if method == "sgld" else sghmc
        r = sampler(lp, start_points, n_samples=S, n_burnin=cfg["burnin"], lr=base, batch_size=t.batch_size,
                    thin=cfg["thin"], schedule="constant", generator=gen)
        theta = r.samples.reshape(-1, spec.n_params)[:n]
        out.update(n_chains=C, lr=base)
    else:
        raise ValueError(f"unknown method {method!r}; available: {', '.join(METHODS)}")
    out["seconds"] = time.perf_counter() - start
    theta = theta.detach().float().contiguous()
    out["theta"] = theta
    out["f_test"] = _outputs(spec, theta, ds.x_test) if f_test is None else f_test.float()
    if t.grid() is not None:
        grid = t.grid().to(ds.x_test)
        out["f_grid"] = _outputs(spec, theta, grid) if f_grid is None else f_grid.float()
    if "n_chains" in out and method not in ("sgd_trajectory", "hmc"):
        C = out["n_chains"]
        S = n // C
        if S >= 4:
            f = out["f_test"][:S * C].view(S, C, *out["f_test"].shape[1:])
            fs = torch.softmax(f, -1) if t.task == "classification" else f
            out["rhat_median"] = float(split_rhat(fs).median())
            out["ess_median"] = float(ess(fs).median())
    return out


def posterior_sample_size() -> int:
    """Networks kept per posterior method at the current scale: one number for chapters 2, 8 and 8c and
    the command line, so they all read the same cached :func:`posterior_run` entries."""
    return config.by_scale(ci=32, default=128, full=512)


def reference_sample_size() -> int:
    """Samples of the independent HMC run (seed 1) that chapter 2's tables score every method against
    (:func:`compare_methods`' ``n_reference``), at the current scale."""
    return config.by_scale(ci=64, default=256, full=2048)


#: the tasks chapter 2 runs every method of :data:`METHODS` on (``digits`` only beyond the ``ci`` scale)
CHAPTER_TASKS = ("gap1d", "moons", "breast_cancer", "digits")


def chapter_tasks() -> tuple[str, ...]:
    """:data:`CHAPTER_TASKS` at the current scale."""
    return CHAPTER_TASKS if config.scale() != "ci" else CHAPTER_TASKS[:-1]


@cached("posterior/run", version=4)   # 3: sgd_trajectory rows draw-major, like every other method
def posterior_run(task: str, method: str, n: int, seed: int = 0) -> dict:
    """Run ``method`` on ``task`` and keep ``n`` posterior samples (cached).

    See chapter 2, "Inference" and "Breast cancer: every method against HMC".

    Args:
        task: a name of :data:`TASKS`.
        method: one of :data:`METHODS`; its per-scale sizes come from :func:`settings`.
        n: number of weight samples kept.
        seed: seeds the method's generator (mixed with the task and method names).

    Returns:
        A dict with ``theta [n, D]`` (for chain methods draw-major: row ``s * n_chains + c``),
        ``f_test [n, N_test, out]`` and, for 1-D/2-D tasks, ``f_grid [n, N_grid, out]`` (network outputs;
        for Laplace from the linearized predictive), ``seconds`` (wall time), and method diagnostics
        (acceptance, step size, divergences, function-space split-R-hat and ESS of the test-set predictive
        across chains; for HMC over all ``draws_per_chain >= 16`` draws, of which ``n`` evenly spaced ones
        are returned).
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; available: {', '.join(METHODS)}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int; got {n!r}")
    return _run(get_task(task), method, n, seed)


def posterior_samples(task: str, method: str, n: int, seed: int = 0) -> Tensor:
    """``n`` weight samples ``[n, D]`` of ``method``'s posterior for ``task`` (see :func:`posterior_run`),
    laid out by ``TASKS[task].spec``.

    Args:
        task: a name of :data:`TASKS`.
        method: one of :data:`METHODS`.
        n: number of samples.
        seed: seed of the run (the same seed returns the same cached samples).
    """
    get_task(task)
    return posterior_run(task, method, n, seed)["theta"]


def predictive_from_outputs(f: Tensor, task: str = "classification") -> Tensor:
    """Bayesian model average of sampled outputs ``[n, N, C]``: class probabilities ``[N, C]`` (eq. 2.1)."""
    if task != "classification":
        raise ValueError("predictive_from_outputs averages class probabilities; use the outputs directly "
                         "for regression")
    return torch.softmax(f, -1).mean(0)


def compare_methods(task: str, methods: list[str], n: int, seed: int = 0, reference: str = "hmc",
                    n_reference: int | None = None, baseline: str | None = None) -> "object":
    """One table (a pandas DataFrame, one row per method) of test accuracy, NLL, ECE, Brier, and agreement and
    total variation against a reference predictive (Izmailov et al., 2021), with wall time.

    With a ``baseline`` among ``methods``, the columns ``nll_diff`` and ``nll_diff_se`` hold each method's NLL
    minus the baseline's, paired over the test points, and the standard error of that mean difference: how
    far the test set's own noise lets the NLL column be read. The column ``nll_share_missed`` is the share of
    each method's summed test NLL carried by the test points that every row misclassifies (their number is
    ``table.attrs["n_missed_by_all"]``): when it is large, a handful of points decide the NLL column.

    The reference is an *independent* run of ``reference`` (seed ``seed + 1``, ``n_reference`` samples,
    default ``n``); every method, ``reference`` included, is run with ``seed`` and ``n`` samples. The row of the
    reference method itself is therefore the ceiling: how close two independent runs of the reference get.
    See chapter 2, "Breast cancer: every method against HMC".

    Args:
        task: a classification task of :data:`TASKS`.
        methods: the rows, names of :data:`METHODS`.
        n: samples per method.
        seed: seed of every method's run (the reference uses ``seed + 1``).
        reference: the method whose independent run is the reference predictive.
        n_reference: samples of the reference run (default ``n``).
        baseline: the method the paired NLL differences are taken against (e.g. ``"map"``; default none).
    """
    import pandas as pd

    t = get_task(task)
    if t.task != "classification":
        raise ValueError(f"compare_methods needs a classification task; {task!r} is regression")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; available: {', '.join(METHODS)}")
    if baseline is not None and baseline not in methods:
        raise ValueError(f"the baseline {baseline!r} must be one of the methods {methods}")
    y = t.data().y_test
    p_ref = predictive_from_outputs(posterior_run(task, reference, n_reference or n, seed + 1)["f_test"])
    rows, point_nll, wrong = [], {}, []
    for method in methods:
        run = posterior_run(task, method, n, seed)
        p = predictive_from_outputs(run["f_test"])
        point_nll[method] = M.pointwise_nll(p, y).double()
        wrong.append(p.argmax(-1) != y)
        rows.append(dict(method=method, accuracy=float(M.accuracy(p, y)), nll=float(M.nll(p, y)),
                         ece=float(M.ece(p, y)), brier=float(M.brier(p, y)), agreement=float(M.agreement(p, p_ref)),
                         tv=float(M.total_variation(p, p_ref)), seconds=float(run["seconds"])))
    missed_by_all = torch.stack(wrong).all(0)
    for row in rows:
        row["nll_share_missed"] = float(point_nll[row["method"]][missed_by_all].sum() / point_nll[row["method"]].sum())
        if baseline is not None:
            row["nll_diff"], row["nll_diff_se"] = mean_se(point_nll[row["method"]] - point_nll[baseline])
    table = pd.DataFrame(rows).set_index("method")
    table.attrs["n_missed_by_all"] = int(missed_by_all.sum())
    return table


def chain_modes(task: str, n: int | None = None, seed: int = 0, method: str = "hmc") -> dict:
    """Do the chains of a chain-based run sit in different modes with the same predictions? Returns each
    chain's test accuracy and NLL (of its own model average), the median split-R-hat of the weights and of
    the test-set predictive probabilities across chains (weights far above 1 and functions near 1: different
    modes, one function; Izmailov et al., 2021; thesis 000, sec. 2.4), the mean distance between chain means
    and the mean distance between the means of the two halves of one chain, and pairwise chain agreement.
    ``aligned_weight_rhat`` and ``aligned_between`` repeat the weight-space numbers after each chain is
    permuted onto chain 0 by weight matching (chapter 5): what permutation symmetry explains.
    See chapter 2, "Properties of neural-network posteriors: many modes, one function".

    Args:
        task: a classification task of :data:`TASKS`.
        n: samples of the run (at least 4 draws per chain); by default :func:`posterior_sample_size` or four
            draws per chain, whichever is more.
        seed: seed of the run.
        method: a chain-based method (:data:`CHAIN_METHODS`).
    """
    if method not in CHAIN_METHODS:
        raise ValueError(f"{method!r} runs have no chains to compare; use one of {', '.join(CHAIN_METHODS)}")
    if n is None:
        n = max(posterior_sample_size(), 4 * settings(method)["chains"])
    run = posterior_run(task, method, n, seed)
    C = run["n_chains"]
    S = n // C
    if S < 4:
        raise ValueError(f"need at least 4 draws per chain; {n} samples over {C} chains give {S}")
    theta = run["theta"][:S * C].view(S, C, -1)
    probs = torch.softmax(run["f_test"][:S * C].view(S, C, *run["f_test"].shape[1:]), -1)
    y = get_task(task).data().y_test
    p = probs.mean(0)                                                      # [C, N, K]
    means = theta.mean(0)
    half = (theta[:S // 2].mean(0) - theta[S - S // 2:].mean(0)).norm(dim=-1).mean()
    off = ~torch.eye(C, dtype=torch.bool, device=means.device)
    between = torch.cdist(means, means)[off]
    # Permutation copies? Align every chain's mean to chain 0's by weight matching (chapter 5) and apply the
    # chain's permutation to all its draws; what is left between chains is not a relabelling of neurons.
    from wsbook.symmetry import permute, weight_matching

    spec = get_task(task).spec
    perms = weight_matching(spec, means[:1], means).perms                  # one [C, width] per hidden layer
    aligned = permute(spec, theta.reshape(S * C, -1), [q.repeat(S, 1) for q in perms]).view(S, C, -1)
    aligned_means = aligned.mean(0)
    return dict(chain_accuracy=M.accuracy(p, y), chain_nll=M.nll(p, y),
                weight_rhat=float(M.split_rhat(theta).median()), function_rhat=float(M.split_rhat(probs).median()),
                aligned_weight_rhat=float(M.split_rhat(aligned).median()),
                aligned_between=float(torch.cdist(aligned_means, aligned_means)[off].mean()),
                draws_per_chain=S, n_chains=C,
                between=float(between.mean()), within_drift=float(half),
                pairwise_agreement=M.agreement(p.unsqueeze(0), p.unsqueeze(1)))
