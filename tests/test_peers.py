"""Agreement with the libraries a researcher would use instead (issue 12), at small sizes.

Each test runs the agreement check of one ``benchmarks/bench_peer_*.py`` (the same code the benchmark
asserts before it times anything): wsbook and the peer compute the same answer on the same problem. The
peers are the optional ``[bench]`` extra (``make bench`` installs it); a test whose peer is not installed
is skipped. torch-geometric and SciPy are core dependencies, so the PNA and alignment checks always run.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

pytestmark = pytest.mark.peers


def test_manifolds_agree_with_geoopt():
    pytest.importorskip("geoopt")
    import bench_peer_manifolds as bench

    out = bench.check(blocks=((40, 2), (30, 3), (20, 5), (10, 16)), batch=3)
    assert max(out["errors"].values()) < bench.TOL


def test_pna_layer_equals_pyg_pnaconv():
    pytest.importorskip("torch_geometric")
    import bench_peer_pna as bench

    errors = bench.check(n_networks=3, dim=8)
    assert "grad pre.weight" in errors and max(errors.values()) < 1e-8


def test_weight_matching_equals_rebasin_reference():
    import bench_peer_alignment as bench

    out = bench.check(widths=(6, 16, 12, 16, 3), zoo_size=24)
    assert out["ours"].perms[0].shape == (24, 16)


def test_weight_matching_threads_do_not_change_the_answer():
    """The cost blocks are pipelined over a thread pool when torch has several threads: same answer."""
    import bench_peer_alignment as bench
    from wsbook.symmetry import weight_matching

    spec, ref, zoo = bench.problem((6, 16, 16, 3), 40)
    single = weight_matching(spec, ref, zoo)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        several = weight_matching(spec, ref, zoo)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(single.perms, several.perms))


def test_ot_coupling_agrees_with_torchcfm():
    pytest.importorskip("torchcfm")
    import bench_peer_cfm as bench

    assert bench.check(n_batches=2, batch=64)["relative_cost_difference"] < 1e-9


def test_sgld_sghmc_stationary_moments_agree_with_posteriors():
    pytest.importorskip("posteriors")
    import bench_peer_sgmcmc as bench

    out = bench.check(chains=64, steps=400, burnin=100)
    # at the same step and friction, our SGHMC discretisation is closer to the posterior than posteriors'
    post = out["posterior_var"]
    assert ((out["exact"]["sghmc_ours"] - post).abs() < (out["exact"]["sghmc_posteriors"] - post).abs()).all()


def test_hmc_agrees_with_pyro():
    pytest.importorskip("pyro")
    import bench_peer_hmc as bench

    out = bench.check(chains=6, n_iter=20, burnin=5)
    assert out["potential_error"] < 1e-10


def test_laplace_agrees_with_laplace_torch():
    pytest.importorskip("laplace")
    import bench_peer_laplace as bench

    out = bench.check(steps=100)
    assert set(out) == {"full", "diag"}
    assert all(r["log_marglik_error"] < bench.TOL for r in out.values())


# ------------------------------------------------------------------ the results file of `make bench`
def test_results_file_round_trip(tmp_path):
    """benchmarks/run_all.py's lines and header come back from wsbook.experiments.performance.read_results."""
    import run_all as runner
    from wsbook.experiments import performance

    rows = runner.parse("bench_peer_x", "noise\nname, ours, peer, ratio\nop (batch 4), 0.5, 2.0, 4.0\n"
                                        "agreement, 1e-9, 1e-9, -\n")
    assert [r["name"] for r in rows] == ["op (batch 4)", "agreement"] and rows[0]["against"] == "peer"
    assert runner.parse("bench_x", "a, 1.0, 2.0, 2.0\n")[0]["against"] == "baseline"
    path = tmp_path / "results.csv"
    path.write_text("# date: 2030-01-01\n# platform: test\n# cpu_count: 2\n"
                    "script,name,ours,baseline,ratio,against\n"
                    "bench_peer_x,op (batch 4),0.5,2.0,4.0,peer\nbench_peer_x,agreement,1e-9,1e-9,-,peer\n")
    table, machine = performance.read_results(path)
    assert machine["cpu_count"] == "2" and table["ours"].tolist() == ["0.5", "1e-9"]
    assert table["ratio"].tolist() == ["4.0", "-"]
    path.write_text("# date: 2030-01-01\n# platform: test\n# cpu_count: 2\n"
                    "script,name,ours,baseline,ratio,against\nbench_x,op,fast,2.0,-,baseline\n")
    with pytest.raises(ValueError, match="numbers"):
        performance.read_results(path)
    path.write_text("script,name,ours,baseline,ratio,against\n")
    with pytest.raises(ValueError, match="date"):
        performance.read_results(path)
    with pytest.raises(FileNotFoundError, match="make bench"):
        performance.read_results(tmp_path / "missing.csv")


def test_runner_turns_progress_bars_off(tmp_path, monkeypatch):
    """`make bench` prints only the benchmarks' lines: run_all runs every script with WSBOOK_PROGRESS=0."""
    import run_all as runner

    monkeypatch.setenv("WSBOOK_PROGRESS", "1")
    script = tmp_path / "bench_env.py"
    script.write_text("import os\nprint('progress, ' + os.environ['WSBOOK_PROGRESS'])\n")
    assert runner.run_script(script) == (0, "progress, 0\n")
