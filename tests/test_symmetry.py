"""Mathematics of wsbook.symmetry: group actions are symmetries, matching recovers planted elements,
Sinkhorn is doubly stochastic, canonicalization is idempotent and function-preserving, barriers."""
import pytest
import torch

from wsbook import symmetry as S
from wsbook.nets import CNNSpec, MLPSpec


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _rel(spec, a, b, x):
    return S.function_difference(spec, a, b, x).max().item()


@pytest.mark.parametrize("activation", ["relu", "tanh", "sine", "gelu"])
def test_permutation_preserves_function(activation):
    g = _gen()
    spec = MLPSpec((6, 24, 16, 8, 3), activation=activation, frequency=3.0)
    theta = spec.init(5, generator=g)
    x = torch.randn(64, 6, generator=g)
    perms = S.random_permutation(spec, 5, g)
    moved = S.permute(spec, theta, perms)
    assert (moved - theta).abs().max() > 1e-2          # the weights really moved
    assert _rel(spec, theta, moved, x) < 1e-5
    back = S.permute(spec, moved, S.inverse_permutation(perms))
    torch.testing.assert_close(back, theta)


def test_permutation_broadcast_and_compose():
    g = _gen(1)
    spec = MLPSpec((4, 8, 8, 2))
    theta = spec.init(1, generator=g)
    p1, p2 = S.random_permutation(spec, 3, g), S.random_permutation(spec, 3, g)
    twice = S.permute(spec, S.permute(spec, theta, p1), p2)     # [1, D] broadcast over 3 elements
    assert twice.shape == (3, spec.n_params)
    torch.testing.assert_close(twice, S.permute(spec, theta, S.compose(p1, p2)))


def test_relu_positive_scaling_and_sign_flips():
    g = _gen(2)
    x = torch.randn(64, 5, generator=g)
    relu = MLPSpec((5, 32, 32, 4))
    theta = relu.init(4, generator=g)
    scaled = S.scale(relu, theta, S.random_scales(relu, 4, g))
    assert _rel(relu, theta, scaled, x) < 1e-5
    with pytest.raises(ValueError, match="positive"):
        S.scale(relu, theta, [-torch.ones(4, 32), torch.ones(4, 32)])
    for act in ("tanh", "sine"):
        odd = MLPSpec((5, 32, 32, 4), activation=act, frequency=2.0)
        th = odd.init(4, generator=g)
        flipped = S.flip_signs(odd, th, S.random_signs(odd, 4, g))
        assert _rel(odd, th, flipped, x) < 1e-5
        # a tanh network is not invariant to positive rescaling: the check refuses it, and it changes outputs
        with pytest.raises(ValueError, match="sign flips"):
            S.scale(odd, th, S.random_scales(odd, 4, g))
        assert _rel(odd, th, S.scale(odd, th, S.random_scales(odd, 4, g), check=False), x) > 1e-2


def test_soft_action_with_one_hot_equals_permute():
    g = _gen(3)
    spec = MLPSpec((3, 10, 7, 2))
    theta = spec.init(2, generator=g)
    perms = S.random_permutation(spec, 2, g)
    hard = [torch.nn.functional.one_hot(p, p.shape[1]).float() for p in perms]
    torch.testing.assert_close(S.permute_soft(spec, theta, hard), S.permute(spec, theta, perms))


@pytest.mark.parametrize("widths", [(8, 64, 5), (8, 32, 32, 5), (8, 48, 40, 32, 5), (8, 256, 128, 64, 32, 5)])
def test_weight_matching_recovers_planted_permutation(widths):
    g = _gen(4)
    spec = MLPSpec(widths)
    ref = spec.init(1, generator=g)
    perms = S.random_permutation(spec, 3, g)
    zoo = S.permute(spec, ref, perms) + 1e-4 * torch.randn(3, spec.n_params, generator=g)
    res = S.weight_matching(spec, ref, zoo, generator=g)
    inverse = S.inverse_permutation(perms)
    for f, inv in zip(res.perms, inverse):
        assert torch.equal(f, inv)
    assert (res.aligned - ref).abs().max() < 1e-3 and bool(res.converged.all())


