"""Flows over convolutional networks: the charts, the channel field and WeightFlow on a CNNSpec.

Small CNNs (one or two convolutions of a few channels, 1x1 to 5x5 kernels, on 8x8 and 12x12 images) so that
every test runs in well under a second or two on one core.
"""
import itertools
import math

import pytest
import torch
from torch import nn

from wsbook.nets import CNNSpec, MLPSpec
from wsbook.symmetry import permute, random_permutation
from wsbook.weightflow import (FIELDS, ChannelField, EuclideanChart, FlatField, GeometricChart, Guidance, NeuronField,
                               NormalizedChart, WeightField, WeightFlow, chart_from_config,
                               field_from_config)

pytestmark = pytest.mark.usefixtures("one_thread")

SPECS = [CNNSpec(1, (4,), 3, 3), CNNSpec(1, (4, 6), 3, 3), CNNSpec(2, (3, 5), 5, 2), CNNSpec(3, (4, 2, 3), 1, 4)]
IMAGE = {1: 8, 3: 12, 5: 12}          # image side per kernel size


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def zoo(spec: CNNSpec, n: int, seed: int = 0) -> torch.Tensor:
    """``n`` random networks with a spread of channel scales (so that canonicalisation has work to do)."""
    theta = spec.init(n, generator=gen(seed))
    ws, bs = spec.weights(theta), spec.biases(theta)
    g = gen(seed + 100)
    ws = [w * torch.exp(torch.randn(n, w.shape[1], *([1] * (w.dim() - 2)), generator=g)) for w in ws]
    return spec.pack(ws, bs)


def images(spec: CNNSpec, n: int = 6, seed: int = 1) -> torch.Tensor:
    side = IMAGE[spec.kernel_size]
    return torch.randn(n, spec.in_channels, side, side, generator=gen(seed))


