"""The book's trained populations ("zoos"), each cached under an explicit artifact name: independently
trained classifiers (chapter 5), mean-field posteriors (chapter 5), SIREN pairs of a 2-D shape (chapter 5),
a digit-classifier zoo over widths, learning rates, seeds and checkpoints (chapter 6), CNN digit classifiers
with their checkpoints (chapter 6) and a zoo of SIRENs of digit images (chapter 6). Each returns plain tensors
and numbers.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from wsbook import config, data
from wsbook.bayes.vi import fit_mean_field
from wsbook.cache import cached
from wsbook.graphs.inr import pixel_grid, render
from wsbook.graphs.train import embed_population
from wsbook.nets import CNNSpec, MLPSpec, accuracy, train_population


@cached("zoo/trained", version=1)
def train_zoo(spec: MLPSpec, dataset: str, n: int, *, steps: int, lr: float = 3e-3, batch_size: int = 64,
              weight_decay: float = 0.0, seed: int = 0) -> Tensor:
    """``n`` networks trained independently (different initialisations and minibatch orders) on a dataset
    of :mod:`wsbook.data`, all in one population: ``[n, D]`` (cached).

    See chapter 5, "Experiment 1: aligning a zoo of digit classifiers".

    Args:
        spec: the architecture.
        dataset: a name of :mod:`wsbook.data` (classification: cross-entropy, regression: MSE).
        n: number of networks.
        steps: Adam steps of every network.
        lr: learning rate.
        batch_size: minibatch size (each network draws its own minibatches).
        weight_decay: decoupled weight decay.
        seed: seeds the initialisations and the minibatch orders.
    """
    ds = data.load(dataset)
    gen = torch.Generator().manual_seed(seed)
    theta0 = spec.init(n, generator=gen)
    return train_population(spec, theta0, ds.x_train, ds.y_train, steps=steps, lr=lr, batch_size=batch_size,
                            weight_decay=weight_decay, generator=gen,
                            task="classification" if ds.n_classes else "regression").theta


def digit_images(x: Tensor) -> Tensor:
    """Flattened 8x8 digit images ``[N, 64]`` (:func:`wsbook.data.load` ``("digits")``) as one-channel images
    ``[N, 1, 8, 8]``, the input of a :class:`wsbook.nets.CNNSpec`."""
    if x.dim() != 2 or x.shape[1] != 64:
        raise ValueError(f"digit_images expects flattened 8x8 digits [N, 64]; got {tuple(x.shape)}")
    return x.reshape(-1, 1, 8, 8)


@cached("zoo/cnn_digits", version=1)
def train_cnn_zoo(spec: CNNSpec, n: int, *, steps: int, lr: float = 3e-3, batch_size: int = 64,
                  seed: int = 0) -> Tensor:
    """``n`` CNN classifiers of the 8x8 digits trained independently (different initialisations and
    minibatch orders) with Adam, all in one population: ``[n, D]`` (cached).

    See chapter 5, "Convolutional classifiers" (in "Experiment 1").

    Args:
        spec: a CNN with one input channel and 10 classes.
        n: number of networks.
        steps: Adam steps of every network.
        lr: learning rate.
        batch_size: minibatch size (each network draws its own minibatches).
        seed: seeds the initialisations and the minibatch orders.
    """
    if not isinstance(spec, CNNSpec) or spec.in_channels != 1 or spec.n_classes != 10:
        raise ValueError(f"train_cnn_zoo needs a CNNSpec with 1 input channel and 10 classes; got {spec}")
    ds = data.load("digits")
    gen = torch.Generator().manual_seed(seed)
    theta0 = spec.init(n, generator=gen)
    return train_population(spec, theta0, digit_images(ds.x_train), ds.y_train, steps=steps, lr=lr,
                            batch_size=batch_size, generator=gen).theta


@cached("zoo/cnn_digit_checkpoints", version=1)
def cnn_checkpoint_zoo(spec: CNNSpec, n_runs: int, *, steps: int, n_checkpoints: int = 4,
                       lrs: Sequence[float] = (1e-3, 3e-3), batch_size: int = 64, seed: int = 0) -> dict:
    """A heterogeneous zoo of CNN digit classifiers: ``n_runs`` independent runs per learning rate, each saved
    at ``n_checkpoints`` evenly spaced training lengths, so accuracies range from barely trained to
    converged (cached).

    See chapter 6, "Convolutional classifiers" (in "Experiment 3").

    Args:
        spec: a CNN with one input channel and 10 classes.
        n_runs: independent runs per learning rate.
        steps: Adam steps of every run.
        n_checkpoints: evenly spaced checkpoints kept per run (the last one at ``steps``).
        lrs: the learning rates.
        batch_size: minibatch size (each network draws its own minibatches).
        seed: seeds the initialisations and the minibatch orders.

    Returns:
        ``theta [M, D]``, ``test_accuracy [M]`` and per network ``lr``, ``step``, ``run`` and ``seed`` (the
        run's index within its learning rate; checkpoints of one run share ``run`` and ``seed``).
    """
    if not isinstance(spec, CNNSpec) or spec.in_channels != 1 or spec.n_classes != 10:
        raise ValueError(f"cnn_checkpoint_zoo needs a CNNSpec with 1 input channel and 10 classes; got {spec}")
    if not 1 <= n_checkpoints <= steps:
        raise ValueError(f"n_checkpoints must be in [1, steps={steps}]; got {n_checkpoints}")
    ds = data.load("digits")
    x, x_test = digit_images(ds.x_train), digit_images(ds.x_test)
    gen = torch.Generator().manual_seed(seed)
    thetas, meta = [], {"lr": [], "step": [], "run": [], "seed": []}
    for k, lr in enumerate(lrs):
        res = train_population(spec, spec.init(n_runs, generator=gen), x, ds.y_train, steps=steps, lr=lr,
                               batch_size=batch_size, checkpoint_every=steps // n_checkpoints, generator=gen,
                               desc="zoo")
        ckpts = res.checkpoints[-n_checkpoints:]                            # [K, n_runs, D]
        K = ckpts.shape[0]
        thetas.append(ckpts.reshape(-1, spec.n_params))
        meta["lr"].append(torch.full((K * n_runs,), lr))
        meta["step"].append(torch.tensor(res.checkpoint_steps[-K:]).repeat_interleave(n_runs))
        meta["run"].append(k * n_runs + torch.arange(n_runs).repeat(K))
        meta["seed"].append(torch.arange(n_runs).repeat(K))
    theta = torch.cat(thetas)
    return {"theta": theta, "test_accuracy": accuracy(spec, theta, x_test, ds.y_test),
            **{k: torch.cat(v) for k, v in meta.items()}}


@cached("zoo/variational", version=1)
def fit_variational_zoo(spec: MLPSpec, dataset: str, n: int, *, steps: int, lr: float = 1e-2,
                        prior_std: float = 1.0, batch_size: int = 128, temperature: float = 1.0,
                        seed: int = 0) -> dict[str, Tensor]:
    """``n`` independent mean-field Gaussian posteriors (Bayes by backprop via :mod:`wsbook.bayes.vi`),
    cached: ``{"mean": [n, D], "std": [n, D]}``.

    See chapter 5, "Experiment 3: variational posteriors".

    Args:
        spec: the architecture.
        dataset: a classification data set of :mod:`wsbook.data`.
        n: number of posteriors.
        steps: optimisation steps.
        lr: learning rate.
        prior_std: standard deviation of the Gaussian weight prior.
        batch_size: minibatch size.
        temperature: ``T`` of the tempered posterior ``p^(1/T)`` (``T < 1``: cold).
        seed: seeds initialisation, minibatches and reparameterisation noise.
    """
    ds = data.load(dataset)
    q = fit_mean_field(spec, ds.x_train, ds.y_train, n_members=n, steps=steps, lr=lr, prior_std=prior_std,
                       batch_size=batch_size, generator=torch.Generator().manual_seed(seed), init_std=1e-3,
                       temperature=temperature)
    return {"mean": q.mean, "std": q.std}


def shape_sdf(n_grid: int = 32, shape: str = "star") -> tuple[Tensor, Tensor]:
    """A 2-D shape as a signed distance field sampled on an ``n_grid x n_grid`` grid of ``[-1, 1]^2``:
    ``x [n^2, 2]``, ``y [n^2, 1]`` (negative inside). ``star``: a five-pointed star (polar boundary
    ``r(phi) = 0.5 + 0.15 cos 5 phi``, radial distance approximation); ``circle``: radius 0.5."""
    g = torch.linspace(-1, 1, n_grid)
    xx, yy = torch.meshgrid(g, g, indexing="xy")
    x = torch.stack([xx.flatten(), yy.flatten()], 1)
    r, phi = x.norm(dim=1), torch.atan2(x[:, 1], x[:, 0])
    if shape == "star":
        boundary = 0.5 + 0.15 * torch.cos(5 * phi)
    elif shape == "circle":
        boundary = torch.full_like(r, 0.5)
    else:
        raise ValueError(f"shape must be 'star' or 'circle'; got {shape!r}")
    return x.to(config.device()), (r - boundary).unsqueeze(1).to(config.device())


@cached("zoo/inr_pairs", version=1)
def fit_inr_pairs(spec: MLPSpec, n_pairs: int, *, n_grid: int = 32, steps: int = 1000, lr: float = 1e-4,
                  batch_size: int = 256, seed: int = 0) -> dict[str, Tensor]:
    """SIRENs fitted to :func:`shape_sdf` (De Luigi et al., 2023's INR setting, in 2-D): ``a`` and ``same``
    share an initialisation but see different minibatch orders; ``diff`` starts from its own initialisation.
    Returns ``{"a", "same", "diff"}``, each ``[n_pairs, D]``.

    See chapter 5, "Experiment 4: implicit neural representations".

    Args:
        spec: a SIREN architecture ``2 -> ... -> 1`` (``activation="sine"``).
        n_pairs: number of networks in each of the three groups.
        n_grid: side of the sampling grid of the shape.
        steps: Adam steps.
        lr: learning rate.
        batch_size: minibatch of grid points.
        seed: seeds the initialisations and minibatch orders.
    """
    x, y = shape_sdf(n_grid)
    gen = torch.Generator().manual_seed(seed)
    init_a, init_d = spec.init(n_pairs, "siren", generator=gen), spec.init(n_pairs, "siren", generator=gen)
    theta0 = torch.cat([init_a, init_a, init_d])
    fit = train_population(spec, theta0, x, y, steps=steps, lr=lr, task="regression", batch_size=batch_size, generator=gen)
    a, same, diff = fit.theta.split(n_pairs)
    return {"a": a, "same": same, "diff": diff}


def pooled_digits(x: Tensor, pool: int = 1) -> Tensor:
    """Average-pool flattened 8x8 digit images ``[N, 64]`` by ``pool`` -> ``[N, (8 / pool)^2]``."""
    if pool not in (1, 2, 4, 8) or x.dim() != 2 or x.shape[1] != 64:
        raise ValueError(f"need x [N, 64] and pool in (1, 2, 4, 8); got {tuple(x.shape)} and {pool}")
    if pool == 1:
        return x
    return torch.nn.functional.avg_pool2d(x.view(-1, 1, 8, 8), pool).flatten(1)


@cached("zoo/digits", version=2)
def digits_zoo(hidden_widths: Sequence[int] = (4, 8, 16), lrs: Sequence[float] = (3e-4, 1e-3, 3e-3),
               n_seeds: int = 4, steps: int = 400, n_checkpoints: int = 4, depth: int = 2,
               pool: int = 1, seed: int = 0) -> dict:
    """A zoo of ReLU digit classifiers ``(64 / pool^2) -> w x depth -> 10`` for every width, learning rate and
    seed, saved at ``n_checkpoints`` evenly spaced training lengths; all embedded into the widest spec
    (:func:`wsbook.graphs.train.embed_population`: a narrow network is the wide one with zero neurons).

    See chapter 6, "Experiment 1: predicting generalization from weights" and "Experiment 2: learned
    alignment".

    Args:
        hidden_widths: the hidden widths ``w`` of the runs.
        lrs: Adam learning rates of the runs.
        n_seeds: runs per (width, learning rate).
        steps: training steps of every run.
        n_checkpoints: evenly spaced checkpoints kept per run.
        depth: number of hidden layers.
        pool: > 1 average-pools the 8x8 images (``pool=2``: 4x4 images, 16 inputs, a 4x smaller first layer).
        seed: seeds initialisations and minibatch orders.

    Returns:
        ``theta [M, D]``, ``test_accuracy [M]``, and per network ``width``, ``lr``, ``step``, ``run`` and
        ``seed`` (runs are seeds x widths x lrs; checkpoints of one run share its id), and ``widths`` of the
        widest spec.
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


@cached("zoo/digit_inrs", version=1)
def digit_inr_zoo(n_images: int = 256, hidden: int = 16, depth: int = 2, frequency: float = 10.0,
                  steps: int = 500, lr: float = 1e-3, shared_init: bool = False, seed: int = 0) -> dict:
    """Fit one SIREN ``2 -> hidden x depth -> 1`` (Sitzmann et al., 2020) to each of the first
    ``n_images`` digits of the training split (pixels scaled to [0, 1]), all at once with Adam.

    See chapter 6, "Experiment 3: canonicalization by an autoencoder".

    Args:
        n_images: number of images (one SIREN each).
        hidden: hidden width.
        depth: number of hidden layers.
        frequency: the SIREN's first-layer frequency ``omega_0``.
        steps: full-batch Adam steps.
        lr: learning rate.
        shared_init: every SIREN starts from the same random initialisation (as in many INR datasets);
            otherwise each has its own.
        seed: seeds the initialisation.

    Returns:
        ``theta [B, D]``, ``images [B, 64]``, ``labels [B]``, ``mse [B]`` and ``widths`` / ``frequency``.
    """
    ds = data.load("digits")
    x = ds.x_train[:n_images]
    if x.shape[0] < n_images:
        raise ValueError(f"digits has only {x.shape[0]} training images; asked for {n_images}")
    images = (x - ds.x_train.min()) / (ds.x_train.max() - ds.x_train.min())
    spec = MLPSpec((2, *[hidden] * depth, 1), activation="sine", frequency=frequency)
    coords = pixel_grid(8, x.device)
    gen = torch.Generator().manual_seed(seed)
    theta = spec.init(1 if shared_init else n_images, "siren", generator=gen, device=x.device)
    theta = theta.expand(n_images, -1).clone().requires_grad_(True)
    opt = torch.optim.Adam([theta], lr=lr)
    for _ in range(steps):
        loss = ((render(spec, theta, coords) - images) ** 2).mean(1)
        opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        opt.step()
    theta = theta.detach()
    mse = ((render(spec, theta, coords) - images) ** 2).mean(1)
    if not torch.isfinite(mse).all():
        raise FloatingPointError("SIREN fitting diverged; lower lr")
    return {"theta": theta, "images": images, "labels": ds.y_train[:n_images], "mse": mse,
            "widths": list(spec.widths), "frequency": frequency}
