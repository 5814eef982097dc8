"""The results protocol (wsbook.experiments.protocol): the test split is sealed outside the final report,
selection reads validation only, the perfect-generator floor scores iid draws at about 1, and verdicts
need two standard errors."""
import math

import pytest
import torch

from wsbook.experiments import protocol


def test_sealed_value_opens_only_inside_the_final_report():
    s = protocol.Sealed([1, 2, 3], "toy: 1 test run")
    with pytest.raises(protocol.SealedSplitError, match="test split"):
        s.open()
    assert protocol.final_report(sum, s) == 6
    assert protocol.final_report(lambda a, b, k: (a, b, k), s, protocol.Sealed("x", "y"), k=1) == ([1, 2, 3], "x", 1)
    with pytest.raises(protocol.SealedSplitError):
        s.open()                                   # sealed again afterwards
    with pytest.raises(ZeroDivisionError):         # and after a report that raised
        protocol.final_report(lambda v: 1 / 0, s)
    with pytest.raises(protocol.SealedSplitError):
        s.open()
    assert "toy" in repr(s) and "1, 2" not in repr(s)


def test_selection_cannot_read_the_test_split():
    """Selection given a split whose test part it reads fails: the seal is structural, not a convention."""
    test = protocol.Sealed({"a": {"mmd": 0.0}}, "toy test")

    def selection_that_peeks(validation):
        return protocol.select_best({**validation, **test.open()}, "mmd")

    validation = {"a": {"mmd": 2.0, "nn": 1.1}, "b": {"mmd": 1.0, "nn": 0.9}, "c": {"mmd": 1.5, "nn": 1.0}}
    with pytest.raises(protocol.SealedSplitError):
        selection_that_peeks(validation)
    assert protocol.select_best(validation, "mmd") == "b"
    assert protocol.select_best(validation, "mmd", admissible=lambda s: s["nn"] >= 1) == "c"
    assert protocol.select_best(validation, "mmd", admissible=lambda s: s["nn"] >= 9) == "b"
    with pytest.raises(ValueError, match="no candidates"):
        protocol.select_best({}, "mmd")


def test_mean_se_and_verdicts():
    m, se = protocol.mean_se([1.0, 2.0, 3.0])
    assert m == 2.0 and se == pytest.approx(1 / math.sqrt(3))
    with pytest.raises(ValueError, match="at least 2"):
        protocol.mean_se([1.0])
    assert protocol.verdict(1.0, 0.1, 2.0) == "met"            # 1.0 beats 2.0 by 10 se
    assert protocol.verdict(1.85, 0.1, 2.0) == "level"
    assert protocol.verdict(2.3, 0.1, 2.0) == "missed"
    assert protocol.verdict(0.97, 0.01, 0.95, "higher") == "met"
    assert protocol.verdict(0.90, 0.01, 0.95, "higher") == "missed"
    with pytest.raises(ValueError, match="better"):
        protocol.verdict(1.0, 0.1, 2.0, "smaller")
    assert protocol.bound_verdict(1.02, 0.01, 1.0, 0.95) == "met"
    assert protocol.bound_verdict(0.99, 0.01, 1.0, 0.95) == "level"    # below 1 but within noise of it
    assert protocol.bound_verdict(1.01, 0.05, 1.0, 0.95) == "level"    # interval reaches below 0.95
    assert protocol.bound_verdict(0.90, 0.01, 1.0, 0.95) == "missed"
    # two uncertain means: the standard errors add in quadrature (0.3 apart, se of the difference 0.1414)
    assert protocol.versus(1.0, 0.1, 1.3, 0.1) == "met"
    assert protocol.versus(1.0, 0.1, 1.25, 0.1) == "level"        # 1.77 se of the difference, not 2.5 of one
    assert protocol.versus(1.3, 0.1, 1.0, 0.1) == "missed"
    assert protocol.versus(0.9, 0.01, 0.8, 0.02, "higher") == "met"


