"""Tests of the posterior-flow experiments (chapter 8, flows as posterior samplers) that need no HMC run."""
import math

import pytest
import torch

from wsbook.experiments import posterior_flows as pf
from wsbook.nets import MLPSpec
from wsbook.weightflow import EuclideanChart, FlatField, WeightFlow


def test_auroc_orders_and_ties():
    pos = torch.tensor([3.0, 4.0, 5.0])
    assert pf.auroc(pos, torch.tensor([0.0, 1.0, 2.0])) == 1.0
    assert pf.auroc(pos, torch.tensor([6.0, 7.0])) == 0.0
    assert pf.auroc(pos, pos.clone()) == 0.5
    # a NaN score counts as the lowest score, not as an error
    assert pf.auroc(pos, torch.tensor([math.nan])) == 1.0


def test_bad_arguments_are_rejected_before_work():
    with pytest.raises(ValueError, match="unknown posterior flow"):
        pf.train_posterior_flow("breast_cancer", "normalized flow")
    with pytest.raises(ValueError, match="not among"):
        pf.detection_table(sets={"a": torch.zeros(2, 3)}, positive="held-out HMC draws")
    with pytest.raises(ValueError, match="at least 2"):
        pf.importance_sampling(n=1)
    with pytest.raises(ValueError, match="proposal must be one of"):
        pf.importance_sampling(proposal="laplace")


def test_flow_settings_choose_a_known_field():
    st = pf.flow_settings()
    assert st.field in ("flat", "gnn") and st.steps > 0 and st.n_probes >= 1
    kl = pf.kl_settings()
    assert kl.steps > 0 and kl.batch_size > 1 and kl.solver_steps >= 4 and 0 < kl.ema_decay < 1
    spec = MLPSpec((3, 4, 2))
    assert isinstance(pf.posterior_field(spec, st), torch.nn.Module)


def test_sample_flow_returns_networks_points_and_time():
    spec = MLPSpec((3, 4, 2))
    flow = WeightFlow(EuclideanChart(spec, sigma=1.0), FlatField(spec, hidden=16, depth=2))
    theta, points, seconds = pf.sample_flow(flow, 5, torch.Generator().manual_seed(0), steps=4)
    assert theta.shape == points.shape == (5, spec.n_params) and seconds >= 0
    assert torch.allclose(theta, points)          # the Euclidean chart without reference is the identity


def test_gaussian_fits_match_the_draws_moments_and_keep_the_chains_apart(monkeypatch):
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(0)
    k, s, d = 3, 400, 5
    centres = torch.tensor([[-10.0], [0.0], [10.0]]).expand(k, d)             # one mode per chain
    scale = torch.tensor([1.0, 0.5, 0.2, 0.2, 0.1])
    draws = centres[None] + scale * torch.randn(s, k, d, generator=g)          # [S, K, D]
    fake = SimpleNamespace(theta=draws.reshape(-1, d), n_chains=k)             # draw-major rows
    monkeypatch.setattr(pf.targets, "hmc_reference", lambda task, seed: fake)
    fits = pf.gaussian_fits("any", 3000, torch.Generator().manual_seed(1))
    one, mix = fits["gaussian fit"][0], fits["per-chain gaussians"][0]
    assert one.shape == mix.shape == (3000, d)
    assert torch.allclose(one.mean(0), fake.theta.mean(0), atol=0.5)
    assert torch.allclose(one.std(0), fake.theta.std(0), rtol=0.1)
    # the mixture puts a third of its draws near every chain's mode, none in between
    nearest = (mix[:, :1] - centres[None, :, 0]).abs().argmin(1)
    assert torch.bincount(nearest, minlength=k).tolist() == [1000, 1000, 1000]
    assert torch.allclose(mix[nearest == 2].std(0), scale, rtol=0.1, atol=0.01)
    assert (one[:, 0].abs() < 3).float().mean() > 0.2                           # one Gaussian fills the gaps


