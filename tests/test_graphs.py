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
    t = torch.rand(4)
    inv = WeightSpaceGNN(graph, layer, dim=16, n_layers=2, head="invariant", out_dim=3, attention=attention, time=True)
    inv.set_normalization(theta)                          # per-layer input scales keep the symmetry
    torch.testing.assert_close(inv(permuted, t), inv(theta, t), atol=1e-5, rtol=0)
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


def test_aligner_scores_follow_permutations_of_the_second_network():
    from wsbook import symmetry
    from wsbook.graphs.align import LearnedAligner, planted_recovery

    torch.manual_seed(0)
    spec = MLPSpec((4, 6, 5, 3))
    a, b = _population(spec, 3, 0), _population(spec, 3, 1)
    g = symmetry.random_permutation(spec, 3, torch.Generator().manual_seed(4))
    aligner = LearnedAligner(spec, dim=16, n_layers=2, layer="relational_transformer")
    with torch.no_grad():
        s, s_moved = aligner.scores(a, b), aligner.scores(a, symmetry.permute(spec, b, g))
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
