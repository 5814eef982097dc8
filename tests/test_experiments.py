"""wsbook.experiments and wsbook.figures: clear errors at the boundary, the one table of published numbers,
cache names that survive moves, and general figure helpers."""
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from wsbook import bayes
from wsbook.experiments import graphs as gexp
from wsbook.experiments import published, tasks, zoos
from wsbook.nets import MLPSpec

ROOT = Path(__file__).resolve().parent.parent


def test_unknown_task_or_method_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown task"):
        tasks.posterior_samples("imagenet", "hmc", 4)
    with pytest.raises(ValueError, match="unknown method"):
        tasks.posterior_samples("breast_cancer", "gibbs", 4)
    with pytest.raises(ValueError, match="positive int"):
        tasks.posterior_run("breast_cancer", "map", 0)


def test_predictive_from_outputs_is_the_average_of_softmaxes():
    f = torch.randn(5, 7, 3, generator=torch.Generator().manual_seed(0))
    p = tasks.predictive_from_outputs(f)
    assert torch.allclose(p, torch.stack([torch.softmax(fi, -1) for fi in f]).mean(0))
    with pytest.raises(ValueError, match="regression"):
        tasks.predictive_from_outputs(f, "gaussian")


def test_compare_methods_pairs_each_nll_with_the_baselines_over_the_test_points(tmp_path, monkeypatch):
    monkeypatch.setenv("WSBOOK_CACHE_DIR", str(tmp_path))
    table = tasks.compare_methods("breast_cancer", ["map", "ensemble"], 4, reference="map", baseline="map")
    assert table.loc["map", "nll_diff"] == 0 and table.loc["map", "nll_diff_se"] == 0
    # the mean of the paired differences is the difference of the means; its se is that of the differences
    assert math.isclose(table.loc["ensemble", "nll_diff"], table.loc["ensemble", "nll"] - table.loc["map", "nll"],
                        abs_tol=1e-6)
    assert table.loc["ensemble", "nll_diff_se"] > 0
    assert "nll_diff" not in tasks.compare_methods("breast_cancer", ["map"], 4, reference="map")
    with pytest.raises(ValueError, match="baseline"):
        tasks.compare_methods("breast_cancer", ["ensemble"], 4, reference="map", baseline="map")


def test_compare_methods_shares_each_nll_over_the_points_every_method_misclassifies(tmp_path, monkeypatch):
    monkeypatch.setenv("WSBOOK_CACHE_DIR", str(tmp_path))
    table = tasks.compare_methods("breast_cancer", ["map", "ensemble"], 4, reference="map")
    y = tasks.get_task("breast_cancer").data().y_test
    p = {m: tasks.predictive_from_outputs(tasks.posterior_run("breast_cancer", m, 4, 0)["f_test"])
         for m in ("map", "ensemble")}
    missed = (p["map"].argmax(-1) != y) & (p["ensemble"].argmax(-1) != y)
    assert table.attrs["n_missed_by_all"] == int(missed.sum())
    for m in p:
        nll = bayes.pointwise_nll(p[m], y).double()
        assert math.isclose(table.loc[m, "nll_share_missed"], float(nll[missed].sum() / nll.sum()), rel_tol=1e-6)
    assert ((table["nll_share_missed"] >= 0) & (table["nll_share_missed"] <= 1)).all()


def test_chain_modes_refuses_a_method_without_chains():
    with pytest.raises(ValueError, match="no chains"):
        tasks.chain_modes("breast_cancer", method="vi")


def test_cached_experiments_have_explicit_names():
    from wsbook.experiments import zoos as z

    names = {fn.cache_name for fn in (z.train_zoo, z.fit_variational_zoo, z.fit_inr_pairs, z.digits_zoo,
                                      z.digit_inr_zoo, tasks.posterior_run)}
    assert names == {"zoo/trained", "zoo/variational", "zoo/inr_pairs", "zoo/digits", "zoo/digit_inrs",
                     "posterior/run"}


def test_legacy_cache_names_map_onto_the_cached_functions():
    from wsbook import experiments
    from wsbook.experiments import zoos as z

    current = {fn.cache_name for fn in (z.train_zoo, z.fit_variational_zoo, z.fit_inr_pairs, z.digits_zoo,
                                        z.digit_inr_zoo, tasks.posterior_run)}
    assert set(experiments.LEGACY_CACHE_NAMES.values()) == current
    assert experiments.migrate_cache() == {name: 0 for name in current}   # an empty cache: nothing to move


