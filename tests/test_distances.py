"""Distances between sets of networks: the MMD, predictive diversity, nearest neighbours, W2."""
import math

import pytest
import torch

from wsbook.bayes import distances as dist


def _gauss(n, d, shift, gen):
    return torch.randn(n, d, generator=gen, dtype=torch.float64) + shift


def _mmd2_exact(d, sigma, shift_norm, h):
    """MMD^2 of N(mu1, s^2 I) and N(mu2, s^2 I) in d dimensions under exp(-|x-y|^2 / 2h^2)."""
    c = (h * h / (h * h + 2 * sigma ** 2)) ** (d / 2)
    return 2 * c * (1 - math.exp(-shift_norm ** 2 / (2 * (h * h + 2 * sigma ** 2))))


def test_mmd_unbiased_matches_closed_form():
    gen = torch.Generator().manual_seed(0)
    d, n, reps, h = 3, 6, 1500, 1.5
    for shift in (0.0, 1.0):
        est = torch.stack([dist.mmd2(_gauss(n, d, 0.0, gen), _gauss(n, d, shift / math.sqrt(d), gen), bandwidth=h)
                           for _ in range(reps)])
        se = float(est.std() / math.sqrt(reps))
        exact = _mmd2_exact(d, 1.0, shift, h)
        assert abs(float(est.mean()) - exact) < 4 * se, (shift, float(est.mean()), exact, se)
    # the biased V-statistic is off by O(1/n) at this size, which the test above would have caught
    biased = torch.stack([dist.mmd2(_gauss(n, d, 0.0, gen), _gauss(n, d, 0.0, gen), bandwidth=h, unbiased=False)
                          for _ in range(300)])
    assert float(biased.mean()) > 10 * float(biased.std() / math.sqrt(300))


def test_mmd_identical_distribution_near_zero_and_grows_with_shift():
    gen = torch.Generator().manual_seed(1)
    x = _gauss(300, 5, 0.0, gen)
    same = dist.mmd2(x, _gauss(300, 5, 0.0, gen))
    assert abs(float(same)) < 0.01
    values = [float(dist.mmd2(x, _gauss(300, 5, s, gen))) for s in (0.25, 0.5, 1.0, 2.0)]
    assert values[0] > 3 * abs(float(same))
    assert all(a < b for a, b in zip(values, values[1:])), values


def test_mmd_on_probabilities_flattens_networks_and_checks_shapes():
    gen = torch.Generator().manual_seed(2)
    p = torch.softmax(torch.randn(20, 7, 3, generator=gen), -1)
    q = torch.softmax(torch.randn(20, 7, 3, generator=gen) + torch.tensor([2.0, 0, 0]), -1)
    h = dist.median_bandwidth(p, q)
    assert torch.allclose(dist.mmd2(p, q, bandwidth=h), dist.mmd2(p.reshape(20, -1), q.reshape(20, -1), bandwidth=h))
    assert float(dist.mmd2(p, q)) > 0
    with pytest.raises(ValueError, match="feature sizes"):
        dist.mmd2(p, q[:, :5])
    with pytest.raises(ValueError, match="bandwidth"):
        dist.mmd2(p, q, bandwidth=0.0)


def test_jsd_identical_zero_disjoint_log2_and_matches_scipy():
    from scipy.spatial.distance import jensenshannon

    gen = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(4, 9, 5, generator=gen), -1)
    assert torch.allclose(dist.pairwise_jsd(p).diagonal(), torch.zeros(4, dtype=torch.float64), atol=1e-12)
    onehot = torch.nn.functional.one_hot(torch.tensor([[0, 1, 2], [1, 2, 0]]), 3).float()   # [2, N=3, C=3]
    assert float(dist.diversity(onehot)) == pytest.approx(math.log(2))
    ref = torch.tensor([[[jensenshannon(p[i, k].numpy(), p[j, k].numpy()) ** 2 for k in range(9)]
                         for j in range(4)] for i in range(4)]).mean(-1)
    assert torch.allclose(dist.pairwise_jsd(p, max_elements=50), ref.double(), atol=1e-6)
    same = p[:1].expand(5, -1, -1)
    assert float(dist.diversity(same)) == pytest.approx(0.0, abs=1e-12)


