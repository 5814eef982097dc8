"""Figures of chapter 7 (the method): the geometry of canonical networks and where a field reads a neuron.

* :func:`rescaling_orbit`: one ReLU neuron rescaled by every ``a > 0`` (a curve in weight space) and the
  single point of its sphere that normalisation sends the whole curve to.
* :func:`geodesic_and_chord`: a geodesic conditional path on S^2 with its velocities, beside the straight
  chord between the same end points.
* :func:`product_path`: the conditional path of a whole network on the product of spheres times the
  Euclidean last layer: one arc per neuron, straight lines for the last layer.
* :func:`neuron_in_graph`: a network's neural graph (:func:`~wsbook.figures.draw_neural_graph`) with one
  hidden neuron's node, incoming and outgoing edges highlighted.
* :func:`decision_panels`: a grid of two-input classifiers, each drawn as its probability of class 1 over
  the plane with the data on top (trained networks beside networks sampled from a flow).
* :func:`flow_in_motion`: the same picture for a few networks along the flow's time ``t``, as plotly frames
  with a slider and a play button (pure JavaScript: it moves in the static HTML book without a kernel).

The functions draw what they are given; the chapter computes the points with :mod:`wsbook.manifolds`,
:mod:`wsbook.symmetry` and :mod:`wsbook.flows`.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from wsbook.figures import style
from wsbook.figures.flows import arrow3d, to_numpy
from wsbook.figures.graphs import draw_neural_graph

_AXIS3D = dict(showbackground=False, zeroline=False, range=[-1.15, 1.15])


def _line3d(p: np.ndarray, name: str, color: str, *, width: int = 5, dash: str | None = None,
            legend: bool = True, group: str | None = None) -> go.Scatter3d:
    return go.Scatter3d(x=p[:, 0], y=p[:, 1], z=p[:, 2], mode="lines", name=name, showlegend=legend,
                        legendgroup=group or name, line=dict(color=color, width=width, dash=dash),
                        hoverinfo="skip")


def _points3d(p: np.ndarray, name: str, color: str, *, size: int = 5, symbol: str = "circle",
              text: list[str] | None = None, legend: bool = True) -> go.Scatter3d:
    return go.Scatter3d(x=p[:, 0], y=p[:, 1], z=p[:, 2], mode="markers+text" if text else "markers",
                        text=text, name=name, showlegend=legend,
                        marker=dict(size=size, color=color, symbol=symbol))


def rescaling_orbit(scales: Tensor, incoming: Tensor, outgoing: Tensor, canonical_in: Tensor,
                    canonical_out: Tensor, *, title: str = "") -> go.Figure:
    """One hidden ReLU neuron of a two-input network along its rescaling orbit, in two panels.

    Left: its incoming weights and bias ``(w_1, w_2, b)`` for every scale ``a`` (a ray from the origin),
    the unit sphere, and the canonical point where the ray meets it. Right: the norm of ``(w_1, w_2, b)``
    against the norm of the outgoing weights (a hyperbola: their product is fixed), with the canonical
    point at norm 1. See chapter 7, "Three charts".

    Args:
        scales: the scales ``a`` ``[A]`` (positive).
        incoming: the neuron's ``[w_1, w_2, b]`` at every scale ``[A, 3]``.
        outgoing: its outgoing weights at every scale ``[A, C]``.
        canonical_in: the normalised network's ``[w_1, w_2, b]`` ``[3]`` (on the sphere).
        canonical_out: the normalised network's outgoing weights ``[C]``.
        title: figure title.
    """
    a, w, v = to_numpy(scales), to_numpy(incoming), to_numpy(outgoing)
    if w.ndim != 2 or w.shape[1] != 3 or len(a) != len(w) or len(v) != len(w):
        raise ValueError(f"rescaling_orbit: expected [A], [A, 3] and [A, C]; got {a.shape}, {w.shape}, {v.shape}")
    c_in, c_out = to_numpy(canonical_in).reshape(3), to_numpy(canonical_out).reshape(-1)
    fig = make_subplots(rows=1, cols=2, specs=[[{"type": "scene"}, {"type": "xy"}]], column_widths=[0.55, 0.45],
                        subplot_titles=["incoming weights and bias (w1, w2, b)",
                                        "incoming norm against outgoing norm"])
    fig.add_trace(style.sphere_surface(), row=1, col=1)
    orbit_color, canon_color = style.color("flow"), "#000000"
    hover = [f"a = {s:.3g}" for s in a]
    fig.add_trace(go.Scatter3d(x=w[:, 0], y=w[:, 1], z=w[:, 2], mode="lines+markers", name="orbit, a > 0",
                               legendgroup="orbit", text=hover, hoverinfo="text",
                               line=dict(color=orbit_color, width=4),
                               marker=dict(size=2.5, color=np.log(a), colorscale="Viridis")), row=1, col=1)
    fig.add_trace(_points3d(c_in[None], "canonical point (norm 1)", canon_color, size=7, symbol="diamond"),
                  row=1, col=1)
    r_in, r_out = np.linalg.norm(w, axis=1), np.linalg.norm(v, axis=1)
    fig.add_trace(go.Scatter(x=r_in, y=r_out, mode="lines+markers", name="orbit, a > 0", legendgroup="orbit",
                             showlegend=False, text=hover, line=dict(color=orbit_color, width=2),
                             marker=dict(size=4, color=np.log(a), colorscale="Viridis")), row=1, col=2)
    fig.add_trace(go.Scatter(x=[float(np.linalg.norm(c_in))], y=[float(np.linalg.norm(c_out))], mode="markers",
                             name="canonical point (norm 1)", showlegend=False,
                             marker=dict(size=11, color=canon_color, symbol="diamond")), row=1, col=2)
    fig.add_trace(go.Scatter(x=[1.0, 1.0], y=[float(r_out.min()), float(r_out.max())], mode="lines",
                             name="norm 1", showlegend=False, hoverinfo="skip",
                             line=dict(color="#999999", dash="dot", width=1)), row=1, col=2)
    fig.update_xaxes(title_text="|(w1, w2, b)|", type="log", row=1, col=2)
    fig.update_yaxes(title_text="|outgoing weights|", type="log", row=1, col=2)
    reach = max(1.15, float(np.abs(w).max()) * 1.05)
    axis = dict(_AXIS3D, range=[-reach, reach])
    fig.update_scenes(aspectmode="cube", xaxis=dict(axis, title="w1"), yaxis=dict(axis, title="w2"),
                      zaxis=dict(axis, title="b"))
    fig.update_layout(title=title, height=500)
    return fig


def geodesic_and_chord(geodesic: Tensor, chord: Tensor, marks: Tensor, velocities: Tensor,
                       chord_velocity: Tensor, *, title: str = "") -> go.Figure:
    """A geodesic path on S^2 and the straight chord between its end points.

    The geodesic is drawn on the sphere with the velocity ``u_t`` at a few of its points (tangent arrows);
    the chord cuts through the ball, with its one constant velocity ``x_1 - x_0`` drawn at its midpoint.
    See chapter 7, "The conditional path on the product of spheres".

    Args:
        geodesic: the path ``x_t`` on a time grid ``[T, 3]`` (first row ``x_0``, last row ``x_1``).
        chord: the straight line ``(1 - t) x_0 + t x_1`` on the same grid ``[T, 3]``.
        marks: points of the geodesic where the velocity is drawn ``[K, 3]``.
        velocities: the velocities ``u_t`` at ``marks`` ``[K, 3]``.
        chord_velocity: ``x_1 - x_0`` ``[3]``.
        title: figure title.
    """
    g, c, m, u = to_numpy(geodesic), to_numpy(chord), to_numpy(marks), to_numpy(velocities)
    fig = style.scene3d(go.Figure(style.sphere_surface()), title=title, height=540)
    fig.add_trace(_line3d(g, "geodesic x_t = exp_x0(t log_x0 x1)", style.color("geometric"), width=7))
    fig.add_trace(_line3d(c, "chord (1 - t) x0 + t x1", style.color("euclidean"), width=4, dash="dash"))
    scale = 0.25 / max(float(np.linalg.norm(u, axis=1).max()), 1e-9)       # arrows of a readable length
    for k in range(len(m)):
        arrow3d(fig, m[k], scale * u[k], "#0072B2", "velocity u_t (tangent)", legend=k == 0)
    mid = c[len(c) // 2]
    arrow3d(fig, mid, scale * to_numpy(chord_velocity).reshape(3), "#D55E00", "chord velocity x1 - x0")
    fig.add_trace(_points3d(np.stack([g[0], g[-1]]), "end points", "#000000", size=5, text=["x0", "x1"]))
    return fig


def product_path(sphere_paths: Tensor, last_layer: Tensor, times: Tensor, *, title: str = "") -> go.Figure:
    """The conditional path of one network on the product of spheres times a Euclidean last layer.

    Left: every hidden neuron's ``(w_1, w_2, b)`` travels its own great-circle arc of S^2 (start grey,
    end in the neuron's colour). Right: every coordinate of the last layer against ``t``, straight lines.
    See chapter 7, "The conditional path on the product of spheres".

    Args:
        sphere_paths: the neurons' points on the time grid ``[T, n, 3]``.
        last_layer: the last layer's coordinates on the time grid ``[T, m]``.
        times: the time grid ``[T]``.
        title: figure title.
    """
    p, last, t = to_numpy(sphere_paths), to_numpy(last_layer), to_numpy(times)
    if p.ndim != 3 or p.shape[2] != 3 or last.shape[0] != p.shape[0] or len(t) != p.shape[0]:
        raise ValueError(f"product_path: expected [T, n, 3], [T, m] and [T]; got {p.shape}, {last.shape}, {t.shape}")
    fig = make_subplots(rows=1, cols=2, specs=[[{"type": "scene"}, {"type": "xy"}]], column_widths=[0.55, 0.45],
                        subplot_titles=["hidden neurons: one arc per sphere", "last layer: straight in t"])
    fig.add_trace(style.sphere_surface(), row=1, col=1)
    for j in range(p.shape[1]):
        c = style.PALETTE[j % len(style.PALETTE)]
        fig.add_trace(_line3d(p[:, j], f"neuron {j}", c, width=5, legend=False), row=1, col=1)
        fig.add_trace(_points3d(p[-1:, j], f"neuron {j}", c, size=4, legend=False), row=1, col=1)
    fig.add_trace(_points3d(p[0], "x0 (source)", "#999999", size=3), row=1, col=1)
    for i in range(last.shape[1]):
        fig.add_trace(go.Scatter(x=t, y=last[:, i], mode="lines", showlegend=False, hoverinfo="skip",
                                 line=dict(color=style.rgba(style.color("euclidean"), 0.7), width=1.5)),
                      row=1, col=2)
    fig.update_xaxes(title_text="t", row=1, col=2)
    fig.update_yaxes(title_text="last-layer coordinate", row=1, col=2)
    fig.update_scenes(aspectmode="cube", xaxis=dict(_AXIS3D, title="w1"), yaxis=dict(_AXIS3D, title="w2"),
                      zaxis=dict(_AXIS3D, title="b"))
    fig.update_layout(title=title, height=480)
    return fig


def neuron_in_graph(graph, theta: Tensor, layer: int, index: int, *, title: str = "") -> go.Figure:
    """A network's neural graph with hidden neuron ``index`` of node layer ``layer`` highlighted: its node
    (ringed), its incoming edges and its outgoing edges (thick, one colour each). These are the numbers the
    neuron field reads as one vector; the graph network reads each edge as its own feature.
    See chapter 7, "The vector field".

    Args:
        graph: the :class:`wsbook.graphs.NeuralGraph` of the network's spec.
        theta: one network ``[D]`` or ``[1, D]``.
        layer: the node layer of the neuron (1 to ``len(widths) - 2``: a hidden layer).
        index: the neuron's index within its layer.
        title: figure title.
    """
    widths = list(graph.widths)
    if not 0 < layer < len(widths) - 1 or not 0 <= index < widths[layer]:
        raise ValueError(f"neuron_in_graph: no hidden neuron {index} in node layer {layer} of widths {widths}")
    fig = draw_neural_graph(graph, theta, title=title)
    node_layer = graph.node_layer.numpy()
    pos = np.concatenate([np.arange(w) - (w - 1) / 2 for w in widths])
    node = int(np.nonzero(node_layer == layer)[0][index])
    src, dst = graph.edge_index.numpy()
    for sel, name, c in ((dst == node, "incoming weights", "#000000"), (src == node, "outgoing weights", "#E69F00")):
        ids = np.nonzero(sel)[0]
        ex = np.stack([node_layer[src[ids]], node_layer[dst[ids]], np.full(len(ids), np.nan)], 1).ravel()
        ey = np.stack([pos[src[ids]], pos[dst[ids]], np.full(len(ids), np.nan)], 1).ravel()
        fig.add_trace(go.Scatter(x=ex.astype(float), y=ey, mode="lines", name=name, hoverinfo="skip",
                                 line=dict(color=c, width=4)))
    fig.add_trace(go.Scatter(x=[float(layer)], y=[pos[node]], mode="markers", name="the neuron and its bias",
                             hoverinfo="skip", marker=dict(size=22, color="rgba(0,0,0,0)",
                                                           line=dict(color="#000000", width=3))))
    fig.update_layout(showlegend=True)
    return fig


#: class 0 blue, undecided white, class 1 vermilion (the book's palette)
_CLASS_COLORS = ("#0072B2", "#D55E00")
_P1_SCALE = [[0.0, _CLASS_COLORS[0]], [0.5, "#FFFFFF"], [1.0, _CLASS_COLORS[1]]]


def _square_grid(grid: Tensor) -> tuple[np.ndarray, np.ndarray, int]:
    g = to_numpy(grid)
    side = int(round(len(g) ** 0.5))
    if g.ndim != 2 or g.shape[1] != 2 or side * side != len(g):
        raise ValueError(f"expected a square 2-D grid [side * side, 2], x fastest; got {g.shape}")
    return g[:side, 0], g[::side, 1], side


def _percent(p1: np.ndarray, side: int) -> np.ndarray:
    """p(class 1) in whole percent as bytes: a figure's frames stay a quarter of their float32 size."""
    return np.clip(np.rint(100.0 * p1.reshape(side, side)), 0, 100).astype(np.uint8)


