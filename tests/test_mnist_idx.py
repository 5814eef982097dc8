"""The full-MNIST loader reads the standard IDX files (plain or gzip) from a local directory; here a few
images the test writes itself."""
import dataclasses
import gzip
import struct

import numpy as np
import pytest
import torch

from wsbook import data


def _write_idx(path, array: np.ndarray, compress: bool) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    blob = header + array.astype(np.uint8).tobytes()
    if compress:
        with gzip.open(f"{path}.gz", "wb") as fh:
            fh.write(blob)
    else:
        path.write_bytes(blob)


@pytest.fixture
def idx_dir(tmp_path):
    rng = np.random.default_rng(0)
    train_x, test_x = rng.integers(0, 256, (12, 28, 28)), rng.integers(0, 256, (5, 28, 28))
    train_y, test_y = rng.integers(0, 10, 12), rng.integers(0, 10, 5)
    _write_idx(tmp_path / "train-images-idx3-ubyte", train_x, compress=True)      # gzip and plain mixed
    _write_idx(tmp_path / "train-labels-idx1-ubyte", train_y, compress=False)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte", test_x, compress=False)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte", test_y, compress=True)
    return tmp_path, train_x, train_y, test_x, test_y


def test_reads_idx_files_into_standardized_splits(idx_dir, monkeypatch):
    root, train_x, train_y, test_x, test_y = idx_dir
    assert np.array_equal(data.read_idx(root / "train-images-idx3-ubyte.gz"), train_x)
    monkeypatch.setenv("WSBOOK_MNIST_DIR", str(root))
    ds = data.mnist(n_val=3, device="cpu")
    assert (ds.x_train.shape, ds.x_val.shape, ds.x_test.shape) == ((9, 784), (3, 784), (5, 784))
    assert torch.equal(ds.y_train, torch.as_tensor(train_y[:9])) and torch.equal(ds.y_val, torch.as_tensor(train_y[9:]))
    assert torch.equal(ds.y_test, torch.as_tensor(test_y))
    mean, std = train_x[:9].mean(), train_x[:9].std()
    torch.testing.assert_close(ds.x_test[2], torch.as_tensor((test_x[2].reshape(-1) - mean) / std, dtype=torch.float32))
    assert abs(float(ds.x_train.mean())) < 1e-5 and ds.n_classes == 10


