"""HMC's batched loop keeps its per-iteration work in tensors: one log-density gradient per leapfrog step
(a trajectory starts from the gradient the previous one ended with), no host reads per iteration, and
kept draws that are not aliased by later iterations."""
from __future__ import annotations

import pytest
import torch

from wsbook import bayes
from wsbook.bayes import mcmc
from wsbook.nets import MLPSpec

pytestmark = pytest.mark.usefixtures("one_thread")


def _posterior(chains: int = 5):
    g = torch.Generator().manual_seed(0)
    spec = MLPSpec((4, 8, 3))
    x = torch.randn(40, 4, generator=g, dtype=torch.float64)
    lp = bayes.LogPosterior(spec, x, torch.randint(0, 3, (40,), generator=g))
    return lp, lp.init(chains, generator=g, dtype=torch.float64)


def _run(lp, theta0, n_samples: int, n_warmup: int, thin: int = 1):
    return bayes.hmc(lp, theta0, n_samples=n_samples, n_warmup=n_warmup, n_leapfrog=6, step_size=0.02, thin=thin,
                     generator=torch.Generator().manual_seed(1), progress=False)


def test_hmc_evaluates_one_gradient_per_leapfrog_step(monkeypatch):
    lp, theta0 = _posterior()
    calls = []
    value_and_grad = mcmc._value_and_grad

    def counted(log_posterior, theta, batch=None):
        calls.append(theta.shape[0])
        return value_and_grad(log_posterior, theta, batch)

    monkeypatch.setattr(mcmc, "_value_and_grad", counted)
    _run(lp, theta0, n_samples=4, n_warmup=3, thin=2)
    assert calls == [5] * (1 + (3 + 4 * 2) * 6)          # the start, then one per leapfrog step, all chains at once


def test_hmc_reads_no_value_on_the_host_per_iteration(host_reads):
    lp, theta0 = _posterior()
    assert host_reads(lambda: _run(lp, theta0, 3, 3)) == host_reads(lambda: _run(lp, theta0, 12, 12))


def test_hmc_kept_draws_are_not_overwritten_by_later_iterations():
    lp, theta0 = _posterior()
    run = _run(lp, theta0, n_samples=6, n_warmup=2)
    draws = run.by_chain()                                # [S, C, D]
    assert not torch.equal(draws[0], draws[-1])           # the chains moved
    torch.testing.assert_close(run.log_prob.view(6, -1), lp(draws.reshape(-1, draws.shape[-1])).view(6, -1),
                               rtol=1e-12, atol=1e-9)
    again = _run(lp, theta0, n_samples=3, n_warmup=2)      # the same stream: its first draws are the longer run's
    assert torch.equal(again.samples, run.samples[: again.samples.shape[0]])
