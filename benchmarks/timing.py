"""Timing shared by the benchmark scripts: the fastest of a few repeats after one warm-up call, and the
machine's matrix-multiply rate that compute-bound lines are a share of."""
from __future__ import annotations

import time

import torch
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


def best_pair(ours: Callable[[], object], baseline: Callable[[], object], rounds: int = 5) -> tuple[float, float]:
    """Fastest wall times of ``ours`` and ``baseline`` over ``rounds`` rounds that call each once, alternating
    (after one untimed call of each), so that a change of the machine's load between them reaches both."""
    ours(), baseline()
    times = []
    for _ in range(rounds):
        times.append((best_seconds(ours, repeats=1, warmup=False), best_seconds(baseline, repeats=1, warmup=False)))
    return min(t for t, _ in times), min(t for _, t in times)


def matmul_gflops(n: int = 2048) -> float:
    """GFLOP/s of an ``n x n`` float32 matrix product on the current torch threads (best of 10)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / best_seconds(lambda: a @ b, repeats=10) / 1e9
