"""wsbook's batched HMC against Pyro's HMC on the breast-cancer BNN posterior (chapter 2's reference task).

The posterior: MLP 30-16-16-2 (ReLU, 802 parameters), N(0, 1) prior on every weight, categorical likelihood
on the training split, float64. In Pyro it is written as a model (``pyro.sample`` of the weights under
the prior, a ``Categorical(logits=...)`` likelihood under a ``plate``, the network written out with
``torch.nn.functional.linear`` on slices of the flat weight vector); ours is ``Task.log_posterior``.

Agreement:
1. the potential energy (minus the log joint density, constants included) and its gradient are equal at
   the same points (Pyro's ``initialize_model`` potential, to 1e-10 relative);
2. with the same settings (step size, 10 leapfrog steps, no step-size adaptation, no jitter, the same 32
   starting points, a burn-in of the first draws) the acceptance rates and the posterior predictive
   probabilities on the test set are statistically equal: two-sample z-scores over the 32 independent
   chains, per test point, all below 5.

Timing: 32 chains, ours as one batch, Pyro as it is used for one chain per ``MCMC.run`` (Pyro's own
several-chain mode starts one process per chain; it cannot batch chains), the 32 runs one after another.
Also effective samples per second (median function-space ESS of the test-set class probabilities).

Prints ``name, ours, peer, ratio`` lines (seconds; ratio = peer / ours, > 1 means wsbook is faster).
"""
from __future__ import annotations

import os
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from wsbook import bayes  # noqa: E402
from wsbook.experiments import tasks  # noqa: E402

DT = torch.float64
SETTINGS = dict(step_size=1e-2, n_leapfrog=10)


def problem():
    """The task, our float64 log posterior and the same posterior as a Pyro model ``model(x, y)``."""
    import pyro
    import pyro.distributions as dist

    task = tasks.get_task("breast_cancer")
    lp = task.log_posterior(dtype=DT)
    spec = lp.spec

    def logits(theta, x):
        h = x
        for layer, (o, i) in enumerate(spec.layer_shapes):
            w, b = spec.slices(layer)
            h = F.linear(h, theta[..., w].reshape(o, i), theta[..., b])
            if layer < spec.n_layers - 1:
                h = torch.relu(h)
        return h

    def model(x, y):
        theta = pyro.sample("theta", dist.Normal(torch.zeros(spec.n_params, dtype=DT), task.prior_std).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Categorical(logits=logits(theta, x)), obs=y)

    return task, lp, model


def check_potential(lp, model, points: torch.Tensor) -> float:
    """Assert equal potential energies and gradients at ``points [K, D]``; returns the largest relative error."""
    from pyro.infer.mcmc.util import initialize_model

    _, potential_fn, _, _ = initialize_model(model, model_args=(lp.x, lp.y))
    worst = 0.0
    for theta in points:
        t = theta.clone().requires_grad_(True)
        u_peer = potential_fn({"theta": t})
        u_peer_value = float(u_peer.detach())
        (g_peer,) = torch.autograd.grad(u_peer, t)
        value, grad = lp.grad(theta.unsqueeze(0))
        u_ours, g_ours = -value[0], -grad[0]
        err = max(abs(float(u_ours) - u_peer_value) / abs(u_peer_value),
                  float((g_ours - g_peer).abs().max() / g_peer.abs().max()))
        worst = max(worst, err)
        assert err < 1e-10, f"potential or gradient differ between wsbook and Pyro: relative error {err:.2e}"
    return worst


def run_ours(lp, theta0: torch.Tensor, n_iter: int, seed: int = 1):
    """Our HMC for all chains at once: draws ``[n_iter, C, D]`` and per-chain acceptance rates."""
    r = bayes.hmc(lp, theta0, n_samples=n_iter, n_warmup=0, jitter=0.0, generator=torch.Generator().manual_seed(seed),
                  progress=False, **SETTINGS)
    s = r.samples
    draws = s if s.dim() == 3 else s.reshape(n_iter, theta0.shape[0], -1)   # [S, C, D] or draw-major [S * C, D]
    return draws, r.accept_rate.to(DT)


def run_pyro(lp, model, theta0: torch.Tensor, n_iter: int, seed: int = 100):
    """Pyro's HMC, one chain per run: draws ``[n_iter, C, D]`` and per-chain acceptance rates."""
    import pyro
    from pyro.infer import HMC, MCMC

    draws, accept = [], []
    for c in range(theta0.shape[0]):
        pyro.set_rng_seed(seed + c)
        kernel = HMC(model, step_size=SETTINGS["step_size"], num_steps=SETTINGS["n_leapfrog"], adapt_step_size=False,
                     adapt_mass_matrix=False)
        mcmc = MCMC(kernel, num_samples=n_iter, warmup_steps=0, initial_params={"theta": theta0[c]},
                    disable_progbar=True)
        mcmc.run(lp.x, lp.y)
        draws.append(mcmc.get_samples()["theta"])
        accept.append(float(mcmc.diagnostics()["acceptance rate"]["chain 0"]))
    return torch.stack(draws, 1), torch.tensor(accept, dtype=DT)


