"""The results protocol: what may be chosen on which data, and how a verdict is read.

* A zoo's runs are split by whole runs (:func:`split_runs`) into **training** runs (what a flow learns
  from), **validation** runs (every choice: settings, the best row of a table, steps) and **test** runs
  (every verdict). The test runs are :class:`Sealed`: reading them raises :class:`SealedSplitError`
  anywhere but inside :func:`final_report`, so selection code cannot read them by accident.
* :func:`perfect_generator_floor`: the MMD\\ :sup:`2` that a perfect generator scores. It draws networks
  iid across runs that are not the reference runs, as many as a flow's sample, and scores them with the
  same estimator and bandwidth as every flow. A flow's MMD\\ :sup:`2` over this floor reads 1 for a
  generator as good as new runs of the optimiser.
* :func:`mean_se` and :func:`verdict`: a headline cell is the mean over independent seeds with its
  standard error; a goal is *met* when the mean beats it by more than two standard errors, *level* when
  within two, *missed* otherwise.
"""
from __future__ import annotations

import contextvars
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Generic, Iterator, Sequence, TypeVar

import torch
from torch import Tensor

from wsbook.bayes import distances

T = TypeVar("T")
#: the training seeds of every flow in a verdict table: not seed 0, whose sample the choice read (a draw
#: chosen for scoring well on validation data would carry its luck into the verdict)
SEEDS = (1, 2, 3)
_TEST_OPEN = contextvars.ContextVar("wsbook_test_split_open", default=False)
#: the verdict words, in the order of the table columns' legend
VERDICTS = ("met", "level", "missed")
#: the goals of the zoo pages' verdict tables: MMD^2 at most this many perfect-generator floors ...
MMD_GOAL = 2.0
#: ... and a nearest-neighbour ratio of at least the first value with its mean - 2 se at least the second
NN_GOAL = (1.0, 0.95)


class SealedSplitError(RuntimeError):
    """Raised when the test split is read outside :func:`final_report`."""


class Sealed(Generic[T]):
    """A value that only :func:`final_report` may read (:meth:`open`)."""

    __slots__ = ("_value", "what")

    def __init__(self, value: T, what: str):
        self._value = value
        self.what = what

    def open(self) -> T:
        """The value, inside :func:`final_report`; :class:`SealedSplitError` anywhere else."""
        if not _TEST_OPEN.get():
            raise SealedSplitError(f"{self.what} is the test split: every choice is made on validation runs, "
                                   "and the test runs are read only by protocol.final_report")
        return self._value

    def __repr__(self) -> str:
        return f"Sealed({self.what})"


@contextmanager
def _opened() -> Iterator[None]:
    token = _TEST_OPEN.set(True)
    try:
        yield
    finally:
        _TEST_OPEN.reset(token)


def final_report(report: Callable[..., T], *sealed: Sealed, **kwargs) -> T:
    """The one way to the test split: ``report(*values, **kwargs)`` with every ``sealed`` value opened.

    Call it once per table, after every choice has been made on validation runs; what it returns is the
    verdict. Inside ``report`` the seal is open, so ``report`` must not choose anything.
    """
    with _opened():
        return report(*(s.open() for s in sealed), **kwargs)


# ------------------------------------------------------------------------------------------------- splits
@dataclass(frozen=True)
class RunSplit:
    """A checkpoint zoo split by whole runs (the checkpoints of one run are near-copies, so a split by rows
    would leak).

    Attributes:
        zoo: the whole zoo.
        train: the runs a flow learns from.
        validation: held-out runs for every choice; scored against in :func:`references` by default.
        other: as many training runs as ``validation``: the perfect generator of the validation floor.
        test: held-out runs for every verdict, :class:`Sealed`.
        reference: the network ``[1, D]`` aligned charts match every network to (the last checkpoint of the
            first training run).
    """

    zoo: object
    train: object
    validation: object
    other: object
    test: Sealed
    reference: Tensor

    @property
    def spec(self):
        return self.zoo.spec

    @property
    def data(self):
        return self.zoo.data

    def run_counts(self) -> dict[str, int]:
        """How many runs each part holds (the test part counted without reading its networks)."""
        counts = {k: len(getattr(self, k).runs) for k in ("train", "validation", "other")}
        counts["test"] = len(self.zoo.runs) - counts["train"] - counts["validation"]
        return counts


