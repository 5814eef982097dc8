"""Training helpers for the weight-space experiments of chapter 6.

* :func:`digits_zoo`: a zoo of digit classifiers with varied widths, seeds, learning rates and training
  lengths, all embedded in one widest spec (a narrow network is the wide one with zero neurons), cached.
* :func:`fit_predictor` / :func:`predict`: regress a per-network scalar (test accuracy) from weights with
  any model over populations, optionally with random hidden-permutation augmentation.
* :func:`kendall_tau`, :func:`r2_score`: the metrics of generalization prediction (Unterthiner et al., 2020).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from wsbook import config, data
from wsbook.cache import cached
from wsbook.graphs.neural_graph import NeuralGraph
from wsbook.nets import MLPSpec, accuracy, train_population
from wsbook.symmetry import permute, random_permutation


def embed_population(small: MLPSpec, theta: Tensor, big: MLPSpec) -> Tensor:
    """Place networks of ``small`` into ``big`` (same input/output, hidden layers at least as wide) by
    zero padding: the extra neurons have zero in- and out-weights, so the function is unchanged (ReLU/tanh)."""
    theta = small.check(theta)
    if len(small.widths) != len(big.widths) or small.widths[0] != big.widths[0] or small.widths[-1] != big.widths[-1] \
            or any(s > b for s, b in zip(small.widths, big.widths)) or small.activation != big.activation:
        raise ValueError(f"cannot embed {small} into {big}: need equal depth, input, output and activation")
    B = theta.shape[0]
    ws, bs = [], []
    for w, b, (o, i) in zip(small.weights(theta), small.biases(theta), big.layer_shapes):
        W = theta.new_zeros(B, o, i)
        W[:, :w.shape[1], :w.shape[2]] = w
        bias = theta.new_zeros(B, o)
        bias[:, :b.shape[1]] = b
        ws.append(W)
        bs.append(bias)
    return big.pack(ws, bs)


def pooled_digits(x: Tensor, pool: int = 1) -> Tensor:
    """Average-pool flattened 8x8 digit images ``[N, 64]`` by ``pool`` -> ``[N, (8 / pool)^2]``."""
    if pool not in (1, 2, 4, 8) or x.dim() != 2 or x.shape[1] != 64:
        raise ValueError(f"need x [N, 64] and pool in (1, 2, 4, 8); got {tuple(x.shape)} and {pool}")
    if pool == 1:
        return x
    return torch.nn.functional.avg_pool2d(x.view(-1, 1, 8, 8), pool).flatten(1)


@cached(version="2")
def digits_zoo(hidden_widths: Sequence[int] = (4, 8, 16), lrs: Sequence[float] = (3e-4, 1e-3, 3e-3),
               n_seeds: int = 4, steps: int = 400, n_checkpoints: int = 4, depth: int = 2,
               pool: int = 1, seed: int = 0) -> dict:
    """A zoo of ReLU digit classifiers ``(64 / pool^2) -> w x depth -> 10`` for every width, learning rate and
    seed, saved at ``n_checkpoints`` evenly spaced training lengths; all embedded into the widest spec.
    ``pool`` > 1 average-pools the 8x8 images (``pool=2``: 4x4 images, 16 inputs, a 4x smaller first layer).

    Returns ``theta [M, D]``, ``test_accuracy [M]``, and per network ``width``, ``lr``, ``step``, ``run``
    and ``seed`` (runs are seeds x widths x lrs; checkpoints of one run share its id).
    """
    ds = data.load("digits")
    x_train, x_test = pooled_digits(ds.x_train, pool), pooled_digits(ds.x_test, pool)
    n_in = x_train.shape[1]
    gen = torch.Generator().manual_seed(seed)
    big = MLPSpec((n_in, *[max(hidden_widths)] * depth, 10))
    thetas, meta = [], {"width": [], "lr": [], "step": [], "run": [], "seed": []}
    run = 0
    for width in hidden_widths:
        spec = MLPSpec((n_in, *[width] * depth, 10))
        for lr in lrs:
            theta0 = spec.init(n_seeds, generator=gen)
            res = train_population(spec, theta0, x_train, ds.y_train, steps=steps, lr=lr, batch_size=32,
                                   checkpoint_every=steps // n_checkpoints, generator=gen, desc="zoo")
            ckpts = res.checkpoints.reshape(-1, spec.n_params)                      # [K*n_seeds, D]
            thetas.append(embed_population(spec, ckpts, big))
            K = res.checkpoints.shape[0]
            meta["width"].append(torch.full((K * n_seeds,), width))
            meta["lr"].append(torch.full((K * n_seeds,), lr))
            meta["step"].append(torch.tensor(res.checkpoint_steps).repeat_interleave(n_seeds))
            meta["run"].append(run + torch.arange(n_seeds).repeat(K))
            meta["seed"].append(torch.arange(n_seeds).repeat(K))
            run += n_seeds
    theta = torch.cat(thetas)
    acc = accuracy(big, theta, x_test, ds.y_test)
    return {"theta": theta, "test_accuracy": acc, **{k: torch.cat(v) for k, v in meta.items()},
            "widths": list(big.widths)}


def split_by_seed(seed: Tensor, n_test_seeds: int = 1) -> tuple[Tensor, Tensor]:
    """Indices of train / held-out networks: the runs of the last ``n_test_seeds`` seeds of every
    (width, learning rate) configuration are held out, with all their checkpoints, so held-out networks
    come from unseen training runs while every configuration appears on both sides."""
    n_seeds = int(seed.max()) + 1
    if not 1 <= n_test_seeds < n_seeds:
        raise ValueError(f"n_test_seeds must be in [1, {n_seeds - 1}] for a zoo of {n_seeds} seeds; got {n_test_seeds}")
    is_test = seed >= n_seeds - n_test_seeds
    return (~is_test).nonzero().flatten(), is_test.nonzero().flatten()


def fit_predictor(model: nn.Module, theta: Tensor, y: Tensor, *, epochs: int = 100, lr: float = 1e-3,
                  batch_size: int = 32, weight_decay: float = 0.0, augment: NeuralGraph | None = None,
                  seed: int = 0) -> Tensor:
    """Fit ``model(theta) -> y`` (one scalar per network) with Adam on the standardized MSE.

    With ``augment`` (the zoo's :class:`NeuralGraph`) every minibatch is replaced by randomly
    hidden-permuted copies, the data augmentation of Schürholt et al. (2021). Returns per-epoch losses.
    """
    if theta.dim() != 2 or y.shape != (theta.shape[0],):
        raise ValueError(f"theta must be [M, D] and y [M]; got {tuple(theta.shape)} and {tuple(y.shape)}")
    gen = torch.Generator().manual_seed(seed)
    if hasattr(model, "set_normalization"):
        model.set_normalization(theta)
    mean, std = y.mean(), y.std().clamp_min(1e-8)
    model.register_buffer("y_mean", mean.detach().clone(), persistent=False)
    model.register_buffer("y_std", std.detach().clone(), persistent=False)
    target = (y - mean) / std
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    model.train()

    def batch_loss(idx: Tensor) -> Tensor:
        xb = theta[idx]
        if augment is not None:
            xb = permute(augment.spec, xb, random_permutation(augment.spec, len(idx), gen, device=xb.device))
        return ((model(xb).squeeze(-1) - target[idx]) ** 2).mean()

    history = fit_minibatches(opt, batch_loss, theta.shape[0], epochs=epochs, batch_size=batch_size,
                              generator=gen, device=theta.device, what="predictor")
    model.eval()
    return history


def fit_minibatches(opt: torch.optim.Optimizer, batch_loss: Callable[[Tensor], Tensor], n: int, *, epochs: int,
                    batch_size: int, generator: torch.Generator, device: torch.device, what: str = "model") -> Tensor:
    """The shared training loop: ``epochs`` shuffled passes over ``n`` items in minibatches of indices,
    minimizing ``batch_loss(idx)`` with ``opt`` under a cosine learning-rate decay. Raises on a
    non-finite loss; returns the per-epoch mean loss ``[epochs]``."""
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    history = torch.empty(epochs)
    for epoch in range(epochs):
        order = torch.randperm(n, generator=generator).to(device)
        total = 0.0
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            loss = batch_loss(idx)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{what} loss became {loss.item()} at epoch {epoch}; lower lr")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        sched.step()
        history[epoch] = total / n
    return history


@torch.no_grad()
def predict(model: nn.Module, theta: Tensor, batch_size: int = 128) -> Tensor:
    """Predictions of a model trained by :func:`fit_predictor`, in the target's units ``[M]``."""
    model.eval()
    out = torch.cat([model(theta[s:s + batch_size]).squeeze(-1) for s in range(0, theta.shape[0], batch_size)])
    return out * model.y_std + model.y_mean


def kendall_tau(pred: Tensor, target: Tensor) -> float:
    """Kendall's rank correlation tau-b between predictions and targets (scipy)."""
    from scipy.stats import kendalltau

    return float(kendalltau(pred.detach().cpu().numpy(), target.detach().cpu().numpy()).statistic)


def r2_score(pred: Tensor, target: Tensor) -> float:
    """Coefficient of determination ``1 - sum (y - yhat)^2 / sum (y - ybar)^2``."""
    ss_res = ((target - pred) ** 2).sum()
    ss_tot = ((target - target.mean()) ** 2).sum()
    return float(1 - ss_res / ss_tot)


def generalization_benchmark(zoo: dict, models: dict[str, Callable[[], nn.Module]], *, epochs: int,
                             lr: float | dict[str, float] = 1e-3, augmented: Sequence[str] = (), seed: int = 0,
                             n_test_seeds: int = 1) -> dict:
    """Train each model of ``models`` (name -> constructor) to predict test accuracy from weights on the
    zoo's training runs and score it on held-out runs. Returns ``metrics`` (name -> Kendall tau, R^2,
    parameter count, training seconds), ``predictions`` (name -> ``[M_test]``), ``target`` and ``test_index``.
    ``lr`` is one learning rate or one per model name; models named in ``augmented`` see randomly
    hidden-permuted networks in every minibatch."""
    import time

    from wsbook.graphs.models import count_parameters

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
