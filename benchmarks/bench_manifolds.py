"""exp/log on a product of 10,000 spheres: wsbook's batched Product versus a Python loop over factors.

Prints ``name, ours, baseline, ratio`` lines (seconds per call; ratio = baseline / ours, > 1 means faster).
"""
from __future__ import annotations

import time

import torch

from wsbook.manifolds import Product, Sphere


def timeit(fn, repeat: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(n_factors: int = 10_000, n: int = 3, batch: int = 16) -> None:
    g = torch.Generator().manual_seed(0)
    prod = Product.spheres(n_factors, n)
    sphere = Sphere(n)
    x, y = prod.random_base(batch, generator=g), prod.random_base(batch, generator=g)
    u = prod.proju(x, torch.randn(x.shape, generator=g)) * 0.3

    def loop(op, a, b):
        return torch.cat([getattr(sphere, op)(a[:, k * n:(k + 1) * n], b[:, k * n:(k + 1) * n])
                          for k in range(n_factors)], -1)

    assert torch.allclose(prod.expmap(x, u), loop("expmap", x, u), atol=1e-6)
    assert torch.allclose(prod.logmap(x, y), loop("logmap", x, y), atol=1e-5)
    for op, b in (("expmap", u), ("logmap", y)):
        ours = timeit(lambda: getattr(prod, op)(x, b))
        base = timeit(lambda: loop(op, x, b), repeat=1)
        print(f"{op} product of {n_factors} S^{n - 1} (batch {batch}), {ours:.5f}, {base:.5f}, {base / ours:.1f}")


if __name__ == "__main__":
    torch.set_num_threads(1)     # both sides on one thread: stable timings on a shared 2-core machine
    main()
