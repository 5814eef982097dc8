"""``make gpu-check``: what only a CUDA machine can tell, in a few minutes on one GPU.

1. The CUDA tests (``pytest -k cuda``: the tests skipped without a CUDA device).
2. One training step (``WeightFlow.fit``: batch, coupling, pairing, field, AdamW, EMA) and one sampling
   pass (``WeightFlow.sample``, the chapters' solver, steps and number of networks) of every field kind at
   the ``full`` sizes of the book: ``gnn_field``, ``NeuronField`` and ``FlatField`` on breast-cancer
   networks (30-16-16-2, :func:`wsbook.experiments.flows.flow_config`), the ``ChannelField`` and the
   ``FlatField`` of chapter 8d's flows from the mean network on its 1-8-8-10 CNNs
   (:func:`wsbook.experiments.flows.cnn_candidates`, :func:`~wsbook.experiments.flows.cnn_sizes`),
   ``gnn_field``, ``NeuronField`` and ``FlatField`` on MNIST networks (784-10-10,
   :func:`wsbook.experiments.mnist_flows.budget`), each with the field under bfloat16 autocast and in
   float32.
3. The MNIST GNN flow at ``full`` size trained for :data:`TRAIN_STEPS` steps (``fit``'s default: the field
   under bfloat16 autocast on CUDA; the loss at the start and at the end), then sampled; last, the whole
   check's wall time.

The networks are random (Kaiming-uniform) networks of the zoos' architectures, not the zoos: only the
time is measured. The lines go to ``benchmarks/gpu_results.csv`` (``what, zoo, field, dtype, ms, note,
device, date``), which the appendix "Performance" renders.

Usage: ``python benchmarks/gpu_check.py [--device cpu] [--tiny] [--out PATH]``. Without a CUDA device
(and without ``--device cpu``) it says so and exits 0. ``--device cpu --tiny`` runs the same code at the
``ci`` sizes on small architectures (8 networks sampled in 2 steps) in a few seconds: the unit test
``tests/test_gpu_check.py``. On the CPU a CSV is written only with ``--out``. Exit status 1 when the CUDA
tests or a measurement failed.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from wsbook import config
from wsbook.nets import CNNSpec, MLPSpec

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "gpu_results.csv"
COLUMNS = ("what", "zoo", "field", "dtype", "ms", "note", "device", "date")
TRAIN_STEPS = 200           # the MNIST flow's training run
WARM_STEPS, TIMED_STEPS = 3, 20     # training steps of the untimed fit and of the timed one
#: (zoo, architecture at full size, architecture with --tiny); a CNN's is (in channels, *channels, classes)
ZOOS = (("breast_cancer", (30, 16, 16, 2), (6, 4, 4, 2)), ("cnn_digits", (1, 8, 8, 10), (1, 3, 3, 4)),
        ("mnist5k", (784, 10, 10), (12, 4, 3)))


def spec_of(zoo: str, widths: tuple[int, ...]) -> MLPSpec | CNNSpec:
    """The architecture of ``zoo``'s networks with ``widths`` (CNNs: 3x3 kernels, as chapter 8d's)."""
    return CNNSpec(widths[0], widths[1:-1], kernel_size=3, n_classes=widths[-1]) if zoo.startswith("cnn") \
        else MLPSpec(widths)


def flows_of(zoo: str, widths: tuple[int, ...], device: torch.device,
             tiny: bool = False) -> list[tuple[object, dict, dict]]:
    """``(untrained WeightFlow, fit arguments, sample arguments)`` for each field kind of ``zoo`` at the
    current scale, built as the chapters build them (aligned to a random reference network), with the
    field on ``device``; ``tiny``: 8 networks sampled in 2 steps."""
    from wsbook.experiments import flows, mnist_flows, summary

    spec = spec_of(zoo, widths)
    ref = spec.init(1, generator=torch.Generator().manual_seed(1), device="cpu")
    if zoo == "cnn_digits":      # the page's two flows from the mean network (of random networks here)
        n, steps = flows.cnn_sizes()
        train = spec.init(16, generator=torch.Generator().manual_seed(2), device="cpu")
        out = [(flows.build_flow(spec, cfg, ref, train), dict(batch_size=cfg.batch_size, lr=cfg.lr),
                dict(n=n, steps=steps, method="midpoint"))
               for cfg in flows.cnn_candidates().values() if cfg.source == "mean"]
    elif zoo == "breast_cancer":
        n, steps = summary.breast_cancer_sizes()
        out = []
        for kind in ("gnn", "neuron", "flat"):
            cfg = flows.flow_config("euclidean", "aligned_ot", field=kind)
            out.append((flows.build_flow(spec, cfg, ref), dict(batch_size=cfg.batch_size, lr=cfg.lr),
                        dict(n=n, steps=steps, method="midpoint")))
    else:
        b = mnist_flows.budget()
        sample = dict(n=b.n_samples, steps=b.sample_steps, method=b.method)
        recipes = (("geometric_aligned_ot", b.batch_size, b.lr),
                   (mnist_flows.NEURON_ANCHORED, b.neuron_batch, b.neuron_lr),
                   ("plain baseline", b.flat_batch, b.flat_lr))
        out = [(mnist_flows.make_flow(r, spec, ref[0], b), dict(batch_size=bs, lr=lr), sample)
               for r, bs, lr in recipes]
    for flow, _, sample in out:
        flow.field.to(device)
        sample.update(dict(n=8, steps=2) if tiny else {})
    return out


@contextlib.contextmanager
def field_autocast(flow, on: bool):
    """Sample with the field under bfloat16 autocast (the flag ``fit(autocast=...)`` sets while it trains)."""
    flow._autocast = on
    try:
        yield
    finally:
        flow._autocast = False


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(flow, nets, fit_kw: dict, sample_kw: dict, bf16: bool, device: torch.device, warm: int, timed: int):
    """Milliseconds per training step (a fit of ``timed`` steps after one of ``warm``) and of one sampling
    pass (after a pass of one solver step)."""
    gen = torch.Generator().manual_seed(0)
    flow.fit(nets, steps=warm, generator=gen, autocast=bf16, **fit_kw)
    step_ms = 1e3 * flow.fit(nets, steps=timed, generator=gen, autocast=bf16, **fit_kw).seconds / timed
    with field_autocast(flow, bf16):
        flow.sample(sample_kw["n"], steps=1, method=sample_kw["method"], generator=gen)     # warm-up
        sync(device)
        start = time.perf_counter()
        flow.sample(generator=gen, **sample_kw)      # raises FloatingPointError on NaN or inf
        sync(device)
    return step_ms, 1e3 * (time.perf_counter() - start)


def cuda_tests() -> tuple[int, float]:
    """Run the test suite's CUDA tests (their names end in ``cuda``); exit status and milliseconds."""
    env = {**os.environ, "WSBOOK_SCALE": "ci", "WSBOOK_PROGRESS": "0"}
    start = time.perf_counter()
    rc = subprocess.call([sys.executable, "-m", "pytest", "tests", "-m", "not book", "-k", "cuda", "-q",
                          "-p", "no:cacheprovider"], cwd=ROOT, env=env)
    return rc, 1e3 * (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="ci sizes on small architectures (a test)")
    parser.add_argument("--out", type=Path, help=f"the CSV (default on CUDA: {RESULTS.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: no CUDA device; nothing to measure")
        return 0
    device = torch.device(args.device)
    out = args.out or (RESULTS if device.type == "cuda" else None)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    date = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    rows, failed, began = [], False, time.perf_counter()

    def row(what, zoo="", field="", dtype="", ms=float("nan"), note=""):
        rows.append(dict(what=what, zoo=zoo, field=field, dtype=dtype, ms=f"{ms:.2f}", note=note, device=name,
                         date=date))
        print(", ".join(str(v) for v in list(rows[-1].values())[:6]), flush=True)

    if device.type == "cuda":
        rc, ms = cuda_tests()
        failed |= rc != 0
        row("cuda_tests", ms=ms, note=f"pytest -k cuda: exit {rc}")
    warm, timed, train_steps, n_nets = (1, 2, 3, 32) if args.tiny else (WARM_STEPS, TIMED_STEPS, TRAIN_STEPS, 256)
    gen = torch.Generator().manual_seed(0)
    try:
        with config.at_scale("ci" if args.tiny else "full"):
            for zoo, full_widths, tiny_widths in ZOOS:
                widths = tiny_widths if args.tiny else full_widths
                nets = spec_of(zoo, widths).init(n_nets, generator=gen, device="cpu")
                for flow, fit_kw, sample_kw in flows_of(zoo, widths, device, args.tiny):
                    field = type(flow.field).__name__
                    for bf16 in (True, False):
                        dtype = "bfloat16" if bf16 else "float32"
                        try:
                            step_ms, sample_ms = measure(flow, nets, fit_kw, sample_kw, bf16, device, warm, timed)
                        except Exception as err:       # measure the others; the exit status says it
                            failed = True
                            row("error", zoo, field, dtype, note=f"{type(err).__name__}: {err}"[:200])
                            continue
                        row("train_step", zoo, field, dtype, step_ms, f"batch {fit_kw['batch_size']}")
                        row("sample", zoo, field, dtype, sample_ms,
                            f"{sample_kw['n']} networks, {sample_kw['steps']} {sample_kw['method']} steps")
            # the MNIST GNN flow (the first of flows_of; MNIST is the last of ZOOS, so widths and nets are
            # its) trained for a fixed number of steps with fit's default autocast (bfloat16 on CUDA), then
            # sampled in float32 as the chapters do
            flow, fit_kw, sample_kw = flows_of("mnist5k", widths, device, args.tiny)[0]
            fit = flow.fit(nets, steps=train_steps, generator=gen, **fit_kw)
            k = max(1, train_steps // 10)
            field = type(flow.field).__name__
            row("train", "mnist5k", field, "bfloat16" if device.type == "cuda" else "float32", 1e3 * fit.seconds,
                f"{train_steps} steps, batch {fit_kw['batch_size']}, "
                f"loss {fit.losses[:k].mean():.3g} -> {fit.losses[-k:].mean():.3g}")
            sync(device)
            start = time.perf_counter()
            flow.sample(generator=gen, **sample_kw)
            sync(device)
            row("sample_trained", "mnist5k", field, "float32", 1e3 * (time.perf_counter() - start),
                f"{sample_kw['n']} networks, {sample_kw['steps']} {sample_kw['method']} steps")
        row("total", ms=1e3 * (time.perf_counter() - began), note="the whole check")
    finally:            # what was measured is kept even when a later step fails
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(out, "w", newline="") as f:
                writer = csv.DictWriter(f, COLUMNS)
                writer.writeheader()
                writer.writerows(rows)
            print(f"gpu-check: wrote {len(rows)} lines to {out}")
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
