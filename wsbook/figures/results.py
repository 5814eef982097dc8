"""Figures of the results pages (chapter 8): what generated networks look like beside their targets.

* :func:`first_layer_images`: every hidden neuron's incoming weights of an image classifier drawn as an
  image (MNIST page: digit detectors, repeated neurons after width transfer).
* :func:`accuracy_histograms`: per-network test accuracy of several sets of networks, one panel each.
* :func:`pca_projection` / :func:`pca_scatter`: sets of networks on the first principal components of one
  of them (MNIST page: training runs, validation runs and flow samples in the aligned canonical space).
* :func:`predictive_scatter`: one model average's predictive probability against a reference's, test point
  by test point (posterior page: a flow and VI against HMC).
* :func:`reliability` / :func:`reliability_diagram`: confidence bins against accuracy, with the binning
  of :func:`wsbook.bayes.metrics.ece`.
* :func:`training_curves` / :func:`accuracy_along_training`: flows' training losses against the step, and
  the accuracy of networks sampled from copies of a field kept during training (MNIST page).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from wsbook.figures import style
from wsbook.nets import CNNSpec, MLPSpec


def _color(name: str, colors: Mapping[str, str] | None) -> str:
    return (colors or {}).get(name) or style.color(name)


def neuron_tiles(spec: MLPSpec | CNNSpec, theta: Tensor, cols: int | None = None, gap: int = 1) -> np.ndarray:
    """The first layer's incoming weights of networks ``theta [n, D]`` as one image of tiles.

    Every hidden neuron's ``widths[0]`` weights (a square number: 784 for 28x28 images) become one square
    tile; for a CNN with one input channel, every filter of the first convolution is one tile. A tile is
    divided by its largest absolute weight so that every tile spans ``[-1, 1]`` and the pattern, not the
    scale, is compared (canonical networks carry a neuron's scale elsewhere). Each network fills
    ``ceil(H / cols)`` rows of ``cols`` tiles, networks one below the other; ``gap`` rows and columns of
    NaN (drawn blank) separate the tiles.

    Returns an array ``[rows * (side + gap) - gap, cols * (side + gap) - gap]``.

    Args:
        spec: the architecture (an MLP's input must be a square image; a CNN's, one channel).
        theta: the networks.
        cols: tiles per row (default: the hidden width).
        gap: blank pixels between tiles.
    """
    theta = spec.check(theta).detach().cpu().float()
    if isinstance(spec, CNNSpec):
        if spec.in_channels != 1:
            raise ValueError(f"neuron_tiles: draws the filters of one input channel; got {spec.in_channels}")
        side = spec.kernel_size
        w = spec.weights(theta)[0].flatten(2)                                   # [n, C, k * k]
    else:
        side = int(round(spec.widths[0] ** 0.5))
        if side * side != spec.widths[0]:
            raise ValueError(f"neuron_tiles: {spec.widths[0]} inputs are not a square image")
        w = spec.weights(theta)[0]                                              # [n, H, side * side]
    n, h = w.shape[:2]
    cols = h if cols is None else int(cols)
    if cols < 1:
        raise ValueError(f"neuron_tiles: cols must be positive; got {cols}")
    scale = w.abs().amax(-1, keepdim=True).clamp_min(1e-12)
    tiles = (w / scale).reshape(n, h, side, side).numpy()
    per_net = -(-h // cols)
    step = side + gap
    image = np.full((n * per_net * step - gap, cols * step - gap), np.nan)
    for i in range(n):
        for j in range(h):
            r, c = i * per_net + j // cols, j % cols
            image[r * step:r * step + side, c * step:c * step + side] = tiles[i, j]
    return image


def first_layer_images(sets: Mapping[str, tuple[MLPSpec | CNNSpec, Tensor]], *, cols: int | Mapping[str, int] | None = None,
                       title: str = "", colorscale: str = "RdBu_r") -> go.Figure:
    """One panel per set of networks, each hidden neuron's incoming weights drawn as an image
    (:func:`neuron_tiles`), on one diverging colour scale centred at 0 (red positive, blue negative).

    See chapter 8, the MNIST page ("first layers").

    Args:
        sets: panel title -> ``(spec, networks [n, D])``; draw a few networks per set.
        cols: tiles per row, for every set or per set name (default: the set's hidden width).
        title: figure title.
        colorscale: a diverging plotly colour scale.
    """
    names = list(sets)
    images = {}
    for name in names:
        spec, theta = sets[name]
        c = cols.get(name) if isinstance(cols, Mapping) else cols
        images[name] = neuron_tiles(spec, theta, c)
    heights = [im.shape[0] for im in images.values()]
    fig = make_subplots(rows=len(names), cols=1, subplot_titles=[style.label(n) for n in names],
                        row_heights=heights, vertical_spacing=0.3 / len(names))
    for k, name in enumerate(names, 1):
        im = images[name]
        fig.add_trace(go.Heatmap(z=im[::-1], colorscale=colorscale, zmin=-1, zmax=1, zmid=0,
                                 showscale=k == 1, hoverongaps=False,
                                 colorbar=dict(title="weight / largest", thickness=12, len=0.5)),
                      row=k, col=1)
        suffix = "" if k == 1 else str(k)
        fig.update_xaxes(visible=False, constrain="domain", row=k, col=1)
        fig.update_yaxes(visible=False, scaleanchor=f"x{suffix}", scaleratio=1, constrain="domain", row=k, col=1)
    widest = max(im.shape[1] for im in images.values())
    fig.update_layout(title=title, height=int(130 + 560 * sum(heights) / widest + 30 * len(names)),
                      margin=dict(b=30), plot_bgcolor="white")
    return fig


def accuracy_histograms(accuracies: Mapping[str, np.ndarray | Tensor], *, title: str = "", bin_size: float = 0.01,
                        xaxis: str = "test accuracy of one network",
                        colors: Mapping[str, str] | None = None) -> go.Figure:
    """Per-network accuracies of several sets, one histogram panel per set on a shared x axis, each in its
    method's colour, with the set's mean as a dashed dark line.

    See chapter 8, the MNIST page (per-network accuracy).

    Args:
        accuracies: panel title -> accuracies ``[n]``.
        title: figure title.
        bin_size: width of a bin.
        xaxis: x-axis title.
        colors: colour per set (default: :func:`wsbook.figures.style.color`).
    """
    names = list(accuracies)
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, subplot_titles=[style.label(n) for n in names],
                        vertical_spacing=0.4 / max(len(names), 1))
    values = {n: np.asarray(torch.as_tensor(a).detach().cpu().double()) for n, a in accuracies.items()}
    lo = min(float(v.min()) for v in values.values())
    hi = max(float(v.max()) for v in values.values())
    start = np.floor(lo / bin_size) * bin_size
    for k, name in enumerate(names, 1):
        v = values[name]
        c = _color(name, colors)
        fig.add_trace(go.Histogram(x=v, xbins=dict(start=start, end=hi + bin_size, size=bin_size), marker_color=c,
                                   name=style.label(name), showlegend=False), row=k, col=1)
        fig.add_vline(x=float(v.mean()), line=dict(color="#333333", dash="dash", width=1.5), row=k, col=1)
    fig.update_yaxes(title_text="networks", nticks=3)
    fig.update_xaxes(title_text=xaxis, row=len(names), col=1)
    fig.update_layout(title=title, height=130 + 115 * len(names), bargap=0.05, margin=dict(b=60))
    return fig


def relative_losses(losses: Tensor | np.ndarray, smooth: int | None = None) -> np.ndarray:
    """A training loss ``[steps]`` over the mean of its first tenth of steps, as a moving average over
    ``smooth`` steps (default: a fiftieth of the run, at least one): where a run ends below 1 its loss fell."""
    v = np.asarray(torch.as_tensor(losses).detach().cpu().double()).reshape(-1)
    if v.size == 0 or not np.isfinite(v).all():
        raise ValueError("relative_losses: the losses must be a non-empty run of finite numbers")
    w = max(1, v.size // 50) if smooth is None else int(smooth)
    if w < 1:
        raise ValueError(f"relative_losses: smooth must be a positive number of steps; got {smooth}")
    avg = np.convolve(v, np.ones(w) / w, mode="valid")
    return avg / v[: max(1, v.size // 10)].mean()


def training_curves(losses: Mapping[str, Tensor | np.ndarray], *, title: str = "",
                    colors: Mapping[str, str] | None = None) -> go.Figure:
    """Flow-matching losses of several trained fields against the training step, each over its own first
    tenth of steps (:func:`relative_losses`, log scale): fields trained on different charts have losses in
    different units, and what the figure compares is how far and how fast each fell.

    See the MNIST page (chapter 8b).

    Args:
        losses: method -> training losses ``[steps]`` (:attr:`wsbook.weightflow.FitResult.losses`).
        title: figure title.
        colors: colour per method (default: :func:`wsbook.figures.style.color`).
    """
    fig = go.Figure()
    for name, run in losses.items():
        y = relative_losses(run)
        x = np.arange(y.size) + (np.asarray(run).size - y.size) // 2 + 1
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=style.label(name),
                                 line=dict(color=_color(name, colors), width=1.8)))
    fig.add_hline(y=1.0, line=dict(color="#999999", dash="dot"))
    fig.update_layout(title=title, xaxis_title="training step", yaxis_title="loss / loss over the first tenth",
                      yaxis_type="log", height=440)
    return fig


def accuracy_along_training(runs: Mapping[str, Mapping[str, Tensor | np.ndarray]], *,
                            reference: float | None = None, reference_name: str = "training checkpoints",
                            band: str = "se", title: str = "", yaxis: str = "validation accuracy",
                            colors: Mapping[str, str] | None = None) -> go.Figure:
    """The accuracy of networks sampled from copies of a field kept during training against the step at
    which each copy was kept: the mean over a copy's networks, with a band of one standard error of that
    mean (``band="se"``) or one standard deviation of the networks (``"std"``), on a log step axis, and a
    dotted reference line (e.g. the target zoo's mean accuracy).

    See the MNIST page (chapter 8b).

    Args:
        runs: method -> ``{"steps": [K], "accuracy": [K, n]}`` (every sampled network's accuracy at each of
            the K copies; :func:`wsbook.experiments.mnist_flows.accuracy_along_training`).
        reference: the reference accuracy, or ``None`` for no line.
        reference_name: what the reference is, for its label.
        band: ``"se"`` or ``"std"``.
        title: figure title.
        yaxis: y-axis title.
        colors: colour per method (default: :func:`wsbook.figures.style.color`).
    """
    if band not in ("se", "std"):
        raise ValueError(f"accuracy_along_training: band must be 'se' or 'std'; got {band!r}")
    fig = go.Figure()
    for name, run in runs.items():
        steps = np.asarray(torch.as_tensor(run["steps"]).detach().cpu().double()).reshape(-1)
        acc = np.asarray(torch.as_tensor(run["accuracy"]).detach().cpu().double())
        if acc.ndim != 2 or acc.shape[0] != steps.size or acc.shape[1] < 1:
            raise ValueError(f"accuracy_along_training: {name}'s accuracy must be [K={steps.size}, n >= 1] "
                             f"(networks of each copy); got {acc.shape}")
        mean = acc.mean(1)
        spread = acc.std(1, ddof=1) if acc.shape[1] > 1 else np.zeros_like(mean)
        half = spread / np.sqrt(acc.shape[1]) if band == "se" else spread
        c = _color(name, colors)
        fig.add_trace(go.Scatter(x=np.concatenate([steps, steps[::-1]]),
                                 y=np.concatenate([mean + half, (mean - half)[::-1]]), mode="lines", fill="toself",
                                 fillcolor=style.rgba(c, 0.2), line=dict(width=0), hoverinfo="skip",
                                 showlegend=False, legendgroup=name))
        fig.add_trace(go.Scatter(x=steps, y=mean, mode="lines+markers", name=style.label(name), legendgroup=name,
                                 line=dict(color=c, width=2), marker=dict(size=6, color=c),
                                 customdata=np.stack([half, np.full_like(mean, acc.shape[1])], 1),
                                 hovertemplate="step %{x:.0f}<br>accuracy %{y:.3f} ± %{customdata[0]:.3f}"
                                 "<br>%{customdata[1]:.0f} networks<extra></extra>"))
    if reference is not None:
        fig.add_hline(y=float(reference), line=dict(color="#555555", dash="dot"),
                      annotation_text=f"{reference_name}: {float(reference):.3f}", annotation_position="top left")
    what = "standard error" if band == "se" else "standard deviation of the networks"
    fig.update_layout(title=title, xaxis=dict(title="training step (log scale)", type="log"),
                      yaxis=dict(title=f"{yaxis} (mean ± {what})"), height=440)
    return fig


def pca_projection(fit: Tensor, sets: Mapping[str, Tensor], k: int = 2) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Project sets of points on the first ``k`` principal components of ``fit [N, D]``.

    The components come from the singular value decomposition of ``fit`` centred on its mean
    (:func:`torch.linalg.svd`); every set is centred on the same mean. Returns ``({name: [n, k]},
    explained)``, ``explained [k]`` the fraction of ``fit``'s variance along each component.

    Args:
        fit: the points that define the components (e.g. a zoo's training networks).
        sets: name -> points ``[n, D]`` in the same space (``fit`` itself may be one of them).
        k: number of components.
    """
    x = fit.detach().cpu().double()
    if x.ndim != 2 or not 1 <= k <= min(x.shape):
        raise ValueError(f"pca_projection: fit must be [N, D] with N, D >= k; got {tuple(x.shape)}, k={k}")
    mean = x.mean(0)
    _, s, vh = torch.linalg.svd(x - mean, full_matrices=False)
    explained = (s[:k] ** 2 / (s ** 2).sum()).numpy()
    out = {}
    for name, points in sets.items():
        p = points.detach().cpu().double()
        if p.ndim != 2 or p.shape[1] != x.shape[1]:
            raise ValueError(f"pca_projection: {name} must be [n, {x.shape[1]}]; got {tuple(p.shape)}")
        out[name] = ((p - mean) @ vh[:k].T).numpy()
    return out, explained


def pca_scatter(points: Mapping[str, np.ndarray], explained: Sequence[float], *, title: str = "",
                sizes: Mapping[str, int] | None = None, colors: Mapping[str, str] | None = None) -> go.Figure:
    """The first two principal coordinates of every set (:func:`pca_projection`), one colour per set,
    axis titles with the fraction of variance each component explains.

    Args:
        points: name -> coordinates ``[n, 2]`` (or more; the first two are drawn).
        explained: the variance fractions of the components.
        title: figure title.
        sizes: marker size per set name (default 6).
        colors: colour per set (default: :func:`wsbook.figures.style.color`).
    """
    fig = go.Figure()
    for k, (name, p) in enumerate(points.items()):
        size = (sizes or {}).get(name, 6)
        fig.add_trace(go.Scatter(x=p[:, 0], y=p[:, 1], mode="markers", name=style.label(name),
                                 marker=dict(size=size, color=_color(name, colors), opacity=0.75,
                                             line=dict(width=0.5, color="white"))))
    fig.update_layout(title=title, xaxis_title=f"PC 1 ({100 * explained[0]:.0f} % of the variance)",
                      yaxis_title=f"PC 2 ({100 * explained[1]:.0f} % of the variance)", height=500)
    return fig


def predictive_scatter(reference: np.ndarray | Tensor, panels: Mapping[str, np.ndarray | Tensor], *,
                       reference_name: str = "HMC", title: str = "", quantity: str = "p(y = 1 | x)",
                       colors: Mapping[str, str] | None = None) -> go.Figure:
    """One point per test input: a method's predictive probability (y) against the reference's (x), one
    panel per method, with the diagonal where the two agree.

    See chapter 8, the posterior page.

    Args:
        reference: the reference's probabilities ``[N]`` (e.g. HMC's model average of one class).
        panels: method -> its probabilities ``[N]`` at the same inputs.
        reference_name: the reference, for the x-axis title.
        title: figure title.
        quantity: what is plotted, for the axis titles.
        colors: colour per method (default: :func:`wsbook.figures.style.color`).
    """
    ref = np.asarray(torch.as_tensor(reference).detach().cpu().double())
    names = list(panels)
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=[style.label(n) for n in names],
                        shared_yaxes=True, horizontal_spacing=0.06)
    for k, name in enumerate(names, 1):
        p = np.asarray(torch.as_tensor(panels[name]).detach().cpu().double())
        if p.shape != ref.shape:
            raise ValueError(f"predictive_scatter: {name} has shape {p.shape}, the reference {ref.shape}")
        fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(color="#999999", dash="dot"),
                                 hoverinfo="skip", showlegend=False), row=1, col=k)
        fig.add_trace(go.Scatter(x=ref, y=p, mode="markers", name=style.label(name), showlegend=False,
                                 marker=dict(size=6, color=_color(name, colors), opacity=0.7)), row=1, col=k)
        fig.update_xaxes(title_text=f"{reference_name}: {quantity}", range=[-0.02, 1.02], row=1, col=k)
    fig.update_yaxes(title_text=f"method: {quantity}", range=[-0.02, 1.02], row=1, col=1)
    fig.update_layout(title=title, height=430)
    return fig


