"""The chapter-8 flow driver (wsbook.experiments.flows) at tiny sizes: names, the split, the cached
training and sampling, and the scores (the memorisation check must see replayed training networks)."""
import pytest
import torch

from wsbook import config
from wsbook.experiments import flows, protocol
from wsbook.nets import MLPSpec
from wsbook.weightflow import NeuronField


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
    # the neuron field: named apart, anchored on the aligned chart; its layer count is message-passing rounds
    # over two or more hidden layers, attention layers over one
    neuron = flows.neuron_config()
    assert neuron.name == "neuron_euclidean_aligned_ot" and neuron.anchored and not neuron.align_pairs
    split = flows.zoo_split("breast_cancer")
    deep, shallow = flows.build_field(split.spec, neuron), flows.build_field(MLPSpec((4, 3, 2)), neuron)
    assert isinstance(deep, NeuronField) and isinstance(shallow, NeuronField)
    assert deep.kwargs["rounds"] == neuron.n_layers and shallow.kwargs["attention_layers"] == neuron.n_layers
    with pytest.raises(ValueError, match="variant"):
        flows.flow_config("geometric", "sorted")
    with pytest.raises(ValueError, match="chart"):
        flows.FlowConfig(chart="hyperbolic")
    with pytest.raises(ValueError, match="steps"):
        flows.flow_config("geometric", steps=0)


