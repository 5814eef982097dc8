"""The MNIST results page's experiment helpers (cheap parts: no flow is trained here)."""

import pytest
import torch

from wsbook import data
from wsbook.experiments import flows, mnist_flows as mf, targets
from wsbook.nets import MLPSpec


def test_permuted_mnist_is_one_fixed_pixel_permutation():
    ds, perm = data.load("mnist5k", device="cpu"), mf.permuted_mnist()
    again = mf.permuted_mnist()
    assert torch.equal(perm.x_train, again.x_train)                    # seeded: the same task every time
    assert torch.equal(perm.y_test, ds.y_test) and perm.x_test.shape == ds.x_test.shape
    # every image is a permutation of the original's pixels, the same one for all images and splits
    assert torch.equal(perm.x_train.sort(1).values, ds.x_train.sort(1).values)
    assert not torch.equal(perm.x_train, ds.x_train)


def test_bma_curve_of_identical_members_is_flat_and_sizes_capped():
    probs = torch.softmax(torch.randn(1, 50, 10, generator=torch.Generator().manual_seed(0)), -1).expand(8, -1, -1)
    y = torch.randint(0, 10, (50,), generator=torch.Generator().manual_seed(1))
    curve = mf.bma_curve(probs, y)
    assert sorted(curve) == [1, 4, 8]                                   # no model average larger than the set
    assert len({round(v["accuracy"], 6) for v in curve.values()}) == 1
    assert len({round(v["nll"], 6) for v in curve.values()}) == 1


def test_probability_scores_have_the_table_columns():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(12, 40, 10, generator=g), -1)
    y = torch.randint(0, 10, (40,), generator=g)
    row = flows.probability_scores(probs, y, bma_k=4, generator=torch.Generator().manual_seed(1))
    assert {"n", "accuracy", "nll", "bma_accuracy", "bma_nll", "diversity"} == set(row) - {"accuracy_std", "nll_std"}
    assert row["diversity"] > 0 and row["n"] == 12
    same = flows.probability_scores(probs[:1].expand(5, -1, -1), y)
    assert same["diversity"] == pytest.approx(0.0, abs=1e-6) and same["accuracy_std"] == 0.0


def test_recipes_and_errors():
    spec = MLPSpec((6, 4, 3))
    ref = spec.init(1, generator=torch.Generator().manual_seed(0), device="cpu")
    b = mf.budget()
    for name in mf.RECIPES:
        flow = mf.make_flow(name, spec, ref[0], b)
        assert flow.coupling_name == mf.RECIPES[name][2]
        # unanchored equivariant fields get pairs aligned to their source partners
        assert flow.align_pairs == (mf.RECIPES[name][1] in ("gnn_unanchored", "neuron"))
    transfer = mf.make_flow(mf.TRANSFER, spec, ref[0], b)
    assert type(transfer.field).__name__ == "NeuronField"
    assert transfer.with_spec(MLPSpec((6, 9, 3))).spec.widths == (6, 9, 3)
    # every recipe is a FlowConfig trained by the one pipeline, with its own budget's sizes
    neuron, gnn = mf.recipe_config(mf.TRANSFER), mf.recipe_config("geometric_aligned_ot")
    assert (neuron.field, neuron.steps, neuron.anchored) == ("neuron", b.neuron_steps, False)
    assert (gnn.field, gnn.steps, gnn.anchored, gnn.dim) == ("gnn", b.steps, True, b.dim)
    assert mf.recipe_config("geometric_aligned_ot", dim=b.dim + 4).dim == b.dim + 4
    assert mf.recipe_config("plain baseline").align_pairs is False
    with pytest.raises(ValueError, match="unknown recipe"):
        mf.make_flow("nope", spec, ref[0], b)
    with pytest.raises(ValueError, match="unknown recipe"):
        mf.sample_flow("nope")
    with pytest.raises(ValueError, match="task must be"):
        mf.task_data("fashion")


def test_guidance_weight_is_chosen_on_the_validation_split(monkeypatch):
    """The weight whose guided networks match the target's validation accuracy is chosen; a weight
    without guidance is an error."""
    spec = MLPSpec(tuple(targets.ZOOS[mf.ZOO].widths))
    target = spec.init(6, generator=torch.Generator().manual_seed(0), device="cpu")
    dead = torch.zeros_like(target)                       # predicts class 0 everywhere

    def fake_sample(recipe, guided=None, weight=None, **kw):
        assert guided == "mnist"
        return (target if weight == 1.0 else dead), 0.0

    monkeypatch.setattr(mf, "sample_flow", fake_sample)
    out = mf.guidance_by_validation("euclidean_aligned_ot", target, weights=(0.1, 1.0, 4.0))
    assert out["chosen"] == 1.0 and out["accuracy"][1.0] == out["target"]
    with pytest.raises(ValueError, match="at least one weight"):
        mf.guidance_by_validation("euclidean_aligned_ot", target, weights=())
    monkeypatch.undo()
    with pytest.raises(ValueError, match="needs guided"):
        mf.sample_flow("euclidean_aligned_ot", weight=1.0)


