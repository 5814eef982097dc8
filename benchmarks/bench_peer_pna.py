"""wsbook's node-only PNA layer against torch-geometric's ``PNAConv`` on the same neural graphs.

A batch of networks (MLP 16-16-16-10, the chapter-6 zoo architecture) becomes one batched neural graph
(``NeuralGraph.to_graph``); its node and edge features are embedded to ``dim`` by fixed linear maps, and
one layer runs on it: ``wsbook.graphs.PNALayer`` (PNA with the edge update switched off) and a
``torch_geometric.nn.PNAConv`` with the same aggregators (mean, std, max, min), scalers (identity,
amplification, attenuation), degree reference, one tower and the *same weights* (copied), given both
directions of every edge. Agreement: equal outputs and equal gradients (float64, to 1e-8 relative).
Timing: forward + backward (gradients of the weights and of the input features), float32.

Prints ``name, ours, peer, ratio`` lines (seconds; ratio = peer / ours, > 1 means wsbook is faster).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from wsbook.graphs import NeuralGraph, PNALayer  # noqa: E402
from wsbook.graphs.layers import bidirectional  # noqa: E402
from wsbook.nets import MLPSpec  # noqa: E402

from timing import best_seconds  # noqa: E402

SPEC = MLPSpec((16, 16, 16, 10))


def build(n_networks: int, dim: int, dtype: torch.dtype = torch.float32, seed: int = 0):
    """The graph batch, its embedded features ``h [N, dim]``, ``e [E, dim]``, our layer and a ``PNAConv``
    holding the same weights."""
    from torch_geometric.nn import PNAConv
    from torch_geometric.utils import degree

    gen = torch.Generator().manual_seed(seed)
    graph = NeuralGraph(SPEC)
    gb = graph.to_graph(SPEC.init(n_networks, generator=gen))
    h = (gb.x * torch.randn(1, dim, generator=gen) + torch.randn(gb.pos.max() + 1, dim, generator=gen)[gb.pos])
    e = gb.edge_attr * torch.randn(1, dim, generator=gen) + torch.randn(1, dim, generator=gen)
    torch.manual_seed(seed)                                        # the layers' own initialisation
    ours = PNALayer(dim, graph.mean_log_degree())
    in_degree = degree(torch.cat([gb.edge_index[1], gb.edge_index[0]]), num_nodes=h.shape[0], dtype=torch.long)
    peer = PNAConv(dim, dim, aggregators=["mean", "std", "max", "min"],
                   scalers=["identity", "amplification", "attenuation"], deg=torch.bincount(in_degree),
                   edge_dim=dim, towers=1, pre_layers=1, post_layers=1)
    with torch.no_grad():                                          # share the weights
        for mine, theirs in ((ours.edge_encoder, peer.edge_encoder), (ours.pre, peer.pre_nns[0][0]),
                             (ours.post, peer.post_nns[0][0]), (ours.lin, peer.lin)):
            theirs.weight.copy_(mine.weight)
            theirs.bias.copy_(mine.bias)
    ours, peer = ours.to(dtype), peer.to(dtype)
    # PyG computes the reference delta from the degree histogram in float32: the same value to 1e-6;
    # give it ours exactly so that float64 outputs can be compared to round-off
    assert abs(float(peer.aggr_module.avg_deg_log) - ours.aggr_module.mean_log_degree) < 1e-6
    peer.aggr_module.avg_deg_log.fill_(ours.aggr_module.mean_log_degree)
    return gb, h.to(dtype), e.to(dtype), ours, peer


def run_ours(ours, gb, h, e):
    return ours(h, gb.edge_index, e)[0]


def run_peer(ours, peer, gb, h, e):
    """PyG's layer on the same graph: both directions of every edge, the direction embedding added."""
    ei, ea = bidirectional(gb.edge_index, e, ours.direction)
    return peer(h, ei, ea)


def forward_backward(fn, params, h, e):
    h, e = h.detach().requires_grad_(True), e.detach().requires_grad_(True)
    out = fn(h, e)
    grads = torch.autograd.grad((out * out).sum(), [h, e, *params])
    return out.detach(), grads


def check(n_networks: int = 8, dim: int = 16) -> dict:
    """Assert equal outputs and gradients (float64); returns the deviations."""
    gb, h, e, ours, peer = build(n_networks, dim, torch.float64)
    params = list(ours.parameters())
    out_o, g_o = forward_backward(lambda h, e: run_ours(ours, gb, h, e), params, h, e)
    # the direction embedding enters PyG's input; its gradient flows through ``bidirectional``
    peer_params = [ours.direction.weight, peer.edge_encoder.weight, peer.edge_encoder.bias,
                   peer.pre_nns[0][0].weight, peer.pre_nns[0][0].bias, peer.post_nns[0][0].weight,
                   peer.post_nns[0][0].bias, peer.lin.weight, peer.lin.bias]
    out_p, g_p = forward_backward(lambda h, e: run_peer(ours, peer, gb, h, e), peer_params, h, e)
    names = ["h", "e"] + [n for n, _ in ours.named_parameters()]
    scale = out_p.abs().max()
    errors = {"output": float((out_o - out_p).abs().max() / scale)}
    for name, a, b in zip(names, g_o, g_p):
        errors[f"grad {name}"] = float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
    for what, err in errors.items():
        assert err < 1e-8, f"PNALayer and PNAConv differ in {what}: relative error {err:.2e}"
    return errors


def main(n_networks: int = 64, dim: int = 32) -> None:
    check()
    gb, h, e, ours, peer = build(n_networks, dim)
    p_ours, p_peer = list(ours.parameters()), list(peer.parameters()) + [ours.direction.weight]
    t_ours = best_seconds(lambda: forward_backward(lambda h, e: run_ours(ours, gb, h, e), p_ours, h, e), repeats=5)
    t_peer = best_seconds(lambda: forward_backward(lambda h, e: run_peer(ours, peer, gb, h, e), p_peer, h, e),
                          repeats=5)
    with torch.no_grad():
        f_ours = best_seconds(lambda: run_ours(ours, gb, h, e), repeats=5)
        f_peer = best_seconds(lambda: run_peer(ours, peer, gb, h, e), repeats=5)
    size = f"{n_networks} graphs of {SPEC.widths}, dim {dim}"
    print("name, ours, peer, ratio")
    print(f"pna_forward_backward {size}, {t_ours:.5f}, {t_peer:.5f}, {t_peer / t_ours:.2f}")
    print(f"pna_forward {size}, {f_ours:.5f}, {f_peer:.5f}, {f_peer / f_ours:.2f}")


if __name__ == "__main__":
    main()