def _p1_contour(z: np.ndarray, gx: np.ndarray, gy: np.ndarray, *, showscale: bool) -> go.Contour:
    return go.Contour(z=z, x=gx.astype(np.float32), y=gy.astype(np.float32), zmin=0, zmax=100, colorscale=_P1_SCALE,
                      showscale=showscale,
                      contours=dict(coloring="heatmap", start=50, end=50, size=1, showlabels=False),
                      line=dict(color="#000000", width=1.5), name="p(class 1)",
                      colorbar=dict(title=dict(text="p(class 1), %"), len=0.8, thickness=12),
                      hovertemplate="x1 %{x:.2f}, x2 %{y:.2f}: p(class 1) %{z} %<extra></extra>")


def _data_points(x: Tensor, y: Tensor) -> go.Scatter:
    px, labels = to_numpy(x).astype(np.float32), to_numpy(y).astype(np.uint8)
    return go.Scatter(x=px[:, 0], y=px[:, 1], mode="markers", showlegend=False, hoverinfo="skip",
                      marker=dict(size=3.5, color=labels, cmin=0, cmax=1, showscale=False,
                                  colorscale=[[0.0, _CLASS_COLORS[0]], [1.0, _CLASS_COLORS[1]]],
                                  line=dict(width=0.5, color="#FFFFFF")))