@pytest.mark.parametrize("widths", [(6, 64, 4), (6, 48, 32, 4), (6, 64, 48, 32, 4), (6, 256, 64, 32, 32, 4)])
def test_activation_matching_recovers_planted_permutation(widths):
    g = _gen(5)
    spec = MLPSpec(widths, activation="tanh")   # no dead units, so every neuron is identifiable from data
    ref = spec.init(1, "kaiming_normal", generator=g)
    x = torch.randn(512, widths[0], generator=g)
    perms = S.random_permutation(spec, 3, g)
    zoo = S.permute(spec, ref, perms)
    res = S.activation_matching(spec, ref, zoo, x, batch_size=100)   # streamed in 6 batches
    for f, inv in zip(res.perms, S.inverse_permutation(perms)):
        assert torch.equal(f, inv)
    assert (res.aligned - ref).abs().max() < 1e-6 and res.signs is None


def test_activation_matching_relu_live_neurons():
    g = _gen(6)
    spec = MLPSpec((6, 64, 64, 3))
    ref = spec.init(1, "kaiming_normal", generator=g)
    x = torch.randn(1024, 6, generator=g)
    perms = S.random_permutation(spec, 2, g)
    res = S.activation_matching(spec, ref, S.permute(spec, ref, perms), x)
    found, aligned = res.perms, res.aligned
    _, hidden = spec.forward(ref, x, return_hidden=True)
    for f, inv, h in zip(found, S.inverse_permutation(perms), hidden):
        live = h[0].std(0) > 0        # dead ReLUs are indistinguishable by their (zero) activations
        assert live.sum() > 0.8 * live.numel()
        assert torch.equal(f[:, live], inv[:, live])
    assert _rel(spec, ref, aligned, x) < 1e-5


@pytest.mark.parametrize("activation", ["tanh", "sine"])
def test_sign_aware_matching_recovers_permutation_and_signs(activation):
    g = _gen(7)
    spec = MLPSpec((2, 64, 64, 32, 1), activation=activation, frequency=3.0)
    ref = spec.init(1, generator=g)
    perms, signs = S.random_permutation(spec, 4, g), S.random_signs(spec, 4, g)
    zoo = S.flip_signs(spec, S.permute(spec, ref, perms), signs)
    res = S.sign_aware_weight_matching(spec, ref, zoo, generator=g)
    assert (res.aligned - ref).abs().max() < 1e-6
    for found_s, found_p, truth_s in zip(res.signs, res.perms, signs):   # new neuron i undoes the flip of old neuron found_p[i]
        assert torch.equal(found_s, truth_s.gather(1, found_p))
    x = torch.rand(400, 2, generator=g) * 2 - 1
    aligned_am = S.activation_matching(spec, ref, zoo, x, signs=True).aligned
    assert (aligned_am - ref).abs().max() < 1e-6
    # plain weight matching cannot undo the flips
    assert (S.weight_matching(spec, ref, zoo, generator=g).aligned - ref).abs().max() > 1e-2


def test_variational_matching_recovers_permutation_of_means_and_stds():
    g = _gen(8)
    spec = MLPSpec((5, 32, 32, 3))
    mean, std = spec.init(1, generator=g), 0.05 + 0.1 * torch.rand(1, spec.n_params, generator=g)
    perms = S.random_permutation(spec, 2, g)
    res = S.variational_matching(spec, mean, std, S.permute(spec, mean, perms), S.permute(spec, std, perms),
                                 generator=g)
    torch.testing.assert_close(res.mean, mean.expand(2, -1))
    torch.testing.assert_close(res.std, std.expand(2, -1))


def test_sinkhorn_is_doubly_stochastic_and_matching_recovers():
    g = _gen(9)
    P = S.sinkhorn(torch.randn(3, 20, 20, generator=g) * 3, n_iter=200)
    torch.testing.assert_close(P.sum(1), torch.ones(3, 20), atol=1e-4, rtol=0)
    torch.testing.assert_close(P.sum(2), torch.ones(3, 20), atol=1e-4, rtol=0)
    assert (P >= 0).all()
    spec = MLPSpec((4, 16, 16, 2))
    ref = spec.init(1, generator=g)
    perms = S.random_permutation(spec, 2, g)
    res = S.sinkhorn_matching(spec, ref, S.permute(spec, ref, perms), loss="l2", steps=60, lr=0.1, generator=g)
    assert (res.aligned - ref).abs().max() < 1e-6
    assert [p.shape for p in res.soft] == [(2, 16, 16), (2, 16, 16)]
    # initialised from the right answer, zero steps return it unchanged
    same = S.sinkhorn_matching(spec, ref, S.permute(spec, ref, perms), steps=0, init=S.inverse_permutation(perms),
                               generator=g).aligned
    assert (same - ref).abs().max() < 1e-6