def test_vi_posterior_is_the_fit_behind_the_cached_vi_run():
    from wsbook.experiments import tasks

    t = tasks.get_task("breast_cancer")
    gen = tasks._method_generator(t, "vi", 0)
    q = tasks._fit_vi(t, gen)
    assert torch.equal(q.sample(8, gen).samples, tasks.posterior_run("breast_cancer", "vi", 8)["theta"])
    assert torch.equal(tasks.vi_posterior("breast_cancer").std, q.std)


def _tiny_flow(seed: int = 0) -> WeightFlow:
    """A flow on networks of 13 weights whose field (its sampling EMA) has random, far from zero weights."""
    spec = MLPSpec((2, 3, 1))
    flow = WeightFlow(EuclideanChart(spec, sigma=1.0), FlatField(spec, hidden=16, depth=2))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in flow.ema.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return flow


def test_the_exact_divergence_is_the_trace_of_the_jacobian():
    from wsbook.flows.likelihood import divergence

    flow = _tiny_flow()
    x = torch.randn(5, flow.chart.dim, generator=torch.Generator().manual_seed(1))
    fn = lambda z: flow.velocity(0.3, z)
    for chunk in (1, 4, 256):                          # batches of unit vectors that do and do not divide D
        v, div = divergence(fn, x, "exact", chunk=chunk)
        assert torch.allclose(v, fn(x).detach())
        for i in range(x.shape[0]):
            jac = torch.autograd.functional.jacobian(lambda z: fn(z[None])[0], x[i])
            assert div[i].item() == pytest.approx(float(jac.trace()), rel=1e-4, abs=1e-4)


def test_flow_with_log_q_is_the_change_of_variables_of_the_solver_map():
    """The log-density carried along the path (exact trace) equals the source log-density minus the log
    Jacobian determinant of the map from source to sample, computed by brute force through the same fine
    solver; a coarse Euler path (the density flows' training solver) misses it."""
    flow = _tiny_flow()
    x0 = flow.chart.sample_source(2, torch.Generator().manual_seed(2))
    x1, log_q = pf.flow_with_log_q(flow, x0, 32, "rk4")
    assert torch.allclose(x1, flow.integrate(x0, steps=32, method="rk4").x, atol=1e-5)
    for i in range(x0.shape[0]):
        jac = torch.autograd.functional.jacobian(lambda z: _rk4_positions(flow, z, 32), x0[i])
        brute = flow.chart.source_log_prob(x0[i:i + 1])[0] - torch.linalg.slogdet(jac.double())[1]
        assert log_q[i].item() == pytest.approx(float(brute), abs=5e-3)       # float32 solves
    # doubling the steps changes nothing any more; two Euler steps are off
    log_q_fine = pf.flow_with_log_q(flow, x0, 64, "rk4")[1]
    assert torch.allclose(log_q, log_q_fine, atol=5e-3)
    log_q_euler = pf.flow_with_log_q(flow, x0, 2, "euler")[1]
    assert (log_q_euler - log_q).abs().max() > 5e-2
    # Hutchinson's probes, each held along its sample's path: the same points, one unbiased estimate per
    # probe whose mean over many probes comes within 4 standard errors of the exact trace's log q
    from wsbook.flows.likelihood import rademacher

    probes = rademacher((2000, *x0.shape), torch.Generator().manual_seed(4))
    x1_h, log_q_h = pf.flow_with_log_q(flow, x0, 32, "rk4", probes=probes)
    assert torch.equal(x1_h, x1) and log_q_h.shape == (2000, 2)
    assert log_q_h.std(0).min() > 0                                          # the probes do add noise
    se = log_q_h.std(0) / math.sqrt(probes.shape[0])
    assert ((log_q_h.mean(0) - log_q).abs() <= 4 * se + 1e-4).all(), (log_q_h.mean(0), log_q, se)
    with pytest.raises(ValueError, match="probes must have shape"):
        pf.flow_with_log_q(flow, x0, 4, probes=probes[:, :1])
    with pytest.raises(ValueError, match="method"):
        pf.flow_with_log_q(flow, x0, 4, "midpoint")
    with pytest.raises(ValueError, match="steps"):
        pf.flow_with_log_q(flow, x0, 0)