def test_published_tables_are_consistent_and_cite_the_bibliography():
    bib = (ROOT / "book" / "references.bib").read_text()
    keys = set(re.findall(r"@\w+\{([^,]+),", bib))
    for key, table in published.TABLES.items():
        assert table.source in keys, f"{key}: {table.source} is not in references.bib"
        assert all(len(v) == len(table.columns) for v in table.rows.values())
        for column in table.columns:
            if column.endswith("_std"):
                assert all(v >= 0 for v in table.column(column).values())
    navon = published.table("navon2024/mlp_alignment")
    assert navon.get("weight_matching", "mnist_barrier") == 0.047
    assert math.isnan(navon.get("sinkhorn_l2", "mnist_barrier", float("nan")))
    with pytest.raises(KeyError, match="rows"):
        navon.get("sinkhorn_l2", "mnist_barrier")
    with pytest.raises(KeyError, match="columns"):
        navon.get("naive", "stl10_barrier")
    with pytest.raises(KeyError, match="available"):
        published.table("imagenet")
    frame = published.table("erdogan2025/mnist").frame()
    assert frame.loc["target", "accuracy"] == 0.933 and list(frame.columns)[:2] == ["accuracy", "accuracy_std"]
    with pytest.raises(ValueError, match="values for"):
        published.PublishedTable("x", "Table 0", "", ("a", "b"), {"row": (1.0,)})


def test_published_numbers_are_typed_only_in_the_table():
    # the numbers of the tables chapters 5 and 6 show, as they would be typed (at least three digits, two of them
    # significant: a lone 0.009 is a common number in prose)
    numbers = {f"{v}" for key in ("navon2024/mlp_alignment", "navon2024/cnn_alignment",
                                  "navon2024/cnn_runtime", "navon2024/ood_alignment",
                                  "navon2024/objectives", "boufalis2025/inr_reconstruction",
                                  "boufalis2025/cnn_reconstruction")
               for row in published.table(key).rows.values() for v in row
               if len(f"{v}") >= 5 and len(f"{v}".replace(".", "").lstrip("0")) >= 2}
    assert {"2.007", "0.047", "0.0096", "0.0135", "1.124", "79.81", "0.769", "0.061", "0.8914",
            "0.0142"} <= numbers
    sources = [p for p in (ROOT / "wsbook").rglob("*.py") if p.name != "published.py"]
    sources += sorted((ROOT / "chapters").glob("*.md"))
    found = [(p.name, n) for p in sources for n in numbers
             if re.search(rf"(?<![\d.]){re.escape(n)}(?!\d)", p.read_text(encoding="utf-8"))]
    assert not found, f"published numbers typed outside wsbook/experiments/published.py: {found}"


def test_split_by_seed_holds_out_whole_runs():
    seed = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])
    train, test = gexp.split_by_seed(seed, 1)
    assert (seed[test] == 2).all() and (seed[train] < 2).all() and len(train) + len(test) == len(seed)
    with pytest.raises(ValueError, match="n_test_seeds"):
        gexp.split_by_seed(seed, 3)


def test_trained_model_trains_once_then_reads_the_cache(tmp_path, monkeypatch):
    from wsbook import config
    from wsbook.graphs.align import LearnedAligner, fit_aligner

    monkeypatch.setenv("WSBOOK_CACHE_DIR", str(tmp_path))
    spec = MLPSpec((4, 6, 5, 3))
    gen = torch.Generator().manual_seed(0)
    zoo, x, y = torch.randn(6, spec.n_params, generator=gen), torch.randn(32, 4, generator=gen), torch.arange(32) % 3
    build = dict(dim=8, n_layers=1, layer="relational_transformer")
    calls = []
    monkeypatch.setitem(gexp.TRAINABLE, "aligner",
                        (LearnedAligner, lambda *a, **k: calls.append(1) or fit_aligner(*a, **k)))
    model, history, seconds = gexp.trained_model("aligner", spec, zoo, x, y, build=build, steps=3, batch_size=2)
    again, history_again, _ = gexp.trained_model("aligner", spec, zoo, x, y, build=build, steps=3, batch_size=2)
    assert len(calls) == 1 and seconds > 0 and history.shape == (3, 2)
    # the same as training by hand from the same initial weights
    with config.seeded(0):
        by_hand = LearnedAligner(spec, **build)
    torch.testing.assert_close(fit_aligner(by_hand, zoo, x, y, steps=3, batch_size=2), history_again)
    for ours in (model, again):
        for (name, a), b in zip(ours.state_dict().items(), by_hand.state_dict().values()):
            torch.testing.assert_close(a, b, msg=name)
    with pytest.raises(ValueError, match="trainable"):
        gexp.trained_model("flow", spec, zoo)


