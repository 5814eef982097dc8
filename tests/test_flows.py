"""Mathematics of wsbook.flows: couplings, paths, solvers, likelihoods, training."""
import math

import numpy as np
import pytest
import torch

from wsbook import flows
from wsbook.manifolds import Euclidean, Product, Sphere


pytestmark = pytest.mark.usefixtures("one_thread")


class Linear(torch.nn.Module):
    """v(t, x) = A x: its flow is x_t = expm(t A) x_0."""

    def __init__(self, a):
        super().__init__()
        self.a = a

    def forward(self, t, x):
        return x @ self.a.T


def test_ode_with_known_solution_all_methods():
    a = torch.tensor([[0.0, -1.0], [1.0, 0.0]])       # rotation: x_1 = R(1 rad) x_0
    x0 = torch.randn(16, 2, generator=torch.Generator().manual_seed(0))
    exact = x0 @ torch.linalg.matrix_exp(a).T
    errors = {}
    for method, steps in (("euler", 200), ("midpoint", 50), ("rk4", 10), ("dopri5", 0)):
        out = flows.solve_ode(Linear(a), x0, method=method, steps=max(steps, 1))
        errors[method] = (out.x - exact).abs().max().item()
        assert out.nfe > 0
    assert errors["euler"] < 1e-2 and errors["midpoint"] < 1e-3 and errors["rk4"] < 1e-5 and errors["dopri5"] < 1e-4
    out = flows.solve_ode(Linear(a), x0, method="euler", steps=10, return_trajectory=True)
    assert out.trajectory.shape == (11, 16, 2) and out.nfe == 10


def test_linear_field_likelihood_matches_gaussian_pushforward():
    a = torch.tensor([[0.3, 0.4], [-0.2, -0.5]], dtype=torch.float64)
    m = torch.linalg.matrix_exp(a)
    cov = m @ m.T
    g = torch.Generator().manual_seed(1)
    x1 = torch.randn(32, 2, generator=g, dtype=torch.float64) @ m.T
    exact = torch.distributions.MultivariateNormal(torch.zeros(2, dtype=torch.float64), cov).log_prob(x1)
    for method in ("rk4", "dopri5"):
        res = flows.log_likelihood(Linear(a), x1, method=method, steps=20)
        assert torch.allclose(res.logp, exact, atol=1e-5), method
        assert torch.allclose(res.int_div, torch.full((32,), torch.trace(a).item(), dtype=torch.float64), atol=1e-6)


def test_hutchinson_mean_over_many_probes_matches_exact_trace():
    torch.manual_seed(0)
    net = flows.TimeMLP(3, hidden=32, depth=2)
    x = torch.randn(8, 3)
    f = lambda y: net(torch.tensor(0.3), y)  # noqa: E731
    _, exact = flows.divergence(f, x, "exact")
    probes = flows.rademacher((4000, 8, 3), torch.Generator().manual_seed(3))
    _, est = flows.divergence(f, x, "hutchinson", probes)
    # the estimator is eps^T J eps averaged over probes (J from autograd, row by row)
    jac = torch.stack([torch.autograd.functional.jacobian(lambda y: f(y[None])[0], xi) for xi in x])  # [B, 3, 3]
    per_probe = torch.einsum("pbi,bij,pbj->pb", probes, jac, probes)
    assert torch.allclose(est, per_probe.mean(0), atol=1e-5)
    _, each = flows.divergence(f, x, "hutchinson", probes[:5], per_probe=True)       # one estimate per probe
    assert each.shape == (5, 8) and torch.allclose(each, per_probe[:5], atol=1e-5)
    assert torch.allclose(exact, jac.diagonal(dim1=1, dim2=2).sum(-1), atol=1e-5)
    # unbiased: the mean over many probes lies within 4 standard errors of the exact trace
    se = per_probe.std(0) / math.sqrt(per_probe.shape[0])
    assert ((est - exact).abs() <= 4 * se + 1e-6).all()
    assert per_probe.std(0).max() > 0        # a non-trivial estimator (off-diagonal Jacobian entries)
    with pytest.raises(ValueError, match="probes of shape"):
        flows.divergence(f, x, "hutchinson", probes[:, :2])


