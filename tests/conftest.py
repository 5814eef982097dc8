"""Shared test set-up: ci scale, quiet progress bars, a private cache directory, one thread-friendly seed."""
import os

import pytest

os.environ.setdefault("WSBOOK_SCALE", "ci")
os.environ.setdefault("WSBOOK_PROGRESS", "0")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WSBOOK_CACHE_DIR", str(tmp_path / "cache"))
    yield
