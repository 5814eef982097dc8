"""Helpers that put computed numbers into the book's prose.

``glue`` wraps :func:`myst_nb.glue` so that a glued string renders as plain text (myst-nb shows the
``text/plain`` repr, which for a ``str`` would carry quotes), numbers can be formatted on the way in,
and nothing is displayed in the cell.
"""
from __future__ import annotations

from typing import Any


class PlainText(str):
    """A string whose repr is itself, so ``{glue:}`` renders it without quotes."""

    def __repr__(self) -> str:
        return str(self)


def glue(name: str, value: Any, fmt: str | None = None, display: bool = False) -> None:
    """Glue ``value`` under ``name`` for ``{glue:}`name``` in the prose; ``fmt`` formats numbers
    (e.g. ``".3f"``). Tensors and NumPy scalars are converted to Python numbers first. Returns nothing, so
    a ``glue`` call that ends a cell leaves no stray output (``'49,985'``) on the page."""
    from myst_nb import glue as myst_glue

    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    shown = PlainText(format(value, fmt) if fmt else value) if (fmt or isinstance(value, str)) else value
    myst_glue(name, shown, display=display)
