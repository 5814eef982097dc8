"""wsbook's GGN Laplace against laplace-torch on chapter 2's breast-cancer MAP network.

The same MAP network (MLP 30-16-16-2, trained as chapter 2 trains the Laplace run's MAP), the same data,
the same prior precision; float64. Ours: ``wsbook.bayes.fit_laplace`` (a one-value grid fixes the prior
precision). laplace-torch: ``Laplace(model, "classification", subset_of_weights="all",
hessian_structure=kind)`` on ``spec.to_module(theta)`` (its default curvature backend), fitted on one
full-batch loader. For ``kind`` in full and diag, agreement to 1e-4 relative: the log marginal likelihood,
and the linearised (GLM) predictive on the test set, that is the mean ``f(x, theta*)`` and covariance
``J(x) Sigma J(x)^T`` of the network outputs, which define it. Timing: fit (curvature, its factorisation
and the log marginal likelihood) and predict (GLM predictive probabilities, 100 Monte Carlo samples of
the linearised outputs, on the test set).

``python benchmarks/bench_peer_laplace.py --investigate`` also answers why chapter 2's Laplace predictive is
the farthest from HMC (see :func:`investigate`).

Prints ``name, ours, peer, ratio`` lines (seconds; ratio = peer / ours, > 1 means wsbook is faster).
"""
from __future__ import annotations

import os
import sys
import time
import zlib

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from wsbook import bayes  # noqa: E402
from wsbook.bayes.laplace import jacobian  # noqa: E402
from wsbook.experiments import tasks  # noqa: E402

DT = torch.float64
TOL = 1e-4


def map_network(steps: int | None = None, seed: int = 0) -> torch.Tensor:
    """The MAP network of chapter 2's Laplace run (``tasks.posterior_run("breast_cancer", "laplace", ...)``):
    the same generator, optimiser settings and steps (the scale's, unless ``steps`` is given). ``[1, D]``."""
    task = tasks.get_task("breast_cancer")
    cfg = tasks.settings("laplace")
    gen = torch.Generator().manual_seed(seed * 1000 + zlib.crc32(f"{task.name}/laplace".encode()) % 1000)
    return bayes.deep_ensemble(task.log_posterior(), 1, steps=steps or cfg["steps"], lr=cfg["lr"],
                               batch_size=task.batch_size, generator=gen).theta


def ours(lp, theta: torch.Tensor, kind: str, delta: float | None):
    """Our Laplace approximation at ``theta`` with prior precision ``delta`` (``None``: tuned by the evidence)."""
    grid = None if delta is None else torch.tensor([delta], dtype=DT)
    return bayes.fit_laplace(lp, theta, kind=kind, grid=grid)


def ours_glm(la, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean ``[N, C]`` and covariance ``[N, C, C]`` of our linearised outputs at ``x``."""
    with torch.no_grad():
        f_mu = la.spec.forward(la.mean, x)[0]
    J = jacobian(la.spec, la.mean, x)[0]                                     # [N, C, D]
    cov = la.covariance()[0]
    if la.kind == "full":
        return f_mu, torch.einsum("ncd,de,nke->nck", J, cov, J)
    return f_mu, torch.einsum("ncd,d,nkd->nck", J, cov, J)


def peer(lp, theta: torch.Tensor, kind: str, delta: float):
    """laplace-torch's Laplace approximation of the same network and posterior."""
    from laplace import Laplace
    from torch.utils.data import DataLoader, TensorDataset

    model = lp.spec.to_module(theta.to(DT))
    loader = DataLoader(TensorDataset(lp.x, lp.y), batch_size=lp.n_data)
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure=kind, prior_precision=delta)
    la.fit(loader)
    return la


def check(kinds=("full", "diag"), steps: int | None = None) -> dict:
    """Assert equal log marginal likelihoods and GLM predictives at our evidence-tuned prior precision."""
    task = tasks.get_task("breast_cancer")
    lp = task.log_posterior(dtype=DT)
    theta = map_network(steps).to(DT)
    x_test = task.data().x_test.to(DT)
    out = {}
    for kind in kinds:
        mine = ours(lp, theta, kind, None)
        delta = float(mine.prior_precision[0])
        theirs = peer(lp, theta, kind, delta)
        lml_o, lml_p = float(mine.log_evidence[0]), float(theirs.log_marginal_likelihood())
        f_mu_o, f_var_o = ours_glm(mine, x_test)
        f_mu_p, f_var_p = theirs._glm_predictive_distribution(x_test)
        errors = {"log_marglik_error": abs(lml_o - lml_p) / abs(lml_p),
                  "f_mean_error": float((f_mu_o - f_mu_p).abs().max() / f_mu_p.abs().max()),
                  "f_cov_error": float((f_var_o - f_var_p).abs().max() / f_var_p.abs().max())}
        for what, err in errors.items():
            assert err < TOL, f"{kind} Laplace: {what} differs from laplace-torch by {err:.2e} (relative)"
        out[kind] = dict(errors, prior_precision=delta, log_marglik=lml_o, log_marglik_peer=lml_p)
    return out


