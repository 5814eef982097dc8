"""``python -m wsbook``: compute and cache the artifacts the chapters read, at any scale.

::

    python -m wsbook --list                          # every artifact, and whether it is cached per scale
    python -m wsbook zoos hmc --scale full           # compute what is missing (names, groups or patterns)
    python -m wsbook 'flow/mnist/*' --scale default
    torchrun --nproc-per-node 4 -m wsbook chapter/08 --scale full     # the same work over 4 processes
    python -m wsbook all --scale ci --jobs 2         # on a CPU: two artifacts at a time, one thread each
    python -m wsbook all --jobs auto                 # one per core on a CPU (what `make book` runs first)

Every artifact is a call of the cached functions of :mod:`wsbook.experiments` with the arguments the
chapters use, so the chapters find the entries and only load them. Under ``torchrun`` the processes share
the work (:mod:`wsbook.distributed`): population members and HMC chains are split over the ranks and
gathered, flows train with DistributedDataParallel, and rank 0 writes the cache and prints the summary.
On a CPU, where most artifacts are small networks that one core computes about as fast as several,
``--jobs N`` instead computes N artifacts at a time in worker processes of one torch thread each; an entry
that two of them need is computed by one while the other waits for its lock (:mod:`wsbook.cache`). Each
training seed of a verdict table is an artifact of its own (``verdict/<table>/seed/<seed>``, ahead of the
table), so that the workers train the seeds side by side and the table itself only scores.
Errors (an unknown artifact or scale, a cache directory that cannot be written, an optional artifact whose
data is not on disk) are one line on stderr and a non-zero exit code. The optional artifacts (``zoo/mnist``:
the full MNIST from ``WSBOOK_MNIST_DIR``; nothing is downloaded) are listed always, computed when named,
and left out of groups and patterns, with a note, while their data is missing.

The registry holds every flow the results chapters (8, 8b, 8c, 8d, 9) train or sample, every posterior run
of chapter 2 and every zoo and model chapters 5 and 6 train (:mod:`wsbook.experiments.foundations`), with their
arguments: after ``python -m wsbook chapter/02 chapter/05 ...`` (or ``all``) the chapters load every cached
entry they read, which ``make test`` checks by running them under
``WSBOOK_CACHE_STRICT=align/,flows/,models/,posterior/,targets/,zoo/`` (:mod:`wsbook.cache`). The command line
itself ignores that variable, and computes as the chapters do (torch's deterministic CPU kernels; chapters 8b
and 8c's artifacts on one CPU thread).
"""
from __future__ import annotations

import argparse
import fnmatch
import inspect
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from wsbook import cache, config, data, distributed


class CLIError(Exception):
    """A usage error: printed as one line, exit code 2 (1 for an unusable cache)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Artifact:
    """One thing the chapters read: ``compute()`` calls the cached functions that produce it. ``missing()``
    says why its input data is not on this machine (``None``: it is; only optional artifacts can miss it)."""

    name: str
    help: str
    compute: Callable[[], Any]
    missing: Callable[[], str | None] = lambda: None


# ------------------------------------------------------------------ what the results chapters compute
# Chapters 8, 8b, 8c and 9 call the cached functions of wsbook.experiments, some with arguments of their own
# (a size set in a cell, a generator's draws). The functions below make the same calls with the same
# arguments, so that after `python -m wsbook all` those chapters train and sample no flow; tests/gates.py
# checks it (WSBOOK_STRICT_CHAPTERS=1 runs them with WSBOOK_CACHE_STRICT set after the command line).
# A value copied from a chapter says which cell it mirrors: when the chapter changes it, that gate fails
# until it is changed here too.
BC = "breast_cancer"
#: the CNN zoo of chapter 8d
CNN = "cnn_digits"


def _default(fn: Callable[..., Any], parameter: str) -> Any:
    """The default of ``fn``'s ``parameter`` (the chapters rely on it, so the command line reads it too)."""
    return inspect.signature(fn).parameters[parameter].default


