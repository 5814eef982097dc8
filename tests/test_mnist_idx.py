"""The full-MNIST loader reads the standard IDX files (plain or gzip) from a local directory; here a few
images the test writes itself."""
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
