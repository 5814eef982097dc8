"""wsbook's SGLD and SGHMC against posteriors' (``posteriors.sgmcmc``) for a population of chains.

The same log posterior (``wsbook.bayes.LogPosterior``) drives both. posteriors advances one chain per
state; its chains are vectorised the way its documentation suggests for ensembles, with
``torch.func.vmap`` over ``init`` and ``update`` (``randomness="different"``), which is the fastest way to
run a population with it. Parameters are mapped so that both take the same steps:

* SGLD: ours ``theta += (h/2) grad + N(0, h)``; posteriors ``theta += lr grad + N(0, 2 lr)``: ``lr = h / 2``.
* SGHMC: ours ``v <- (1 - a) v + h grad + N(0, 2 a h); theta += v``; posteriors ``theta += lr m;
  m <- m + lr grad - lr alpha m + N(0, 2 lr alpha)``, the same with ``h = lr^2``, ``a = lr alpha`` and
  ``v = lr m``, except that posteriors moves ``theta`` with the momentum *before* its update (explicit
  Euler) where ours uses the updated one (Chen et al., 2014, eq. 15; symplectic Euler).

Agreement, on a conjugate model (Bayesian linear regression, full-batch gradients, float64): the
stationary mean and covariance of each sampler's chains against the exact stationary moments of its own
discretisation (a discrete Lyapunov equation), and the two samplers' moments against each other: SGLD is
the same recursion in both (equal stationary moments); SGHMC's two discretisations have the same mean and
stationary variances that differ at O(step), both reported against the exact posterior. Timing: seconds
per step for a population of chains, on the conjugate model and on the breast-cancer BNN (minibatches).

Prints ``name, ours, peer, ratio`` lines (seconds per step; ratio = peer / ours, > 1 means wsbook is faster).
"""
from __future__ import annotations

import os
import sys
import time
import warnings

import torch
from scipy.linalg import solve_discrete_lyapunov

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from wsbook import bayes  # noqa: E402
from wsbook.bayes import LogPosterior  # noqa: E402
from wsbook.nets import MLPSpec  # noqa: E402

DT = torch.float64


