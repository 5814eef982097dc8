"""Drawing a neural graph (chapter 6): neurons as nodes coloured by bias, weights as edges coloured by value."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from torch import Tensor

if TYPE_CHECKING:   # only for the annotation: drawing needs no torch-geometric import
    from wsbook.graphs.neural_graph import NeuralGraph


def draw_neural_graph(graph: NeuralGraph, theta: Tensor, *, n_bins: int = 15, colorscale: str = "RdBu",
                      title: str = "") -> go.Figure:
    """An interactive drawing of one network ``theta [D]`` as its neural graph. Edges are binned into
    ``n_bins`` colours of a diverging scale symmetric around zero (one trace per bin, so the figure stays
    light); hovering a node shows its layer, index and bias. For CNN graphs the edge colour is the
    kernel's mean weight.

    See chapter 6, "Neural graphs from MLPs and CNNs".

    Args:
        graph: the :class:`wsbook.graphs.NeuralGraph` of the network's spec.
        theta: one network ``[D]`` or ``[1, D]``.
        n_bins: number of edge colours.
        colorscale: a diverging plotly colour scale.
        title: figure title.
    """
    theta = graph.spec.check(theta)
    if theta.shape[0] != 1:
        raise ValueError(f"draw one network at a time; got {theta.shape[0]}")
    gb = graph.to_graph(theta.detach().cpu())
    layer = graph.node_layer.numpy()
    index = np.concatenate([np.arange(w) - (w - 1) / 2 for w in graph.widths])
    xs, ys = layer.astype(float), index
    weight = gb.edge_attr.mean(1).numpy()
    bias = gb.x[:, 0].numpy()
    vmax = float(np.abs(weight).max()) or 1.0
    edges = np.digitize(weight, np.linspace(-vmax, vmax, n_bins + 1)[1:-1])
    colors = sample_colorscale(colorscale, list(np.linspace(0, 1, n_bins)))
    src, dst = graph.edge_index.numpy()
    fig = go.Figure()
    for k in range(n_bins):
        sel = np.nonzero(edges == k)[0]
        if len(sel) == 0:
            continue
        ex = np.stack([xs[src[sel]], xs[dst[sel]], np.full(len(sel), np.nan)], 1).ravel()
        ey = np.stack([ys[src[sel]], ys[dst[sel]], np.full(len(sel), np.nan)], 1).ravel()
        fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line=dict(color=colors[k], width=1.2), hoverinfo="skip",
                                 showlegend=False, opacity=0.8))
    hover = [f"layer {l}, neuron {int(i + (graph.widths[l] - 1) / 2)}<br>bias {b:.3f}" for l, i, b in zip(layer, index, bias)]
    bmax = float(np.abs(bias).max()) or 1.0
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", hovertext=hover, hoverinfo="text", showlegend=False,
                             marker=dict(size=11, color=bias, colorscale=colorscale, cmin=-bmax, cmax=bmax,
                                         line=dict(color="#333", width=1),
                                         colorbar=dict(title="bias / weight", thickness=12))))
    fig.update_layout(title=title, xaxis=dict(title="layer", tickvals=list(range(len(graph.widths))), zeroline=False,
                                              showgrid=False),
                      yaxis=dict(visible=False), height=420)
    return fig


def aligner_learning_curves(history: Tensor, *, window: int = 25, title: str = "") -> go.Figure:
    """The two training losses of a learned aligner (:func:`wsbook.graphs.align.fit_aligner`) against the
    step, each as a moving average over ``window`` steps, in two panels (their scales differ).

    See chapter 6, "Experiment 2: learned alignment".

    Args:
        history: per-step losses ``[steps, 2]``: supervised (planted permutations), interpolation loss.
        window: steps per moving average (at most the number of steps).
        title: figure title.
    """
    from plotly.subplots import make_subplots

    h = np.asarray(history.detach().cpu(), dtype=float)
    if h.ndim != 2 or h.shape[1] != 2 or h.shape[0] == 0:
        raise ValueError(f"history must be [steps, 2]; got {tuple(h.shape)}")
    window = max(1, min(window, h.shape[0]))
    kernel = np.ones(window) / window
    steps = np.arange(window, h.shape[0] + 1)
    names = ("planted permutations (cross-entropy)", "interpolation loss of the task")
    fig = make_subplots(rows=1, cols=2, subplot_titles=names)
    for k, (name, c) in enumerate(zip(names, ("#0072B2", "#CC79A7"))):
        smooth = np.convolve(h[:, k], kernel, mode="valid")
        fig.add_trace(go.Scatter(x=steps, y=smooth, mode="lines", line=dict(color=c, width=2), name=name,
                                 showlegend=False), row=1, col=k + 1)
        fig.update_xaxes(title_text="training step", row=1, col=k + 1)
    fig.update_yaxes(title_text=f"loss (mean of {window} steps)", row=1, col=1)
    fig.update_layout(title=title, height=380)
    return fig
