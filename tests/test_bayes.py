"""wsbook.bayes: samplers recover known posteriors, metrics match hand computations, bad input fails clearly."""
from __future__ import annotations

import math

import pytest
import torch

from wsbook import bayes
from wsbook.bayes import metrics as M
from wsbook.nets import MLPSpec



pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def linreg():
    """Bayesian linear regression y = X w + N(0, sigma^2), w ~ N(0, s^2 I): exact Gaussian posterior."""
    g = torch.Generator().manual_seed(1)
    N, d, sigma, s = 40, 3, 0.5, 1.0
    X = torch.randn(N, d, generator=g, dtype=torch.float64)
    y = X @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + sigma * torch.randn(N, generator=g, dtype=torch.float64)
    spec = MLPSpec((d, 1), bias=False)
    lp = bayes.LogPosterior(spec, X, y[:, None], s, "regression", noise_std=sigma)
    precision = X.T @ X / sigma**2 + torch.eye(d, dtype=torch.float64) / s**2
    cov = torch.linalg.inv(precision)
    mean = cov @ X.T @ y / sigma**2
    return dict(spec=spec, lp=lp, mean=mean, cov=cov, X=X, y=y, sigma=sigma, s=s)


def _check_moments(samples: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor, tol_mean: float, tol_std: float):
    sd = cov.diag().sqrt()
    est_mean, est_sd = samples.mean(0), samples.std(0)
    assert ((est_mean - mean).abs() / sd).max() < tol_mean, (est_mean, mean)
    assert ((est_sd / sd) - 1).abs().max() < tol_std, (est_sd, sd)


def test_log_likelihood_matches_analytic_densities():
    g = torch.Generator().manual_seed(0)
    spec = MLPSpec((2, 3))
    theta = spec.init(4, generator=g)
    x = torch.randn(5, 2, generator=g)
    y = torch.randint(0, 3, (5,), generator=g)
    logits = spec.forward(theta, x)
    expected = torch.distributions.Categorical(logits=logits).log_prob(y.expand(4, 5)).sum(1)
    assert torch.allclose(bayes.log_likelihood(spec, theta, x, y), expected, atol=1e-5)
    yr = torch.randn(5, 3, generator=g)
    expected = torch.distributions.Normal(logits, 0.3).log_prob(yr).sum((1, 2))
    assert torch.allclose(bayes.log_likelihood(spec, theta, x, yr, "regression", 0.3), expected, atol=1e-4)
    prior = bayes.GaussianPrior((0.5, 2.0)) if spec.n_layers == 2 else bayes.GaussianPrior(0.5)
    lp = prior.log_prob(spec, theta)
    assert torch.allclose(lp, torch.distributions.Normal(0.0, 0.5).log_prob(theta).sum(1), atol=1e-4)


def test_minibatch_log_posterior_is_unbiased_and_tempered(linreg):
    lp = linreg["lp"]
    theta = torch.randn(3, 3, dtype=torch.float64)
    full = lp.log_likelihood(theta)
    idx = torch.arange(40).view(4, 10)
    per_batch = torch.stack([lp.log_likelihood(theta, idx[k]) for k in range(4)])
    assert torch.allclose(per_batch.mean(0), full)
    cold = bayes.LogPosterior(lp.spec, lp.x, lp.y, 1.0, "regression", noise_std=lp.noise_std, temperature=0.5)
    assert torch.allclose(cold(theta), 2 * lp(theta))


def test_hmc_recovers_conjugate_posterior(linreg):
    r = bayes.hmc(linreg["lp"], torch.zeros(16, 3), n_samples=150, n_warmup=100, n_leapfrog=10, step_size=0.01,
                  generator=torch.Generator().manual_seed(0), progress=False)
    assert r.samples.shape == (150 * 16, 3) and r.samples.dtype == torch.float64    # [n, D], draw-major
    assert r.chain[:16].tolist() == list(range(16)) and r.by_chain().shape == (150, 16, 3)
    assert r.log_prob.shape == (150 * 16,)
    assert 0.6 < r.accept_rate.mean() < 1.0
    _check_moments(r.samples, linreg["mean"], linreg["cov"], tol_mean=0.15, tol_std=0.1)
    assert (bayes.split_rhat(r.by_chain()) < 1.05).all()
    # network evaluated in float32, Hamiltonian and positions in float64
    lp32 = bayes.LogPosterior(linreg["spec"], linreg["X"].float(), linreg["y"][:, None].float(), 1.0, "regression",
                              noise_std=linreg["sigma"])
    r32 = bayes.hmc(lp32, torch.zeros(16, 3), n_samples=100, n_warmup=100, n_leapfrog=10, step_size=0.01,
                    compute_dtype=torch.float32, generator=torch.Generator().manual_seed(0), progress=False)
    assert r32.samples.dtype == torch.float64
    _check_moments(r32.samples, linreg["mean"], linreg["cov"], tol_mean=0.2, tol_std=0.15)


