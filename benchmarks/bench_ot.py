"""Minibatch exact OT coupling (wsbook.flows.OTCoupling, POT's network simplex) for batch sizes 64 to 1,024,
against SciPy's Hungarian solver (``linear_sum_assignment``) on the same cost matrix; both are exact, and
the script checks that they reach the same total cost.

Prints ``name, ours, baseline, ratio`` lines (seconds per coupling, the best of a few repeats after a warm-up;
ratio = baseline / ours).
"""
from __future__ import annotations

import torch
from scipy.optimize import linear_sum_assignment

from timing import best_seconds
from wsbook.flows import OTCoupling


def main(dim: int = 2) -> None:
    g = torch.Generator().manual_seed(0)
    coupling = OTCoupling()
    for b in (64, 128, 256, 512, 1024):
        x0, x1 = torch.randn(b, dim, generator=g), torch.randn(b, dim, generator=g) + 1
        reps = max(1, 2048 // b)     # small couplings take ~0.1 ms: time enough of them to see past the noise

        def ours_call():
            for _ in range(reps):
                _, y1 = coupling(x0, x1)
            return y1

        def scipy_call():
            for _ in range(reps):
                cost = (torch.cdist(x0, x1) ** 2).double().numpy()
                rows, cols = linear_sum_assignment(cost)
            return cost, rows, cols

        # a warm-up call each, so that neither side is charged the first call's set-up (at batch 64 the first
        # coupling of a process costs several times a later one)
        ours = best_seconds(ours_call, repeats=5) / reps
        base = best_seconds(scipy_call, repeats=5) / reps
        y1 = ours_call()
        cost, rows, cols = scipy_call()
        ours_cost = ((x0 - y1) ** 2).sum().item()
        assert abs(ours_cost - cost[rows, cols].sum()) < 1e-3 * max(1.0, ours_cost), (ours_cost, cost[rows, cols].sum())
        print(f"OT coupling batch {b} (dim {dim}), {ours:.5f}, {base:.5f}, {base / ours:.2f}")


if __name__ == "__main__":
    torch.set_num_threads(1)     # both sides on one thread: stable timings on a shared 2-core machine
    main()
