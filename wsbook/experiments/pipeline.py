"""Every flow the results chapters train, by one name: ``train(target, recipe, seed)`` and
``sample(target, recipe, n, ...)`` (book chapters 8, 8b, 8c and 9; the command line's ``flow/...`` artifacts).

A *target* is what a flow learns to generate:

* ``"breast_cancer"`` and ``"mnist5k"``: a checkpoint zoo, split by whole runs into training, validation and
  sealed test runs (:func:`wsbook.experiments.flows.zoo_split`); the flow trains on the training runs.
* ``"posterior/breast_cancer"``: the breast-cancer posterior, whose HMC runs are split into training draws,
  a validation run and a sealed test run (:data:`~wsbook.experiments.posterior_flows.HMC_RUNS`); the flow
  trains on the training draws, the unnormalised posterior density, or both.

A *recipe* is one flow over a target and its budget at the current scale (:func:`recipes`): the chart, the
coupling, the vector field, the objective and the training sizes. Its name is the row name of the chapter's
tables. Training and sampling are cached (:mod:`wsbook.cache`), so a chapter run after
``python -m wsbook all`` trains nothing. :func:`score` scores any set of networks of a zoo target against
its validation runs (:func:`references`), and posterior samples against the validation HMC run. The
test runs are read only by the verdict tables.
"""
from __future__ import annotations

import time

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from wsbook import config
from wsbook.experiments import flows, mnist_flows as mf, posterior_flows as pf, targets, tasks

#: the zoo targets and the posterior targets
ZOO_TARGETS = ("breast_cancer", "mnist5k", "cnn_digits")
POSTERIOR_TARGETS = ("posterior/breast_cancer",)
TARGETS = ZOO_TARGETS + POSTERIOR_TARGETS


@dataclass(frozen=True)
class Recipe:
    """One flow over ``target`` by its table name: ``config`` is its
    :class:`~wsbook.experiments.flows.FlowConfig` (zoo targets) or the posterior settings it trains with
    (:class:`~wsbook.experiments.posterior_flows.FlowSettings`, with the reverse-KL or joint settings where
    the objective reads the density); ``objective`` is ``"draws"`` (flow matching on networks),
    ``"draws, then density"`` (reverse KL after flow matching) or ``"density and draws"``."""

    target: str
    name: str
    config: Any
    objective: str = "draws"


def _check_target(target: str) -> None:
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; available: {', '.join(TARGETS)}")


def _task(target: str) -> str:
    return target.removeprefix("posterior/")


def recipes(target: str) -> dict[str, Recipe]:
    """Every flow the book trains on ``target``, by name, with the current scale's sizes."""
    _check_target(target)
    if target == "breast_cancer":
        return {name: Recipe(target, name, cfg) for name, cfg in flows.breast_cancer_candidates().items()}
    if target == "mnist5k":
        return {name: Recipe(target, name, mf.recipe_config(name)) for name in mf.trained_recipes()}
    if target == "cnn_digits":
        return {name: Recipe(target, name, cfg) for name, cfg in flows.cnn_candidates().items()}
    st = pf.flow_settings()
    return {f"{chart} flow": Recipe(target, f"{chart} flow", st) for chart in pf.CHARTS} | {
        pf.DENSITY_FLOWS[1]: Recipe(target, pf.DENSITY_FLOWS[1], (st, pf.kl_settings()), "draws, then density"),
        pf.DENSITY_FLOWS[0]: Recipe(target, pf.DENSITY_FLOWS[0], (st, pf.joint_settings()), "density and draws")}


def recipe(target: str, name: str) -> Recipe:
    """The recipe ``name`` of ``target`` (:func:`recipes`), with a clear error for an unknown name."""
    available = recipes(target)
    if name not in available:
        raise ValueError(f"unknown recipe {name!r} for {target!r}; available: {', '.join(available)}")
    return available[name]