def test_sgld_and_sghmc_recover_conjugate_posterior(linreg):
    g = torch.Generator().manual_seed(0)
    lp = linreg["lp"]
    r = bayes.sgld(lp, torch.zeros(16, 3, dtype=torch.float64), n_samples=400, n_burnin=300, lr=1e-3, thin=2,
                   batch_size=20, schedule="constant", generator=g, progress=False)
    _check_moments(r.samples, linreg["mean"], linreg["cov"], tol_mean=0.25, tol_std=0.2)
    r = bayes.sghmc(lp, torch.zeros(16, 3, dtype=torch.float64), n_samples=400, n_burnin=300, lr=1e-4,
                    friction=0.1, thin=2, generator=g, progress=False)
    _check_moments(r.samples, linreg["mean"], linreg["cov"], tol_mean=0.25, tol_std=0.2)


def test_vi_recovers_a_diagonal_gaussian_posterior():
    # orthogonal design => the exact posterior is a diagonal Gaussian, which mean-field VI can represent exactly
    g = torch.Generator().manual_seed(3)
    N, d, sigma = 64, 4, 0.7
    q, _ = torch.linalg.qr(torch.randn(N, d, generator=g, dtype=torch.float64))
    X = q * torch.tensor([2.0, 4.0, 6.0, 8.0], dtype=torch.float64)
    y = X @ torch.tensor([0.5, -1.0, 0.2, 0.3], dtype=torch.float64) + sigma * torch.randn(N, generator=g,
                                                                                         dtype=torch.float64)
    spec = MLPSpec((d, 1), bias=False)
    lp = bayes.LogPosterior(spec, X, y[:, None], 1.0, "regression", noise_std=sigma)
    prec = (X * X).sum(0) / sigma**2 + 1.0
    mean, sd = (X.T @ y / sigma**2) / prec, prec.rsqrt()
    post = bayes.fit_vi(lp, n_members=3, steps=3000, lr=2e-2, n_mc=8, init_std=0.1, generator=g, progress=False)
    draws = post.sample(7)
    assert post.mean.shape == (3, d) and draws.samples.shape == (7, d) and draws.chain.tolist() == [0, 1, 2] * 2 + [0]
    assert ((post.mean - mean).abs() / sd).max() < 0.2
    assert ((post.std / sd) - 1).abs().max() < 0.1


def test_fit_mean_field_interface():
    from wsbook import data

    ds = data.load("moons")
    spec = MLPSpec((2, 8, 2))
    q = bayes.fit_mean_field(spec, ds.x_train, ds.y_train, n_members=3, steps=50, batch_size=32,
                             generator=torch.Generator().manual_seed(0), progress=False)
    assert q.mean.shape == q.std.shape == (3, spec.n_params)
    assert (q.std > 0).all() and q.sample(4).samples.shape == (4, spec.n_params)
    assert not torch.allclose(q.mean[0], q.mean[1])  # independent inits