def test_canonicalization_idempotent_and_function_preserving():
    g = _gen(10)
    spec = MLPSpec((5, 32, 24, 3))
    x = torch.randn(100, 5, generator=g)
    theta = S.scale(spec, spec.init(4, generator=g), S.random_scales(spec, 4, g))
    for ref in (None, spec.init(1, generator=g)):
        c = S.canonicalize(spec, theta, ref, task="regression")
        assert _rel(spec, theta, c, x) < 1e-5
        torch.testing.assert_close(S.canonicalize(spec, c, ref, task="regression"), c, atol=1e-6, rtol=1e-5)
    c = S.canonicalize(spec, theta, task="classification")
    assert torch.equal(spec.forward(c, x).argmax(-1), spec.forward(theta, x).argmax(-1))
    # a rescaled and permuted copy lands on the same canonical point
    other = S.permute(spec, S.scale(spec, theta, S.random_scales(spec, 4, g)), S.random_permutation(spec, 4, g))
    torch.testing.assert_close(S.canonicalize(spec, other, task="classification"), c, atol=1e-5, rtol=1e-4)


def test_rescale_neurons_sets_incoming_norms_and_keeps_the_function():
    g = _gen(12)
    spec = MLPSpec((5, 32, 24, 3))
    x = torch.randn(100, 5, generator=g)
    theta = spec.init(4, generator=g)
    wanted = [torch.full((4, 32), 2.5), torch.rand(4, 24, generator=g) + 0.5]
    out = S.rescale_neurons(spec, theta, wanted)
    for got, want in zip(S.neuron_norms(spec, out), wanted):
        torch.testing.assert_close(got, want)
    assert _rel(spec, theta, out, x) < 1e-5
    assert (out - theta).abs().max() > 1e-2
    # unit norms are what normalize_neurons gives before it scales the last layer
    torch.testing.assert_close(S.rescale_neurons(spec, theta, 1.0),
                               S.normalize_neurons(spec, theta, task="regression"))
    with pytest.raises(ValueError, match="hidden layers"):
        S.rescale_neurons(spec, theta, [1.0])
    with pytest.raises(ValueError, match="positive"):
        S.rescale_neurons(spec, theta, -1.0)


