"""Figures of chapter 5: neurons of a canonicalized population on the sphere."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from wsbook.figures import style
from wsbook.nets import MLPSpec


def neurons_on_sphere(spec: MLPSpec, normalized: Tensor, canonical: Tensor, members: int = 3) -> go.Figure:
    """First-layer neurons ``[w_1, w_2, b]`` of 2-input networks on the unit sphere S^2: left after
    normalization only, right after canonicalization (alignment to network 0).

    A permutation relabels neurons, it does not move them, so the two panels hold the same points. What
    changes is which neuron of network ``k`` carries index ``i``: each neuron is joined by a line to the
    neuron of network 0 with the same index (its match). Before alignment the lines cross the sphere;
    after it they are short, because matched neurons sit close together. Markers are coloured by index.

    See chapter 5, "Experiment 5: canonicalization".

    Args:
        spec: an architecture with 2 inputs and biases.
        normalized: the population after :func:`wsbook.symmetry.normalize_neurons` ``[B, D]``.
        canonical: the population after :func:`wsbook.symmetry.canonicalize` ``[B, D]``.
        members: how many networks to draw (network 0 and ``members - 1`` others).
    """
    if spec.widths[0] != 2 or not spec.bias:
        raise ValueError(f"the sphere picture needs 2 inputs and biases (points on S^2); got {spec}")
    if members < 2:
        raise ValueError(f"members must be at least 2 (network 0 and one to match to it); got {members}")
    fig = make_subplots(rows=1, cols=2, specs=[[{"type": "scene"}, {"type": "scene"}]],
                        subplot_titles=["normalized: index i joined to index i of network 0",
                                        "canonical: index i joined to its match in network 0"])
    symbols = ["circle", "diamond", "square", "cross", "x"]
    for col, theta in ((1, normalized), (2, canonical)):
        fig.add_trace(style.sphere_surface(), row=1, col=col)
        w, b = spec.weights(theta)[0][:members], spec.biases(theta)[0][:members]
        pts = torch.cat([w, b.unsqueeze(2)], 2).cpu().numpy()          # [members, width, 3]
        width = pts.shape[1]
        for k in range(1, pts.shape[0]):    # segments from network k's neuron i to network 0's neuron i
            seg = np.stack([pts[k], pts[0], np.full_like(pts[0], np.nan)], 1).reshape(-1, 3)
            fig.add_trace(go.Scatter3d(x=seg[:, 0], y=seg[:, 1], z=seg[:, 2], mode="lines",
                                       line=dict(color="#777777", width=2), name="matched pairs",
                                       legendgroup="pairs", showlegend=(col == 1 and k == 1),
                                       hoverinfo="skip"), row=1, col=col)
        for k in range(pts.shape[0]):   # one trace per plotted network (a handful), for the legend
            fig.add_trace(go.Scatter3d(x=pts[k, :, 0], y=pts[k, :, 1], z=pts[k, :, 2], mode="markers",
                                       marker=dict(size=4, color=np.arange(width), colorscale="Turbo",
                                                   symbol=symbols[k % len(symbols)]),
                                       text=[f"network {k}, neuron {i}" for i in range(width)],
                                       hoverinfo="text", name=f"network {k}", legendgroup=f"n{k}",
                                       showlegend=(col == 1)), row=1, col=col)
    axis = dict(showbackground=False, zeroline=False, range=[-1.1, 1.1])
    for name in ("scene", "scene2"):
        fig.layout[name].update(aspectmode="cube", xaxis=dict(axis, title="w<sub>1</sub>"),
                                yaxis=dict(axis, title="w<sub>2</sub>"), zaxis=dict(axis, title="b"))
    fig.update_layout(height=480, margin=dict(l=0, r=0, t=50, b=60))
    return fig
