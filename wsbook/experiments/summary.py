"""The headline numbers of the results chapter, gathered for the discussion (chapter 9).

Every number comes from the same cached calls as chapter 8 (:mod:`wsbook.experiments.flows`,
:mod:`wsbook.experiments.mnist_flows`) with the same sizes, so after chapter 8 has run nothing is
trained again; on a cold cache the discussion computes what it quotes.
"""
from __future__ import annotations

import pandas as pd
import torch

from wsbook import config
from wsbook.experiments import flows, pipeline, tasks
from wsbook.experiments import mnist_flows as mf

#: the rows the discussion compares on each task: the target, the plain baseline and the book's flows (on
#: breast cancer the table's field that reads whole neurons on two charts, and the message-passing graph
#: network on the headline flow at the table's budget and extended)
EXTENDED = "euclidean_aligned_ot, extended"
NEURON_GRAPH = flows.neuron_config().name
BREAST_CANCER_ROWS = ("plain baseline", NEURON_GRAPH, flows.neuron_config("geometric").name, "euclidean_aligned_ot",
                      EXTENDED)
MNIST_ROWS = ("plain baseline", "euclidean_aligned_ot", "geometric_aligned_ot", mf.UNANCHORED_GNN, mf.TRANSFER,
              mf.NEURON_ANCHORED)


def breast_cancer_sizes() -> tuple[int, int]:
    """``(generated networks, midpoint steps)`` per flow: the sizes of chapter 8's breast-cancer table."""
    return config.by_scale(ci=64, default=128, full=512), flows.solver_steps()


def breast_cancer_verdict() -> pd.DataFrame:
    """Chapter 8's test verdict (:func:`wsbook.experiments.flows.verdict_table`): the flow chosen on the
    validation runs from :func:`~wsbook.experiments.flows.breast_cancer_verdict_candidates`, and the plain
    baseline, at the table's sizes (:func:`breast_cancer_sizes`)."""
    return flows.verdict_table("breast_cancer", flows.breast_cancer_verdict_candidates(), *breast_cancer_sizes())


def headline() -> pd.DataFrame:
    """One row per (task, set of networks): accuracy (mean over networks), its gap to the target's, NLL,
    BMA-64 accuracy, the function-space distance to held-out runs (MMD ratio: on breast cancer MMD^2 to
    the validation runs over the perfect generator's floor, :func:`wsbook.experiments.flows.references`)
    and, on breast cancer, the median nearest-neighbour distance to the training zoo over the validation
    runs' (nn ratio; below 1: closer to the training checkpoints than new runs). The test verdict is
    :func:`wsbook.experiments.flows.verdict_table`'s.

    See chapter 9, "What the numbers say".
    """
    rows = []
    n_gen, solver_steps = breast_cancer_sizes()
    refs = pipeline.references("breast_cancer", n_gen)
    target = flows.target_rows(refs, n_gen)["iid training checkpoints"]
    sets = {"target": target}
    for name in BREAST_CANCER_ROWS:
        theta, _ = pipeline.sample("breast_cancer", name, n_gen, steps=solver_steps)
        sets[name] = pipeline.score("breast_cancer", theta, refs)
    b = mf.budget()
    train, refs = mf.split().train, pipeline.references(mf.ZOO)
    pick = torch.randperm(len(train), generator=config.generator())[:b.n_samples]
    mn = {"target": pipeline.score(mf.ZOO, train.theta[pick], refs)}
    for recipe in MNIST_ROWS:
        if recipe in mf.trained_recipes(b):
            mn[recipe] = pipeline.score(mf.ZOO, pipeline.sample(mf.ZOO, recipe)[0], refs)
    for task, scored, columns in (("breast cancer", sets, ("nn_ratio",)), ("MNIST 784-10-10", mn, ())):
        for name, s in scored.items():
            rows.append(dict(task=task, networks=name, accuracy=s["accuracy"],
                             gap=s["accuracy"] - scored["target"]["accuracy"], nll=s["nll"],
                             bma_accuracy=s["bma_accuracy"], mmd_ratio=s["mmd_ratio"],
                             **{c: s[c] for c in columns}))
    return pd.DataFrame(rows).set_index(["task", "networks"])