def test_ot_coupling_cost_at_most_independent_and_is_a_permutation():
    g = torch.Generator().manual_seed(2)
    for manifold in (None, Sphere(3), Product.spheres(20, 3)):
        if manifold is None:
            x0, x1 = torch.randn(128, 2, generator=g), torch.randn(128, 2, generator=g) + 2
        else:
            x0, x1 = manifold.random_base(128, generator=g), manifold.random_base(128, generator=g)
        ot = flows.OTCoupling(manifold)
        y0, y1 = ot(x0, x1)
        assert torch.equal(y0, x0)
        assert torch.equal(torch.sort(y1, 0).values, torch.sort(x1, 0).values)   # same points, re-paired
        c_ot, c_ind = flows.coupling_cost(y0, y1, manifold), flows.coupling_cost(x0, x1, manifold)
        assert c_ot <= c_ind + 1e-6
        assert c_ot < 0.9 * c_ind
    # against a brute-force optimum on a tiny problem
    import itertools
    x0, x1 = torch.randn(6, 2, generator=g), torch.randn(6, 2, generator=g)
    cost = torch.cdist(x0, x1) ** 2
    best = min(sum(cost[i, p[i]].item() for i in range(6)) for p in itertools.permutations(range(6)))
    perm = flows.ot_assignment(cost)
    assert abs(cost[torch.arange(6), perm].sum().item() - best) < 1e-5


def test_small_batches_get_the_network_simplex_permutation():
    # up to HUNGARIAN_MAX_BATCH points SciPy's Hungarian method assigns; it must agree with POT's network simplex
    import ot
    g = torch.Generator().manual_seed(5)
    for n in (2, 17, flows.couplings.HUNGARIAN_MAX_BATCH):
        for _ in range(5):
            cost = torch.cdist(torch.randn(n, 2, generator=g), torch.randn(n, 2, generator=g) + 1) ** 2
            a = np.full(n, 1.0 / n)
            simplex = ot.emd(a, a, cost.double().numpy()).argmax(1)
            assert torch.equal(flows.ot_assignment(cost), torch.as_tensor(simplex))


def test_euclidean_ot_coupling_pairs_as_the_squared_distance_assignment():
    # the Euclidean coupling solves on inner products (the norms change every assignment's total alike): on
    # random batches it must pair exactly as SciPy's solver on the squared distances, in both solver branches
    from scipy.optimize import linear_sum_assignment
    g = torch.Generator().manual_seed(11)
    for n, repeats in ((2, 10), (17, 10), (flows.couplings.HUNGARIAN_MAX_BATCH, 20), (96, 3), (160, 2)):
        for dim in (2, 3, 16):
            for _ in range(repeats):
                x0, x1 = torch.randn(n, dim, generator=g), 2 * torch.randn(n, dim, generator=g) + 1
                cost = flows.OTCoupling().cost(x0, x1).double().numpy()
                assert torch.equal(flows.OTCoupling()(x0, x1)[1], x1[linear_sum_assignment(cost)[1]])
    # in one dimension the optimum is the sorted pairing; near-ties there are resolved by the float products,
    # so only the total is compared (exact arithmetic on the float inputs)
    for n in (64, 200):
        x0, x1 = torch.randn(n, 1, generator=g), 2 * torch.randn(n, 1, generator=g) + 1
        paired = flows.OTCoupling()(x0, x1)[1]
        exact = lambda a, b: ((a.double() - b.double()) ** 2).sum().item()  # noqa: E731
        best = exact(x0.sort(0).values, x1.sort(0).values)
        assert exact(x0, paired) <= best * (1 + 1e-9)
    # repeated points tie several assignments; the re-paired points are the same whichever is taken
    x0, x1 = torch.randn(64, 2, generator=g), torch.randn(16, 2, generator=g).repeat(4, 1)
    expected = linear_sum_assignment(flows.OTCoupling().cost(x0, x1).double().numpy())[1]
    assert torch.equal(flows.OTCoupling()(x0, x1)[1], x1[expected])