def split_runs(zoo, n_holdout: int, seed: int = 0) -> RunSplit:
    """Split ``zoo`` (a :class:`~wsbook.experiments.targets.Zoo`) into ``n_holdout`` test runs,
    ``n_holdout`` validation runs and the rest for training, by a generator seeded with ``seed``."""
    from wsbook.experiments.targets import split_runs as take

    n_runs = len(zoo.runs)
    if not 1 <= n_holdout <= (n_runs - 1) // 3:
        raise ValueError(f"split_runs: n_holdout must be in [1, {(n_runs - 1) // 3}] for a zoo of {n_runs} runs "
                         "(test, validation and as many training runs for the validation floor, and one more); "
                         f"got {n_holdout}")
    gen = torch.Generator().manual_seed(seed)
    # validation first: these are the runs the book's earlier two-way split held out and tuned against, so
    # the test runs are drawn from runs no choice has read
    rest, validation = take(zoo, n_holdout, generator=gen)
    train, test = take(rest, n_holdout, generator=gen)
    _, other = take(train, n_holdout, generator=gen)
    first = train.select(train.run == int(train.runs[0]))
    reference = first.theta[first.step.argmax()][None].clone()
    return RunSplit(zoo, train, validation, other, Sealed(test, f"{zoo.name}: {n_holdout} test runs"), reference)


# -------------------------------------------------------------------------------------------------- floor
@dataclass(frozen=True)
class Floor:
    """The perfect generator's MMD\\ :sup:`2`: ``mean`` and standard error ``se`` over ``draws`` sets of ``n``
    networks drawn iid across ``runs`` runs."""

    mean: float
    se: float
    draws: int
    n: int
    runs: int

    def ratio(self, mmd2: Tensor | Sequence[float]) -> tuple[float, float]:
        """``(mean, se)`` of MMD\\ :sup:`2` over this floor for one value per seed, the floor's own
        uncertainty carried into the standard error (:func:`ratio`)."""
        return ratio(mmd2, self.mean, self.se)


def iid_rows(n_rows: int, n: int, generator: torch.Generator) -> Tensor:
    """``min(n, n_rows)`` distinct row indices drawn at random."""
    return torch.randperm(n_rows, generator=generator)[:min(n, n_rows)]


def perfect_generator_floor(source_probs: Tensor, source_runs: Tensor, reference_probs: Tensor, n: int,
                            bandwidth: float, draws: int = 32, seed: int = 0, unbiased: bool = True) -> Floor:
    """The MMD\\ :sup:`2` a perfect generator scores against ``reference_probs``.

    With the unbiased estimator the floor is positive only because a reference run contributes several
    alike networks (checkpoints of one run), which a generated set cannot match; when every network is a run
    of its own the unbiased floor is zero in expectation, and the biased one (``unbiased=False``: the floor
    is then the estimator's own bias at ``n`` networks) is the one to read sets against.

    Args:
        source_probs: test probabilities ``[m, N, C]`` of networks of runs that are not reference runs.
        source_runs: the run of every source network ``[m]`` (for :attr:`Floor.runs`).
        reference_probs: the reference runs' probabilities ``[k, N, C]``.
        n: networks per draw: the size of the flows' samples.
        bandwidth: the kernel bandwidth every set is scored with.
        draws: independent draws averaged.
        seed: seeds the draws.
        unbiased: the estimator of :func:`wsbook.bayes.distances.mmd2` (score every set with the same one).
    """
    if draws < 2 or n < 2:
        raise ValueError(f"perfect_generator_floor: needs at least 2 draws of 2 networks; got {draws}, {n}")
    gen = torch.Generator().manual_seed(seed)
    values = [float(distances.mmd2(source_probs[iid_rows(len(source_probs), n, gen).to(source_probs.device)],
                                   reference_probs, bandwidth=bandwidth, unbiased=unbiased))
              for _ in range(draws)]
    m, se = mean_se(values)
    if m <= 0:
        raise ValueError("perfect_generator_floor: the floor is not positive; the source runs are "
                         "indistinguishable from the reference runs at this size, so no ratio can be read"
                         + (" (when every network is a run of its own, pass unbiased=False)" if unbiased else ""))
    return Floor(m, se, draws, min(n, len(source_probs)), int(torch.unique(source_runs).numel()))


# ------------------------------------------------------------------------------------------ uncertainty
def mean_se(values: Tensor | Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (sample standard deviation over ``sqrt(k)``) of ``k >= 2`` values."""
    v = torch.as_tensor(values, dtype=torch.float64).flatten()
    if v.numel() < 2:
        raise ValueError(f"mean_se: a standard error needs at least 2 values; got {v.numel()}")
    return float(v.mean()), float(v.std() / math.sqrt(v.numel()))


def ratio(values: Tensor | Sequence[float], denominator: float, denominator_se: float) -> tuple[float, float]:
    """``(mean, se)`` of ``values / denominator`` for one value per seed, where the denominator is itself an
    estimate with standard error ``denominator_se``: its uncertainty is carried into the ratio's (delta
    method), so that a row whose numerator matches the denominator's population reads 1 within its error."""
    if not denominator > 0 or not denominator_se >= 0:
        raise ValueError(f"ratio: needs a positive denominator and a non-negative standard error; got "
                         f"{denominator}, {denominator_se}")
    m, se = mean_se(values)
    r = m / denominator
    return r, math.sqrt((se / denominator) ** 2 + (r * denominator_se / denominator) ** 2)


