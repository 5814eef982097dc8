"""Figures of the flow chapters 3 and 4: trajectories in the plane and geometry and samples on S^2."""
from __future__ import annotations

from typing import Mapping

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from wsbook.figures import style
from wsbook.manifolds import Sphere

Tensor = torch.Tensor


def to_numpy(x: Tensor | np.ndarray) -> np.ndarray:
    """A tensor (or array) as a NumPy array on the CPU, detached."""
    return torch.as_tensor(x).detach().cpu().numpy()


def trajectories_2d(trajectories: Mapping[str, Tensor], n_show: int = 60, height: int = 430,
                    target: Tensor | None = None, n_target: int = 600) -> go.Figure:
    """One panel per entry of ``trajectories`` ([T+1, B, 2] each): paths in the method's colour, start
    points grey, end points black, and (given ``target`` [M, 2]) samples of the target behind them.

    See chapter 3, "Training with two couplings".

    Args:
        trajectories: name -> ``[T+1, B, 2]`` positions on a time grid.
        n_show: paths drawn per panel.
        height: figure height in pixels.
        target: samples of the target distribution, drawn in light orange under the paths.
        n_target: how many target samples to draw.
    """
    names = list(trajectories)
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names, horizontal_spacing=0.06)
    for col, name in enumerate(names, start=1):
        if target is not None:
            tgt = to_numpy(target[:n_target])
            fig.add_trace(go.Scatter(x=tgt[:, 0], y=tgt[:, 1], mode="markers", name="target samples",
                                     marker=dict(size=4, color=style.rgba("#E69F00", 0.35)),
                                     showlegend=col == 1, hoverinfo="skip"), row=1, col=col)
        traj = to_numpy(trajectories[name][:, :n_show])
        xs = np.concatenate([np.append(traj[:, i, 0], np.nan) for i in range(traj.shape[1])])
        ys = np.concatenate([np.append(traj[:, i, 1], np.nan) for i in range(traj.shape[1])])
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=style.color(name), width=1),
                                 opacity=0.6, name=f"{name} paths", showlegend=False), row=1, col=col)
        fig.add_trace(go.Scatter(x=traj[0, :, 0], y=traj[0, :, 1], mode="markers", name="x0 (source)",
                                 marker=dict(size=4, color="#999999"), showlegend=col == 1), row=1, col=col)
        fig.add_trace(go.Scatter(x=traj[-1, :, 0], y=traj[-1, :, 1], mode="markers", name="x1 (generated)",
                                 marker=dict(size=4, color="#000000"), showlegend=col == 1), row=1, col=col)
        fig.update_xaxes(scaleanchor=f"y{col if col > 1 else ''}", title_text="x<sub>1</sub>", row=1, col=col)
        fig.update_yaxes(title_text="x<sub>2</sub>" if col == 1 else None, row=1, col=col)
    fig.update_layout(height=height)
    return fig


def arrow3d(fig: go.Figure, base: np.ndarray, vec: np.ndarray, color: str, name: str, legend: bool = True) -> None:
    """Add the vector ``vec`` drawn from the point ``base`` (both ``[3]``) to a 3-D figure: a line and a cone."""
    tip = base + vec
    fig.add_trace(go.Scatter3d(x=[base[0], tip[0]], y=[base[1], tip[1]], z=[base[2], tip[2]], mode="lines",
                               line=dict(color=color, width=6), name=name, showlegend=legend, legendgroup=name))
    fig.add_trace(go.Cone(x=[tip[0]], y=[tip[1]], z=[tip[2]], u=[vec[0]], v=[vec[1]], w=[vec[2]], sizemode="absolute",
                          sizeref=0.08, anchor="tip", showscale=False, colorscale=[[0, color], [1, color]],
                          hoverinfo="skip", legendgroup=name, showlegend=False))


def sphere_geometry(x: Tensor, u: Tensor, w: Tensor, n_transport: int = 5, title: str = "") -> go.Figure:
    """The sphere S^2 with a point ``x``, a tangent vector ``u`` at x, the geodesic t -> exp_x(t u) to
    y = exp_x(u), log_y(x) at y, and a vector ``w`` parallel-transported along the geodesic.

    See chapter 4, "A short review of Riemannian geometry".

    Args:
        x: a point on S^2 ``[1, 3]``.
        u: a tangent vector at ``x`` ``[1, 3]``.
        w: the tangent vector at ``x`` that is transported ``[1, 3]``.
        n_transport: number of points along the geodesic where the transported ``w`` is drawn.
        title: figure title.
    """
    s = Sphere(3)
    tips = torch.cat([x, s.expmap(x, u)]).abs().max().item() + float(u.norm()) + float(w.norm())
    reach = max(1.15, min(tips, 2.5))          # equal ranges on all axes keep the sphere round
    fig = style.scene3d(go.Figure(style.sphere_surface()), title=title, height=560, axis_range=(-reach, reach))
    ts = torch.linspace(0, 1, 60)[:, None]
    curve = to_numpy(s.expmap(x.expand(60, 3), ts * u))
    fig.add_trace(go.Scatter3d(x=curve[:, 0], y=curve[:, 1], z=curve[:, 2], mode="lines",
                               line=dict(color="#000000", width=5), name="geodesic exp_x(t u)"))
    y = s.expmap(x, u)
    arrow3d(fig, to_numpy(x[0]), to_numpy(u[0]), "#0072B2", "u in T_x M")
    arrow3d(fig, to_numpy(y[0]), to_numpy(s.logmap(y, x)[0]), "#D55E00", "log_y(x) in T_y M")
    for k, t in enumerate(torch.linspace(0, 1, n_transport)):
        p = s.expmap(x, t * u)
        arrow3d(fig, to_numpy(p[0]), to_numpy(s.transp(x, p, w)[0]), "#009E73", "parallel transport of w",
                legend=k == 0)
    pts = to_numpy(torch.cat([x, y]))
    fig.add_trace(go.Scatter3d(x=pts[:, 0], y=pts[:, 1], z=pts[:, 2], mode="markers+text", text=["x", "y"],
                               marker=dict(size=5, color="#000000"), name="points"))
    return fig


def sphere_samples(samples: Mapping[str, Tensor], n_show: int = 1500, title: str = "") -> go.Figure:
    """Point clouds on S^2 (one colour per entry)."""
    fig = style.scene3d(go.Figure(style.sphere_surface(opacity=0.15)), title=title)
    for name, x in samples.items():
        p = to_numpy(x[:n_show])
        fig.add_trace(go.Scatter3d(x=p[:, 0], y=p[:, 1], z=p[:, 2], mode="markers", name=name,
                                   marker=dict(size=2, color=style.color(name), opacity=0.7)))
    return fig
