"""The one train/sample path of the results chapters (wsbook.experiments.pipeline)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from wsbook import cli
from wsbook.experiments import flows, mnist_flows as mf, pipeline, posterior_flows as pf

ROOT = Path(__file__).resolve().parent.parent
RESULTS_CHAPTERS = ("08_results", "08b_mnist", "08c_posterior", "08d_cnn", "09_discussion")


def test_every_target_lists_its_flows_by_the_names_of_the_tables():
    for target in pipeline.TARGETS:
        recipes = pipeline.recipes(target)
        assert recipes and all(r.target == target and r.name == name for name, r in recipes.items())
        assert {r.objective for r in recipes.values()} <= {"draws", "draws, then density", "density and draws"}
    assert set(pipeline.recipes("breast_cancer")) == set(flows.breast_cancer_candidates())
    assert tuple(pipeline.recipes(mf.ZOO)) == mf.trained_recipes()
    assert tuple(pipeline.recipes("posterior/breast_cancer")) == pf.FLOWS
    assert set(pf.GUIDED_FLOWS.values()) == set(pf.GUIDANCE_WEIGHTS)
    assert set(pf.candidates()) == set(pf.FLOWS) | set(pf.GUIDED_FLOWS), "the verdict chooses among these flows"
    with pytest.raises(ValueError, match="unknown target"):
        pipeline.recipes("wine")
    with pytest.raises(ValueError, match="unknown recipe 'nope' for 'breast_cancer'"):
        pipeline.train("breast_cancer", "nope")


def test_sample_rejects_options_its_target_does_not_have_before_any_work():
    bc, post = "breast_cancer", "posterior/breast_cancer"
    name = flows.neuron_config().name
    bad = [((bc, name, 0), "n must be positive"), ((bc, name), "needs the number of networks"),
           ((bc, name, 4), "only MNIST flows sample other widths", {"widths": (30, 8, 2)}),
           ((bc, name, 4), "cached by sample_seed", {"generator": torch.Generator()}),
           ((bc, name, 4), "guided by their own data", {"guided": "mnist", "weight": 1.0}),
           ((bc, name, 4), "needs its weight", {"guided": bc}),
           ((mf.ZOO, mf.TRANSFER, 4), "budget's solver", {"steps": 3}),
           ((post, pf.FLOWS[0], 4), "not guided here", {"guided": bc})]
    for args, message, *kw in bad:
        with pytest.raises(ValueError, match=message):
            pipeline.sample(*args, **(kw[0] if kw else {}))


def test_the_command_line_precomputes_every_flow_of_the_pipeline():
    registry = cli.artifacts()
    for target in pipeline.TARGETS:
        for name in pipeline.recipes(target):
            assert cli.flow_artifact(target, name) in registry, (target, name)


def test_the_results_chapters_train_and_sample_flows_only_through_the_pipeline():
    """A chapter that called a data set's own trainer or sampler would be a second path past the cache
    entries the command line precomputes; the pipeline is the one the chapters use."""
    private = re.compile(r"\b(?:flows|mf|pf)\.(?:train_flow|sample_flow|train_posterior_flow|posterior_flow\w*)\(")
    for chapter in RESULTS_CHAPTERS:
        text = (ROOT / "chapters" / f"{chapter}.md").read_text()
        assert not private.findall(text), (chapter, private.findall(text))
    uses = [c for c in RESULTS_CHAPTERS[:3] if "pipeline.train(" in (ROOT / "chapters" / f"{c}.md").read_text()]
    assert uses == list(RESULTS_CHAPTERS[:3])


def test_one_score_for_every_zoo_table_and_the_chapters_use_it():
    split = flows.zoo_split("breast_cancer")
    refs = pipeline.references("breast_cancer", 12)
    theta = split.validation.theta[:12]
    row = pipeline.score("breast_cancer", theta, refs)
    assert row == flows.score(theta, refs)
    assert {"accuracy", "bma_accuracy", "bma_nll", "diversity", "mmd_ratio", "nn_ratio", "w2"} <= set(row)
    # another data set's test split: the function columns only, computed on that data
    other = split.data
    on_data = pipeline.score("breast_cancer", theta, data=other)
    assert set(on_data) < set(row) and on_data["accuracy"] == pytest.approx(row["accuracy"])
    with pytest.raises(ValueError, match="not both"):
        pipeline.score("breast_cancer", theta, refs, data=other)
    with pytest.raises(ValueError, match="validation HMC run"):
        pipeline.score("posterior/breast_cancer", theta, refs)
    with pytest.raises(ValueError, match="needs the networks per set"):
        pipeline.references("breast_cancer")
    # the chapters score zoo networks through the pipeline only
    own = re.compile(r"\b(?:flows|mf)\.(?:score|probability_scores|nearest_neighbour_ratio)\(")
    for chapter in RESULTS_CHAPTERS:
        text = (ROOT / "chapters" / f"{chapter}.md").read_text()
        assert not own.findall(text), (chapter, own.findall(text))


def test_posterior_samples_are_scored_against_the_validation_run():
    from wsbook.experiments import targets

    post = "posterior/breast_cancer"
    val = targets.hmc_reference("breast_cancer", pf.HMC_RUNS["validation"])
    train = targets.hmc_reference("breast_cancer", pf.HMC_RUNS["training"])
    itself = pipeline.score(post, val.theta[:16])
    other = pipeline.score(post, train.theta[:16])
    assert {"accuracy", "bma_nll", "tv", "mmd2"} <= set(itself)
    assert itself["tv"] < other["tv"] + 0.05 and itself["mmd2"] <= other["mmd2"] + 1e-3
    prior = pipeline.score(post, pf.prior_draws("breast_cancer", 16, torch.Generator().manual_seed(0)))
    assert prior["mmd2"] > other["mmd2"] and prior["tv"] > other["tv"]


def test_a_guided_posterior_candidate_samples_through_the_pipeline_as_the_verdict_draws_it(monkeypatch):
    """pipeline.sample of a name of posterior_flows.GUIDED_FLOWS draws the flow trained on draws and density
    with that guidance weight: the networks of the verdict's Candidate, from the same generator."""
    from wsbook.experiments import tasks
    from wsbook.weightflow import WeightFlow, make_chart

    spec = tasks.get_task("breast_cancer").spec
    flow = WeightFlow(make_chart("euclidean", spec), pf.posterior_field(spec))
    trained = []
    monkeypatch.setattr(pf, "train_posterior_flow",
                        lambda task, name, seed=0: trained.append(name) or (flow, 0.0, torch.zeros(1)))
    name, lam = next(iter(pf.GUIDED_FLOWS.items()))
    theta, seconds = pipeline.sample("posterior/breast_cancer", name, 3, generator=torch.Generator().manual_seed(4))
    ref = pf.candidates()[name](0).draw(3, torch.Generator().manual_seed(4))
    plain, _ = pipeline.sample("posterior/breast_cancer", pf.DENSITY_FLOWS[0], 3,
                               generator=torch.Generator().manual_seed(4))
    assert set(trained) == {pf.DENSITY_FLOWS[0]} and seconds > 0
    assert torch.allclose(theta, ref) and not torch.allclose(theta, plain)      # the guidance moved them
    assert pf.candidates()[name](0).guide.weight == lam
