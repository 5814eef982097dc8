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


#: aten operators whose result the host must read (on a GPU each is a host-device synchronisation)
HOST_READS = {"_local_scalar_dense", "nonzero", "is_nonzero", "masked_select", "unique", "_unique", "_unique2",
              "unique_dim", "unique_consecutive", "equal", "repeat_interleave"}


@pytest.fixture
def host_reads():
    """``host_reads(fn)``: how many operators that read a tensor's value on the host ``fn()`` runs
    (``.item()``, ``bool(t)``, ``float(t)``, ``nonzero``, ...), seen at the dispatcher, so it counts them
    on the CPU too. A training loop that reads nothing per step reads as much in 30 steps as in 5."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += func._schema.name.split("::")[-1] in HOST_READS
            return func(*args, **(kwargs or {}))

    def count(fn) -> int:
        Count.n = 0
        with Count():
            fn()
        return Count.n

    return count


@pytest.fixture
def fake_zoo():
    """``fake_zoo(spec, cfg, runs, per_run, seed)``: a :class:`wsbook.experiments.targets.Zoo` named "tiny" of
    ``runs`` runs of ``per_run`` random networks of ``spec`` each (trained by ``cfg``, in name only)."""
    import torch

    from wsbook.experiments import targets

    def make(spec, cfg, runs: int, per_run: int, seed: int):
        theta = spec.init(runs * per_run, generator=torch.Generator().manual_seed(seed))
        return targets.Zoo("tiny", spec, theta, torch.arange(runs).repeat_interleave(per_run),
                           torch.arange(per_run).repeat(runs) + 1, cfg, 0.0)
    return make