def test_probs(task, draws: torch.Tensor) -> torch.Tensor:
    """Class probabilities on the test set for every draw: ``[S, C, N, K]``."""
    S, C, D = draws.shape
    with torch.no_grad():
        probs = torch.softmax(task.spec.forward(draws.reshape(-1, D).float(), task.data().x_test), -1)
    return probs.view(S, C, *probs.shape[1:])


def two_sample_z(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """z-scores of the difference of means over the chains (dim 0) of two independent samples."""
    se = (a.var(0) / a.shape[0] + b.var(0) / b.shape[0]).sqrt().clamp_min(1e-12)
    return (a.mean(0) - b.mean(0)) / se


def check_statistics(task, ours, peer, burnin: int, z_max: float = 5.0) -> dict:
    """Assert statistically equal acceptance rates and test-set predictives; returns the z-scores."""
    (d_o, acc_o), (d_p, acc_p) = ours, peer
    z_accept = float(two_sample_z(acc_o, acc_p))
    p_o = test_probs(task, d_o[burnin:]).mean(0)[..., 1]                   # [C, N]: per-chain predictive
    p_p = test_probs(task, d_p[burnin:]).mean(0)[..., 1]
    z_pred = two_sample_z(p_o, p_p)
    z_pred = z_pred[torch.isfinite(z_pred)]
    assert abs(z_accept) < z_max, f"acceptance rates differ: ours {acc_o.mean():.3f}, Pyro {acc_p.mean():.3f}"
    assert z_pred.abs().max() < z_max, f"test predictives differ: largest |z| {z_pred.abs().max():.1f}"
    return {"z_accept": z_accept, "z_pred_max": float(z_pred.abs().max()), "accept_ours": float(acc_o.mean()),
            "accept_pyro": float(acc_p.mean())}


def function_ess(task, draws: torch.Tensor) -> float:
    return float(bayes.ess(test_probs(task, draws)).median())


def check(chains: int = 32, n_iter: int = 80, burnin: int = 20) -> dict:
    """Assert equal potentials and statistically equal runs; returns the runs, their times and the statistics."""
    warnings.simplefilter("ignore", RuntimeWarning)
    task, lp, model = problem()
    theta0 = lp.init(chains, generator=torch.Generator().manual_seed(0), dtype=DT)
    points = theta0[:4]
    err = check_potential(lp, model, torch.cat([points, points + 0.1 * torch.randn(points.shape, dtype=DT,
                                                generator=torch.Generator().manual_seed(1))]))
    run_ours(lp, theta0[:2], 2)                                               # warm up kernels
    t0 = time.perf_counter()
    ours = run_ours(lp, theta0, n_iter)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    peer = run_pyro(lp, model, theta0, n_iter)
    t_peer = time.perf_counter() - t0
    stats = check_statistics(task, ours, peer, burnin)
    return dict(stats, task=task, ours=ours, peer=peer, t_ours=t_ours, t_peer=t_peer, potential_error=err)


def main(chains: int = 32, n_iter: int = 80, burnin: int = 20) -> None:
    r = check(chains, n_iter, burnin)
    task, t_ours, t_peer = r["task"], r["t_ours"], r["t_peer"]
    ess_o, ess_p = function_ess(task, r["ours"][0][burnin:]), function_ess(task, r["peer"][0][burnin:])
    print("name, ours, peer, ratio")
    print(f"hmc_potential_and_gradient max relative difference, {r['potential_error']:.1e}, {r['potential_error']:.1e}, -")
    print(f"hmc_accept_rate (two-sample z {r['z_accept']:.2f}), {r['accept_ours']:.3f}, {r['accept_pyro']:.3f}, -")
    print(f"hmc_test_predictive largest |z| over test points, {r['z_pred_max']:.2f}, {r['z_pred_max']:.2f}, -")
    print(f"hmc_{chains}_chains {n_iter} iterations x {SETTINGS['n_leapfrog']} leapfrog seconds, {t_ours:.2f}, "
          f"{t_peer:.2f}, {t_peer / t_ours:.1f}")
    print(f"hmc_ess_per_second, {ess_o / t_ours:.2f}, {ess_p / t_peer:.2f}, {(ess_o / t_ours) / (ess_p / t_peer):.1f}")


if __name__ == "__main__":
    main()
