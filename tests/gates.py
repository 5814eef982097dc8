"""The gates of `make test`, each timed: unit tests, chapters, the book build, the browser.

Usage: ``python tests/gates.py [unit|chapters|book|browser ...]`` (no argument: all, in that order).
Chapters run at ``ci`` scale unless ``WSBOOK_SCALE`` is set (the Makefile sets ``ci``); the chapters gate and
the book build share one cache directory so the book build reuses what the chapters gate computed.

The chapters gate runs every chapter under nbval (a cell that raises fails it). When the book gate follows
in the same run (``make test``), the chapters execute once, in the book build, which fails on a cell that
raises just as nbval does (``nb_execution_raise_on_error``): running them under nbval as well would execute
every chapter twice.

The unit tests, the notebooks and the browser checks run in pytest-xdist workers, one per CPU core up to 4
(``WSBOOK_TEST_WORKERS`` overrides; 0 runs them in one process); with more than one worker every worker's
torch runs on one thread (``OMP_NUM_THREADS=1``), since thread pools of several kernels on the same cores
spin against each other.

With ``WSBOOK_STRICT_CHAPTERS=1`` (``make test`` sets it) the chapters gate first runs ``python -m wsbook`` for
the command-line groups of the selected chapters (``chapter/02``, ``chapter/05``, ``chapter/06``, ``chapter/08``,
``chapter/08b``, ``chapter/08c``, ``chapter/08d``, ``chapter/09``) into the gate's cache directory, then runs the
chapters (under nbval, or in the book build) with ``WSBOOK_CACHE_STRICT`` = :data:`STRICT_PREFIXES`
(:mod:`wsbook.cache`), which covers every cached function of the library: an entry (a zoo, a trained model, a
posterior run, a flow) that a chapter would compute because the command line does not precompute it fails that
chapter instead.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CI_BUILD = ROOT / "_build" / "ci"


def toc_entries() -> list[str]:
    """Every ``file`` entry of ``_toc.yml``, in order."""
    import yaml

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                yield node["file"]
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    return list(walk(yaml.safe_load((ROOT / "_toc.yml").read_text())))


def toc_files() -> list[Path]:
    """Chapter sources listed in ``_toc.yml`` (only those under ``chapters/``)."""
    return [ROOT / f"{f}.md" for f in toc_entries() if f.startswith("chapters/")]


def env_ci() -> dict[str, str]:
    env = dict(os.environ)
    # `make test` runs the gates at ci scale; WSBOOK_SCALE=default python tests/gates.py chapters ... times
    # the published sizes with the same machinery.
    env.update(WSBOOK_SCALE=os.environ.get("WSBOOK_SCALE", "ci"), WSBOOK_PROGRESS="0",
               WSBOOK_CACHE_DIR=os.environ.get("WSBOOK_CACHE_DIR", str(ROOT / "_build" / "cache-ci")),
               PYTHONPATH=str(ROOT))
    return env


def workers() -> int:
    """pytest-xdist processes per gate: ``WSBOOK_TEST_WORKERS``, else one per CPU core up to 4 (each chapter's
    kernel and each browser hold a few hundred MiB to a few GiB; most chapters run torch on one thread)."""
    value = os.environ.get("WSBOOK_TEST_WORKERS", "").strip()
    if value:
        if not value.isdigit():
            raise SystemExit(f"WSBOOK_TEST_WORKERS must be a non-negative integer; got {value!r}")
        return int(value)
    return max(1, min(os.cpu_count() or 1, 4))


def run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> int:
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env or env_ci(), cwd=cwd)


def gate_unit(extra: list[str]) -> int:
    env = env_ci()
    parallel = []
    if workers() > 1:
        # tests are short and uneven (one takes about 95 s): idle workers take queued tests from busy ones
        env["OMP_NUM_THREADS"] = "1"
        parallel = ["-n", str(workers()), "--dist", "worksteal"]
    return run([str(BIN / "python"), "-m", "pytest", "tests", "-m", "not book", "-q", "-p", "no:cacheprovider",
                *parallel, *extra], env=env)


#: the artifact-name prefixes that chapters may only load, never compute, in the strict chapters gate
STRICT_PREFIXES = "align/,flows/,models/,posterior/,targets/,zoo/"


def strict_chapters() -> bool:
    """Whether ``WSBOOK_STRICT_CHAPTERS`` asks for the strict chapters gate."""
    return os.environ.get("WSBOOK_STRICT_CHAPTERS", "").strip().lower() in ("1", "true", "yes", "on")


def cli_groups(chapters: list[Path]) -> list[str]:
    """The ``python -m wsbook`` groups of ``chapters``: ``chapter/<number>`` (``chapter/08b`` for
    ``08b_mnist.md``) where the command line has one."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from wsbook import cli

    known = cli.groups()
    wanted = [f"chapter/{c.stem.split('_')[0]}" for c in chapters]
    return [g for g in dict.fromkeys(wanted) if g in known]