def _rk4_positions(flow: WeightFlow, x: torch.Tensor, steps: int) -> torch.Tensor:
    """One point ``x [D]`` carried to t = 1 by ``steps`` RK4 steps of the flow's field, differentiably."""
    h, y = 1.0 / steps, x[None]
    v = lambda t, z: flow.velocity(t, z)
    for k in range(steps):
        t = k * h
        k1 = v(t, y)
        k2 = v(t + h / 2, y + h / 2 * k1)
        k3 = v(t + h / 2, y + h / 2 * k2)
        k4 = v(t + h, y + h * k3)
        y = y + h * (k1 + 2 * k2 + 2 * k3 + k4) / 6
    return y[0]


def test_elbos_average_over_seeds_and_compare_the_solvers(monkeypatch):
    """Each flow's bound is the mean over seeds of its samples' mean log-weight at the finest RK4 steps, with
    the standard error over seeds; the change on doubling and the Euler solver's excess are paired per seed.
    VI's is the bound of its fitted Gaussian, far above that of the prior it starts from."""
    from wsbook.bayes.vi import gaussian_entropy
    from wsbook.experiments import tasks

    es = pf.ELBOSettings(n=2, steps=(4, 8), euler_steps=8, vi_samples=256)
    fine = {0: torch.tensor([-10.0, -12.0]), 1: torch.tensor([-14.0, -16.0])}         # seed means -11, -15

    # each sample's probe variance: seed 0 [1, 3] (se sqrt(4) / 2 samples = 1), seed 1 none: probe_se 0.5
    probe_var = {0: torch.tensor([1.0, 3.0]), 1: torch.zeros(2)}

    def fake(task, name, recipe, settings, seed):
        f = fine[seed] + (0.0 if name == "euclidean flow" else 100.0)
        return {k: {"log_w": f + shift, "probe_var": probe_var[seed], "seconds": sec}
                for k, shift, sec in (("euler 8", 5.0, 1.0), ("rk4 4", -1.0, 1.0), ("rk4 8", 0.0, 2.0))}

    monkeypatch.setattr(pf, "_elbo_samples", fake)
    q0 = tasks.vi_posterior("breast_cancer")                   # one fit stands for every seed's
    monkeypatch.setattr(tasks, "vi_posterior", lambda task, seed=0: q0)
    out = pf.elbos("breast_cancer", seeds=(0, 1), settings=es)
    draws = out.loc["flow (draws)"]
    assert draws["elbo"] == pytest.approx(-13.0) and draws["se"] == pytest.approx(2.0)
    assert draws["doubling"] == pytest.approx(1.0) and draws["doubling_se"] == pytest.approx(0.0)
    assert draws["euler_gap"] == pytest.approx(5.0) and draws["euler"] == pytest.approx(-8.0)
    assert draws["within_se"] == pytest.approx(1.0)                    # std sqrt(2) over sqrt(2 samples)
    assert draws["probe_se"] == pytest.approx(0.5)
    assert out.loc["flow (reverse KL)", "elbo"] == pytest.approx(87.0)
    assert out.attrs["seconds"] == pytest.approx(3 * 2 * 4.0)
    t = tasks.get_task("breast_cancer")
    prior = float(t.prior_std) * torch.randn(256, t.spec.n_params, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        prior_elbo = float(t.log_posterior()(prior).mean()) + float(
            gaussian_entropy(torch.full((t.spec.n_params,), float(t.prior_std))))
    vi = out.loc["mean-field VI"]
    assert vi["within_se"] > 0 and vi["elbo"] > prior_elbo + 10 * vi["within_se"], (vi, prior_elbo)
    assert math.isnan(vi["euler_gap"])
    with pytest.raises(ValueError, match="2 seeds"):
        pf.elbos("breast_cancer", seeds=(0,), settings=es)
    with pytest.raises(ValueError, match="probes"):                    # one probe cannot measure its noise
        pf.elbos("breast_cancer", seeds=(0, 1), settings=pf.ELBOSettings(2, (4, 8), 8, 256, probes=1))


def test_joint_flow_starts_at_a_vi_mixture_and_trains_on_draws_and_density(monkeypatch):
    """The joint flow's source is the equal mixture of K mean-field VI fits and its field starts at zero, so
    its first reverse-KL estimates are the mixture's negative ELBO; the draws (aligned to the nearest fit's
    mean) get a second loss column."""
    from types import SimpleNamespace

    from wsbook.experiments import tasks

    t = tasks.get_task("breast_cancer")
    q = tasks.vi_posterior("breast_cancer", members=2)
    assert q.n_members == 2 and not torch.allclose(q.mean[0], q.mean[1])
    draws = q.sample(64, torch.Generator().manual_seed(1)).samples
    monkeypatch.setattr(pf.targets, "hmc_reference", lambda task, seed: SimpleNamespace(theta=draws))
    monkeypatch.setattr(pf, "joint_settings", lambda: pf.JointSettings(2, 1, 1e-12, 2, 1e-12, 256, 0.9, 4, 1.0))
    flow, seconds, losses = pf.train_posterior_flow("breast_cancer", pf.DENSITY_FLOWS[0])
    assert losses.shape == (2, 2) and torch.isfinite(losses).all() and seconds > 0
    assert flow.chart.n_components == 2
    assert torch.equal(flow.chart.loc, q.mean) and torch.equal(flow.chart.sigma, q.std)
    x = flow.chart.sample_source(256, torch.Generator().manual_seed(2))
    with torch.no_grad():
        log_w = t.log_posterior()(x) - flow.chart.source_log_prob(x)
    se = float(log_w.std()) / 16
    assert abs(float(losses[0, 0]) + float(log_w.mean())) < 6 * se, (losses[0], log_w.mean(), se)
    # every draw, aligned to the nearer of the two means, is at least as near it as to either mean unaligned
    aligned = flow.chart.to_points(draws)
    assert (torch.cdist(aligned, q.mean).min(1).values <= torch.cdist(draws, q.mean).min(1).values + 1e-4).all()


def test_joint_field_is_zero_for_both_kinds_and_refuses_others():
    from dataclasses import replace

    from wsbook.experiments import tasks

    spec = tasks.get_task("breast_cancer").spec
    joint = pf.JointSettings(2, 1, 1e-3, 1, 1e-3, 8, 0.9, 4, 1.0)
    t, x = torch.rand(3), torch.randn(3, spec.n_params, generator=torch.Generator().manual_seed(0))
    for kind in ("neuron", "flat"):
        field = pf.joint_field(spec, replace(joint, field=kind))
        assert torch.equal(field(t, x), torch.zeros_like(x)), kind
    with pytest.raises(ValueError, match="'neuron' or 'flat'"):
        pf.joint_field(spec, replace(joint, field="gnn"))


def test_repeated_distances_tell_a_close_sampler_from_a_shifted_one(monkeypatch):
    """Sets of a sampler of the held-out run's own distribution sit at MMD^2 ~ 0; a shifted one far above it,
    by many standard errors; the summary's standard error is the std over sets over sqrt(sets)."""
    from types import SimpleNamespace

    n_test, c = 20, 2

    def probs(m, shift, g):
        p = torch.sigmoid(torch.randn(m, n_test, generator=g) + shift)
        return torch.stack([p, 1 - p], -1)

    refs = {s: SimpleNamespace(probs=probs(400, 0.0, torch.Generator().manual_seed(10 + s)), spec=None)
            for s in (0, 1)}
    monkeypatch.setattr(pf.targets, "hmc_reference", lambda task, seed: refs[seed])
    monkeypatch.setattr(pf.targets, "predictive_probs", lambda spec, theta, x: theta)   # "networks" are outputs
    samplers = {"same": lambda n, g: probs(n, 0.0, g), "shifted": lambda n, g: probs(n, 1.5, g)}
    per_set = pf.repeated_distances("breast_cancer", samplers, n=64, repeats=4)
    assert per_set.shape == (8, 2) and list(per_set.index[:2]) == [("same", 0), ("same", 1)]
    s = pf.summarise_repeats(per_set)
    same, shifted = s.loc["same"], s.loc["shifted"]
    assert abs(same[("mmd2_run1", "mean")]) < 0.02
    assert shifted[("mmd2_run1", "mean")] - same[("mmd2_run1", "mean")] > 10 * shifted[("mmd2_run1", "se")]
    assert shifted[("tv_run1", "mean")] > 3 * same[("tv_run1", "mean")]
    assert same[("tv_run1", "se")] == pytest.approx(same[("tv_run1", "std")] / 2)
    with pytest.raises(ValueError, match="at least 2 sets"):
        pf.repeated_distances("breast_cancer", samplers, n=64, repeats=1)


def test_compare_means_needs_more_than_the_noise():
    import pandas as pd

    cols = pd.MultiIndex.from_tuples([("tv", "mean"), ("tv", "se")])
    s = pd.DataFrame([[1.0, 0.1], [1.5, 0.1], [1.1, 0.1]], index=["a", "b", "c"], columns=cols)
    assert pf.compare_means(s, "a", "b", "tv") == "met"
    assert pf.compare_means(s, "b", "a", "tv") == "missed"
    assert pf.compare_means(s, "a", "c", "tv") == "level"          # 0.1 apart, 0.14 standard error


def test_standing_names_the_rivals_a_distance_beats():
    rivals = {"mean-field VI": 0.02, "Laplace": 0.1}
    assert pf.standing(0.01, rivals) == "closer to HMC than both mean-field VI and Laplace"
    assert pf.standing(0.3, rivals) == "no closer to HMC than both mean-field VI and Laplace"
    assert pf.standing(0.05, rivals) == "closer to HMC than Laplace but not than mean-field VI"
    assert pf.standing(0.1, rivals).startswith("no closer")                       # level with Laplace
    assert pf.standing(0.1, {"a": 0.1}) == "no closer to HMC than a"             # a tie is not closer
    assert pf.standing(0.0, {"a": 1, "b": 2, "c": 3}) == "closer to HMC than each of a, b and c"
    with pytest.raises(ValueError):
        pf.standing(0.1, {})


def test_share_closed_runs_from_the_start_to_the_floor():
    assert pf.share_closed(0.4, 0.4, 0.0) == 0.0
    assert pf.share_closed(0.0, 0.4, 0.0) == 1.0
    assert pf.share_closed(0.3, 0.4, 0.2) == pytest.approx(0.5)
    assert pf.share_closed(0.5, 0.4, 0.2) < 0                                     # beyond the start
    with pytest.raises(ValueError):
        pf.share_closed(0.1, 0.2, 0.2)


def test_hmc_polish_moves_networks_towards_the_posterior(monkeypatch):
    """A transition from the prior raises the posterior density; zero transitions return the start. The
    step size and leapfrog count come from the reference run's diagnostics (faked here: no HMC run)."""
    from types import SimpleNamespace

    from wsbook.experiments.tasks import get_task

    fake = SimpleNamespace(diagnostics={"n_leapfrog": 30, "step_size": 0.005})
    monkeypatch.setattr(pf.targets, "hmc_reference", lambda task, seed: fake)
    lp = get_task("breast_cancer").log_posterior()
    g = torch.Generator().manual_seed(0)
    start = pf.prior_draws("breast_cancer", 8, g)
    assert pf.hmc_polish("breast_cancer", start, 0) is start
    moved = pf.hmc_polish("breast_cancer", start, 2, g)
    assert moved.shape == start.shape and moved.dtype == start.dtype
    with torch.no_grad():
        assert lp(moved).mean() > lp(start).mean() + 10
    with pytest.raises(ValueError, match="trajectories"):
        pf.hmc_polish("breast_cancer", start, -1)


def test_posterior_terms_split_the_log_posterior_per_network():
    """The two columns add up to the (untempered) log posterior of every network, one row per network and
    set, and shrinking a network raises its log prior."""
    from wsbook.experiments.tasks import get_task

    lp = get_task("breast_cancer").log_posterior()
    g = torch.Generator().manual_seed(0)
    prior = pf.prior_draws("breast_cancer", 5, g)
    terms = pf.posterior_terms("breast_cancer", {"prior": prior, "scaled": 0.5 * prior[:3]})
    assert list(terms["set"]) == ["prior"] * 5 + ["scaled"] * 3
    with torch.no_grad():
        total = lp(prior).double()
        shrunk_prior = lp.log_prior(0.5 * prior[:3]).double()
    assert torch.allclose(torch.tensor(terms["log_likelihood"][:5] + terms["log_prior"][:5]), total, rtol=1e-5)
    assert torch.allclose(torch.tensor(terms["log_prior"][5:].to_numpy()), shrunk_prior)
    # a smaller network sits higher under the zero-mean prior
    assert (terms["log_prior"][5:].to_numpy() > terms["log_prior"][:3].to_numpy()).all()


def test_sample_flow_without_a_generator_draws_from_the_books_seed(monkeypatch):
    """No private seed: the default source draws come from ``config.generator()`` (``WSBOOK_SEED``)."""
    spec = MLPSpec((3, 4, 2))
    flow = WeightFlow(EuclideanChart(spec, sigma=1.0), FlatField(spec, hidden=16, depth=2))

    def draw(seed, generator=None):
        monkeypatch.setenv("WSBOOK_SEED", str(seed))
        return pf.sample_flow(flow, 5, generator, steps=2)[0]

    assert torch.equal(draw(0), draw(0))
    assert torch.equal(draw(0), draw(7, torch.Generator().manual_seed(0)))
    assert not torch.equal(draw(1), draw(0))


def test_posterior_verdict_chooses_on_validation_and_reads_the_test_run_only_in_the_report(monkeypatch, tmp_path):
    """The protocol on fake runs, flows and VI ("networks" are their own test outputs): the choice reads the
    validation run only (the test run raises anywhere but inside protocol.final_report), the chosen flow
    is the candidate nearest the validation run, every row of the verdict has one value per fresh seed, a
    flow at the test run's own distribution beats VI, and a chosen guided flow brings its control row."""
    from types import SimpleNamespace

    from wsbook.experiments import protocol, tasks

    n_test = 20

    def outputs(m, shift, g):
        p = torch.sigmoid(torch.randn(m, n_test, generator=g) + shift)
        return torch.stack([p, 1 - p], -1)

    class Run(SimpleNamespace):
        @property
        def probs(self):
            if self.sealed and not protocol._TEST_OPEN.get():
                raise AssertionError("the test run was read outside the final report")
            return self.values

    test = pf.HMC_RUNS["test"]
    runs = {s: Run(values=outputs(400, 0.0, torch.Generator().manual_seed(10 + s)), sealed=s == test, spec=None,
                   theta=outputs(400, 0.0, torch.Generator().manual_seed(20 + s)))
            for s in pf.HMC_RUNS.values()}
    opened = []
    monkeypatch.setattr(pf.targets, "hmc_reference", lambda task, seed: opened.append(seed) or runs[seed])
    monkeypatch.setattr(pf.targets, "predictive_probs", lambda spec, theta, x: theta)

    sampled = []

    def sampler(shift, guide=None):
        def draw(m, g):
            sampled.append(m)
            return outputs(m, shift, g)
        return SimpleNamespace(draw=draw, source=lambda m, g: outputs(m, 3.0, g), guide=guide,
                               control=lambda m, g: outputs(m, 2.0, g))

    # "good" is nearest the runs, "vi-like" is VI's twin, "far" is farther than VI
    shifts = {"far": 1.5, "good": 0.05, "vi-like": 0.4}
    monkeypatch.setattr(pf, "candidates", lambda task="breast_cancer": {k: (lambda s, v=v: sampler(v))
                                                                        for k, v in shifts.items()})
    vi = SimpleNamespace(sample=lambda m, g: SimpleNamespace(samples=outputs(m, 0.4, g)))
    monkeypatch.setattr(tasks, "vi_posterior", lambda task, seed=0, members=1: vi)
    monkeypatch.setattr(pf, "gaussian_fits", lambda task, m, g: {pf.MIXTURE_ROW: (outputs(m, 0.2, g), 0.0)})

    validation = pf.validation_scores(n=32, repeats=3)
    assert test not in opened and pf.select_flow(validation) == "good"  # the choice never looked at the test run
    assert {pf.vi_row(s) for s in protocol.SEEDS} < set(validation.index)   # VI's yardstick: the verdict's fits
    with pytest.raises(AssertionError, match="outside the final report"):
        runs[test].probs                                                 # selection code that peeks fails
    sampled.clear()
    monkeypatch.setattr(pf, "repeat_count", lambda: 4)
    table = pf.verdict_table(n=64)
    # validation: 4 sets of each of 3 candidates; test: each seed's score is the mean over its own 4 sets
    assert len(sampled) == 4 * 3 + 4 * len(protocol.SEEDS)
    assert table.attrs["selected"] == "good" and test in opened
    assert set(table.index) == {pf.HMC_ROW, "good", pf.FLOW_SOURCE_ROW, pf.VI_ROW, pf.MIXTURE_ROW}
    assert (table["seeds"] == len(protocol.SEEDS)).all()
    assert table.loc["good", "TV vs VI"] == "met" and table.loc["good", "MMD² vs VI"] == "met"
    assert table.loc[pf.FLOW_SOURCE_ROW, "MMD² vs VI"] == "missed" and table.attrs["goal"] == "met"
    assert table.loc[pf.VI_ROW, "TV vs VI"] == "—"

    # a guided candidate chosen: its control (prior draws under the same guidance) is a row with verdicts (the
    # fake candidates are not in the cache keys, which name the recipes: a cache of their own)
    monkeypatch.setenv("WSBOOK_CACHE_DIR", str(tmp_path / "guided"))
    monkeypatch.setattr(pf, "candidates", lambda task="breast_cancer": {
        "guided": lambda s: sampler(0.05, guide="a guide"), "far": lambda s: sampler(1.5)})
    table = pf.verdict_table(n=64, seeds=(5, 6, 7))
    assert table.attrs["selected"] == "guided" and pf.GUIDANCE_CONTROL_ROW in table.index
    assert table.loc[pf.GUIDANCE_CONTROL_ROW, "MMD² vs VI"] == "missed"


def test_the_posterior_choice_is_the_widest_margin_over_vi_in_the_narrower_measure():
    """select_flow: a candidate far ahead of VI in MMD² but barely ahead in TV loses to one clearly ahead in
    both; a candidate behind VI in either measure is never preferred to one ahead in both; VI's distances are
    the mean over its fits, not one fit's."""
    import pandas as pd

    def table(means):
        return pd.DataFrame({(col, "mean"): [v[i] for v in means.values()]
                             for i, col in enumerate(("tv_run1", "mmd2_run1"))}, index=list(means))

    vi = {pf.vi_row(1): (0.030, 0.010), pf.vi_row(2): (0.010, 0.018)}          # mean (0.020, 0.014)
    means = {"mmd-only": (0.019, 0.008), "both": (0.015, 0.011), "tv-only": (0.010, 0.016)}
    validation = table(vi | means)
    assert pf.select_flow(validation) == "both"
    assert pf.select_flow(validation.drop("both")) == "mmd-only"
    # the first fit alone, far from HMC in TV, would make "mmd-only" look safe in both measures
    assert pf.select_flow(table({pf.vi_row(1): vi[pf.vi_row(1)]} | means)) == "mmd-only"
    with pytest.raises(ValueError, match="no VI rows"):
        pf.select_flow(table(means))


def test_off_chart_marks_networks_with_a_neuron_without_direction():
    spec = MLPSpec((3, 4, 4, 2))
    theta = torch.randn(3, spec.n_params, generator=torch.Generator().manual_seed(0))
    w, b = spec.slices(1)
    theta[1, w.start + 4:w.start + 8] = 0.0        # the second neuron of the second hidden layer ...
    theta[1, b.start + 1] = 0.0                    # ... and its bias
    assert pf.off_chart(spec, theta).tolist() == [False, True, False]
    theta[2, w.start:w.start + 4] = 1e-3           # small, not zero: still a direction
    assert pf.off_chart(spec, theta).tolist() == [False, True, False]