def test_laplace_on_linear_regression_is_exact(linreg):
    lp = linreg["lp"]
    fit = bayes.fit_map(lp, torch.zeros(2, 3, dtype=torch.float64), steps=1500, lr=0.05, progress=False)
    assert torch.allclose(fit.theta[0], linreg["mean"], atol=1e-5)
    la = bayes.fit_laplace(lp, fit.theta, tune_prior=False)
    assert torch.allclose(la.covariance()[0], linreg["cov"], atol=1e-10)
    # the Laplace evidence is the exact marginal likelihood log N(y; 0, sigma^2 I + s^2 X X^T) here
    X, y, sigma, s = linreg["X"], linreg["y"], linreg["sigma"], linreg["s"]
    marginal = torch.distributions.MultivariateNormal(torch.zeros(len(y), dtype=torch.float64),
                                                      sigma**2 * torch.eye(len(y), dtype=torch.float64)
                                                      + s**2 * X @ X.T).log_prob(y)
    assert torch.allclose(la.log_evidence[0], marginal, atol=1e-6)
    tuned = bayes.fit_laplace(lp, fit.theta)
    assert tuned.log_evidence[0] >= la.log_evidence[0] - 1e-9
    # the linearized predictive of a linear model is exact
    f = la.glm_function_samples(X[:5], 4000, torch.Generator().manual_seed(0))[0, :, :, 0]
    assert torch.allclose(f.var(0), (X[:5] @ linreg["cov"] * X[:5]).sum(1), rtol=0.1)


@pytest.mark.parametrize("temperature", [0.25, 2.0])
def test_every_method_targets_the_same_tempered_posterior(temperature):
    """Issue 10, item 1: p_T ∝ exp((log prior + log lik) / T) is N(m, T S) for a linear-Gaussian model with
    posterior N(m, S). HMC, Laplace and mean-field VI must all target it (a prior of std 0.4 makes prior and
    likelihood tempering differ by a lot; an orthogonal design makes the exact posterior diagonal, which
    mean-field VI can represent)."""
    g = torch.Generator().manual_seed(11)
    N, d, sigma, s = 30, 3, 0.8, 0.4
    q, _ = torch.linalg.qr(torch.randn(N, d, generator=g, dtype=torch.float64))
    X = q * torch.tensor([1.5, 3.0, 5.0], dtype=torch.float64)
    noise = sigma * torch.randn(N, generator=g, dtype=torch.float64)
    y = X @ torch.tensor([0.7, -0.4, 0.2], dtype=torch.float64) + noise
    spec = MLPSpec((d, 1), bias=False)
    lp = bayes.LogPosterior(spec, X, y[:, None], s, "regression", noise_std=sigma, temperature=temperature)
    prec = (X * X).sum(0) / sigma**2 + 1 / s**2                           # untempered, diagonal
    mean, var = (X.T @ y / sigma**2) / prec, temperature / prec         # the tempered posterior
    sd = var.sqrt()
    fit = bayes.fit_map(lp, torch.zeros(1, d, dtype=torch.float64), steps=800, lr=0.05, progress=False)
    assert torch.allclose(fit.theta[0], mean, atol=1e-6)
    la = bayes.fit_laplace(lp, fit.theta, tune_prior=False)
    torch.testing.assert_close(torch.diagonal(la.covariance()[0]), var, rtol=1e-8, atol=0)
    la_draws = la.sample(4000, torch.Generator().manual_seed(0)).samples
    assert ((la_draws.std(0) / sd) - 1).abs().max() < 0.05
    vi = bayes.fit_vi(lp, n_members=2, steps=2500, lr=2e-2, n_mc=8, init_std=0.1, generator=g, progress=False)
    assert ((vi.mean - mean).abs() / sd).max() < 0.1
    assert ((vi.std / sd) - 1).abs().max() < 0.1
    r = bayes.hmc(lp, torch.zeros(8, d, dtype=torch.float64), n_samples=400, n_warmup=100, n_leapfrog=10,
                  step_size=0.02, generator=torch.Generator().manual_seed(1), progress=False)
    _check_moments(r.samples, mean, torch.diag(var), tol_mean=0.15, tol_std=0.1)


def test_laplace_ggn_full_and_diag_agree_on_the_diagonal():
    g = torch.Generator().manual_seed(0)
    spec = MLPSpec((3, 4, 2))
    theta = spec.init(2, generator=g)
    x = torch.randn(7, 3, generator=g)
    full, diag = bayes.ggn(spec, theta, x, "classification"), bayes.ggn(spec, theta, x, "classification", kind="diag")
    assert torch.allclose(torch.diagonal(full, dim1=1, dim2=2), diag, atol=1e-6)
    assert torch.linalg.eigvalsh(full).min() > -1e-5  # positive semi-definite