def test_perfect_generator_floor_reads_one_for_iid_draws_and_carries_its_spread():
    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(12, 1, 2, generator=gen)                        # 12 "runs" of a function space
    runs = torch.arange(12).repeat_interleave(20)
    probs = (centres[runs] + 0.3 * torch.randn(240, 5, 2, generator=gen)).softmax(-1)
    source, ref = runs < 6, runs >= 6
    floor = protocol.perfect_generator_floor(probs[source], runs[source], probs[ref], 32, 0.5, draws=8)
    assert floor.runs == 6 and floor.n == 32 and floor.draws == 8 and floor.mean > 0 and floor.se > 0
    from wsbook.bayes import distances
    again = [float(distances.mmd2(probs[source][protocol.iid_rows(120, 32, gen)], probs[ref], bandwidth=0.5))
             for _ in range(6)]
    r, r_se = floor.ratio(again)
    assert abs(r - 1) < 3 * r_se + 0.25
    # the ratio's error includes the floor's own
    assert r_se > protocol.mean_se(again)[1] / floor.mean
    with pytest.raises(ValueError, match="draws"):
        protocol.perfect_generator_floor(probs[source], runs[source], probs[ref], 32, 0.5, draws=1)


def test_floor_for_networks_that_are_each_a_run_of_their_own():
    # iid members, one per "run": the unbiased floor is zero in expectation, the biased one is its bias
    gen = torch.Generator().manual_seed(1)
    probs = (torch.randn(96, 5, 2, generator=gen)).softmax(-1)
    source, ref = probs[:64], probs[64:]
    with pytest.raises(ValueError, match="unbiased=False"):
        for seed in range(20):      # some seed's unbiased mean falls below zero
            protocol.perfect_generator_floor(source, torch.arange(64), ref, 16, 0.5, draws=4, seed=seed)
    floor = protocol.perfect_generator_floor(source, torch.arange(64), ref, 16, 0.5, unbiased=False)
    assert floor.mean > 0 and floor.runs == 64
    from wsbook.bayes import distances
    again = [float(distances.mmd2(source[protocol.iid_rows(64, 16, gen)], ref, 0.5, unbiased=False))
             for _ in range(8)]
    r, r_se = floor.ratio(again)
    assert abs(r - 1) < 3 * r_se + 0.1


def test_run_bootstrap_resamples_whole_runs():
    d = torch.arange(10.0)
    assert protocol.run_bootstrap_medians(d, torch.zeros(10), n_boot=20).std() == 0     # one run: no spread
    assert protocol.run_bootstrap_medians(d, torch.arange(10), n_boot=20).std() > 0
    # two runs of identical members: resampling runs moves the median, resampling within them would not
    two = protocol.run_bootstrap_medians(torch.tensor([0.0] * 5 + [1.0] * 5), torch.arange(10) // 5, n_boot=50)
    assert set(two.tolist()) <= {0.0, 1.0} and len(set(two.tolist())) == 2
    with pytest.raises(ValueError, match="replicates"):
        protocol.run_bootstrap_medians(d, torch.arange(10), n_boot=1)


def test_ratio_carries_the_denominators_error():
    # an exact denominator: the values' own standard error, scaled
    r, se = protocol.ratio([1.0, 1.2, 1.4], 2.0, 0.0)
    assert r == pytest.approx(0.6) and se == pytest.approx(protocol.mean_se([1.0, 1.2, 1.4])[1] / 2)
    # an uncertain one: relative errors add in quadrature (delta method)
    r, se = protocol.ratio([2.0, 2.0], 2.0, 0.1)
    assert r == pytest.approx(1.0) and se == pytest.approx(0.05)
    with pytest.raises(ValueError, match="positive denominator"):
        protocol.ratio([1.0, 2.0], 0.0, 0.1)
    with pytest.raises(ValueError, match="non-negative"):
        protocol.ratio([1.0, 2.0], 1.0, -0.1)


def test_split_runs_needs_room_for_three_parts():
    from types import SimpleNamespace
    with pytest.raises(ValueError, match="n_holdout"):
        protocol.split_runs(SimpleNamespace(runs=torch.arange(6), name="toy"), 2)


def test_within_reads_a_gap_against_a_tolerance_with_both_errors():
    # gap 0.01 with se hypot(0.003, 0.004) = 0.005: 0.02 below the tolerance 0.03 is 4 se
    assert protocol.within(0.90, 0.003, 0.91, 0.004, 0.03) == "met"
    assert protocol.within(0.80, 0.003, 0.91, 0.004, 0.03) == "missed"
    assert protocol.within(0.875, 0.003, 0.91, 0.004, 0.03) == "level"
    assert protocol.within(0.90, 0.0, 0.91, 0.0, 0.03) == protocol.verdict(0.01, 0.0, 0.03)
