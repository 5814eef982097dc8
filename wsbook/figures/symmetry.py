"""Figures of chapter 5: neurons of a canonicalized population on the sphere."""
from __future__ import annotations

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from wsbook.figures import style
from wsbook.nets import MLPSpec


def neurons_on_sphere(spec: MLPSpec, normalized: Tensor, canonical: Tensor, members: int = 3) -> go.Figure:
    """First-layer neurons ``[w_1, w_2, b]`` of 2-input networks on the unit sphere S^2, one colour per network:
    left after normalization only, right after canonicalization (alignment to member 0).

    See chapter 5, "Experiment 5: canonicalization".

    Args:
        spec: an architecture with 2 inputs and biases.
        normalized: the population after :func:`wsbook.symmetry.normalize_neurons` ``[B, D]``.
        canonical: the population after :func:`wsbook.symmetry.canonicalize` ``[B, D]``.
        members: how many networks to draw.
    """
    if spec.widths[0] != 2 or not spec.bias:
        raise ValueError(f"the sphere picture needs 2 inputs and biases (points on S^2); got {spec}")
    fig = make_subplots(rows=1, cols=2, specs=[[{"type": "scene"}, {"type": "scene"}]],
                        subplot_titles=["normalized (scaling removed)", "canonical (aligned to network 0)"])
    for col, theta in ((1, normalized), (2, canonical)):
        fig.add_trace(style.sphere_surface(), row=1, col=col)
        w, b = spec.weights(theta)[0][:members], spec.biases(theta)[0][:members]
        pts = torch.cat([w, b.unsqueeze(2)], 2).cpu().numpy()          # [members, width, 3]
        for k in range(pts.shape[0]):   # one trace per plotted network (a handful), for the legend
            fig.add_trace(go.Scatter3d(x=pts[k, :, 0], y=pts[k, :, 1], z=pts[k, :, 2], mode="markers",
                                       marker=dict(size=4, color=style.PALETTE[k % len(style.PALETTE)]),
                                       name=f"network {k}", legendgroup=f"n{k}", showlegend=(col == 1)),
                          row=1, col=col)
    axis = dict(showbackground=False, zeroline=False, range=[-1.1, 1.1])
    for name in ("scene", "scene2"):
        fig.layout[name].update(aspectmode="cube", xaxis=axis, yaxis=axis, zaxis=axis)
    fig.update_layout(height=480, margin=dict(l=0, r=0, t=40, b=0))
    return fig