@pytest.mark.parametrize("kind", ["full", "diag"])
def test_laplace_glm_predictive_samples_each_input_from_its_output_gaussian(kind):
    """The GLM predictive draws each input's outputs from N(f0, J Σ Jᵀ) (glm_output_distribution): that
    covariance is J Σ Jᵀ from the posterior covariance, the empirical covariance of whole-function samples
    (glm_function_samples) matches it, and the predictive agrees with the softmax average of those samples."""
    from wsbook.bayes.laplace import jacobian

    g = torch.Generator().manual_seed(0)
    spec = MLPSpec((3, 5, 3))
    x = torch.randn(40, 3, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (40,), generator=g)
    lp = bayes.LogPosterior(spec, x, y, 1.0, "classification")
    theta = spec.init(1, generator=g).double()
    la = bayes.fit_laplace(lp, theta, kind=kind, tune_prior=False)
    f0, cov = la.glm_output_distribution(x[:6])
    J, post = jacobian(spec, la.mean, x[:6])[0], la.covariance()[0]
    expect = (torch.einsum("ncd,de,nke->nck", J, post, J) if kind == "full"
              else torch.einsum("ncd,d,nkd->nck", J, post, J))
    assert f0.shape == (1, 6, 3) and torch.allclose(cov[0], expect, atol=1e-10)
    f = la.glm_function_samples(x[:6], 20_000, torch.Generator().manual_seed(1))[0]      # [n, N, C]
    centred = f - f.mean(0)
    empirical = torch.einsum("snc,snk->nck", centred, centred) / (f.shape[0] - 1)
    assert torch.allclose(empirical, cov[0], atol=0.05 * float(cov.abs().max()))
    p = la.predictive(x[:6], n=20_000, generator=torch.Generator().manual_seed(2))[0]
    assert p.shape == (6, 3) and torch.allclose(p.sum(-1), torch.ones(6, dtype=p.dtype))
    assert (p - torch.softmax(f, -1).mean(0)).abs().max() < 0.01
    with pytest.raises(ValueError, match="positive number"):
        la.predictive(x[:6], n=0)


def test_every_method_returns_draw_major_samples(linreg):
    """[n, D] draw-major with the chain / run / member of each row, for trajectories, Laplace and VI alike."""
    lp, g = linreg["lp"], torch.Generator().manual_seed(4)
    traj = bayes.sgd_trajectory(lp, 3, 2, steps=40, lr=0.05, generator=g, progress=False)
    assert traj.samples.shape == (6, 3) and traj.chain.tolist() == [0, 1, 2, 0, 1, 2]
    assert traj.by_chain().shape == (2, 3, 3) and torch.equal(traj.by_chain()[1, 2], traj.samples[5])
    fit = bayes.fit_map(lp, torch.zeros(2, 3, dtype=torch.float64), steps=300, lr=0.05, progress=False)
    la = bayes.fit_laplace(lp, fit.theta + torch.tensor([[0.0], [5.0]], dtype=torch.float64), tune_prior=False)
    draws = la.sample(5, torch.Generator().manual_seed(0))
    assert draws.samples.shape == (5, 3) and draws.chain.tolist() == [0, 1, 0, 1, 0] and draws.n_chains == 2
    # each row comes from its own member: member 1's mean is shifted by 5
    assert ((draws.samples - la.mean[draws.chain]).abs() < 1.0).all()
    with pytest.raises(ValueError, match="multiple of n_chains"):
        draws.by_chain()


def test_ensemble_members_are_independent_map_solutions():
    from wsbook import data

    ds = data.load("moons")
    lp = bayes.LogPosterior(MLPSpec((2, 16, 2)), ds.x_train, ds.y_train, 1.0)
    res = bayes.deep_ensemble(lp, 4, steps=200, lr=2e-2, generator=torch.Generator().manual_seed(0), progress=False)
    assert (res.loss_history[-1] < res.loss_history[0]).all()
    assert torch.cdist(res.theta, res.theta)[0, 1:].min() > 1.0