# ------------------------------------------------------------------ the conjugate model
def conjugate(n: int = 200, d: int = 4, noise: float = 0.5, prior: float = 1.0, seed: int = 0):
    """Bayesian linear regression as a one-layer network: ``(log posterior, exact mean, precision A)``."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=DT)
    y = x @ torch.randn(d, 1, generator=gen, dtype=DT) + 0.3 + noise * torch.randn(n, 1, generator=gen, dtype=DT)
    lp = LogPosterior(MLPSpec((d, 1)), x, y, prior, "regression", noise_std=noise)
    design = torch.cat([x, torch.ones(n, 1, dtype=DT)], 1)            # the spec's layout: weights, then bias
    A = design.T @ design / noise ** 2 + torch.eye(d + 1, dtype=DT) / prior ** 2
    mean = torch.linalg.solve(A, design.T @ y[:, 0] / noise ** 2)
    return lp, mean, A


def stationary_cov(kind: str, A: torch.Tensor, step: float, friction: float = 0.0) -> torch.Tensor:
    """Exact stationary covariance of theta of a sampler's linear recursion on ``N(mean, A^-1)``.

    ``kind``: ``"sgld"`` (step = posteriors' lr, h / 2 for ours), ``"sghmc_ours"`` (step = h, friction = a) or
    ``"sghmc_posteriors"`` (step = lr, friction = alpha).
    """
    a, D = A.numpy(), A.shape[0]
    eye = torch.eye(D, dtype=DT).numpy()
    zero = 0 * eye
    if kind == "sgld":
        return torch.as_tensor(solve_discrete_lyapunov(eye - step * a, 2 * step * eye))
    if kind == "sghmc_ours":           # (e, v): v' = (1 - a) v - h A e + n, e' = e + v'
        T = [[eye - step * a, (1 - friction) * eye], [-step * a, (1 - friction) * eye]]
        Q = [[2 * friction * step * eye] * 2] * 2
    elif kind == "sghmc_posteriors":   # (e, m): e' = e + lr m, m' = -lr A e + (1 - lr alpha) m + n
        T = [[eye, step * eye], [-step * a, (1 - step * friction) * eye]]
        Q = [[zero, zero], [zero, 2 * step * friction * eye]]
    else:
        raise ValueError(kind)
    block = lambda m: torch.as_tensor(__import__("numpy").block(m))  # noqa: E731
    S = solve_discrete_lyapunov(block(T).numpy(), block(Q).numpy())
    return torch.as_tensor(S[:D, :D])


# ------------------------------------------------------------------ running both
def draws_of(result, chains: int) -> torch.Tensor:
    """Our samples as ``[S, C, D]`` (from ``[S, C, D]`` or draw-major ``[S * C, D]``)."""
    s = result.samples
    return s if s.dim() == 3 else s.reshape(-1, chains, s.shape[-1])


def ours(kind: str, lp, theta0: torch.Tensor, steps: int, step: float, friction: float = 0.1,
         batch_size: int | None = None, seed: int = 1) -> torch.Tensor:
    """Our sampler, every step kept: ``[steps, C, D]``."""
    gen = torch.Generator().manual_seed(seed)
    kw = dict(n_samples=steps, n_burnin=0, lr=step, batch_size=batch_size, thin=1, schedule="constant",
              generator=gen, progress=False)
    if kind == "sgld":
        return draws_of(bayes.sgld(lp, theta0, **kw), theta0.shape[0])
    return draws_of(bayes.sghmc(lp, theta0, friction=friction, **kw), theta0.shape[0])


def peer_transform(kind: str, lp, step: float, friction: float = 0.1):
    """posteriors' transform for the same steps as ours (see the module docstring)."""
    import posteriors

    def log_post(params, batch):
        value = lp(params.unsqueeze(0), batch)[0] if batch is not None else lp(params.unsqueeze(0))[0]
        return value, value.new_zeros(())

    if kind == "sgld":
        return posteriors.sgmcmc.sgld.build(log_post, lr=step / 2)
    lr = step ** 0.5
    return posteriors.sgmcmc.sghmc.build(log_post, lr=lr, alpha=friction / lr, momenta=0.0)


def peer(kind: str, lp, theta0: torch.Tensor, steps: int, step: float, friction: float = 0.1,
         batches=None, seed: int = 1) -> torch.Tensor:
    """posteriors' sampler, its chains vectorised by ``torch.func.vmap``: ``[steps, C, D]``."""
    torch.manual_seed(seed)
    transform = peer_transform(kind, lp, step, friction)
    state = torch.func.vmap(transform.init)(theta0.clone())
    update = torch.func.vmap(transform.update, in_dims=(0, None if batches is None else 0), randomness="different")
    out = []
    for k in range(steps):
        state, _ = update(state, None if batches is None else batches(k))
        out.append(state.params.clone())
    return torch.stack(out)


# ------------------------------------------------------------------ agreement
def chain_moments(draws: torch.Tensor, mean: torch.Tensor):
    """Per-chain time averages of theta and of (theta - mean)^2: ``[C, D]`` each (chains are independent)."""
    return draws.mean(0), ((draws - mean) ** 2).mean(0)


def check(chains: int = 128, steps: int = 1500, burnin: int = 300, z: float = 5.0) -> dict:
    """Assert equal stationary moments on the conjugate model; returns them."""
    lp, mean, A = conjugate()
    theta0 = mean + 0.1 * torch.randn(chains, mean.shape[0], generator=torch.Generator().manual_seed(0), dtype=DT)
    eig = torch.linalg.eigvalsh(A)
    h_sgld = 0.1 / float(eig.max())                    # our SGLD step: 5% of the stability limit
    h_sghmc, friction = 0.1 / float(eig.max()), 0.5
    exact = {"sgld": stationary_cov("sgld", A, h_sgld / 2),
             "sghmc_ours": stationary_cov("sghmc_ours", A, h_sghmc, friction),
             "sghmc_posteriors": stationary_cov("sghmc_posteriors", A, h_sghmc ** 0.5, friction / h_sghmc ** 0.5)}
    runs = {"sgld_ours": ours("sgld", lp, theta0, steps, h_sgld),
            "sgld_posteriors": peer("sgld", lp, theta0, steps, h_sgld),
            "sghmc_ours": ours("sghmc", lp, theta0, steps, h_sghmc, friction),
            "sghmc_posteriors": peer("sghmc", lp, theta0, steps, h_sghmc, friction)}
    out = {"posterior_var": torch.linalg.inv(A).diagonal(), "exact": {k: v.diagonal() for k, v in exact.items()}}
    for name, draws in runs.items():
        m, v = chain_moments(draws[burnin:], mean)
        target = exact["sgld" if name.startswith("sgld") else name].diagonal()
        se_m, se_v = m.std(0) / chains ** 0.5, v.std(0) / chains ** 0.5
        assert ((m.mean(0) - mean).abs() < z * se_m).all(), f"{name}: stationary mean off"
        assert ((v.mean(0) - target).abs() < z * se_v).all(), (f"{name}: stationary variance {v.mean(0)} "
                                                               f"is not its discretisation's {target}")
        out[name] = {"mean": m.mean(0), "var": v.mean(0), "se_var": se_v}
    # both SGHMCs have the posterior mean (checked above); the two SGLDs are one recursion, so their variances agree with each other within the sampling error
    a, b = out["sgld_ours"], out["sgld_posteriors"]
    assert ((a["var"] - b["var"]).abs() < z * (a["se_var"] ** 2 + b["se_var"] ** 2).sqrt()).all()
    return out


# ------------------------------------------------------------------ timing
def per_step(fn, steps: int) -> float:
    fn(2)                                          # warm-up
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        fn(steps)
        best = min(best, time.perf_counter() - t0)
    return best / steps


def main(chains: int = 256, steps: int = 200) -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)      # tensordict's notice, raised inside posteriors
    moments = check()
    print("name, ours, peer, ratio")
    post = moments["posterior_var"]
    bias = {k: float((v / post - 1).abs().max()) for k, v in moments["exact"].items()}
    print(f"sgmcmc_sgld stationary variance error vs posterior (same step), {bias['sgld']:.4f}, {bias['sgld']:.4f}, -")
    print(f"sgmcmc_sghmc stationary variance error vs posterior (same step and friction), {bias['sghmc_ours']:.4f}, "
          f"{bias['sghmc_posteriors']:.4f}, -")
    lp, mean, A = conjugate()
    theta0 = mean + torch.zeros(chains, mean.shape[0], dtype=DT)
    h = 0.1 / float(torch.linalg.eigvalsh(A).max())
    for kind in ("sgld", "sghmc"):
        t_ours = per_step(lambda s: ours(kind, lp, theta0, s, h), steps)
        t_peer = per_step(lambda s: peer(kind, lp, theta0, s, h), steps)
        print(f"sgmcmc_{kind}_conjugate {chains} chains, {t_ours:.6f}, {t_peer:.6f}, {t_peer / t_ours:.1f}")
    # the breast-cancer BNN (30-16-16-2), 32 chains, minibatches of 64 (one per chain), float32
    from wsbook.experiments import tasks

    task = tasks.get_task("breast_cancer")
    bnn = task.log_posterior()
    C, n = 32, 64
    theta0 = bnn.init(C, generator=torch.Generator().manual_seed(0))
    h = 0.5 / bnn.n_data
    gen = torch.Generator().manual_seed(3)
    index = [torch.randint(0, bnn.n_data, (C, n), generator=gen) for _ in range(8)]

    def batches(k):
        idx = index[k % len(index)]
        return bnn.x[idx], bnn.y[idx]

    for kind in ("sgld", "sghmc"):
        t_ours = per_step(lambda s: ours(kind, bnn, theta0, s, h, batch_size=n), steps // 2)
        t_peer = per_step(lambda s: peer(kind, bnn, theta0, s, h, batches=batches), steps // 2)
        print(f"sgmcmc_{kind}_bnn breast cancer {C} chains batch {n}, {t_ours:.6f}, {t_peer:.6f}, {t_peer / t_ours:.1f}")


if __name__ == "__main__":
    main()