def test_ot_coupling_of_batches_far_from_the_origin():
    # both batches around one distant point (a source centred on the training networks): every inner product
    # is large and negative as a cost, which POT's network simplex once reported as infeasible
    from scipy.optimize import linear_sum_assignment
    g = torch.Generator().manual_seed(3)
    centre = 0.7 * torch.randn(300, generator=g)
    for n in (flows.couplings.HUNGARIAN_MAX_BATCH + 1, 256):
        x0, x1 = centre + 0.1 * torch.randn(n, 300, generator=g), centre + 0.7 * torch.randn(n, 300, generator=g)
        expected = linear_sum_assignment((torch.cdist(x0.double(), x1.double()) ** 2).numpy())[1]
        assert torch.equal(flows.OTCoupling()(x0, x1)[1], x1[expected])


def test_ot_failure_raises_instead_of_falling_back():
    with pytest.raises(ValueError, match="NaN"):
        flows.ot_assignment(torch.tensor([[0.0, float("nan")], [1.0, 0.0]]))
    import warnings
    with pytest.raises(RuntimeError, match="refusing"), warnings.catch_warnings():
        warnings.simplefilter("ignore")                       # POT also warns; the point is that we raise
        flows.ot_assignment(torch.rand(96, 96), numitermax=3)    # above HUNGARIAN_MAX_BATCH: the network simplex
    with pytest.raises(ValueError, match="equal shape"):
        flows.OTCoupling()(torch.zeros(4, 2), torch.zeros(5, 2))


def test_paths_endpoints_and_fields():
    g = torch.Generator().manual_seed(3)
    x0, x1 = torch.randn(10, 2, generator=g), torch.randn(10, 2, generator=g)
    xt, ut = flows.LinearPath().sample(x0, x1, torch.zeros(10))
    assert torch.allclose(xt, x0) and torch.allclose(ut, x1 - x0)
    s = Sphere(3)
    y0, y1 = s.random_base(10, generator=g), s.random_base(10, generator=g)
    path = flows.GeodesicPath(s)
    t = torch.rand(10, generator=g) * 0.9
    xt, ut = path.sample(y0, y1, t)
    assert s.belongs(xt).all() and s.is_tangent(xt, ut).all()
    # |u_t| is the constant speed d(x0, x1) of the geodesic
    assert torch.allclose(s.norm(xt, ut), s.dist(y0, y1), atol=1e-4)
    xt1, ut1 = path.sample(y0, y1, torch.ones(10))                   # t clipped: finite field, near x1
    assert torch.isfinite(ut1).all() and torch.allclose(xt1, y1, atol=1e-2)
    with pytest.raises(ValueError, match=r"times in \[0, 1\]"):
        path.sample(y0, y1, torch.full((10,), 1.5))
    with pytest.raises(ValueError, match="x0"):
        path.sample(y0 * 2, y1, t)


@pytest.mark.parametrize("method", ["euler", "midpoint", "rk4"])
def test_manifold_integrators_stay_on_manifold(method):
    p = Product.from_blocks([("sphere", 200, 3), ("euclidean", 1, 4)])
    g = torch.Generator().manual_seed(4)
    w = torch.randn(p.dim, p.dim, generator=g) * 0.5
    field = lambda t, x: p.proju(x, torch.tanh(x @ w) * (1 + t))  # noqa: E731
    x = p.random_base(16, generator=g)
    out = flows.solve_ode(field, x, manifold=p, method=method, steps=25, return_trajectory=True)
    for state in out.trajectory:
        assert p.belongs(state, atol=1e-5).all()
    # a plain Euclidean step with the same field leaves the spheres
    drift = p.factor_view(x + 0.5 * field(0.0, x)).norm(dim=-1) - 1
    assert drift.abs().max() > 1e-2
    with pytest.raises(ValueError, match="on Product"):
        flows.solve_ode(field, x * 2, manifold=p, method=method, steps=5)


