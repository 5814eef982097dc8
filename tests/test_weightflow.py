"""Tests of wsbook.weightflow: charts, fields, training, sampling, guidance, likelihood, transfer, errors."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from wsbook import cache
from wsbook.nets import MLPSpec
from wsbook.symmetry import permute, random_permutation
from wsbook.weightflow.variational import fit_reverse_kl
from wsbook.weightflow import (EuclideanChart, chart_from_config, FlatField, GeometricChart, Guidance, NeuronField,
                               NormalizedChart, WeightFlow, gnn_field, make_chart,
                               reference_sample, sample_times, task_gradient)

SPEC = MLPSpec((4, 5, 3, 2))


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def zoo(n: int = 12, spec: MLPSpec = SPEC, seed: int = 0) -> torch.Tensor:
    return spec.init(n, generator=gen(seed), device="cpu")


def _t(t, x):
    t = torch.as_tensor(t, dtype=x.dtype)
    return t.reshape(-1, 1) if t.dim() else t


class GaussianEndpoint(nn.Module):
    """The exact x1-prediction E[x1 | x_t] between N(0, I) and N(m, s^2 I) on the straight path."""

    def __init__(self, m: float = 1.0, s: float = 1.0):
        super().__init__()
        self.m, self.s, self.p = m, s, nn.Parameter(torch.zeros(1))

    def forward(self, t, x):
        t = _t(t, x)
        var = (1 - t) ** 2 + t ** 2 * self.s ** 2
        return self.m + t * self.s ** 2 / var * (x - t * self.m)


class GaussianVelocity(GaussianEndpoint):
    """The same flow as a velocity field, (E[x1 | x_t] - x_t) / (1 - t) written without the division."""

    def forward(self, t, x):
        t = _t(t, x)
        var = (1 - t) ** 2 + t ** 2 * self.s ** 2
        # (m + t s^2 (x - t m)/var - x) / (1 - t) simplifies to (m + (t s^2 - (1 - t)) (x - t m) / var) ...
        return self.m + (t * self.s ** 2 - (1 - t)) * (x - t * self.m) / var


# ------------------------------------------------------------------------------------------- charts
@pytest.mark.parametrize("kind", ["euclidean", "normalized", "geometric"])
def test_round_trip_and_function(kind):
    theta, x = zoo(), torch.randn(30, 4, generator=gen(1))
    chart = make_chart(kind, SPEC)
    points = chart.to_points(theta)
    back = chart.to_weights(points)
    assert back.shape == theta.shape
    out_a, out_b = SPEC.forward(theta, x), SPEC.forward(back, x)
    assert torch.allclose(out_a, out_b, atol=1e-5, rtol=1e-5), "the chart must keep every network's function"
    assert torch.allclose(chart.to_points(back), points, atol=1e-6), "round trip must be exact"
    assert torch.equal(chart.layout(chart.unlayout(theta)), theta)


def test_geometric_points_are_on_spheres_and_sphere_variant_keeps_labels():
    theta, x = zoo(), torch.randn(50, 4, generator=gen(1))
    chart = GeometricChart(SPEC)
    assert bool(chart.manifold.belongs(chart.to_points(theta), atol=1e-5).all())
    variant = GeometricChart(SPEC, last_layer="sphere")
    back = variant.to_weights(variant.to_points(theta))
    assert torch.equal(SPEC.forward(back, x).argmax(-1), SPEC.forward(theta, x).argmax(-1))
    last = variant.to_points(theta)[:, variant.last]
    assert torch.allclose(last.norm(dim=1), torch.ones(len(theta)), atol=1e-5)


def test_euclidean_alignment_to_reference():
    theta = zoo(8)
    perms = random_permutation(SPEC, 8, gen(3))
    shuffled = permute(SPEC, theta[:1].expand(8, -1), perms)
    chart = EuclideanChart(SPEC, reference=theta[0])
    aligned = chart.to_points(shuffled)
    assert torch.allclose(aligned, theta[:1].expand(8, -1), atol=1e-6), "permuted copies align back to the reference"


def test_sources_have_exact_log_densities():
    chart = EuclideanChart(SPEC, sigma=0.3)
    x = chart.sample_source(5, gen())
    ref = torch.distributions.Normal(0.0, 0.3).log_prob(x).sum(1)
    assert torch.allclose(chart.source_log_prob(x), ref, atol=1e-4)
    geo = GeometricChart(SPEC, sigma=0.5)
    p = geo.sample_source(4, gen())
    assert bool(geo.manifold.belongs(p, atol=1e-6).all())
    sphere_part = -(5 * math.log(2 * math.pi ** 2.5 / math.gamma(2.5)) + 3 * math.log(2 * math.pi ** 3 / math.gamma(3)))
    last = p[:, geo.last]
    gauss = torch.distributions.Normal(0.0, 0.5).log_prob(last).sum(1)
    assert torch.allclose(geo.source_log_prob(p), sphere_part + gauss, atol=1e-4)


# ------------------------------------------------------------------------------------- couplings
def test_ot_coupling_is_a_permutation_and_shortens_geodesics():
    chart = GeometricChart(SPEC)
    flow = WeightFlow(chart, gnn_field(SPEC, dim=8, n_layers=1), coupling="ot")
    x0, x1 = chart.sample_source(64, gen(1)), chart.to_points(zoo(64))
    a, b = flow.coupling(x0, x1)
    assert torch.equal(a, x0)
    match = (b[:, None, :] == x1[None, :, :]).all(-1)
    assert bool((match.sum(1) == 1).all()) and bool((match.sum(0) == 1).all()), "OT pairs must be a permutation"
    d_ot, d_ind = chart.manifold.dist(a, b).pow(2).mean(), chart.manifold.dist(x0, x1).pow(2).mean()
    assert d_ot < d_ind


def test_align_pairs_keeps_functions_and_shortens_pairs():
    chart = GeometricChart(SPEC)
    flow = WeightFlow(chart, gnn_field(SPEC, dim=8, n_layers=1), align_pairs=True)
    x0, x1 = chart.sample_source(32, gen(21)), chart.to_points(zoo(32))
    a, b = flow.pair(x0, x1)
    x = torch.randn(20, 4, generator=gen(22))
    assert torch.allclose(SPEC.forward(chart.to_weights(b), x), SPEC.forward(chart.to_weights(x1), x), atol=1e-5)
    assert bool(chart.manifold.belongs(b, atol=1e-5).all())
    assert chart.manifold.dist(a, b).pow(2).mean() < chart.manifold.dist(x0, x1).pow(2).mean()


def test_time_distributions():
    t = sample_times(20000, "beta(1,2)", gen())
    assert abs(t.mean().item() - 1 / 3) < 0.01 and float(t.min()) >= 0 and float(t.max()) <= 1
    with pytest.raises(ValueError, match="distribution"):
        sample_times(3, "gamma")


# ------------------------------------------------------------------------------------ parametrisations
def test_endpoint_and_velocity_agree_on_known_field():
    spec = MLPSpec((3, 2, 2))
    chart = EuclideanChart(spec, sigma=1.0)
    x0 = chart.sample_source(4000, gen(2))
    endpoint = WeightFlow(chart, GaussianEndpoint(1.0, 2.0), parametrization="endpoint")
    velocity = WeightFlow(chart, GaussianVelocity(1.0, 2.0), parametrization="velocity")
    a = endpoint.sample(4000, steps=40, method="midpoint", x0=x0)
    b = velocity.sample(4000, steps=40, method="midpoint", x0=x0)
    assert torch.allclose(a, b, atol=1e-3)
    assert abs(a.mean().item() - 1.0) < 0.03 and abs(a.std(0).mean().item() - 2.0) < 0.05
    # the reference code's sampler, on the exact field between N(0, 1) and N(1, 1), gives std 0.49
    # instead of 1 (METHOD.md sec. 2.1); the correct velocity recovers 1
    unit = WeightFlow(chart, GaussianEndpoint(1.0, 1.0), parametrization="endpoint")
    ref = reference_sample(unit, 4000, steps=200, x0=x0)
    ok = unit.sample(4000, steps=40, method="midpoint", x0=x0)
    assert abs(ref.mean().item() - 1.0) < 0.05 and abs(ref.std(0).mean().item() - 0.49) < 0.03
    assert abs(ok.std(0).mean().item() - 1.0) < 0.03


def test_endpoint_and_velocity_agree_on_spheres():
    chart = GeometricChart(SPEC)
    target = chart.to_points(zoo(1))

    class ToPoint(nn.Module):          # x1_hat = a fixed canonical network, in weight layout
        def forward(self, t, x):
            return chart.layout(target).expand(x.shape[0], -1)

    class LogToPoint(nn.Module):       # its velocity log_x(p) / (1 - t), in weight layout
        def forward(self, t, x):
            p = chart.unlayout(x)
            return chart.layout(chart.manifold.logmap(p, target.expand_as(p)) / (1 - _t(t, x)).clamp_min(1e-3))

    x0 = chart.sample_source(50, gen(4))
    a = WeightFlow(chart, ToPoint(), parametrization="endpoint").integrate(x0, steps=20).x
    b = WeightFlow(chart, LogToPoint(), parametrization="velocity").integrate(x0, steps=20).x
    assert torch.allclose(a, b, atol=1e-4)
    assert torch.allclose(a, target.expand_as(a), atol=1e-4)


# ------------------------------------------------------------------------------------ training, sampling
def test_fit_sample_on_spheres_thousands_at_once():
    chart = GeometricChart(SPEC)
    flow = WeightFlow(chart, gnn_field(SPEC, dim=8, n_layers=1), coupling="ot", time_distribution="beta(1,2)")
    res = flow.fit(zoo(64), steps=3, batch_size=32, generator=gen(), progress=False)
    assert res.losses.shape == (3,) and torch.isfinite(res.losses).all()
    for method in ("euler", "midpoint", "rk4"):
        points = flow.integrate(chart.sample_source(2000, gen(5)), steps=3, method=method).x
        assert float(chart.manifold.norm_deviation(points).max()) < 1e-5
    nets = flow.sample(2000, steps=2, generator=gen(6))
    assert nets.shape == (2000, SPEC.n_params) and torch.isfinite(nets).all()


def test_velocity_fit_learns_a_shift():
    """A short run must beat the untrained field on its own loss (the trainer really trains)."""
    spec = MLPSpec((3, 4, 2))
    chart = EuclideanChart(spec, sigma=1.0)
    target = 2.0 + 0.1 * torch.randn(256, spec.n_params, generator=gen(7))
    torch.manual_seed(0)        # the field's initialisation, whatever earlier tests drew from the global generator
    flow = WeightFlow(chart, FlatField(spec, hidden=64, depth=2), parametrization="velocity")
    res = flow.fit(target, steps=300, batch_size=128, lr=3e-3, ema_decay=0.9, generator=gen(), progress=False)
    assert res.losses[-20:].mean() < 0.5 * res.losses[:5].mean()
    samples = flow.sample(512, steps=20, method="midpoint", generator=gen(8))
    assert abs(samples.mean().item() - 2.0) < 0.2


def test_reverse_kl_fit_learns_a_density_mean_and_spread():
    """Trained on an unnormalised Gaussian log-density alone (no samples), the flow gets its mean and spread
    (the entropy term, the divergence along the path, keeps the samples from collapsing on the mode), the ODE
    integrated finely is the distribution trained with Euler steps, and its change-of-variables density is
    the target's."""
    spec = MLPSpec((3, 4, 2))
    flow = WeightFlow(EuclideanChart(spec, sigma=1.0), FlatField(spec, hidden=64, depth=2))
    target = torch.distributions.Normal(2.0, 0.5)

    def log_density(theta):                        # N(2, 0.5^2) per weight, up to a constant
        return target.log_prob(theta).sum(-1) + 123.0

    res = fit_reverse_kl(flow, log_density, steps=500, batch_size=64, solver_steps=8, lr=3e-3, ema_decay=0.9,
                              generator=gen(3), progress=False)
    assert res.losses.shape == (500,)
    # the loss is the reverse KL minus log Z = 123: it ends near its minimum, not below it
    assert -123.0 - 1.0 < res.losses[-50:].mean().item() < -123.0 + 2.0, res.losses[-50:].mean()
    for method, steps in (("euler", 8), ("rk4", 20)):
        samples = flow.sample(2048, steps=steps, method=method, generator=gen(4))
        assert abs(samples.mean().item() - 2.0) < 0.1, (method, samples.mean())
        assert 0.45 < samples.std(0).mean().item() < 0.55, (method, samples.std(0).mean())
    nets = flow.sample(128, steps=20, method="rk4", generator=gen(5))
    gap = flow.log_prob(nets, steps=20, method="rk4", estimator="exact") - target.log_prob(nets).sum(-1)
    assert gap.mean().abs() < 1.5 and gap.std() < 1.5, gap