def test_pooled_digits_averages_blocks():
    x = torch.arange(2 * 64, dtype=torch.float32).view(2, 64)
    pooled = zoos.pooled_digits(x, 2)
    assert pooled.shape == (2, 16) and pooled[0, 0] == (0 + 1 + 8 + 9) / 4
    with pytest.raises(ValueError, match="pool"):
        zoos.pooled_digits(x, 3)


# ------------------------------------------------------------------ figures
def test_entropy_maps_scale_to_the_number_of_classes():
    from wsbook import figures

    g = torch.linspace(-1, 1, 4)
    xx, yy = torch.meshgrid(g, g, indexing="xy")
    grid = torch.stack([xx.reshape(-1), yy.reshape(-1)], 1)
    probs = {"hmc": torch.full((16, 3), 1 / 3), "map": torch.eye(3)[torch.arange(16) % 3]}
    fig = figures.entropy_maps(grid, probs, grid[:3], torch.tensor([0, 1, 2]))
    assert fig.data[0].zmax == pytest.approx(math.log(3))       # three classes: log 3, not log 2
    assert np.allclose(fig.data[0].z, math.log(3))
    assert figures.entropy_maps(grid, probs, grid[:3], torch.tensor([0, 1, 2]), zmax=2.0).data[0].zmax == 2.0
    with pytest.raises(ValueError, match="square"):
        figures.entropy_maps(grid[:15], {k: v[:15] for k, v in probs.items()}, grid[:3], torch.tensor([0, 1, 2]))


def test_regression_panels_y_range_is_an_argument():
    from wsbook import figures

    x = torch.linspace(-1, 1, 10)
    runs = {"hmc": torch.randn(4, 10, generator=torch.Generator().manual_seed(0))}
    auto = figures.regression_panels(x, runs, x, x, 0.1)
    assert auto.layout.yaxis.range is None
    fixed = figures.regression_panels(x, runs, x, x, 0.1, y_range=(-2.0, 5.0))
    assert tuple(fixed.layout.yaxis.range) == (-2.0, 5.0)


def test_rgba_uses_public_colour_parsing():
    from wsbook import figures

    assert figures.rgba("#0072B2", 0.25) == "rgba(0,114,178,0.25)"
    with pytest.raises(ValueError, match="alpha"):
        figures.rgba("#0072B2", 1.5)


def test_reader_figure_fixes():
    """Issue 11: round spheres, bands without markers, readable names, targets in trajectory plots, and the
    canonicalization figure showing matched pairs (a permutation moves no point)."""
    from wsbook import figures
    from wsbook.nets import MLPSpec
    from wsbook.symmetry import permute, random_permutation

    fig = figures.curves_with_bands([0, 1, 2], {"sgd_trajectory": ([1, 2, 3], [0, 1, 2], [2, 3, 4])})
    band, line = fig.data
    assert band.mode == "lines" and line.name == "Adam checkpoints"
    assert figures.label("kendall_tau") == "Kendall τ" and figures.label("test NLL") == "test NLL"
    sphere = figures.sphere_samples({"target": torch.randn(20, 3)})
    ranges = [tuple(sphere.layout.scene[a].range) for a in ("xaxis", "yaxis", "zaxis")]
    assert len(set(ranges)) == 1, f"unequal axis ranges draw the sphere as an ellipsoid: {ranges}"
    traj = figures.trajectories_2d({"ot": torch.randn(5, 4, 2)}, target=torch.randn(30, 2))
    assert any(t.name == "target samples" for t in traj.data)
    assert traj.layout.xaxis.title.text and traj.layout.yaxis.title.text
    spec = MLPSpec((2, 6, 2))
    theta = spec.init(3, generator=torch.Generator().manual_seed(0))
    moved = permute(spec, theta, random_permutation(spec, 3, generator=torch.Generator().manual_seed(1)))
    fig = figures.neurons_on_sphere(spec, theta, moved)
    pairs = [t for t in fig.data if t.name == "matched pairs"]
    assert len(pairs) == 4, "one set of segments per non-reference network and panel"
    with pytest.raises(ValueError, match="members"):
        figures.neurons_on_sphere(spec, theta, moved, members=1)


