"""Figures of posterior predictives (chapter 2), built on the shared style (a method keeps its colour)."""
from __future__ import annotations

from typing import Mapping

import numpy as np
import plotly.graph_objects as go
from torch import Tensor

from wsbook.bayes.metrics import predictive_entropy
from wsbook.figures import style


def function_samples(x: Tensor, curves: Mapping[str, Tensor], n_show: int = 8, title: str = "") -> go.Figure:
    """Side-by-side panels of sampled 1-D functions over shared inputs.

    See chapter 2, "Priors: one weight prior, many function priors".

    Args:
        x: inputs ``[N]`` (or ``[N, 1]``).
        curves: panel title -> sampled function values ``[n, N]``.
        n_show: functions drawn per panel.
        title: figure title.
    """
    from plotly.subplots import make_subplots

    names = list(curves)
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names, shared_yaxes=True)
    xs = x.reshape(-1).cpu().numpy()
    for k, name in enumerate(names):
        for f in curves[name][:n_show].cpu().numpy():
            fig.add_trace(go.Scatter(x=xs, y=f, mode="lines", line=dict(color=style.PALETTE[k], width=1.3),
                                     opacity=0.7, showlegend=False, hoverinfo="skip"), row=1, col=k + 1)
    fig.update_xaxes(title_text="x")
    fig.update_yaxes(title_text="f(x)", col=1)
    fig.update_layout(title=title, height=380)
    return fig


def regression_panels(x_grid: Tensor, runs: Mapping[str, Tensor], x_train: Tensor, y_train: Tensor,
                      noise_std: float, cols: int = 4, title: str = "",
                      y_range: tuple[float, float] | None = None) -> go.Figure:
    """One panel per method: predictive mean and a +-2 standard deviation band (function variance plus
    observation noise) from sampled outputs ``runs[name] = [n, N_grid]``, with the training data.

    See chapter 2, "Regression with a gap".

    Args:
        x_grid: 1-D plotting inputs ``[N_grid]`` or ``[N_grid, 1]``.
        runs: method name -> sampled outputs ``[n, N_grid]``.
        x_train: training inputs (drawn as points).
        y_train: training targets.
        noise_std: observation noise added to the function variance in the band.
        cols: panels per row.
        title: figure title.
        y_range: shared y-axis range; ``None`` lets plotly choose.
    """
    from plotly.subplots import make_subplots

    names = list(runs)
    rows = (len(names) + cols - 1) // cols
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[style.label(n) for n in names], shared_xaxes=True,
                        shared_yaxes=True, horizontal_spacing=0.03, vertical_spacing=0.12)
    xs = x_grid.reshape(-1).cpu().numpy()
    for k, name in enumerate(names):
        f = runs[name].reshape(runs[name].shape[0], -1).double()
        mean, sd = f.mean(0).cpu().numpy(), (f.var(0) + noise_std**2).sqrt().cpu().numpy()
        r, c = k // cols + 1, k % cols + 1
        col = style.color(name)
        fig.add_trace(go.Scatter(x=np.concatenate([xs, xs[::-1]]), y=np.concatenate([mean + 2 * sd, (mean - 2 * sd)[::-1]]),
                                 fill="toself", fillcolor=style.rgba(col, 0.25), line=dict(width=0),
                                 hoverinfo="skip", showlegend=False), row=r, col=c)
        fig.add_trace(go.Scatter(x=xs, y=mean, mode="lines", line=dict(color=col, width=2), name=name,
                                 showlegend=False), row=r, col=c)
        fig.add_trace(go.Scatter(x=x_train.reshape(-1).cpu().numpy(), y=y_train.reshape(-1).cpu().numpy(),
                                 mode="markers", marker=dict(size=3, color=style.color("data")), showlegend=False,
                                 hoverinfo="skip"), row=r, col=c)
    if y_range is not None:
        fig.update_yaxes(range=list(y_range))
    fig.update_xaxes(title_text="x", row=rows)
    fig.update_yaxes(title_text="y", col=1)
    fig.update_layout(title=title, height=300 * rows + 60)
    return fig


def entropy_maps(grid: Tensor, probs: Mapping[str, Tensor], x: Tensor, y: Tensor, cols: int = 4,
                 title: str = "", zmax: float | None = None) -> go.Figure:
    """Predictive entropy ``H[p(y|x, D)]`` of each method's model average ``probs[name] = [N_grid, C]`` on a
    square 2-D grid, with the data on top; every panel is square (equal scales on the two inputs).

    See chapter 2, "Two moons: where is each method uncertain?".

    Args:
        grid: the square grid of inputs ``[side * side, 2]``, x fastest (as ``Task.grid``).
        probs: method name -> class probabilities on the grid ``[side * side, C]``.
        x: data inputs ``[N, 2]`` drawn on every panel.
        y: data labels ``[N]``.
        cols: panels per row.
        title: figure title.
        zmax: top of the shared colour scale; default ``log C``, the largest possible entropy.
    """
    side = int(round(grid.shape[0] ** 0.5))
    if side * side != grid.shape[0] or grid.dim() != 2 or grid.shape[1] != 2:
        raise ValueError(f"grid must be a square 2-D grid [side * side, 2]; got {tuple(grid.shape)}")
    n_classes = {p.shape[-1] for p in probs.values()}
    if len(n_classes) != 1:
        raise ValueError(f"every method needs the same number of classes; got {sorted(n_classes)}")
    gx = grid[:side, 0].cpu().numpy()
    gy = grid[::side, 1].cpu().numpy()
    z = {name: predictive_entropy(p).view(side, side).cpu().numpy() for name, p in probs.items()}
    zmax = float(np.log(n_classes.pop())) if zmax is None else zmax
    fig = style.heatmap_grid(z, gx, gy, cols=cols, title=title, zmin=0.0, zmax=zmax,
                             points=(x[:, 0].cpu().numpy(), x[:, 1].cpu().numpy(), y.cpu().numpy()))
    # one unit of x1 is as long as one of x2: square panels of the square grid, not stretched to the row
    for k in range(len(z)):
        axis = "" if k == 0 else str(k + 1)
        fig.layout["xaxis" + axis].update(range=[float(gx[0]), float(gx[-1])], constrain="domain")
        fig.layout["yaxis" + axis].update(range=[float(gy[0]), float(gy[-1])], constrain="domain",
                                          scaleanchor="x" + axis, scaleratio=1)
    rows = (len(z) + cols - 1) // cols
    fig.update_layout(height=240 * rows + 130)
    return fig
