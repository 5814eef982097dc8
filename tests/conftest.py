"""Shared test set-up: ci scale, quiet progress bars, a private cache directory, one thread-friendly seed."""
import os

import pytest

os.environ.setdefault("WSBOOK_SCALE", "ci")
os.environ.setdefault("WSBOOK_PROGRESS", "0")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WSBOOK_CACHE_DIR", str(tmp_path / "cache"))
    yield


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's many tiny tensor operations on one thread (restored afterwards): on a small or
    shared CPU that is faster and steadier than thread-pool barriers around microsecond kernels."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
