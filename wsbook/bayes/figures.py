"""Figures of chapter 2 built on :mod:`wsbook.plots` (a method keeps its colour everywhere)."""
from __future__ import annotations

from typing import Mapping

import numpy as np
import plotly.graph_objects as go
import torch
from torch import Tensor

from wsbook import plots


def function_samples(x: Tensor, curves: Mapping[str, Tensor], n_show: int = 8, title: str = "") -> go.Figure:
    """Side-by-side panels of sampled 1-D functions ``curves[name] = [n, N]`` over inputs ``x [N]``."""
    from plotly.subplots import make_subplots

    names = list(curves)
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names, shared_yaxes=True)
    xs = x.reshape(-1).cpu().numpy()
    for k, name in enumerate(names):
        for f in curves[name][:n_show].cpu().numpy():
            fig.add_trace(go.Scatter(x=xs, y=f, mode="lines", line=dict(color=plots.PALETTE[k], width=1.3),
                                     opacity=0.7, showlegend=False, hoverinfo="skip"), row=1, col=k + 1)
    fig.update_layout(title=title, height=350)
    return fig


def regression_panels(x_grid: Tensor, runs: Mapping[str, Tensor], x_train: Tensor, y_train: Tensor,
                      noise_std: float, cols: int = 4, title: str = "") -> go.Figure:
    """One panel per method: predictive mean and a +-2 standard deviation band (function variance plus
    observation noise) from sampled outputs ``runs[name] = [n, N_grid]``, with the training data."""
    from plotly.subplots import make_subplots

    names = list(runs)
    rows = (len(names) + cols - 1) // cols
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=names, shared_xaxes=True, shared_yaxes=True,
                        horizontal_spacing=0.03, vertical_spacing=0.1)
    xs = x_grid.reshape(-1).cpu().numpy()
    for k, name in enumerate(names):
        f = runs[name].reshape(runs[name].shape[0], -1).double()
        mean, sd = f.mean(0).cpu().numpy(), (f.var(0) + noise_std**2).sqrt().cpu().numpy()
        r, c = k // cols + 1, k % cols + 1
        col = plots.color(name)
        fig.add_trace(go.Scatter(x=np.concatenate([xs, xs[::-1]]), y=np.concatenate([mean + 2 * sd, (mean - 2 * sd)[::-1]]),
                                 fill="toself", fillcolor=plots._rgba(col, 0.25), line=dict(width=0),
                                 hoverinfo="skip", showlegend=False), row=r, col=c)
        fig.add_trace(go.Scatter(x=xs, y=mean, mode="lines", line=dict(color=col, width=2), name=name,
                                 showlegend=False), row=r, col=c)
        fig.add_trace(go.Scatter(x=x_train.reshape(-1).cpu().numpy(), y=y_train.reshape(-1).cpu().numpy(),
                                 mode="markers", marker=dict(size=3, color=plots.color("data")), showlegend=False,
                                 hoverinfo="skip"), row=r, col=c)
    fig.update_yaxes(range=[-3.5, 3.5])
    fig.update_layout(title=title, height=300 * rows)
    return fig


def entropy_maps(grid: Tensor, probs: Mapping[str, Tensor], x: Tensor, y: Tensor, cols: int = 4,
                 title: str = "") -> go.Figure:
    """Predictive entropy ``H[p(y|x, D)]`` of each method's model average ``probs[name] = [N_grid, C]`` on a
    square 2-D grid, with the data on top."""
    side = int(round(grid.shape[0] ** 0.5))
    gx = grid[:side, 0].cpu().numpy()
    gy = grid[::side, 1].cpu().numpy()
    z = {name: predictive_entropy(p).view(side, side).cpu().numpy() for name, p in probs.items()}
    return plots.heatmap_grid(z, gx, gy, cols=cols, title=title, zmin=0.0, zmax=float(np.log(2.0)),
                              points=(x[:, 0].cpu().numpy(), x[:, 1].cpu().numpy(), y.cpu().numpy()))


def predictive_entropy(p: Tensor) -> Tensor:
    """Entropy ``-sum_c p_c log p_c`` of class probabilities ``[..., C]``."""
    return -(p * torch.log(p.clamp_min(1e-12))).sum(-1)
