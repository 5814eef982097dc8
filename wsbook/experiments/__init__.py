"""The book's concrete runs: everything that names a data set, a chapter's architecture, a per-scale
setting, a published number or a cached run. Only chapters, benchmarks and the command line import it;
the math packages never do.

* :mod:`~wsbook.experiments.pipeline`: every flow the results chapters train, by target and recipe name:
  ``pipeline.train(target, recipe, seed)`` and ``pipeline.sample(...)``, the one path the chapters and the
  command line use. The analyses over trained flows live in :mod:`~wsbook.experiments.flows` (zoo flows,
  scoring, the breast-cancer verdict), :mod:`~wsbook.experiments.mnist_flows` and
  :mod:`~wsbook.experiments.posterior_flows`; :mod:`~wsbook.experiments.protocol` holds the
  validation/test protocol (sealed test runs, mean and standard error over seeds, verdicts).
* :mod:`~wsbook.experiments.tasks`: posterior tasks (data + architecture + prior) and cached posterior runs.
* :mod:`~wsbook.experiments.zoos`: trained populations (cached).
* :mod:`~wsbook.experiments.alignment`: alignment and canonicalization experiments (chapters 5 and 6).
* :mod:`~wsbook.experiments.graphs`: the generalization-prediction benchmark (chapter 6).
* :mod:`~wsbook.experiments.foundations`: the zoos and models chapters 5 and 6 train, at their settings per
  scale (what ``python -m wsbook chapter/05 chapter/06`` precomputes).
* :mod:`~wsbook.experiments.published`: the one table of published numbers.

Submodules are imported on use (``from wsbook.experiments import tasks``), so a chapter pays only for
what it reads.
"""
from __future__ import annotations

import torch

from wsbook import config


def setup_chapter(seed: int = 0) -> torch.Generator:
    """The first cell of every chapter: the book's plotly template and renderer
    (:func:`wsbook.figures.setup`), the allocator tuning (:func:`wsbook.config.tune_allocator`), torch's
    deterministic kernels on the CPU (:func:`wsbook.config.deterministic_kernels`) and the seeds
    (:func:`wsbook.config.seed_everything`). Returns the seeded generator.

    These are the only global changes the book makes, and it makes them here, explicitly: importing
    :mod:`wsbook` changes nothing.
    """
    from wsbook import figures

    figures.setup()
    config.tune_allocator()
    config.deterministic_kernels()
    return config.seed_everything(seed)


#: The module-path names artifacts were stored under before they had explicit names.
LEGACY_CACHE_NAMES = {
    "wsbook.bayes.tasks.posterior_run": "posterior/run",
    "wsbook.symmetry.experiments.train_zoo": "zoo/trained",
    "wsbook.symmetry.experiments.fit_variational_zoo": "zoo/variational",
    "wsbook.symmetry.experiments.fit_inr_pairs": "zoo/inr_pairs",
    "wsbook.graphs.train.digits_zoo": "zoo/digits",
    "wsbook.graphs.inr.digit_inr_zoo": "zoo/digit_inrs",
}


def migrate_cache() -> dict[str, int]:
    """Carry artifacts cached under the old module-path names (:data:`LEGACY_CACHE_NAMES`) over to their
    explicit names, so nothing computed before the move is recomputed. Returns entries moved per name."""
    from wsbook import cache

    return {new: cache.rename_entries(old, new) for old, new in LEGACY_CACHE_NAMES.items()}


__all__ = ["setup_chapter", "migrate_cache", "LEGACY_CACHE_NAMES"]