def test_guided_posterior_samples_and_their_control():
    """`posterior_flows.guided`: the guided flow and the guided prior draws are populations of the task's
    spec, and the guidance alone lowers the training loss of prior draws (descent)."""
    from wsbook.experiments import posterior_flows as pf
    from wsbook.nets import per_member_loss
    from wsbook.weightflow import EuclideanChart, FlatField, WeightFlow

    task = tasks.get_task("breast_cancer")
    ds = task.data()
    flow = WeightFlow(EuclideanChart(task.spec, sigma=1.0), FlatField(task.spec, hidden=16, depth=1))
    out = pf.guided(flow, 6, weight=2.0, generator=torch.Generator().manual_seed(0), steps=32)
    assert set(out) == {"euclidean flow + guidance", "prior + guidance"}
    for theta, seconds in out.values():
        assert theta.shape == (6, task.spec.n_params) and torch.isfinite(theta).all() and seconds >= 0
    prior = pf.prior_draws("breast_cancer", 6, torch.Generator().manual_seed(0))
    loss = lambda th: per_member_loss(task.spec, th, ds.x_train, ds.y_train, task.task).mean()
    assert loss(out["prior + guidance"][0]) < loss(prior)


def test_cnn_digit_zoo_and_alignment_through_the_same_code():
    from wsbook import data as wdata
    from wsbook import symmetry as S
    from wsbook.experiments import alignment
    from wsbook.nets import CNNSpec

    with pytest.raises(ValueError, match="8x8"):
        zoos.digit_images(torch.zeros(3, 63))
    ds = wdata.load("digits", device="cpu")
    spec = CNNSpec(1, (4, 5), n_classes=10)
    zoo = zoos.train_cnn_zoo(spec, 2, steps=40).cpu()
    assert zoo.shape == (2, spec.n_params) and zoos.train_cnn_zoo.cache_name == "zoo/cnn_digits"
    with pytest.raises(ValueError, match="1 input channel"):
        zoos.train_cnn_zoo(CNNSpec(3, (4,), n_classes=10), 2, steps=1)
    x, xt = zoos.digit_images(ds.x_train[:64]), zoos.digit_images(ds.x_test[:64])
    reverse = [torch.arange(w).flip(0).expand(2, w) for w in (4, 5)]   # never the identity
    planted = S.permute(spec, zoo, reverse)                             # same functions, permuted channels
    res = alignment.compare_alignments(spec, zoo, planted, x, ds.y_train[:64], xt, ds.y_test[:64],
                                       methods=("naive", "weight_matching", "activation_matching"))
    assert ((planted - zoo).abs().amax(1) > 1e-2).all()
    for m in ("weight_matching", "activation_matching"):
        assert (res[m]["aligned"] - zoo).abs().max() < 1e-5, m
        assert res[m]["barrier"].abs().max() < 1e-5 and res[m]["seconds_per_pair"] > 0


def test_variational_width_sweep_reuses_the_fits():
    from wsbook import data as wdata
    from wsbook.experiments import alignment
    from wsbook.nets import MLPSpec

    sweep = alignment.variational_width_sweep([4, 6], n_pairs=1, steps=5, n_samples=2)
    assert sweep["widths"].tolist() == [4, 6]
    assert all(sweep[k].shape == (2, 1) for k in ("naive", "aligned", "end_loss"))
    ds = wdata.load("digits")
    q = zoos.fit_variational_zoo(MLPSpec((64, 6, 6, 10)), "digits", 2, steps=5)
    one = alignment.variational_barriers(MLPSpec((64, 6, 6, 10)), q["mean"], q["std"], ds.x_test, ds.y_test,
                                         n_samples=2)
    torch.testing.assert_close(sweep["aligned"][1], one["aligned"]["barrier"].to(sweep["aligned"]))
    assert alignment.variational_width_sweep.cache_name == "align/variational_width"