def reliability(p: Tensor, y: Tensor, n_bins: int = 10) -> dict[str, np.ndarray]:
    """Confidence bins of a predictive ``p [N, C]`` with labels ``y [N]``, binned as
    :func:`wsbook.bayes.metrics.ece` bins them (``n_bins`` equal-width bins of the top-class probability).

    Returns ``{"confidence", "accuracy", "count"}`` for the non-empty bins (mean confidence and accuracy
    in each) and ``"ece"``: ``sum_bins (count / N) |accuracy - confidence|``, which equals
    ``metrics.ece(p, y, n_bins)``.
    """
    if p.ndim != 2 or y.shape != p.shape[:1]:
        raise ValueError(f"reliability: p must be [N, C] and y [N]; got {tuple(p.shape)}, {tuple(y.shape)}")
    p, y = p.detach().cpu().double(), y.detach().cpu()
    confidence, predicted = p.max(-1)
    correct = (predicted == y).double()
    bins = (confidence * n_bins).long().clamp_(0, n_bins - 1)
    count = torch.bincount(bins, minlength=n_bins).double()
    conf = torch.bincount(bins, confidence, minlength=n_bins)
    acc = torch.bincount(bins, correct, minlength=n_bins)
    keep = count > 0
    out = {"confidence": (conf[keep] / count[keep]).numpy(), "accuracy": (acc[keep] / count[keep]).numpy(),
           "count": count[keep].numpy()}
    out["ece"] = np.array(float((acc - conf).abs().sum() / len(y)))
    return out


