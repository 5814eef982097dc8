"""The chapter-8 flow driver (wsbook.experiments.flows) at tiny sizes: names, the split, the cached
training and sampling, and the scores (the memorisation check must see replayed training networks)."""
import pytest
import torch

from wsbook.experiments import flows
from wsbook.nets import MLPSpec
from wsbook.weightflow import NeuronField, NeuronGraphField


@pytest.fixture(autouse=True)
def _ci(monkeypatch, tmp_path):
    monkeypatch.setenv("WSBOOK_SCALE", "ci")
    monkeypatch.setenv("WSBOOK_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("WSBOOK_PROGRESS", "0")


def test_config_names_and_errors():
    assert flows.flow_config("geometric", "aligned_ot").name == "geometric_aligned_ot"
    assert flows.flow_config("normalized", "aligned").name == "normalized_aligned"
    assert flows.flow_config("euclidean", "plain").name == "euclidean"
    # an anchor only on aligned charts; on plain charts an equivariant field with pairs aligned instead
    plain, aligned = flows.flow_config("geometric", "plain"), flows.flow_config("geometric", "aligned")
    assert (plain.anchored, plain.align_pairs) == (False, True)
    assert (aligned.anchored, aligned.align_pairs) == (True, False)
    base = flows.baseline_config()
    assert (base.field, base.chart, base.aligned, base.coupling) == ("flat", "euclidean", True, "ot")
    ext, head = flows.extended_config(), flows.flow_config("euclidean", "aligned_ot")
    assert ext.name == head.name and ext.global_context and not head.global_context
    assert ext.steps == flows.EXTENDED_STEPS * head.steps and ext.lr > head.lr
    assert flows.extended_config(steps=7).steps == 7
    # the neuron field: named apart, anchored on the aligned chart, the deep or one-layer class as needed
    neuron = flows.neuron_config()
    assert neuron.name == "neuron_euclidean_aligned_ot" and neuron.anchored and not neuron.align_pairs
    split = flows.zoo_split("breast_cancer")
    assert isinstance(flows.build_field(split.spec, neuron), NeuronGraphField)
    assert isinstance(flows.build_field(MLPSpec((4, 3, 2)), neuron), NeuronField)
    with pytest.raises(ValueError, match="variant"):
        flows.flow_config("geometric", "sorted")
    with pytest.raises(ValueError, match="chart"):
        flows.FlowConfig(chart="hyperbolic")
    with pytest.raises(ValueError, match="steps"):
        flows.flow_config("geometric", steps=0)


def test_split_is_by_whole_runs_with_a_disjoint_floor_group():
    s = flows.zoo_split("breast_cancer", n_holdout=2)
    held, other, train = (set(z.run.tolist()) for z in (s.held, s.other, s.train))
    assert len(held) == len(other) == 2 and held.isdisjoint(train) and other <= train and held.isdisjoint(other)
    assert len(s.train) + len(s.held) == len(s.zoo)
    assert (s.train.theta == s.reference).all(1).any(), "the reference is a training network"
    again = flows.zoo_split("breast_cancer", n_holdout=2)
    assert torch.equal(again.held.run, s.held.run)
    with pytest.raises(ValueError, match="n_holdout"):
        flows.zoo_split("breast_cancer", n_holdout=len(s.zoo.runs))


def test_train_sample_score_cached_and_replay_is_detected():
    cfg = flows.baseline_config(steps=30, hidden=32, batch_size=16)
    trained = flows.train_flow("breast_cancer", cfg)
    path = flows._train_flow.cache_path("breast_cancer", None, 0, cfg, 0)
    assert path.exists() and trained.losses.shape == (30,)
    stamp = path.stat().st_mtime_ns
    theta, _ = flows.sample_flow("breast_cancer", cfg, 12, steps=2)
    again, _ = flows.sample_flow("breast_cancer", cfg, 12, steps=2)
    assert torch.equal(theta, again) and path.stat().st_mtime_ns == stamp
    split = flows.zoo_split("breast_cancer")
    refs = flows.references(split, w2_n=16)
    row = flows.score(theta, refs, bma_k=8)
    assert row["n"] == 12 and row["mmd2_floor"] == refs.mmd2_floor and row["w2"] > 0
    rows = flows.target_rows(refs, 16, bma_k=8)
    # training checkpoints replayed: nearest-neighbour distance zero; held-out runs are farther away
    assert rows["target"]["nn_train"] < 1e-3 * refs.nn_held
    assert rows["other runs"]["nn_train"] < 1e-3 * refs.nn_held      # the floor's runs are training runs too
    fresh = flows.score(split.held.theta[:16], refs, bma_k=8)
    assert fresh["nn_train"] > 0.1 * refs.nn_held
    with pytest.raises(ValueError, match="guidance"):
        flows.sample_flow("breast_cancer", cfg, 4, guidance=-1.0)
    # the ratio's interval: replayed training networks sit near zero, held-out networks around one
    replay = flows.nn_ratio_interval(split.train.theta[:32], refs, n_boot=200)
    assert replay["high"] < 1e-3
    held = flows.nn_ratio_interval(split.held.theta, refs, n_boot=200)
    assert held["ratio"] == pytest.approx(1.0) and held["low"] < 1.0 < held["high"]
    with pytest.raises(ValueError, match="level"):
        flows.nn_ratio_interval(theta, refs, level=1.5)
    # several draws of the same flow: seed 1 is the tables' set, other seeds other source points
    draws = flows.score_draws("breast_cancer", cfg, refs, 12, steps=2, sample_seeds=(1, 2))
    assert list(draws.index) == [1, 2]
    assert draws.loc[1, "mmd2"] == pytest.approx(flows.score(theta, refs)["mmd2"])
    assert draws.loc[1, "mmd2"] != draws.loc[2, "mmd2"]
    with pytest.raises(ValueError, match="sample seed"):
        flows.score_draws("breast_cancer", cfg, refs, 12, sample_seeds=())


def test_adam_curve_is_the_zoo_optimiser_after_k_steps():
    rows = flows.adam_curve("breast_cancer", (2, 6), 4)
    assert [r["steps"] for r in rows] == [2, 6] and rows[0]["flow"] == "adam"
    assert rows[1]["nll"] < rows[0]["nll"]
    with pytest.raises(ValueError, match="steps_list"):
        flows.adam_curve("breast_cancer", (0,), 4)