def test_variational_prior_sweep_settings_and_errors():
    from wsbook.experiments import alignment

    sweep = alignment.variational_prior_sweep([0.5, 1.0], [0.5, 1.0], width=4, n_pairs=1, steps=5, n_samples=2)
    for part in ("prior", "temperature"):
        assert sweep[part]["values"].tolist() == [0.5, 1.0]
        assert all(sweep[part][k].shape == (2, 1) for k in ("naive", "aligned", "end_loss"))
    # prior 1 at T = 1 is one setting: the same fit and the same barriers in both sweeps
    torch.testing.assert_close(sweep["prior"]["aligned"][1], sweep["temperature"]["aligned"][1])
    assert not torch.equal(sweep["prior"]["end_loss"][0], sweep["temperature"]["end_loss"][0])
    with pytest.raises(ValueError, match="positive"):
        alignment.variational_prior_sweep([0.0], [1.0], width=4, n_pairs=1, steps=5)


def test_hyper_matching_shortens_the_segment_and_orbit_distances_see_relabellings():
    from wsbook.experiments import alignment
    from wsbook.experiments.alignment import _segment_loss
    from wsbook.symmetry import flip_signs, permute, random_permutation, random_signs

    spec = MLPSpec((2, 8, 8, 1), activation="sine", frequency=3.0)
    gen = torch.Generator().manual_seed(0)
    a, b = spec.init(2, "siren", generator=gen, device="cpu"), spec.init(2, "siren", generator=gen, device="cpu")
    hm = alignment.hyper_matching(spec, a, b, n_grid=8, steps=40)
    assert hm["hyper"].shape == hm["direct"].shape == a.shape and hm["hyper_seconds"] > 0
    x, y = zoos.shape_sdf(8)
    before, after = (_segment_loss(spec, a, t, x, y, torch.Generator().manual_seed(1)) for t in (b, hm["direct"]))
    assert (after < before).all(), (before, after)
    # a relabelled b (permuted and sign-flipped neurons) sits on b's orbit
    moved = flip_signs(spec, permute(spec, b, random_permutation(spec, 2, generator=gen)),
                       random_signs(spec, 2, generator=gen))
    d = alignment.orbit_distances(spec, a, b, moved)
    assert d["to_b_orbit"].max() < 1e-4 and (d["a_to_b_orbit"] > 0.1).all()
    torch.testing.assert_close(d["to_a"], (moved - a).norm(dim=1))


def test_merge_canonical_forms_paths_and_orbit_pairs():
    from wsbook.experiments.alignment import merge_canonical_forms
    from wsbook.graphs.inr import INRAutoencoder, orbit_partner, pixel_grid, render

    torch.manual_seed(0)
    spec = MLPSpec((2, 6, 6, 1), activation="sine", frequency=3.0)
    a = spec.init(4, "siren", generator=torch.Generator().manual_seed(0), device="cpu")
    images = render(spec, a, pixel_grid(8)).detach()             # a draws its image exactly
    partner = orbit_partner(spec, a, noise=0.0, generator=torch.Generator().manual_seed(1))
    ae = INRAutoencoder(spec, dim=8, n_layers=1, latent=4, decoder_hidden=16)
    out = merge_canonical_forms(ae, a, partner, images, n_points=9)
    assert set(out) == {"naive", "weight_matching", "autoencoder"}
    for v in out.values():
        assert v["loss"].shape == (4, 9) and v["barrier"].shape == (4,)
        torch.testing.assert_close(v["max_loss"], v["loss"].amax(1))
    # one orbit: matching undoes the permutation and flips, the encoder gives both one code
    assert out["weight_matching"]["max_loss"].max() < 1e-8
    assert out["autoencoder"]["barrier"].abs().max() < 1e-6
    assert out["naive"]["barrier"].min() > 1e-3
    with pytest.raises(ValueError, match="images"):
        merge_canonical_forms(ae, a, partner, images[:, :10])


