"""``make book``: jupyter-book 1.x's build with the chapters executed several at a time.

jupyter-book executes each notebook while Sphinx reads it, one document after another, and the chapters
run torch on one thread (its small kernels run fastest so). On a machine with two cores a build used half
of it. Sphinx can read documents in parallel processes; :func:`main` switches that on (``jobs`` processes,
``WSBOOK_BOOK_JOBS``, default: up to 2 of the machine's cores) and hands the documents to the processes
one at a time, the longest first by the run times recorded in ``book/chapter_times.csv`` at the build's
scale, so that the processes finish at about the same time. Chapters that need the same cached artifact do
not compute it twice: the one that comes second waits for the first (:func:`wsbook.cache.computing`).

Usage: ``python -m wsbook.book [jupyter-book build arguments]``, e.g. ``python -m wsbook.book . -W``.
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from wsbook.sphinx import CHAPTER_TIMES, read_chapter_times


def default_jobs() -> int:
    """``WSBOOK_BOOK_JOBS`` if set, else the machine's cores, at most 2 (the chapters' caches are shared,
    so more processes mostly wait for each other)."""
    text = os.environ.get("WSBOOK_BOOK_JOBS", "").strip()
    if text:
        jobs = int(text)
        if jobs < 1:
            raise ValueError(f"WSBOOK_BOOK_JOBS must be a positive integer; got {text!r}")
        return jobs
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(2, cores))


def reading_order(docnames: list[str], seconds: dict[str, float], jobs: int) -> list[list[str]]:
    """One chunk per document, arranged so that Sphinx's parallel tasks start them the longest first
    (``seconds`` by file stem, e.g. ``07_method``; documents without a recorded time come last, in their
    order): longest-processing-time-first scheduling over ``jobs`` processes.

    ``sphinx.util.parallel.ParallelTasks`` starts the first ``jobs`` tasks at once and keeps the others
    waiting in a dict it pops from the end (last in, first out), so the list handed to it is the wanted
    start order with everything after the first ``jobs`` reversed (``tests/test_reader.py`` checks the
    start order Sphinx produces)."""
    def cost(doc: str) -> float:
        return seconds.get(doc.rsplit("/", 1)[-1], 0.0)

    wanted = [[doc] for doc in sorted(docnames, key=cost, reverse=True)]
    return wanted[:jobs] + wanted[jobs:][::-1]


def recorded_seconds(root: Path, scale: str) -> dict[str, float]:
    """``{chapter stem: seconds}`` at ``scale`` from the book's run-time file (empty if it has none)."""
    path = root / CHAPTER_TIMES
    if not path.exists():
        return {}
    times = read_chapter_times(path)
    return {ch: float(row[scale]["seconds"]) for ch, row in times.items()
            if scale in row and row[scale]["seconds"] is not None}


#: Extensions of the build that are safe for parallel reading and writing but do not say so (Sphinx then
#: reads serially, with a warning, an error under ``-W``): ``sphinx_multitoc_numbering`` (loaded by
#: jupyter-book) replaces how section numbers are assigned, which Sphinx does in the main process after
#: reading; ``sphinx-mathjax-offline`` copies MathJax into the output when the build has finished;
#: ``sphinx_jupyterbook_latex`` (loaded by jupyter-book) acts only in LaTeX builds.
UNDECLARED_SAFE = ("sphinx_multitoc_numbering", "sphinx-mathjax-offline", "sphinx_jupyterbook_latex")


def _declare_parallel_safe(module: str) -> None:
    """Make the extension ``module``'s ``setup`` declare it parallel-safe (see :data:`UNDECLARED_SAFE`)."""
    import importlib

    ext = importlib.import_module(module)
    setup = ext.setup
    if getattr(setup, "wsbook_parallel_safe", False):
        return

    @functools.wraps(setup)
    def declared(app):
        return {**(setup(app) or {}), "parallel_read_safe": True, "parallel_write_safe": True}

    declared.wsbook_parallel_safe = True
    ext.setup = declared


def main(argv: list[str] | None = None, jobs: int | None = None) -> int:
    """Run ``jupyter-book build <argv>`` with ``jobs`` reading processes (see the module docstring)."""
    import sphinx.builders
    from jupyter_book import sphinx as jb_sphinx
    from jupyter_book.cli.main import main as jupyter_book

    argv = list(sys.argv[1:] if argv is None else argv)
    jobs = default_jobs() if jobs is None else jobs
    if jobs > 1:
        # two chapters on two cores: each kernel's torch takes one thread (set before the kernels start)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        root = Path(next((a for a in argv if not a.startswith("-")), ".")).resolve()
        seconds = recorded_seconds(root, os.environ.get("WSBOOK_SCALE", "default").strip().lower())
        for module in UNDECLARED_SAFE:
            _declare_parallel_safe(module)

        def chunks(docnames, nproc, maxbatch=10):
            return reading_order(list(docnames), seconds, nproc)

        sphinx.builders.make_chunks = chunks
        jb_sphinx.build_sphinx = functools.partial(jb_sphinx.build_sphinx, jobs=jobs)
    try:
        jupyter_book(["build", *argv])
    except SystemExit as stop:      # click ends every run with sys.exit
        return stop.code if isinstance(stop.code, int) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