def reliability_diagram(curves: Mapping[str, Mapping[str, np.ndarray]], *, title: str = "",
                        colors: Mapping[str, str] | None = None) -> go.Figure:
    """Accuracy against mean confidence per bin (:func:`reliability`) for several predictives, each in its
    method's colour, marker area proportional to the bin's share of the test points, with the diagonal
    of a calibrated predictive.

    Args:
        curves: method -> the output of :func:`reliability`.
        title: figure title.
        colors: colour per method (default: :func:`wsbook.figures.style.color`).
    """
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(color="#999999", dash="dot"),
                             name="calibrated", hoverinfo="skip"))
    lo = 1.0
    for name, r in curves.items():
        share = r["count"] / r["count"].sum()
        lo = min(lo, float(r["confidence"].min()), float(r["accuracy"].min()))
        fig.add_trace(go.Scatter(x=r["confidence"], y=r["accuracy"], mode="lines+markers",
                                 name=f"{style.label(name)} (ECE {float(r['ece']):.3f})",
                                 customdata=r["count"], hovertemplate="confidence %{x:.3f}<br>accuracy %{y:.3f}"
                                 "<br>%{customdata:.0f} test points<extra></extra>",
                                 line=dict(color=_color(name, colors)),
                                 marker=dict(size=6 + 30 * np.sqrt(share), color=_color(name, colors),
                                             opacity=0.8)))
    edge = max(0.0, np.floor(lo * 10) / 10 - 0.05)
    fig.update_layout(title=title, xaxis=dict(title="mean confidence in the bin", range=[edge, 1.02]),
                      yaxis=dict(title="accuracy in the bin", range=[edge, 1.02]), height=480,
                      legend=dict(itemsizing="constant"))
    return fig
