"""The weight-space GNN's dense-block route (feature-major edges, one ``[out, in]`` grid per layer block,
:meth:`RelationalTransformerLayer.forward_grid`) computes the function of its edge-list route (gathers and
scatters over ``edge_index``): same outputs, same gradients for the parameters and the input, on the book's
field sizes, on random MLP specs of mixed widths and on a CNN graph."""
import pytest
import torch

from wsbook.graphs import NeuralGraph, WeightSpaceField, WeightSpaceGNN
from wsbook.nets import CNNSpec, MLPSpec
from wsbook.weightflow import gnn_field


def _run(fn, params, x, monkeypatch, grid: bool):
    """Outputs and the gradients of a fixed linear functional of them (parameters, then input), with
    the batch on dense blocks (``grid``) or forced onto edge lists."""
    with monkeypatch.context() as m:
        if not grid:
            m.setattr(WeightSpaceGNN, "_grid", lambda self, batch: False)
        x = x.detach().clone().requires_grad_(True)
        out = fn(x)
        weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
        grads = torch.autograd.grad((out * weights).sum(), [*params, x], allow_unused=True)
    return out.detach(), grads


def _assert_same(fn, params, x, monkeypatch, rtol):
    """Dense == edge lists, every tensor to ``rtol`` relative to its largest entry."""
    (dense, g_dense), (ref, g_ref) = (_run(fn, params, x, monkeypatch, grid) for grid in (True, False))
    pairs = [(dense, ref)] + [(a, b) for a, b in zip(g_dense, g_ref) if b is not None]
    assert len(pairs) > len(params) // 2
    for a, b in pairs:
        assert a is not None
        torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * float(b.abs().max().clamp_min(1e-30)))


@pytest.mark.parametrize("widths,dim,n_layers,batch", [((30, 16, 16, 2), 16, 2, 32), ((784, 10, 10), 8, 1, 8)],
                         ids=["breast_cancer", "mnist"])
def test_book_fields_dense_equals_edge_lists(widths, dim, n_layers, batch, monkeypatch):
    """The GNN fields of chapters 8 and 8b (anchored: a second channel). In float64 the two routes agree
    to 1e-10 everywhere. In float32 the outputs and the gradient for the input agree to 1e-5; a parameter
    gradient sums over all edges of the batch (up to 63,520), where float32 itself is off by up to 4e-4
    on the edge-list route (against float64), so there the dense route must be as close to float64 as the
    edge-list route is (it is closer: the layer norms' sums run along rows)."""
    torch.manual_seed(0)
    spec = MLPSpec(widths)
    field = gnn_field(spec, dim=dim, n_layers=n_layers, heads=1, anchored=True).double()
    field.set_anchor(torch.randn(spec.n_params, dtype=torch.float64) * 0.3)
    x, t = torch.randn(batch, spec.n_params, dtype=torch.float64) * 0.3, torch.rand(batch, dtype=torch.float64)
    params = list(field.parameters())
    _assert_same(lambda x: field(t, x), params, x, monkeypatch, rtol=1e-10)
    truth = _run(lambda x: field(t, x), params, x, monkeypatch, grid=False)
    field.float()
    x32, t32 = x.float(), t.float()
    (out, g_dense), (ref, g_ref) = (_run(lambda x: field(t32, x), params, x32, monkeypatch, grid)
                                    for grid in (True, False))
    scale = lambda a: 1e-5 * float(a.abs().max())
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=scale(ref))
    torch.testing.assert_close(g_dense[-1], g_ref[-1], rtol=1e-5, atol=scale(g_ref[-1]))
    for a, b, exact in zip(g_dense[:-1], g_ref[:-1], truth[1][:-1]):
        if exact is None:
            continue
        err = lambda g: float((g.double() - exact).abs().max() / exact.abs().max().clamp_min(1e-30))
        assert err(a) <= 2 * err(b) + 1e-5


@pytest.mark.parametrize("seed", range(4))
def test_random_specs_dense_equals_edge_lists(seed, monkeypatch):
    """Random depths and mixed widths, heads, global context, one or two channels: float64 to 1e-10,
    float32 to 1e-5."""
    gen = torch.Generator().manual_seed(seed)
    depth = int(torch.randint(1, 5, (1,), generator=gen))
    widths = tuple(int(w) for w in torch.randint(1, 12, (depth + 1,), generator=gen))
    spec = MLPSpec(widths)
    heads = [1, 2, 4][seed % 3]
    channels = 1 + seed % 2
    for dtype, rtol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        torch.manual_seed(seed)
        field = WeightSpaceField(spec, "relational_transformer", dim=8, n_layers=2, heads=heads,
                                 channels=channels, global_context=seed >= 2).to(dtype)
        if field.gnn.global_in is not None:      # the virtual node starts at zero: give it weights
            with torch.no_grad():
                for lin in field.gnn.global_in:
                    lin.weight.normal_()
        field.set_normalization(torch.randn(5, spec.n_params, dtype=dtype))
        x, t = torch.randn(5, spec.n_params, dtype=dtype), torch.rand(5, dtype=dtype)
        ctx = torch.randn(1, spec.n_params, dtype=dtype) if channels == 2 else None
        _assert_same(lambda x: field(t, x, context=ctx), list(field.parameters()), x, monkeypatch, rtol)


@pytest.mark.parametrize("spec", [MLPSpec((4, 6, 3)), CNNSpec(2, (4, 5), kernel_size=3, n_classes=3)],
                         ids=["mlp", "cnn"])
def test_invariant_head_and_cnn_graphs_dense_equals_edge_lists(spec, monkeypatch):
    """The invariant read-out and a CNN's graph (complete between consecutive layers too, kernel-sized
    edge features) take the dense route as well: same function (float64)."""
    torch.manual_seed(1)
    x = torch.randn(3, spec.n_params, dtype=torch.float64)
    for head in ("invariant", "equivariant"):
        model = WeightSpaceGNN(spec, "relational_transformer", dim=8, n_layers=2, head=head, out_dim=2,
                               time=True, heads=2).double()
        t = torch.rand(3, dtype=torch.float64)
        _assert_same(lambda x: model(x, t=t), list(model.parameters()), x, monkeypatch, rtol=1e-10)


def test_dense_route_is_taken_and_embed_graph_keeps_its_layout():
    """A one-spec batch of a neighbour-attention model runs on dense blocks; a mixed batch, PNA and
    all-pairs attention do not. ``embed_graph`` returns edges ``[E, dim]`` on either route."""
    spec = MLPSpec((3, 4, 2))
    graph = NeuralGraph.of(spec)
    x = torch.randn(2, spec.n_params)
    batch = graph.to_graph(x)
    from wsbook.graphs import GraphBatch
    model = WeightSpaceGNN(spec, "relational_transformer", dim=8, n_layers=1)
    assert model._grid(batch) and not model._grid(GraphBatch.cat([graph.to_graph(x[:1]), graph.to_graph(x[1:])]))
    assert not WeightSpaceGNN(spec, "pna", dim=8)._grid(batch)
    assert not WeightSpaceGNN(spec, "relational_transformer", dim=8, attention="all")._grid(batch)
    h, e = model.embed_graph(batch)
    assert h.shape == (2 * graph.n_nodes, 8) and e.shape == (2 * graph.n_edges, 8)
