"""Identities of wsbook.manifolds: exp/log inverse, distances, tangency, transport, checks."""
import math

import pytest
import torch

from wsbook.manifolds import Euclidean, Product, Sphere



@pytest.fixture(autouse=True)
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def manifolds():
    return [Euclidean(5), Sphere(3), Sphere(7),
            Product.from_blocks([("sphere", 50, 3), ("sphere", 4, 5), ("euclidean", 1, 6)])]


def tangent(m, x, g, scale=0.8):
    u = m.proju(x, torch.randn(x.shape, generator=g))
    if not isinstance(m, Euclidean):   # keep each factor's step below pi so log(exp) is the identity
        u = u / m.norm(x, u).unsqueeze(-1).clamp_min(1e-9) * scale * torch.rand(x.shape[0], 1, generator=g)
        if isinstance(m, Product):
            u = m.proju(x, torch.randn(x.shape, generator=g)) * 0.3
    return u


@pytest.mark.parametrize("m", manifolds(), ids=repr)
def test_exp_log_identities(m):
    g = torch.Generator().manual_seed(0)
    x, y = m.random_base(64, generator=g), m.random_base(64, generator=g)
    u = tangent(m, x, g)
    assert torch.allclose(m.logmap(x, m.expmap(x, u)), u, atol=1e-8)
    assert torch.allclose(m.expmap(x, m.logmap(x, y)), y, atol=1e-8)
    assert torch.allclose(m.dist(x, m.expmap(x, u)), m.norm(x, u), atol=1e-8)
    assert m.logmap(x, x).abs().max() < 1e-10
    assert m.dist(x, x).abs().max() == 0
    assert m.belongs(m.expmap(x, u)).all() and m.is_tangent(x, m.logmap(x, y)).all()


@pytest.mark.parametrize("m", manifolds(), ids=repr)
def test_transport_preserves_norms_and_tangency(m):
    g = torch.Generator().manual_seed(1)
    x, y = m.random_base(32, generator=g), m.random_base(32, generator=g)
    v, w = m.proju(x, torch.randn(x.shape, generator=g)), m.proju(x, torch.randn(x.shape, generator=g))
    tv, tw = m.transp(x, y, v), m.transp(x, y, w)
    assert torch.allclose(m.norm(y, tv), m.norm(x, v), atol=1e-8)
    assert torch.allclose(m.inner(y, tv, tw), m.inner(x, v, w), atol=1e-8)
    assert m.is_tangent(y, tv).all()


def test_sphere_transport_moves_log_along_geodesic():
    s, g = Sphere(3), torch.Generator().manual_seed(2)
    x, y = s.random_base(16, generator=g), s.random_base(16, generator=g)
    # the velocity of the geodesic at x, transported to y, is minus the log at y back to x
    assert torch.allclose(s.transp(x, y, s.logmap(x, y)), -s.logmap(y, x), atol=1e-8)


def test_sphere_distance_accurate_at_zero_and_antipode_and_finite_grad():
    s = Sphere(3)
    x = torch.tensor([[1.0, 0, 0]])
    eps = 1e-7
    y = s.projx(torch.tensor([[1.0, eps, 0]]))
    assert abs(s.dist(x, y).item() - eps) < 1e-12
    z = s.projx(torch.tensor([[-1.0, eps, 0]]))
    assert abs(s.dist(x, z).item() - (math.pi - eps)) < 1e-9
    xx = x.clone().requires_grad_(True)
    s.dist(xx, x).sum().backward()
    assert torch.isfinite(xx.grad).all()
    xx.grad = None
    s.logmap(xx, x).sum().backward()
    assert torch.isfinite(xx.grad).all()


