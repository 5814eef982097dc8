"""Benchmarks of wsbook.graphs: batched graph construction and GNN throughput.

Prints ``name, ours, baseline, ratio`` lines:
* ``build_graph_256``: seconds to turn 256 networks into one batched graph by index gathering (ours)
  versus one torch-geometric ``Data`` per network joined with ``Batch.from_data_list`` (baseline).
* ``throughput_<layer>_batch<B>``: graphs per second of a forward pass at the chapter's sizes (the
  experiment-1 zoo spec 16-16-16-10, width 32, two layers), ``B`` graphs batched (ours) versus one graph at a
  time (baseline); ratio = ours / baseline.
"""
from __future__ import annotations


import torch
from torch_geometric.data import Batch, Data

from wsbook.graphs import NeuralGraph, WeightSpaceGNN
from wsbook.nets import MLPSpec

from timing import best_pair, best_seconds  # the script's own folder is on sys.path


def per_network_batch(graph: NeuralGraph, theta: torch.Tensor) -> Batch:
    """The baseline: build each network's graph on its own, then let torch-geometric batch them."""
    data_list = []
    for row in theta:
        padded = torch.cat([row, row.new_zeros(1)])
        data_list.append(Data(x=padded[graph.node_param].unsqueeze(-1), edge_attr=padded[graph.edge_param],
                              edge_index=graph.edge_index, pos=graph.node_pos))
    return Batch.from_data_list(data_list)


def main() -> None:
    torch.manual_seed(0)
    spec = MLPSpec((16, 16, 16, 10))
    graph = NeuralGraph(spec)
    theta = spec.init(256, device="cpu")
    ours = best_seconds(lambda: graph.to_graph(theta))
    base = best_seconds(lambda: per_network_batch(graph, theta))
    ours_batch, base_batch = graph.to_graph(theta), per_network_batch(graph, theta)
    assert torch.equal(ours_batch.edge_attr, base_batch.edge_attr) and torch.equal(ours_batch.edge_index, base_batch.edge_index)
    print(f"build_graph_256, {ours:.5f}, {base:.5f}, {base / ours:.1f}")

    for batch in (8, 64):
        x = spec.init(batch, device="cpu")
        for name, kwargs in [("pna", dict(layer="pna")),
                             ("relational_transformer", dict(layer="relational_transformer")),
                             ("relational_transformer_all", dict(layer="relational_transformer", attention="all"))]:
            model = WeightSpaceGNN(spec, dim=32, n_layers=2, **kwargs).eval()
            with torch.no_grad():
                t_batched, t_single = best_pair(lambda: model(x), lambda: [model(x[i:i + 1]) for i in range(8)])
            ours_gps, base_gps = batch / t_batched, 8 / t_single
            print(f"throughput_{name}_batch{batch}, {ours_gps:.1f}, {base_gps:.1f}, {ours_gps / base_gps:.1f}")

if __name__ == "__main__":
    main()
