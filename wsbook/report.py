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


def timed_on() -> str:
    """Where a timing taken now runs, in words for a table's heading or the prose: ``"one CPU thread"``,
    ``"2 CPU threads"`` or ``"the GPU (NVIDIA H200)"`` (:func:`wsbook.device`, torch's thread count)."""
    import torch

    from wsbook import config

    device = config.device()
    if device.type == "cuda":
        return f"the GPU ({torch.cuda.get_device_name(device)})"
    if device.type != "cpu":
        return f"the {device.type} device"
    threads = torch.get_num_threads()
    return "one CPU thread" if threads == 1 else f"{threads} CPU threads"


def pm(row, column: str, digits: int) -> str:
    """``"mean ± se"`` of a table row holding ``column`` and ``column + "_se"``, to ``digits`` decimals."""
    return f"{row[column]:.{digits}f} ± {row[column + '_se']:.{digits}f}"


def verdict_display(table, columns: dict[str, tuple[str, int]], verdicts: list[str], chosen: str | None = None,
                    label=lambda k: k, axis: str = "test runs"):
    """A verdict table as the book shows it: a column ``seeds``, one ``"mean ± se"`` column per entry of
    ``columns`` (``{column: (heading, digits)}``), then the ``verdicts`` columns as they are; rows named by
    ``label(row)``, the ``chosen`` row marked "chosen flow: ", the index named ``axis``."""
    import pandas as pd

    shown = pd.DataFrame({"seeds": table["seeds"].astype(int),
                          **{head: [pm(r, col, digits) for _, r in table.iterrows()]
                             for col, (head, digits) in columns.items()}}, index=table.index).join(table[verdicts])
    shown.index = [f"chosen flow: {label(k)}" if k == chosen else label(k) for k in shown.index]
    return shown.rename_axis(axis)