def test_flat_field_diagonal_term_starts_as_the_same_field_and_survives_the_state_dict():
    spec = MLPSpec((3, 4, 2))
    field = FlatField(spec, hidden=8, depth=2)
    diag = field.with_diagonal()
    x, t = torch.randn(5, spec.n_params, generator=gen(1)), torch.rand(5, generator=gen(2))
    assert torch.equal(diag(t, x), field(t, x))            # zero at first: the same function
    with torch.no_grad():
        diag.diagonal.copy_(torch.randn(2, spec.n_params, generator=gen(3)))
    expected = field(t, x) + (diag.diagonal[0] + t[:, None] * diag.diagonal[1]) * x
    assert torch.allclose(diag(t, x), expected, atol=1e-6)
    assert torch.allclose(diag(0.5, x), diag(torch.full((5,), 0.5), x))
    flow = WeightFlow(EuclideanChart(spec, sigma=1.0), diag)
    back = WeightFlow.from_state(flow.state_dict())
    assert back.field.config()["diagonal"] is True
    assert torch.equal(back.field(t, x), diag(t, x))
    assert "diagonal" not in field.config()                # configs of plain fields are unchanged


def test_flat_field_zeroed_is_zero_everywhere():
    spec = MLPSpec((3, 4, 2))
    field = FlatField(spec, hidden=16, depth=2, diagonal=True)
    nn.init.normal_(field.diagonal)
    t, x = torch.rand(5), torch.randn(5, spec.n_params, generator=gen(0))
    assert field(t, x).abs().max() > 0
    assert field.zero_() is field and torch.equal(field(t, x), torch.zeros_like(x))