#: set by the chapters gate for a book gate that executes the chapters in its place (see the module docstring)
BOOK_ENV: dict[str, str] = {}


def gate_chapters(extra: list[str], notebooks: bool = True) -> int:
    """Precompute the command line's artifacts (strict mode), then run the selected chapters under nbval;
    with ``notebooks=False`` leave the chapters to the book gate, with the same strictness."""
    chapters = toc_files()
    selected = [c for c in chapters if not extra or any(e in c.name for e in extra)]
    env = env_ci()
    if strict_chapters():
        groups = cli_groups(selected)
        if groups:
            start = time.perf_counter()
            code = run([str(BIN / "python"), "-m", "wsbook", *groups, "--scale", env["WSBOOK_SCALE"],
                        "--jobs", str(max(1, workers()))], env=env)      # 0 workers: one process
            print(f"python -m wsbook {' '.join(groups)}: {time.perf_counter() - start:.1f} s", flush=True)
            if code:
                return code
        env["WSBOOK_CACHE_STRICT"] = STRICT_PREFIXES
        print(f"strict: the chapters run with WSBOOK_CACHE_STRICT={STRICT_PREFIXES} (they load those entries, "
              "never compute them)", flush=True)
    if not notebooks:
        BOOK_ENV.update({k: env[k] for k in ("WSBOOK_CACHE_STRICT",) if k in env})
        print("the chapters execute once, in the book gate's build (a cell that raises fails it)", flush=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="wsbook-nbval-") as tmp:
        notebooks = []
        for chapter in selected:
            target = Path(tmp) / f"{chapter.stem}.ipynb"
            code = run([str(BIN / "jupytext"), "--quiet", "--to", "ipynb", "-o", str(target), str(chapter)])
            if code:
                return code
            notebooks.append(str(target))
        if not notebooks:
            print("no chapters selected")
            return 1
        # one notebook per worker process (--dist loadfile keeps a notebook's cells in order in one kernel)
        if workers() > 1:
            env["OMP_NUM_THREADS"] = "1"
        return run([str(BIN / "python"), "-m", "pytest", "--nbval-lax", "--nbval-current-env",
                    "--nbval-cell-timeout=600", "-p", "no:cacheprovider", "-q", "-n", str(workers()),
                    "--dist", "loadfile", "--rootdir", tmp, *notebooks],
                   env=env, cwd=Path(tmp))


def gate_book(extra: list[str]) -> int:
    shutil.rmtree(CI_BUILD, ignore_errors=True)
    env = env_ci() | BOOK_ENV
    if BOOK_ENV:
        print(f"the book build executes the chapters with {BOOK_ENV}", flush=True)
    return run([str(BIN / "python"), "-m", "wsbook.book", str(ROOT), "-W", "--keep-going", "--path-output",
                str(CI_BUILD)], env=env)


def gate_browser(extra: list[str]) -> int:
    if not (CI_BUILD / "_build" / "html" / "index.html").exists():
        code = gate_book([])
        if code:
            return code
    env = env_ci()
    env["WSBOOK_HTML_DIR"] = str(CI_BUILD / "_build" / "html")
    return run([str(BIN / "python"), "-m", "pytest", "tests/test_browser.py", "-m", "book", "-q", "-p",
                "no:cacheprovider", "-n", str(workers()), *extra], env=env)


GATES = {"unit": gate_unit, "chapters": gate_chapters, "book": gate_book, "browser": gate_browser}


def main(argv: list[str]) -> int:
    names = [a for a in argv if a in GATES] or list(GATES)
    extra = [a for a in argv if a not in GATES]
    results = []
    for name in names:
        start = time.perf_counter()
        print(f"\n=== gate: {name} ===", flush=True)
        if name == "chapters" and "book" in names and not extra:
            code = gate_chapters(extra, notebooks=False)
        else:
            code = GATES[name](extra)
        results.append((name, code, time.perf_counter() - start))
        print(f"=== gate {name}: {'passed' if code == 0 else 'FAILED'} in {results[-1][2]:.1f} s ===", flush=True)
        if code:
            break
    print("\nsummary")
    for name, code, seconds in results:
        print(f"  {name:10s} {'passed' if code == 0 else 'FAILED':7s} {seconds:8.1f} s")
    failed = sum(1 for _, code, _ in results if code)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
