"""One place for the book's knobs: scale, device, dtype, seeds and progress bars.

Everything that depends on how big a run should be reads :func:`scale` (from the
``WSBOOK_SCALE`` environment variable) and picks its sizes with :func:`by_scale`.
"""
from __future__ import annotations

import contextlib
import os
import random
from typing import Iterator, TypeVar

import numpy as np
import torch

SCALES = ("ci", "default", "full")
T = TypeVar("T")


def scale() -> str:
    """The run size, from ``WSBOOK_SCALE``: ``ci`` (seconds), ``default`` (minutes on a laptop) or ``full`` (GPU).

    Raises ``ValueError`` for any other value, so a typo never silently runs the wrong size.
    """
    value = os.environ.get("WSBOOK_SCALE", "default").strip().lower()
    if value not in SCALES:
        raise ValueError(f"WSBOOK_SCALE must be one of {', '.join(SCALES)}; got {value!r}")
    return value


@contextlib.contextmanager
def at_scale(name: str) -> Iterator[None]:
    """Run a block at scale ``name`` (``WSBOOK_SCALE``), the previous value restored afterwards."""
    before = os.environ.get("WSBOOK_SCALE")
    os.environ["WSBOOK_SCALE"] = name
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("WSBOOK_SCALE", None)
        else:
            os.environ["WSBOOK_SCALE"] = before


def by_scale(ci: T, default: T, full: T) -> T:
    """Return the argument that belongs to the current :func:`scale` (the one function that sizes every run)."""
    return {"ci": ci, "default": default, "full": full}[scale()]


def device() -> torch.device:
    """CUDA when present (or ``WSBOOK_DEVICE`` when set), else CPU."""
    requested = os.environ.get("WSBOOK_DEVICE")
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def dtype() -> torch.dtype:
    """The default floating dtype for weights and data (float32; samplers accumulate energies in float64)."""
    return torch.float32


def seed_everything(seed: int = 0) -> torch.Generator:
    """Seed Python, NumPy and torch (CPU and CUDA); return a torch generator seeded the same way."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator(device="cpu").manual_seed(seed)


def generator(offset: int = 0) -> torch.Generator:
    """A CPU generator seeded with the book's seed (``WSBOOK_SEED``, default 0) plus ``offset``: the fixed
    random streams of the book's experiments come from here, so they are set in one place."""
    return torch.Generator(device="cpu").manual_seed(int(os.environ.get("WSBOOK_SEED", "0")) + offset)


_ALLOCATOR_TUNED: bool | None = None


@contextlib.contextmanager
def isolated_rng() -> Iterator[None]:
    """Run the block and then put back the global random states it may have drawn from (torch's CPU
    and CUDA generators, NumPy's and Python's). The cache computes inside it, so whether an entry was
    computed or loaded never shifts the random numbers that the code after it draws."""
    numpy_state, python_state = np.random.get_state(), random.getstate()
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block with torch's global generator seeded to ``seed`` and restore every global random
    state afterwards. For what draws from the global generator (``nn.Module`` initialisation) inside a
    cached computation: the result must not depend on which chapter happened to compute it first."""
    with isolated_rng():
        torch.manual_seed(seed)
        yield


def deterministic_kernels() -> bool:
    """On the CPU, make torch pick its deterministic kernels (``torch.use_deterministic_algorithms``), so a
    chapter gives the same numbers every time it runs on one machine. Without it, the multi-threaded
    scatter-adds of message passing sum in a varying order, and training amplifies the last-bit
    differences (chapter 6's learned aligner moved by 0.1 in barrier between two runs). On the CPU this
    costs nothing measurable; on a GPU it is left off (it would need ``CUBLAS_WORKSPACE_CONFIG`` and slow
    the kernels down). Returns whether it was turned on. A process-wide change: only
    :func:`wsbook.experiments.setup_chapter` calls it.
    """
    if device().type != "cpu":
        return False
    torch.use_deterministic_algorithms(True, warn_only=True)
    return True


def tune_allocator() -> bool:
    """Let glibc keep freed large blocks for reuse (``WSBOOK_MALLOC_TUNING=0`` turns this off).

    By default glibc returns every block above a few MB to the kernel on free, so each training step
    pays page faults again for its activations; on a CPU that costs up to half the step time. This
    raises the mmap and trim thresholds (as ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``
    would). Returns whether the allocator was tuned (only on Linux with glibc).

    A process-wide change, so neither importing wsbook nor calling a library function does it: a program
    calls it once at its start (:func:`wsbook.experiments.setup_chapter` for the chapters, ``python -m
    wsbook`` and the benchmarks that train). Calls after the first return the first answer.
    """
    global _ALLOCATOR_TUNED
    if os.environ.get("WSBOOK_MALLOC_TUNING", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if _ALLOCATOR_TUNED is None:
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
            _ALLOCATOR_TUNED = bool(libc.mallopt(m_mmap_threshold, 32 << 20)
                                    and libc.mallopt(m_trim_threshold, 1 << 30) and libc.mallopt(m_top_pad, 64 << 20))
        except (OSError, AttributeError):
            _ALLOCATOR_TUNED = False
    return _ALLOCATOR_TUNED


def progress_enabled() -> bool:
    """Progress bars are shown interactively, and hidden under CI or when ``WSBOOK_PROGRESS=0``."""
    flag = os.environ.get("WSBOOK_PROGRESS")
    if flag is not None:
        return flag.strip().lower() not in ("0", "false", "no", "off", "")
    return not os.environ.get("CI")