def test_neuron_graph_field_zeroed_is_zero_everywhere_and_still_trains():
    spec = MLPSpec((4, 5, 3, 2))
    field = NeuronField(spec, hidden=16, edge_dim=8, rounds=1)
    with torch.no_grad():
        field.linear_edges.normal_(generator=gen(5))
    t, x = torch.rand(5), torch.randn(5, spec.n_params, generator=gen(0))
    assert field(t, x).abs().max() > 0
    assert field.zero_() is field and torch.equal(field(t, x), torch.zeros_like(x))
    # the hidden layers keep their initialisation, so gradients reach the zeroed outputs
    field(t, x).sum().backward()
    assert field.dec[0][-1].weight.grad.abs().max() > 0


def test_euclidean_chart_with_a_per_weight_gaussian_source():
    """A mean-field source N(loc, diag(sigma^2)): its samples, its exact log-density, its config round trip."""
    spec = MLPSpec((3, 4, 2))
    loc = torch.linspace(-1, 1, spec.n_params)
    sigma = torch.linspace(0.2, 2.0, spec.n_params)
    chart = EuclideanChart(spec, sigma=sigma, loc=loc)
    x = chart.sample_source(20_000, gen(1))
    assert torch.allclose(x.mean(0), loc, atol=0.05) and torch.allclose(x.std(0), sigma, rtol=0.05)
    exact = torch.distributions.Normal(loc, sigma).log_prob(x[:5]).sum(-1)
    assert torch.allclose(chart.source_log_prob(x[:5]), exact, atol=1e-4)
    back = chart_from_config(chart.config())
    assert torch.equal(back.sample_source(3, gen(2)), chart.sample_source(3, gen(2)))
    assert "loc" not in EuclideanChart(spec, sigma=0.5).config()   # older configs stay as they were
    with pytest.raises(ValueError, match="positive"):
        EuclideanChart(spec, sigma=sigma - 1.0)
    with pytest.raises(ValueError):
        EuclideanChart(spec, sigma=0.5, loc=torch.zeros(spec.n_params + 1))


def test_euclidean_chart_with_a_mixture_source_and_nearest_references():
    """K Gaussians as an equal mixture: rows cycle through the components, the log-density is the mixture's
    (torch.distributions), the config round-trips; with K references every network is aligned to the one it
    matches best (a permuted copy of reference 1 lands exactly on it)."""
    spec = MLPSpec((3, 4, 2))
    loc = torch.stack([torch.full((spec.n_params,), -3.0), torch.full((spec.n_params,), 3.0)])
    sigma = torch.stack([torch.full((spec.n_params,), 0.5), torch.full((spec.n_params,), 1.5)])
    chart = EuclideanChart(spec, sigma=sigma, loc=loc)
    assert chart.n_components == 2 and EuclideanChart(spec).n_components == 1
    x = chart.sample_source(20_000, gen(1))
    assert torch.allclose(x[0::2].mean(0), loc[0], atol=0.05) and torch.allclose(x[1::2].std(0), sigma[1], rtol=0.05)
    mix = torch.distributions.MixtureSameFamily(
        torch.distributions.Categorical(torch.ones(2)),
        torch.distributions.Independent(torch.distributions.Normal(loc, sigma), 1))
    assert torch.allclose(chart.source_log_prob(x[:6]), mix.log_prob(x[:6]), atol=1e-4)
    back = chart_from_config(chart.config())
    assert torch.equal(back.sample_source(3, gen(2)), chart.sample_source(3, gen(2)))
    shared = EuclideanChart(spec, sigma=0.7, loc=loc)      # one scale for every component
    assert torch.allclose(shared.sample_source(4000, gen(3))[1::2].std(0), torch.full((spec.n_params,), 0.7),
                          rtol=0.1)
    with pytest.raises(ValueError, match="rows"):
        EuclideanChart(spec, sigma=torch.ones(3, spec.n_params), loc=loc)
    refs = torch.randn(2, spec.n_params, generator=gen(4))
    copy = permute(spec, refs[1:], random_permutation(spec, 1, gen(5)))
    far = refs[:1] + 5.0
    two = EuclideanChart(spec, reference=refs)
    points = two.to_points(torch.cat([copy, far]))
    assert torch.allclose(points[0], refs[1], atol=1e-5)
    single = [EuclideanChart(spec, reference=r).to_points(far) for r in refs]
    dist = [float((s - r).norm()) for s, r in zip(single, refs)]
    assert torch.allclose(points[1], single[int(dist[1] < dist[0])][0])


def test_reverse_kl_with_samples_covers_what_the_density_alone_misses():
    """The draws' negative log-likelihood (forward KL) widens a flow that the reverse KL alone fits to a
    narrower density: fitted to N(0, 0.5^2) by reverse KL and to draws of N(0, 1), the joint flow lands in
    between, the reverse-KL-only flow on the density's spread; the second loss column is the draws' NLL and
    falls."""
    spec = MLPSpec((3, 4, 2))
    narrow = torch.distributions.Normal(0.0, 0.5)
    draws = torch.randn(512, spec.n_params, generator=gen(1))
    spreads = {}
    for w in (0.0, 2.0):
        torch.manual_seed(0)
        flow = WeightFlow(EuclideanChart(spec, sigma=0.5), FlatField(spec, hidden=64, depth=2, diagonal=True))
        res = fit_reverse_kl(flow, lambda th: narrow.log_prob(th).sum(-1), steps=300, batch_size=64, lr=3e-3,
                                  ema_decay=0.9, networks=draws if w else None, forward_weight=w,
                                  generator=gen(3), progress=False)
        spreads[w] = flow.sample(2048, steps=8, generator=gen(4)).std(0).mean().item()
        if w:
            assert res.losses.shape == (300, 2)
            assert res.losses[-50:, 1].mean() < res.losses[:50, 1].mean()
    assert 0.45 < spreads[0.0] < 0.55, spreads
    assert spreads[2.0] > 0.65, spreads
    flow = WeightFlow(EuclideanChart(spec, sigma=1.0), FlatField(spec, hidden=8, depth=1))
    with pytest.raises(ValueError, match="forward_weight"):
        fit_reverse_kl(flow, lambda th: -th.pow(2).sum(-1), steps=2, networks=draws)
    with pytest.raises(ValueError, match="forward_weight"):
        fit_reverse_kl(flow, lambda th: -th.pow(2).sum(-1), steps=2, forward_weight=1.0)