def test_shifted_digits_keep_the_inputs_and_classes_of_the_pooled_digits():
    from wsbook import data as wdata
    from wsbook.experiments import alignment

    digits = wdata.load("digits")
    pooled = zoos.pooled_digits(digits.x_train, 2)
    rotated = alignment.shifted_digits("rotated", pool=2)
    assert rotated["x_train"].shape == pooled.shape and torch.equal(rotated["y_train"], digits.y_train)
    assert rotated["x_test"].shape == (len(digits.x_test), 16)
    # turned by at most 45 degrees: close to the upright image, never identical to it
    change = (rotated["x_train"] - pooled).norm(dim=1) / pooled.norm(dim=1)
    assert (change > 1e-3).float().mean() > 0.9 and change.median() < 0.8
    torch.testing.assert_close(alignment.shifted_digits("rotated", pool=2)["x_test"], rotated["x_test"])
    mnist = alignment.shifted_digits("mnist", pool=4)
    assert mnist["x_train"].shape[1] == 4 and set(mnist["y_test"].tolist()) == set(range(10))
    with pytest.raises(ValueError, match="shift"):
        alignment.shifted_digits("inverted")
    zoo = alignment.shifted_digits_zoo("rotated", 2, hidden=8, steps=60, lr=3e-2)
    assert zoo["theta"].shape == (2, MLPSpec((16, 8, 8, 10)).n_params)
    assert (zoo["test_accuracy"] > 0.3).all()   # learned something (chance: 0.1)
    assert alignment.shifted_digits_zoo.cache_name == "align/shifted_zoo"


def test_aligner_objectives_train_one_aligner_per_objective():
    from wsbook.experiments import alignment

    spec = MLPSpec((4, 6, 5, 3))
    gen = torch.Generator().manual_seed(0)
    nets = 0.5 * torch.randn(10, spec.n_params, generator=gen)
    x, y = torch.randn(32, 4, generator=gen), torch.randint(0, 3, (32,), generator=gen)
    kw = dict(dim=8, n_layers=1, steps=3, batch_size=3)
    res = alignment.aligner_objectives(spec, nets[:6], nets[6:8], nets[8:], x, y, x, y,
                                       objectives=("supervised", "interpolation", "both"), **kw)
    assert set(res) == {"supervised", "interpolation", "both"}
    for name, r in res.items():
        assert math.isfinite(r["barrier"]) and 0 <= r["recovery"] <= 1, name
    assert math.isnan(res["supervised"]["final_interpolation"]) and math.isnan(res["interpolation"]["final_supervised"])
    assert math.isfinite(res["both"]["final_supervised"]) and math.isfinite(res["both"]["final_interpolation"])
    with pytest.raises(ValueError, match="objectives"):
        alignment.aligner_objectives(spec, nets[:6], nets[6:8], nets[8:], x, y, x, y, objectives=("alignment",))
    assert alignment.aligner_objectives.cache_name == "align/objectives"


def test_compare_learned_alignment_runs_the_methods_asked_for():
    from wsbook import symmetry as S
    from wsbook.experiments import alignment
    from wsbook.graphs.align import LearnedAligner

    spec = MLPSpec((4, 6, 5, 3))
    gen = torch.Generator().manual_seed(0)
    a = 0.5 * torch.randn(3, spec.n_params, generator=gen)
    b = S.permute(spec, a, S.random_permutation(spec, 3, gen))     # same functions, permuted neurons
    x, y = torch.randn(64, 4, generator=gen), torch.randint(0, 3, (64,), generator=gen)
    torch.manual_seed(0)
    aligner = LearnedAligner(spec, dim=8, n_layers=1, layer="relational_transformer")
    methods = ("learned", "naive", "activation_matching", "learned_wm")
    res = alignment.compare_learned_alignment(aligner, a, b, x, y, x, y, methods=methods)
    assert tuple(res) == methods
    for m in ("learned", "activation_matching", "learned_wm"):   # an exact copy is found again
        assert abs(res[m]["barrier"]) < 1e-5 and res[m]["curve"].shape == (25,), m
    naive = res["naive"]["curve"]
    assert (naive[12] - naive[0]).abs() > 1e-3    # the unaligned path does change the loss
    # per-pair barriers, and their paired difference: the exact copies' zero against the naive ones
    assert res["naive"]["barriers"].shape == (3,)
    assert res["naive"]["barriers"].mean().item() == pytest.approx(res["naive"]["barrier"])
    diff = alignment.paired_difference(res, "naive", "learned")
    assert diff["pairs"] == 3 and diff["se"] >= 0
    assert diff["mean"] == pytest.approx(res["naive"]["barrier"] - res["learned"]["barrier"])
    with pytest.raises(ValueError, match="unknown methods"):
        alignment.compare_learned_alignment(aligner, a, b, x, y, x, y, methods=("canonical",))