def _one_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` run on one torch thread on the CPU, as chapters 8b and 8c run (their first cell sets one; a
    training's numbers depend on it), the thread count restored afterwards; on a GPU ``fn`` unchanged."""
    def run():
        import torch

        if config.device().type != "cpu":
            return fn()
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn()
        finally:
            torch.set_num_threads(before)
    return run


def _bc_sample_seeds() -> tuple[int, ...]:
    from wsbook.experiments import flows

    return tuple(_default(flows.score_draws, "sample_seeds"))


def bc_more_draws() -> None:
    """Chapter 8's further draws of the extended graph-network flow and of the headline neuron flow
    (``flows.score_draws`` with its default sample seeds, at the table's size and solver steps)."""
    from wsbook.experiments import flows, pipeline, summary

    n_gen, steps = summary.breast_cancer_sizes()
    long = f"{flows.flow_config('euclidean', 'aligned_ot').name}, extended"      # chapter 8's LONG
    for label in (long, flows.neuron_config().name):                             # ... and NEURON
        for k in _bc_sample_seeds():
            pipeline.sample(BC, label, n_gen, steps=steps, sample_seed=k)


def bc_source_scale() -> None:
    """Chapter 8's source-scale table: the plain baseline and the headline neuron flow at the table's
    Euclidean source scale and at narrower ones, each trained and drawn over ``score_draws``' seeds."""
    from wsbook.experiments import flows, pipeline, summary

    n_gen, steps = summary.breast_cancer_sizes()
    configs = flows.breast_cancer_candidates()
    neuron = flows.neuron_config().name
    table_sigma = pipeline.train(BC, neuron).flow.chart.sigma
    scales = config.by_scale(ci=(0.05,), default=(0.03, 0.05), full=(0.03, 0.05))   # chapter 8's `scales`
    make = {"plain baseline": flows.baseline_config, neuron: flows.neuron_config}
    for label in make:
        cfgs = {table_sigma: configs[label]}
        cfgs.update({s: make[label](sigma=s) for s in scales})
        for cfg in cfgs.values():
            for k in _bc_sample_seeds():
                flows.sample_flow(BC, cfg, n_gen, steps=steps, sample_seed=k)


def bc_steps_curve() -> None:
    """Chapter 8's solver-steps figure: the three aligned + OT neuron flows and the plain baseline against
    Euler steps, without and with guidance (``flows.steps_curve``), beside Adam (``flows.adam_curve``)."""
    from wsbook.experiments import flows

    steps_list = config.by_scale(ci=(2, 8), default=(8, 32, 128), full=(8, 64, 128, 256, 512))  # chapter 8's
    n_steps_nets = config.by_scale(ci=16, default=32, full=64)                                  # ... sizes
    configs = flows.breast_cancer_candidates()
    for name in [flows.neuron_config(c).name for c in flows.CHARTS] + ["plain baseline"]:
        flows.steps_curve(BC, configs[name], steps_list, n_steps_nets, guidance=(0.0, 1.0))
    flows.adam_curve(BC, steps_list, n_steps_nets)


#: the artifact-name prefix of each target's flows
FLOW_PREFIX = {"breast_cancer": "flow/breast_cancer/", "mnist5k": "flow/mnist/", "cnn_digits": "flow/cnn/",
               "posterior/breast_cancer": "flow/posterior/"}


def flow_artifact(target: str, name: str) -> str:
    """The artifact of the flow ``name`` of ``target`` (:func:`wsbook.experiments.pipeline.recipes`), e.g.
    ``flow/breast_cancer/plain_baseline`` or ``flow/posterior/flow_draws_density``."""
    return FLOW_PREFIX[target] + "_".join(name.lower().replace(",", " ").replace("+", " ").split())


def bc_flow_artifact(label: str) -> str:
    """The artifact of the breast-cancer candidate flow ``label`` (``flow/breast_cancer/plain_baseline``)."""
    return flow_artifact(BC, label)


def mnist_best() -> str:
    """The recipe chapter 8b calls best: the most accurate on the data's validation split."""
    from wsbook.experiments import mnist_flows as mf

    return max(mf.budget().recipes, key=mf.validation_accuracy)


def _mnist_chapter_draws():
    """Chapter 8b's generator (``setup_chapter(seed=0)``'s) after its first draw, the target networks'
    rows ``pick``: ``(split, pick, generator)``."""
    import torch

    from wsbook.experiments import mnist_flows as mf

    split = mf.split()
    generator = torch.Generator(device="cpu").manual_seed(0)
    pick = torch.randperm(len(split.train), generator=generator)[:mf.budget().n_samples]
    return split, pick, generator


def mnist_guidance() -> None:
    """Chapter 8b's guided samples of the best recipe: every weight of the budget's grid
    (``mf.guidance_by_validation``) and the chosen one."""
    from wsbook.experiments import mnist_flows as mf, pipeline

    split, pick, _ = _mnist_chapter_draws()
    best = mnist_best()
    choice = mf.guidance_by_validation(best, split.train.theta[pick])
    pipeline.sample(mf.ZOO, best, guided="mnist", weight=choice["chosen"])


def mnist_second_task() -> None:
    """Chapter 8b's second task (permuted MNIST): the best recipe's plain and guided samples, SGD from
    ``N(0, 0.1^2)`` for the guidance's and the zoo's steps (``mf.trained_networks``), and SGD from every
    starting set of its initialisation figure (``mf.init_curves``, the same starting networks)."""
    import torch

    import wsbook.symmetry
    from wsbook.experiments import mnist_flows as mf, pipeline, targets

    b = mf.budget()
    split, pick, generator = _mnist_chapter_draws()
    spec, best, n2 = split.spec, mnist_best(), b.n_wide
    perm = mf.permuted_mnist()
    zoo = targets.ZOOS[mf.ZOO]
    zoo_steps = zoo.epochs * (perm.x_train.shape[0] // zoo.batch_size)
    plain2, _ = pipeline.sample(mf.ZOO, best, n2)
    guided2, _ = pipeline.sample(mf.ZOO, best, n2, guided="permuted")
    for steps in (b.guidance_steps, zoo_steps):
        mf.trained_networks("permuted", spec.widths, n2, steps)
    zoo_scale = [t.mean() for t in wsbook.symmetry.neuron_norms(spec, split.train.theta)]
    starts = {"flow samples": plain2,
              "flow samples at the zoo's neuron scale": wsbook.symmetry.rescale_neurons(spec, plain2, zoo_scale),
              "guided flow samples": guided2,
              "MNIST zoo checkpoints": split.train.theta[pick[:n2]],
              "N(0, 0.1^2)": torch.randn(n2, spec.n_params, generator=generator) * zoo.init_std}
    mf.init_curves(starts, task="permuted")


def mnist_training_accuracy() -> None:
    """Chapter 8b's accuracy along training: the best recipe and the plain baseline trained again with copies
    of the field kept (``mf.accuracy_along_training``)."""
    from wsbook.experiments import mnist_flows as mf

    for recipe in (mnist_best(), "plain baseline"):
        mf.accuracy_along_training(recipe)


def artifacts() -> dict[str, Artifact]:
    """The registry: every artifact by name (sizes follow the scale at the time ``compute`` runs)."""
    from wsbook.experiments import (flows, foundations, mnist_flows as mf, pipeline, posterior_flows as pf,
                                    protocol, summary, targets, tasks)

    out: list[Artifact] = []
    # chapters 5 and 6 read the zoos and models of wsbook.experiments.foundations, at their settings
    for chapter, runs in foundations.RUNS.items():
        for name, run in runs.items():
            fn = getattr(run, "func", run)
            args = f"({', '.join(map(repr, run.args))})" if hasattr(run, "args") else ""
            out.append(Artifact(f"foundations/{chapter}/{name}", f"chapter {int(chapter)}'s "
                                f"wsbook.experiments.foundations.{fn.__name__}{args}", run))
    for name in targets.ZOOS:
        out.append(Artifact(f"zoo/{name}", f"checkpoint zoo {name} "
                            f"({'chapters 8, 8b' if name in targets.MLP_ZOOS else 'chapter 8d'})",
                            lambda name=name: targets.zoo(name)))
    for name, cfg in targets.OPTIONAL_ZOOS.items():
        out.append(Artifact(f"zoo/{name}", f"checkpoint zoo {name} on the full MNIST (optional: its IDX files in "
                            "WSBOOK_MNIST_DIR; no chapter reads it)", lambda name=name: targets.zoo(name),
                            missing=lambda cfg=cfg: data.missing(cfg.dataset)))
    # breast cancer's posterior protocol reads three runs: training, validation and test draws
    for task, seeds in (("breast_cancer", tuple(pf.HMC_RUNS.values())), ("mnist5k", (0, 1))):
        for seed in seeds:
            out.append(Artifact(f"hmc/{task}/{seed}", f"reference HMC posterior of {task}, seed {seed} "
                                "(chapters 8, 8c)",
                                lambda task=task, seed=seed: targets.hmc_reference(task, seed)))
    # chapter 2 runs every method on its tasks and scores them against an independent HMC run; chapters 8
    # and 8c read breast cancer's approximate methods (targets.COMPARED_TO_HMC)
    for task in tasks.chapter_tasks():
        for method in tasks.METHODS:
            readers = "chapters 2, 8" if task == BC and method in targets.COMPARED_TO_HMC else "chapter 2"
            out.append(Artifact(f"posterior/{task}/{method}", f"{method} posterior samples of {task} ({readers})",
                                lambda task=task, method=method: tasks.posterior_run(
                                    task, method, tasks.posterior_sample_size())))
        if task in ("breast_cancer", "digits"):
            out.append(Artifact(f"posterior/{task}/reference", f"the independent HMC run chapter 2 scores the "
                                f"methods of {task} against (seed 1)", lambda task=task: tasks.posterior_run(
                                    task, "hmc", tasks.reference_sample_size(), seed=1)))
    out.append(Artifact("posterior/breast_cancer/chain_modes", "the HMC chains of breast cancer, mode by mode "
                        "(chapter 2)", lambda: tasks.chain_modes(BC)))

    def train_and_sample(target: str, name: str) -> Callable[[], Any]:
        def run():
            pipeline.train(target, name)
            if target == BC:
                return pipeline.sample(target, name, summary.breast_cancer_sizes()[0])
            if target == mf.ZOO:
                return pipeline.sample(target, name)
            if target == CNN:
                return pipeline.sample(target, name, flows.cnn_sizes()[0])
        return run if target == BC else _one_thread(run)

    chapters = {BC: "chapters 8, 9", mf.ZOO: "chapter 8b", CNN: "chapter 8d", f"posterior/{BC}": "chapters 8c, 9"}
    for target in pipeline.TARGETS:
        for name, recipe in pipeline.recipes(target).items():
            what = "its samples" if target in pipeline.ZOO_TARGETS else f"trained on {recipe.objective}"
            out.append(Artifact(flow_artifact(target, name), f"flow {name} on {target}, {what} ({chapters[target]})",
                                train_and_sample(target, name)))
    out.append(Artifact("flow/breast_cancer/more_draws", "further draws of the extended graph-network flow and "
                        "the headline neuron flow (chapter 8)", bc_more_draws))
    out.append(Artifact("flow/breast_cancer/source_scale", "the plain baseline and the headline neuron flow at "
                        "narrower source scales, trained and drawn (chapter 8)", bc_source_scale))
    out.append(Artifact("flow/breast_cancer/steps_curve", "samples against solver steps and guidance, and Adam "
                        "runs as long (chapter 8)", bc_steps_curve))
    # each training seed of a verdict table on its own, ahead of the table, so that `--jobs` trains them
    # side by side (the table then only scores)
    for s in protocol.SEEDS:
        out.append(Artifact(f"verdict/breast_cancer/seed/{s}", f"seed {s} of chapter 8's test verdict: the flow "
                            "chosen on validation runs and the plain baseline, trained and sampled",
                            lambda s=s: flows.verdict_seed("breast_cancer", flows.breast_cancer_verdict_candidates(),
                                                           *summary.breast_cancer_sizes(), s)))
        out.append(Artifact(f"verdict/mnist5k/seed/{s}", f"seed {s} of chapter 8b's test verdict: the MNIST flow "
                            "chosen on validation data and the plain baseline, trained and sampled",
                            _one_thread(lambda s=s: mf.verdict_seed(s))))
        out.append(Artifact(f"verdict/cnn_digits/seed/{s}", f"seed {s} of chapter 8d's test verdicts: the CNN flow, "
                            "the channel-field and the flat-field flow chosen on validation runs and the plain "
                            "baseline, trained and sampled", _one_thread(lambda s=s: [
                                flows.verdict_seed(CNN, flows.cnn_verdict_candidates(field), *flows.cnn_sizes(), s)
                                for field in flows.CNN_VERDICT_FIELDS])))
    out.append(Artifact("verdict/breast_cancer", "the flow chosen on validation runs and the plain baseline, "
                        f"trained with seeds {protocol.SEEDS} and sampled (chapter 8's test verdict)",
                        summary.breast_cancer_verdict))
    out.append(Artifact("verdict/mnist5k", "the MNIST flow chosen on validation data and the plain baseline, trained "
                        f"with seeds {protocol.SEEDS} and sampled (chapter 8b's test verdict)",
                        _one_thread(mf.verdict_table)))
    out.append(Artifact("verdict/cnn_digits", "the CNN flow chosen on validation runs, the channel-field and the "
                        f"flat-field flow chosen so, and the plain baseline, trained with seeds {protocol.SEEDS} and "
                        "sampled (chapter 8d's test verdicts)",
                        _one_thread(lambda: [flows.cnn_verdict_table(f) for f in flows.CNN_VERDICT_FIELDS])))
    out.append(Artifact("flow/cnn/width_transfer", "16-channel CNNs from the chosen channel flow as the verdict "
                        f"trained it on 8-channel ones (seeds {protocol.SEEDS}), beside packed ensembles of its "
                        "8-channel samples and the trained 16-channel zoo (chapter 8d)",
                        _one_thread(flows.cnn_width_transfer)))
    out.append(Artifact("flow/mnist/guidance", "the best MNIST flow's samples guided by the task loss, every weight "
                        "the validation split chooses from (chapter 8b)", _one_thread(mnist_guidance)))
    out.append(Artifact("flow/mnist/width_transfer", "784-32-10 samples of the flows trained on 784-10-10 networks, "
                        f"and the verdict: the width-agnostic flow chosen on validation data, trained with seeds "
                        f"{protocol.SEEDS}, against trained 784-32-10 networks and packed ensembles (chapters 8b, 9)",
                        _one_thread(lambda: (mf.width_transfer(), mf.width_transfer_verdict()))))
    out.append(Artifact("flow/mnist/second_task", "the best MNIST flow on permuted MNIST: plain and guided samples, "
                        "SGD runs from them and from the other starts (chapter 8b)", _one_thread(mnist_second_task)))
    out.append(Artifact("flow/mnist/field_size", "geometric_aligned_ot with GNN fields of several widths, trained "
                        "and sampled (chapter 8b)", _one_thread(lambda: mf.field_size_sweep("geometric_aligned_ot"))))
    out.append(Artifact("flow/mnist/training_accuracy", "the best MNIST flow and the plain baseline trained again "
                        "keeping copies of the field, each copy sampled and scored on validation data (chapter 8b)",
                        _one_thread(mnist_training_accuracy)))
    for s in protocol.SEEDS:
        out.append(Artifact(f"verdict/posterior/seed/{s}", f"seed {s} of the posterior test verdict: the posterior "
                            "flow chosen on the validation HMC run, trained",
                            _one_thread(lambda s=s: pf.verdict_seed(BC, s))))
    out.append(Artifact("verdict/posterior", "the posterior flow chosen on the validation HMC run, trained with "
                        f"seeds {protocol.SEEDS} and judged on the test run beside VI (chapters 8c, 9)",
                        _one_thread(lambda: pf.verdict_table(BC))))
    out.append(Artifact("flow/posterior/importance", "importance weights of the three Euclidean posterior flows' "
                        "samples, and the ELBOs (chapters 8c, 9)",
                        _one_thread(lambda: [pf.elbos(BC), *(pf.importance_sampling(BC, proposal=p)
                                                             for p in pf.PROPOSALS)])))
    out.append(Artifact("flow/posterior/detection", "the posterior flows' log-likelihoods of the detection sets "
                        "(chapter 8c)", _one_thread(lambda: pf.detection_table(BC))))
    out.append(Artifact("flow/posterior/mnist5k_cost", "chapter 8c's MNIST cost: the Euclidean posterior flow on "
                        "MNIST's HMC draws, trained only where that run has converged (else nothing)",
                        _one_thread(lambda: pf.task_cost("mnist5k", tasks.posterior_sample_size()))))
    return {a.name: a for a in out}


def groups() -> dict[str, Callable[[], list[str]]]:
    """Named groups of artifacts (evaluated at the current scale: chapter 8b's recipes and chapter 2's tasks
    depend on it)."""
    from wsbook.experiments import flows, mnist_flows as mf, posterior_flows as pf, targets, tasks

    def zoos() -> list[str]:
        return [f"zoo/{z}" for z in targets.MLP_ZOOS]

    def mnist_flows() -> list[str]:
        return [flow_artifact(mf.ZOO, r) for r in mf.trained_recipes()]

    def compared() -> list[str]:
        return [f"posterior/{BC}/{m}" for m in targets.COMPARED_TO_HMC]

    return {
        "all": lambda: ["*"],
        "zoos": lambda: ["zoo/*"],
        "hmc": lambda: ["hmc/*"],
        "flows": lambda: ["flow/*"],
        # chapter 2 reads every method's posterior run on each of its tasks
        "chapter/02": lambda: [f"posterior/{task}/*" for task in tasks.chapter_tasks()],
        # chapters 5 and 6 read their zoos and trained models (wsbook.experiments.foundations)
        "chapter/05": lambda: ["foundations/05/*"],
        "chapter/06": lambda: ["foundations/06/*"],
        # chapter 8 reads every zoo, both HMC runs of both tasks and the methods it compares with HMC
        "chapter/08": lambda: [*zoos(), "hmc/*", *compared(),
                               "flow/breast_cancer/*", "verdict/breast_cancer*"],
        "chapter/08b": lambda: ["zoo/mnist5k", "zoo/mnist5k_w32", *mnist_flows(), "verdict/mnist5k*",
                                "flow/mnist/guidance", "flow/mnist/width_transfer", "flow/mnist/second_task",
                                "flow/mnist/field_size", "flow/mnist/training_accuracy"],
        "chapter/08d": lambda: ["zoo/cnn_digits", "zoo/cnn_digits_w16", "flow/cnn/*", "verdict/cnn_digits*"],
        "chapter/08c": lambda: ["zoo/breast_cancer", "hmc/breast_cancer/*", "hmc/mnist5k/0", *compared(),
                                "flow/posterior/*", "verdict/posterior*"],
        # the discussion quotes chapters 8, 8b, 8c and 8d (8d's verdicts and width transfer)
        "chapter/09": lambda: [*zoos(), "hmc/breast_cancer/*", "hmc/mnist5k/0", *compared(),
                               *map(bc_flow_artifact, flows.breast_cancer_candidates()), "verdict/breast_cancer",
                               *mnist_flows(), "verdict/mnist5k", "flow/mnist/width_transfer",
                               *(flow_artifact(f"posterior/{BC}", name) for name in pf.FLOWS),
                               "flow/posterior/importance", "flow/posterior/mnist5k_cost",
                               "verdict/posterior", "zoo/cnn_digits",
                               *(flow_artifact(CNN, name) for name in flows.cnn_candidates()), "verdict/cnn_digits",
                               "zoo/cnn_digits_w16", "flow/cnn/width_transfer"],
    }


def select(patterns: Sequence[str], registry: dict[str, Artifact],
           skipped: dict[str, str] | None = None) -> list[str]:
    """Artifact names matching ``patterns`` (names, group names or shell patterns), in registry order.

    An artifact whose data is missing (:attr:`Artifact.missing`) is left out of a group or pattern that
    matches others too (and entered in ``skipped`` with the reason), and is a :class:`CLIError` when
    named, or when a pattern matches nothing else.
    """
    named = groups()
    chosen: set[str] = set()
    for pattern in patterns:
        expanded = named[pattern]() if pattern in named else [pattern]
        hits = [n for n in registry if any(fnmatch.fnmatchcase(n, p) for p in expanded)]
        if not hits:
            raise CLIError(f"unknown artifact {pattern!r}; `python -m wsbook --list` shows the artifacts and groups")
        reasons = {n: registry[n].missing() for n in hits}
        present = {n for n in hits if reasons[n] is None}
        if not present:
            raise CLIError(f"{hits[0]} cannot be computed here: {reasons[hits[0]]}")
        if skipped is not None:
            skipped.update({n: r for n, r in reasons.items() if r is not None})
        chosen |= present
    return [n for n in registry if n in chosen]


def is_cached(artifact: Artifact) -> bool:
    """Whether everything ``artifact`` needs is in the cache (at the current scale); computes nothing."""
    try:
        with cache.probe():
            artifact.compute()
        return True
    except cache.MissingEntry:
        return False


def check_cache_dir() -> Path:
    """The cache directory, created and checked writable (a :class:`CLIError` otherwise)."""
    if not cache.enabled():
        raise CLIError("the cache is off (WSBOOK_CACHE); nothing computed would be kept", code=1)
    path = cache.cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as err:
        raise CLIError(f"cache directory {path} is not writable ({type(err).__name__}: {err.strerror or err})",
                       code=1) from None
    return path


def _entries(root: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in root.rglob("*.pt")} if root.exists() else {}


def list_artifacts(registry: dict[str, Artifact], out=None) -> None:
    """Print every artifact with ``yes`` / ``-`` per scale (cached or not), then the groups.

    Some artifacts exist at some scales only (a table trains more recipes at ``default`` than at ``ci``), so
    each scale's column reads that scale's own registry; ``n/a`` marks a name that scale does not have.
    ``registry`` (the current scale's) gives the order and the descriptions; names only other scales have
    follow it."""
    out = out or sys.stdout
    cached: dict[str, dict[str, bool]] = {}
    helps = {name: a.help for name, a in registry.items()}
    for scale in config.SCALES:
        with config.at_scale(scale):
            at_scale = artifacts()
            cached[scale] = {name: is_cached(a) for name, a in at_scale.items()}
        for name, a in at_scale.items():
            helps.setdefault(name, a.help)
    width = max(len(n) for n in helps)
    print(f"cache: {cache.cache_dir()}", file=out)
    print(f"{'artifact':<{width}}  " + "  ".join(f"{s:>7}" for s in config.SCALES) + "  description", file=out)
    for name, help in helps.items():
        marks = [("yes" if cached[s][name] else "-") if name in cached[s] else "n/a" for s in config.SCALES]
        print(f"{name:<{width}}  " + "  ".join(f"{m:>7}" for m in marks) + f"  {help}", file=out)
    print("groups: " + ", ".join(groups()) + "; shell patterns such as 'flow/mnist/*' work too", file=out)


def _cached_row(name: str) -> dict:
    """The summary row of an artifact that was already cached."""
    return {"artifact": name, "status": "cached", "seconds": 0.0, "files": [], "bytes": 0}


def compute(names: list[str], registry: dict[str, Artifact], out=None) -> list[dict]:
    """Compute the artifacts ``names`` that are not cached yet (all ranks together); returns one summary
    row per artifact (printed by rank 0)."""
    out = out or sys.stdout
    from tqdm.auto import tqdm

    root = check_cache_dir()
    main = distributed.is_main()
    rows = []
    bar = tqdm(names, desc=f"wsbook ({config.scale()})", disable=not (main and config.progress_enabled()),
               leave=False, position=0)
    for name in bar:
        bar.set_postfix_str(name)
        before = _entries(root)
        if distributed.all_agree(is_cached(registry[name])):
            rows.append(_cached_row(name))
            continue
        config.seed_everything(0)        # the same global random state, whatever ran before (and on every rank)
        logged, start = len(cache.compute_log()), time.perf_counter()
        registry[name].compute()
        distributed.barrier()
        after = _entries(root)
        # not the entries another process (a --jobs worker) computed meanwhile
        theirs = {r["entry"] for r in cache.compute_log()[logged:] if r.get("pid") != os.getpid()}
        new = sorted(p for p in after if before.get(p) != after[p] and p.name not in theirs)
        rows.append({"artifact": name, "status": "computed", "seconds": time.perf_counter() - start,
                     "files": [str(p.relative_to(root)) for p in new], "bytes": sum(after[p] for p in new)})
    if main:
        print_summary(rows, f"{distributed.world_size()} process(es)", out)
    return rows


def print_summary(rows: list[dict], processes: str, out=None) -> None:
    """Print :func:`compute`'s summary rows: per artifact its status, seconds, files and size."""
    out = out or sys.stdout
    print(f"scale {config.scale()}, {processes}, cache {cache.cache_dir()}", file=out)
    for r in rows:
        print(f"  {r['artifact']:<42} {r['status']:<9} {r['seconds']:9.1f} s  {len(r['files'])} file(s), "
              f"{r['bytes'] / 2**20:.1f} MiB", file=out)
        for f in r["files"]:
            print(f"      {f}", file=out)
    done = sum(r["status"] == "computed" for r in rows)
    print(f"{done} computed, {len(rows) - done} already cached", file=out, flush=True)


@contextmanager
def as_chapters() -> Iterator[None]:
    """Compute as the chapters do (:func:`wsbook.experiments.setup_chapter`): torch's deterministic CPU
    kernels (:func:`wsbook.config.deterministic_kernels`), so an artifact holds the numbers a chapter would
    have computed; and without strict mode (``WSBOOK_CACHE_STRICT``, meant for the chapters' test), since
    computing is the command line's job. Both are put back afterwards."""
    import torch

    strict = os.environ.pop(cache.STRICT_ENV, None)
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    config.deterministic_kernels()
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        if strict is not None:
            os.environ[cache.STRICT_ENV] = strict


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:      # one line, not the usage block
        raise CLIError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m wsbook", description="Compute and cache the artifacts the chapters read.")
    p.add_argument("artifacts", nargs="*", help=f"artifact names, group names ({', '.join(groups())}) or shell "
                   "patterns ('flow/mnist/*')")
    p.add_argument("--scale", help="ci, default or full (default: WSBOOK_SCALE, else default)")
    p.add_argument("--list", action="store_true", help="list the artifacts and whether each is cached, per scale")
    p.add_argument("--cache-dir", help="the cache directory (default: WSBOOK_CACHE_DIR, else the user cache)")
    p.add_argument("--jobs", type=_jobs, default=1, help="on a CPU: artifacts computed at a time, each in a process "
                   "of its own with one torch thread (default 1: one process, torch's threads); 'auto': the "
                   "machine's cores (at most 8) on a CPU, 1 on a GPU or under torchrun")
    p.add_argument("--timings", action="store_true", help="where the cache's computing time went: seconds per "
                   "artifact name at the scale, from the cache's log of computed entries, longest first")
    return p


#: the registry of a :func:`compute_in_processes` worker process, built once per process
_WORKER_REGISTRY: dict[str, Artifact] = {}


def _start_worker(scale: str, root: str) -> None:
    """A :func:`compute_in_processes` worker: the parent's scale and cache, one torch thread, no progress bars."""
    import torch

    os.environ.update(WSBOOK_SCALE=scale, WSBOOK_CACHE_DIR=root, WSBOOK_PROGRESS="0")
    torch.set_num_threads(1)
    _WORKER_REGISTRY.update(artifacts())


def _compute_in_worker(name: str) -> dict:
    with as_chapters(), open(os.devnull, "w") as quiet:      # the parent prints the summary
        return compute([name], _WORKER_REGISTRY, out=quiet)[0]


def compute_in_processes(names: list[str], registry: dict[str, Artifact], jobs: int, out=None) -> list[dict]:
    """Compute the artifacts ``names`` that are not cached yet in ``jobs`` worker processes of one torch thread
    each: every worker takes the next artifact in the registry's order as soon as it is free (the early
    artifacts, which later ones read, start first), and an entry two of them need is computed by one while
    the other waits for its lock (:mod:`wsbook.cache`). Prints and returns one summary row per artifact, as
    :func:`compute`."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from tqdm.auto import tqdm

    out = out or sys.stdout
    pending = [n for n in names if not is_cached(registry[n])]
    rows = {n: _cached_row(n) for n in names if n not in pending}
    print(f"python -m wsbook: {len(pending)} of {len(names)} artifact(s) to compute, {jobs} at a time",
          file=out, flush=True)
    if pending:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker,
                                 initargs=(config.scale(), str(cache.cache_dir()))) as pool:
            futures = {pool.submit(_compute_in_worker, name): name for name in pending}   # in the registry's order
            bar = tqdm(as_completed(futures), total=len(futures), desc=f"wsbook ({config.scale()}, {jobs} jobs)",
                       disable=not config.progress_enabled(), leave=False)
            try:
                for done in bar:
                    rows[futures[done]] = done.result()
                    bar.set_postfix_str(futures[done])
            except BaseException:           # a failed artifact (or Ctrl-C): start nothing more
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    ordered = [rows[n] for n in names]
    print_summary(ordered, f"{jobs} worker process(es) of one thread", out)
    return ordered


def print_timings(scale: str, file=None) -> float:
    """Print the seconds the cache's compute log (:func:`wsbook.cache.compute_log`) records per artifact name
    at ``scale``, longest first: the entries computed, their own seconds (less the entries computed inside
    them) and their longest single one. Returns the total of own seconds."""
    totals: dict[str, list[float]] = {}
    for rec in cache.compute_log():
        if rec.get("scale") == scale:
            t = totals.setdefault(rec["name"], [0, 0.0, 0.0])
            t[0], t[1], t[2] = t[0] + 1, t[1] + float(rec["own"]), max(t[2], float(rec["own"]))
    if not totals:
        print(f"no computations recorded at scale {scale} in {cache.cache_dir() / cache.COMPUTE_LOG}", file=file)
        return 0.0
    width = max(len(n) for n in totals)
    print(f"{'artifact':<{width}}  entries  own seconds  longest", file=file)
    for name, (count, own, longest) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:<{width}}  {count:7d}  {own:11.1f}  {longest:7.1f}", file=file)
    total = sum(t[1] for t in totals.values())
    print(f"{'total':<{width}}  {sum(t[0] for t in totals.values()):7d}  {total:11.1f}", file=file)
    return total


def _jobs(text: str) -> int:
    """``--jobs``: a positive integer, or ``auto`` (:func:`auto_jobs`)."""
    if text == "auto":
        return auto_jobs()
    try:
        jobs = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a positive integer or 'auto'; got {text!r}") from None
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1; got {jobs}")
    return jobs


#: the most worker processes ``--jobs auto`` starts (each holds torch, its data and a model: a few hundred MiB
#: to a few GiB)
AUTO_JOBS_MAX = 8


def auto_jobs() -> int:
    """The worker processes ``--jobs auto`` starts: one per core the process may run on (at most
    :data:`AUTO_JOBS_MAX`), on a CPU; one (no workers: torch's threads, or the GPU) on a GPU or under
    ``torchrun``."""
    if distributed.launched() or config.device().type != "cpu":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, AUTO_JOBS_MAX))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code."""
    try:
        args = parser().parse_args(argv)
        if args.scale is not None:
            if args.scale not in config.SCALES:
                raise CLIError(f"unknown scale {args.scale!r}; choose one of {', '.join(config.SCALES)}")
            os.environ["WSBOOK_SCALE"] = args.scale
        try:
            config.scale()
        except ValueError as err:
            raise CLIError(str(err)) from None
        if args.cache_dir:
            os.environ["WSBOOK_CACHE_DIR"] = args.cache_dir
        if args.timings:
            print_timings(config.scale())
            return 0
        if not args.list and not args.artifacts:
            raise CLIError("name the artifacts to compute (or --list to see them)")
        registry = artifacts()
        if args.list:
            list_artifacts(registry)
            return 0
        skipped: dict[str, str] = {}
        names = select(args.artifacts, registry, skipped)
        check_cache_dir()
        if args.jobs > 1:
            if distributed.launched() or config.device().type != "cpu":
                raise CLIError("--jobs is for a CPU: on GPUs launch the processes with torchrun instead")
            for name, reason in skipped.items():
                print(f"python -m wsbook: note: skipping {name} ({reason})", file=sys.stderr)
            compute_in_processes(names, registry, args.jobs)
            return 0
        distributed.init()
        if distributed.is_main():
            for name, reason in skipped.items():
                print(f"python -m wsbook: note: skipping {name} ({reason})", file=sys.stderr)
        if not distributed.is_main():
            os.environ["WSBOOK_PROGRESS"] = "0"        # one progress bar: rank 0's
        config.tune_allocator()
        try:
            with as_chapters():
                compute(names, registry)
        finally:
            distributed.close()
        return 0
    except CLIError as err:
        print(f"python -m wsbook: error: {err}", file=sys.stderr)
        return err.code


__all__ = ["Artifact", "CLIError", "artifacts", "groups", "select", "is_cached", "list_artifacts", "compute",
           "as_chapters", "compute_in_processes", "auto_jobs", "print_summary", "print_timings", "main"]