def posterior_headline(task: str = "breast_cancer") -> pd.DataFrame:
    """Total variation and MMD^2 to the unseen HMC run of the flows trained on HMC draws, of the Euclidean
    one trained further on the posterior density by reverse KL, and of the one trained on draws and density
    together (chapter 8c), beside HMC's own floor, mean-field VI and Laplace, with the model average's
    accuracy.

    See chapter 9, "What the numbers say".
    """
    from wsbook.experiments import pipeline, posterior_flows as pf

    n = tasks.posterior_sample_size()
    gen = config.generator()
    target = f"posterior/{task}"
    rows = {name: (pipeline.sample(target, name, n, generator=gen)[0], pipeline.train(target, name).seconds)
            for name in pf.FLOWS}
    table = pf.methods_table(task, n, rows)
    keep = ["hmc", "vi", "laplace", *rows]
    return table.loc[keep, ["tv_run1", "mmd2_run1", "accuracy"]]


def sampling_cost(task_names: tuple[str, ...] = ("breast_cancer", "mnist5k")) -> dict[str, "pd.DataFrame | str"]:
    """The end-to-end cost of a posterior sample, as chapter 8c prices it: per task, the table of
    :func:`wsbook.experiments.posterior_flows.task_cost` (each flow's training and the HMC run it learned
    from, spread over the page's samples and over ten times as many, against HMC's whole run per effective
    sample; cached trainings, the sampling timed now), or the sentence that says no cost can be measured
    where the task's HMC reference has not converged.

    See chapter 9, "Limits".
    """
    from wsbook.experiments import posterior_flows as pf

    return {task: pf.task_cost(task, tasks.posterior_sample_size(), config.generator()) for task in task_names}


#: the columns of :func:`verdicts`
VERDICT_COLUMNS = ("networks", "mean", "se", "criterion", "verdict")


