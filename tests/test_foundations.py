"""Chapters 5 and 6's runs (wsbook.experiments.foundations): the splits the chapters rely on, clear errors,
and the registry the command line precomputes (the strict chapters gate checks the cache keys themselves)."""
import functools

import pytest
import torch

from wsbook.experiments import foundations, zoos
from wsbook.nets import MLPSpec


def test_aligner_data_splits_three_quarters_for_training_and_pools_the_digits(monkeypatch):
    spec = MLPSpec((16, 16, 16, 10))
    theta = spec.init(10, generator=torch.Generator().manual_seed(0))
    calls = []

    def fake_digits_zoo(**kwargs):
        calls.append(kwargs)
        return {"theta": theta, "test_accuracy": torch.linspace(0.5, 0.9, 10), "widths": list(spec.widths)}

    monkeypatch.setattr(zoos, "digits_zoo", fake_digits_zoo)
    d = foundations.aligner_data()
    assert calls == [dict(hidden_widths=(16,), lrs=(3e-3,), n_seeds=48, steps=300, n_checkpoints=1, pool=2)]
    assert d.spec == spec and torch.equal(d.fit, theta[:7]) and torch.equal(d.held_out, theta[7:])
    assert d.x_fit.shape[1] == d.x_eval.shape[1] == 16 and len(d.x_fit) == len(d.y_fit)
    assert torch.equal(d.test_accuracy, torch.linspace(0.5, 0.9, 10))
    a, b = foundations.aligner_test_pairs(d.held_out)                     # 3 held out: one pair, one left over
    assert torch.equal(a, theta[7:8]) and torch.equal(b, theta[8:9])


def test_cnn_autoencoder_names_the_ones_it_has():
    with pytest.raises(ValueError, match="relu.*scale_canonical"):
        foundations.cnn_autoencoder("relu", "sign_canonical")


def test_runs_register_every_training_of_both_chapters_once():
    runs = foundations.RUNS
    assert set(runs) == {"05", "06"}
    names = [n for chapter in runs.values() for n in chapter]
    assert len(names) == len(set(names)) and all(callable(r) for c in runs.values() for r in c.values())
    autoencoders = [r for n, r in runs["06"].items() if n.startswith("cnn_autoencoder_")]
    assert {r.args for r in autoencoders} == set(foundations.CNN_AUTOENCODERS)
    sirens = [r for n, r in runs["06"].items() if n.startswith("siren_autoencoder_")]
    assert all(isinstance(r, functools.partial) for r in sirens)
    assert {r.args[0] for r in sirens} == set(foundations.SIREN_AUTOENCODER_SEEDS)


def test_moons_zoo_at_ci_is_what_chapter_5_canonicalizes():
    spec, theta = foundations.moons_zoo()
    assert spec.widths == (2, 16, 16, 2) and theta.shape == (8, spec.n_params) and torch.isfinite(theta).all()