def run_bootstrap_medians(values: Tensor, runs: Tensor, *, size: int | None = None, n_boot: int = 500,
                          seed: int = 0) -> Tensor:
    """Medians of ``values [m]`` (one per network) over ``n_boot`` bootstrap replicates that resample the runs
    (``runs [m]``, each network's run) whole; with ``size``, each replicate's median is over ``size`` of its
    networks drawn without replacement. Returns ``[n_boot]``; their standard deviation is the standard error
    of a median over these runs. With a handful of runs the bootstrap is coarse and reads the spread low."""
    if n_boot < 2:
        raise ValueError(f"run_bootstrap_medians: needs at least 2 replicates; got {n_boot}")
    gen = torch.Generator().manual_seed(seed)
    members = [torch.nonzero(runs == r).flatten() for r in runs.unique()]
    out = torch.empty(n_boot)
    for b in range(n_boot):           # replicates, each a handful of tensor operations
        pick = torch.cat([members[i] for i in torch.randint(len(members), (len(members),), generator=gen)])
        if size is not None:
            pick = pick[torch.randperm(len(pick), generator=gen)[:size]]
        out[b] = values[pick].median()
    return out


def verdict(mean: float, se: float, goal: float, better: str = "lower") -> str:
    """``"met"`` when ``mean`` beats ``goal`` by more than two standard errors, ``"missed"`` when it is
    worse by more than two, ``"level"`` otherwise. ``better``: ``"lower"`` or ``"higher"``."""
    if better not in ("lower", "higher"):
        raise ValueError(f"verdict: better must be 'lower' or 'higher'; got {better!r}")
    if not se >= 0:
        raise ValueError(f"verdict: the standard error must be >= 0; got {se}")
    margin = (goal - mean) if better == "lower" else (mean - goal)
    if margin > 2 * se:
        return "met"
    return "missed" if margin < -2 * se else "level"


def versus(mean: float, se: float, other_mean: float, other_se: float, better: str = "lower") -> str:
    """:func:`verdict` of one mean against another, both uncertain: ``"met"`` when ``mean`` beats
    ``other_mean`` by more than two standard errors of the difference (independent seeds), ``"missed"``
    when it is worse by as much, ``"level"`` otherwise."""
    return verdict(mean - other_mean, math.hypot(se, other_se), 0.0, better)


def within(mean: float, se: float, other_mean: float, other_se: float, tolerance: float) -> str:
    """:func:`verdict` of ``mean`` falling short of ``other_mean`` by at most ``tolerance`` (an accuracy gap),
    both uncertain: ``"met"`` when the gap is below ``tolerance`` by more than two standard errors of the
    difference, ``"missed"`` when above it by as much, ``"level"`` otherwise."""
    return verdict(other_mean - mean, math.hypot(se, other_se), tolerance)


def versus_column(table, name: str, column: str, rows, other: str, better: str = "lower") -> None:
    """Add the column ``name`` to a DataFrame of means (``column``) and standard errors (``column + "_se"``):
    :func:`versus` of each of ``rows`` against the row ``other``; "—" in the other rows."""
    table[name] = "—"
    o = table.loc[other]
    for r in rows:
        table.loc[r, name] = versus(table.loc[r, column], table.loc[r, f"{column}_se"], o[column], o[f"{column}_se"],
                                    better)


def bound_verdict(mean: float, se: float, goal: float, floor: float) -> str:
    """A goal with a tolerance, as the memorisation ratio's "at least ``goal``, its 95 % interval not below
    ``floor``": ``"met"`` when ``mean >= goal`` and ``mean - 2 se >= floor``; ``"missed"`` when even
    ``mean + 2 se`` is below ``goal``; ``"level"`` otherwise."""
    if mean >= goal and mean - 2 * se >= floor:
        return "met"
    return "missed" if mean + 2 * se < goal else "level"


def select_best(scores: dict[str, dict], key: str, *, admissible: Callable[[dict], bool] | None = None) -> str:
    """The label whose ``scores[label][key]`` is lowest among the admissible ones (all, when none is).

    Selection reads validation scores only; pass nothing computed on test runs (they are sealed)."""
    if not scores:
        raise ValueError("select_best: no candidates")
    ok = [k for k, s in scores.items() if admissible is None or admissible(s)] or list(scores)
    return min(ok, key=lambda k: scores[k][key])


__all__ = ["SealedSplitError", "Sealed", "final_report", "RunSplit", "split_runs", "Floor", "iid_rows",
           "perfect_generator_floor", "mean_se", "ratio", "run_bootstrap_medians", "MMD_GOAL", "NN_GOAL", "verdict",
           "versus", "within", "versus_column", "bound_verdict", "select_best", "VERDICTS", "SEEDS"]