def test_sphere_blocks_round_trip_and_distance():
    g = _gen(11)
    spec = MLPSpec((5, 16, 8, 3))
    blocks, index = S.sphere_blocks(spec)
    assert blocks == [("sphere", 16, 6), ("sphere", 8, 17), ("sphere", 1, 27)]
    assert sorted(index.tolist()) == list(range(spec.n_params))
    c = S.canonicalize(spec, spec.init(3, generator=g))
    pts = S.to_spheres(spec, c)
    start = 0
    for _, n, d in blocks:
        torch.testing.assert_close(pts[:, start:start + n * d].view(3, n, d).norm(dim=2), torch.ones(3, n))
        start += n * d
    torch.testing.assert_close(S.from_spheres(spec, pts), c)
    assert S.sphere_distance(spec, c, c).abs().max() < 1e-5
    assert (S.sphere_distance(spec, c[:1], c[1:]) > 0.1).all()
    with pytest.raises(ValueError, match="not canonical"):
        S.to_spheres(spec, spec.init(1, generator=g))
    product = S.product_manifold(spec)
    torch.testing.assert_close(product.projx(pts), pts, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(product.dist(pts[:1], pts[1:]), S.sphere_distance(spec, c[:1], c[1:]),
                               atol=1e-4, rtol=1e-4)


def test_barrier_of_network_with_itself_is_zero():
    g = _gen(12)
    spec = MLPSpec((4, 16, 3))
    theta = spec.init(3, generator=g)
    x, y = torch.randn(50, 4, generator=g), torch.randint(0, 3, (50,), generator=g)
    out = S.connectivity(spec, theta, theta, x, y)
    assert out["loss"].shape == (3, 25)
    assert out["barrier"].abs().max() < 1e-6 and out["auc"].abs().max() < 1e-6
    # a concave bump has the known barrier and AUC
    lam = torch.linspace(0, 1, 101)
    bump = (1 + lam * (1 - lam)).unsqueeze(0)
    assert abs(S.barrier(bump, lam).item() - 0.25) < 1e-6
    assert abs(S.auc(bump, lam).item() - 1 / 6) < 1e-3


def test_gaussian_paths():
    g = _gen(13)
    spec = MLPSpec((4, 16, 3))
    mean, std = spec.init(2, generator=g), torch.full((2, spec.n_params), 0.01)
    x, y = torch.randn(40, 4, generator=g), torch.randint(0, 3, (40,), generator=g)
    w = S.gaussian_interpolation_curve(spec, mean[:1], std[:1], mean[:1], std[:1], x, y, n_samples=8)
    assert (w["loss"] - w["loss"][:, :1]).abs().max() < 1e-5          # same Gaussian: a flat path
    mix = S.gaussian_interpolation_curve(spec, mean[:1], std[:1], mean[1:], std[1:], x, y, path="mixture")
    assert S.barrier(mix).item() <= 1e-6        # NLL of a mixture is convex along the mixture path


def test_mismatched_architectures_raise():
    a, b = MLPSpec((4, 16, 3)), MLPSpec((4, 8, 3))
    with pytest.raises(ValueError, match=r"shape \[B, 131\].*got \(1, 67\)"):
        S.weight_matching(a, a.init(1), b.init(1))
    with pytest.raises(ValueError, match="one entry per hidden layer"):
        S.permute(a, a.init(1), [torch.arange(16), torch.arange(3)])
    with pytest.raises(ValueError, match=r"must be \[B, 16\]"):
        S.permute(a, a.init(1), [torch.arange(8)])
    with pytest.raises(ValueError, match="architectures differ"):
        S.check_same_architecture(a, b)
    with pytest.raises(ValueError, match="references"):
        S.weight_matching(a, a.init(2), a.init(3))


def test_batched_zoo_alignment_equals_pair_by_pair():
    g = _gen(14)
    spec = MLPSpec((6, 20, 20, 20, 3))
    ref, zoo = spec.init(1, generator=g), spec.init(5, generator=g)
    batched = S.weight_matching(spec, ref, zoo, restarts=2, generator=_gen(99))
    aligned = batched.aligned
    for i in range(5):
        single = S.weight_matching(spec, ref, zoo[i:i + 1], restarts=2, generator=_gen(99))
        for p, q in zip(batched.perms, single.perms):
            assert torch.equal(p[i:i + 1], q)
        torch.testing.assert_close(aligned[i:i + 1], single.aligned)
        torch.testing.assert_close(batched.objective[i:i + 1], single.objective)
    # alignment never increases the distance to the reference
    assert ((aligned - ref).norm(dim=1) <= (zoo - ref).norm(dim=1) + 1e-5).all()


@pytest.mark.parametrize("signs", [False, True])
def test_starts_run_together_equal_each_start_run_alone(signs):
    # the starts are optimised in one batch; each must end where it ends alone, and the best one wins
    g = _gen(16)
    spec = MLPSpec((5, 11, 11, 7, 3), activation="tanh" if signs else "relu")
    ref, zoo = spec.init(1, generator=g), spec.init(6, generator=g)
    match = S.sign_aware_weight_matching if signs else S.weight_matching
    together = match(spec, ref, zoo)
    alone = [match(spec, ref, zoo, starts=(start,)) for start in S.matching.STARTS]
    objectives = torch.stack([a.objective for a in alone])
    best = objectives.argmax(0)                       # the first of equally good starts
    torch.testing.assert_close(together.objective, objectives.max(0).values, rtol=0, atol=0)
    for i, k in enumerate(best.tolist()):
        for p, q in zip(together.perms, alone[k].perms):
            assert torch.equal(p[i], q[i])
        assert torch.equal(together.aligned[i], alone[k].aligned[i])


@pytest.mark.parametrize("loss", ["midpoint", "random"])
def test_sinkhorn_data_losses_return_a_true_permutation(loss):
    g = _gen(15)
    spec = MLPSpec((4, 12, 12, 3))
    a, b = spec.init(2, generator=g), spec.init(2, generator=g)
    x, y = torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)
    res = S.sinkhorn_matching(spec, a, b, x, y, loss=loss, steps=10, generator=g)
    perms, aligned = res.perms, res.aligned
    for p in perms:
        assert torch.equal(p.sort(1).values, torch.arange(12).expand(2, 12))
    assert _rel(spec, b, aligned, x) < 1e-5
    with pytest.raises(ValueError, match="needs data"):
        S.sinkhorn_matching(spec, a, b, loss=loss)


