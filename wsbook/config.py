"""One place for the book's knobs: scale, device, dtype, seeds and progress bars.

Everything that depends on how big a run should be reads :func:`scale` (from the
``WSBOOK_SCALE`` environment variable) and picks its sizes with :func:`by_scale`.
"""
from __future__ import annotations

import os
import random
from typing import TypeVar

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


def progress_enabled() -> bool:
    """Progress bars are shown interactively, and hidden under CI or when ``WSBOOK_PROGRESS=0``."""
    flag = os.environ.get("WSBOOK_PROGRESS")
    if flag is not None:
        return flag.strip().lower() not in ("0", "false", "no", "off", "")
    return not os.environ.get("CI")
