"""``make gpu-check`` (``benchmarks/gpu_check.py``) without a GPU: the one line it prints when there is no
CUDA device, and its timing code run at tiny sizes on the CPU (``--device cpu --tiny``)."""
from __future__ import annotations

import csv
import math
import os
import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import gpu_check  # noqa: E402


def test_without_a_gpu_it_says_so_and_writes_nothing(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = gpu_check.RESULTS.stat().st_mtime_ns if gpu_check.RESULTS.exists() else None
    out = tmp_path / "gpu.csv"
    assert gpu_check.main([]) == 0
    assert gpu_check.main(["--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == ["gpu-check: no CUDA device; nothing to measure"] * 2
    assert not out.exists()
    assert (gpu_check.RESULTS.stat().st_mtime_ns if gpu_check.RESULTS.exists() else None) == before


def test_tiny_run_on_the_cpu_times_every_field_kind(tmp_path, monkeypatch):
    monkeypatch.setenv("WSBOOK_SCALE", "ci")
    out = tmp_path / "gpu.csv"
    assert gpu_check.main(["--device", "cpu", "--tiny", "--out", str(out)]) == 0
    assert os.environ["WSBOOK_SCALE"] == "ci"          # the full / ci switch is undone
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == gpu_check.COLUMNS
    assert {r["device"] for r in rows} == {"cpu"} and not any(r["what"] == "error" for r in rows)
    assert all(math.isfinite(float(r["ms"])) and float(r["ms"]) > 0 for r in rows)
    timed = {(r["what"], r["zoo"], r["field"], r["dtype"]) for r in rows}
    fields = {"breast_cancer": ("GNNField", "NeuronField", "FlatField"),
              "cnn_digits": ("ChannelField", "FlatField"),
              "mnist5k": ("GNNField", "NeuronField", "FlatField")}
    assert timed >= {(what, zoo, field, dtype) for zoo, names in fields.items() for field in names
                     for what in ("train_step", "sample") for dtype in ("bfloat16", "float32")}
    assert [r["what"] for r in rows[-3:]] == ["train", "sample_trained", "total"]