def test_activation_statistics_inner_matches_direct_computation():
    g = _gen(16)
    spec = MLPSpec((3, 8, 5, 2), activation="tanh")
    a, b = spec.init(1, generator=g), spec.init(2, generator=g)
    x = torch.randn(30, 3, generator=g)
    stats = S.activation_statistics(spec, a, b, x, batch_size=7, statistic="inner")
    _, ha = spec.forward(a, x, return_hidden=True)
    _, hb = spec.forward(b, x, return_hidden=True)
    for s, u, v in zip(stats, ha, hb):
        torch.testing.assert_close(s, torch.einsum("ni,bnj->bij", u[0], v) / 30)


def test_invalid_inputs_raise_clear_errors():
    relu, gelu = MLPSpec((3, 8, 2)), MLPSpec((3, 8, 2), activation="gelu")
    with pytest.raises(ValueError, match="relu"):
        S.sphere_blocks(gelu)
    with pytest.raises(ValueError, match="odd activation"):
        S.sign_aware_weight_matching(relu, relu.init(1), relu.init(1))
    with pytest.raises(ValueError, match="non-negative"):
        S.variational_matching(relu, relu.init(1), -torch.ones(1, relu.n_params), relu.init(1),
                               torch.ones(1, relu.n_params))
    assert S.sphere_blocks(relu, task="regression")[0][-1][0] == "euclidean"
    with pytest.raises(ValueError, match="no per-neuron scaling"):
        S.scale(gelu, gelu.init(1), [torch.ones(1, 8)])


# ----------------------------------------------------------- issue 10, item 6: narrow deep networks
def test_weight_matching_recovers_planted_elements_of_narrow_deep_networks():
    """Coordinate descent from the identity stopped at wrong local optima here (1 of 16 ReLU copies, 0 of 16
    sign-flipped tanh copies); the greedy starts recover every member, also with noise."""
    widths = (2, 5, 14, 3, 26, 8, 4)
    g = _gen(21)
    for activation, noise in (("relu", 0.0), ("relu", 0.02), ("tanh", 0.0), ("tanh", 0.02)):
        spec = MLPSpec(widths, activation=activation)
        ref = spec.init(1, generator=g, device="cpu")
        perms = S.random_permutation(spec, 16, g)
        zoo = S.permute(spec, ref, perms)
        if activation == "tanh":
            zoo = S.flip_signs(spec, zoo, S.random_signs(spec, 16, g))
            res = S.sign_aware_weight_matching(spec, ref, zoo + noise * torch.randn(zoo.shape, generator=g), generator=g)
        else:
            res = S.weight_matching(spec, ref, zoo + noise * torch.randn(zoo.shape, generator=g), generator=g)
        for found, truth in zip(res.perms, S.inverse_permutation(perms)):
            assert torch.equal(found, truth), (activation, noise)
        assert res.converged.shape == (16,) and bool(res.converged.all())
        if noise == 0:
            assert (res.aligned - ref).abs().max() < 1e-6
    # the classic start alone (identity) is the failure mode: it stops at wrong fixed points on this network
    spec = MLPSpec(widths)
    ref = spec.init(1, generator=g)
    perms = S.random_permutation(spec, 16, g)
    classic = S.weight_matching(spec, ref, S.permute(spec, ref, perms), starts=("identity",))
    exact = torch.stack([(f == t).all(1) for f, t in zip(classic.perms, S.inverse_permutation(perms))]).all(0)
    assert classic.candidates == 1 and exact.float().mean() < 0.5
    assert bool(classic.converged[~exact].all())      # converged, yet wrong: a fixed point is only a local optimum
    with pytest.raises(ValueError, match="starts must be"):
        S.weight_matching(spec, ref, ref, starts=("sideways",))