def main() -> None:
    result = check()
    task = tasks.get_task("breast_cancer")
    lp = task.log_posterior(dtype=DT)
    theta = map_network().to(DT)
    x_test = task.data().x_test.to(DT)
    print("name, ours, peer, ratio")
    for kind, r in result.items():
        print(f"laplace_{kind} log marginal likelihood at delta={r['prior_precision']:.3g} (relative difference "
              f"{r['log_marglik_error']:.1e}), {r['log_marglik']:.3f}, {r['log_marglik_peer']:.3f}, -")
        print(f"laplace_{kind} GLM predictive: relative difference of output mean / covariance, "
              f"{r['f_mean_error']:.1e}, {r['f_cov_error']:.1e}, -")
    for kind, r in result.items():
        delta = r["prior_precision"]

        def fit_ours():
            la = ours(lp, theta, kind, delta)
            return la.log_evidence

        def fit_peer():
            la = peer(lp, theta, kind, delta)
            return la.log_marginal_likelihood()

        t_fit_o, t_fit_p = best(fit_ours), best(fit_peer)
        la_o, la_p = ours(lp, theta, kind, delta), peer(lp, theta, kind, delta)
        gen = torch.Generator().manual_seed(0)
        t_pred_o = best(lambda: la_o.predictive(x_test, n=100, generator=gen))
        t_pred_p = best(lambda: la_p(x_test, pred_type="glm", link_approx="mc", n_samples=100))
        print(f"laplace_{kind}_fit (D={lp.spec.n_params}, N={lp.n_data}), {t_fit_o:.4f}, {t_fit_p:.4f}, "
              f"{t_fit_p / t_fit_o:.2f}")
        print(f"laplace_{kind}_glm_predict (N_test={x_test.shape[0]}, 100 samples), {t_pred_o:.4f}, {t_pred_p:.4f}, "
              f"{t_pred_p / t_pred_o:.2f}")


def best(fn, repeats: int = 3) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def investigate(n_samples: int | None = None, n_reference: int | None = None) -> None:
    """Why is chapter 2's Laplace predictive the farthest from HMC? Total variation to the chapter's HMC
    reference (the same cached runs) of: the chapter's Laplace run; the same approximation recomputed
    here and by laplace-torch (exact GLM functional moments, many samples); the MC (not linearised)
    predictive; the prior precision of the posterior HMC samples (delta = 1 / prior_std^2) instead of the
    evidence-tuned one; and the diagonal GGN."""
    import wsbook
    from wsbook.bayes import metrics as M

    task = tasks.get_task("breast_cancer")
    n_samples = n_samples or wsbook.by_scale(ci=32, default=128, full=512)
    n_reference = n_reference or wsbook.by_scale(ci=64, default=256, full=2048)
    lp = task.log_posterior(dtype=DT)
    x_test = task.data().x_test.to(DT)
    p_hmc = tasks.predictive_from_outputs(tasks.posterior_run("breast_cancer", "hmc", n_reference, 1)["f_test"])
    run = tasks.posterior_run("breast_cancer", "laplace", n_samples, 0)
    theta = map_network().to(DT)
    rows = {"chapter 2 laplace run (ours, glm, %d samples)" % n_samples:
            tasks.predictive_from_outputs(run["f_test"])}
    la = ours(lp, theta, "full", None)
    print(f"prior precision: chapter run {run['prior_precision']:.4g}, recomputed {float(la.prior_precision[0]):.4g}")
    gen = torch.Generator().manual_seed(0)
    tuned = float(la.prior_precision[0])
    for kind in ("full", "diag"):
        for delta, label in ((tuned, f"evidence-tuned delta={tuned:.3g}"), (1.0 / task.prior_std ** 2, "delta=1 (HMC's prior)")):
            mine = ours(lp, theta, kind, delta)
            rows[f"ours {kind} {label}, glm 4000 samples"] = mine.predictive(x_test, n=4000, generator=gen)[0].float()
            rows[f"ours {kind} {label}, mc 4000 samples"] = mine.predictive(x_test, n=4000, method="mc", generator=gen)[0].float()
            theirs = peer(lp, theta, kind, delta)
            rows[f"laplace-torch {kind} {label}, glm mc 4000"] = theirs(
                x_test, pred_type="glm", link_approx="mc", n_samples=4000).float()
            rows[f"laplace-torch {kind} {label}, glm probit"] = theirs(x_test, pred_type="glm", link_approx="probit").float()
        theirs = peer(lp, theta, kind, tuned)
        theirs.optimize_prior_precision(method="marglik", pred_type="glm")
        print(f"laplace-torch {kind}: prior precision by its marglik optimiser {float(theirs.prior_precision):.4g} "
              f"(ours, grid over the same objective: {float(ours(lp, theta, kind, None).prior_precision[0]):.4g})")
    y = task.data().y_test
    with torch.no_grad():
        p_map = torch.softmax(task.spec.forward(theta.float(), x_test.float())[0], -1)
    rows["MAP network alone"] = p_map
    for name, p in rows.items():
        print(f"{name}: TV to HMC {float(M.total_variation(p, p_hmc)):.4f}, NLL {float(M.nll(p, y)):.4f}")


if __name__ == "__main__":
    if "--investigate" in sys.argv:
        investigate()
    else:
        main()