def train(target: str, name: str, seed: int = 0) -> flows.TrainedFlow:
    """The flow ``name`` (:func:`recipes`) trained on ``target``'s training data with seed ``seed`` (cached):
    a :class:`~wsbook.experiments.flows.TrainedFlow` (flow, the recipe's config, seconds, per-step losses).

    Args:
        target: a key of :data:`TARGETS`.
        name: the recipe's name.
        seed: the training run's randomness (initial field, source draws, minibatches, times); the verdict
            tables train seeds :data:`wsbook.experiments.protocol.SEEDS`, and every choice reads seed 0.
    """
    r = recipe(target, name)
    if target in ZOO_TARGETS:
        holdout = mf.budget().n_holdout if target == mf.ZOO else None
        return flows.train_flow(target, r.config, n_holdout=holdout, seed=seed)
    flow, seconds, losses = pf.train_posterior_flow(_task(target), name, seed)
    return flows.TrainedFlow(flow, r.config, seconds, losses)


def sample(target: str, name: str, n: int | None = None, *, seed: int = 0, sample_seed: int | None = None,
           steps: int | None = None, guided: str | None = None, weight: float | None = None,
           widths: tuple[int, ...] | None = None, generator: torch.Generator | None = None) -> tuple[Tensor, float]:
    """``n`` networks of the trained flow ``name`` (:func:`train` with ``seed``): ``(theta [n, D], seconds)``.

    Zoo samples are cached by ``sample_seed``; posterior samples are drawn from ``generator`` (default: one
    seeded with ``sample_seed``, else the book's :func:`wsbook.config.generator`), cheaply, as many times as a
    chapter asks.

    Args:
        target, name, seed: the trained flow, as in :func:`train`; on a posterior target ``name`` may also be a
            guided candidate (:data:`~wsbook.experiments.posterior_flows.GUIDED_FLOWS`): the flow trained on
            draws and density, drawn with that weight of task-loss guidance, as the verdict draws it.
        n: networks to draw (default for MNIST: its budget's ``n_samples``; required otherwise).
        sample_seed: the source points and guidance minibatches (default: 1 for breast cancer, 0 otherwise).
        steps: midpoint steps of the ODE solver (default: the target's).
        guided: guide the samples by the task loss on this data set's training split: ``"breast_cancer"``,
            ``"mnist"`` or ``"permuted"`` (zoo targets only).
        weight: the guidance's lambda (default: the target's).
        widths: sample another architecture (MNIST's width transfer, :meth:`~wsbook.weightflow.WeightFlow.with_spec`).
        generator: posterior targets only: draw from this generator.
    """
    # a guided posterior candidate (posterior_flows.GUIDED_FLOWS) draws from the flow it guides
    lam = pf.GUIDED_FLOWS.get(name) if target not in ZOO_TARGETS else None
    r = recipe(target, name if lam is None else pf.DENSITY_FLOWS[0])
    if n is not None and n < 1:
        raise ValueError(f"sample: n must be positive; got {n}")
    if target == mf.ZOO:
        if steps is not None or generator is not None:
            raise ValueError("sample: MNIST flows sample with their budget's solver and a sample_seed")
        return mf.sample_flow(name, n, widths=widths, guided=guided, seed=sample_seed or 0, weight=weight,
                              train_seed=seed)
    if widths is not None:
        raise ValueError(f"sample: only MNIST flows sample other widths; got widths for {target!r}")
    if n is None:
        raise ValueError(f"sample: {target!r} needs the number of networks n")
    if target in ZOO_TARGETS:
        if generator is not None:
            raise ValueError("sample: zoo samples are cached by sample_seed, not drawn from a generator")
        if guided not in (None, target):
            raise ValueError(f"sample: {target!r} flows are guided by their own data; got {guided!r}")
        if guided is not None and weight is None:
            raise ValueError(f"sample: guidance of {target!r} flows needs its weight")
        lam = 0.0 if guided is None else weight
        return flows.sample_flow(target, r.config, n, steps=flows.solver_steps() if steps is None else steps,
                                 guidance=lam, seed=seed, sample_seed=1 if sample_seed is None else sample_seed)
    if guided is not None:
        raise ValueError("sample: posterior flows are not guided here (see posterior_flows.guided)")
    if generator is None:
        generator = config.generator() if sample_seed is None else torch.Generator().manual_seed(sample_seed)
    flow = train(target, r.name, seed).flow
    if lam is not None:
        start = time.perf_counter()
        theta = pf.sample_guided(flow, n, pf.task_guidance(_task(target), lam), generator, steps)
        return theta, time.perf_counter() - start
    theta, _, seconds = pf.sample_flow(flow, n, generator, steps)
    return theta, seconds


