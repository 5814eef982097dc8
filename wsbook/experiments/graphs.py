"""Chapter 6's models over weights, trained and cached: the generalization-prediction benchmark (models
predict a network's test accuracy from its weights, trained on some runs of a zoo,
:func:`wsbook.experiments.zoos.digits_zoo`, and scored on held-out runs; Unterthiner et al., 2020), and
:func:`trained_model`, the learned aligner and the weight autoencoders fitted once and read from the cache."""
from __future__ import annotations

import time
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from wsbook import config
from wsbook.cache import cached
from wsbook.graphs.align import LearnedAligner, fit_aligner
from wsbook.graphs.inr import WeightAutoencoder, fit_autoencoder
from wsbook.graphs.models import count_parameters
from wsbook.graphs.neural_graph import NeuralGraph
from wsbook.graphs.train import fit_predictor, kendall_tau, predict, r2_score
from wsbook.nets import MLPSpec


def split_by_seed(seed: Tensor, n_test_seeds: int = 1) -> tuple[Tensor, Tensor]:
    """Indices of train / held-out networks: the runs of the last ``n_test_seeds`` seeds of every
    (width, learning rate) configuration are held out, with all their checkpoints, so held-out networks
    come from unseen training runs while every configuration appears on both sides.

    Args:
        seed: the zoo's per-network seed index ``[M]`` (``digits_zoo(...)["seed"]``).
        n_test_seeds: how many of the seeds are held out.
    """
    n_seeds = int(seed.max()) + 1
    if not 1 <= n_test_seeds < n_seeds:
        raise ValueError(f"n_test_seeds must be in [1, {n_seeds - 1}] for a zoo of {n_seeds} seeds; got {n_test_seeds}")
    is_test = seed >= n_seeds - n_test_seeds
    return (~is_test).nonzero().flatten(), is_test.nonzero().flatten()


def generalization_benchmark(zoo: dict, models: dict[str, Callable[[], nn.Module]], *, epochs: int,
                             lr: float | dict[str, float] = 1e-3, augmented: Sequence[str] = (), seed: int = 0,
                             n_test_seeds: int = 1) -> dict:
    """Train each model of ``models`` to predict test accuracy from weights on the zoo's training runs and
    score it on held-out runs.

    See chapter 6, "Experiment 1: predicting generalization from weights".

    Args:
        zoo: a zoo of :func:`wsbook.experiments.zoos.digits_zoo` (``theta``, ``test_accuracy``, ``seed``,
            ``widths``).
        models: name -> constructor of a model ``[M, D] -> [M, 1]``.
        epochs: training epochs of every model (:func:`wsbook.graphs.train.fit_predictor`).
        lr: one learning rate, or one per model name.
        augmented: names of models that see randomly hidden-permuted networks in every minibatch.
        seed: seeds initialisation, minibatches and augmentation.
        n_test_seeds: seeds of every configuration held out (:func:`split_by_seed`).

    Returns:
        ``metrics`` (name -> Kendall tau, R^2, parameter count, training seconds), ``predictions``
        (name -> ``[M_test]``), ``target`` and ``test_index``.
    """
    theta, acc = zoo["theta"], zoo["test_accuracy"]
    train_idx, test_idx = split_by_seed(zoo["seed"], n_test_seeds)
    graph = NeuralGraph(MLPSpec(tuple(zoo["widths"])))
    results, predictions = {}, {}
    for name, make in models.items():
        torch.manual_seed(seed)
        model = make().to(theta.device)
        start = time.perf_counter()
        fit_predictor(model, theta[train_idx], acc[train_idx], epochs=epochs,
                      lr=lr[name] if isinstance(lr, dict) else lr,
                      augment=graph if name in augmented else None, seed=seed)
        seconds = time.perf_counter() - start
        pred = predict(model, theta[test_idx])
        results[name] = {"kendall_tau": kendall_tau(pred, acc[test_idx]), "r2": r2_score(pred, acc[test_idx]),
                         "parameters": count_parameters(model), "train_seconds": seconds}
        predictions[name] = pred
    return {"metrics": results, "predictions": predictions, "target": acc[test_idx], "test_index": test_idx}


#: The models :func:`trained_model` fits, by kind: (constructor taking the spec first, its training function).
TRAINABLE = {
    "aligner": (LearnedAligner, fit_aligner),
    "weight_autoencoder": (WeightAutoencoder, fit_autoencoder),
}


@cached("models/trained")
def _fit_state(kind: str, spec, build: dict, data: list, fit: dict, init_seed: int) -> dict:
    model = _build(kind, spec, build, init_seed)
    start = time.perf_counter()
    history = TRAINABLE[kind][1](model, *data, **fit)
    return {"state": {k: v.detach() for k, v in model.state_dict().items()}, "history": history,
            "seconds": time.perf_counter() - start}


def _build(kind: str, spec, build: dict, init_seed: int) -> nn.Module:
    with config.seeded(init_seed):
        return TRAINABLE[kind][0](spec, **build)


def trained_model(kind: str, spec, *data: Tensor, build: dict | None = None, init_seed: int = 0,
                  **fit) -> tuple[nn.Module, Tensor, float]:
    """A model of :data:`TRAINABLE` built from ``spec`` and ``build`` (its initial weights drawn under
    ``init_seed``), trained by its training function on ``data`` with the keyword arguments ``fit``, and
    cached: the second call with the same arguments reads the trained weights instead of training.
    Returns ``(model, history, seconds)``: the per-step (or per-epoch) losses of the training function
    and the wall-clock seconds the training took when it ran.

    ``trained_model("aligner", spec, zoo, x, y, build=dict(dim=16), steps=300)`` is
    ``fit_aligner(LearnedAligner(spec, dim=16), zoo, x, y, steps=300)``, once.
    """
    if kind not in TRAINABLE:
        raise ValueError(f"unknown model kind {kind!r}; trainable: {', '.join(TRAINABLE)}")
    build = dict(build or {})
    out = _fit_state(kind, spec, build, list(data), fit, init_seed)
    model = _build(kind, spec, build, init_seed)
    model.load_state_dict(out["state"])
    return model, out["history"], float(out["seconds"])