def test_manifold_rk4_converges_on_rotation_field():
    # v(x) = omega x e_z (rotation about the z axis): the exact flow rotates by angle omega t
    s = Sphere(3)
    omega = 2.0
    field = lambda t, x: omega * torch.stack([-x[:, 1], x[:, 0], torch.zeros_like(x[:, 0])], 1)  # noqa: E731
    # float64: fourth-order RK4 reaches float32 rounding (~5e-7) at 20 steps, where convergence is unmeasurable
    x0 = s.random_base(8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    c, sn = math.cos(omega), math.sin(omega)
    exact = torch.stack([c * x0[:, 0] - sn * x0[:, 1], sn * x0[:, 0] + c * x0[:, 1], x0[:, 2]], 1)
    err = {m: (flows.solve_ode(field, x0, manifold=s, method=m, steps=20).x - exact).abs().max().item()
           for m in ("euler", "midpoint", "rk4")}
    # midpoint (second order) and RK4 (fourth order) beat Euler and converge
    assert max(err["rk4"], err["midpoint"]) < err["euler"] / 10
    assert err["rk4"] < err["midpoint"] / 10
    finer = (flows.solve_ode(field, x0, manifold=s, method="rk4", steps=40).x - exact).abs().max().item()
    assert finer < err["rk4"] / 3


def test_sphere_likelihood_of_zero_field_is_uniform_and_rotation_preserves_it():
    s = Sphere(3)
    x = s.random_base(16, generator=torch.Generator().manual_seed(6))
    rot = lambda t, y: torch.stack([-y[:, 1], y[:, 0], torch.zeros_like(y[:, 0])], 1)  # noqa: E731  divergence-free
    res = flows.log_likelihood(rot, x, manifold=s, method="rk4", steps=10)
    assert torch.allclose(res.logp, torch.full((16,), -math.log(4 * math.pi)), atol=1e-5)
    # a field pushing mass to the north pole: density of the pushforward at the pole exceeds uniform
    north = torch.tensor([0.0, 0.0, 1.0])
    push = lambda t, y: s.proju(y, north.expand_as(y))  # noqa: E731
    res = flows.log_likelihood(push, north.expand(1, 3).clone(), manifold=s, method="rk4", steps=20)
    # exact: the flow of the gradient of z; at the pole div = -2 (z = 1 fixed), so log p = -log 4 pi + 2
    assert abs(res.logp.item() - (2.0 - math.log(4 * math.pi))) < 1e-4


def test_cfm_training_reduces_loss_and_matches_target():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    target = flows.GaussianMixture(torch.tensor([[2.0, 0.0], [-2.0, 0.0]]), 0.3)
    model = flows.TimeMLP(2, hidden=64, depth=3)
    res = flows.train_flow(model, target, flows.standard_normal(2), path=flows.LinearPath(),
                           coupling=flows.OTCoupling(), steps=500, batch_size=128, lr=1e-2, generator=g,
                           progress=False)
    assert res.losses[-30:].mean() < 0.5 * res.losses[:30].mean()
    x = flows.solve_ode(res.ema, torch.randn(2000, 2, generator=g), method="rk4", steps=10).x
    assert abs((x[:, 0] > 0).float().mean().item() - 0.5) < 0.05            # both modes, equal mass
    assert (x[:, 0].abs() < 1).float().mean() < 0.08                          # little mass between them
    assert abs(x[:, 0].abs().mean().item() - 2.0) < 0.15 and abs(x[:, 1].std().item() - 0.3) < 0.1


@pytest.mark.parametrize("geometry", ["euclidean", "sphere"])
def test_train_flow_reads_no_value_on_the_host_per_step(host_reads, geometry):
    """With the NaN check spaced out (as on a GPU), a step of the chapter-3 trainer reads nothing on the host:
    5 and 30 steps read the same number of values (the first step's validation of points and times and the
    final NaN check). A per-step ``.item()``, check of the path's times or points, or NaN check would add
    reads every step. The CPU default still checks every step's loss."""
    s = Sphere(3)

    def run(steps: int, **kw):
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        if geometry == "sphere":
            model, target, source, path = (flows.TimeMLP(3, hidden=8, depth=1, manifold=s),
                                           s.random_base(64, generator=torch.Generator().manual_seed(2)), s,
                                           flows.GeodesicPath(s))
        else:
            model, target, source, path = (flows.TimeMLP(2, hidden=8, depth=1), torch.randn(64, 2),
                                           flows.standard_normal(2), flows.LinearPath(0.01))
        return lambda: flows.train_flow(model, target, source, path=path, coupling=flows.IndependentCoupling(),
                                        steps=steps, batch_size=16, generator=g, progress=False, **kw)

    assert host_reads(run(30, check_every=1000)) == host_reads(run(5, check_every=1000))
    per_step = host_reads(run(30)) - host_reads(run(30, check_every=1000))
    assert per_step >= 29
    # spacing out the check changes nothing else
    assert torch.equal(run(30)().losses, run(30, check_every=1000)().losses)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_train_flow_does_not_synchronise_per_step_on_cuda():
    """On a GPU, CUDA's sync debug mode reports every synchronising call: 5 and 55 steps of the chapter-3
    trainer differ by at most the two extra NaN checks (every 25 steps)."""
    import warnings

    def syncs(steps: int) -> int:
        torch.manual_seed(0)
        model = flows.TimeMLP(2, hidden=16, depth=1).cuda()
        target = torch.randn(256, 2, device="cuda") + 2
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                flows.train_flow(model, target, flows.standard_normal(2), path=flows.LinearPath(0.01),
                                 coupling=flows.IndependentCoupling(), steps=steps, batch_size=32,
                                 generator=torch.Generator().manual_seed(1), progress=False)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        return sum("synchroniz" in str(w.message) for w in caught)

    syncs(5)                                      # warm up (lazy initialisation may synchronise once)
    assert syncs(55) - syncs(5) <= 2


def test_train_flow_still_stops_at_a_non_finite_loss():
    """The first step validates its points and times; a loss that turns NaN later is caught by the loop
    (on the CPU before the update, naming the step)."""
    class Breaks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.calls = flows.TimeMLP(2, hidden=8, depth=1), 0

        def forward(self, t, x):
            self.calls += 1
            out = self.inner(t, x)
            return out * float("nan") if self.calls > 3 else out

    kw = dict(path=flows.LinearPath(), coupling=flows.IndependentCoupling(), steps=10, batch_size=8,
              generator=torch.Generator().manual_seed(0), progress=False)
    with pytest.raises(FloatingPointError, match="step 3 of 10"):
        flows.train_flow(Breaks(), torch.randn(32, 2), flows.standard_normal(2), **kw)
    with pytest.raises(ValueError, match="x1"):          # off the sphere: the first step's check
        s = Sphere(3)
        flows.train_flow(flows.TimeMLP(3, hidden=8, depth=1, manifold=s), torch.randn(32, 3), s,
                         **{**kw, "path": flows.GeodesicPath(s)})


def test_straightness_of_a_line_and_a_detour():
    t = torch.linspace(0, 1, 11)[:, None, None]
    line = t * torch.tensor([[1.0, 2.0]])
    s = flows.straightness(line)
    assert torch.allclose(s["ratio"], torch.ones(1)) and s["energy_excess"].abs().max() < 1e-5
    bent = torch.cat([torch.stack([t[:6, :, 0] * 2, 0 * t[:6, :, 0]], -1),
                      torch.stack([torch.ones(5, 1), (t[6:, :, 0] - 0.5) * 2], -1)], 0)
    assert flows.straightness(bent)["ratio"].item() < 0.8


def test_vmf_mixture_density_normalised_and_sampler_consistent():
    g = torch.Generator().manual_seed(8)
    vmf = flows.VonMisesFisherMixture(torch.tensor([[0.0, 0, 1], [1.0, 0, 0]]), torch.tensor([5.0, 20.0]),
                                      torch.tensor([0.3, 0.7]))
    u = Sphere(3).random_uniform(200000, generator=g)
    assert abs((vmf.log_prob(u).exp().mean() * 4 * math.pi).item() - 1) < 0.02     # integrates to 1
    x = vmf.sample(20000, g)
    a = lambda k: 1 / math.tanh(k) - 1 / k  # noqa: E731   mean resultant length of vMF on S^2
    assert torch.allclose(x.mean(0), torch.tensor([0.7 * a(20.0), 0.0, 0.3 * a(5.0)]), atol=0.015)
    # E[mu^T x] for one vMF on S^2 is coth(kappa) - 1/kappa
    one = flows.VonMisesFisherMixture(torch.tensor([[0.0, 1.0, 0]]), 20.0).sample(20000, g)
    assert abs(one[:, 1].mean().item() - (1 / math.tanh(20) - 1 / 20)) < 0.005


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="method"):
        flows.solve_ode(lambda t, x: x, torch.zeros(2, 2), method="heun")
    with pytest.raises(ValueError, match="t1"):
        flows.solve_ode(lambda t, x: x, torch.zeros(2, 2), t1=1.5)
    with pytest.raises(ValueError, match="dopri5"):
        flows.solve_ode(lambda t, x: x, Sphere(3).random_base(2), manifold=Sphere(3), method="dopri5")
    with pytest.raises(ValueError, match=r"\[B, 3\]"):
        flows.TimeMLP(3)(torch.tensor(0.5), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="coordinates"):
        flows.log_likelihood(lambda t, x: x, torch.zeros(4, 2), manifold=Euclidean(3))
    with pytest.raises(ValueError, match="estimator"):
        flows.log_likelihood(lambda t, x: x, torch.zeros(4, 2), estimator="skilling")
    with pytest.raises(ValueError, match="independent"):
        flows.make_coupling("sinkhorn")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_flow_pipeline_runs_on_cuda():
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(9)
    s = Sphere(3)
    target = flows.VonMisesFisherMixture(torch.tensor([[0.0, 0, 1]]), 10.0)
    model = flows.TimeMLP(3, hidden=32, depth=2, manifold=s).to(dev)
    res = flows.train_flow(model, lambda n, gen: target.sample(n, gen), s, path=flows.GeodesicPath(s),
                           coupling=flows.OTCoupling(s), steps=20, batch_size=64, generator=g, progress=False)
    x0 = s.random_base(32, generator=g, device=dev)
    out = flows.solve_ode(res.ema, x0, manifold=s, method="rk4", steps=5)
    assert out.x.device.type == "cuda" and s.belongs(out.x).all()
    lik = flows.log_likelihood(res.ema, out.x, manifold=s, steps=5, estimator="hutchinson", n_probes=2, generator=g)
    assert lik.logp.device.type == "cuda" and torch.isfinite(lik.logp).all()
    euc = flows.TimeMLP(2, hidden=16, depth=1).to(dev)
    res = flows.train_flow(euc, torch.randn(256, 2, device=dev) + 2, flows.standard_normal(2),
                           path=flows.LinearPath(0.01), coupling=flows.OTCoupling(), steps=10, batch_size=32,
                           generator=g, progress=False)
    out = flows.solve_ode(res.ema, torch.randn(16, 2, device=dev), method="dopri5")
    assert out.x.device.type == "cuda" and out.nfe > 0
    assert flows.log_likelihood(res.ema, out.x, method="euler", steps=4).logp.device.type == "cuda"


