"""wsbook.flows against torchcfm: exact minibatch OT-CFM on the same 2-D problem.

Source N(0, I), target two moons (``wsbook.flows.two_moons``), minibatches of 256. The coupling: ours,
``wsbook.flows.OTCoupling`` (the optimal permutation of the minibatch, POT's exact solver), and torchcfm's
``OTPlanSampler("exact")`` (the optimal plan, from which ``ExactOptimalTransportConditionalFlowMatcher``
then draws pairs with replacement). Agreement on several minibatches: the same coupling cost
``sum_ij pi_ij |x0_i - x1_j|^2`` (to 1e-9 relative) and the same pairing (the plan's support is our
permutation). Timing: the coupling alone, and one training step of the same field (``TimeMLP``, Adam) with
each library's coupling and path: ours ``OTCoupling`` + ``cfm_loss`` with ``LinearPath``, torchcfm's
``sample_location_and_conditional_flow`` + the squared error of its example scripts.

Prints ``name, ours, peer, ratio`` lines (seconds; ratio = peer / ours, > 1 means wsbook is faster).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from wsbook.flows import (LinearPath, OTCoupling, TimeMLP, cfm_loss, coupling_cost, ot_assignment,  # noqa: E402
                          two_moons)

from timing import best_seconds  # noqa: E402


def batches(n_batches: int, batch: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 2, generator=gen), two_moons(batch, generator=gen)) for _ in range(n_batches)]


def check(n_batches: int = 4, batch: int = 256) -> dict:
    """Assert equal coupling costs and pairings; returns the largest relative cost difference."""
    from torchcfm.optimal_transport import OTPlanSampler

    peer = OTPlanSampler(method="exact")
    worst = 0.0
    for x0, x1 in batches(n_batches, batch):
        coupling = OTCoupling()
        perm = ot_assignment(coupling.cost(x0, x1))                   # what OTCoupling pairs x0 with
        paired = coupling(x0, x1)[1]
        assert torch.equal(paired, x1[perm])
        ours = float(coupling_cost(x0.double(), paired.double()))
        pi = torch.as_tensor(peer.get_map(x0, x1))
        cost = torch.cdist(x0.double(), x1.double()) ** 2
        theirs = float((pi * cost).sum())
        worst = max(worst, abs(ours - theirs) / theirs)
        assert abs(ours - theirs) <= 1e-9 * theirs + 1e-6, f"coupling costs differ: wsbook {ours}, torchcfm {theirs}"
        support = pi.argmax(1)
        assert torch.equal(support, perm), "torchcfm's plan pairs the minibatch differently"
        assert torch.allclose(pi.sum(1), torch.full((batch,), 1.0 / batch, dtype=pi.dtype))
    return {"relative_cost_difference": worst}


def main(batch: int = 256, steps: int = 20) -> None:
    check()
    from torchcfm.conditional_flow_matching import ExactOptimalTransportConditionalFlowMatcher
    from torchcfm.optimal_transport import OTPlanSampler

    data = batches(steps, batch, seed=1)
    ours_coupling, path = OTCoupling(), LinearPath()
    peer_plan, peer_fm = OTPlanSampler(method="exact"), ExactOptimalTransportConditionalFlowMatcher(sigma=0.0)
    t_ours = best_seconds(lambda: [ours_coupling(x0, x1) for x0, x1 in data]) / steps
    t_peer = best_seconds(lambda: [peer_plan.sample_plan(x0, x1) for x0, x1 in data]) / steps
    print("name, ours, peer, ratio")
    print(f"cfm_exact_ot_coupling batch {batch}, {t_ours:.5f}, {t_peer:.5f}, {t_peer / t_ours:.2f}")

    def trainer(step):
        torch.manual_seed(0)
        field = TimeMLP(2, hidden=128, depth=3)
        opt = torch.optim.Adam(field.parameters(), lr=1e-3)

        def run():
            for x0, x1 in data:
                loss = step(field, x0, x1)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        return run

    gen = torch.Generator().manual_seed(2)

    def ours_step(field, x0, x1):
        x0, x1 = ours_coupling(x0, x1)
        return cfm_loss(field, x0, x1, torch.rand(x0.shape[0], generator=gen), path)

    def peer_step(field, x0, x1):
        t, xt, ut = peer_fm.sample_location_and_conditional_flow(x0, x1)
        return torch.mean((field(t, xt) - ut) ** 2)

    t_ours = best_seconds(trainer(ours_step)) / steps
    t_peer = best_seconds(trainer(peer_step)) / steps
    print(f"cfm_training_step batch {batch} (TimeMLP 3x128, Adam), {t_ours:.5f}, {t_peer:.5f}, {t_peer / t_ours:.2f}")


if __name__ == "__main__":
    main()