def _zoo_split(target: str):
    return mf.split() if target == mf.ZOO else flows.zoo_split(target)


def references(target: str, n: int | None = None) -> flows.References:
    """The validation references of the zoo target ``target`` for sets of ``n`` networks (default for MNIST:
    its budget's ``n_samples``): every distance of :func:`score`, and the perfect generator's floor drawn
    from as many networks (:func:`wsbook.experiments.flows.references`)."""
    _check_target(target)
    if target not in ZOO_TARGETS:
        raise ValueError(f"references: {target!r} is a posterior target; its reference is an HMC run "
                         f"(wsbook.experiments.posterior_flows.HMC_RUNS)")
    if target == mf.ZOO:
        return mf.references(n)
    if n is None:
        raise ValueError(f"references: {target!r} needs the networks per set n")
    return flows.references(_zoo_split(target), n)


def score(target: str, theta: Tensor, refs: flows.References | None = None, *, data=None, seed: int = 0) -> dict:
    """One row of a results table: networks ``theta [n, D]`` of ``target`` scored the one way every table
    scores them. For every target: accuracy, NLL, the model average of 64 (``bma_accuracy``, ``bma_nll``)
    and diversity on the data's test inputs (:func:`wsbook.experiments.flows.probability_scores`). For a
    zoo target, against the validation runs ``refs`` (default :func:`references` for ``n`` networks): the
    MMD^2 over the perfect generator's floor (``mmd_ratio``), the memorisation ratio ``nn_ratio`` and the
    weight-space W2 (:func:`wsbook.experiments.flows.score`). For a posterior target, against the
    validation HMC run: ``tv`` and ``mmd2``
    (:func:`wsbook.experiments.posterior_flows.validation_distances`).

    Args:
        target: a key of :data:`TARGETS`.
        theta: the networks, in the zoo's architecture.
        refs: the reference runs (from :func:`references`; built for ``len(theta)`` networks if omitted).
        data: score on another data set's test split instead (a :class:`wsbook.data.Dataset` with the zoo's
            inputs and classes, e.g. a second task): the function columns only, without references.
        seed: the model average's members and the W2 subsamples.
    """
    _check_target(target)
    if target not in ZOO_TARGETS:
        if refs is not None or data is not None:
            raise ValueError(f"score: {target!r} is scored against its validation HMC run; it takes no refs or data")
        task = _task(target)
        ds, spec = tasks.get_task(task).data(), targets.hmc_reference(task, pf.HMC_RUNS["training"]).spec
        probs = targets.predictive_probs(spec, spec.check(theta, "theta"), ds.x_test)
        return flows.probability_scores(probs, ds.y_test, generator=torch.Generator().manual_seed(seed)) \
            | pf.validation_distances(task, theta, seed, probs=probs)
    if data is not None:
        if refs is not None:
            raise ValueError("score: references are the zoo's runs on the zoo's data; pass data or refs, not both")
        spec = _zoo_split(target).spec
        probs = targets.predictive_probs(spec, spec.check(theta, "theta"), data.x_test)
        return flows.probability_scores(probs, data.y_test, generator=torch.Generator().manual_seed(seed))
    if refs is None:
        refs = references(target, len(theta))
    return flows.score(theta, refs, seed=seed)
