"""Timing shared by the benchmark scripts: the fastest of a few repeats after one warm-up call."""
from __future__ import annotations

import time
from typing import Callable


def best_seconds(fn: Callable[[], object], repeats: int = 3, warmup: bool = True) -> float:
    """Fastest wall time of ``repeats`` calls of ``fn`` (after one untimed call when ``warmup``)."""
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)
