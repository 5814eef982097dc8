"""The benchmark results rendered by the appendix "Performance": ``benchmarks/results.csv``, written by
``make bench`` (``benchmarks/run_all.py``) with the machine and the date it ran on.
"""
from __future__ import annotations

from pathlib import Path

#: where ``make bench`` writes its results (the repository's ``benchmarks/`` folder)
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results.csv"


def read_results(path: str | Path | None = None) -> tuple["object", dict[str, str]]:
    """The benchmark lines as a pandas DataFrame (``script, name, ours, baseline, ratio, against``; the values
    as the scripts printed them, ``ratio`` ``-`` where a line reports an agreement rather than a speed) and
    the machine description (``date``, ``platform``, ``processor``, ``cpu_count``, ...).

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
    table = pd.read_csv(path, comment="#", skipinitialspace=True, dtype=str)
    expected = ["script", "name", "ours", "baseline", "ratio", "against"]
    if list(table.columns) != expected:
        raise ValueError(f"{path}: expected the columns {expected}; got {list(table.columns)}")
    for column in ("ours", "baseline"):
        bad = [v for v in table[column] if not _is_number(v)]
        if bad:
            raise ValueError(f"{path}: column {column!r} must hold numbers; got {bad[:3]}")
    for key in ("date", "platform", "cpu_count"):
        if key not in machine:
            raise ValueError(f"{path}: the header does not say the machine's {key!r}; rerun `make bench`")
    return table, machine


def _is_number(value: str) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


__all__ = ["RESULTS", "read_results"]