def test_paired_difference_over_every_pair_uses_the_network_jackknife():
    from wsbook.experiments import alignment

    i, j = alignment.every_pair(6)
    assert len(i) == 15 and bool((i < j).all())
    gen = torch.Generator().manual_seed(0)
    # each network carries its own offset, so pairs sharing a network are correlated
    offset = torch.randn(6, generator=gen)
    d = offset[i] + offset[j] + 0.1 * torch.randn(15, generator=gen)
    res = {"x": {"barriers": d}, "y": {"barriers": torch.zeros(15)}}
    out = alignment.paired_difference(res, "x", "y", pairs=(i, j))
    # the jackknife written out: leave each network (and its pairs) out in turn
    loo = torch.stack([d[(i != k) & (j != k)].mean() for k in range(6)])
    se = ((5 / 6) * ((loo - loo.mean()) ** 2).sum()).sqrt()
    assert out["mean"] == pytest.approx(float(d.mean())) and out["pairs"] == 15
    assert out["se"] == pytest.approx(float(se), rel=1e-5)
    # the shared networks make the naive standard error too small here
    assert out["se"] > alignment.paired_difference(res, "x", "y")["se"]
    words = alignment.difference_verdict(out)
    assert words.startswith("above" if out["mean"] > 0 else "below") and "15 pairs" in words
    assert alignment.difference_verdict({"mean": -0.5, "se": 0.1, "pairs": 9}).endswith(
        "beyond two standard errors")
    assert alignment.difference_verdict({"mean": 0.1, "se": 0.1, "pairs": 9}, "Sinkhorn") == (
        "above Sinkhorn by 0.100 ± 0.100 per pair (mean ± standard error over 9 pairs), within two standard errors")
    with pytest.raises(ValueError, match="distinct networks"):
        alignment.paired_difference(res, "x", "y", pairs=(i, i))
    with pytest.raises(ValueError, match="at least 2 networks"):
        alignment.every_pair(1)


def test_compare_learned_alignment_runs_on_cnns_through_the_same_code():
    from wsbook import symmetry as S
    from wsbook.experiments import alignment
    from wsbook.graphs.align import LearnedAligner
    from wsbook.nets import CNNSpec

    spec = CNNSpec(1, (4, 3), kernel_size=3, n_classes=3)
    gen = torch.Generator().manual_seed(0)
    a = 0.5 * torch.randn(2, spec.n_params, generator=gen)
    b = S.permute(spec, a, S.random_permutation(spec, 2, gen))     # same functions, permuted channels
    x, y = torch.randn(32, 1, 5, 5, generator=gen), torch.randint(0, 3, (32,), generator=gen)
    torch.manual_seed(0)
    aligner = LearnedAligner(spec, dim=8, n_layers=1, layer="relational_transformer")
    methods = ("naive", "weight_matching", "activation_matching", "sinkhorn", "learned", "learned_sinkhorn")
    res = alignment.compare_learned_alignment(aligner, a, b, x, y, x, y, methods=methods, sinkhorn_steps=5)
    assert tuple(res) == methods
    for m in ("learned", "weight_matching", "activation_matching"):   # an exact copy is found again
        assert abs(res[m]["barrier"]) < 1e-5, m
    assert res["learned_sinkhorn"]["seconds_per_pair"] >= res["learned"]["seconds_per_pair"]
    assert (res["naive"]["curve"][12] - res["naive"]["curve"][0]).abs() > 1e-3


def test_training_curves_read_each_loss_over_its_first_tenth():
    from wsbook import figures

    falling = torch.linspace(2.0, 0.5, 200)
    rel = figures.relative_losses(falling, smooth=1)
    assert rel[0] == pytest.approx(2.0 / falling[:20].mean().item()) and rel[-1] < 1 < rel[0]
    assert figures.relative_losses(torch.ones(50)).tolist() == [1.0] * 50
    assert len(figures.relative_losses(falling)) == 200 - 4 + 1          # a moving average over 4 steps
    fig = figures.training_curves({"plain baseline": falling, "geometric_aligned_ot": torch.ones(300)})
    assert [t.name for t in fig.data] == ["plain baseline", "Geometric, aligned + OT"]
    assert fig.layout.yaxis.type == "log" and fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
    with pytest.raises(ValueError, match="finite"):
        figures.relative_losses(torch.tensor([1.0, float("nan")]))
