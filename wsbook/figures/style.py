"""The book's plotly style: one template, one colour per method, a few general figure helpers, and a
renderer that works both in JupyterLab (plotly's MIME type) and in the built HTML book (a div drawn by
the ``plotly.min.js`` that :mod:`wsbook.sphinx` ships into the book's ``_static``).

Nothing changes plotly's defaults at import; :func:`setup` does, and the chapters call it (through
:func:`wsbook.experiments.setup_chapter`) in their first cell.
"""
from __future__ import annotations

import hashlib
import json
import textwrap
from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.colors import hex_to_rgb
from plotly.io.base_renderers import MimetypeRenderer

TEMPLATE = "wsbook"
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000",
           "#882255", "#44AA99", "#999933", "#AA4499"]

#: A method keeps its colour in every chapter.
METHOD_COLORS: dict[str, str] = {
    # inference methods
    "hmc": "#000000", "sgld": "#0072B2", "sghmc": "#56B4E9", "vi": "#D55E00", "laplace": "#E69F00",
    "ensemble": "#009E73", "map": "#999999", "sgd_trajectory": "#44AA99",
    # networks trained by Adam, beside the flows in chapter 8 (a hashed colour had been a chart's)
    "adam": "#44AA99",
    # flows over weights, one colour per chart, far apart (wine, indigo, rose: they share figures)
    "flow": "#CC79A7", "euclidean": "#882255", "normalized": "#332288", "geometric": "#CC79A7", "target": "#000000",
    # alignment
    "naive": "#999999", "weight_matching": "#0072B2", "activation_matching": "#009E73", "sinkhorn": "#E69F00",
    "wm_sinkhorn": "#D55E00", "learned": "#CC79A7", "autoencoder": "#CC79A7",
    "learned_sinkhorn": "#882255", "learned_wm": "#AA4499",
    "sinkhorn_l2": "#F0E442", "sinkhorn_midpoint": "#E69F00", "sinkhorn_random": "#999933",
    "sign_aware_weight_matching": "#56B4E9", "variational_matching": "#0072B2", "mixture_path": "#AA4499",
    "same_initialisation": "#000000",
    # models over weights
    "pna": "#0072B2", "relational_transformer": "#D55E00", "mlp": "#999999", "mlp_augmented": "#009E73",
    # couplings
    "independent": "#999999", "ot": "#0072B2",
    "data": "#444444",
}


#: How a method's identifier is written in figures and tables.
METHOD_LABELS: dict[str, str] = {
    "hmc": "HMC", "sgld": "SGLD", "sghmc": "SGHMC", "vi": "mean-field VI", "laplace": "Laplace (GGN)",
    "ensemble": "deep ensemble", "map": "MAP", "sgd_trajectory": "Adam checkpoints", "ot": "OT",
    "weight_matching": "weight matching", "activation_matching": "activation matching",
    "wm_sinkhorn": "weight matching + Sinkhorn", "learned_sinkhorn": "learned + Sinkhorn",
    "learned_wm": "learned + weight matching", "sinkhorn_l2": "Sinkhorn (L2)",
    "sinkhorn_midpoint": "Sinkhorn (midpoint loss)", "sinkhorn_random": "Sinkhorn (random)",
    "sign_aware_weight_matching": "sign-aware weight matching", "pna": "PNA",
    "relational_transformer": "relational transformer", "mlp": "MLP", "mlp_augmented": "MLP (augmented)",
    "kendall_tau": "Kendall τ", "r2": "R²",
    # metric columns
    "nll": "test NLL", "ece": "ECE", "brier": "Brier", "accuracy": "accuracy",
    "agreement": "agreement with HMC", "tv": "total variation to HMC", "seconds": "seconds",
    "nll_diff": "test NLL − baseline's (paired)", "nll_diff_se": "its standard error",
    "nll_share_missed": "NLL share of points all misclassify",
    "mmd2": "MMD²", "mmd_ratio": "MMD² / floor", "nn_train": "distance to nearest training network",
    "nn_train / nn_held": "nearest-neighbour ratio", "w2": "W2", "w2 / floor": "W2 / floor",
    "bma_accuracy": "BMA-64 accuracy", "bma_nll": "BMA-64 NLL", "train_seconds": "training seconds",
}


