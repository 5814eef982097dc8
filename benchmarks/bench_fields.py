"""How close each vector field's training step comes to this machine's matrix-multiply rate.

For every field kind at the sizes the results chapters train it with at `default` (breast cancer 30-16-16-2:
the neuron field, the flat baseline and the message-passing GNN of chapter 8; MNIST 784-10-10: the
anchored neuron field, the flat baseline and the GNN of chapter 8b; the 1-8-8-10 CNNs of chapter 8d: the
larger channel field and the flat field from the mean network, ``cnn_channel`` and ``cnn_flat``), one
training step (the flow-matching loss on a minibatch of chart points, its backward pass) is counted in floating-point operations
(``torch.utils.flop_counter``: matrix products and convolutions, the work a step must do) and timed (best of
several after a warm-up). Prints ``field_flops_<task>_<kind>_batch<B>, achieved GFLOP/s, matmul GFLOP/s,
share`` (``share`` = achieved / matmul rate of a large float32 product in the same run, on one thread).
``python benchmarks/bench_fields.py mnist_gnn breast_cancer_gnn`` runs only the rows named.
A field whose step spends its time in gathers, scatters, small kernels and Python has a small share.

For the message-passing GNN also ``field_flops_<task>_gnn_edge_product``: the share reached by one plain
``[dim, dim] @ [dim, edges x batch]`` product, the shape of every per-edge linear layer of its step (edge
features are feature-major there, see :meth:`wsbook.graphs.RelationalTransformerLayer.forward_grid`), timed
the same way. Its features are ``dim`` numbers per edge, so its products are too thin to run at the large
product's rate; this line is the ceiling of such a layer on this machine.
"""
from __future__ import annotations

import os
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from wsbook import config  # noqa: E402
from wsbook.experiments import flows, mnist_flows as mf, targets  # noqa: E402
from wsbook.nets import CNNSpec, MLPSpec  # noqa: E402

from timing import best_seconds, matmul_gflops  # noqa: E402


def field_configs() -> dict[str, tuple[MLPSpec | CNNSpec, flows.FlowConfig]]:
    """``{"<task>_<kind>": (spec, FlowConfig)}`` of the fields the results chapters train at `default`."""
    with config.at_scale("default"):
        bc = MLPSpec(tuple(targets.ZOOS["breast_cancer"].widths))
        mnist = MLPSpec(tuple(targets.ZOOS[mf.ZOO].widths))
        cnn = targets.ZOOS["cnn_digits"].spec
        from_mean = {c.field: c for c in flows.cnn_candidates().values() if c.source == "mean"}
        return {"breast_cancer_neuron": (bc, flows.neuron_config()),
                "breast_cancer_flat": (bc, flows.baseline_config()),
                "breast_cancer_gnn": (bc, flows.flow_config("euclidean")),
                "mnist_neuron": (mnist, mf.recipe_config(mf.NEURON_ANCHORED)),
                "mnist_flat": (mnist, mf.recipe_config("plain baseline")),
                "mnist_gnn": (mnist, mf.recipe_config("geometric_aligned_ot")),
                "cnn_channel": (cnn, from_mean["channel"]),
                "cnn_flat": (cnn, from_mean["flat"])}


def training_step(spec: MLPSpec | CNNSpec, cfg: flows.FlowConfig, seed: int = 0):
    """A closure running one loss + backward of the flow ``cfg`` on a fixed minibatch (random networks
    stand in for a zoo: the cost of a step does not depend on the weights, nor on an anchored field's
    anchor)."""
    gen = torch.Generator().manual_seed(seed)
    nets = spec.init(cfg.batch_size, generator=gen, device="cpu")
    with config.seeded(seed):
        flow = flows.build_flow(spec, cfg, reference=nets[0], train=nets)
    points = flow.chart.to_points(nets)
    flow.set_scale(points)
    x0 = flow.chart.sample_source(cfg.batch_size, gen)
    t = torch.rand(cfg.batch_size, generator=gen)
    params = list(flow.field.parameters())

    def step() -> None:
        for p in params:
            p.grad = None
        flow.loss(x0, points, t, check=False).backward()
    return step


def main(only: list[str] | None = None) -> None:
    """Every field of :func:`field_configs`, or those named in ``only`` (e.g. ``mnist_gnn``)."""
    torch.set_num_threads(1)     # one thread: the share of one core's matmul rate, stable on a shared machine
    peak = matmul_gflops()
    configs = field_configs()
    unknown = set(only or ()) - set(configs)
    if unknown:
        raise SystemExit(f"unknown field(s) {sorted(unknown)}; choose from {sorted(configs)}")
    for name, (spec, cfg) in configs.items():
        if only and name not in only:
            continue
        step = training_step(spec, cfg)
        with FlopCounterMode(display=False) as counter:
            step()
        seconds = best_seconds(step, repeats=5)
        achieved = counter.get_total_flops() / seconds / 1e9
        print(f"field_flops_{name}_batch{cfg.batch_size}, {achieved:.2f}, {peak:.1f}, {achieved / peak:.2f}")
        print(f"# {name}: {seconds * 1e3:.1f} ms per step, {counter.get_total_flops() / 1e9:.3f} GFLOP")
        if cfg.field == "gnn":
            edges = cfg.batch_size * sum(i * o for i, o in zip(spec.widths[:-1], spec.widths[1:]))
            a, w = torch.randn(cfg.dim, edges), torch.randn(cfg.dim, cfg.dim)
            rate = 2 * edges * cfg.dim**2 / best_seconds(lambda: w @ a, repeats=10) / 1e9
            print(f"field_flops_{name}_edge_product_{edges}x{cfg.dim}, {rate:.2f}, {peak:.1f}, {rate / peak:.2f}")


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fields", nargs="*", help="field rows to run (default all), e.g. breast_cancer_gnn mnist_gnn")
    main(parser.parse_args().fields or None)