def test_missing_directory_or_file_or_bad_header_is_a_clear_error(idx_dir, monkeypatch, tmp_path):
    root = idx_dir[0]
    monkeypatch.delenv("WSBOOK_MNIST_DIR", raising=False)
    with pytest.raises(ValueError, match="WSBOOK_MNIST_DIR"):
        data.mnist()
    (root / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte"):
        data.mnist(root)
    bad = tmp_path / "bad"
    bad.write_bytes(bytes([0, 0, 0x0D, 1, 0, 0, 0, 1, 0, 0, 0, 0]))             # float IDX: not images
    with pytest.raises(ValueError, match="not an unsigned-byte IDX"):
        data.read_idx(bad)


def _learnable(rng, n: int):
    """``n`` noisy 28x28 images whose label ``k`` lights rows ``2k`` and ``2k + 1``: a linear model learns them."""
    y = rng.integers(0, 10, n)
    x = rng.integers(0, 120, (n, 28, 28))
    for k in range(10):
        x[y == k, 2 * k:2 * k + 2, :] = 255
    return x, y


@pytest.fixture
def mnist_dir(tmp_path, monkeypatch):
    """A stand-in for the full MNIST (1,200 training and 100 test images) in ``WSBOOK_MNIST_DIR``."""
    rng = np.random.default_rng(1)
    (train_x, train_y), (test_x, test_y) = _learnable(rng, 1200), _learnable(rng, 100)
    for name, array in (("train-images-idx3-ubyte", train_x), ("train-labels-idx1-ubyte", train_y),
                        ("t10k-images-idx3-ubyte", test_x), ("t10k-labels-idx1-ubyte", test_y)):
        _write_idx(tmp_path / name, array, compress=False)
    monkeypatch.setenv("WSBOOK_MNIST_DIR", str(tmp_path))
    monkeypatch.setenv("WSBOOK_SCALE", "ci")
    return tmp_path, train_x.reshape(1200, -1), train_y, test_y


def _rows(x: torch.Tensor, raw: np.ndarray) -> np.ndarray:
    """The row of ``raw`` every standardized image of ``x`` came from (an affine image of it: correlation 1)."""
    a = x.numpy().astype(np.float64)
    a, b = a - a.mean(1, keepdims=True), raw - raw.mean(1, keepdims=True)
    corr = (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (b / np.linalg.norm(b, axis=1, keepdims=True)).T
    assert np.allclose(corr.max(1), 1.0, atol=1e-5)
    return corr.argmax(1)


def test_load_mnist_is_a_seeded_split_of_the_training_images(mnist_dir, monkeypatch):
    root, raw, train_y, test_y = mnist_dir
    assert data.missing("mnist") is None and data.missing("digits") is None
    ds = data.load("mnist", device="cpu")
    assert (ds.name, ds.n_classes) == ("mnist", 10)
    assert (ds.x_train.shape, ds.x_val.shape, ds.x_test.shape) == ((1000, 784), (200, 784), (100, 784))
    train, val = _rows(ds.x_train, raw), _rows(ds.x_val, raw)
    assert sorted([*train, *val]) == list(range(1200))                       # a split of all training images
    assert np.array_equal(ds.y_train.numpy(), train_y[train]) and np.array_equal(ds.y_val.numpy(), train_y[val])
    assert not np.array_equal(np.sort(val), np.arange(1000, 1200))           # seeded, not the last images
    assert torch.equal(ds.y_test, torch.as_tensor(test_y))
    assert abs(float(ds.x_train.mean())) < 1e-5 and abs(float(ds.x_train.std()) - 1) < 1e-3
    again = data._mnist_cached.__wrapped__(str(root.resolve()), "cpu")       # the same split every time
    assert torch.equal(again.x_val, ds.x_val) and torch.equal(again.y_train, ds.y_train)
    other = data.mnist(root, seed=1, device="cpu")
    assert set(_rows(other.x_val, raw)) != set(val)
    monkeypatch.delenv("WSBOOK_MNIST_DIR")
    assert "WSBOOK_MNIST_DIR" in data.missing("mnist")
    with pytest.raises(ValueError, match="WSBOOK_MNIST_DIR"):
        data.load("mnist")


def test_full_mnist_zoo_trains_at_ci_through_the_command_line(mnist_dir, monkeypatch, capsys, one_thread):
    """``python -m wsbook zoo/mnist`` trains the zoo (2 runs of 784-10-10, 2 epochs, 1 discarded, at ci) with
    the mnist5k recipe on the full-MNIST split, and the library reads that cache entry."""
    from wsbook import cache, cli
    from wsbook.experiments import targets

    monkeypatch.setenv("WSBOOK_PROGRESS", "0")
    assert cli.main(["zoo/mnist"]) == 0
    assert "zoo/mnist" in capsys.readouterr().out
    with cache.probe():                                   # read, not trained again
        z = targets.zoo("mnist")
    assert z.config == dataclasses.replace(targets.ZOOS["mnist5k"], dataset="mnist", epochs=2, discard_epochs=1)
    assert z.spec.widths == (784, 10, 10) and z.data.name == "mnist" and z.data.x_train.shape == (1000, 784)
    # 1000 // 64 = 15 iterations an epoch: of the checkpoints every 10, those after the first epoch
    assert z.theta.shape == (4, z.spec.n_params)
    assert z.run.tolist() == [0, 0, 1, 1] and z.step.tolist() == [20, 30, 20, 30]
    assert not torch.equal(z.theta[0], z.theta[2])        # two runs
    ev = targets.evaluate(z.spec, z.theta, z.data)
    assert ev.accuracy > 0.9, ev                          # they learned the labels (chance: 0.1)
