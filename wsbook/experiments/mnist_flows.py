"""Flows over MNIST classifiers (book chapter 8, page "MNIST"; thesis sec. 7.3-7.5).

Everything the page computes that costs more than a second lives here, cached with :mod:`wsbook.cache`:

* :func:`budget`: the per-scale sizes (field width, training steps, batch, samples, solver steps). On a
  CPU the GNN field over a 784-10-10 network costs a sizeable fraction of a second per training step at
  batch 8, so ``default`` trains small fields for a few hundred steps; ``full`` holds the thesis's sizes.
* :func:`split`: the 784-10-10 zoo split by whole runs into training, validation and (sealed) test runs
  (:mod:`wsbook.experiments.protocol`).
* :func:`recipe_config` / :func:`sample_flow`: one recipe (chart, field, coupling; the names of the thesis's
  Table 7.2 rows, plus ``"plain baseline"``) as a :class:`~wsbook.experiments.flows.FlowConfig`, and its
  samples, optionally for another hidden width (:meth:`WeightFlow.with_spec`) and with task-loss guidance.
  Chapters train and sample through :mod:`wsbook.experiments.pipeline` (target ``"mnist5k"``).
* :func:`width_transfer`: Table 7.4, :data:`TRANSFER` (the DeepSets field over hidden neurons,
  :class:`~wsbook.weightflow.NeuronField`) trained on 784-10-10 and sampling 784-32-10.
* :func:`bma_curve`: accuracy and NLL of the model average against its size. Every table row is scored by
  :func:`wsbook.experiments.pipeline.score` (accuracy, NLL, BMA-64, diversity, MMD^2 over the perfect
  generator's floor, memorisation).
* :func:`verdict_table`: the flow chosen on validation data, trained over fresh seeds and judged on the
  test runs beside the plain baseline.
* :func:`permuted_mnist`: the second task (MNIST with one fixed, seeded pixel permutation; Fashion-MNIST
  cannot be downloaded here) and :func:`init_curves` (flow samples as initialisation).
* :func:`field_size_sweep`: sample quality against the width of the field.
* :func:`accuracy_along_training`: the validation accuracy of a flow's samples at copies of its field kept
  during training (:func:`snapshot_steps`), beside the training checkpoints' (:func:`zoo_validation_accuracy`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from wsbook import config, data, nets
from wsbook.cache import cached
from wsbook.experiments import flows, protocol, targets
from wsbook.nets import MLPSpec, train_population
from wsbook.weightflow import Guidance, WeightFlow

#: recipe name -> (chart, field, coupling); names as in the thesis's Table 7.2 (every chart aligned)
RECIPES: dict[str, tuple[str, str, str]] = {
    "euclidean_aligned": ("euclidean", "gnn", "independent"),
    "euclidean_aligned_ot": ("euclidean", "gnn", "ot"),
    "normalized_aligned": ("normalized", "gnn", "independent"),
    "normalized_aligned_ot": ("normalized", "gnn", "ot"),
    "geometric_aligned": ("geometric", "gnn", "independent"),
    "geometric_aligned_ot": ("geometric", "gnn", "ot"),
    # equivariant fields without an anchor (pairs aligned to their source partner): they sample other widths
    "geometric_aligned_ot_unanchored": ("geometric", "gnn_unanchored", "ot"),
    "geometric_aligned_ot_neuron": ("geometric", "neuron", "ot"),
    # the neuron field reading the mean aligned network beside each neuron (one width only)
    "geometric_aligned_ot_neuron_anchored": ("geometric", "neuron_anchored", "ot"),
    "plain baseline": ("euclidean", "flat", "ot"),
}
#: the recipe whose field transfers to other hidden widths (an anchored field exists for one width)
TRANSFER = "geometric_aligned_ot_neuron"
#: the GNN field without an anchor (also width-agnostic; at CPU budgets it does not learn MNIST)
UNANCHORED_GNN = "geometric_aligned_ot_unanchored"
#: the neuron field with an anchor (one width)
NEURON_ANCHORED = "geometric_aligned_ot_neuron_anchored"
ZOO = "mnist5k"
WIDE_ZOO = "mnist5k_w32"
BMA_SIZES = (1, 4, 8, 16, 32, 64)
#: copies of the field kept along a training run by :func:`accuracy_along_training`
N_SNAPSHOTS = 10


@dataclass(frozen=True)
class Budget:
    """The sizes of the page at one scale.

    Attributes:
        recipes: the GNN recipes of the table (the plain baseline is always added).
        dim, n_layers: width and depth of the GNN field.
        batch_size, steps, lr, ema_decay: GNN training.
        flat_hidden, flat_batch, flat_steps, flat_lr: the plain baseline's MLP field and its training.
        neuron_hidden, neuron_attention, neuron_batch, neuron_steps, neuron_lr: the neuron field of
            :data:`TRANSFER` (width, self-attention layers among neurons) and its training.
        n_samples: networks sampled per flow (the table, BMA curve and MMD use them all).
        sample_steps, method: the ODE solver (midpoint: two field evaluations per step).
        n_wide: networks sampled at width 32 per setting.
        guidance_weight: lambda of the (linearly scheduled) MNIST guidance at the table's solver steps.
        guidance_grid: the lambdas :func:`guidance_by_validation` chooses from for the best flow.
        transfer_weight, guidance_steps: lambda and Euler steps of a guided sample on the second task
            (guidance acts like gradient descent along the path, so it needs many steps; lambda is chosen so
            that one step moves at most about as far as one SGD step of the zoo's learning rate).
        init_steps, init_every: SGD steps and checkpoint spacing of the initialisation experiment.
        field_dims: field widths of the model-size sweep.
        n_holdout: runs held out (and as many other runs for the floor).
    """

    recipes: tuple[str, ...]
    dim: int
    n_layers: int
    batch_size: int
    steps: int
    lr: float
    ema_decay: float
    flat_hidden: int
    flat_batch: int
    flat_steps: int
    flat_lr: float
    neuron_hidden: int
    neuron_attention: int
    neuron_batch: int
    neuron_steps: int
    neuron_lr: float
    n_samples: int
    sample_steps: int
    method: str
    n_wide: int
    guidance_weight: float
    guidance_grid: tuple[float, ...]
    transfer_weight: float
    guidance_steps: int
    init_steps: int
    init_every: int
    field_dims: tuple[int, ...]
    n_holdout: int


def budget() -> Budget:
    """The page's sizes at the current scale (the one place they are chosen)."""
    s = config.by_scale
    return Budget(
        recipes=s(("geometric_aligned", "geometric_aligned_ot", UNANCHORED_GNN, TRANSFER, NEURON_ANCHORED),
                  ("euclidean_aligned", "euclidean_aligned_ot", "geometric_aligned", "geometric_aligned_ot",
                   UNANCHORED_GNN, TRANSFER, NEURON_ANCHORED),
                  tuple(r for r in RECIPES if r != "plain baseline")),
        dim=s(8, 8, 64), n_layers=s(1, 1, 4), batch_size=s(8, 8, 64), steps=s(30, 350, 50_000), lr=s(1e-2, 1e-2, 1e-3),
        ema_decay=s(0.9, 0.95, 0.999), flat_hidden=s(256, 256, 512), flat_batch=64, flat_steps=s(150, 600, 20_000),
        flat_lr=s(3e-3, 3e-3, 1e-3), neuron_hidden=s(64, 256, 512), neuron_attention=2, neuron_batch=32,
        neuron_steps=s(150, 3000, 50_000), neuron_lr=1e-3, n_samples=s(16, 64, 256), sample_steps=s(4, 8, 100),
        method="midpoint",
        n_wide=s(8, 32, 256), guidance_weight=0.1, guidance_grid=s((0.1, 1.0), (0.1, 1.0, 4.0), (0.1, 1.0, 4.0)),
        transfer_weight=s(0.5, 1.0, 16.0), guidance_steps=s(16, 32, 512),
        init_steps=s(60, 200, 1000), init_every=s(20, 20, 50), field_dims=s((4, 8), (4, 8, 16), (16, 32, 64, 128)),
        n_holdout=s(1, 4, 10))


# ------------------------------------------------------------------------------------------ targets
def split(seed: int = 0) -> protocol.RunSplit:
    """The 784-10-10 zoo by whole runs: the budget's ``n_holdout`` test runs (sealed), as many validation
    runs, the rest for training (:func:`wsbook.experiments.flows.zoo_split`)."""
    return flows.zoo_split(ZOO, n_holdout=budget().n_holdout, seed=seed)


def references(n: int | None = None) -> "flows.References":
    """The validation references of :func:`split` for sets of ``n`` networks (default: the budget's
    ``n_samples``): what every table of the page is scored against (:func:`wsbook.experiments.flows.references`)."""
    return flows.references(split(), int(n or budget().n_samples))


def permuted_mnist(seed: int = 0) -> data.Dataset:
    """The second task: the packaged MNIST subset with one fixed pixel permutation (drawn from ``seed``)
    applied to every image of every split. Its statistics match MNIST's, but every input weight of an
    MNIST network now looks at another pixel: the digit detectors a flow learned do not fit it."""
    ds = data.load(ZOO)
    perm = torch.randperm(ds.n_features, generator=torch.Generator().manual_seed(10_000 + seed)).to(ds.x_train.device)
    return replace(ds, name=f"{ZOO}_permuted", x_train=ds.x_train[:, perm], x_val=ds.x_val[:, perm],
                   x_test=ds.x_test[:, perm])


def task_data(task: str) -> data.Dataset:
    """``"mnist"`` (the packaged subset) or ``"permuted"`` (:func:`permuted_mnist`)."""
    if task == "mnist":
        return data.load(ZOO)
    if task == "permuted":
        return permuted_mnist()
    raise ValueError(f"task must be 'mnist' or 'permuted'; got {task!r}")


# -------------------------------------------------------------------------------------------- flows
def trained_recipes(b: Budget | None = None) -> tuple[str, ...]:
    """The recipes chapter 8b trains at the budget's scale (default: the current one): the budget's
    recipes and the plain baseline."""
    return (*(budget() if b is None else b).recipes, "plain baseline")


def recipe_config(recipe: str, b: Budget | None = None, dim: int | None = None) -> flows.FlowConfig:
    """The :class:`~wsbook.experiments.flows.FlowConfig` of ``recipe`` (a key of :data:`RECIPES`) with the
    budget's sizes: every chart aligned to the split's reference network; the GNN and neuron fields read
    the mean aligned network (anchored) unless the recipe says otherwise, and the unanchored ones get pairs
    aligned to their source partner instead (equivariant flow matching, Klein et al., 2023).

    Args:
        recipe: the recipe's name.
        b: the budget (default: the current scale's).
        dim: override of the GNN field's width (model-size sweep).
    """
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; available: {', '.join(RECIPES)}")
    b = budget() if b is None else b
    chart, kind, coupling = RECIPES[recipe]
    anchored = kind in ("gnn", "neuron_anchored")
    if kind == "flat":
        sizes = dict(field="flat", hidden=b.flat_hidden, depth=3, steps=b.flat_steps, batch_size=b.flat_batch,
                     lr=b.flat_lr)
    elif kind.startswith("neuron"):
        sizes = dict(field="neuron", hidden=b.neuron_hidden, n_layers=b.neuron_attention, steps=b.neuron_steps,
                     batch_size=b.neuron_batch, lr=b.neuron_lr)
    else:
        sizes = dict(field="gnn", dim=dim or b.dim, n_layers=b.n_layers, steps=b.steps, batch_size=b.batch_size,
                     lr=b.lr)
    return flows.FlowConfig(chart=chart, aligned=True, coupling=coupling, anchored=anchored,
                            align_pairs=not anchored and kind != "flat", ema_decay=b.ema_decay, **sizes)


def make_flow(recipe: str, spec: MLPSpec, reference: Tensor, b: Budget | None = None,
              dim: int | None = None) -> WeightFlow:
    """An untrained flow of ``recipe`` (:func:`recipe_config`) for networks of ``spec``, aligned to
    ``reference``."""
    return flows.build_flow(spec, recipe_config(recipe, b, dim), reference)


def describe(recipe: str, b: Budget | None = None) -> str:
    """The field and training of ``recipe`` in words (for the page's prose)."""
    b = budget() if b is None else b
    kind = RECIPES[recipe][1]
    if kind == "flat":
        return f"a flat MLP field of width {b.flat_hidden} trained for {b.flat_steps} steps of {b.flat_batch}"
    if kind.startswith("neuron"):
        return (f"a neuron field of width {b.neuron_hidden} with {b.neuron_attention} attention layers, trained for "
                f"{b.neuron_steps} steps of {b.neuron_batch}")
    layers = f"{b.n_layers} message-passing layer" + ("s" if b.n_layers != 1 else "")
    return f"a GNN field of width {b.dim} with {layers}, trained for {b.steps} steps of {b.batch_size}"


@cached("flows/mnist/samples", version=8)   # 8: flows trained by flows.train_flow
def _sample(recipe: str, cfg: flows.FlowConfig, widths: tuple[int, ...], n: int, guided: str | None,
            sampler: dict, seed: int, train_seed: int) -> dict:
    b = budget()
    flow = flows.train_flow(ZOO, cfg, n_holdout=b.n_holdout, seed=train_seed).flow
    spec = MLPSpec(widths)
    if spec != flow.spec:
        flow = flow.with_spec(spec)
    gen = torch.Generator().manual_seed(2000 + seed)
    guide, steps, method = None, b.sample_steps, b.method
    if guided is not None:
        ds = task_data(guided)
        if guided == "permuted":                     # guidance has to train the networks: many small steps
            steps, method = b.guidance_steps, "euler"
        guide = Guidance(ds.x_train, ds.y_train, weight=sampler["weight"], schedule="linear", batch_size=256,
                         generator=gen)
    start = time.perf_counter()
    theta = flow.sample(n, steps=steps, method=method, generator=gen, guidance=guide)
    return {"theta": theta, "seconds": time.perf_counter() - start}


def sample_flow(recipe: str, n: int | None = None, widths: tuple[int, ...] | None = None, guided: str | None = None,
                dim: int | None = None, seed: int = 0, weight: float | None = None,
                train_seed: int = 0) -> tuple[Tensor, float]:
    """Networks sampled from the trained flow of ``recipe`` (cached): ``(theta [n, D], seconds)``.

    Args:
        recipe: a key of :data:`RECIPES`.
        n: networks (default: the budget's ``n_samples``).
        widths: the architecture to sample (default 784-10-10; another hidden width uses ``with_spec``).
        guided: ``None``, ``"mnist"`` or ``"permuted"``: task-loss guidance on that task's training data.
        dim: the field width (model-size sweep; default the budget's).
        seed: the source points and guidance minibatches.
        weight: the guidance's lambda (default: the budget's for that task).
        train_seed: the training run of the flow (``seed`` of :func:`wsbook.experiments.flows.train_flow`).
    """
    b = budget()
    widths = tuple(widths or targets.ZOOS[ZOO].widths)
    sampler = {"steps": b.sample_steps, "method": b.method}
    if weight is not None and guided is None:
        raise ValueError("sample_flow: a guidance weight needs guided='mnist' or 'permuted'")
    if guided is not None:
        default = b.transfer_weight if guided == "permuted" else b.guidance_weight
        sampler["weight"] = float(default if weight is None else weight)
        sampler["guided_steps"] = b.guidance_steps if guided == "permuted" else b.sample_steps
    out = _sample(recipe, recipe_config(recipe, b, dim), widths, int(n or b.n_samples), guided, sampler, seed,
                  train_seed)
    return out["theta"], float(out["seconds"])


def guidance_by_validation(recipe: str, target: Tensor, weights: tuple[float, ...] | None = None) -> dict:
    """Choose the lambda of MNIST task-loss guidance for ``recipe``'s samples on the validation split (the
    test split stays for the tables): the weight whose guided networks' mean validation accuracy comes
    closest to that of the ``target`` networks ``[n, D]``.

    Returns ``{"accuracy": {weight: mean validation accuracy}, "target": the target's, "chosen": weight}``.
    """
    weights = tuple(budget().guidance_grid if weights is None else weights)
    if not weights:
        raise ValueError("guidance_by_validation needs at least one weight")
    ds = data.load(ZOO)
    spec = MLPSpec(tuple(targets.ZOOS[ZOO].widths))

    def val_accuracy(theta: Tensor) -> float:
        return targets.evaluate(spec, theta, ds, split="val").accuracy

    acc = {w: val_accuracy(sample_flow(recipe, guided="mnist", weight=w)[0]) for w in weights}
    aim = val_accuracy(target)
    return {"accuracy": acc, "target": aim, "chosen": min(weights, key=lambda w: abs(acc[w] - aim))}


# ------------------------------------------------------------------------------------------- scores
def probs_of(spec: MLPSpec, theta: Tensor, ds: data.Dataset) -> Tensor:
    """Test-set class probabilities ``[n, N, C]``."""
    return targets.predictive_probs(spec, theta, ds.x_test)


def bma_curve(probs: Tensor, y: Tensor, sizes: tuple[int, ...] = BMA_SIZES, repeats: int = 8,
              generator: torch.Generator | None = None) -> dict[int, dict]:
    """Accuracy and NLL of the model average of ``k`` random members for every ``k`` in ``sizes`` (at most
    the set's size), each averaged over ``repeats`` random draws: ``{k: {"accuracy", "nll"}}``."""
    from wsbook.bayes import metrics as M

    gen = generator if generator is not None else config.generator()
    n = probs.shape[0]
    out = {}
    for k in sizes:
        if k > n:
            continue
        picks = torch.stack([torch.randperm(n, generator=gen)[:k] for _ in range(repeats)]).to(probs.device)
        avg = probs[picks].mean(1)                                          # [repeats, N, C]
        out[k] = {"accuracy": float(M.accuracy(avg, y).mean()), "nll": float(M.nll(avg, y).mean())}
    return out


def validation_accuracy(recipe: str) -> float:
    """Mean accuracy on the data's validation split of the networks of ``recipe``'s seed-0 flow (the draw
    every table of the page shows): what :func:`verdict_table` chooses by."""
    ds = data.load(ZOO)
    return targets.evaluate(MLPSpec(tuple(targets.ZOOS[ZOO].widths)), sample_flow(recipe)[0], ds, bma_k=1,
                            split="val").accuracy


def verdict_choice() -> tuple[str, dict[str, float]]:
    """The choice of :func:`verdict_table`: ``(the recipe with the most accurate seed-0 networks on the
    validation split, every recipe's validation accuracy)``."""
    validation = {r: validation_accuracy(r) for r in budget().recipes}
    return max(validation, key=validation.get), validation


def verdict_seed(seed: int) -> dict[str, Tensor]:
    """One training seed of :func:`verdict_table`: the chosen recipe's and the plain baseline's flows trained
    with ``seed`` and sampled with source seed ``seed`` (both cached), ``{recipe: theta}``. The command line
    computes each seed on its own (``verdict/mnist5k/seed/<seed>``), so that ``--jobs`` trains them side by
    side."""
    chosen, _ = verdict_choice()
    return {r: sample_flow(r, seed=seed, train_seed=seed)[0] for r in (chosen, "plain baseline")}


def verdict_table(seeds: tuple[int, ...] = protocol.SEEDS):
    """The page's verdict: the recipe whose seed-0 networks are most accurate on the validation split of the
    data is chosen, trained with fresh ``seeds`` beside the plain baseline and judged on the test runs by
    :func:`wsbook.experiments.flows.test_report` (test inputs; MMD^2 to the test runs over the perfect
    generator's floor). Two columns hold the MNIST goals: ``gap verdict`` (the target's mean accuracy minus
    the row's at most :data:`wsbook.experiments.flows.ACCURACY_GAP`) and ``MMD² vs baseline`` (below the plain baseline's).

    Returns the DataFrame with ``attrs["selected"]`` and ``attrs["validation"]`` (validation accuracy per
    recipe).
    """
    b = budget()
    recipes = {r: recipe_config(r, b) for r in (*b.recipes, "plain baseline")}
    return flows.with_floor(_verdict_table(tuple(seeds), targets.ZOOS[ZOO], recipes, b))


@cached("flows/mnist_verdict", version=4)   # 4: the yardstick's spread in the nn ratio's error
def _verdict_table(seeds: tuple[int, ...], zoo: targets.ZooConfig, recipes: dict, b: Budget):
    """:func:`verdict_table`, cached under the zoo's settings, the recipes' and the budget's."""
    chosen, validation = verdict_choice()
    per_seed = [verdict_seed(s) for s in seeds]
    sets = {r: [drawn[r] for drawn in per_seed] for r in (chosen, "plain baseline")}
    table = flows.test_report(split(), sets, b.n_samples, accuracy_gap=flows.ACCURACY_GAP)
    protocol.versus_column(table, "MMD² vs baseline", "mmd_ratio", [chosen], "plain baseline")
    table.attrs.update(selected=chosen, validation=validation)
    return flows.floor_as_fields(table)


# ------------------------------------------------------------------------------ second task, init
def neuron_similarity(spec: MLPSpec, theta: Tensor) -> float:
    """How alike the first hidden layer's neurons of each network are: for every neuron the largest cosine
    similarity of its ``[incoming weights, bias]`` to another neuron of the same network, averaged over
    neurons and networks ``theta [n, D]``. Near 1: the layer repeats a few neurons."""
    w, b = spec.weights(theta)[0], spec.biases(theta)[0]
    rows = torch.nn.functional.normalize(torch.cat([w, b[..., None]], -1) if b is not None else w, dim=-1)
    cos = rows @ rows.transpose(1, 2)
    cos.diagonal(dim1=1, dim2=2).fill_(-1.0)
    return float(cos.amax(-1).mean())


def assembled_networks(narrow: Tensor, spec: MLPSpec, wide: MLPSpec, n: int,
                       generator: torch.Generator | None = None) -> Tensor:
    """``n`` networks of the wider one-hidden-layer ``wide`` built from the neurons of networks of ``spec``:
    each takes the hidden neurons (incoming weights, bias, outgoing weights) of ``ceil(H / h)`` members of
    ``narrow [N, D]`` drawn without replacement until it has ``H``, scales the outgoing weights by ``h / H``
    and averages the members' output biases. For whole members this is the average of their logits: what a
    wider layer made of narrow-network neurons computes. With trained networks as ``narrow`` it is a
    reference for width transfer; with independent flow samples, a way to sample wide networks from a flow
    over narrow ones."""
    if len(spec.widths) != 3 or len(wide.widths) != 3 or spec.widths[::2] != wide.widths[::2]:
        raise ValueError(f"assembled_networks: {spec} and {wide} must be one-hidden-layer MLPs with the same "
                         f"inputs and outputs")
    h, big = spec.widths[1], wide.widths[1]
    k = -(-big // h)
    if narrow.shape[0] < n * k:
        raise ValueError(f"assembled_networks: {n} networks of width {big} need {n * k} members of width {h}; "
                         f"got {narrow.shape[0]}")
    pick = torch.randperm(narrow.shape[0], generator=generator)[:n * k]
    (w1, w2), (b1, b2) = spec.weights(narrow[pick]), spec.biases(narrow[pick])
    w1 = w1.reshape(n, k * h, -1)[:, :big]
    b1 = b1.reshape(n, k * h)[:, :big]
    w2 = w2.reshape(n, k, -1, h).permute(0, 2, 1, 3).reshape(n, -1, k * h)[..., :big] * (h / big)
    return wide.pack([w1, w2], [b1, b2.reshape(n, k, -1).mean(1)])


def width_transfer(seed: int = 0) -> dict[str, dict]:
    """Table 7.4: the unanchored flows trained on 784-10-10 networks sampling 784-32-10 networks
    (:meth:`WeightFlow.with_spec`), scored on the MNIST test set beside trained 784-32-10 networks. Every
    unguided sample at the new width has its outgoing weights scaled by the width ratio
    (:func:`mlp_widening`).

    Returns ``{row name: score}`` (:func:`wsbook.experiments.flows.probability_scores`, plus
    :func:`neuron_similarity` and, for flow rows, ``sample_seconds``): the trained zoo (``n_wide`` random
    checkpoints, drawn from ``seed``), wide networks assembled from the neurons of the 784-10-10 training
    checkpoints (:func:`assembled_networks`), :data:`NEURON_ANCHORED` at the new width (its anchor widened
    by repeating neurons, :meth:`~wsbook.weightflow.NeuronField.with_spec`), the
    assembly of ``k`` independent 784-10-10 samples of :data:`NEURON_ANCHORED` (no guidance; ``k`` the
    number of narrow widths the wide one needs) and the probability average of the same ``k`` samples (the
    packed-ensemble baselines an anchored transfer must beat, since its widened anchor repeats the narrow
    neurons), :data:`TRANSFER` without and with MNIST guidance, and :data:`UNANCHORED_GNN` without.
    """
    b = budget()
    ds, wide = data.load(ZOO), targets.zoo(WIDE_ZOO)
    theta = wide.theta[torch.randperm(len(wide), generator=torch.Generator().manual_seed(seed))[:b.n_wide]]

    def scored(theta: Tensor, **extra) -> dict:
        return {**flows.probability_scores(probs_of(wide.spec, theta, ds), ds.y_test),
                "neuron_similarity": neuron_similarity(wide.spec, theta), **extra}

    rows = {"trained 784-32-10 (zoo)": scored(theta)}
    train = split().train
    rows["assembled from 784-10-10 neurons"] = scored(assembled_networks(
        train.theta, train.spec, wide.spec, b.n_wide, generator=torch.Generator().manual_seed(seed)))
    # every field's neurons carry outgoing weights sized for the narrow width: an unguided sample at the new
    # width has them scaled by h / H to average rather than add up (guidance fits a sample's scale itself)
    widening = mlp_widening(train.spec, wide.spec)
    rescale, k = widening.rescale, widening.k
    # the anchored field at the new width (its anchor widened by repeating neurons)
    theta, seconds = sample_flow(NEURON_ANCHORED, n=b.n_wide, widths=wide.spec.widths, seed=seed)
    rows[f"{NEURON_ANCHORED}, transferred"] = scored(rescale(theta), sample_seconds=seconds)
    narrow, seconds = sample_flow(NEURON_ANCHORED, n=b.n_wide * k, seed=seed)
    rows[f"{NEURON_ANCHORED}, composed"] = scored(widening.pack(narrow, seed), sample_seconds=seconds)
    # the same k narrow samples as an ensemble: the baseline an anchored transfer has to beat
    members = probs_of(train.spec, narrow[:b.n_wide * k], ds)
    average = members.reshape(b.n_wide, k, *members.shape[1:]).mean(1)
    rows[f"{NEURON_ANCHORED}, {k}-member average"] = {**flows.probability_scores(average, ds.y_test),
                                                      "sample_seconds": seconds}
    for recipe, guided in ((TRANSFER, None), (TRANSFER, "mnist"), (UNANCHORED_GNN, None)):
        theta, seconds = sample_flow(recipe, n=b.n_wide, widths=wide.spec.widths, guided=guided, seed=seed)
        rows[f"{recipe}, transferred" + (" + guidance" if guided else "")] = scored(
            theta if guided else rescale(theta), sample_seconds=seconds)
    return rows


#: the recipes whose field samples other hidden widths without an anchor (:func:`width_transfer_verdict`)
WIDTH_AGNOSTIC = (TRANSFER, UNANCHORED_GNN)


def width_transfer_choice() -> str:
    """The flow of :func:`width_transfer_verdict`: of the table's width-agnostic recipes, the one whose seed-0
    flow samples the most accurate 784-32-10 networks on the validation split of the data
    (:func:`wide_validation_accuracy`)."""
    return max((r for r in budget().recipes if r in WIDTH_AGNOSTIC), key=wide_validation_accuracy)


def wide_validation_accuracy(recipe: str) -> float:
    """Mean accuracy on the data's validation split of the 784-32-10 networks that ``recipe``'s seed-0 flow
    samples (the draw of :func:`width_transfer`, its outgoing weights scaled by :func:`mlp_widening`)."""
    wide, spec = MLPSpec(tuple(targets.ZOOS[WIDE_ZOO].widths)), MLPSpec(tuple(targets.ZOOS[ZOO].widths))
    theta, _ = sample_flow(recipe, n=budget().n_wide, widths=wide.widths)
    return targets.evaluate(wide, mlp_widening(spec, wide).rescale(theta), data.load(ZOO), bma_k=1,
                            split="val").accuracy


def width_transfer_verdict(seeds: tuple[int, ...] = protocol.SEEDS):
    """The width-transfer verdict: the flow of :func:`width_transfer_choice`, trained on 784-10-10 networks with
    each of ``seeds`` (as :func:`verdict_seed` trains), samples 784-32-10 networks without guidance, read
    against the trained 784-32-10 zoo (one unit per run) and against the two packed-ensemble baselines built
    from ``k`` of its own narrow samples (:func:`assembled_networks` and the probability average), on the MNIST test
    set (:func:`wsbook.experiments.flows.transfer_rows`; outgoing weights of every wide sample scaled by
    ``h / H`` so that they average). Returns the DataFrame of
    :func:`wsbook.experiments.flows.cnn_width_transfer`'s columns, ``attrs`` with the flow (``chosen``)."""
    import pandas as pd

    chosen = width_transfer_choice()
    b = budget()
    wide = targets.ZOOS[WIDE_ZOO]
    out = _width_transfer_verdict(recipe_config(chosen, b), b, targets.ZOOS[ZOO], wide,
                                  targets.zoo_runs(WIDE_ZOO), tuple(int(s) for s in seeds), flows.ACCURACY_GAP)
    table = pd.DataFrame(out["rows"]).T.loc[list(flows.TRANSFER_ROWS)]
    table.attrs.update({k: v for k, v in out.items() if k != "rows"}, chosen=chosen)
    return table


@cached("flows/mnist/width_verdict", version=2)   # 2: above both packed ensembles
def _width_transfer_verdict(cfg: flows.FlowConfig, b: Budget, zoo: targets.ZooConfig, wide: targets.ZooConfig,
                            wide_runs: int, seeds: tuple[int, ...], accuracy_gap: float) -> dict:
    """:func:`width_transfer_verdict`, cached under the flow's settings, the budget, both zoos (the wider one's
    runs too) and the seeds."""
    trained = {s: flows.train_flow(ZOO, cfg, n_holdout=b.n_holdout, seed=s).flow for s in seeds}
    the_split, wide_zoo = split(), targets.zoo(WIDE_ZOO, n_runs=wide_runs)
    return flows.transfer_rows(the_split, wide_zoo, trained, b.n_wide, b.sample_steps, accuracy_gap,
                               mlp_widening(the_split.spec, wide_zoo.spec))


def mlp_widening(spec: MLPSpec, wide: MLPSpec) -> "flows.WidthChange":
    """:class:`~wsbook.experiments.flows.WidthChange` for one-hidden-layer MLPs: ``ceil(H / h)`` narrow networks
    make one wide one (:func:`assembled_networks`), and a sample at width ``H`` has its outgoing weights scaled
    by ``h / H``."""
    h, big = spec.widths[1], wide.widths[1]
    k = -(-big // h)

    def rescale(theta: Tensor) -> Tensor:
        (w1, w2), biases = wide.weights(theta), wide.biases(theta)
        return wide.pack([w1, w2 * h / big], biases)

    def pack(narrow: Tensor, seed: int) -> Tensor:
        gen = torch.Generator().manual_seed(seed)
        return assembled_networks(narrow, spec, wide, narrow.shape[0] // k, generator=gen)

    return flows.WidthChange(k, pack, rescale, {"narrow_widths": list(spec.widths), "wide_widths": list(wide.widths)})


@cached("flows/mnist/trained_on_task", version=1)
def trained_networks(task: str, widths: tuple[int, ...], n: int, steps: int, seed: int = 0,
                     theta0: Tensor | None = None, every: int | None = None) -> dict:
    """Networks trained on ``task`` with the zoo's optimiser (SGD, momentum 0.9, lr 0.1, weight decay 1e-5,
    batch 64) for ``steps`` steps from ``theta0`` (default ``N(0, 0.1^2)``), with checkpoints every ``every``
    steps: ``{"theta", "checkpoints" [K, n, D], "steps" [K], "seconds"}`` (cached).

    Args:
        task: ``"mnist"`` or ``"permuted"``.
        widths: the architecture.
        n: networks trained at once.
        steps: SGD steps.
        seed: initialisation and minibatches.
        theta0: starting networks ``[n, D]`` (e.g. flow samples) or ``None``.
        every: checkpoint spacing (``None``: only the end).
    """
    cfg = targets.ZOOS[ZOO]
    ds = task_data(task)
    spec = MLPSpec(widths)
    gen = torch.Generator().manual_seed(3000 + seed)
    if theta0 is None:
        theta0 = torch.randn(n, spec.n_params, generator=gen) * cfg.init_std
    theta0 = spec.check(theta0, "theta0").to(ds.x_train)
    start = time.perf_counter()
    res = train_population(spec, theta0.clone(), ds.x_train, ds.y_train, steps=steps, lr=cfg.lr, optimizer="sgd",
                           batch_size=cfg.batch_size, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                           checkpoint_every=every, generator=gen, progress=False)
    out = {"theta": res.theta.detach(), "seconds": time.perf_counter() - start}
    if every:
        out["checkpoints"] = torch.cat([theta0[None], res.checkpoints])
        out["steps"] = torch.tensor([0] + list(res.checkpoint_steps))
    return out


def init_curves(starts: dict[str, Tensor], task: str = "permuted") -> dict[str, dict[str, Tensor]]:
    """Test accuracy and NLL along SGD runs on ``task`` from each set of starting networks (mean over the
    set): ``{name: {"steps", "accuracy", "nll"}}`` (thesis Fig. 7.6, flow samples as initialisation)."""
    b = budget()
    ds = task_data(task)
    spec = MLPSpec(targets.ZOOS[ZOO].widths)
    out = {}
    for name, theta0 in starts.items():
        run = trained_networks(task, spec.widths, theta0.shape[0], b.init_steps, theta0=theta0, every=b.init_every)
        ck = run["checkpoints"]                                               # [K, n, D]
        K, n = ck.shape[:2]
        probs = probs_of(spec, ck.reshape(K * n, -1), ds).view(K, n, *ds.y_test.shape, -1)
        from wsbook.bayes import metrics as M

        out[name] = {"steps": run["steps"],
                     "accuracy": torch.stack([M.accuracy(p, ds.y_test).mean() for p in probs]),
                     "nll": torch.stack([M.nll(p, ds.y_test).mean() for p in probs])}
    return out


# ------------------------------------------------------------------------------------- model size
def field_size_sweep(recipe: str = "geometric_aligned_ot", y: Tensor | None = None) -> list[dict]:
    """The same recipe with GNN fields of the budget's ``field_dims`` widths, trained for the same steps:
    ``[{"dim", "field_parameters", "train_seconds", "accuracy", "nll", "bma_accuracy", ...}]``."""
    b = budget()
    ds = data.load(ZOO)
    spec = MLPSpec(targets.ZOOS[ZOO].widths)
    rows = []
    for dim in b.field_dims:
        trained = flows.train_flow(ZOO, recipe_config(recipe, b, dim), n_holdout=b.n_holdout)
        theta, _ = sample_flow(recipe, dim=dim)
        row = flows.probability_scores(probs_of(spec, theta, ds), ds.y_test)
        losses = trained.losses[-max(1, len(trained.losses) // 10):]
        rows.append(dict(dim=dim, field_parameters=trained.field_parameters, train_seconds=trained.seconds,
                         final_loss=float(losses.mean()), **row))
    return rows


# ----------------------------------------------------------------------------- accuracy along training
def snapshot_steps(steps: int, k: int = N_SNAPSHOTS) -> tuple[int, ...]:
    """At most ``k`` step counts of a run of ``steps`` steps, evenly spaced in log from a fiftieth of the run
    (at least one step) to its last step, which is always one of them (fewer than ``k`` where a short run
    has fewer distinct counts)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1 or isinstance(k, bool) \
            or not isinstance(k, int) or k < 1:
        raise ValueError(f"snapshot_steps: steps and k must be positive integers; got {steps!r}, {k!r}")
    if k == 1:
        return (steps,)
    lo = max(1.0, steps / 50)
    grid = torch.logspace(math.log10(lo), math.log10(steps), k, dtype=torch.float64).round().long()
    grid[-1] = steps
    return tuple(int(s) for s in grid.unique().tolist())


def _per_network_val_accuracy(spec: MLPSpec, theta: Tensor, ds: data.Dataset) -> Tensor:
    """Every network's accuracy on the data's validation split ``[n]`` (on the CPU)."""
    return nets.accuracy(spec, spec.check(theta, "theta"), ds.x_val, ds.y_val).cpu()


@cached("flows/mnist/accuracy_along_training", version=1)
def _accuracy_along_training(recipe: str, cfg: flows.FlowConfig, n_holdout: int, steps: tuple[int, ...], n: int,
                             sampler: dict, seed: int, train_seed: int) -> dict:
    """:func:`accuracy_along_training`, cached under the recipe's config, the split, the kept steps and the
    sampler: the training run of :func:`wsbook.experiments.flows.train_flow` (same split, seeds and
    settings) keeping copies of the EMA, each sampled from the same source points."""
    flow, fit = flows.fit_recipe(ZOO, n_holdout, 0, cfg, train_seed, snapshot_steps=steps,
                                 desc=f"flow {cfg.name}, kept along training")
    split = flows.zoo_split(ZOO, n_holdout, 0)
    ds = data.load(ZOO)
    accuracy = []
    start = time.perf_counter()
    for _, state in fit.snapshots:                  # a handful of copies, each one batched sample
        flow.ema.load_state_dict(state)
        gen = torch.Generator().manual_seed(2000 + seed)
        with torch.no_grad():
            theta = flow.sample(n, steps=sampler["steps"], method=sampler["method"], generator=gen)
        accuracy.append(_per_network_val_accuracy(split.spec, theta, ds))
    return {"steps": torch.tensor([s for s, _ in fit.snapshots]), "accuracy": torch.stack(accuracy),
            "train_seconds": fit.seconds, "sample_seconds": time.perf_counter() - start,
            "losses": fit.losses}


def accuracy_along_training(recipe: str, k: int = N_SNAPSHOTS, seed: int = 0, train_seed: int = 0) -> dict:
    """What ``recipe``'s training buys (cached): its flow trained again as :func:`sample_flow`'s
    (:func:`wsbook.experiments.flows.train_flow`, seed ``train_seed``), with copies of the sampling EMA
    kept after the :func:`snapshot_steps` of its run; each copy draws the budget's ``n_samples`` networks
    with the budget's solver from the same source points (those of :func:`sample_flow` with ``seed``: where
    the training run reproduces the cached one bit for bit, the last copy's networks are the table's),
    scored on the data's validation split (never the test split).

    Returns ``{"steps" [K], "accuracy" [K, n] (every network's validation accuracy), "train_seconds",
    "sample_seconds", "losses" [steps]}``.
    """
    b = budget()
    cfg = recipe_config(recipe, b)
    sampler = {"steps": b.sample_steps, "method": b.method}
    out = _accuracy_along_training(recipe, cfg, b.n_holdout, snapshot_steps(cfg.steps, k), b.n_samples, sampler,
                                   seed, train_seed)
    return {**out, "train_seconds": float(out["train_seconds"]), "sample_seconds": float(out["sample_seconds"])}


def zoo_validation_accuracy() -> tuple[float, float]:
    """Mean and standard deviation of the accuracy on the data's validation split of every checkpoint of
    the training runs (what the flows learn to generate): the reference of :func:`accuracy_along_training`."""
    train = split().train
    acc = _per_network_val_accuracy(train.spec, train.theta, data.load(ZOO)).double()
    return float(acc.mean()), float(acc.std()) if acc.numel() > 1 else 0.0


__all__ = ["RECIPES", "TRANSFER", "UNANCHORED_GNN", "NEURON_ANCHORED", "BMA_SIZES", "describe", "Budget", "budget",
           "split", "permuted_mnist", "task_data", "recipe_config", "make_flow", "sample_flow", "probs_of",
           "bma_curve", "neuron_similarity", "assembled_networks", "width_transfer", "WIDTH_AGNOSTIC",
           "width_transfer_choice", "wide_validation_accuracy", "width_transfer_verdict", "mlp_widening",
           "trained_networks",
           "init_curves", "field_size_sweep", "N_SNAPSHOTS", "snapshot_steps", "accuracy_along_training",
           "zoo_validation_accuracy"]