def test_weight_matching_objective_candidates_and_convergence_flag():
    g = _gen(22)
    spec = MLPSpec((4, 9, 23, 5, 17, 3))
    ref, zoo = spec.init(1, generator=g), spec.init(6, generator=g)
    res = S.weight_matching(spec, ref, zoo, restarts=3, generator=_gen(1))
    torch.testing.assert_close(res.objective, (ref * res.aligned).sum(1))
    assert res.candidates == 6 and res.sweeps >= 1
    # more candidates can only help: the deterministic ones are a subset of the larger set
    plain = S.weight_matching(spec, ref, zoo)
    assert (res.objective >= plain.objective - 1e-5).all() and plain.candidates == 3
    # without restarts the result is deterministic; the same generator reproduces the random restarts
    torch.testing.assert_close(S.weight_matching(spec, ref, zoo).aligned, plain.aligned)
    torch.testing.assert_close(S.weight_matching(spec, ref, zoo, restarts=3, generator=_gen(1)).aligned, res.aligned)
    # converged means a fixed point was reached, not that the sweep budget ran out
    stopped = S.weight_matching(spec, ref, zoo, max_iter=0, restarts=3, generator=_gen(1))
    assert not bool(stopped.converged.any()) and stopped.sweeps == 0
    # a converged alignment is a fixed point: started there (restarts off), nothing moves
    again = S.weight_matching(spec, ref, res.aligned, restarts=0)
    assert bool(again.converged.all()) and (again.objective >= res.objective - 1e-5).all()
    with pytest.raises(ValueError, match="restarts"):
        S.weight_matching(spec, ref, zoo, restarts=-1)
    with pytest.raises(ValueError, match="init for hidden layer 0 is not a permutation"):
        S.weight_matching(spec, ref, zoo, init=[torch.zeros(9, dtype=torch.long)] + [torch.arange(w) for w in (23, 5, 17)])



def _matching_cases():
    """Weight matching on unrelated networks (many local optima, so every sweep and tie-break matters):
    the benchmark's pair and zoo, per-member references, init, signs, Gaussians and a CNN."""
    g = _gen(30)
    spec = MLPSpec((64, 128, 128, 128, 10))
    ref, zoo = spec.init(1, generator=g), spec.init(3, generator=g)
    yield "bench pair", spec, zoo[:1], S.weight_matching(spec, ref, zoo[:1], generator=_gen(3))
    yield "bench zoo restarts", spec, zoo, S.weight_matching(spec, ref, zoo, restarts=2, generator=_gen(4))
    spec = MLPSpec((6, 20, 20, 20, 3))
    ref, zoo = spec.init(1, generator=g), spec.init(7, generator=g)
    yield "mlp per-member refs", spec, zoo, S.weight_matching(spec, zoo.flip(0), zoo, restarts=3, generator=_gen(5))
    init = [torch.randperm(20, generator=g) for _ in range(3)]
    yield "mlp init backward", spec, zoo, S.weight_matching(spec, ref, zoo, starts=("backward", "identity"), init=init,
                                                             restarts=1, generator=_gen(6))
    tanh = MLPSpec((5, 16, 16, 9, 2), activation="tanh")
    ref, zoo = tanh.init(1, generator=g), tanh.init(5, generator=g)
    yield "sign-aware", tanh, zoo, S.sign_aware_weight_matching(tanh, ref, zoo, restarts=2, generator=_gen(7))
    mean, std = spec.init(4, generator=g), 0.05 + 0.1 * torch.rand(4, spec.n_params, generator=g)
    yield "variational", spec, (mean, std), S.variational_matching(spec, mean[:1], std[:1], mean, std, restarts=1,
                                                                    generator=_gen(8))
    cnn = CNNSpec(2, (5, 7, 4), kernel_size=3, n_classes=3)
    ref, zoo = cnn.init(1, generator=g, device="cpu"), cnn.init(4, generator=g, device="cpu")
    yield "cnn", cnn, zoo, S.weight_matching(cnn, ref, zoo, restarts=1, generator=_gen(9))


#: sha-256 (first 16 hex digits) of each case's permutations and signs, computed by the implementation
#: before issue 36's speed-ups (commit ff6d7d9): the faster code must return the very same elements
MATCHING_DIGESTS = {
    "bench pair": "29a67108410a03e4",
    "bench zoo restarts": "6ba921d663e6529d",
    "mlp per-member refs": "727f306e2ca97a04",
    "mlp init backward": "59db3999b65b289a",
    "sign-aware": "ae5facc977b644bd",
    "variational": "e5fb5f44b03c27b8",
    "cnn": "1687b48072899834",
}