def outputs(spec: CNNSpec, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return spec.forward(theta, x)


# ----------------------------------------------------------------------------------------------- charts
@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_charts_on_cnns_round_trip_and_keep_the_function(spec):
    theta, x = zoo(spec, 5), images(spec)
    euclid = EuclideanChart(spec)
    points = euclid.to_points(theta)
    assert torch.equal(euclid.to_weights(points), theta)
    for chart in (GeometricChart(spec), GeometricChart(spec, reference=theta[0]), NormalizedChart(spec)):
        points = chart.to_points(theta)
        assert points.shape == theta.shape and chart.dim == spec.n_params
        assert torch.equal(chart.unlayout(chart.layout(points)), points)        # the linear re-indexing
        chart.check_points(points)                                             # on the unit spheres
        back = chart.to_weights(points)
        # the network a point is computes the function of the network it came from
        torch.testing.assert_close(outputs(spec, back, x), outputs(spec, theta, x), atol=2e-5, rtol=1e-4)
        module = spec.to_module(back[1])
        torch.testing.assert_close(module(x), outputs(spec, theta, x)[1], atol=2e-5, rtol=1e-4)
        # and maps back to the same point (canonical networks are fixed points)
        torch.testing.assert_close(chart.to_points(back), points, atol=1e-5, rtol=0)
        again = chart_from_config(chart.config())
        assert again.config().keys() == chart.config().keys() and again.spec == spec
        torch.testing.assert_close(again.to_points(theta), points)


def test_geometric_cnn_chart_scales_channels_and_next_layer_absorbs_the_norm():
    """By hand for 1 -> 4 -> 6 channels: each channel's [kernel, bias] divided by its norm, the next convolution's
    kernels reading that channel (then the head's columns) multiplied by it, the head itself unchanged."""
    spec = CNNSpec(1, (4, 6), 3, 3)
    theta = zoo(spec, 3)
    (w1, w2, w3), (b1, b2, b3) = spec.weights(theta), spec.biases(theta)
    n1 = torch.cat([w1.flatten(2), b1[..., None]], -1).norm(dim=-1)                 # [B, 4]
    w2 = w2 * n1[:, None, :, None, None]
    n2 = torch.cat([w2.flatten(2), b2[..., None]], -1).norm(dim=-1)                 # [B, 6]
    expected = spec.pack([w1 / n1[..., None, None, None], w2 / n2[..., None, None, None], w3 * n2[:, None]],
                         [b1 / n1, b2 / n2, b3])
    chart = GeometricChart(spec)
    torch.testing.assert_close(chart.to_weights(chart.to_points(theta)), expected)
    assert [(b.kind, b.n_factors, b.factor_dim) for b in chart.manifold.blocks] == \
        [("sphere", 4, 1 * 9 + 1), ("sphere", 6, 4 * 9 + 1), ("euclidean", 1, 3 * 6 + 3)]


@pytest.mark.parametrize("kind", ["euclidean", "geometric"])
def test_charts_align_channels_to_their_reference(kind):
    """Channel-permuted copies of the reference map to the reference's own point (weight matching through the
    symmetry module's CNN path); several references: each network to the one it lands nearest."""
    spec = CNNSpec(1, (4, 6), 3, 3)
    theta = zoo(spec, 4, seed=3)
    ref = theta[:1]
    copies = permute(spec, ref.expand(5, -1), random_permutation(spec, 5, generator=gen(4)))
    assert not torch.allclose(copies, ref.expand_as(copies))
    chart = (EuclideanChart(spec, reference=ref) if kind == "euclidean" else GeometricChart(spec, reference=ref))
    points = chart.to_points(copies)
    torch.testing.assert_close(points, chart.to_points(ref).expand_as(points), atol=1e-5, rtol=0)
    if kind == "euclidean":
        both = EuclideanChart(spec, reference=theta[:2])
        other = permute(spec, theta[1:2].expand(3, -1), random_permutation(spec, 3, generator=gen(5)))
        torch.testing.assert_close(both.to_points(other), theta[1:2].expand(3, -1))


def test_source_densities_on_cnn_charts():
    spec = CNNSpec(1, (4, 6), 3, 3)
    euclid = EuclideanChart(spec, sigma=0.3)
    z = euclid.sample_source(7, gen(0))
    assert z.shape == (7, spec.n_params)
    torch.testing.assert_close(euclid.source_log_prob(z), torch.distributions.Normal(0.0, 0.3).log_prob(z).sum(1))
    geo = GeometricChart(spec, sigma=0.5)
    p = geo.sample_source(7, gen(1))
    geo.check_points(p)                                                # every channel on its unit sphere
    log_area = lambda n: math.log(2) + 0.5 * n * math.log(math.pi) - math.lgamma(0.5 * n)   # area of S^{n-1}
    head = p[:, geo.last]
    expected = -4 * log_area(10) - 6 * log_area(37) + torch.distributions.Normal(0.0, 0.5).log_prob(head).sum(1)
    torch.testing.assert_close(geo.source_log_prob(p), expected)


def test_ot_coupling_uses_the_geodesic_metric_of_the_cnn_chart():
    spec = CNNSpec(1, (4,), 3, 3)
    chart = GeometricChart(spec)
    flow = WeightFlow(chart, ChannelField(spec, hidden=8), coupling="ot")
    x0, x1 = chart.sample_source(5, gen(0)), chart.to_points(zoo(spec, 5, seed=1))
    p0, p1 = flow.pair(x0, x1)
    cost = lambda a, b: chart.manifold.dist(a, b).pow(2).sum()
    best = min(float(cost(x0, x1[list(perm)])) for perm in itertools.permutations(range(5)))
    assert torch.equal(p0, x0) and sorted(map(tuple, p1.tolist())) == sorted(map(tuple, x1.tolist()))
    assert float(cost(p0, p1)) == pytest.approx(best, rel=1e-5)


# ----------------------------------------------------------------------------------------------- fields
@pytest.mark.parametrize("spec,attention", [(SPECS[0], 0), (SPECS[1], 1), (SPECS[3], 0)], ids=str)
def test_channel_field_is_equivariant_to_channel_permutations(spec, attention):
    torch.manual_seed(0)
    field = ChannelField(spec, hidden=16, edge_dim=8, rounds=2, attention_layers=attention)
    for p in field.parameters():                  # the linear terms start at zero: give them values too
        if p.dim() == 2 and p.shape[0] == 2:
            nn.init.normal_(p)
    theta, t = zoo(spec, 4), torch.rand(4, generator=gen(2))
    perms = random_permutation(spec, 4, generator=gen(3))
    out = field(t, theta)
    assert out.shape == theta.shape and torch.isfinite(out).all()
    torch.testing.assert_close(field(t, permute(spec, theta, perms)), permute(spec, out, perms), atol=1e-5, rtol=1e-4)


def test_channel_field_is_equivariant_to_each_layer_on_its_own():
    """Permuting the channels of one convolution (and the inputs of the next) permutes the velocity the same way,
    layer by layer, so no layer's channels are read in a fixed order or mixed with another layer's."""
    spec = CNNSpec(2, (3, 4, 5), 3, 4)
    torch.manual_seed(0)
    field = ChannelField(spec, hidden=16, edge_dim=8, rounds=2)
    for p in field.parameters():
        if p.dim() == 2 and p.shape[0] == 2:
            nn.init.normal_(p)
    theta, t = zoo(spec, 3), torch.rand(3, generator=gen(2))
    out = field(t, theta)
    for layer in range(len(spec.channels)):
        perms = [torch.arange(w).expand(3, w) for w in spec.channels]
        perms[layer] = torch.rand(3, spec.channels[layer], generator=gen(10 + layer)).argsort(1)
        moved = permute(spec, theta, perms)
        assert not torch.allclose(moved, theta)
        torch.testing.assert_close(field(t, moved), permute(spec, out, perms), atol=1e-5, rtol=1e-4)


def test_channel_field_writes_every_channel_and_kernel_to_its_own_weights():
    """With the decoders zeroed, the output is the per-coordinate linear term: built by hand from the kernel layout
    [out, in, k, k], each first-layer channel's kernel and bias, each kernel between convolutions and the head's
    column of each last-layer channel must be scaled by their own factors and land on their own coordinates."""
    spec = CNNSpec(2, (3, 4, 5), 3, 6)
    field = ChannelField(spec, hidden=8, edge_dim=4).zero_()
    g = gen(0)
    with torch.no_grad():
        for p in [*field.linear_nodes, *field.linear_edges]:
            p.copy_(torch.randn(p.shape, generator=g))
    theta, t = zoo(spec, 2), torch.tensor([0.3, 0.8])
    (w1, w2, w3, w4), (b1, b2, b3, _) = spec.weights(theta), spec.biases(theta)
    n1, n3, e1, e2 = field.linear_nodes[0], field.linear_nodes[2], field.linear_edges[0], field.linear_edges[1]
    c = lambda lin: lin[0] + t.reshape(-1, *([1] * lin[0].dim())) * lin[1]       # a + b t per row
    expected = spec.pack(
        [w1 * c(n1[:, :18]).reshape(2, 1, 2, 3, 3), w2 * c(e1).reshape(2, 1, 1, 3, 3),
         w3 * c(e2).reshape(2, 1, 1, 3, 3), w4 * c(n3[:, 1:])[:, :, None]],
        [b1 * c(n1[:, 18:19]), b2 * c(field.linear_nodes[1]), b3 * c(n3[:, :1]), torch.zeros(2, 6)])
    torch.testing.assert_close(field(t, theta), expected)


@pytest.mark.parametrize("anchored", [False, True])
def test_channel_field_on_1x1_kernels_is_the_neuron_field(anchored):
    """A CNN of 1x1 kernels is an MLP on each pixel and has the MLP's flat layout: with the same parameters the
    channel field computes exactly the neuron field's velocity (same nodes, edges, rounds and readouts)."""
    cnn, mlp = CNNSpec(3, (4, 5, 2), 1, 3), MLPSpec((3, 4, 5, 2, 3))
    assert cnn.n_params == mlp.n_params
    torch.manual_seed(0)
    channel = ChannelField(cnn, hidden=16, edge_dim=8, rounds=2, anchored=anchored)
    neuron = NeuronField(mlp, hidden=16, edge_dim=8, rounds=2, anchored=anchored)
    g = gen(1)
    with torch.no_grad():                          # random values everywhere, the zero-initialised terms included
        for p in channel.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    state = channel.state_dict()
    edges = torch.cat([state.pop(f"linear_edges.{k}") for k in range(2)], 1)        # [2, 1] per kernel set
    state["linear_edges"] = edges
    neuron.load_state_dict({k: v.reshape(neuron.state_dict()[k].shape) for k, v in state.items()})
    theta, t = zoo(cnn, 3), torch.rand(3, generator=gen(2))
    if anchored:
        channel.set_anchor(theta[0])
        neuron.set_anchor(theta[0])
    torch.testing.assert_close(channel(t, theta), neuron(t, theta), atol=1e-6, rtol=1e-5)


def test_anchored_channel_field_is_equivariant_in_the_pair():
    spec = SPECS[1]
    torch.manual_seed(0)
    field = ChannelField(spec, hidden=16, edge_dim=8, anchored=True)
    theta, t = zoo(spec, 2), torch.rand(1, generator=gen(2))
    perms = random_permutation(spec, 1, generator=gen(3))
    field.set_anchor(theta[1:])
    out = field(t, theta[:1])
    field.set_anchor(permute(spec, theta[1:], perms))
    torch.testing.assert_close(field(t, permute(spec, theta[:1], perms)), permute(spec, out, perms),
                               atol=1e-5, rtol=1e-4)


def test_channel_field_follows_the_weight_field_protocol():
    spec = SPECS[1]
    torch.manual_seed(0)
    field = ChannelField(spec, hidden=8, edge_dim=4, attention_layers=1)
    assert isinstance(field, WeightField) and FIELDS["channel"] is ChannelField
    cfg = field.config()
    assert cfg["architecture"] == "cnn" and cfg["kernel_size"] == 3 and cfg["widths"] == [1, 4, 6, 3]
    again = field_from_config(cfg)
    again.load_state_dict(field.state_dict())
    x, t = zoo(spec, 3), torch.rand(3)
    assert torch.equal(again(t, x), field(t, x))
    assert field.with_spec(spec) is field
    with pytest.raises(ValueError, match="anchored=False"):
        field.set_anchor(x[0])
    wider = field.with_spec(CNNSpec(1, (7, 2), 3, 3))          # no parameter depends on a hidden width
    assert wider(0.5, zoo(wider.spec, 2)).shape == (2, wider.spec.n_params)
    assert field.zero_() is field and torch.equal(field(t, x), torch.zeros_like(x))
    anchored = ChannelField(spec, hidden=8, edge_dim=4, anchored=True)
    anchored.set_anchor(x[0])
    assert field_from_config(anchored.config()).anchored and anchored(t, x).shape == x.shape
    with pytest.raises(ValueError, match="anchored field"):
        anchored.with_spec(CNNSpec(1, (7, 2), 3, 3))
    # widened, the anchored field reads every copy of a channel beside a copy of its anchor channel: on a
    # network widened by repeating channels it computes its own output, repeated
    from wsbook.nets import repeat_units

    wide = CNNSpec(1, (8, 12), 3, 3)
    with torch.no_grad():
        for p in anchored.parameters():         # the decoders and linear terms start at zero; give them values
            p.add_(0.1 * torch.randn_like(p))
        big = anchored.with_spec(wide)
        assert torch.equal(big.anchor, repeat_units(spec, anchored.anchor, wide))
        torch.testing.assert_close(big(t, repeat_units(spec, x, wide)), repeat_units(spec, anchored(t, x), wide),
                                   atol=1e-5, rtol=1e-4)


def test_flat_field_reads_a_cnn():
    spec = SPECS[1]
    field = FlatField(spec, hidden=16, depth=2)
    x = zoo(spec, 3)
    assert field(torch.rand(3), x).shape == x.shape
    again = field_from_config(field.config())
    assert again.spec == spec and isinstance(again, FlatField)


def test_mlp_configs_keep_their_keys():
    mlp = MLPSpec((4, 5, 2))
    assert list(GeometricChart(mlp).config()) == ["kind", "widths", "activation", "sigma", "reference", "last_layer"]
    assert list(NeuronField(mlp, hidden=8).config()) == ["kind", "widths", "activation", "hidden", "depth",
                                                         "attention_layers", "heads"]
    assert chart_from_config(EuclideanChart(mlp).config()).spec == mlp


# ------------------------------------------------------------------------------------------- likelihood
class _Diagonal(nn.Module):
    """``v(t, x) = a * x`` per coordinate (weight layout)."""

    def __init__(self, a: torch.Tensor):
        super().__init__()
        self.a = nn.Parameter(a)

    def forward(self, t, x):
        return self.a * x


class _RotateAndScale(nn.Module):
    """On the Geometric chart: every channel's sphere rotated by a skew matrix ``A`` (one per block of equal
    spheres; a Killing field, divergence zero), the Euclidean head scaled by ``a`` per coordinate."""

    def __init__(self, chart: GeometricChart, seed: int = 0):
        super().__init__()
        self.chart, g = chart, gen(seed)
        self.skews = []
        for b in chart.manifold.blocks:
            if b.kind == "sphere":
                m = torch.randn(b.factor_dim, b.factor_dim, generator=g) * 0.1
                self.skews.append(m - m.T)
        self.a = torch.rand(chart.last.stop - chart.last.start, generator=g) - 0.5
        self.p = nn.Parameter(torch.zeros(1))            # a device for WeightFlow.sample

    def forward(self, t, x):
        p = self.chart.unlayout(x)
        out, k = torch.zeros_like(p), 0
        for b in self.chart.manifold.blocks:
            xs = p[:, b.slice]
            if b.kind == "sphere":
                rows = xs.reshape(-1, b.n_factors, b.factor_dim)
                out[:, b.slice] = (rows @ self.skews[k].T).reshape(xs.shape)
                k += 1
            else:
                out[:, b.slice] = self.a * xs
        return self.chart.layout(out)

    def inverse(self, points):
        """Where the flow from t = 0 to 1 started, for points at t = 1."""
        out, k = points.clone(), 0
        for b in self.chart.manifold.blocks:
            if b.kind == "sphere":
                rows = points[:, b.slice].reshape(-1, b.n_factors, b.factor_dim)
                out[:, b.slice] = (rows @ torch.linalg.matrix_exp(-self.skews[k]).T).reshape(-1, b.stop - b.start)
                k += 1
            else:
                out[:, b.slice] = points[:, b.slice] * torch.exp(-self.a)
        return out


def test_log_prob_of_an_analytic_field_is_the_change_of_variables():
    # Euclidean: x1 = exp(a) x0 coordinate-wise, log p1(x1) = log p0(exp(-a) x1) - sum(a)
    spec = CNNSpec(1, (2,), 3, 2)                        # 26 parameters: the exact divergence
    chart = EuclideanChart(spec, sigma=0.5)
    a = torch.rand(spec.n_params, generator=gen(0)) - 0.5
    flow = WeightFlow(chart, _Diagonal(a))
    theta = zoo(spec, 3)
    logp = flow.log_prob(theta, steps=10, estimator="exact")
    torch.testing.assert_close(logp, chart.source_log_prob(theta * torch.exp(-a)) - a.sum(), atol=1e-3, rtol=1e-5)
    # Geometric: rotations of every channel's sphere keep the uniform density; the head is scaled
    spec = CNNSpec(1, (2,), 3, 2)                        # two S^9 and a Euclidean head of 6: 26 coordinates
    chart = GeometricChart(spec, sigma=0.7)
    field = _RotateAndScale(chart)
    flow = WeightFlow(chart, field)
    points = chart.to_points(zoo(spec, 3, seed=2))
    res = flow.likelihood(points, steps=8, estimator="exact")
    torch.testing.assert_close(res.x0, field.inverse(points), atol=1e-4, rtol=1e-4)
    expected = chart.source_log_prob(field.inverse(points)) - field.a.sum()
    torch.testing.assert_close(res.logp, expected, atol=2e-3, rtol=1e-5)
    # sampling runs the same field forward: the inverse maps samples back to their source points
    x0 = chart.sample_source(4, gen(3))
    x1 = flow.integrate(x0, steps=8, method="rk4").x
    torch.testing.assert_close(field.inverse(x1), x0, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("kind", ["geometric", "euclidean"])
def test_fit_then_sample_gives_cnns_that_load_into_torch(kind):
    spec = CNNSpec(1, (4, 6), 3, 3)
    theta = zoo(spec, 12)
    torch.manual_seed(0)
    if kind == "geometric":
        chart, field = GeometricChart(spec, reference=theta[0]), ChannelField(spec, hidden=16, edge_dim=8)
        flow = WeightFlow(chart, field, coupling="ot", align_pairs=True)
    else:
        chart, field = EuclideanChart(spec, reference=theta[0]), FlatField(spec, hidden=32, depth=2)
        flow = WeightFlow(chart, field, coupling="ot", time_distribution="beta(1,2)")
    result = flow.fit(theta, steps=8, batch_size=6, generator=gen(1))
    assert result.losses.shape == (8,) and torch.isfinite(result.losses).all()
    samples = flow.sample(3, steps=4, generator=gen(2))
    assert samples.shape == (3, spec.n_params) and torch.isfinite(samples).all()
    x = images(spec, 2)
    logits = spec.to_module(samples[0])(x)
    assert logits.shape == (2, 3) and torch.allclose(logits, spec.forward(samples[:1], x)[0], atol=1e-5)
    logp = flow.log_prob(samples, steps=3, generator=gen(3))
    assert logp.shape == (3,) and torch.isfinite(logp).all()
    y = torch.randint(0, 3, (2,), generator=gen(5))
    guided = flow.sample(2, steps=3, generator=gen(6), guidance=Guidance(x, y, weight=0.1, batch_size=None))
    assert guided.shape == (2, spec.n_params) and torch.isfinite(guided).all()
    again = WeightFlow.from_state(flow.state_dict())
    assert again.chart.spec == spec and type(again.field) is type(field)
    assert torch.equal(again.sample(2, steps=3, generator=gen(4)), flow.sample(2, steps=3, generator=gen(4)))


def test_channel_flow_transfers_to_other_channel_counts():
    spec = CNNSpec(1, (4, 6), 3, 3)
    flow = WeightFlow(GeometricChart(spec), ChannelField(spec, hidden=8, edge_dim=4))
    flow.fit(zoo(spec, 6), steps=2, batch_size=6, generator=gen(0))
    other = flow.with_spec(CNNSpec(1, (5, 3), 3, 3))
    samples = other.sample(2, steps=2, generator=gen(1))
    assert samples.shape == (2, other.spec.n_params) and torch.isfinite(samples).all()


# ----------------------------------------------------------------------------------------------- errors
def test_clear_errors_on_bad_cnn_input():
    spec = CNNSpec(1, (4, 6), 3, 3)
    with pytest.raises(ValueError, match="another architecture"):
        WeightFlow(GeometricChart(spec), ChannelField(CNNSpec(1, (4, 5), 3, 3), hidden=8))
    with pytest.raises(ValueError, match="another architecture"):
        WeightFlow(EuclideanChart(spec), FlatField(MLPSpec((4, 5, 2)), hidden=8))
    for chart in (GeometricChart, NormalizedChart):
        with pytest.raises(ValueError, match="ReLU.*positively homogeneous"):
            chart(CNNSpec(1, (4,), 3, 3, activation="tanh"))
    EuclideanChart(CNNSpec(1, (4,), 3, 3, activation="tanh"))          # the Euclidean chart needs no ReLU
    with pytest.raises(TypeError, match="MLPSpec or a CNNSpec"):
        EuclideanChart("a spec")
    with pytest.raises(TypeError, match="needs a CNNSpec"):
        ChannelField(MLPSpec((4, 5, 2)))
    with pytest.raises(ValueError, match="kind of network"):
        GeometricChart(spec).with_spec(MLPSpec((1, 4, 6, 3)))
    with pytest.raises(ValueError, match="kernel size"):
        ChannelField(spec, hidden=8).with_spec(CNNSpec(1, (4, 6), 5, 3))
    with pytest.raises(ValueError, match="parameters per network"):
        GeometricChart(spec).to_points(torch.zeros(2, spec.n_params + 1))


def test_first_layer_tiles_of_a_cnn_are_its_filters():
    """figures.neuron_tiles draws a one-channel CNN's first-layer filters, one k x k tile each, scaled to
    its largest weight: network i's filter j sits in row i, column j."""
    from wsbook.figures import neuron_tiles

    spec = CNNSpec(1, (3, 2), kernel_size=3, n_classes=4)
    theta = torch.randn(2, spec.n_params, generator=torch.Generator().manual_seed(0))
    image = neuron_tiles(spec, theta, gap=1)
    assert image.shape == (2 * 4 - 1, 3 * 4 - 1)
    w = spec.weights(theta)[0]                                       # [2, 3, 1, 3, 3]
    tile = torch.as_tensor(image[4:7, 8:11]).float()                 # network 1, filter 2
    assert torch.allclose(tile, (w[1, 2, 0] / w[1, 2].abs().max()).float(), atol=1e-6)
    with pytest.raises(ValueError, match="one input channel"):
        neuron_tiles(CNNSpec(2, (3,)), torch.zeros(1, CNNSpec(2, (3,)).n_params))


# ------------------------------------------------------------------------------------------ width transfer
@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_packed_cnns_compute_the_mean_of_their_members_logits(spec):
    """pack_cnns puts k CNNs side by side: the packed network's logits are the mean of the members' logits,
    and the kernels between two members are zero (block-diagonal)."""
    from wsbook.nets import pack_cnns

    theta, x = zoo(spec, 6), images(spec)
    for k in (1, 2, 3):
        wide, packed = pack_cnns(spec, theta, k)
        assert wide.channels == tuple(c * k for c in spec.channels) and packed.shape == (6 // k, wide.n_params)
        mean = outputs(spec, theta, x).reshape(6 // k, k, x.shape[0], -1).mean(1)
        torch.testing.assert_close(outputs(wide, packed, x), mean, atol=1e-5, rtol=1e-5)
        for w, c_out, c_in in zip(wide.weights(packed)[1:-1], spec.channels[1:], spec.channels[:-1]):
            blocks = w.reshape(6 // k, k, c_out, k, c_in, -1)
            off = ~torch.eye(k, dtype=torch.bool)
            assert (blocks.permute(1, 3, 0, 2, 4, 5)[off] == 0).all()
    with pytest.raises(ValueError, match="whole groups"):
        pack_cnns(spec, theta, 4)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_repeated_units_compute_the_network_once_their_readers_are_divided(spec):
    """repeat_units widens a CNN (and an MLP) by copying hidden units: with every layer that reads hidden units
    divided by the width ratio it computes the original network; a source centred on a network goes to other
    widths the same way, and a flow from such a source samples at the new width."""
    from wsbook.nets import repeat_units

    theta, x = zoo(spec, 3), images(spec)
    for k in (2, 3):
        wide = CNNSpec(spec.in_channels, tuple(c * k for c in spec.channels), spec.kernel_size, spec.n_classes)
        copies = repeat_units(spec, theta, wide)
        ws, bs = wide.weights(copies), wide.biases(copies)
        assert torch.equal(ws[0][:, spec.channels[0]:2 * spec.channels[0]], spec.weights(theta)[0])
        averaged = wide.pack([ws[0], *(w / k for w in ws[1:])], bs)
        torch.testing.assert_close(outputs(wide, averaged, x), outputs(spec, theta, x), atol=1e-5, rtol=1e-5)
    mlp, wide_mlp = MLPSpec((4, 3, 5, 2)), MLPSpec((4, 6, 10, 2))
    nets = mlp.init(2, generator=gen(3))
    copies = repeat_units(mlp, nets, wide_mlp)
    ws, bs = wide_mlp.weights(copies), wide_mlp.biases(copies)
    x_mlp = torch.randn(5, 4, generator=gen(4))
    torch.testing.assert_close(wide_mlp.forward(wide_mlp.pack([ws[0], *(w / 2 for w in ws[1:])], bs), x_mlp),
                               mlp.forward(nets, x_mlp), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="kind of network"):
        repeat_units(spec, theta, mlp)

    wide = CNNSpec(spec.in_channels, tuple(2 * c for c in spec.channels), spec.kernel_size, spec.n_classes)
    chart = EuclideanChart(spec, sigma=0.01, loc=theta[0])
    flow = WeightFlow(chart, ChannelField(spec, hidden=8, edge_dim=4))
    moved = flow.with_spec(wide)
    assert torch.equal(moved.chart.loc, repeat_units(spec, theta[:1], wide))
    source = moved.chart.sample_source(256, generator=gen(5))
    assert (source.mean(0) - moved.chart.loc[0]).abs().max() < 0.01
    assert moved.sample(2, steps=2, generator=gen(6)).shape == (2, wide.n_params)


def test_width_transfer_rows_at_a_tiny_size(fake_zoo):
    """flows.transfer_rows on a tiny zoo of random 1-2-2-10 CNNs, two flows trained for 2 steps and a random
    'wide' zoo of 1-4-4-10 CNNs: every row of TRANSFER_ROWS with finite means and standard errors, and the
    verdicts on the flow's row only."""
    from wsbook.experiments import flows, protocol, targets

    spec, wide_spec = CNNSpec(1, (2, 2), 3, 10), CNNSpec(1, (4, 4), 3, 10)
    cfg = targets.CNNZooConfig("digits", (1, 2, 2, 10), "adam", 1e-2, epochs=1, discard_epochs=0, every=1)
    split = protocol.split_runs(fake_zoo(spec, cfg, 7, 3, 0), 2)
    trained = {}
    for seed in (1, 2):
        flow = WeightFlow(EuclideanChart(spec), ChannelField(spec, hidden=8, edge_dim=4), coupling="ot",
                          align_pairs=True)
        flow.fit(split.train.theta, steps=2, batch_size=4, generator=gen(seed))
        trained[seed] = flow
    out = flows.transfer_rows(split, fake_zoo(wide_spec, cfg, 2, 3, 1), trained, n=4, steps=2,
                              accuracy_gap=flows.ACCURACY_GAP)
    rows = out["rows"]
    assert list(rows) == list(flows.TRANSFER_ROWS) and out["k"] == 2 and out["seeds"] == [1, 2]
    assert rows["trained wide zoo"]["seeds"] == 2 and rows["packed ensemble"]["seeds"] == 2
    for row in rows.values():
        for col in ("accuracy", "nll", "bma_accuracy"):
            assert math.isfinite(row[col]) and math.isfinite(row[f"{col}_se"]) and row[f"{col}_se"] >= 0
    assert rows["flow at the new width"]["transfer verdict"] in protocol.VERDICTS
    assert rows["packed ensemble"]["transfer verdict"] == "—"


def test_equivariant_against_flat_pairs_each_fields_chosen_flow(monkeypatch):
    """The like-for-like reading compares the channel table's chosen row with the flat table's, by MMD²."""
    import pandas as pd

    from wsbook.experiments import flows

    def table(field):
        chosen = {"channel": "ch", "flat": "fl"}[field]
        mmd = {"channel": (5.0, 0.2), "flat": (0.7, 0.05)}[field]
        t = pd.DataFrame({"seeds": [3, 3], "mmd_ratio": [mmd[0], 11.0], "mmd_ratio_se": [mmd[1], 0.3]},
                         index=[chosen, "plain baseline"])
        t.attrs["selected"] = chosen
        return t

    monkeypatch.setattr(flows, "cnn_verdict_table", table)
    pair = flows.equivariant_against_flat()
    assert list(pair.index) == ["ch", "fl"] and list(pair["field"]) == ["channel", "flat"]
    assert pair.loc["ch", "MMD² vs flat"] == "missed" and pair.loc["fl", "MMD² vs flat"] == "—"