def test_neuron_similarity_is_one_for_repeated_neurons_and_zero_for_orthogonal_ones():
    spec = MLPSpec((4, 3, 2))
    w2, b2 = torch.randn(2, 2, 3), torch.randn(2, 2)
    eye = torch.eye(4)[:3]                                   # three orthogonal neurons, zero biases
    orth = spec.pack([eye.expand(2, -1, -1), w2], [torch.zeros(2, 3), b2])
    row = torch.tensor([1.0, 2.0, 0.0, -1.0])
    same = spec.pack([row.expand(2, 3, -1) * torch.tensor([1.0, 2.0, 0.5])[:, None], w2], [torch.zeros(2, 3), b2])
    assert mf.neuron_similarity(spec, orth) == pytest.approx(0.0, abs=1e-6)
    assert mf.neuron_similarity(spec, same) == pytest.approx(1.0, abs=1e-6)   # scale does not matter


def test_assembled_networks_average_the_logits_of_whole_members():
    spec, wide = MLPSpec((5, 3, 4)), MLPSpec((5, 6, 4))
    narrow = spec.init(16, generator=torch.Generator().manual_seed(0), device="cpu")
    gen = torch.Generator().manual_seed(1)
    theta = mf.assembled_networks(narrow, spec, wide, 7, generator=gen)
    pick = torch.randperm(16, generator=torch.Generator().manual_seed(1))[:14].reshape(7, 2)
    x = torch.randn(9, 5, generator=torch.Generator().manual_seed(2))
    members = torch.stack([spec.forward(narrow[pick[:, j]], x) for j in range(2)]).mean(0)
    assert torch.allclose(wide.forward(theta, x), members, atol=1e-5)
    with pytest.raises(ValueError, match="need 18 members"):     # members are drawn without replacement
        mf.assembled_networks(narrow, spec, wide, 9)
    with pytest.raises(ValueError, match="same"):
        mf.assembled_networks(narrow, spec, MLPSpec((6, 6, 4)), 2)


def test_mlp_width_transfer_rows_at_a_tiny_size(fake_zoo):
    """flows.transfer_rows with mf.mlp_widening on a tiny zoo of random 64-3-10 digit MLPs, two unanchored neuron
    flows trained for 2 steps and a random 'wide' zoo of 64-7-10 MLPs (k = 3 narrow networks per wide one): every
    row with finite means and standard errors, the verdicts on the flow's row only; a wide sample's outgoing
    weights are scaled by h / H."""
    import math

    from wsbook.experiments import protocol
    from wsbook.weightflow import EuclideanChart, NeuronField, WeightFlow

    spec, wide_spec = MLPSpec((64, 3, 10)), MLPSpec((64, 7, 10))
    cfg = targets.ZooConfig("digits", spec.widths, "sgd", 0.1, epochs=1, discard_epochs=0, every=1)

    def gen(seed):
        return torch.Generator().manual_seed(seed)

    split = protocol.split_runs(fake_zoo(spec, cfg, 7, 3, 0), 2)
    trained = {}
    for seed in (1, 2):
        flow = WeightFlow(EuclideanChart(spec), NeuronField(spec, hidden=8), coupling="ot", align_pairs=True)
        flow.fit(split.train.theta, steps=2, batch_size=4, generator=gen(seed))
        trained[seed] = flow
    widening = mf.mlp_widening(spec, wide_spec)
    assert widening.k == 3
    theta = wide_spec.init(2, generator=gen(3))
    scaled = widening.rescale(theta)
    assert torch.allclose(wide_spec.weights(scaled)[1], wide_spec.weights(theta)[1] * 3 / 7)
    assert torch.equal(wide_spec.weights(scaled)[0], wide_spec.weights(theta)[0])
    assert widening.pack(spec.init(6, generator=gen(4)), 0).shape == (2, wide_spec.n_params)
    out = flows.transfer_rows(split, fake_zoo(wide_spec, cfg, 2, 3, 1), trained, n=4, steps=2,
                              accuracy_gap=flows.ACCURACY_GAP, widening=widening)
    rows = out["rows"]
    assert list(rows) == list(flows.TRANSFER_ROWS) and out["k"] == 3 and out["wide_widths"] == [64, 7, 10]
    for row in rows.values():
        for col in ("accuracy", "nll", "bma_accuracy"):
            assert math.isfinite(row[col]) and math.isfinite(row[f"{col}_se"]) and row[f"{col}_se"] >= 0
    assert rows["flow at the new width"]["transfer verdict"] in protocol.VERDICTS
    assert rows["probability average"]["gap verdict"] == "—"


def test_width_transfer_flow_is_chosen_among_width_agnostic_recipes_on_validation(monkeypatch):
    """The width-transfer verdict's flow: the one whose wide samples are most accurate on the validation split
    among the table's recipes that sample other widths, never an anchored one however accurate."""
    accuracy = {mf.TRANSFER: 0.7, mf.UNANCHORED_GNN: 0.75, mf.NEURON_ANCHORED: 0.9}
    monkeypatch.setattr(mf, "wide_validation_accuracy", lambda r: accuracy.get(r, 0.0))
    assert mf.width_transfer_choice() == mf.UNANCHORED_GNN
    accuracy[mf.TRANSFER] = 0.8
    assert mf.width_transfer_choice() == mf.TRANSFER