#: How the words of a flow's identifier (``neuron_euclidean_aligned_ot``) read in a table or legend.
FLOW_WORDS = {"euclidean": "Euclidean", "normalized": "Normalized", "geometric": "Geometric", "gnn": "GNN field",
              "neuron": "neuron field", "channel": "channel field", "flat": "flat field"}


def label(name: str) -> str:
    """The readable name of a method, metric or flow identifier (``sgd_trajectory`` -> ``Adam checkpoints``,
    ``neuron_euclidean_aligned_ot`` -> ``neuron field, Euclidean, aligned + OT``; a trailing ``_from_mean``
    -> ``, source at the mean network``; what follows a comma is kept: ``neuron_euclidean, guided λ=1`` ->
    ``neuron field, Euclidean, guided λ=1``); names that are not identifiers are returned unchanged."""
    name = str(name)
    if name in METHOD_LABELS:
        return METHOD_LABELS[name]
    if ", " in name:
        head, tail = name.split(", ", 1)
        return f"{label(head)}, {tail}"
    words = name.replace("aligned_ot", "aligned + OT").replace("_from_mean", "_source at the mean network").split("_")
    if any(w in ("euclidean", "normalized", "geometric") for w in words):     # a flow: field, chart, variant
        return ", ".join(FLOW_WORDS.get(w, w) for w in words)
    return name.replace("_", " ")


#: The posterior chapter's other rows (:mod:`wsbook.experiments.posterior_flows`), by the names they are
#: shown under: the flows in their charts' colours, the rest each in a colour of its own that no method has.
SERIES_COLORS: dict[str, str] = {
    "euclidean flow": "#882255", "normalized flow": "#332288", "geometric flow": "#CC79A7",
    "flow, draws + density": "#117733", "euclidean flow + reverse KL": "#6699CC",
    "gaussian fit": "#999933", "per-chain gaussians": "#661100", "prior draws": "#BBBBBB",
    "the flow's source": "#DDCC77", "HMC, training run": "#000000",
}


def _key(name: str) -> str:
    return str(name).lower().replace(" ", "_").replace("-", "_")


def color(name: str) -> str:
    """The colour of a method (case- and separator-insensitive), also under its readable label
    (``"mean-field VI"`` is ``vi``'s colour) and of the series in :data:`SERIES_COLORS`; other names get a
    stable palette colour."""
    key = _key(name)
    if key in METHOD_COLORS:
        return METHOD_COLORS[key]
    series = {_key(k): v for k, v in SERIES_COLORS.items()}
    if key in series:
        return series[key]
    labels = {_key(v): k for k, v in METHOD_LABELS.items() if k in METHOD_COLORS}
    if key in labels:
        return METHOD_COLORS[labels[key]]
    return PALETTE[int(hashlib.md5(key.encode()).hexdigest(), 16) % len(PALETTE)]