def test_nearest_neighbour_planted():
    gen = torch.Generator().manual_seed(4)
    ref = torch.randn(200, 10, generator=gen) * 10                          # well separated points
    noise = torch.randn(50, 10, generator=gen)
    noise = 0.1 * noise / noise.norm(dim=1, keepdim=True) * torch.linspace(0.5, 1.5, 50)[:, None]
    pick = torch.randperm(200, generator=gen)[:50]
    d = dist.nearest_neighbour_distances(ref[pick] + noise, ref, max_elements=1000)
    assert torch.allclose(d.float(), noise.norm(dim=1), atol=1e-4)
    expected = float(noise.norm(dim=1).median())
    assert float(dist.median_nn_distance(ref[pick] + noise, ref)) == pytest.approx(expected, rel=1e-4)
    # a set against itself: zero unless self-matches are excluded
    assert float(dist.median_nn_distance(ref, ref)) == 0.0
    assert float(dist.median_nn_distance(ref, ref, exclude_self=True)) > 1.0


def test_wasserstein2_translation_and_permutation():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(60, 4, generator=gen, dtype=torch.float64)
    t = torch.tensor([0.3, -1.0, 2.0, 0.5], dtype=torch.float64)
    assert float(dist.wasserstein2(x, x + t)) == pytest.approx(float(t.norm()), rel=1e-6)
    assert float(dist.wasserstein2(x, x[torch.randperm(60, generator=gen)])) == pytest.approx(0.0, abs=1e-6)
    # unequal sizes: two copies of x against x is still zero, a shifted half is not
    assert float(dist.wasserstein2(torch.cat([x, x]), x)) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="weights"):
        dist.wasserstein2(x, x, a=torch.ones(60))


def test_distances_to_mean_flatten_probabilities_and_tell_a_shell_from_a_cloud():
    from wsbook.bayes.distances import distances_to_mean

    ref = torch.tensor([[[0.2, 0.8], [1.0, 0.0]], [[0.4, 0.6], [0.0, 1.0]]])        # mean [[.3,.7],[.5,.5]]
    d = distances_to_mean(ref[:1], ref)
    assert d.dtype == torch.float64 and d.shape == (1,)
    assert d.item() == pytest.approx((2 * 0.1 ** 2 + 2 * 0.5 ** 2) ** 0.5)
    # a shell of radius 1 and a Gaussian cloud of the same mean square radius in 50 dimensions: same average
    # spread, different quantiles
    g = torch.Generator().manual_seed(0)
    cloud = torch.randn(4000, 50, generator=g) / 50 ** 0.5
    shell = cloud / cloud.norm(dim=1, keepdim=True)
    ds, dc = distances_to_mean(shell, shell), distances_to_mean(cloud, shell)
    assert ds.std() < 0.05 < dc.std()
    with pytest.raises(ValueError, match="feature sizes"):
        distances_to_mean(cloud, shell[:, :3])


def test_wasserstein2_shares_the_flows_transport_solve():
    """One transport solve (``flows.wasserstein2_from_costs``) serves both W2s; this one keeps its float64
    costs and returns a float64 scalar."""
    from wsbook import flows

    gen = torch.Generator().manual_seed(4)
    x, y = _gauss(30, 3, 0.0, gen), _gauss(40, 3, 0.5, gen)
    w = dist.wasserstein2(x, y)
    assert w.dtype == torch.float64 and w.shape == ()
    assert float(w) == flows.wasserstein2_from_costs(dist._sq_dists(x, y))
    assert float(w) == pytest.approx(flows.wasserstein2(x, y), rel=1e-10)
    a = torch.full((30,), 1 / 30, dtype=torch.float64)
    assert float(dist.wasserstein2(x, y, a=a)) == float(w)
    with pytest.raises(ValueError, match="weights"):
        flows.wasserstein2_from_costs(torch.ones(3, 4), a=torch.ones(2))


def test_median_bandwidth_subsamples_with_the_books_seed(monkeypatch):
    """Without a generator the subsample comes from ``config.generator()`` (``WSBOOK_SEED``), not from a
    seed of its own: the same seed gives the same bandwidth, another seed another one."""
    x = torch.randn(400, 5, generator=torch.Generator().manual_seed(3))

    def default(seed):
        monkeypatch.setenv("WSBOOK_SEED", str(seed))
        return dist.median_bandwidth(x, max_points=50)

    explicit = [dist.median_bandwidth(x, max_points=50, generator=torch.Generator().manual_seed(s)) for s in (0, 1)]
    assert default(0) == default(0) == explicit[0]
    assert default(1) == explicit[1] != explicit[0]