def _digest(tensors):
    import hashlib

    h = hashlib.sha256()
    for t in tensors:
        h.update(t.to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def test_weight_matching_returns_the_reference_elements():
    for name, spec, theta, res in _matching_cases():
        signs = getattr(res, "signs", None)
        assert _digest(list(res.perms) + list(signs or [])) == MATCHING_DIGESTS[name], name
        # the aligned networks are the population moved by exactly those elements
        if isinstance(theta, tuple):
            torch.testing.assert_close(res.mean, S.permute(spec, theta[0], res.perms), rtol=0, atol=0)
            torch.testing.assert_close(res.std, S.permute(spec, theta[1], res.perms), rtol=0, atol=0)
            continue
        moved = S.permute(spec, theta, res.perms)
        assert torch.equal(res.aligned, moved if signs is None else S.flip_signs(spec, moved, signs)), name


# ----------------------------------------------------------------- CNNs through the same code
def test_cnn_alignment_and_canonicalization():
    g = _gen(23)
    cnn = CNNSpec(2, (5, 7, 4), kernel_size=3, n_classes=3)
    ref = cnn.init(1, generator=g, device="cpu")
    x = torch.randn(6, 2, 8, 8, generator=g)
    perms = S.random_permutation(cnn, 4, g)
    moved = S.permute(cnn, ref, perms)
    assert (moved - ref).abs().max() > 1e-2 and _rel(cnn, ref, moved, x) < 1e-5
    res = S.weight_matching(cnn, ref, moved, generator=g)
    for f, inv in zip(res.perms, S.inverse_permutation(perms)):
        assert torch.equal(f, inv)
    assert (res.aligned - ref).abs().max() < 1e-6
    assert (S.activation_matching(cnn, ref, moved, x).aligned - ref).abs().max() < 1e-6
    hard = [torch.nn.functional.one_hot(p, p.shape[1]).float() for p in perms]
    torch.testing.assert_close(S.permute_soft(cnn, ref, hard), moved)
    # positive channel scalings are a symmetry of ReLU CNNs, and canonicalization undoes them with the permutation
    other = S.scale(cnn, moved, S.random_scales(cnn, 4, g))
    assert _rel(cnn, ref, other, x) < 1e-5
    for task in ("regression", "classification"):
        canon = S.canonicalize(cnn, other, ref, task=task)
        torch.testing.assert_close(canon, S.canonicalize(cnn, ref, ref, task=task).expand(4, -1), atol=1e-5, rtol=1e-4)
        if task == "regression":
            assert _rel(cnn, other, canon, x) < 1e-5
        else:
            assert torch.equal(cnn.forward(canon, x).argmax(-1), cnn.forward(other, x).argmax(-1))
        torch.testing.assert_close(S.from_spheres(cnn, S.to_spheres(cnn, canon, task), task), canon)
    sorted_ = S.canonicalize(cnn, other, task="regression")
    torch.testing.assert_close(sorted_, S.canonicalize(cnn, ref, task="regression").expand(4, -1), atol=1e-5, rtol=1e-4)
    blocks, _ = S.sphere_blocks(cnn)
    assert blocks == [("sphere", 5, 2 * 9 + 1), ("sphere", 7, 5 * 9 + 1), ("sphere", 4, 7 * 9 + 1), ("sphere", 1, 15)]


# ----------------------------------------------------------- issue 10, item 11: invalid elements
def test_permute_rejects_elements_that_are_not_permutations():
    spec = MLPSpec((3, 4, 5, 2))
    theta = spec.init(2, generator=_gen(24))
    ok = torch.arange(4)
    for bad, layer in ((torch.zeros(2, 5, dtype=torch.long), 1), (torch.tensor([[0, 1, 2, 3, 5]]), 1),
                       (torch.tensor([4, 3, 2, 1, 0]).expand(2, -1).clone(), None)):
        bad_first = layer is None
        perms = [torch.tensor([0, 0, 1, 2]), torch.arange(5)] if bad_first else [ok, bad]
        with pytest.raises(ValueError, match=f"hidden layer {0 if bad_first else 1} is not a permutation"):
            S.permute(spec, theta, perms)
    with pytest.raises(TypeError, match="integer"):
        S.permute(spec, theta, [ok.float(), torch.arange(5)])


# ---------------------------------------------------------------- the one-layer primitive
def test_one_layer_action_touches_only_its_tensors():
    g = _gen(25)
    spec = MLPSpec((3, 6, 5, 4, 2))
    theta = spec.init(3, generator=g)
    work = theta.clone()
    ptr = work.data_ptr()
    p, s = torch.rand(3, 5, generator=g).argsort(1), torch.rand(3, 5, generator=g) + 0.5
    out = S.act_on_layer_(spec, work, 1, perm=p, scale=s)
    assert out.data_ptr() == ptr                                   # in place, no copy of the population
    touched = torch.zeros(spec.n_params, dtype=torch.bool)
    for sl in (*spec.slices(1), spec.slices(2)[0]):
        touched[sl] = True
    assert torch.equal(work[:, ~touched], theta[:, ~touched])
    full = [torch.arange(6).expand(3, 6), p, torch.arange(4).expand(3, 4)]
    ones = [torch.ones(3, 6), s, torch.ones(3, 4)]
    torch.testing.assert_close(work, S.scale(spec, S.permute(spec, theta, full), ones))
    # normalize_neurons and sort_neurons are layer-by-layer compositions of that primitive
    normed = S.normalize_neurons(spec, theta, "regression")
    for h, rows in enumerate(spec.weights(normed)[:-1]):
        norms = torch.cat([rows, spec.biases(normed)[h].unsqueeze(2)], 2).norm(dim=2)
        torch.testing.assert_close(norms, torch.ones_like(norms))
    perms, sorted_ = S.sort_neurons(spec, normed)
    for h in range(3):
        out_norm = spec.weights(sorted_)[h + 1].norm(dim=1)
        assert (out_norm[:, :-1] >= out_norm[:, 1:]).all()
    torch.testing.assert_close(sorted_, S.permute(spec, normed, perms))


def test_sign_canonicalize_picks_one_member_of_each_sign_orbit():
    g = _gen(26)
    spec = MLPSpec((2, 8, 8, 1), activation="sine", frequency=3.0)
    theta = spec.init(3, generator=g) + 0.1 * torch.randn(3, spec.n_params, generator=g)
    flipped = S.flip_signs(spec, theta, S.random_signs(spec, 3, g))
    assert not torch.allclose(flipped, theta)
    torch.testing.assert_close(S.sign_canonicalize(spec, flipped), S.sign_canonicalize(spec, theta))
    x = torch.rand(16, 2, generator=g)
    assert _rel(spec, theta, S.sign_canonicalize(spec, theta), x) < 1e-5
    assert all((b >= 0).all() for b in spec.biases(S.sign_canonicalize(spec, theta))[:-1])
    with pytest.raises(ValueError, match="odd activations"):
        S.sign_canonicalize(MLPSpec((2, 4, 1)), MLPSpec((2, 4, 1)).init(1))


# ------------------------------------------------------------------ one barrier implementation
def test_interpolation_curve_with_per_pair_targets():
    g = _gen(27)
    spec = MLPSpec((2, 8, 1), activation="tanh")
    a, b = spec.init(3, generator=g), spec.init(3, generator=g)
    x, y = torch.rand(10, 2, generator=g), torch.rand(3, 10, 1, generator=g)     # one target image per pair
    curve = S.interpolation_curve(spec, a, b, x, y, n_points=5, task="regression", chunk=4)
    for t, lam in enumerate(curve["lambdas"]):
        direct = ((spec.forward((1 - lam) * a + lam * b, x) - y) ** 2).mean((1, 2))
        torch.testing.assert_close(curve["loss"][:, t], direct)
    assert "accuracy" not in curve and S.barrier(curve).shape == (3,)
    labels = torch.randint(0, 3, (2, 10), generator=g)
    clf = MLPSpec((2, 8, 3))
    c = S.interpolation_curve(clf, clf.init(2, generator=g), clf.init(2, generator=g), x, labels, n_points=3)
    assert c["accuracy"].shape == (2, 3)
    with pytest.raises(ValueError, match="task must be one of"):
        S.connectivity(spec, a, b, x, y, task="mse")
    with pytest.raises(ValueError, match="one entry per pair"):
        S.interpolation_curve(spec, a, b, x, y[:2], task="regression")
