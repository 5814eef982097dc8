"""Training helpers for models over weights (chapter 6).

* :func:`embed_population`: place narrow networks into a wider spec by zero padding (same functions).
* :func:`fit_predictor` / :func:`predict`: regress a per-network scalar (test accuracy) from weights with
  any model over populations, optionally with random hidden-permutation augmentation.
* :func:`fit_minibatches`: the shared minibatch training loop.
* :func:`kendall_tau`, :func:`r2_score`: the metrics of generalization prediction (Unterthiner et al., 2020).

The book's zoos and the generalization benchmark live in :mod:`wsbook.experiments`.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn

from wsbook.graphs.neural_graph import NeuralGraph
from wsbook.loop import Minibatches, descend
from wsbook.nets import MLPSpec
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
    """``epochs`` shuffled passes over ``n`` items in minibatches of indices, minimizing ``batch_loss(idx)``
    with ``opt`` under a per-epoch cosine learning-rate decay, on the library's one loop
    (:func:`wsbook.loop.descend`: it raises on a non-finite loss). Returns the per-epoch mean loss ``[epochs]``."""
    batches = Minibatches(n, batch_size, generator=generator, device=device, drop_last=False)
    every = torch.arange(n, device=device)
    sizes = torch.tensor([min(batch_size, n - k * batch_size) for k in range(batches.per_epoch)], dtype=torch.float)
    cosine = lambda step: 0.5 * (1 + math.cos(math.pi * batches.epoch(step) / epochs))  # noqa: E731
    run = descend(lambda step: batch_loss(every if batches.full else batches(step)), opt, epochs * batches.per_epoch,
                  schedule=cosine, desc=what)
    if batches.full:
        return run.losses.detach().float().cpu()
    return (run.losses.detach().float().cpu().view(epochs, -1) * sizes).sum(1) / n


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
