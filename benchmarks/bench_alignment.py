"""Benchmark of wsbook.symmetry.weight_matching.

1. One pair of 64-128-128-128-10 MLPs: total weight-matching time against the time of its Hungarian
   solves alone (the lower bound of any Hungarian-based coordinate descent); ratio = ours / bound.
2. The same zoo call against its own Hungarian solves (how much of a batched call is the LAP loop).
3. A zoo of 256 networks aligned to one reference in one batched call, against 256 pair-by-pair calls;
   ratio = pair-by-pair / batched (speed-up). Both give identical permutations (checked).

Prints ``name, ours, baseline, ratio`` lines (seconds).
"""
from __future__ import annotations

import time

import torch

from wsbook.nets import MLPSpec
from wsbook.symmetry import weight_matching


def main(width: int = 128, zoo_size: int = 256, repeats: int = 5) -> None:
    torch.manual_seed(0)
    spec = MLPSpec((64, width, width, width, 10))
    gen = torch.Generator().manual_seed(0)
    ref = spec.init(1, generator=gen)
    zoo = spec.init(zoo_size, generator=gen)

    total, lap = 0.0, 0.0
    weight_matching(spec, ref, zoo[:1])  # warm-up
    for k in range(repeats):
        t0 = time.perf_counter()
        res = weight_matching(spec, ref, zoo[k:k + 1], generator=torch.Generator().manual_seed(k))
        total += time.perf_counter() - t0
        lap += res.hungarian_seconds
    print(f"weight_matching_pair_vs_hungarian_bound, {total / repeats:.4f}, {lap / repeats:.4f}, {total / lap:.2f}")

    t0 = time.perf_counter()
    res = weight_matching(spec, ref, zoo, generator=torch.Generator().manual_seed(1))
    batched = res.perms
    t_batch = time.perf_counter() - t0
    print(f"weight_matching_zoo{zoo_size}_batched_vs_hungarian_bound, {t_batch:.4f}, "
          f"{res.hungarian_seconds:.4f}, {t_batch / res.hungarian_seconds:.2f}")
    t0 = time.perf_counter()
    single = [weight_matching(spec, ref, zoo[i:i + 1], generator=torch.Generator().manual_seed(1)).perms
              for i in range(zoo_size)]
    t_pairs = time.perf_counter() - t0
    for layer, p in enumerate(batched):
        if not torch.equal(p, torch.cat([s[layer] for s in single])):
            raise AssertionError("batched and pair-by-pair weight matching disagree")
    print(f"weight_matching_zoo{zoo_size}_batched_vs_pairwise, {t_batch:.4f}, {t_pairs:.4f}, {t_pairs / t_batch:.2f}")


if __name__ == "__main__":
    main()