def verdicts(cost: "pd.DataFrame | str | None" = None) -> pd.DataFrame:
    """Every criterion the results chapters judge on their test runs, one row each, read from the cached
    verdict tables (:func:`wsbook.experiments.flows.verdict_table` for breast cancer,
    :func:`~wsbook.experiments.mnist_flows.verdict_table`, :func:`~wsbook.experiments.posterior_flows.verdict_table`,
    :func:`~wsbook.experiments.flows.cnn_verdict_table` and the width transfers,
    :func:`~wsbook.experiments.mnist_flows.width_transfer_verdict` and
    :func:`~wsbook.experiments.flows.cnn_width_transfer`)
    and the breast-cancer cost (``cost``: :func:`sampling_cost`'s entry for breast cancer; computed when
    ``None``). Indexed by (chapter, measure); columns :data:`VERDICT_COLUMNS`: the networks judged (the
    flow each table chose on validation data), the measure's mean and standard error over training seeds
    (the cost row: the cheapest flow's ratio, without an error), the criterion in words and the table's
    verdict (*met*, *level*, *missed*; the cost row: :func:`~wsbook.experiments.posterior_flows.cost_verdict`
    or ``"not measured"``).

    See chapter 9, "The verdicts at a glance".
    """
    from wsbook.experiments import posterior_flows as pf

    rows: dict[tuple[str, str], dict] = {}

    def add(chapter: str, measure: str, networks: str, mean: float, se: float, criterion: str, verdict: str):
        rows[chapter, measure] = dict(zip(VERDICT_COLUMNS, (networks, float(mean), float(se), criterion, verdict)))

    def zoo_rows(chapter: str, table: pd.DataFrame, measures: tuple[str, ...]) -> None:
        chosen, row = table.attrs["selected"], table.loc[table.attrs["selected"]]
        mmd_goal, (nn_goal, nn_floor) = table.attrs["mmd_goal"], table.attrs["nn_goal"]
        gap = table.attrs["accuracy_gap"]                  # set by the tables that judge an accuracy gap
        criteria = {
            "MMD² verdict": ("MMD² over the perfect generator's", "mmd_ratio", f"at most {mmd_goal:g}"),
            "memorisation verdict": ("nearest-neighbour ratio", "nn_ratio",
                                     f"at least {nn_goal:g}, mean - 2 se at least {nn_floor:g}"),
            "accuracy verdict": ("accuracy", "accuracy", "level with the zoo's or better"),
            "BMA-64 NLL verdict": ("BMA-64 NLL", "bma_nll", "level with the zoo's or better"),
            "gap verdict": ("accuracy", "accuracy", gap is not None and f"within {gap:g} of the zoo's"),
            "MMD² vs baseline": ("MMD² against the plain baseline", "mmd_ratio", "below the plain baseline's"),
        }
        for column in measures:
            measure, value, criterion = criteria[column]
            add(chapter, measure, chosen, row[value], row[f"{value}_se"], criterion, row[column])

    def width_row(chapter: str, measure: str, wide: pd.DataFrame) -> None:
        new = wide.loc["flow at the new width"]
        add(chapter, measure, wide.attrs["chosen"], new["accuracy"], new["accuracy_se"],
            f"within {wide.attrs['accuracy_gap']:g} of trained ones, above both ensembles of its narrow samples",
            new["transfer verdict"])

    bc = breast_cancer_verdict()
    zoo_rows("8, breast cancer", bc, ("MMD² verdict", "memorisation verdict", "accuracy verdict",
                                      "BMA-64 NLL verdict"))
    zoo_rows("8b, MNIST", mf.verdict_table(), ("gap verdict", "MMD² vs baseline"))
    width_row("8b, MNIST", "width transfer to 784-32-10", mf.width_transfer_verdict())

    post = pf.verdict_table("breast_cancer")
    chosen = post.attrs["selected"]
    for measure, col in (("TV", "tv"), ("MMD²", "mmd2")):
        add("8c, posterior", f"{measure} to the test HMC run", chosen, post.loc[chosen, col],
            post.loc[chosen, f"{col}_se"], f"below mean-field VI's ({post.loc[pf.VI_ROW, col]:.3g})",
            post.loc[chosen, f"{measure} vs VI"])
    cost = sampling_cost(("breast_cancer",))["breast_cancer"] if cost is None else cost
    criterion = f"{pf.COST_GOAL:g}x cheaper than HMC, training included"
    if isinstance(cost, str):
        add("8c, posterior", "cost", "every posterior flow", float("nan"), float("nan"), criterion, "not measured")
    else:
        cheapest = cost["ratio_n"].idxmax()
        add("8c, posterior", "cost", cheapest, cost.loc[cheapest, "ratio_n"], float("nan"), criterion,
            cost.loc[cheapest, "verdict"])

    zoo_rows("8d, CNN", flows.cnn_verdict_table(), ("gap verdict", "MMD² verdict", "memorisation verdict"))
    channel = flows.cnn_verdict_table("channel")
    chosen = channel.attrs["selected"]
    add("8d, CNN", "equivariant field against the plain baseline", chosen, channel.loc[chosen, "mmd_ratio"],
        channel.loc[chosen, "mmd_ratio_se"], "MMD² below the plain (DeepWeightFlow-style) baseline's",
        channel.loc[chosen, "MMD² vs baseline"])
    pair = flows.equivariant_against_flat()
    add("8d, CNN", "equivariant field against the best flat field", chosen, pair.loc[chosen, "mmd_ratio"],
        pair.loc[chosen, "mmd_ratio_se"], "MMD² below the flat-field flow's chosen on validation runs",
        pair.loc[chosen, "MMD² vs flat"])
    width_row("8d, CNN", "channel-width transfer", flows.cnn_width_transfer())
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index = pd.MultiIndex.from_tuples(table.index, names=["chapter", "measure"])
    return table[list(VERDICT_COLUMNS)]