def test_geodesic_interpolation_and_uniform_density():
    s, g = Sphere(3), torch.Generator().manual_seed(3)
    x, y = s.random_base(20, generator=g), s.random_base(20, generator=g)
    t = torch.rand(20, generator=g)
    z = s.geodesic(x, y, t)
    assert torch.allclose(s.dist(x, z), t * s.dist(x, y), atol=1e-8)
    assert torch.allclose(s.dist(z, y), (1 - t) * s.dist(x, y), atol=1e-8)
    assert torch.allclose(s.uniform_logprob(x), torch.full((20,), -math.log(4 * math.pi)))
    p = Product.spheres(10, 3)
    assert torch.allclose(p.uniform_logprob(p.random_uniform(4, generator=g)), torch.full((4,), -10 * math.log(4 * math.pi)))
    # uniform samples: mean of the coordinates is near 0, second moment 1/3
    u = s.random_uniform(20000, generator=g)
    assert u.mean(0).abs().max() < 0.03 and (u.pow(2).mean(0) - 1 / 3).abs().max() < 0.02


def test_product_matches_loop_over_factors_and_pairwise():
    g = torch.Generator().manual_seed(4)
    p = Product.from_blocks([("sphere", 30, 3), ("sphere", 2, 4), ("euclidean", 1, 3)])
    assert p.dim == 30 * 3 + 8 + 3 and p.intrinsic_dim == 30 * 2 + 2 * 3 + 3
    x, y = p.random_base(8, generator=g), p.random_base(8, generator=g)
    s3, s4 = Sphere(3), Sphere(4)
    d2 = sum(s3.dist(x[:, 3 * k:3 * k + 3], y[:, 3 * k:3 * k + 3]) ** 2 for k in range(30))
    d2 = d2 + sum(s4.dist(x[:, 90 + 4 * k:94 + 4 * k], y[:, 90 + 4 * k:94 + 4 * k]) ** 2 for k in range(2))
    d2 = d2 + ((x[:, 98:] - y[:, 98:]) ** 2).sum(-1)
    assert torch.allclose(p.dist(x, y) ** 2, d2)
    assert torch.allclose(p.pairwise_sqdist(x, y).diagonal(), d2)
    assert torch.allclose(p.logmap(x, y)[:, :3], s3.logmap(x[:, :3], y[:, :3]))
    assert torch.allclose(p.factor_dist(x, y, 0)[:, 5], s3.dist(x[:, 15:18], y[:, 15:18]))


def test_bad_inputs_raise():
    s = Sphere(3)
    with pytest.raises(ValueError, match="on Sphere"):
        s.check_point(torch.tensor([[2.0, 0, 0]]))
    with pytest.raises(ValueError, match="last axis has size 3"):
        s.check_point(torch.zeros(4, 5))
    with pytest.raises(ValueError, match="tangent"):
        s.check_vector(torch.tensor([[1.0, 0, 0]]), torch.tensor([[1.0, 0, 0]]))
    p = Product.spheres(4, 3)
    with pytest.raises(ValueError, match="last axis has size 12"):
        p.expmap(torch.zeros(2, 12), torch.zeros(2, 11))
    with pytest.raises(ValueError, match="kind"):
        Product.from_blocks([("torus", 1, 2)])
    with pytest.raises(ValueError, match="Euclidean block"):
        Product.from_blocks([("sphere", 2, 3), ("euclidean", 1, 2)]).random_uniform(3)
    with pytest.raises(ValueError):
        Sphere(1)


def test_norm_deviation_measures_drift():
    p = Product.from_blocks([("sphere", 100, 3), ("euclidean", 1, 2)])
    x = p.random_base(5, generator=torch.Generator().manual_seed(5))
    assert p.norm_deviation(x).max() < 1e-12
    y = x.clone()
    y[2, 30:33] *= 1.5                                                   # stretch one factor of one point
    y[:, -2:] *= 10                                                      # Euclidean part is free
    assert torch.allclose(p.norm_deviation(y), torch.tensor([0.0, 0, 0.5, 0, 0]), atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [2, 4, 9])