def rgba(hex_color: str, alpha: float) -> str:
    """A ``#rrggbb`` colour with opacity ``alpha`` as a CSS ``rgba(...)`` string (for filled bands)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1]; got {alpha}")
    r, g, b = hex_to_rgb(hex_color)
    return f"rgba({r},{g},{b},{alpha})"


#: Below this width (pixels of the figure's column) a grid of panels is stacked into one column.
NARROW_PX = 560
#: Number format of hover labels: four significant digits, no trailing zeros, no SI prefixes
#: (``10.83`` rather than ``10.83285p``).
HOVER_FORMAT = ".4~g"

# Panel heights and the gap between stacked panels (subplot title, tick labels, axis title), in pixels.
_STACKED_PANEL_PX = {"xy": 260, "scene": 360}
_STACKED_GAP_PX = 80
# Characters of a figure title per line, and the height of a line, on a narrow screen.
_NARROW_TITLE_CHARS = 34
_TITLE_LINE_PX = 24
_PLOTLY_HEIGHT = 450   # plotly's height of a figure that sets none


def _dom(values) -> tuple[float, float]:
    return (round(float(values[0]), 4), round(float(values[1]), 4))


def _margin(layout: Mapping, side: str, default: int) -> int:
    for source in (layout, (layout.get("template") or {}).get("layout") or {}):
        value = (source.get("margin") or {}).get(side)
        if value is not None:
            return int(value)
    return default


def narrow_relayout(figure: Mapping) -> dict | None:
    """How a figure reflows on a narrow screen: a ``Plotly.relayout`` update that wraps a long title, and
    for side-by-side panels stacks every panel that draws something (cartesian subplot or 3-D scene) into
    one column, top to bottom and left to right, hides the empty ones, moves the subplot titles along,
    gives every panel its tick labels and the axis titles of its row and column, and sets a height that
    keeps each panel readable.

    Returns ``{"on": update, "off": update}`` (``off`` restores the wide layout) or ``None`` when the
    figure has a single column of panels and a short title. :class:`BookRenderer` applies it in the page below
    :data:`NARROW_PX`.

    Args:
        figure: a figure as a plain dict with ``data`` and ``layout`` (``fig.to_dict()``).
    """
    import re

    layout = figure.get("layout") or {}
    used_axes = {str(t.get("xaxis", "x")) for t in figure.get("data") or []}
    used_axes |= {str(t.get("scene", "scene")) for t in figure.get("data") or []}
    panels = []   # (kind, x key, y key, x domain, y domain)
    for key, ax in layout.items():
        if not isinstance(ax, Mapping):
            continue
        if re.fullmatch(r"xaxis\d*", key) and "domain" in ax and not ax.get("overlaying"):
            ykey = "yaxis" + str(ax.get("anchor", "y"))[1:]
            yax = layout.get(ykey)
            if isinstance(yax, Mapping) and str(ax.get("anchor", "y")).startswith("y"):
                panels.append(("xy", key, ykey, _dom(ax["domain"]), _dom(yax.get("domain", (0, 1)))))
        elif re.fullmatch(r"scene\d*", key) and isinstance(ax.get("domain"), Mapping):
            dom = ax["domain"]
            panels.append(("scene", key, None, _dom(dom.get("x", (0, 1))), _dom(dom.get("y", (0, 1)))))
    title = layout.get("title") if isinstance(layout.get("title"), Mapping) else {"text": layout.get("title")}
    text = str(title.get("text") or "")
    wrapped = text if "<br>" in text else "<br>".join(textwrap.wrap(text, _NARROW_TITLE_CHARS))
    grid = len({p[3] for p in panels}) >= 2
    if not grid and wrapped == text:
        return None
    on: dict = {}
    # back to the wide layout with an explicit height: plotly's autosize would keep the narrow one
    off: dict = {"height": layout.get("height") or _PLOTLY_HEIGHT}

    def put(attr: str, value, original) -> None:
        on[attr] = value
        off[attr] = original

    # a long title wraps (plotly never does) and the top margin makes room for its new lines
    extra_top = _TITLE_LINE_PX * (wrapped.count("<br>") - text.count("<br>"))
    top = _margin(layout, "t", 70) + extra_top
    if wrapped != text:
        put("title.text", wrapped, text)
        put("margin.t", top, (layout.get("margin") or {}).get("t"))
    if not grid:
        on["height"] = int(layout.get("height") or _PLOTLY_HEIGHT) + extra_top
        put("title.y", round(1 - 12 / on["height"], 4), title.get("y"))
        return {"on": on, "off": off}

    def drawn(panel) -> bool:
        return ("x" + panel[1][5:] if panel[0] == "xy" else panel[1]) in used_axes

    for kind, xkey, ykey, xdom, ydom in (p for p in panels if not drawn(p)):
        for key in (xkey, ykey) if ykey else (xkey,):   # an empty panel of the grid: out of the way
            put(f"{key}.visible", False, layout[key].get("visible"))
        put(f"{ykey}.domain" if ykey else f"{xkey}.domain.y", [0, 0.001], list(ydom))
    panels = sorted((p for p in panels if drawn(p)), key=lambda p: (-p[4][1], p[3][0]))
    bottom = _margin(layout, "b", 110)
    heights = [_STACKED_PANEL_PX[p[0]] for p in panels]
    area = sum(heights) + _STACKED_GAP_PX * (len(panels) - 1)
    on["height"] = top + bottom + area
    if text:   # the title keeps its distance from the top edge of a much taller figure
        put("title.y", round(1 - 12 / on["height"], 4), title.get("y"))

    def axis_title(ax: Mapping) -> str | None:
        title = ax.get("title")
        return title.get("text") if isinstance(title, Mapping) else title

    used = 0
    for (kind, xkey, ykey, xdom, ydom), height in zip(panels, heights):
        hi = round(1 - used / area, 4)
        lo = round(1 - (used + height) / area, 4)
        used += height + _STACKED_GAP_PX
        if kind == "scene":
            put(f"{xkey}.domain.x", [0, 1], list(xdom))
            put(f"{xkey}.domain.y", [lo, hi], list(ydom))
        else:
            xax, yax = layout[xkey], layout[ykey]
            put(f"{xkey}.domain", [0, 1], list(xdom))
            put(f"{ykey}.domain", [lo, hi], list(ydom))
            for key, ax in ((xkey, xax), (ykey, yax)):
                put(f"{key}.showticklabels", True, ax.get("showticklabels"))
            # axis titles shown once per row (y) or column (x) in the grid go on every stacked panel
            if not axis_title(xax):
                same = [axis_title(layout[p[1]]) for p in panels if p[0] == "xy" and p[3] == xdom]
                if any(same):
                    put(f"{xkey}.title.text", next(t for t in same if t), None)
            if not axis_title(yax):
                same = [axis_title(layout[p[2]]) for p in panels if p[0] == "xy" and p[4] == ydom]
                if any(same):
                    put(f"{ykey}.title.text", next(t for t in same if t), None)
        for i, note in enumerate(layout.get("annotations") or []):
            # make_subplots puts a panel's title at the top centre of its domain, in paper coordinates
            if (note.get("xref", "paper") == "paper" and note.get("yref", "paper") == "paper"
                    and abs(float(note.get("x", -9)) - (xdom[0] + xdom[1]) / 2) < 1e-3
                    and abs(float(note.get("y", -9)) - ydom[1]) < 1e-3):
                put(f"annotations[{i}].x", 0.5, note.get("x"))
                put(f"annotations[{i}].y", hi, note.get("y"))
    return {"on": on, "off": off}


# Runs in the page after Plotly.newPlot ({plot_id}, {narrow} are filled in): below NARROW_PX a grid of
# panels is stacked into one column (and restored above it), and the bottom margin grows until the
# legend below the plot clears the x-axis title. Self-contained: nothing else on the page is needed.
_FIT_JS = """
var gd = document.getElementById('{plot_id}'), narrow = {narrow}, busy = false;
function sized(up) { return Object.assign(up, {width: null, autosize: true}); }
function wsbookFit() {
  if (busy || !gd._fullLayout || !gd.clientWidth) { return; }
  var small = gd.clientWidth < {narrow_px}, up = {};
  if (narrow && small !== !!gd._wsbookNarrow) {   // the switch also drops the legend's extra margin
    gd._wsbookNarrow = small; Object.assign(up, small ? narrow.on : narrow.off);
    up['margin.b'] = gd._fullLayout.margin.b - (gd._wsbookExtra || 0); gd._wsbookExtra = 0;
  }
  busy = true;
  // a new height must not freeze the width: plotly would pin it unless autosize stays on
  Promise.resolve(Object.keys(up).length ? Plotly.relayout(gd, sized(up)) : null).then(function () {
    var L = gd._fullLayout, legend = gd.querySelector('g.legend');
    if (legend && L.showlegend && L.legend.orientation === 'h' && L.legend.yref === 'container') {
      // room below the plot: the margin the figure asked for, or the legend plus the x-axis title
      var extra = gd._wsbookExtra || 0, base = L.margin.b - extra;
      var want = Math.max(0, Math.ceil(legend.getBBox().height) + 85 - base);
      if (want !== extra) {
        gd._wsbookExtra = want;
        return Plotly.relayout(gd, sized({'margin.b': base + want, height: L.height - extra + want}));
      }
    }
  }).then(function () {
    if (gd.parentElement && /px$/.test(gd.parentElement.style.height)) {
      gd.parentElement.style.height = gd._fullLayout.height + 'px';
    }
    busy = false;
  }, function () { busy = false; });
}
wsbookFit();
var wsbookTimer;
window.addEventListener('resize', function () { clearTimeout(wsbookTimer); wsbookTimer = setTimeout(wsbookFit, 150); });
"""


class BookRenderer(MimetypeRenderer):
    """Emit both plotly's JSON MIME type (JupyterLab draws it) and a self-contained HTML div
    (the book draws it with the ``Plotly`` global; no require.js, no CDN).

    The HTML figure is responsive: it follows the width of its column, stacks side-by-side panels into
    one column below :data:`NARROW_PX` (:func:`narrow_relayout`), and keeps its legend below the plot.
    """

    def to_mimebundle(self, fig_dict):
        fig_json = json.loads(pio.to_json(fig_dict, validate=False, remove_uids=False))
        narrow = narrow_relayout(fig_json)
        script = (_FIT_JS.replace("{narrow_px}", str(NARROW_PX))
                  .replace("{narrow}", json.dumps(narrow) if narrow else "null"))
        html = pio.to_html(fig_dict, include_plotlyjs=False, include_mathjax=False, full_html=False,
                           validate=False, config={"displaylogo": False, "responsive": True},
                           post_script=script)
        return {"application/vnd.plotly.v1+json": {"data": fig_json.get("data", []),
                                                    "layout": fig_json.get("layout", {}),
                                                    "config": {"displaylogo": False}},
                "text/html": html}


def setup() -> None:
    """Register the book's template and renderer and make them plotly's defaults.

    The one place that changes plotly's global state; importing :mod:`wsbook` never does. Chapters call
    it through :func:`wsbook.experiments.setup_chapter`; call it yourself to get the book's look elsewhere.
    """
    template = go.layout.Template(pio.templates["plotly_white"])
    template.layout.colorway = PALETTE
    template.layout.font = dict(family="Helvetica, Arial, sans-serif", size=13)
    template.layout.margin = dict(l=60, r=20, t=50, b=50)
    # Legends below the plot (they keep their place at phone width), titles clear of the toolbar.
    template.layout.legend = dict(bgcolor="rgba(255,255,255,0.6)", orientation="h", yref="container",
                                  y=0.0, yanchor="bottom", x=0.0, xanchor="left")
    template.layout.margin = dict(l=60, r=20, t=70, b=110)
    template.layout.title = dict(y=0.97, yanchor="top", x=0.0, xanchor="left")
    # Hover labels with a few significant digits and no SI prefixes, on every kind of axis.
    for axis in ("xaxis", "yaxis"):
        template.layout[axis].hoverformat = HOVER_FORMAT
    for axis in ("xaxis", "yaxis", "zaxis"):
        template.layout.scene[axis].hoverformat = HOVER_FORMAT
    for kind in ("heatmap", "contour", "histogram2d", "histogram2dcontour"):
        template.data[kind] = [{"zhoverformat": HOVER_FORMAT}]
    pio.templates[TEMPLATE] = template
    pio.templates.default = TEMPLATE
    pio.renderers[TEMPLATE] = BookRenderer()
    pio.renderers.default = TEMPLATE


def curves_with_bands(x: Sequence[float] | np.ndarray, curves: Mapping[str, tuple], *, title: str = "",
                      xaxis: str = "", yaxis: str = "", alpha: float = 0.2) -> go.Figure:
    """Lines with shaded bands, one per entry of ``curves``, each in its method's colour.

    See chapter 5, "Experiment 1: aligning a zoo of digit classifiers" (loss along the segment).

    Args:
        x: the shared x values.
        curves: name -> ``(mean, lower, upper)``, or ``(mean,)`` for a line without band.
        title: figure title.
        xaxis: x-axis title.
        yaxis: y-axis title.
        alpha: opacity of the bands.
    """
    x = np.asarray(x)
    fig = go.Figure()
    for name, values in curves.items():
        c = color(name)
        mean = np.asarray(values[0])
        if len(values) == 3:
            lo, hi = np.asarray(values[1]), np.asarray(values[2])
            fig.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]), y=np.concatenate([hi, lo[::-1]]),
                                     mode="lines", fill="toself", fillcolor=rgba(c, alpha), line=dict(width=0),
                                     hoverinfo="skip", showlegend=False, legendgroup=name))
        fig.add_trace(go.Scatter(x=x, y=mean, mode="lines", name=label(name), line=dict(color=c, width=2),
                                 legendgroup=name))
    fig.update_layout(title=title, xaxis_title=xaxis, yaxis_title=yaxis)
    return fig


def heatmap_grid(z: Mapping[str, np.ndarray], x: np.ndarray, y: np.ndarray, *, cols: int = 3, title: str = "",
                 colorscale: str = "Viridis", zmin: float | None = None, zmax: float | None = None,
                 points: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None, xaxis: str = "x<sub>1</sub>",
                 yaxis: str = "x<sub>2</sub>") -> go.Figure:
    """One heatmap per entry of ``z`` on a shared colour scale, with optional points on every panel.

    See chapter 1, "Agreement on the data, disagreement away from it".

    Args:
        z: panel title -> values ``[len(y), len(x)]``.
        x: column coordinates.
        y: row coordinates.
        cols: panels per row.
        title: figure title.
        colorscale: a plotly colour scale name.
        zmin: bottom of the shared colour scale (default: the smallest value of all panels).
        zmax: top of the shared colour scale (default: the largest value of all panels).
        points: ``(px, py, labels)`` drawn as a scatter on every panel, coloured by label.
        xaxis: x-axis title of every panel.
        yaxis: y-axis title of the first panel of every row.
    """
    from plotly.subplots import make_subplots

    names = list(z)
    rows = (len(names) + cols - 1) // cols
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[label(n) for n in names], horizontal_spacing=0.04,
                        vertical_spacing=0.16)
    zmin = min(float(np.min(v)) for v in z.values()) if zmin is None else zmin
    zmax = max(float(np.max(v)) for v in z.values()) if zmax is None else zmax
    for k, name in enumerate(names):
        r, c = k // cols + 1, k % cols + 1
        fig.add_trace(go.Heatmap(z=z[name], x=x, y=y, colorscale=colorscale, zmin=zmin, zmax=zmax,
                                 showscale=(k == 0)), row=r, col=c)
        if points is not None:
            px, py, labels = points
            fig.add_trace(go.Scatter(x=px, y=py, mode="markers", showlegend=False,
                                     marker=dict(size=4, color=labels, colorscale=[[0, "white"], [1, "black"]],
                                                 line=dict(width=0.5, color="grey"))), row=r, col=c)
    fig.update_xaxes(title_text=xaxis)
    fig.update_yaxes(title_text=yaxis, col=1)
    fig.update_layout(title=title, height=330 * rows + 60)
    return fig


def scene3d(fig: go.Figure | None = None, *, title: str = "", aspect: str = "cube", height: int = 550,
            axis_range: tuple[float, float] | None = (-1.15, 1.15)) -> go.Figure:
    """A 3-D figure with the book's scene defaults (equal axes, no background grid clutter).

    ``aspectmode="cube"`` draws the three axes with equal *length*, so a unit sphere is only round when the
    three axes also have equal *ranges*; ``axis_range`` fixes them (``None``: plotly's autorange per axis).

    Args:
        fig: a figure to style (default: a new one).
        title: figure title.
        aspect: plotly's ``scene.aspectmode``.
        height: figure height in pixels.
        axis_range: the common range of the x, y and z axes.
    """
    fig = fig or go.Figure()
    axis = dict(showbackground=False, zeroline=False)
    if axis_range is not None:
        axis["range"] = list(axis_range)
    fig.update_layout(title=title, height=height,
                      scene=dict(aspectmode=aspect, xaxis=axis, yaxis=axis, zaxis=axis),
                      margin=dict(l=0, r=0, t=50, b=60))
    return fig


def sphere_surface(radius: float = 1.0, n: int = 40, opacity: float = 0.25) -> go.Surface:
    """A translucent sphere to draw points and curves on."""
    u, v = np.meshgrid(np.linspace(0, 2 * np.pi, n), np.linspace(0, np.pi, n))
    return go.Surface(x=radius * np.cos(u) * np.sin(v), y=radius * np.sin(u) * np.sin(v), z=radius * np.cos(v),
                      opacity=opacity, showscale=False, colorscale=[[0, "#d0d7e1"], [1, "#d0d7e1"]],
                      hoverinfo="skip")