def test_manifold_rk4_is_fourth_order_on_mixed_spheres():
    """Issue 10, item 4: on a product of spheres of mixed dimensions (S^1, S^2, S^4, S^7) under a
    time-dependent rotation field with a closed-form flow, the observed order of ``rk4`` (halving the step)
    is about 4 (midpoint: 2). Projected stage velocities made it a second-order method."""
    dt = torch.float64
    g = torch.Generator().manual_seed(21)
    p = Product.from_blocks([("sphere", 3, 3), ("sphere", 2, 5), ("sphere", 4, 2), ("sphere", 1, 8)])
    skews = []
    for b in p.blocks:
        w = torch.randn(b.n_factors, b.factor_dim, b.factor_dim, generator=g, dtype=dt)
        skews.append(2.0 * (w - w.transpose(1, 2)) / math.sqrt(b.factor_dim))

    def rotate(x, angle_scale):
        parts = [torch.einsum("fij,bfj->bfi", torch.linalg.matrix_exp(angle_scale * a) if angle_scale is not None
                              else a, p.factor_view(x, k)).reshape(x.shape[0], -1) for k, a in enumerate(skews)]
        return torch.cat(parts, -1)

    speed = lambda t: 1 + 0.5 * math.sin(3 * float(t))                   # noqa: E731
    field = lambda t, x: speed(t) * rotate(x, None)                        # noqa: E731
    x0 = p.random_base(32, generator=g, dtype=dt)
    exact = rotate(x0, 1 - (math.cos(3.0) - 1) / 6)                        # rotation by int_0^1 speed
    orders = {}
    for method in ("midpoint", "rk4"):
        errs = [p.dist(flows.solve_ode(field, x0, manifold=p, method=method, steps=n).x, exact).max().item()
                for n in (16, 32, 64)]
        orders[method] = math.log2(errs[1] / errs[2])
    assert orders["rk4"] > 3.5, orders
    assert 1.8 < orders["midpoint"] < 2.3, orders