def test_reverse_kl_fit_needs_a_density_on_the_weights():
    spec = MLPSpec((3, 4, 2))
    flow = WeightFlow(GeometricChart(spec), FlatField(spec, hidden=8, depth=1))
    with pytest.raises(ValueError, match="Euclidean"):
        fit_reverse_kl(flow, lambda th: -th.pow(2).sum(-1), steps=2)


def test_evaluate_tells_memorised_networks_from_new_ones():
    """A field trained long on 16 networks fits them better than fresh draws of their distribution, and
    evaluate is the training loss of the EMA model, reproducible from its generator."""
    spec = MLPSpec((3, 4, 2))
    chart = EuclideanChart(spec, sigma=1.0)
    seen = 2.0 + torch.randn(16, spec.n_params, generator=gen(1))
    fresh = 2.0 + torch.randn(16, spec.n_params, generator=gen(2))
    flow = WeightFlow(chart, FlatField(spec, hidden=128, depth=2), coupling="ot")
    flow.fit(seen, steps=600, batch_size=16, lr=3e-3, ema_decay=0.9, generator=gen(), progress=False)
    on_seen = flow.evaluate(seen, batch_size=16, repeats=8, generator=gen(3))
    assert on_seen == flow.evaluate(seen, batch_size=16, repeats=8, generator=gen(3))
    assert on_seen < 0.7 * flow.evaluate(fresh, batch_size=16, repeats=8, generator=gen(3))
    untrained = WeightFlow(chart, FlatField(spec, hidden=128, depth=2), coupling="ot")
    untrained.set_scale(chart.to_points(seen))
    assert on_seen < untrained.evaluate(seen, batch_size=16, repeats=8, generator=gen(3))
    with pytest.raises(ValueError, match="repeats"):
        flow.evaluate(seen, repeats=0)


class Zero(nn.Module):
    def forward(self, t, x):
        return torch.zeros_like(x)


@pytest.mark.parametrize("kind", ["euclidean", "geometric"])
def test_layer_weighted_loss_divides_each_layer_by_its_scale(kind):
    chart = make_chart(kind, SPEC)
    x1 = chart.to_points(zoo(16))
    x0 = chart.sample_source(16, gen(3))
    t = torch.rand(16, generator=gen(4))
    flows = {w: WeightFlow(chart, Zero(), loss_weighting=w) for w in ("chart", "layer")}
    for flow in flows.values():
        flow.set_scale(x1)
    # with a zero field the error is minus the path's velocity, in the point layout
    _, ut = flows["chart"].path.sample(x0, x1, t.clamp(max=1 - 1e-3), generator=gen(5))
    per_coord = flows["layer"]._scale(ut)
    assert torch.allclose(flows["chart"].loss(x0, x1, t, generator=gen(5)), (ut * ut).mean())
    weighted = ut / chart.unlayout(per_coord.unsqueeze(0))
    assert torch.allclose(flows["layer"].loss(x0, x1, t, generator=gen(5)), (weighted * weighted).mean())
    assert len(set(flows["layer"].layer_scale.tolist())) == SPEC.n_layers   # the layers' scales differ
    assert flows["layer"].settings()["loss_weighting"] == "layer"
    with pytest.raises(ValueError, match="loss_weighting"):
        WeightFlow(chart, Zero(), loss_weighting="uniform")


def test_state_dict_round_trip_and_cacheable(tmp_path, monkeypatch):
    chart = GeometricChart(SPEC, reference=zoo(1)[0])
    flow = WeightFlow(chart, gnn_field(SPEC, dim=8, n_layers=1), coupling="ot")
    flow.fit(zoo(32), steps=2, batch_size=16, generator=gen(), progress=False)
    state = flow.state_dict()
    monkeypatch.setenv("WSBOOK_CACHE_DIR", str(tmp_path))
    cache.save_entry("k", "wf", {"d": 1}, state)
    hit, loaded = cache.load_entry("k", "wf", {"d": 1})
    assert hit
    again = WeightFlow.from_state(loaded)
    x0 = chart.sample_source(5, gen(9))
    assert torch.allclose(flow.sample(5, steps=3, x0=x0), again.sample(5, steps=3, x0=x0), atol=1e-6)