def _square_panels(fig: go.Figure, n: int, cols: int, gx: np.ndarray, gy: np.ndarray) -> None:
    """Equal x and y scales on every panel (a circle of the plane stays round), axes tight on the grid,
    y tick labels on the first column only (they would run into the panel on their left)."""
    for k in range(n):
        suffix = "" if k == 0 else str(k + 1)
        fig.layout["xaxis" + suffix].update(range=[float(gx[0]), float(gx[-1])], constrain="domain")
        fig.layout["yaxis" + suffix].update(range=[float(gy[0]), float(gy[-1])], constrain="domain",
                                            scaleanchor="x" + suffix, scaleratio=1,
                                            showticklabels=k % cols == 0)


def decision_panels(grid: Tensor, p1: Mapping[str, Tensor], x: Tensor, y: Tensor, *, cols: int = 4,
                    title: str = "") -> go.Figure:
    """Two-input binary classifiers side by side: each panel is one network's probability of class 1 over
    the plane (blue class 0, white undecided, vermilion class 1; the black line is its decision boundary,
    ``p = 0.5``), with the data points on top, on equal x and y scales.

    See chapter 7, "Two-moons networks from a flow".

    Args:
        grid: the square grid of inputs ``[side * side, 2]``, x fastest (as ``Task.grid``).
        p1: panel title -> the network's ``p(class 1)`` on the grid ``[side * side]``.
        x: data inputs ``[N, 2]`` drawn on every panel.
        y: data labels ``[N]`` (0 or 1).
        cols: panels per row.
        title: figure title.
    """
    gx, gy, side = _square_grid(grid)
    names = list(p1)
    rows = (len(names) + cols - 1) // cols
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=names, horizontal_spacing=0.03,
                        vertical_spacing=0.14)
    for k, name in enumerate(names):
        r, c = k // cols + 1, k % cols + 1
        fig.add_trace(_p1_contour(_percent(to_numpy(p1[name]), side), gx, gy, showscale=k == 0), row=r, col=c)
        fig.add_trace(_data_points(x, y), row=r, col=c)
    _square_panels(fig, len(names), cols, gx, gy)
    fig.update_xaxes(title_text="x<sub>1</sub>", row=rows)
    fig.update_yaxes(title_text="x<sub>2</sub>", col=1)
    fig.update_layout(title=title, height=235 * rows + 150, showlegend=False)
    return fig