def test_wasserstein2_names_nan_and_inf_inputs():
    """Issue 10, item 12: a NaN or inf point is reported as such (POT used to answer "Problem unbounded")."""
    x, y = torch.randn(6, 3), torch.randn(5, 3)
    for bad, where in ((float("nan"), "x"), (float("inf"), "y")):
        xb, yb = x.clone(), y.clone()
        (xb if where == "x" else yb)[2, 1] = bad
        with pytest.raises(ValueError, match=rf"wasserstein2: {where} contains NaN or inf"):
            flows.wasserstein2(xb, yb)
    s = Sphere(3)
    with pytest.raises(ValueError, match="NaN"):
        flows.wasserstein2(s.projx(x), torch.full((5, 3), float("nan")), s)


def test_mmd2_is_unbiased_where_w2_has_a_floor():
    """Issue 11: two samples of one distribution have a positive empirical W2 but an MMD^2 centred on 0;
    a shifted distribution is clearly separated from it."""
    g = torch.Generator().manual_seed(0)
    same = [flows.mmd2(torch.randn(300, 2, generator=g), torch.randn(300, 2, generator=g)) for _ in range(20)]
    shifted = flows.mmd2(torch.randn(300, 2, generator=g) + 0.5, torch.randn(300, 2, generator=g))
    spread = float(np.std(same))
    assert abs(float(np.mean(same))) < 3 * spread / np.sqrt(len(same)) + 1e-4
    assert min(same) < 0 < max(same), "an unbiased estimate scatters on both sides of 0"
    assert shifted > 10 * spread
    assert flows.wasserstein2(torch.randn(300, 2, generator=g), torch.randn(300, 2, generator=g)) > 0.05
    with pytest.raises(ValueError, match="mmd2"):
        flows.mmd2(torch.randn(5, 2), torch.randn(5, 3))
    with pytest.raises(ValueError, match="positive"):
        flows.mmd2(torch.randn(5, 2), torch.randn(5, 2), bandwidths=[0.0])
