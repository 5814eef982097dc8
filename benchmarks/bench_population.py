"""Population training against the usual one-module-per-network loop (issue: foundation).

256 MLPs 64-32-10 trained on digits for 200 Adam steps:
1. minibatches of 64 (zoo-training regime): one [B, D] population vs 256 torch.nn modules, each with its
   own Adam and its own shuffled minibatches, stepped in a Python loop;
2. full-batch steps (compute-bound): the population's achieved GFLOP/s as a fraction of this machine's
   large-matmul GFLOP/s measured in the same run.
Prints ``name, ours, baseline, ratio`` lines.
"""
from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from wsbook import config, data  # noqa: E402
from wsbook.nets import MLPSpec, train_population  # noqa: E402

from timing import best_seconds, matmul_gflops  # noqa: E402

N_NETS, STEPS, BATCH = 256, 200, 64
BASELINE_NETS = int(os.environ.get("BENCH_BASELINE_NETS", 64))  # the loop is linear in networks: time a slice


def module_loop_seconds(spec: MLPSpec, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, n: int) -> float:
    """Seconds for n separate modules, each with its own Adam and shuffled minibatches, 200 steps."""
    models = [spec.to_module(t) for t in theta[:n]]
    optims = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in models]
    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    per_epoch = x.shape[0] // BATCH
    orders = [None] * n
    start = time.perf_counter()
    for step in range(STEPS):
        k = step % per_epoch
        for i, (model, opt) in enumerate(zip(models, optims)):
            if k == 0:
                orders[i] = torch.randperm(x.shape[0], generator=gens[i])
            idx = orders[i][k * BATCH:(k + 1) * BATCH]
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return time.perf_counter() - start


def main() -> None:
    config.tune_allocator()          # once, before any training: a process-wide glibc setting (both loops gain)
    torch.manual_seed(0)
    ds = data.load("digits", device="cpu")
    spec = MLPSpec((64, 32, 10))
    theta = spec.init(N_NETS, generator=torch.Generator().manual_seed(0), device="cpu")
    x, y = ds.x_train, ds.y_train

    # 1. minibatch regime
    ours = best_seconds(lambda: train_population(spec, theta, x, y, steps=STEPS, lr=1e-3, batch_size=BATCH,
                                                 progress=False))
    baseline = module_loop_seconds(spec, theta, x, y, BASELINE_NETS) * N_NETS / BASELINE_NETS
    print(f"population_minibatch64_256nets_200steps_s, {ours:.3f}, {baseline:.3f}, {baseline / ours:.1f}")

    # 2. full-batch, compute-bound: forward 2*N*sum(in*out) per network, backward about twice that
    flops_forward = 2 * x.shape[0] * N_NETS * sum(i * o for o, i in spec.layer_shapes)
    seconds = best_seconds(lambda: train_population(spec, theta, x, y, steps=STEPS, lr=1e-3, progress=False))
    achieved = 3 * flops_forward * STEPS / seconds / 1e9
    peak = matmul_gflops()
    print(f"population_fullbatch_gflops_vs_matmul, {achieved:.1f}, {peak:.1f}, {achieved / peak:.2f}")


if __name__ == "__main__":
    main()