def flow_in_motion(grid: Tensor, p1: Tensor, times: Tensor, x: Tensor, y: Tensor, *,
                   names: Sequence[str] | None = None, title: str = "") -> go.Figure:
    """A few networks along a flow, from their source points (``t = 0``) to the sampled networks
    (``t = 1``): one panel per network showing its ``p(class 1)`` over the plane as in
    :func:`decision_panels`, one plotly frame per time, a slider over ``t`` and a play button.

    The frames carry only the probabilities (whole percent, one byte per grid point); the slider and the
    animation are plotly.js, so the figure moves in the static HTML book. See chapter 7, "Two-moons
    networks from a flow".

    Args:
        grid: the square grid of inputs ``[side * side, 2]``, x fastest.
        p1: ``p(class 1)`` of every network at every time on the grid ``[T, n, side * side]``.
        times: the times of the frames ``[T]`` (increasing, from 0 to 1).
        x: data inputs ``[N, 2]`` drawn on every panel.
        y: data labels ``[N]`` (0 or 1).
        names: panel titles (default ``network 1`` ... ``network n``).
        title: figure title.
    """
    gx, gy, side = _square_grid(grid)
    p, t = to_numpy(p1), to_numpy(times).reshape(-1)
    if p.ndim != 3 or p.shape[2] != side * side or p.shape[0] != len(t):
        raise ValueError(f"flow_in_motion: expected p1 [T, n, {side * side}] and times [T]; got {p.shape}, {t.shape}")
    n = p.shape[1]
    names = list(names) if names is not None else [f"network {k + 1}" for k in range(n)]
    if len(names) != n:
        raise ValueError(f"flow_in_motion: {len(names)} names for {n} networks")
    fig = make_subplots(rows=1, cols=n, subplot_titles=names, horizontal_spacing=0.03)
    for k in range(n):           # traces 0, 2, 4, ...: the contours; 1, 3, ...: the data
        fig.add_trace(_p1_contour(_percent(p[0, k], side), gx, gy, showscale=k == 0), row=1, col=k + 1)
        fig.add_trace(_data_points(x, y), row=1, col=k + 1)
    contours = [2 * k for k in range(n)]
    labels = [f"{s:.2f}".rstrip("0").rstrip(".") if s not in (0.0, 1.0) else f"{s:.0f}" for s in t]
    fig.frames = [go.Frame(name=labels[i], traces=contours,
                           data=[go.Contour(z=_percent(p[i, k], side)) for k in range(n)])
                  for i in range(len(t))]
    _square_panels(fig, n, n, gx, gy)
    fig.update_xaxes(title_text="x<sub>1</sub>")
    fig.update_yaxes(title_text="x<sub>2</sub>", col=1)

    def play(duration: int) -> dict:   # contours are redrawn, not tweened
        return dict(frame=dict(duration=duration, redraw=True), mode="immediate", fromcurrent=True,
                    transition=dict(duration=0))

    fig.update_layout(
        title=title, height=430, showlegend=False, margin=dict(b=150),
        sliders=[dict(active=0, x=0.08, len=0.92, y=0, yanchor="top", pad=dict(t=60),
                      currentvalue=dict(prefix="t = ", xanchor="right", font=dict(size=14)),
                      steps=[dict(method="animate", label=s, args=[[s], play(0)]) for s in labels])],
        updatemenus=[dict(type="buttons", direction="left", showactive=False, x=0.0, y=0, xanchor="left",
                          yanchor="top", pad=dict(t=72, r=10),
                          buttons=[dict(label="▶", method="animate", args=[None, play(350)])])],
    )
    return fig


__all__ = ["rescaling_orbit", "geodesic_and_chord", "product_path", "neuron_in_graph", "decision_panels",
           "flow_in_motion"]