def test_sphere_logmap_inverts_expmap_near_zero_and_near_pi(dtype, n):
    """Issue 10, item 2: log_x(y) has length d(x, y) and exp_x(log_x(y)) = y at every angle, also within a
    fraction of a microradian of x and of -x (the small-angle branch used to be chosen on sin d, small at both
    ends, so near -x the log was a tiny vector and exp(log) landed 2 away)."""
    s, g = Sphere(n), torch.Generator().manual_seed(n)
    x = s.random_base(40, generator=g, dtype=torch.float64)
    v = s.proju(x, torch.randn(40, n, generator=g, dtype=torch.float64))
    v = v / v.norm(dim=-1, keepdim=True)
    tol = 2e-6 if dtype == torch.float32 else 1e-13
    for angle in (3e-10, 2e-7, 5e-4, 1.3, math.pi - 5e-4, math.pi - 4e-6, math.pi - 3e-7, math.pi - 2e-9):
        y = s.expmap(x, angle * v).to(dtype)
        xd = x.to(dtype)
        u = s.logmap(xd, y)
        assert s.is_tangent(xd, u, atol=tol).all(), angle
        assert (u.norm(dim=-1) - s.dist(xd, y)).abs().max() < tol, angle
        assert (s.expmap(xd, u) - y).abs().max() < tol, angle
        if 1e3 * torch.finfo(dtype).eps < angle < 1:     # relative accuracy of small angles that the dtype resolves
            assert ((u.norm(dim=-1) - angle).abs() / angle).max() < (1e-3 if dtype == torch.float32 else 1e-6)
    # exactly antipodal points: any direction is minimising; the log still has length pi and maps back
    xd = x.to(dtype)
    u = s.logmap(xd, -xd)
    assert torch.allclose(u.norm(dim=-1), torch.full((40,), math.pi, dtype=dtype), atol=tol)
    assert (s.expmap(xd, u) + xd).abs().max() < 10 * tol


@pytest.mark.parametrize("m", manifolds(), ids=repr)
def test_dexpinv_inverts_the_differential_of_exp(m):
    """dexpinv(x, u, d/ds exp_x(u + s w)) = w for tangent w at x (central differences, float64)."""
    g = torch.Generator().manual_seed(12)
    x = m.random_base(16, generator=g)
    u = tangent(m, x, g)
    w = m.proju(x, torch.randn(x.shape, generator=g))
    h = 1e-6
    v = (m.expmap(x, u + h * w) - m.expmap(x, u - h * w)) / (2 * h)      # tangent at exp_x(u)
    assert torch.allclose(m.dexpinv(x, u, v), w, atol=1e-7)
    assert torch.allclose(m.dexpinv(x, torch.zeros_like(u), w), w)       # the identity at u = 0


def test_product_dist_is_exact_and_batched():
    """Product.dist (the distance sphere_distance should use): exact per-factor angles (also tiny ones in
    float32) and broadcasting over leading axes, equal to the loop over factors."""
    g = torch.Generator().manual_seed(13)
    p = Product.from_blocks([("sphere", 5, 3), ("sphere", 3, 6), ("euclidean", 1, 2)])
    x, y = p.random_base(4, generator=g), p.random_base(3, generator=g)
    pairwise = p.dist(x[:, None, :], y[None, :, :])                           # [4, 3]
    loop = torch.stack([torch.stack([p.dist(x[i], y[j]) for j in range(3)]) for i in range(4)])
    assert pairwise.shape == (4, 3) and torch.allclose(pairwise, loop)
    assert torch.allclose(pairwise ** 2, p.pairwise_sqdist(x, y))
    # every sphere factor rotated by 1e-5 rad: the distance is 1e-5 sqrt(8) to float32 rounding
    x32 = x[:1].float()
    step = p.proju(x32, torch.randn(x32.shape, generator=g).float())
    step[..., -2:] = 0
    blocks = [p.factor_view(step, k) for k in range(2)]
    unit = torch.cat([(b / b.norm(dim=-1, keepdim=True)).reshape(1, -1) for b in blocks] + [step[:, -2:]], -1)
    y32 = p.expmap(x32, 1e-5 * unit)
    assert abs(p.dist(x32, y32).item() / (1e-5 * math.sqrt(8)) - 1) < 1e-3
