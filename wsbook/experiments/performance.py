"""The benchmark results rendered by the appendix "Performance": ``benchmarks/results.csv``, written by
``make bench`` (``benchmarks/run_all.py``) with the machine and the date it ran on.
"""
from __future__ import annotations

from pathlib import Path

#: where ``make bench`` writes its results (the repository's ``benchmarks/`` folder)
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results.csv"


def read_results(path: str | Path | None = None) -> tuple["object", dict[str, str]]:
    """The benchmark lines as a pandas DataFrame (``script, name, ours, baseline, ratio, against``; ``ours``
    and ``baseline`` as numbers, ``ratio`` as printed, ``-`` where a line reports an agreement rather than a
    speed) and the machine description (``date``, ``platform``, ``processor``, ``cpu_count``, ...).

    Args:
        path: the results file (default :data:`RESULTS`).
    """
    import pandas as pd

    path = Path(path) if path is not None else RESULTS
    if not path.is_file():
        raise FileNotFoundError(f"no benchmark results at {path}; run `make bench` to write them")
    machine = {}
    for line in path.read_text().splitlines():
        if line.startswith("# ") and ": " in line:
            key, value = line[2:].split(": ", 1)
            machine[key] = value
    table = pd.read_csv(path, comment="#", skipinitialspace=True, dtype={"ratio": str})
    expected = ["script", "name", "ours", "baseline", "ratio", "against"]
    if list(table.columns) != expected:
        raise ValueError(f"{path}: expected the columns {expected}; got {list(table.columns)}")
    for key in ("date", "platform", "cpu_count"):
        if key not in machine:
            raise ValueError(f"{path}: the header does not say the machine's {key!r}; rerun `make bench`")
    return table, machine


__all__ = ["RESULTS", "read_results"]