# ------------------------------------------------------------------- metrics
def test_ece_of_calibrated_predictions_is_near_zero():
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(200_000, generator=g) * 0.5 + 0.5
    correct = torch.rand(200_000, generator=g) < conf
    y = torch.where(correct, 0, 1)
    p = torch.stack([conf, 1 - conf], -1)
    assert M.ece(p, y) < 0.01
    assert M.ece(p, 1 - y) > 0.4  # and a miscalibrated one is far from zero


def test_agreement_tv_and_nll_by_hand():
    p = torch.tensor([[0.7, 0.3], [0.2, 0.8], [0.5, 0.5]])
    assert M.agreement(p, p) == 1 and M.total_variation(p, p) == 0
    q = torch.tensor([[0.4, 0.6], [0.2, 0.8], [0.9, 0.1]])
    assert math.isclose(float(M.total_variation(p, q)), (0.3 + 0.0 + 0.4) / 3, rel_tol=1e-6)
    y = torch.tensor([0, 1, 1])
    assert math.isclose(float(M.nll(p, y)), -(math.log(0.7) + math.log(0.8) + math.log(0.5)) / 3, rel_tol=1e-6)
    assert torch.allclose(M.pointwise_nll(p, y), -torch.tensor([0.7, 0.8, 0.5]).log())
    assert math.isclose(float(M.rmse(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0]))), math.sqrt(2.0), rel_tol=1e-6)
    # a one-member mixture is a plain Gaussian density
    nll = M.gaussian_nll(torch.tensor([[0.0, 1.0]]), torch.tensor([0.5, 0.5]), 2.0)
    assert math.isclose(float(nll), -float(torch.distributions.Normal(0.0, 2.0).log_prob(torch.tensor(0.5))), rel_tol=1e-6)


def test_gaussian_nll_is_exact_in_float64():
    """Issue 10, item 5: a three-member mixture in float64 matches a float64 reference to 1e-13 (a float32
    constant log B costs about 1e-8)."""
    g = torch.Generator().manual_seed(5)
    means = torch.randn(3, 7, generator=g, dtype=torch.float64)
    y = torch.randn(7, generator=g, dtype=torch.float64)
    out = M.gaussian_nll(means, y, 0.3)
    assert out.dtype == torch.float64
    comp = torch.distributions.Normal(means, torch.tensor(0.3, dtype=torch.float64)).log_prob(y)
    reference = -(torch.logsumexp(comp, 0) - math.log(3)).mean()
    assert abs(float(out - reference)) < 1e-13, float(out - reference)


def test_rhat_and_ess_detect_mixing():
    g = torch.Generator().manual_seed(0)
    iid = torch.randn(400, 4, 3, generator=g)
    assert (bayes.split_rhat(iid) < 1.02).all()
    assert (bayes.ess(iid) > 800).all()
    stuck = iid + torch.tensor([0.0, 0.0, 5.0, 5.0]).view(1, 4, 1)
    assert (bayes.split_rhat(stuck) > 1.5).all()
    ar = torch.zeros(400, 4)
    noise = torch.randn(400, 4, generator=g)
    for t in range(1, 400):
        ar[t] = 0.9 * ar[t - 1] + noise[t]
    assert bayes.ess(ar) < 300


