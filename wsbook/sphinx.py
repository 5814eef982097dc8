"""Sphinx extension used by the book build: ship ``plotly.min.js`` with the HTML (no CDN, no require.js).

Figures rendered by :class:`wsbook.plots.BookRenderer` are plain divs plus a ``Plotly.newPlot`` call,
so the library must be loaded, synchronously, before the page body; this extension copies the copy of
plotly.js that ships with the installed ``plotly`` package into ``_static`` and links it in ``<head>``.
"""
from __future__ import annotations

import shutil
from pathlib import Path


def _plotly_js() -> Path:
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.exists():
        raise FileNotFoundError(f"plotly.min.js not found in the installed plotly package ({path})")
    return path


def _copy_plotly(app, exc) -> None:
    if exc is None and app.builder.format == "html":
        static = Path(app.outdir) / "_static"
        static.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_plotly_js(), static / "plotly.min.js")


def setup(app):
    # Keep plotly from reconfiguring the page's MathJax (it only needs MathJax for LaTeX labels).
    app.add_js_file(None, body="window.PlotlyConfig = {MathJaxConfig: 'local'};", priority=100)
    app.add_js_file("plotly.min.js", priority=101)
    app.connect("build-finished", _copy_plotly)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