def test_split_is_by_whole_runs_with_a_sealed_test_part():
    s = flows.zoo_split("breast_cancer", n_holdout=2)
    val, other, train = (set(z.run.tolist()) for z in (s.validation, s.other, s.train))
    assert len(val) == len(other) == 2 and val.isdisjoint(train) and other <= train
    with pytest.raises(protocol.SealedSplitError, match="test split"):
        s.test.open()
    test = protocol.final_report(lambda t: set(t.run.tolist()), s.test)
    assert len(test) == 2 and test.isdisjoint(train | val)
    assert len(s.train) + len(s.validation) + protocol.final_report(len, s.test) == len(s.zoo)
    assert s.run_counts() == {"train": len(train), "validation": 2, "other": 2, "test": 2}
    assert (s.train.theta == s.reference).all(1).any(), "the reference is a training network"
    again = flows.zoo_split("breast_cancer", n_holdout=2)
    assert torch.equal(again.validation.run, s.validation.run)
    with pytest.raises(ValueError, match="n_holdout"):
        flows.zoo_split("breast_cancer", n_holdout=len(s.zoo.runs) // 2)


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
    refs = flows.references(split, 12, w2_n=16)
    assert refs.on == "validation" and refs.floor.n == 12 and refs.floor.runs == len(split.other.runs)
    row = flows.score(theta, refs, bma_k=8)
    assert row["n"] == 12 and row["mmd2_floor"] == refs.mmd2_floor and row["w2"] > 0
    assert row["mmd_ratio"] == pytest.approx(row["mmd2"] / refs.floor.mean)
    rows = flows.target_rows(refs, 12, bma_k=8)
    assert list(rows) == list(flows.CONTROLS)
    # training checkpoints replayed: nearest-neighbour distance zero; validation runs are farther away
    assert rows["iid training checkpoints"]["nn_train"] < 1e-3 * refs.nn_held
    assert rows["perfect generator"]["nn_train"] < 1e-3 * refs.nn_held   # its runs are training runs too
    sets = flows.control_sets(refs, 12)
    one = torch.isin(split.train.run, split.train.run[(split.train.theta[:, None] == sets["one run"][None]).all(-1).any(1)])
    assert len(split.train.run[one].unique()) == 1, "the collapsed generator is one training run"
    fresh = flows.score(split.validation.theta[:16], refs, bma_k=8)
    assert fresh["nn_train"] > 0.1 * refs.nn_held
    with pytest.raises(ValueError, match="guidance"):
        flows.sample_flow("breast_cancer", cfg, 4, guidance=-1.0)
    # the ratio's interval: replayed training networks sit near zero, validation networks around one
    replay = flows.nn_ratio_interval(split.train.theta[:32], refs, n_boot=200)
    assert replay["high"] < 1e-3
    held = flows.nn_ratio_interval(split.validation.theta, refs, n_boot=200)
    assert held["ratio"] == pytest.approx(1.0) and held["low"] < 1.0 < held["high"]
    # the yardstick's own spread over resampled whole runs
    assert 0 < refs.nn_held_se < 0.5 * refs.nn_held
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


def test_test_report_reads_the_sealed_runs_with_seeds_and_verdicts():
    cfg = flows.baseline_config(steps=30, hidden=32, batch_size=16)
    split = flows.zoo_split("breast_cancer")
    sets = {"plain baseline": [flows.sample_flow("breast_cancer", cfg, 12, steps=2, seed=s, sample_seed=s + 1)[0]
                               for s in (0, 1)]}
    table = flows.test_report(split, sets, 12, seeds=3)
    assert list(table.index) == ["plain baseline", *flows.CONTROLS]
    assert table.loc["plain baseline", "seeds"] == 2 and table.loc["one run", "seeds"] == 3
    assert set(table["MMD² verdict"]) <= set(protocol.VERDICTS)
    assert table.attrs["on"] == "test" and table.attrs["floor"].runs == 2
    # the perfect generator reads about one floor
    pg = table.loc["perfect generator"]
    assert abs(pg["mmd_ratio"] - 1) < 3 * pg["mmd_ratio_se"] + 0.5, table
    # the nearest-neighbour ratio's error carries the test runs' own spread, as the MMD² ratio's the floor's
    nn_held, nn_held_se = table.attrs["nn_held"]
    test_refs = protocol.final_report(lambda test: flows._references(split, test, split.validation, "test", 12,
                                                                     w2_n=128, max_train=4000, seed=0), split.test)
    assert (nn_held, nn_held_se) == (test_refs.nn_held, test_refs.nn_held_se) and nn_held_se > 0
    nn_train = [flows.score(flows.control_sets(test_refs, 12, seed=1000 + s)["perfect generator"], test_refs,
                            seed=s)["nn_train"] for s in range(3)]
    assert (pg["nn_ratio"], pg["nn_ratio_se"]) == pytest.approx(protocol.ratio(nn_train, nn_held, nn_held_se))
    assert pg["nn_ratio_se"] > protocol.mean_se(nn_train)[1] / nn_held
    assert table.loc["iid training checkpoints", "accuracy verdict"] == "—"
    with pytest.raises(ValueError, match="2 seeds"):
        flows.test_report(split, {"x": sets["plain baseline"][:1]}, 12)
    with pytest.raises(ValueError, match="control"):
        flows.test_report(split, {"one run": sets["plain baseline"]}, 12)
    # after the report the test runs are sealed again
    with pytest.raises(protocol.SealedSplitError):
        split.test.open()


def test_a_verdict_table_after_its_seeds_trains_nothing():
    """The command line computes each training seed of a table on its own (``verdict_seed``, so that ``--jobs``
    runs them side by side); the table afterwards only scores, and chooses what the seeds chose."""
    from wsbook import cache

    cands = {"plain baseline": flows.baseline_config(steps=30, hidden=32, batch_size=16),
             "wide": flows.baseline_config(steps=30, hidden=64, batch_size=16)}
    chosen, validation = flows.verdict_choice("breast_cancer", cands, 12, 2)
    assert chosen == "wide" and set(validation) == set(cands)       # the baseline is scored, never chosen
    for seed in (1, 2):
        drawn = flows.verdict_seed("breast_cancer", cands, 12, 2, seed)
        assert set(drawn) == {"wide", "plain baseline"} and drawn["wide"].shape[0] == 12
    trained = [r for r in cache.compute_log() if r["name"] == "flows/trained"]
    table = flows.verdict_table("breast_cancer", cands, 12, 2, seeds=(1, 2))
    assert [r for r in cache.compute_log() if r["name"] == "flows/trained"] == trained
    assert table.attrs["selected"] == chosen and table.loc["wide", "seeds"] == 2
    assert torch.equal(flows.verdict_seed("breast_cancer", cands, 12, 2, 2)["wide"], drawn["wide"])


def test_guided_candidates_are_drawn_with_guidance_and_train_nothing_more():
    """A guided candidate draws from the flow its config trains (no second training) with task-loss guidance
    of its weight; the verdict's choice scores it like any flow, and the baseline stays unguided."""
    from wsbook import cache

    flow = flows.baseline_config(steps=30, hidden=64, batch_size=16)
    cands = flows.with_guidance({"plain baseline": flows.baseline_config(steps=30, hidden=32, batch_size=16),
                                 "wide": flow}, (0.5, 2.0))
    assert list(cands) == ["plain baseline", "wide", "wide, guided λ=0.5", "wide, guided λ=2"]
    assert cands["wide, guided λ=2"] == flows.Guided(flow, 2.0)
    with pytest.raises(ValueError, match="positive"):
        flows.Guided(flow, 0.0)
    plain = flows.draw("breast_cancer", cands["wide"], 12, 2)[0]
    guided = flows.draw("breast_cancer", cands["wide, guided λ=2"], 12, 2)[0]
    assert flows.trained_as(cands["wide, guided λ=2"]) == flows.trained_as(cands["wide"]) == flow
    assert torch.equal(guided, flows.sample_flow("breast_cancer", flow, 12, steps=2, guidance=2.0)[0])
    assert not torch.allclose(plain, guided)
    # the draw's cost end to end: the flow's training and the draw
    theta, seconds = flows.draw_cost("breast_cancer", cands["wide, guided λ=2"], 12, 2)
    assert torch.equal(theta, guided)
    assert seconds == pytest.approx(flows.train_flow("breast_cancer", flow).seconds
                                    + flows.draw("breast_cancer", cands["wide, guided λ=2"], 12, 2)[1])
    flows.draw("breast_cancer", cands["plain baseline"], 12, 2)          # every flow trained once, then
    trained = [r["entry"] for r in cache.compute_log() if r["name"] == "flows/trained"]
    chosen, validation = flows.verdict_choice("breast_cancer", cands, 12, 2)
    assert set(validation) == set(cands) and chosen != "plain baseline"
    assert [r["entry"] for r in cache.compute_log() if r["name"] == "flows/trained"] == trained
    # the control of a guided draw: the same source points moved by the guidance alone
    control = flows.guided_source("breast_cancer", cands["wide, guided λ=2"], 12, 2)
    assert control.shape == guided.shape and not torch.allclose(control, guided)
    with pytest.raises(TypeError, match="Guided"):
        flows.guided_source("breast_cancer", flow, 12, 2)
    trained_flow = flows.train_flow("breast_cancer", flow).flow
    x0 = trained_flow.chart.sample_source(5, torch.Generator().manual_seed(3))
    # without the field and without guidance nothing moves the source points
    assert torch.allclose(trained_flow.sample(5, x0=x0, field=False), trained_flow.chart.to_weights(x0))
    table = flows.verdict_table("breast_cancer", {"plain baseline": cands["plain baseline"],
                                                  "wide, guided λ=2": cands["wide, guided λ=2"]}, 12, 2, seeds=(1, 2))
    assert table.attrs["selected"] == "wide, guided λ=2" and table.loc[flows.GUIDANCE_CONTROL, "seeds"] == 2
    assert "wide" not in table.index          # its unguided draw is a row only where it was a candidate
    # chapter 8's candidates: every flow but the plain baseline, also guided with each weight
    bc = flows.breast_cancer_verdict_candidates()
    base = flows.breast_cancer_candidates()
    assert len(bc) == len(base) + (len(base) - 1) * len(flows.BREAST_CANCER_GUIDANCE)
    assert not any(isinstance(c, flows.Guided) for label, c in bc.items() if label in base)


def test_a_source_centred_on_the_training_networks():
    from wsbook import cache

    # a source at zero (every flow before the option existed) keys its entries as before: no "source" in the key
    assert "source" not in cache._canonical(flows.baseline_config())["FlowConfig"]
    cfg = flows.baseline_config(source="mean", sigma=0.3, steps=2)
    assert cache._canonical(cfg)["FlowConfig"]["source"] == "mean"
    assert cfg.name == "flat_euclidean_aligned_ot_from_mean"
    with pytest.raises(ValueError, match="source must be one of"):
        flows.baseline_config(source="median")
    with pytest.raises(ValueError, match="Euclidean chart"):
        flows.flow_config("geometric", "aligned_ot", source="mean")
    split = flows.zoo_split("breast_cancer")
    with pytest.raises(ValueError, match="pass them as train"):
        flows.build_flow(split.spec, cfg, split.reference)
    train = split.train.theta
    flow = flows.build_flow(split.spec, cfg, split.reference, train)
    # the source's mean is the mean of the training networks aligned to the reference, its scale sigma
    assert torch.allclose(flow.chart.loc[0], flow.chart.to_points(train).mean(0))
    x0 = flow.chart.sample_source(4000, torch.Generator().manual_seed(0))
    assert torch.allclose(x0.mean(0), flow.chart.loc[0], atol=0.03)
    assert abs(float(x0.std(0).mean()) - 0.3) < 0.01
    # the training of a table flow centres it the same way
    trained = flows.train_flow("breast_cancer", cfg)
    assert torch.allclose(trained.flow.chart.loc[0], flow.chart.loc[0])
    # the label of tables reads the scale the chart is built with, the chart's default where none is set
    assert cfg.source_label == "N(mean network, 0.3²)"
    plain = flows.build_flow(split.spec, flows.baseline_config(), split.reference)
    assert flows.baseline_config().source_label == f"N(0, {plain.chart.sigma:g}²)"
    assert flows.flow_config("geometric").source_label == "uniform on the spheres"


def test_the_channel_field_sizes_of_a_flow_config_reach_the_field():
    from wsbook import cache
    from wsbook.weightflow import ChannelField

    # configs at the defaults (every CNN flow before the two sizes existed) key their entries as before
    key = cache._canonical(flows.flow_config("euclidean", field="channel"))["FlowConfig"]
    assert "edge_dim" not in key and "attention_layers" not in key
    cfg = flows.flow_config("euclidean", field="channel", hidden=16, n_layers=2, edge_dim=8, attention_layers=1)
    assert cache._canonical(cfg)["FlowConfig"]["attention_layers"] == 1
    field = flows.build_field(flows.targets.ZOOS["cnn_digits"].spec, cfg)
    assert isinstance(field, ChannelField)
    assert field.kwargs | {"anchored": True} == dict(hidden=16, edge_dim=8, rounds=2, attention_layers=1, heads=4,
                                                     anchored=True)
    assert len(field.mix[0]) == 1 and field.edge_enc[0][-1].out_features == 8


def test_cnn_candidates_and_the_width_transfer_choice():
    cands = flows.cnn_candidates()
    # the CNN page's flow from the mean network has the larger field, the others the config's
    assert cands["channel_euclidean_aligned_ot_from_mean"].attention_layers >= 1
    assert all(c.attention_layers == 0 for k, c in cands.items() if k != "channel_euclidean_aligned_ot_from_mean")
    # and, as chapter 8d says, it trains for longer than every other CNN flow at every scale
    for name in ("ci", "default", "full"):
        with config.at_scale(name):
            steps = {k: c.steps for k, c in flows.cnn_candidates().items()}
        longer = steps.pop("channel_euclidean_aligned_ot_from_mean")
        assert longer > max(steps.values()), (name, longer, steps)
    # its training times, and the plain baseline's, from Beta(1, 2); the other flows' uniform (chapter 8d)
    assert {k for k, c in cands.items() if c.time_distribution == "beta(1,2)"} == {
        "channel_euclidean_aligned_ot_from_mean", "plain baseline"}
    assert flows.baseline_config().time_distribution == "uniform"     # the MLP pages' baseline is unchanged

    centred = [k for k, c in cands.items() if c.source == "mean"]
    assert sorted(cands[k].field for k in centred) == ["channel", "flat"]
    assert all(cands[k].parametrization == "endpoint" and cands[k].sigma == flows.CNN_MEAN_SOURCE_SIGMA
               for k in centred)
    # every channel field can be sampled at another width (a mean source widened with it); a flat one cannot
    assert [k for k, c in cands.items() if flows._transferable(c)] == [
        "channel_euclidean_aligned_ot", "channel_geometric_aligned_ot", "channel_euclidean_aligned_ot_from_mean"]
    assert flows.width_transfer_choice("channel_euclidean_aligned_ot_from_mean") == \
        "channel_euclidean_aligned_ot_from_mean"
    with pytest.raises(ValueError, match="not a CNN flow"):
        flows.cnn_width_transfer("conv")
    with pytest.raises(ValueError, match="field must be one of"):
        flows.cnn_verdict_table("conv")
    with pytest.raises(ValueError, match="cannot change width"):
        flows.cnn_width_transfer("flat_euclidean_aligned_ot_from_mean")


def test_the_choice_rule_prefers_flows_no_nearer_the_zoo_than_new_runs():
    near = {"mmd2": 1.0, "nn_ratio": 0.5}
    assert flows.choose({"near": near, "far": {"mmd2": 2.0, "nn_ratio": 1.1}}) == "far"
    assert flows.choose({"near": near, "nearer": {"mmd2": 2.0, "nn_ratio": 0.1}}) == "near"   # none admissible
