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

