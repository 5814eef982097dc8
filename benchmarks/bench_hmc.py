"""HMC: 32 chains as one vectorized batch against the same 32 chains run one after another (issue 2).

Breast cancer, MLP 30-16-16-2 (802 parameters), full-batch HMC in float64 with the chapter's sampler
(`wsbook.bayes.hmc`): identical settings (warm-up with dual averaging, leapfrog steps, number of draws)
in both arms; the only difference is whether the 32 chains share one batched log-posterior evaluation.
Also reports effective samples per second (median function-space ESS of the test-set class
probabilities, across chains). Prints ``name, ours, baseline, ratio`` lines.
"""
from __future__ import annotations

import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from wsbook import bayes, config  # noqa: E402
from wsbook.experiments import tasks  # noqa: E402

CHAINS = 32
REPEATS = int(os.environ.get("BENCH_REPEATS", 3))
SETTINGS = dict(n_samples=int(os.environ.get("BENCH_HMC_SAMPLES", 16)), n_warmup=int(os.environ.get("BENCH_HMC_WARMUP", 16)),
                n_leapfrog=10, step_size=5e-3, progress=False)


def function_ess(task: tasks.Task, samples: torch.Tensor) -> float:
    """Median ESS over test points and classes of p(y|x, theta) along the chains; samples [S, C, D]."""
    S, C, D = samples.shape
    with torch.no_grad():
        probs = torch.softmax(task.spec.forward(samples.reshape(-1, D).float(), task.data().x_test), -1)
    return float(bayes.ess(probs.view(S, C, *probs.shape[1:])).median())


def main() -> None:
    torch.set_num_threads(1)     # both arms on one thread: stable timings on a shared 2-core machine
    config.tune_allocator()      # a process-wide glibc setting, as the chapters run with (both arms gain)
    task = tasks.get_task("breast_cancer")
    lp = task.log_posterior(dtype=torch.float64)
    theta0 = lp.init(CHAINS, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    warnings.simplefilter("ignore", RuntimeWarning)
    bayes.hmc(lp, theta0[:2], n_samples=2, n_warmup=2, n_leapfrog=2, progress=False)   # warm up kernels

    def timed(fn):
        start = time.perf_counter()
        out = fn()
        return time.perf_counter() - start, out

    def batched_arm():
        return bayes.hmc(lp, theta0, generator=torch.Generator().manual_seed(1), **SETTINGS)

    def loop_arm():
        return [bayes.hmc(lp, theta0[i:i + 1], generator=torch.Generator().manual_seed(100 + i), **SETTINGS)
                for i in range(CHAINS)]

    # fastest of REPEATS runs of each arm (same seeds every time), the arms alternating so that a change of
    # the machine's load between them reaches both
    arms = [(timed(batched_arm), timed(loop_arm)) for _ in range(REPEATS)]
    t_batched, batched = min((b for b, _ in arms), key=lambda r: r[0])
    t_loop, runs = min((l for _, l in arms), key=lambda r: r[0])
    looped = torch.cat([r.by_chain() for r in runs], dim=1)                # [S, C, D]

    ess_b, ess_l = function_ess(task, batched.by_chain()), function_ess(task, looped)
    print("name, ours, baseline, ratio")
    print(f"hmc_{CHAINS}_chains_seconds, {t_batched:.2f}, {t_loop:.2f}, {t_loop / t_batched:.1f}")
    print(f"hmc_ess_per_second, {ess_b / t_batched:.2f}, {ess_l / t_loop:.2f}, "
          f"{(ess_b / t_batched) / (ess_l / t_loop):.1f}")
    print(f"hmc_accept_rate, {float(batched.accept_rate.mean()):.3f}, "
          f"{float(torch.cat([r.accept_rate for r in runs]).mean()):.3f}, -")


if __name__ == "__main__":
    main()
