"""``python -m wsbook``: clear one-line errors, and ``--list`` reflects the cache."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from wsbook import cache, cli
from wsbook.experiments import protocol

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def env(monkeypatch, tmp_path):
    """The CLI writes WSBOOK_SCALE / WSBOOK_CACHE_DIR into the environment: restore them afterwards."""
    monkeypatch.setenv("WSBOOK_SCALE", "ci")
    monkeypatch.setenv("WSBOOK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("WSBOOK_PROGRESS", "0")
    return tmp_path


def _one_line_error(capsys, argv, code=None):
    rc = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert rc != 0 and (code is None or rc == code)
    assert len(err.splitlines()) == 1 and err.startswith("python -m wsbook: error:"), err
    return err


def test_unknown_artifact_and_scale_are_one_line_errors(env, capsys):
    assert "unknown artifact 'zoo/nope'" in _one_line_error(capsys, ["zoo/nope"], 2)
    assert "unknown scale 'huge'" in _one_line_error(capsys, ["zoos", "--scale", "huge"], 2)
    assert "--frobnicate" in _one_line_error(capsys, ["--frobnicate"], 2)
    assert "name the artifacts" in _one_line_error(capsys, [], 2)


def test_unwritable_cache_directory_is_a_one_line_error(env, capsys):
    blocker = env / "a_file"
    blocker.write_text("not a directory")
    err = _one_line_error(capsys, ["zoo/breast_cancer", "--cache-dir", str(blocker / "cache")], 1)
    assert "not writable" in err and str(blocker) in err


def test_module_entry_point_exits_nonzero(env):
    proc = subprocess.run([sys.executable, "-m", "wsbook", "--scale", "huge", "zoos"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "python -m wsbook: error: unknown scale 'huge'; choose one of ci, default, full"]


def test_jobs_compute_artifacts_side_by_side_in_processes(env, capsys):
    """--jobs 2 hands the missing artifacts to two worker processes that fill one cache; run again, it finds
    nothing to compute; a job count below 1 is a one-line error; ``auto`` is one job per core on a CPU."""
    assert "--jobs: must be at least 1" in _one_line_error(capsys, ["zoo/breast_cancer", "--jobs", "0"], 2)
    assert "positive integer or 'auto'" in _one_line_error(capsys, ["zoo/breast_cancer", "--jobs", "many"], 2)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    auto = cli.parser().parse_args(["all", "--jobs", "auto"]).jobs
    assert auto == cli.auto_jobs() == min(cores, cli.AUTO_JOBS_MAX)
    command = ["zoo/breast_cancer", "posterior/breast_cancer/vi", "--scale", "ci", "--jobs", "2"]
    assert cli.main(command) == 0
    out = capsys.readouterr().out
    assert "2 of 2 artifact(s) to compute, 2 at a time" in out and "2 computed, 0 already cached" in out, out
    assert any((env / "cache").rglob("zoo-*.pt")) and any((env / "cache").rglob("run-*.pt"))
    assert cli.main(command) == 0
    out = capsys.readouterr().out
    assert "0 of 2 artifact(s) to compute" in out and "0 computed, 2 already cached" in out, out


def _row(out: str, name: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.split()[:1] == [name])
    return line.split()[1:4]


def test_list_reflects_the_cache_and_compute_writes_it(env, capsys, one_thread):
    assert cli.main(["--list"]) == 0
    assert _row(capsys.readouterr().out, "zoo/breast_cancer") == ["-", "-", "-"]
    assert cli.main(["zoo/breast_cancer", "--scale", "ci"]) == 0
    out = capsys.readouterr().out
    assert "zoo/breast_cancer" in out and "computed" in out and "targets/zoo-" in out
    assert len(list((env / "cache").rglob("*.pt"))) == 1
    assert cli.main(["--list"]) == 0
    listing = capsys.readouterr().out
    assert _row(listing, "zoo/breast_cancer") == ["yes", "-", "-"]     # cached at ci only
    assert _row(listing, "zoo/mnist5k") == ["-", "-", "-"]
    assert cli.main(["zoo/breast_cancer"]) == 0                         # again: read, not recomputed
    assert "0 computed, 1 already cached" in capsys.readouterr().out
    assert len(list((env / "cache").rglob("*.pt"))) == 1


def test_list_reads_each_scales_own_registry(env, capsys):
    """Chapter 8b trains more recipes at ``default`` than at ``ci``: ``--list`` at either scale lists them
    all, each scale's column read from that scale's registry (``n/a`` where a scale has no such artifact)."""
    for scale in ("ci", "default"):
        assert cli.main(["--list", "--scale", scale]) == 0
        listing = capsys.readouterr().out
        assert _row(listing, "flow/mnist/euclidean_aligned") == ["n/a", "-", "-"]
        assert _row(listing, "flow/mnist/geometric_aligned_ot") == ["-", "-", "-"]


def test_full_mnist_zoo_is_listed_and_needs_its_files(env, capsys, monkeypatch):
    """zoo/mnist is listed; without WSBOOK_MNIST_DIR (or with a directory lacking a file) naming it is a
    one-line error that says what is missing, and the groups leave it out (nothing is downloaded)."""
    monkeypatch.delenv("WSBOOK_MNIST_DIR", raising=False)
    assert cli.main(["--list"]) == 0
    assert _row(capsys.readouterr().out, "zoo/mnist") == ["-", "-", "-"]
    err = _one_line_error(capsys, ["zoo/mnist"], 2)
    assert "zoo/mnist" in err and "WSBOOK_MNIST_DIR" in err
    assert "WSBOOK_MNIST_DIR" in _one_line_error(capsys, ["*/mnist"], 2)          # a pattern matching it alone
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte.gz"):
        (env / name).write_bytes(b"")                   # all but the test images
    monkeypatch.setenv("WSBOOK_MNIST_DIR", str(env))
    assert "t10k-images-idx3-ubyte" in _one_line_error(capsys, ["zoo/mnist"], 2)
    registry, skipped = cli.artifacts(), {}
    assert cli.select(["zoos"], registry, skipped) == ["zoo/breast_cancer", "zoo/mnist5k", "zoo/mnist5k_w32",
                                                      "zoo/cnn_digits", "zoo/cnn_digits_w16"]
    assert list(skipped) == ["zoo/mnist"] and "t10k-images-idx3-ubyte" in skipped["zoo/mnist"]
    assert not list((env / "cache").rglob("*.pt"))


cheap_calls = []


@cache.cached("test/cli_cheap", version=1)
def _cheap(n: int):
    cheap_calls.append(n)
    return torch.arange(n)


def test_command_line_computes_under_strict_mode_and_puts_it_back(env, capsys, monkeypatch):
    """WSBOOK_CACHE_STRICT is for the chapters' test: the command line, whose job is computing, ignores it
    (and computes with the chapters' deterministic kernels), then leaves both as they were."""
    monkeypatch.setattr(cli, "artifacts", lambda: {"test/cheap": cli.Artifact("test/cheap", "a cheap artifact",
                                                                             lambda: _cheap(3))})
    monkeypatch.setenv("WSBOOK_CACHE_STRICT", "test/")
    cheap_calls.clear()
    with pytest.raises(cache.StrictMiss):
        _cheap(3)
    deterministic = torch.are_deterministic_algorithms_enabled()
    assert cli.main(["test/cheap"]) == 0
    assert "1 computed" in capsys.readouterr().out and cheap_calls == [3]
    assert os.environ["WSBOOK_CACHE_STRICT"] == "test/"
    assert torch.are_deterministic_algorithms_enabled() == deterministic
    assert torch.equal(_cheap(3), torch.arange(3)) and cheap_calls == [3], "strict mode reads what it computed"


def test_chapter_groups_name_the_results_chapters_flows(env):
    """Every artifact that precomputes a flow of chapters 8, 8b, 8c and 8d is in its chapter's group."""
    registry = cli.artifacts()
    chosen = {g: set(cli.select([g], registry))
              for g in ("chapter/08", "chapter/08b", "chapter/08c", "chapter/08d", "chapter/09")}
    assert {n for n in registry if n.startswith(("flow/", "verdict/")) and "mnist" not in n
            and "posterior" not in n and "cnn" not in n} <= chosen["chapter/08"]
    assert {n for n in registry if n.startswith(("flow/cnn/", "verdict/cnn"))} <= chosen["chapter/08d"]
    assert {"zoo/cnn_digits", "zoo/cnn_digits_w16", "flow/cnn/width_transfer"} <= chosen["chapter/08d"]
    assert {"verdict/mnist5k", "flow/mnist/guidance", "flow/mnist/width_transfer", "flow/mnist/second_task",
            "flow/mnist/field_size", "flow/mnist/plain_baseline"} <= chosen["chapter/08b"]
    assert {n for n in registry if n.startswith("flow/posterior/")} <= chosen["chapter/08c"]
    # every training seed of a verdict table is an artifact of its own, in the table's group, ahead of it
    names = list(registry)
    for zoo, group in (("breast_cancer", "chapter/08"), ("mnist5k", "chapter/08b"), ("cnn_digits", "chapter/08d"),
                       ("posterior", "chapter/08c")):
        seeds = [f"verdict/{zoo}/seed/{s}" for s in protocol.SEEDS]
        assert set(seeds) <= chosen[group]
        assert max(map(names.index, seeds)) < names.index(f"verdict/{zoo}")
    assert chosen["chapter/09"] <= set.union(*(chosen[g] for g in ("chapter/08", "chapter/08b", "chapter/08c",
                                                                   "chapter/08d")))


@pytest.mark.parametrize("scale", ["ci", "default"])
def test_registry_lists_the_mnist_flows_chapter_8b_trains(env, monkeypatch, scale):
    """``all`` precomputes the MNIST flows the page trains at the scale, and no recipe it never reads."""
    from wsbook.experiments import mnist_flows as mf

    monkeypatch.setenv("WSBOOK_SCALE", scale)
    registry = cli.artifacts()
    listed = {n for n in registry if n.startswith("flow/mnist/")}
    wanted = {cli.flow_artifact(mf.ZOO, r) for r in mf.trained_recipes()}
    assert wanted <= listed and "plain baseline" in mf.trained_recipes()
    untrained = set(mf.RECIPES) - set(mf.trained_recipes())
    assert untrained and not listed & {cli.flow_artifact(mf.ZOO, r) for r in untrained}
    assert set(cli.select(["chapter/08b"], registry)) >= wanted


@pytest.mark.parametrize("scale", ["ci", "default"])
def test_chapter_2_group_holds_every_posterior_run_the_chapter_reads(env, monkeypatch, scale):
    """``chapter/02`` lists every method on every task of chapter 2 at the scale (digits beyond ``ci``), the
    independent HMC run its tables score against and the chain modes; chapter 8's groups keep only the
    methods they compare with HMC."""
    from wsbook.experiments import targets, tasks

    monkeypatch.setenv("WSBOOK_SCALE", scale)
    registry = cli.artifacts()
    group = set(cli.select(["chapter/02"], registry))
    chapter_tasks = ("gap1d", "moons", "breast_cancer") + (("digits",) if scale != "ci" else ())
    wanted = {f"posterior/{t}/{m}" for t in chapter_tasks for m in tasks.METHODS}
    wanted |= {"posterior/breast_cancer/reference", "posterior/breast_cancer/chain_modes"}
    wanted |= {"posterior/digits/reference"} if scale != "ci" else set()
    assert group == wanted
    assert ("posterior/digits/hmc" in registry) == (scale != "ci")
    compared = {f"posterior/breast_cancer/{m}" for m in targets.COMPARED_TO_HMC}
    for chapter in ("chapter/08", "chapter/08c", "chapter/09"):
        runs = {n for n in cli.select([chapter], registry) if n.startswith("posterior/")}
        assert runs == compared, chapter


def test_chapters_5_and_6_groups_run_every_foundation(env):
    """``chapter/05`` and ``chapter/06`` compute every run of :mod:`wsbook.experiments.foundations`, each an
    artifact that calls it."""
    from wsbook.experiments import foundations

    registry = cli.artifacts()
    for chapter, runs in foundations.RUNS.items():
        group = cli.select([f"chapter/{chapter}"], registry)
        assert group == [f"foundations/{chapter}/{name}" for name in runs]
        assert all(registry[f"foundations/{chapter}/{n}"].compute is run for n, run in runs.items())
    assert "foundations/06/shifted_zoo_mnist" in registry and "foundations/06/siren_autoencoder_2" in registry
