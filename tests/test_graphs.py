"""wsbook.graphs: neural graphs round-trip exactly, GNNs are permutation equivariant / invariant."""
import pytest
import torch

from wsbook import symmetry
from wsbook.graphs import FlatMLP, NeuralGraph, WeightSpaceGNN
from wsbook.nets import CNNSpec, MLPSpec

MLP = MLPSpec((5, 7, 6, 3))
CNN = CNNSpec(2, (4, 5), kernel_size=3, n_classes=3)
CASES = [("pna", "neighbours"), ("relational_transformer", "neighbours"), ("relational_transformer", "all")]


def _population(spec, n=4, seed=0):
    return torch.randn(n, spec.n_params, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("spec", [MLP, CNN], ids=["mlp", "cnn"])
def test_round_trip_is_exact(spec):
    graph = NeuralGraph(spec)
    theta = _population(spec)
    gb = graph.to_graph(theta)
    assert gb.x.shape == (4 * graph.n_nodes, 1) and gb.edge_attr.shape == (4 * graph.n_edges, graph.edge_dim)
    assert torch.equal(graph.to_population(gb.x, gb.edge_attr), theta)
    # edges connect consecutive layers only, and each graph's edges stay inside its own node block
    layer = graph.node_layer
    assert torch.equal(layer[graph.edge_index[1]] - layer[graph.edge_index[0]], torch.ones(graph.n_edges, dtype=torch.long))
    assert torch.equal(gb.batch[gb.edge_index[0]], gb.batch[gb.edge_index[1]])


def test_graph_features_are_the_weights():
    graph = NeuralGraph(MLP)
    theta = _population(MLP, 1)
    gb = graph.to_graph(theta)
    w0 = MLP.weights(theta)[0][0]                       # [7, 5]
    src, dst = graph.edge_index
    first = (graph.node_layer[dst] == 1)
    rebuilt = torch.zeros(7, 5)
    rebuilt[dst[first] - 5, src[first]] = gb.edge_attr[first, 0]
    assert torch.equal(rebuilt, w0)
    assert torch.equal(gb.x[5:12, 0], MLP.biases(theta)[0][0])
    assert torch.all(gb.x[:5] == 0)


@pytest.mark.parametrize("spec", [MLP, CNN], ids=["mlp", "cnn"])
def test_hidden_permutation_is_a_symmetry_and_relabels_the_graph(spec):
    graph = NeuralGraph(spec)
    theta = _population(spec)
    perms = symmetry.random_permutation(spec, 4, torch.Generator().manual_seed(1))
    permuted = symmetry.permute(spec, theta, perms)
    assert not torch.allclose(permuted, theta)
    x = torch.randn(9, 5) if spec is MLP else torch.randn(9, 2, 6, 6)
    torch.testing.assert_close(spec.forward(permuted, x), spec.forward(theta, x), atol=1e-5, rtol=1e-5)
    # the graph of the permuted weights is the old graph with its nodes relabelled by node_permutation
    nperm = graph.node_permutation(perms)                                   # [4, N]
    N, E = graph.n_nodes, graph.n_edges
    old, new = graph.to_graph(theta), graph.to_graph(permuted)
    torch.testing.assert_close(new.x.view(4, N), old.x.view(4, N).gather(1, nperm))
    edge_id = torch.full((N, N), -1, dtype=torch.long)
    edge_id[graph.edge_index[0], graph.edge_index[1]] = torch.arange(E)
    src, dst = graph.edge_index
    moved = edge_id[nperm[:, src], nperm[:, dst]]                          # [4, E] old edge of every new edge
    assert (moved >= 0).all()
    old_edges = old.edge_attr.view(4, E, -1)
    torch.testing.assert_close(new.edge_attr.view(4, E, -1), old_edges.gather(1, moved.unsqueeze(2).expand_as(old_edges)))


@pytest.mark.parametrize("spec", [MLP, CNN], ids=["mlp", "cnn"])
@pytest.mark.parametrize("layer,attention", CASES)
def test_gnn_equivariance_and_invariance(spec, layer, attention):
    torch.manual_seed(0)
    graph = NeuralGraph(spec)
    theta = _population(spec)
    perms = symmetry.random_permutation(spec, 4, torch.Generator().manual_seed(2))
    permuted = symmetry.permute(spec, theta, perms)
    times = torch.rand(4)
    inv = WeightSpaceGNN(graph, layer, dim=16, n_layers=2, head="invariant", out_dim=3, attention=attention, time=True)
    inv.set_normalization(theta)                          # per-role input scales keep the symmetry
    torch.testing.assert_close(inv(permuted, t=times), inv(theta, t=times), atol=1e-5, rtol=0)
    equi = WeightSpaceGNN(graph, layer, dim=16, n_layers=2, head="equivariant", attention=attention)
    out = equi(theta)
    assert out.shape == theta.shape
    torch.testing.assert_close(equi(permuted), symmetry.permute(spec, out, perms), atol=1e-5, rtol=0)
    # the equivariant output is not trivially symmetric: it changes when the input changes
    assert not torch.allclose(out, equi(theta + 0.5))


def test_flat_mlp_is_not_invariant():
    """Control: the check above can fail; a plain MLP on flat weights is not permutation invariant."""
    graph = NeuralGraph(MLP)
    theta = _population(MLP)
    permuted = symmetry.permute(MLP, theta, symmetry.random_permutation(MLP, 4, torch.Generator().manual_seed(3)))
    model = FlatMLP(MLP.n_params, 32)
    assert (model(permuted) - model(theta)).abs().max() > 1e-4


def test_sign_canonicalization_makes_sine_encoder_invariant():
    spec = MLPSpec((2, 8, 8, 1), activation="sine")
    theta = spec.init(3, "siren", generator=torch.Generator().manual_seed(0), device="cpu")
    theta = theta + 0.1 * torch.randn_like(theta)        # nonzero biases
    flipped = symmetry.flip_signs(spec, theta, symmetry.random_signs(spec, 3, torch.Generator().manual_seed(5)))
    x = torch.rand(16, 2)
    torch.testing.assert_close(spec.forward(flipped, x), spec.forward(theta, x), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(flipped, theta)
    torch.testing.assert_close(symmetry.sign_canonicalize(spec, flipped), symmetry.sign_canonicalize(spec, theta))
    from wsbook.graphs.inr import INREncoder

    encoder = INREncoder(spec, dim=16, n_layers=2, latent=8)
    torch.testing.assert_close(encoder(flipped), encoder(theta), atol=1e-5, rtol=0)


def test_bad_input_raises_clear_errors():
    graph = NeuralGraph(MLP)
    with pytest.raises(ValueError, match=r"\[B, %d\]" % MLP.n_params):
        graph.to_graph(torch.randn(2, MLP.n_params + 1))
    model = WeightSpaceGNN(MLP, "pna", dim=8, n_layers=1)
    with pytest.raises(ValueError, match="shape"):
        model(torch.randn(2, 3))
    with pytest.raises(ValueError, match="layer must be"):
        WeightSpaceGNN(MLP, "gcn")
    with pytest.raises(ValueError, match="one entry per hidden layer"):
        graph.node_permutation([torch.arange(7)])
    with pytest.raises(ValueError, match="hidden layer 1 is not a permutation"):
        graph.node_permutation([torch.arange(7), torch.zeros(6, dtype=torch.long)])
    with pytest.raises(TypeError, match="MLPSpec or CNNSpec"):
        NeuralGraph((5, 7, 3))
    with pytest.raises(ValueError, match="kernel_size"):
        CNNSpec(1, (4,), kernel_size=2)


@pytest.mark.parametrize("spec", [MLPSpec((4, 6, 5, 3)), CNN], ids=["mlp", "cnn"])
def test_aligner_scores_follow_permutations_of_the_second_network(spec):
    from wsbook import symmetry
    from wsbook.graphs.align import LearnedAligner, planted_recovery

    torch.manual_seed(0)
    a, b = _population(spec, 3, 0), _population(spec, 3, 1)
    g = symmetry.random_permutation(spec, 3, torch.Generator().manual_seed(4))
    aligner = LearnedAligner(spec, dim=16, n_layers=2, layer="relational_transformer")
    with torch.no_grad():
        s, s_moved = aligner.scores(a, b), aligner.scores(a, symmetry.permute(spec, b, g))
    # one square score matrix per hidden layer (hidden channels of a CNN), from the symmetry spec
    assert [tuple(x.shape) for x in s] == [(3, w, w) for w in symmetry.symmetry_spec(spec).widths]
    perms, aligned = aligner.align(a, b)
    symmetry.check_permutations(perms, symmetry.symmetry_spec(spec).widths)
    torch.testing.assert_close(aligned, symmetry.permute(spec, b, perms))
    for layer, perm in enumerate(g):        # new neuron j of the moved network is old neuron perm[j]
        expected = s[layer].gather(2, perm.unsqueeze(1).expand_as(s[layer]))
        torch.testing.assert_close(s_moved[layer], expected, atol=1e-5, rtol=0)
    # a noiseless planted permutation is recovered exactly by any equivariant aligner with distinct embeddings
    moved = symmetry.permute(spec, a, g)
    assert planted_recovery(aligner, a, moved, symmetry.inverse_permutation(g)) == 1.0
    with pytest.raises(ValueError, match="theta_a and theta_b"):
        aligner.scores(a, b[:2])


def test_orbit_partner_computes_the_same_function():
    from wsbook.graphs.inr import orbit_partner

    spec = MLPSpec((2, 8, 8, 1), activation="sine", frequency=3.0)
    theta = spec.init(4, "siren", generator=torch.Generator().manual_seed(0), device="cpu")
    partner = orbit_partner(spec, theta, noise=0.0, generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(partner, theta)
    assert symmetry.function_difference(spec, theta, partner, torch.rand(32, 2)).max() < 1e-5
    found = symmetry.sign_aware_weight_matching(spec, theta, partner, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(found.aligned, theta, atol=1e-6, rtol=0)


def test_embed_population_preserves_function():
    from wsbook.graphs.train import embed_population

    small, big = MLPSpec((5, 3, 2, 3)), MLPSpec((5, 7, 6, 3))
    theta = _population(small, 4)
    x = torch.randn(11, 5)
    torch.testing.assert_close(big.forward(embed_population(small, theta, big), x), small.forward(theta, x))
    with pytest.raises(ValueError, match="cannot embed"):
        embed_population(big, _population(big, 1), small)


# ---------------------------------------------------------------- not tied to one architecture
FAMILY = [MLPSpec((5, 11, 4, 3)), MLPSpec((5, 8, 9, 6, 3)), MLPSpec((5, 4, 3)), MLPSpec((5, 3, 6, 8, 2, 3))]


def test_graph_ids_do_not_depend_on_widths_or_depth():
    from wsbook.graphs.neural_graph import ROLES, layer_roles

    assert [ROLES[r] for r in layer_roles(5)] == ["input", "first hidden", "middle hidden", "middle hidden",
                                                  "last hidden", "output"]
    assert [ROLES[r] for r in layer_roles(2)] == ["input", "only hidden", "output"]
    graphs = [NeuralGraph(s) for s in [MLP, *FAMILY]]
    assert len({g.n_pos for g in graphs}) == 1 and len({g.family for g in graphs}) == 1
    for g in graphs:            # inputs and outputs keep per-neuron ids; each hidden layer one id of its role
        assert torch.equal(g.node_pos[:5], torch.arange(5)) and torch.equal(g.node_pos[-3:], 5 + torch.arange(3))
        for layer in range(1, len(g.widths) - 1):
            ids = g.node_pos[g.node_layer == layer]
            assert (ids == ids[0]).all() and ids[0] >= 8
    assert NeuralGraph(MLPSpec((4, 7, 3))).family != graphs[0].family


def _train_briefly(model, theta, steps=5):
    """A few steps of a regression so the transfer test uses a trained (not freshly initialised) module."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(7)
    for _ in range(steps):
        t = torch.rand(theta.shape[0], generator=gen)
        noise = torch.randn(theta.shape, generator=gen)
        xt = (1 - t[:, None]) * noise + t[:, None] * theta
        loss = ((model(t, xt) - (theta - noise)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


@pytest.mark.parametrize("layer,attention", CASES)
def test_field_trained_on_one_width_is_equivariant_on_others(layer, attention):
    from wsbook import symmetry
    from wsbook.graphs import WeightSpaceField

    torch.manual_seed(0)
    field = WeightSpaceField(MLP, layer, dim=16, n_layers=2, attention=attention)
    theta = _population(MLP, 8)
    field.set_normalization(theta)
    _train_briefly(field, theta)
    field.eval()
    for k, spec in enumerate(FAMILY):
        x = _population(spec, 4, seed=10 + k)
        t = torch.rand(4, generator=torch.Generator().manual_seed(k))
        g = symmetry.random_permutation(spec, 4, torch.Generator().manual_seed(20 + k))
        with torch.no_grad():
            v = field(t, x, spec=spec)
            v_moved = field(t, symmetry.permute(spec, x, g), spec=spec)
        assert v.shape == x.shape and torch.isfinite(v).all()
        torch.testing.assert_close(v_moved, symmetry.permute(spec, v, g), atol=1e-5, rtol=0)
        assert not torch.allclose(v_moved, v, atol=1e-3)         # the permutation did move something


def test_invariant_model_is_invariant_on_other_widths_and_cnns():
    from wsbook import symmetry

    torch.manual_seed(0)
    model = WeightSpaceGNN(MLP, "pna", dim=16, n_layers=2, head="invariant", out_dim=2)
    model.set_normalization(_population(MLP, 8))
    for spec in FAMILY:
        x = _population(spec, 3)
        g = symmetry.random_permutation(spec, 3, torch.Generator().manual_seed(1))
        with torch.no_grad():
            torch.testing.assert_close(model(symmetry.permute(spec, x, g), spec=spec), model(x, spec=spec), atol=1e-5, rtol=0)
    cnn_model = WeightSpaceGNN(CNN, "relational_transformer", dim=16, n_layers=2, head="equivariant")
    other = CNNSpec(2, (7, 3, 4), kernel_size=3, n_classes=3)
    out = cnn_model(_population(other, 2), spec=other)
    assert out.shape == (2, other.n_params) and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="family"):
        model(_population(MLPSpec((4, 7, 3)), 2), spec=MLPSpec((4, 7, 3)))
    with pytest.raises(ValueError, match="family"):
        model(_population(CNN, 2), spec=CNN)


@pytest.mark.parametrize("layer,attention", CASES)
@pytest.mark.parametrize("head", ["invariant", "equivariant"])
def test_mixed_batch_equals_one_at_a_time(layer, attention, head):
    from wsbook.graphs import GraphBatch

    torch.manual_seed(0)
    model = WeightSpaceGNN(MLP, layer, dim=16, n_layers=2, head=head, out_dim=2, attention=attention, time=True).eval()
    specs = [FAMILY[0], MLP, FAMILY[1], FAMILY[2]]
    pops = [_population(s, n, seed=n) for s, n in zip(specs, (2, 3, 1, 2))]
    times = [torch.rand(p.shape[0], generator=torch.Generator().manual_seed(i)) for i, p in enumerate(pops)]
    batch = GraphBatch.from_populations(list(zip(specs, pops)))
    assert batch.num_graphs == 8 and [c for _, c in batch.parts] == [2, 3, 1, 2]
    with torch.no_grad():
        mixed = model.forward_graph(batch, torch.cat(times))
        single = [model(p, t=t, spec=s) for s, p, t in zip(specs, pops, times)]
    if head == "invariant":
        torch.testing.assert_close(mixed, torch.cat(single), atol=1e-5, rtol=0)
    else:
        assert len(mixed) == len(single)
        for m, s in zip(mixed, single):
            torch.testing.assert_close(m, s, atol=1e-5, rtol=0)


def test_all_attention_keeps_graphs_of_different_sizes_apart():
    """Graphs of 22 and 20 nodes (42 in all): a layout that assumed equal sizes would cut the batch into
    two blocks of 21 nodes and let nodes attend across graphs without any error."""
    from wsbook.graphs import GraphBatch, RelationalTransformerLayer

    torch.manual_seed(0)
    a, b = MLPSpec((5, 8, 6, 3)), MLPSpec((5, 6, 6, 3))
    batch = GraphBatch.from_populations([(a, _population(a, 1)), (b, _population(b, 1))])
    layer = RelationalTransformerLayer(16, 4, "all")
    with torch.no_grad():
        layer.no_edge.normal_()
    h, e = torch.randn(batch.x.shape[0], 16), torch.randn(batch.edge_attr.shape[0], 16)
    na, ea = NeuralGraph(a).n_nodes, NeuralGraph(a).n_edges
    with torch.no_grad():
        h_mixed, e_mixed = layer(h, batch.edge_index, e, batch.batch)
        h_a, e_a = layer(h[:na], batch.edge_index[:, :ea], e[:ea])
        h_b, e_b = layer(h[na:], batch.edge_index[:, ea:] - na, e[ea:])
    torch.testing.assert_close(h_mixed, torch.cat([h_a, h_b]), atol=1e-5, rtol=0)
    torch.testing.assert_close(e_mixed, torch.cat([e_a, e_b]), atol=1e-5, rtol=0)


def test_all_attention_in_blocks_of_graphs_equals_the_whole_batch(monkeypatch):
    """All-pairs attention runs a few graphs at a time; blocks of one graph each give the same outputs as the
    whole mixed-size batch at once (padding and mask included)."""
    from wsbook.graphs import GraphBatch, RelationalTransformerLayer, layers

    torch.manual_seed(0)
    a, b = MLPSpec((5, 8, 6, 3)), MLPSpec((5, 6, 6, 3))
    batch = GraphBatch.from_populations([(a, _population(a, 3)), (b, _population(b, 2))])
    layer = RelationalTransformerLayer(16, 4, "all")
    h, e = torch.randn(batch.x.shape[0], 16), torch.randn(batch.edge_attr.shape[0], 16)
    with torch.no_grad():
        monkeypatch.setattr(layers, "ALL_PAIRS_BLOCK_BYTES", 2 ** 40)
        whole = layer(h, batch.edge_index, e, batch.batch)
        monkeypatch.setattr(layers, "ALL_PAIRS_BLOCK_BYTES", 1)
        blocked = layer(h, batch.edge_index, e, batch.batch)
    for x, y in zip(whole, blocked):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=0)


def test_field_signature_and_time_on_edges():
    from wsbook.graphs import WeightSpaceField

    torch.manual_seed(0)
    field = WeightSpaceField(MLP, "pna", dim=16, n_layers=2)
    x = _population(MLP, 3)
    with torch.no_grad():
        v = field(0.3, x)
        torch.testing.assert_close(field(torch.tensor(0.3), x), v)
        torch.testing.assert_close(field(torch.full((3,), 0.3), x), v)
        torch.testing.assert_close(field(torch.full((3, 1), 0.3), x), v)
        assert not torch.allclose(field(0.7, x), v)
        # time reaches the edges: with the FiLM of the nodes switched off the output still moves with t
        for film in field.gnn.time_film:
            film.weight[:32].zero_()
            film.bias[:32].zero_()
        assert (field(0.7, x) - field(0.3, x))[:, :MLP.slices(0)[0].stop].abs().max() > 1e-4
    with pytest.raises(ValueError, match="t must be a scalar or have 3 entries"):
        field(torch.rand(2), x)
    with pytest.raises(ValueError, match="pass t exactly"):
        field.gnn(x)
    with pytest.raises(ValueError, match="family"):
        from wsbook.graphs import GraphBatch
        GraphBatch.from_populations([(MLP, x), (MLPSpec((4, 7, 3)), torch.randn(1, 4 * 7 + 7 + 7 * 3 + 3))])


@pytest.mark.parametrize("heads,attention,global_context", [(1, "neighbours", False), (4, "neighbours", True),
                                                            (2, "all", False)])
def test_dense_blocks_compute_the_gathered_function_and_gradient(heads, attention, global_context):
    """A batch of one architecture runs the relational layers on dense [out, in] blocks; a batch of two
    parts takes the gather/scatter route. Same values and same parameter gradients (float64)."""
    from wsbook.graphs import GraphBatch, WeightSpaceField

    torch.manual_seed(0)
    spec = MLPSpec((5, 7, 3, 4, 2))
    field = WeightSpaceField(spec, "relational_transformer", dim=8, n_layers=2, heads=heads,
                             attention=attention, global_context=global_context).double()
    if global_context:          # the virtual node starts at zero: give it weights so that it counts
        with torch.no_grad():
            for lin in field.gnn.global_in:
                lin.weight.normal_()
    x, t = torch.randn(6, spec.n_params, dtype=torch.float64), torch.rand(6, dtype=torch.float64)
    graph = NeuralGraph.of(spec)
    results = []
    for batch in (graph.to_graph(x), GraphBatch.cat([graph.to_graph(x[:2]), graph.to_graph(x[2:])])):
        field.zero_grad()
        out = torch.cat(field.forward_graph(t, batch))
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in field.parameters() if p.grad is not None]))
    (dense, g_dense), (gathered, g_gathered) = results
    assert len(results[0][1]) == len(results[1][1]) > 0
    torch.testing.assert_close(dense, gathered, atol=1e-12, rtol=0)
    for a, b in zip(g_dense, g_gathered):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_fit_aligner_noise_range_and_interpolation_points():
    from wsbook.figures import aligner_learning_curves
    from wsbook.graphs.align import LearnedAligner, fit_aligner

    torch.manual_seed(0)
    spec = MLPSpec((4, 6, 5, 3))
    zoo = _population(spec, 6, 0)
    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    runs = {}
    for lmc_at in ("midpoint", "uniform"):
        torch.manual_seed(0)
        aligner = LearnedAligner(spec, dim=8, n_layers=1, layer="relational_transformer")
        runs[lmc_at] = fit_aligner(aligner, zoo, x, y, steps=4, batch_size=3, noise=(0.0, 0.5), lmc_at=lmc_at)
        assert runs[lmc_at].shape == (4, 2) and torch.isfinite(runs[lmc_at]).all()
    # the same pairs and planted copies; only the interpolation points differ
    torch.testing.assert_close(runs["midpoint"][0, 0], runs["uniform"][0, 0])
    assert runs["midpoint"][0, 1] != runs["uniform"][0, 1]
    with pytest.raises(ValueError, match="lmc_at"):
        fit_aligner(aligner, zoo, x, y, steps=1, lmc_at="end")
    with pytest.raises(ValueError, match="noise"):
        fit_aligner(aligner, zoo, x, y, steps=1, noise=(0.5, 0.1))
    fig = aligner_learning_curves(runs["uniform"], window=2)
    assert len(fig.data) == 2 and len(fig.data[0].x) == 3
    with pytest.raises(ValueError, match="history"):
        aligner_learning_curves(runs["uniform"][:, :1])


def test_fit_aligner_trains_on_either_objective_alone():
    from wsbook.graphs.align import LearnedAligner, fit_aligner

    spec = MLPSpec((4, 6, 5, 3))
    zoo = _population(spec, 6, 0)
    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    runs = {}
    for name, (sup, lmc) in {"both": (1.0, 1.0), "supervised": (1.0, 0.0), "interpolation": (0.0, 1.0)}.items():
        torch.manual_seed(0)
        aligner = LearnedAligner(spec, dim=8, n_layers=1, layer="relational_transformer")
        runs[name] = fit_aligner(aligner, zoo, x, y, steps=3, batch_size=3, noise=(0.0, 0.5),
                                 supervised_weight=sup, lmc_weight=lmc)
    # a loss left out is not computed; the other sees the same first pair, copy and batch as with both
    assert runs["supervised"][:, 1].isnan().all() and runs["interpolation"][:, 0].isnan().all()
    torch.testing.assert_close(runs["supervised"][0, 0], runs["both"][0, 0])
    torch.testing.assert_close(runs["interpolation"][0, 1], runs["both"][0, 1])
    # ... and the training differs afterwards (the other loss no longer moves the aligner)
    assert runs["supervised"][-1, 0] != runs["both"][-1, 0]
    assert runs["interpolation"][-1, 1] != runs["both"][-1, 1]
    for bad in ((0.0, 0.0), (-1.0, 1.0)):
        with pytest.raises(ValueError, match="supervised_weight"):
            fit_aligner(aligner, zoo, x, y, steps=1, supervised_weight=bad[0], lmc_weight=bad[1])


def test_learned_aligner_on_a_cnn_trains_and_recovers_planted_channels():
    """The aligner of an MLP runs unchanged on a CNN: both losses are finite and the supervised one falls,
    and training makes it find the planted channel permutations of noisy copies of networks it never saw,
    which the untrained (but equivariant) aligner partly misses."""
    from wsbook.graphs.align import LearnedAligner, fit_aligner, planted_recovery

    spec = CNNSpec(1, (4, 4), kernel_size=3, n_classes=3)
    gen = torch.Generator().manual_seed(0)
    zoo = 0.5 * torch.randn(32, spec.n_params, generator=gen)
    x, y = torch.randn(48, 1, 4, 4, generator=gen), torch.randint(0, 3, (48,), generator=gen)
    held_out = zoo[16:]        # 128 hidden channels: recovery in steps of 1/128, so one CPU's rounding cannot decide
    g = symmetry.random_permutation(spec, len(held_out), torch.Generator().manual_seed(1))
    noisy = held_out + 0.2 * torch.randn(held_out.shape, generator=torch.Generator().manual_seed(2))
    moved, truth = symmetry.permute(spec, noisy, g), symmetry.inverse_permutation(g)
    torch.manual_seed(0)
    aligner = LearnedAligner(spec, dim=16, n_layers=2, layer="relational_transformer")
    aligner.gnn.set_normalization(zoo[:16])
    untrained = planted_recovery(aligner, held_out, moved, truth)
    history = fit_aligner(aligner, zoo[:16], x, y, steps=300, batch_size=8, lr=3e-3, noise=(0.0, 0.3),
                          data_batch=16)
    assert history.shape == (300, 2) and torch.isfinite(history).all()
    assert history[-10:, 0].mean() < 0.5 * history[:10, 0].mean()
    trained = planted_recovery(aligner, held_out, moved, truth)
    assert untrained < 0.9 and trained >= 0.95, (untrained, trained)
    with pytest.raises(ValueError, match="data_batch"):
        fit_aligner(aligner, zoo, x, y, steps=1, data_batch=0)


# ------------------------------------------------------------------ the canonicalizing autoencoder on CNNs
SMALL_CNN = CNNSpec(1, (4, 4), n_classes=10)


def _cnn_orbit_member(spec, theta, seed=3):
    """A random permutation and positive scaling of every hidden channel (same functions for ReLU)."""
    gen = torch.Generator().manual_seed(seed)
    moved = symmetry.permute(spec, theta, symmetry.random_permutation(spec, theta.shape[0], gen))
    scales = [torch.rand(theta.shape[0], w, generator=gen) * 2 + 0.5 for w in spec.channels]
    return symmetry.scale(spec, moved, scales)


@pytest.mark.usefixtures("one_thread")
def test_cnn_autoencoder_shapes_and_orbit_invariance():
    from wsbook.graphs.inr import WeightAutoencoder

    theta = SMALL_CNN.init(3, generator=torch.Generator().manual_seed(0), device="cpu")
    moved = _cnn_orbit_member(SMALL_CNN, theta)
    x = torch.rand(5, 1, 8, 8)
    torch.testing.assert_close(SMALL_CNN.forward(moved, x), SMALL_CNN.forward(theta, x), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(moved, theta)
    torch.manual_seed(0)
    ae = WeightAutoencoder(SMALL_CNN, dim=8, n_layers=2, latent=6, decoder_hidden=16).eval()
    assert ae.encoder(theta).shape == (3, 6) and ae(theta).shape == (3, SMALL_CNN.n_params)
    # one code, hence one decoded network, for every member of an orbit
    torch.testing.assert_close(ae(moved), ae(theta), atol=1e-5, rtol=1e-5)
    # without the scale canonicalization only permutations leave the code unchanged
    perm_only = WeightAutoencoder(SMALL_CNN, dim=8, n_layers=2, latent=6, decoder_hidden=16,
                                  canonicalize=False).eval()
    permuted = symmetry.permute(SMALL_CNN, theta,
                                symmetry.random_permutation(SMALL_CNN, 3, torch.Generator().manual_seed(4)))
    torch.testing.assert_close(perm_only(permuted), perm_only(theta), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(perm_only.encoder(moved), perm_only.encoder(theta), atol=1e-3)


@pytest.mark.usefixtures("one_thread")
def test_tanh_cnn_autoencoder_is_sign_invariant():
    """For tanh CNNs the canonical encoder flips channels (sign_canonicalize): a permuted and sign-flipped
    copy decodes to the same network; the permutation-only encoder sees the flips."""
    from wsbook.graphs.inr import WeightAutoencoder

    spec = CNNSpec(1, (4, 4), n_classes=10, activation="tanh")
    theta = spec.init(3, generator=torch.Generator().manual_seed(0), device="cpu")
    gen = torch.Generator().manual_seed(3)
    moved = symmetry.flip_signs(spec, symmetry.permute(spec, theta, symmetry.random_permutation(spec, 3, gen)),
                                symmetry.random_signs(spec, 3, gen))
    x = torch.rand(5, 1, 8, 8)
    torch.testing.assert_close(spec.forward(moved, x), spec.forward(theta, x), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(moved, theta)
    torch.manual_seed(0)
    ae = WeightAutoencoder(spec, dim=8, n_layers=2, latent=6, decoder_hidden=16).eval()
    assert ae.encoder.scaling == "sign"
    torch.testing.assert_close(ae(moved), ae(theta), atol=1e-5, rtol=1e-5)
    perm_only = WeightAutoencoder(spec, dim=8, n_layers=2, latent=6, decoder_hidden=16, canonicalize=False).eval()
    assert not torch.allclose(perm_only.encoder(moved), perm_only.encoder(theta), atol=1e-3)


@pytest.mark.usefixtures("one_thread")
def test_cnn_autoencoder_kl_loss_decreases_and_metrics():
    from wsbook.graphs.inr import WeightAutoencoder, fit_autoencoder, reconstruction_accuracy

    theta = SMALL_CNN.init(8, generator=torch.Generator().manual_seed(1), device="cpu")
    x = torch.rand(48, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    y = torch.randint(0, 10, (48,), generator=torch.Generator().manual_seed(3))
    torch.manual_seed(0)
    ae = WeightAutoencoder(SMALL_CNN, dim=8, n_layers=1, latent=8, decoder_hidden=32)
    history = fit_autoencoder(ae, theta, inputs=x, temperature=0.5, data_batch=16, epochs=40, lr=3e-3,
                              batch_size=4)
    assert history.shape == (40,) and torch.isfinite(history).all()
    assert history[-5:].mean() < 0.5 * history[:5].mean()
    out = reconstruction_accuracy(ae, theta, x, y, chunk=3)
    assert out["accuracy"].shape == out["decoded_accuracy"].shape == (8,)
    assert out["l1_error"] == pytest.approx((out["accuracy"] - out["decoded_accuracy"]).abs().mean().item())


def test_accuracy_agreement_on_a_known_case():
    from wsbook.graphs.inr import accuracy_agreement

    acc = torch.tensor([0.1, 0.2, 0.3, 0.4])
    out = accuracy_agreement(acc, torch.tensor([0.15, 0.25, 0.45, 0.35]))
    assert out["l1_error"] == pytest.approx(0.075)
    assert out["kendall_tau"] == pytest.approx(4 / 6)       # 5 concordant pairs, 1 discordant
    assert accuracy_agreement(acc, acc)["kendall_tau"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="accuracy vectors"):
        accuracy_agreement(acc, acc[:3])


def test_autoencoder_bad_input_raises_clear_errors():
    from wsbook.graphs.inr import WeightAutoencoder, WeightEncoder, fit_autoencoder

    theta = SMALL_CNN.init(2, generator=torch.Generator().manual_seed(0), device="cpu")
    ae = WeightAutoencoder(SMALL_CNN, dim=4, n_layers=1, latent=2, decoder_hidden=8)
    x = torch.rand(4, 1, 8, 8)
    with pytest.raises(ValueError, match="exactly one of images"):
        fit_autoencoder(ae, theta, epochs=1)
    with pytest.raises(ValueError, match="exactly one of images"):
        fit_autoencoder(ae, theta, torch.rand(2, 64), inputs=x, epochs=1)
    with pytest.raises(ValueError, match="temperature"):
        fit_autoencoder(ae, theta, inputs=x, temperature=0.0, epochs=1)
    with pytest.raises(ValueError, match="do not fit"):
        fit_autoencoder(ae, theta, inputs=torch.rand(4, 3, 8, 8), epochs=1)
    with pytest.raises(ValueError, match=r"\[B, %d\]" % SMALL_CNN.n_params):
        fit_autoencoder(ae, theta[:, :-1], inputs=x, epochs=1)
    with pytest.raises(ValueError, match="no per-neuron scaling"):
        WeightEncoder(MLPSpec((2, 4, 1), activation="gelu"))
    with pytest.raises(TypeError, match="MLPSpec or a CNNSpec"):
        WeightEncoder((2, 4, 1))


@pytest.mark.usefixtures("one_thread")
def test_cnn_checkpoint_zoo_keeps_runs_and_steps():
    from wsbook.experiments import zoos

    spec = CNNSpec(1, (2,))
    zoo = zoos.cnn_checkpoint_zoo(spec, 2, steps=4, n_checkpoints=2, lrs=(1e-3, 3e-3), batch_size=8)
    assert zoo["theta"].shape == (8, spec.n_params) and zoo["test_accuracy"].shape == (8,)
    assert zoo["step"].tolist() == [2, 2, 4, 4] * 2 and zoo["run"].tolist() == [0, 1, 0, 1, 2, 3, 2, 3]
    assert zoo["seed"].tolist() == [0, 1] * 4
    with pytest.raises(ValueError, match="n_checkpoints"):
        zoos.cnn_checkpoint_zoo(spec, 2, steps=4, n_checkpoints=5)