# ----------------------------------------------------------------- bad input
def test_bad_inputs_fail_clearly(linreg):
    lp = linreg["lp"]
    with pytest.raises(ValueError, match=r"\[B, 3\]"):
        lp(torch.zeros(2, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="must map theta"):
        bayes.hmc(lambda t: lp(t).sum(), torch.zeros(2, 3, dtype=torch.float64), n_samples=2, progress=False)
    with pytest.raises(ValueError, match="unknown task"):
        bayes.LogPosterior(lp.spec, lp.x, lp.y, 1.0, "poisson")


def test_non_finite_energy_is_rejected_and_counted():
    def log_post(theta):  # a standard normal that blows up (NaN) for |theta| > 2
        lp = -0.5 * (theta**2).sum(1)
        return torch.where(theta.abs().max(1).values > 2.0, torch.full_like(lp, float("nan")), lp)

    with pytest.warns(RuntimeWarning, match="divergent"):
        r = bayes.hmc(log_post, torch.zeros(8, 2), n_samples=100, n_warmup=0, n_leapfrog=5, step_size=0.8,
                      generator=torch.Generator().manual_seed(0), progress=False)
    assert r.n_divergent.sum() > 0
    assert r.samples.abs().max() <= 2.0  # no NaN state was ever accepted
    assert torch.isfinite(r.log_prob).all()


def test_learned_noise_gaussian_likelihood(linreg):
    lp = linreg["lp"]
    learned = bayes.LogPosterior(lp.spec, lp.x, lp.y, 1.0, "regression", noise_std=1.0, learn_noise=True)
    theta = torch.randn(3, 3, dtype=torch.float64)
    with_noise = torch.cat([theta, torch.full((3, 1), math.log(linreg["sigma"]), dtype=torch.float64)], 1)
    # the likelihood part equals the fixed-noise one at the same sigma
    assert torch.allclose(learned.log_likelihood(with_noise), lp.log_likelihood(theta))
    fit = bayes.fit_map(learned, learned.init(2, dtype=torch.float64), steps=1500, lr=0.05, progress=False)
    sigma_hat = fit.theta[:, -1].exp()
    assert ((sigma_hat - linreg["sigma"]).abs() < 0.15).all(), sigma_hat


def test_predictive_probs_is_one_function_and_its_blocks_change_no_number():
    """The chapters' ``targets.predictive_probs`` is ``bayes.predictive_probs``; blocks of networks and
    chunks of inputs give the probabilities of the whole population at once."""
    from wsbook.experiments import targets

    assert targets.predictive_probs is bayes.predictive_probs is M.predictive_probs
    g = torch.Generator().manual_seed(0)
    spec = MLPSpec((4, 6, 3))
    theta = spec.init(10, generator=g, device="cpu")
    x = torch.randn(40, 4, generator=g)
    whole = torch.softmax(spec.forward(theta, x), -1)
    blocked = M.predictive_probs(spec, theta, x, chunk=7, max_elements=3 * 40 * 6)      # blocks of 3 networks
    assert blocked.shape == (10, 40, 3)
    torch.testing.assert_close(blocked, whole)
    torch.testing.assert_close(M.predictive_probs(spec, theta.double(), x), whole)       # moved to x's dtype
    torch.testing.assert_close(M.predictive_probs(spec, theta[2], x), whole[2:3])        # one [D] network


def test_jacobian_equals_per_input_jacrev():
    # one backward pass per output over per-input copies of the weights: the Jacobian of each member at each input
    from torch.func import jacrev

    from wsbook.bayes.laplace import jacobian
    spec = MLPSpec((5, 7, 6, 3))
    theta = spec.init(2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    J = jacobian(spec, theta, x)
    assert J.shape == (2, 4, 3, spec.n_params)
    for b in range(2):
        for n in range(4):
            ref = jacrev(lambda t: spec.forward(t.unsqueeze(0), x[n:n + 1])[0, 0])(theta[b])
            torch.testing.assert_close(J[b, n], ref, rtol=1e-12, atol=1e-12)


def test_hmc_draws_do_not_depend_on_how_the_forward_views_the_weights(monkeypatch):
    """HMC on a ReLU MLP posterior gives the same draws, bit for bit, with the library's forward (split
    views, in-place ReLU) and with the per-layer slice reference of tests/test_nets.py."""
    from test_nets import _reference_forward
    from wsbook import nets

    g = torch.Generator().manual_seed(0)
    spec = MLPSpec((6, 8, 8, 3))
    x = torch.randn(50, 6, generator=g, dtype=torch.float64)
    lp = bayes.LogPosterior(spec, x, torch.randint(0, 3, (50,), generator=g))
    theta0 = lp.init(6, generator=g, dtype=torch.float64)
    runs = []
    for forward in (nets.MLPSpec.forward, lambda self, t, xx: _reference_forward(self, t, xx)):
        monkeypatch.setattr(nets.MLPSpec, "forward", forward)
        runs.append(bayes.hmc(lp, theta0, n_samples=10, n_warmup=10, n_leapfrog=5, step_size=0.02,
                              generator=torch.Generator().manual_seed(1), progress=False))
    assert torch.equal(runs[0].samples, runs[1].samples) and torch.equal(runs[0].log_prob, runs[1].log_prob)