# ------------------------------------------------------------------------------------- the GNN field
def _check_equivariant_and_batch_independent(field, spec: MLPSpec = SPEC
                                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Permuting the hidden neurons of the input permutes the output; a network's output does not depend on
    the rest of its batch. Returns the networks, times and outputs checked."""
    theta = zoo(6, spec)
    perms = random_permutation(spec, 6, gen(10))
    t = torch.rand(6, generator=gen(11))
    with torch.no_grad():
        out, out_perm = field(t, theta), field(t, permute(spec, theta, perms))
        one_by_one = torch.cat([field(t[i:i + 1], theta[i:i + 1]) for i in range(6)])
    assert torch.allclose(permute(spec, out, perms), out_perm, atol=1e-5)
    assert torch.allclose(out, one_by_one, atol=1e-5)
    return theta, t, out


def test_gnn_field_is_equivariant_and_batch_independent():
    theta, t, _ = _check_equivariant_and_batch_independent(gnn_field(SPEC, dim=8, n_layers=2))
    perms = random_permutation(SPEC, 6, gen(10))
    flat = FlatField(SPEC, hidden=16)
    with torch.no_grad():
        assert not torch.allclose(permute(SPEC, flat(t, theta), perms), flat(t, permute(SPEC, theta, perms)), atol=1e-3)


def test_global_context_keeps_the_field_equivariant_and_batch_independent_and_reads_the_whole_network():
    field = gnn_field(SPEC, dim=8, n_layers=1, global_context=True)
    with torch.no_grad():      # the virtual node starts at zero; give it weights so the check can fail
        for lin in field.net.gnn.global_in:
            lin.weight.normal_(generator=gen(12))
    theta, t, out = _check_equivariant_and_batch_independent(field)
    with torch.no_grad():
        # one layer of message passing: a change far away (the last layer's weights) reaches the first
        # layer's outputs only through the virtual node
        w0, _ = SPEC.slices(0)
        wl, _ = SPEC.slices(SPEC.n_layers - 1)
        far = theta.clone()
        far[:, wl] += 1.0
        local = gnn_field(SPEC, dim=8, n_layers=1)
        moved = field(t, far)[:, w0] - out[:, w0]
        unmoved = local(t, far)[:, w0] - local(t, theta)[:, w0]
    assert moved.abs().max() > 1e-4 and unmoved.abs().max() < 1e-6
    assert WeightFlow.from_state(WeightFlow(EuclideanChart(SPEC), field).state_dict()).field.net.gnn.global_context


def _check_equivariant_in_the_pair(field, spec: MLPSpec) -> torch.Tensor:
    """Permuting the point and the anchor together permutes the output; the point alone does not.
    Returns the anchor set last."""
    theta, anchor = zoo(6, spec), zoo(1, spec, seed=3)
    field.set_anchor(anchor[0])
    perms = random_permutation(spec, 1, gen(10))
    p6 = [p.expand(6, -1) for p in perms]
    t = torch.rand(6, generator=gen(11))
    with torch.no_grad():
        out = field(t, theta)
        moved = field(t, permute(spec, theta, p6))
        field.set_anchor(permute(spec, anchor, perms)[0])
        both = field(t, permute(spec, theta, p6))
    assert torch.allclose(permute(spec, out, p6), both, atol=1e-5)
    assert not torch.allclose(permute(spec, out, p6), moved, atol=1e-4)
    return anchor


def test_anchored_field_is_equivariant_in_the_pair_and_reads_its_anchor():
    field = gnn_field(SPEC, dim=8, n_layers=2, anchored=True)
    anchor = _check_equivariant_in_the_pair(field, SPEC)
    with pytest.raises(ValueError, match="one width|width"):
        field.with_spec(MLPSpec((4, 7, 3, 2)))
    with pytest.raises(ValueError, match="anchored"):
        WeightFlow(EuclideanChart(SPEC), field, align_pairs=True)
    with pytest.raises(ValueError, match="anchored=False"):
        gnn_field(SPEC, dim=8, n_layers=1).set_anchor(anchor)


def test_fit_sets_the_anchor_to_the_mean_network_and_it_survives_the_cache():
    nets = zoo(24)
    flow = WeightFlow(EuclideanChart(SPEC), gnn_field(SPEC, dim=8, n_layers=1, anchored=True), coupling="ot")
    flow.fit(nets, steps=3, batch_size=8, generator=gen(), progress=False)
    expected = nets.mean(0) / flow._scale(nets)
    assert torch.allclose(flow.field.anchor[0], expected, atol=1e-5)
    assert torch.allclose(flow.ema.anchor[0], expected, atol=1e-5)
    again = WeightFlow.from_state(flow.state_dict())
    x = zoo(5, seed=9)
    with torch.no_grad():
        assert torch.allclose(flow.velocity(0.3, x), again.velocity(0.3, x), atol=1e-6)


def test_width_transfer():
    small, wide = MLPSpec((4, 3, 2)), MLPSpec((4, 7, 2))
    flow = WeightFlow(GeometricChart(small), gnn_field(small, dim=8, n_layers=2))
    flow.fit(zoo(32, small), steps=2, batch_size=16, generator=gen(), progress=False)
    big = flow.with_spec(wide)
    nets = big.sample(20, steps=3, generator=gen(12))
    assert nets.shape == (20, wide.n_params) and torch.isfinite(nets).all()
    assert bool(big.chart.manifold.belongs(big.chart.to_points(nets), atol=1e-5).all())
    # the transferred field is the same function of the graph: equivariant, and batch = one at a time
    theta = zoo(4, wide)
    perms = random_permutation(wide, 4, gen(13))
    with torch.no_grad():
        out = big.ema(0.3, theta)
        assert torch.allclose(permute(wide, out, perms), big.ema(0.3, permute(wide, theta, perms)), atol=1e-5)
        assert torch.allclose(out, torch.cat([big.ema(0.3, theta[i:i + 1]) for i in range(4)]), atol=1e-5)
    shared = [k for k, _ in flow.ema.named_parameters()]
    assert all(torch.equal(dict(flow.ema.named_parameters())[k], dict(big.ema.named_parameters())[k]) for k in shared)
    with pytest.raises(ValueError, match="one architecture"):
        FlatField(small).with_spec(wide)


@pytest.mark.parametrize("attention_layers", [0, 2])
def test_neuron_field_is_equivariant_reads_whole_neurons_and_transfers(attention_layers):
    small, wide = MLPSpec((4, 3, 2)), MLPSpec((4, 7, 2))
    field = NeuronField(small, hidden=16, depth=1, attention_layers=attention_layers)
    with torch.no_grad():      # the linear term starts at zero; give it values so the checks can fail
        field.linear.normal_(generator=gen(5))
    theta, t, out = _check_equivariant_and_batch_independent(field, small)
    with torch.no_grad():
        # a neuron's velocity depends on its own outgoing weights, and on the other neurons
        moved = theta.clone()
        small.weights(moved)[1][:, :, 0] += 1.0
        w_in, _ = small.slices(0)
        change = (field(t, moved) - out)[:, w_in].reshape(6, 3, 4).abs().amax((0, 2))
    assert (change > 1e-5).all()
    flow = WeightFlow(GeometricChart(small), field, coupling="ot", align_pairs=True)
    flow.fit(zoo(32, small), steps=2, batch_size=16, generator=gen(), progress=False)
    again = WeightFlow.from_state(flow.state_dict())
    assert again.field.config() == field.config() and again.field.config()["kind"] == "neuron"
    big = again.with_spec(wide)
    nets = big.sample(9, steps=3, generator=gen(12))
    assert nets.shape == (9, wide.n_params) and torch.isfinite(nets).all()
    assert bool(big.chart.manifold.belongs(big.chart.to_points(nets), atol=1e-5).all())
    _check_equivariant_and_batch_independent(big.ema, wide)
    assert all(torch.equal(a, b) for a, b in zip(again.ema.parameters(), big.ema.parameters()))
    with pytest.raises(ValueError, match="depth"):
        field.with_spec(SPEC)
    with pytest.raises(ValueError, match="inputs and outputs"):
        field.with_spec(MLPSpec((5, 3, 2)))


def test_anchored_neuron_field_is_equivariant_in_the_pair_and_fit_sets_its_anchor():
    spec = MLPSpec((4, 3, 2))
    field = NeuronField(spec, hidden=16, depth=1, attention_layers=1, anchored=True)
    anchor = _check_equivariant_in_the_pair(field, spec)
    # widening repeats the anchor's neurons: neuron j of the wide anchor is neuron j mod 3
    wide = MLPSpec((4, 7, 2))
    big = field.with_spec(wide)
    idx = torch.arange(7) % 3
    (w1, w2), (b1, b2) = spec.weights(field.anchor), spec.biases(field.anchor)
    assert torch.equal(big.anchor, wide.pack([w1[:, idx], w2[:, :, idx]], [b1[:, idx], b2]))
    assert all(torch.equal(a, b) for a, b in zip(field.parameters(), big.parameters()))
    with torch.no_grad():        # copies of one anchor neuron read alike: equal inputs, equal outputs
        (w1x, w2x), (b1x, b2x) = wide.weights(zoo(2, wide)), wide.biases(zoo(2, wide))
        copy = torch.tensor([0, 1, 2, 0, 4, 5, 6])
        v = big(0.4, wide.pack([w1x[:, copy], w2x[:, :, copy]], [b1x[:, copy], b2x]))
        assert torch.allclose(wide.weights(v)[0][:, 3], wide.weights(v)[0][:, 0], atol=1e-5)
        assert not torch.allclose(wide.weights(v)[0][:, 4], wide.weights(v)[0][:, 1], atol=1e-3)
    _check_equivariant_in_the_pair(big, wide)
    with pytest.raises(ValueError, match="not narrow"):
        big.with_spec(MLPSpec((4, 2, 2)))
    nets = zoo(24, spec)
    flow = WeightFlow(EuclideanChart(spec), field, coupling="ot")
    flow.fit(nets, steps=2, batch_size=8, generator=gen(), progress=False)
    assert torch.allclose(flow.ema.anchor[0], nets.mean(0) / flow._scale(nets), atol=1e-5)
    again = WeightFlow.from_state(flow.state_dict())
    with torch.no_grad():
        assert torch.allclose(flow.velocity(0.3, nets[:3]), again.velocity(0.3, nets[:3]), atol=1e-6)
    with pytest.raises(ValueError, match="anchored=False"):
        NeuronField(spec, hidden=8).set_anchor(anchor)


@pytest.mark.parametrize("widths", [(4, 5, 3, 2), (4, 3, 5, 3, 2)])
def test_neuron_graph_field_is_equivariant_reaches_across_layers_and_transfers(widths):
    spec = MLPSpec(widths)
    field = NeuronField(spec, hidden=16, edge_dim=8, rounds=1)
    with torch.no_grad():      # the linear terms start at zero; give them values so the checks can fail
        field.linear_edges.normal_(generator=gen(5))
        for lin in field.linear_nodes:
            lin.normal_(generator=gen(6))
    theta, t, out = _check_equivariant_and_batch_independent(field, spec)
    with torch.no_grad():
        # a first-layer neuron's velocity depends on the output weights (through the edges and the
        # context), and every weight between hidden layers gets its own velocity
        far = theta.clone()
        spec.weights(far)[-1][:] += 1.0
        w_in, _ = spec.slices(0)
        assert ((field(t, far) - out)[:, w_in].abs().amax(0) > 1e-6).all()
        w_mid, _ = spec.slices(1)
        assert out[:, w_mid].std(1).min() > 1e-4
    flow = WeightFlow(EuclideanChart(spec), field, coupling="ot", align_pairs=True)
    flow.fit(zoo(32, spec), steps=2, batch_size=16, generator=gen(), progress=False)
    again = WeightFlow.from_state(flow.state_dict())
    assert again.field.config() == field.config() and again.field.config()["kind"] == "neuron"
    wide = MLPSpec((widths[0], *(w + 2 for w in widths[1:-1]), widths[-1]))
    big = again.with_spec(wide)
    nets = big.sample(5, steps=3, generator=gen(12))
    assert nets.shape == (5, wide.n_params) and torch.isfinite(nets).all()
    _check_equivariant_and_batch_independent(big.ema, wide)
    assert all(torch.equal(a, b) for a, b in zip(again.ema.parameters(), big.ema.parameters()))
    with pytest.raises(ValueError, match="two or more hidden layers"):
        NeuronField(MLPSpec((4, 3, 2)), rounds=2)
    with pytest.raises(ValueError, match="at least one hidden layer"):
        NeuronField(MLPSpec((4, 2)))
    with pytest.raises(ValueError, match="inputs and outputs"):
        field.with_spec(MLPSpec((5, *widths[1:])))


def test_anchored_neuron_graph_field_is_equivariant_in_the_pair():
    field = NeuronField(SPEC, hidden=16, edge_dim=8, rounds=1, anchored=True)
    _check_equivariant_in_the_pair(field, SPEC)
    with pytest.raises(ValueError, match="widths only"):
        field.with_spec(MLPSpec((4, 7, 3, 2)))


# ------------------------------------------------------------------------------------------ guidance
def test_guidance_gradient_matches_autograd_per_network():
    theta, x = zoo(5), torch.randn(17, 4, generator=gen(14))
    y = torch.randint(0, 2, (17,), generator=gen(15))
    g = task_gradient(SPEC, theta, x, y)
    for i in range(5):
        module = SPEC.to_module(theta[i])
        loss = nn.functional.cross_entropy(module(x), y)
        grads = torch.autograd.grad(loss, list(module.parameters()))
        assert torch.allclose(g[i], torch.cat([p.reshape(-1) for p in grads]), atol=1e-6)


def test_guidance_is_tangent_and_lowers_the_loss():
    theta, x = zoo(16), torch.randn(64, 4, generator=gen(16))
    y = torch.randint(0, 2, (64,), generator=gen(17))
    chart = GeometricChart(SPEC)
    points = chart.to_points(theta)
    guide = Guidance(x, y, weight=1.0, batch_size=None)
    v = guide.vector(chart, points, 1.0)
    assert bool(chart.manifold.is_tangent(points, v, atol=1e-6).all())
    from wsbook.nets import per_member_loss
    before = per_member_loss(SPEC, chart.layout(points), x, y)
    after = per_member_loss(SPEC, chart.layout(chart.manifold.expmap(points, 0.05 * v)), x, y)
    assert (after < before).float().mean() > 0.9
    assert guide.strength(0.5) == 1.0 and Guidance(x, y, weight=2.0, schedule="linear").strength(0.25) == 0.5


# ---------------------------------------------------------------------------------------- likelihood
class LinearField(nn.Module):
    """v(t, x) = a x + b in point coordinates: x_1 = e^a x_0 + b (e^a - 1) / a."""

    def __init__(self, a: float, b: float):
        super().__init__()
        self.a, self.b, self.p = a, b, nn.Parameter(torch.zeros(1))

    def forward(self, t, x):
        return self.a * x + self.b


def test_log_prob_against_analytic_density_euclidean():
    spec = MLPSpec((2, 3, 2))
    chart = EuclideanChart(spec, sigma=0.5)
    flow = WeightFlow(chart, LinearField(0.4, 0.3), parametrization="velocity")
    nets = flow.sample(6, steps=50, method="rk4", generator=gen(18))
    a, b = 0.4, 0.3
    mean, std = b * (math.exp(a) - 1) / a, 0.5 * math.exp(a)
    expected = torch.distributions.Normal(mean, std).log_prob(nets).sum(1)
    got = flow.log_prob(nets, steps=20, method="rk4", estimator="exact")
    assert torch.allclose(got, expected, atol=1e-3, rtol=1e-4)


def test_log_prob_against_analytic_density_on_spheres():
    """A rotation of every neuron sphere keeps the uniform density; the Euclidean last layer is scaled by e^a."""
    chart = GeometricChart(SPEC, sigma=0.7)
    a = 0.3

    class Rotation(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.zeros(1))

        def forward(self, t, x):
            p = chart.unlayout(x)
            v = torch.zeros_like(p)
            for blk in chart.manifold.blocks:
                part = p[:, blk.slice].reshape(p.shape[0], blk.n_factors, blk.factor_dim)
                if blk.kind == "sphere":
                    A = torch.arange(blk.factor_dim ** 2, dtype=p.dtype).reshape(blk.factor_dim, -1).sin()
                    rot = part @ (A - A.T)
                else:
                    rot = a * part
                v[:, blk.slice] = rot.reshape(p.shape[0], -1)
            return chart.layout(v)

    flow = WeightFlow(chart, Rotation(), parametrization="velocity")
    nets = flow.sample(5, steps=40, method="rk4", generator=gen(19))
    points = chart.to_points(nets)
    spheres = chart.source_log_prob(points) - torch.distributions.Normal(0.0, 0.7).log_prob(points[:, chart.last]).sum(1)
    expected = spheres + torch.distributions.Normal(0.0, 0.7 * math.exp(a)).log_prob(points[:, chart.last]).sum(1)
    got = flow.likelihood(points, steps=20, method="rk4", estimator="exact").logp
    assert torch.allclose(got, expected, atol=2e-3)


def test_hutchinson_within_three_standard_errors_of_exact():
    spec = MLPSpec((3, 3, 2))
    chart = EuclideanChart(spec, sigma=1.0)
    torch.manual_seed(0)
    flow = WeightFlow(chart, gnn_field(spec, dim=8, n_layers=1), parametrization="velocity")
    x = chart.sample_source(3, gen(20))
    exact = flow.likelihood(x, steps=4, method="rk4", estimator="exact").logp
    runs = torch.stack([flow.likelihood(x, steps=4, method="rk4", estimator="hutchinson", n_probes=1,
                                        generator=gen(100 + k)).logp for k in range(30)])
    se = runs.std(0) / math.sqrt(runs.shape[0])
    assert bool(((runs.mean(0) - exact).abs() <= 3 * se + 1e-4).all()), (runs.mean(0), exact, se)
    assert bool((se > 0).all()), "the estimator must actually be stochastic"


def test_normalized_flow_has_no_density():
    flow = WeightFlow(NormalizedChart(SPEC), gnn_field(SPEC, dim=8, n_layers=1))
    with pytest.raises(ValueError, match="no density"):
        flow.log_prob(zoo(2))


# ----------------------------------------------------------------------------------------- bad input
def test_clear_errors():
    chart = GeometricChart(SPEC)
    with pytest.raises(ValueError, match="parameters per network"):
        chart.to_points(zoo(3, MLPSpec((4, 6, 3, 2))))
    points = chart.to_points(zoo(3))
    with pytest.raises(ValueError, match="not canonical"):
        chart.to_weights(points * 1.1)
    flow = WeightFlow(chart, gnn_field(SPEC, dim=8, n_layers=1))
    with pytest.raises(ValueError, match="not canonical"):
        flow.integrate(points * 1.1, steps=2)
    bad = zoo(3)
    bad[1, 4] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        chart.to_points(bad)
    with pytest.raises(ValueError, match="NaN"):
        EuclideanChart(SPEC).to_points(bad)
    with pytest.raises(ValueError, match="parametrization"):
        WeightFlow(chart, gnn_field(SPEC, dim=8, n_layers=1), parametrization="score")
    with pytest.raises(ValueError, match="ReLU"):
        GeometricChart(MLPSpec((4, 5, 2), activation="tanh"))

    class Exploding(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.ones(1))

        def forward(self, t, x):
            return x * self.p * float("inf")

    with pytest.raises(FloatingPointError):
        WeightFlow(EuclideanChart(SPEC), Exploding()).fit(zoo(8), steps=1, batch_size=4, progress=False)


# ------------------------------------------------------------------- public entry points: counts, empties
@pytest.mark.parametrize("kind", ["euclidean", "geometric"])
def test_non_positive_steps_and_negative_n_are_refused_before_any_work(kind):
    # log_prob(steps=-3) on the Geometric chart ran the likelihood loop zero times and returned the source's
    # log-density; steps=0 divided by zero (0.5 / steps) and sample(-2) failed inside torch
    flow = WeightFlow(make_chart(kind, SPEC), gnn_field(SPEC, dim=4, n_layers=1))
    nets = zoo(2)
    points, x0 = flow.chart.to_points(nets), flow.chart.sample_source(2, gen(1))
    g = gen(2)
    state = g.get_state()

    def no_work(*args, **kwargs):
        raise AssertionError("the arguments are checked before the networks are mapped to the chart")

    flow.chart.to_points = no_work
    for steps in (0, -3):
        for call in (lambda: flow.sample(4, steps=steps, generator=g), lambda: flow.integrate(x0, steps=steps),
                     lambda: flow.likelihood(points, steps=steps), lambda: flow.log_prob(nets, steps=steps)):
            with pytest.raises(ValueError, match=f"steps must be a positive integer; got {steps}"):
                call()
    with pytest.raises(ValueError, match="n must be a non-negative integer; got -2"):
        flow.sample(-2, generator=g)
    with pytest.raises(ValueError, match="batch_size must be a positive integer; got 0"):
        flow.sample(4, batch_size=0, generator=g)
    assert torch.equal(g.get_state(), state), "nothing is drawn before the checks"
    if kind == "euclidean":
        with pytest.raises(ValueError, match="steps must be a positive integer; got 0"):
            reference_sample(flow, 2, steps=0)
        with pytest.raises(ValueError, match="n must be a non-negative integer; got -1"):
            reference_sample(flow, -1)


EMPTY_FIELDS = {"gnn": (SPEC, lambda s: gnn_field(s, dim=4, n_layers=1)),
                "flat": (SPEC, lambda s: FlatField(s, hidden=8, depth=1)),
                "neuron": (MLPSpec((4, 5, 2)), lambda s: NeuronField(s, hidden=8, heads=1)),
                "neuron deep": (SPEC, lambda s: NeuronField(s, hidden=8, edge_dim=4, rounds=1))}


@pytest.mark.parametrize("kind", ["euclidean", "normalized", "geometric"])
@pytest.mark.parametrize("field_kind", list(EMPTY_FIELDS))
def test_empty_batches_give_empty_results_and_fit_refuses_them(kind, field_kind):
    # sample(0) and log_prob of no networks failed inside the GNN and the neuron fields (FlatField gave [0, D]);
    # fit on no networks failed in canonicalisation or set layer_scale to NaN before raising
    spec, make = EMPTY_FIELDS[field_kind]
    flow = WeightFlow(make_chart(kind, spec), make(spec))
    d, none = spec.n_params, torch.zeros(0, spec.n_params)
    assert flow.sample(0, steps=2).shape == (0, d)
    assert flow.sample(0, steps=2, x0=flow.chart.sample_source(0), batch_size=4).shape == (0, d)
    assert flow.integrate(flow.chart.sample_source(0), steps=2, return_trajectory=True).x.shape == (0, d)
    if kind == "normalized":
        with pytest.raises(ValueError, match="no density"):
            flow.log_prob(none)
    else:
        assert flow.log_prob(none, steps=2).shape == (0,)
        res = flow.likelihood(flow.chart.sample_source(0), steps=2)
        assert res.logp.shape == res.base_logp.shape == res.int_div.shape == (0,) and res.x0.shape == (0, d)
        assert flow.log_prob(zoo(2, spec), steps=1, method="euler").shape == (2,)
    scale, ema = flow.layer_scale.clone(), flow.ema
    with pytest.raises(ValueError, match="no networks"):
        flow.fit(none, steps=1, progress=False)
    with pytest.raises(ValueError, match="no networks"):
        flow.evaluate(none)
    assert torch.equal(flow.layer_scale, scale) and flow.ema is ema, "nothing changed"


def test_a_field_for_another_architecture_is_refused():
    # both have 94 parameters: the flow fitted and sampled 5-9-4 networks read as 5-5-6-4 ones
    a, b = MLPSpec((5, 9, 4)), MLPSpec((5, 5, 6, 4))
    assert a.n_params == b.n_params
    for field in (gnn_field(b, dim=4, n_layers=1), FlatField(b, hidden=8, depth=1),
                  NeuronField(b, hidden=8, edge_dim=4, rounds=1)):
        with pytest.raises(ValueError, match="built for another architecture"):
            WeightFlow(EuclideanChart(a), field)
        with pytest.raises(ValueError, match="built for another architecture"):
            WeightFlow(GeometricChart(a), field)
    with pytest.raises(ValueError, match="built for another architecture"):
        WeightFlow(EuclideanChart(b), NeuronField(a, hidden=8, heads=1))
    with pytest.raises(ValueError, match="built for another architecture"):
        WeightFlow(EuclideanChart(MLPSpec((5, 9, 4), activation="tanh")), FlatField(a, hidden=8, depth=1))
    assert WeightFlow(EuclideanChart(a), FlatField(a, hidden=8, depth=1)).spec == a
    # width transfer keeps chart and field on one spec (the chart kept only widths and activation before)
    sine = MLPSpec((5, 9, 4), activation="sine", frequency=10.0)
    wide = MLPSpec((5, 12, 4), activation="sine", frequency=10.0)
    moved = WeightFlow(EuclideanChart(sine), gnn_field(sine, dim=4, n_layers=1)).with_spec(wide)
    assert moved.chart.spec == moved.field.spec == wide


def test_time_embedding_width_is_one_constant(monkeypatch):
    """Every field reads the time through ``fields.TIME_FEATURES`` features: 17 (the width trained fields were
    saved with), and with another value every field still builds and runs, so no layer hard-codes it."""
    from wsbook.flows import time_features
    from wsbook.weightflow import fields

    assert fields.TIME_FEATURES == 17
    assert time_features(torch.zeros(3), fields.TIME_FEATURES - 1, 3).shape == (3, fields.TIME_FEATURES)
    monkeypatch.setattr(fields, "TIME_FEATURES", 9)
    one_hidden = MLPSpec((4, 5, 2))
    built = [gnn_field(SPEC, dim=8, n_layers=1), NeuronField(one_hidden, hidden=8, depth=1, attention_layers=1),
             NeuronField(SPEC, hidden=8, edge_dim=4, rounds=1)]
    for field in built:
        x = torch.randn(3, field.spec.n_params, generator=gen(1))
        assert field(torch.rand(3, generator=gen(2)), x).shape == x.shape
    gnn, neuron, graph = built
    assert gnn.skip.net[0].in_features == neuron.time.in_features == graph.time.in_features == 9


def test_docstrings_point_to_the_chapters_instead_of_quoting_results():
    """A docstring says what a thing is and which chapter measures it: a measured number in a docstring is
    never rerun and goes stale (the measurements live in the chapters and docs/tuning-log.md)."""
    import inspect
    import re

    measured = re.compile(r"\d+\.\d+|\b\d{1,3}(?:,\d{3})+\b|\b\d+ (?:nats|against|to) \d+")
    for obj, chapter in ((FlatField, "Chapter 8c"), (NeuronField, "Chapter 8b"), (WeightFlow, "chapter 7")):
        doc = re.sub(r"``[^`]*``|Table \d+\.\d+", "", inspect.getdoc(obj))   # settings in code markup; tables
        assert not measured.search(doc), (obj.__name__, measured.search(doc).group())
        assert chapter in doc, obj.__name__


@pytest.mark.parametrize("field_kind", list(EMPTY_FIELDS))
def test_every_field_follows_the_one_protocol(field_kind):
    """Every field is a WeightField: its config rebuilds it, zero_ makes it zero everywhere, with_spec of its
    own spec is itself, and an unanchored one refuses an anchor."""
    from wsbook.weightflow import FIELDS, WeightField, field_from_config

    spec, make = EMPTY_FIELDS[field_kind]
    torch.manual_seed(0)
    field = make(spec)
    assert isinstance(field, WeightField) and FIELDS[field.kind] is type(field) and field.kind == field_kind.split()[0]
    again = field_from_config(field.config())
    again.load_state_dict(field.state_dict())
    x, t = zoo(3, spec), torch.rand(3)
    assert torch.equal(again(t, x), field(t, x))
    assert field.with_spec(spec) is field
    with pytest.raises(ValueError, match="anchored=False"):
        field.set_anchor(x[0])
    assert field.zero_() is field and torch.equal(field(t, x), torch.zeros_like(x))


def test_an_analytic_field_samples_but_is_not_saved_and_with_field_keeps_the_scales():
    class Drift(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rate = torch.nn.Parameter(torch.ones(()))

        def forward(self, t, x):
            return self.rate * torch.ones_like(x)

    flow = WeightFlow(EuclideanChart(SPEC), Drift())
    assert flow.sample(2, steps=2).shape == (2, SPEC.n_params)
    for call in (flow.state_dict, lambda: flow.with_spec(SPEC)):
        with pytest.raises(TypeError, match="not a WeightField"):
            call()
    with pytest.raises(TypeError, match="torch module"):
        WeightFlow(EuclideanChart(SPEC), lambda t, x: x)
    trained = WeightFlow(EuclideanChart(SPEC), FlatField(SPEC, hidden=8, depth=1))
    trained.fit(zoo(8), steps=2, batch_size=4, progress=False)
    moved = trained.with_field(trained.ema)
    assert moved.field is trained.ema and torch.equal(moved.layer_scale, trained.layer_scale)
    assert moved.settings() == trained.settings() and moved.chart is trained.chart


def test_one_neuron_field_for_any_depth_refuses_the_other_depths_arguments_and_reads_older_kinds():
    from wsbook.weightflow import field_from_config, spec_config

    shallow, deep = MLPSpec((4, 3, 2)), MLPSpec((4, 3, 3, 2))
    assert NeuronField(shallow).kwargs == NeuronField.SET_ARGS
    assert NeuronField(deep).kwargs == NeuronField.GRAPH_ARGS
    with pytest.raises(ValueError, match="edge_dim"):
        NeuronField(shallow, edge_dim=8)
    with pytest.raises(ValueError, match="attention_layers"):
        NeuronField(deep, attention_layers=1)
    with pytest.raises(ValueError, match="positive"):
        NeuronField(deep, rounds=0)
    # flows saved while the deeper field had a kind of its own load as the one neuron field
    older = {"kind": "neuron_graph", **spec_config(deep), "hidden": 8, "edge_dim": 4, "rounds": 1}
    field = field_from_config(older)
    assert isinstance(field, NeuronField) and field.config() == {**older, "kind": "neuron"}
