"""Run every ``benchmarks/bench_*.py`` (or those whose names contain one of the arguments) one after another
and write their ``name, ours, baseline, ratio`` lines, with the machine and the date, to ``results.csv``.

Usage: ``python benchmarks/run_all.py [substring ...] [--out PATH]`` (``make bench`` runs all of them). Each script
runs in its own process with progress bars off (``WSBOOK_PROGRESS=0``: the MAP, HMC and training loops of the
benchmarks would draw theirs between the lines); its output is echoed as it comes. A script that fails (for
example an agreement check between wsbook and a peer library) is reported, the others still run, and the exit
status is 1.

``results.csv`` starts with ``# key: value`` lines (date, platform, processor, CPU count, Python, torch and
the peer libraries' versions, and the environment variable ``BENCH_NOTE`` when set) followed by one row per printed line: ``script, name, ours, baseline,
ratio, against`` where ``against`` is the third column's header of the script (``peer`` for the comparisons
with other libraries, ``baseline`` for wsbook's own loops) and ``ratio`` is as the script defines it (for the
peer scripts: peer time / our time, so > 1 means wsbook is faster). The appendix "Performance" of the book
renders this file.
"""
from __future__ import annotations

import csv
import datetime as dt
import importlib.metadata as md
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = ("torch", "torch-geometric", "scipy", "lap", "pot", "pyro-ppl", "laplace-torch", "posteriors", "geoopt",
         "torchcfm")


def machine() -> dict[str, str]:
    """Where and when the benchmarks ran."""
    import torch

    versions = []
    for name in PEERS:
        try:
            versions.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    cpu = platform.processor() or platform.machine()
    try:      # the model name is more telling than the architecture on Linux
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    note = {"note": os.environ["BENCH_NOTE"]} if os.environ.get("BENCH_NOTE") else {}
    return {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "platform": platform.platform(), "processor": cpu, "cpu_count": str(os.cpu_count()),
            "torch_threads": str(torch.get_num_threads()), "python": platform.python_version(),
            "versions": "; ".join(versions),
            "device": "cuda: " + torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", **note}


def parse(script: str, output: str) -> list[dict[str, str]]:
    """The ``name, ours, baseline, ratio`` lines of one script's output (a header line names the third column)."""
    rows, against = [], "baseline"
    for line in output.splitlines():
        parts = [p.strip() for p in line.rsplit(",", 3)]
        if len(parts) != 4:
            continue
        if parts[1] == "ours":                       # a header: "name, ours, peer, ratio"
            against = parts[2]
            continue
        try:
            float(parts[1]), float(parts[2])
        except ValueError:
            continue
        rows.append(dict(script=script, name=parts[0], ours=parts[1], baseline=parts[2], ratio=parts[3],
                         against=against))
    return rows


def run_script(script: Path) -> tuple[int, str]:
    """Run one benchmark script in its own process without progress bars, echoing its output as it comes;
    its exit status and output."""
    env = {**os.environ, "WSBOOK_PROGRESS": "0"}
    proc = subprocess.Popen([sys.executable, str(script)], cwd=HERE, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    return proc.wait(), "".join(lines)


def main(argv: list[str]) -> int:
    out = HERE / "results.csv"
    if "--out" in argv:
        i = argv.index("--out")
        out = Path(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    scripts = sorted(HERE.glob("bench_*.py"))
    if argv:
        scripts = [s for s in scripts if any(a in s.name for a in argv)]
    rows, failed = [], []
    for script in scripts:
        print(f"== {script.name}", flush=True)
        code, output = run_script(script)
        if code != 0:
            failed.append(script.name)
            continue
        rows.extend(parse(script.stem, output))
    with open(out, "w", newline="") as f:
        for key, value in machine().items():
            f.write(f"# {key}: {value}\n")
        writer = csv.DictWriter(f, ["script", "name", "ours", "baseline", "ratio", "against"])
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} lines to {out}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
