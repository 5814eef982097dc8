"""``python -m wsbook``: compute and cache the artifacts the chapters read, at any scale.

::

    python -m wsbook --list                          # every artifact, and whether it is cached per scale
    python -m wsbook zoos hmc --scale full           # compute what is missing (names, groups or patterns)
    python -m wsbook 'flow/mnist/*' --scale default
    torchrun --nproc-per-node 4 -m wsbook chapter/08 --scale full     # the same work over 4 processes

Every artifact is a call of the cached functions of :mod:`wsbook.experiments` with the arguments the
chapters use, so the chapters find the entries and only load them. Under ``torchrun`` the processes share
the work (:mod:`wsbook.distributed`): population members and HMC chains are split over the ranks and
gathered, flows train with DistributedDataParallel, and rank 0 writes the cache and prints the summary.
Errors (an unknown artifact or scale, a cache directory that cannot be written, an optional artifact whose
data is not on disk) are one line on stderr and a non-zero exit code. The optional artifacts (``zoo/mnist``:
the full MNIST from ``WSBOOK_MNIST_DIR``; nothing is downloaded) are listed always, computed when named,
and left out of groups and patterns, with a note, while their data is missing.
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from wsbook import cache, config, data, distributed


class CLIError(Exception):
    """A usage error: printed as one line, exit code 2 (1 for an unusable cache)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Artifact:
    """One thing the chapters read: ``compute()`` calls the cached functions that produce it. ``missing()``
    says why its input data is not on this machine (``None``: it is; only optional artifacts can miss it)."""

    name: str
    help: str
    compute: Callable[[], Any]
    missing: Callable[[], str | None] = lambda: None


def artifacts() -> dict[str, Artifact]:
    """The registry: every artifact by name (sizes follow the scale at the time ``compute`` runs)."""
    from wsbook.experiments import flows, mnist_flows as mf, posterior_flows as pf, summary, targets, tasks

    out: list[Artifact] = []
    for name in targets.ZOOS:
        out.append(Artifact(f"zoo/{name}", f"checkpoint zoo {name} (chapters 8, 8b)",
                            lambda name=name: targets.zoo(name)))
    for name, cfg in targets.OPTIONAL_ZOOS.items():
        out.append(Artifact(f"zoo/{name}", f"checkpoint zoo {name} on the full MNIST (optional: its IDX files in "
                            "WSBOOK_MNIST_DIR; no chapter reads it)", lambda name=name: targets.zoo(name),
                            missing=lambda cfg=cfg: data.missing(cfg.dataset)))
    for task in ("breast_cancer", "mnist5k"):
        for seed in (0, 1):
            out.append(Artifact(f"hmc/{task}/{seed}", f"reference HMC posterior of {task}, seed {seed} "
                                "(chapters 8, 8c)",
                                lambda task=task, seed=seed: targets.hmc_reference(task, seed)))
    for method in ("sgld", "sghmc", "vi", "laplace", "ensemble"):
        out.append(Artifact(f"posterior/breast_cancer/{method}", f"{method} posterior samples (chapters 2, 8)",
                            lambda method=method: tasks.posterior_run(
                                "breast_cancer", method, tasks.posterior_sample_size())))

    def bc_flow(cfg_of: Callable[[], Any]) -> Callable[[], Any]:
        def run():
            cfg = cfg_of()
            n_gen, steps = summary.breast_cancer_sizes()
            flows.train_flow("breast_cancer", cfg)
            return flows.sample_flow("breast_cancer", cfg, n_gen, steps=steps)
        return run

    for label, cfg in flows.breast_cancer_candidates().items():
        slug = label.replace(", ", "_").replace(" ", "_")
        out.append(Artifact(f"flow/breast_cancer/{slug}", f"flow {label} on the breast-cancer zoo and its samples "
                            "(chapters 8, 9)", bc_flow(lambda label=label: flows.breast_cancer_candidates()[label])))
    out.append(Artifact("verdict/breast_cancer", "the flow chosen on validation runs and the plain baseline, "
                        f"trained with seeds {flows.SEEDS} and sampled (chapter 8's test verdict)",
                        lambda: flows.verdict_table("breast_cancer", flows.breast_cancer_candidates(),
                                                    *summary.breast_cancer_sizes())))
    for recipe in mf.RECIPES:
        out.append(Artifact(f"flow/mnist/{recipe}", f"flow {recipe} on the MNIST zoo and its samples (chapter 8b)",
                            lambda recipe=recipe: (mf.train_flow(recipe), mf.sample_flow(recipe))))
    out.append(Artifact("verdict/mnist5k", "the MNIST flow chosen on validation data and the plain baseline, trained "
                        f"with seeds {flows.SEEDS} and sampled (chapter 8b's test verdict)", mf.verdict_table))
    for chart in pf.CHARTS:
        out.append(Artifact(f"flow/posterior/{chart}", f"{chart} flow on the HMC draws of breast cancer (chapter 8c)",
                            lambda chart=chart: pf.posterior_flow("breast_cancer", chart)))
    return {a.name: a for a in out}


def groups() -> dict[str, Callable[[], list[str]]]:
    """Named groups of artifacts (evaluated at the current scale: chapter 8b's recipes depend on it)."""
    from wsbook.experiments import mnist_flows as mf

    return {
        "all": lambda: ["*"],
        "zoos": lambda: ["zoo/*"],
        "hmc": lambda: ["hmc/*"],
        "flows": lambda: ["flow/*"],
        "chapter/08": lambda: ["zoo/breast_cancer", "hmc/breast_cancer/*", "posterior/breast_cancer/*",
                               "flow/breast_cancer/*", "verdict/breast_cancer"],
        "chapter/08b": lambda: ["zoo/mnist5k", "zoo/mnist5k_w32",
                                *[f"flow/mnist/{r}" for r in (*mf.budget().recipes, "plain_baseline")],
                                "verdict/mnist5k"],
        "chapter/08c": lambda: ["hmc/breast_cancer/*", "hmc/mnist5k/0", "posterior/breast_cancer/*",
                                "flow/posterior/*"],
    }


def select(patterns: Sequence[str], registry: dict[str, Artifact],
           skipped: dict[str, str] | None = None) -> list[str]:
    """Artifact names matching ``patterns`` (names, group names or shell patterns), in registry order.

    An artifact whose data is missing (:attr:`Artifact.missing`) is left out of a group or pattern that
    matches others too (and entered in ``skipped`` with the reason), and is a :class:`CLIError` when
    named, or when a pattern matches nothing else.
    """
    named = groups()
    chosen: set[str] = set()
    for pattern in patterns:
        expanded = named[pattern]() if pattern in named else [pattern]
        hits = [n for n in registry if any(fnmatch.fnmatchcase(n, p) for p in expanded)]
        if not hits:
            raise CLIError(f"unknown artifact {pattern!r}; `python -m wsbook --list` shows the artifacts and groups")
        reasons = {n: registry[n].missing() for n in hits}
        present = {n for n in hits if reasons[n] is None}
        if not present:
            raise CLIError(f"{hits[0]} cannot be computed here: {reasons[hits[0]]}")
        if skipped is not None:
            skipped.update({n: r for n, r in reasons.items() if r is not None})
        chosen |= present
    return [n for n in registry if n in chosen]


@contextmanager
def at_scale(scale: str) -> Iterator[None]:
    """Run a block at another ``WSBOOK_SCALE``."""
    before = os.environ.get("WSBOOK_SCALE")
    os.environ["WSBOOK_SCALE"] = scale
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("WSBOOK_SCALE", None)
        else:
            os.environ["WSBOOK_SCALE"] = before


def is_cached(artifact: Artifact) -> bool:
    """Whether everything ``artifact`` needs is in the cache (at the current scale); computes nothing."""
    try:
        with cache.probe():
            artifact.compute()
        return True
    except cache.MissingEntry:
        return False


def check_cache_dir() -> Path:
    """The cache directory, created and checked writable (a :class:`CLIError` otherwise)."""
    if not cache.enabled():
        raise CLIError("the cache is off (WSBOOK_CACHE); nothing computed would be kept", code=1)
    path = cache.cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as err:
        raise CLIError(f"cache directory {path} is not writable ({type(err).__name__}: {err.strerror or err})",
                       code=1) from None
    return path


def _entries(root: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in root.rglob("*.pt")} if root.exists() else {}


def list_artifacts(registry: dict[str, Artifact], out=None) -> None:
    """Print every artifact with ``yes`` / ``-`` per scale (cached or not), then the groups."""
    out = out or sys.stdout
    width = max(len(n) for n in registry)
    print(f"cache: {cache.cache_dir()}", file=out)
    print(f"{'artifact':<{width}}  " + "  ".join(f"{s:>7}" for s in config.SCALES) + "  description", file=out)
    for name, artifact in registry.items():
        marks = []
        for scale in config.SCALES:
            with at_scale(scale):
                marks.append("yes" if is_cached(artifact) else "-")
        print(f"{name:<{width}}  " + "  ".join(f"{m:>7}" for m in marks) + f"  {artifact.help}", file=out)
    print("groups: " + ", ".join(groups()) + "; shell patterns such as 'flow/mnist/*' work too", file=out)


def compute(names: list[str], registry: dict[str, Artifact], out=None) -> list[dict]:
    """Compute the artifacts ``names`` that are not cached yet (all ranks together); returns one summary
    row per artifact (printed by rank 0)."""
    out = out or sys.stdout
    from tqdm.auto import tqdm

    root = check_cache_dir()
    main = distributed.is_main()
    rows = []
    bar = tqdm(names, desc=f"wsbook ({config.scale()})", disable=not (main and config.progress_enabled()),
               leave=False, position=0)
    for name in bar:
        bar.set_postfix_str(name)
        before = _entries(root)
        if distributed.all_agree(is_cached(registry[name])):
            rows.append({"artifact": name, "status": "cached", "seconds": 0.0, "files": [], "bytes": 0})
            continue
        config.seed_everything(0)        # the same global random state, whatever ran before (and on every rank)
        start = time.perf_counter()
        registry[name].compute()
        distributed.barrier()
        after = _entries(root)
        new = sorted(p for p in after if before.get(p) != after[p])
        rows.append({"artifact": name, "status": "computed", "seconds": time.perf_counter() - start,
                     "files": [str(p.relative_to(root)) for p in new], "bytes": sum(after[p] for p in new)})
    if main:
        print(f"scale {config.scale()}, {distributed.world_size()} process(es), cache {root}", file=out)
        for r in rows:
            print(f"  {r['artifact']:<42} {r['status']:<9} {r['seconds']:9.1f} s  {len(r['files'])} file(s), "
                  f"{r['bytes'] / 2**20:.1f} MiB", file=out)
            for f in r["files"]:
                print(f"      {f}", file=out)
        done = sum(r["status"] == "computed" for r in rows)
        print(f"{done} computed, {len(rows) - done} already cached", file=out)
    return rows


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:      # one line, not the usage block
        raise CLIError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m wsbook", description="Compute and cache the artifacts the chapters read.")
    p.add_argument("artifacts", nargs="*", help="artifact names, group names (all, zoos, hmc, flows, chapter/08, "
                   "chapter/08b, chapter/08c) or shell patterns ('flow/mnist/*')")
    p.add_argument("--scale", help="ci, default or full (default: WSBOOK_SCALE, else default)")
    p.add_argument("--list", action="store_true", help="list the artifacts and whether each is cached, per scale")
    p.add_argument("--cache-dir", help="the cache directory (default: WSBOOK_CACHE_DIR, else the user cache)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit code."""
    try:
        args = parser().parse_args(argv)
        if args.scale is not None:
            if args.scale not in config.SCALES:
                raise CLIError(f"unknown scale {args.scale!r}; choose one of {', '.join(config.SCALES)}")
            os.environ["WSBOOK_SCALE"] = args.scale
        try:
            config.scale()
        except ValueError as err:
            raise CLIError(str(err)) from None
        if args.cache_dir:
            os.environ["WSBOOK_CACHE_DIR"] = args.cache_dir
        if not args.list and not args.artifacts:
            raise CLIError("name the artifacts to compute (or --list to see them)")
        registry = artifacts()
        if args.list:
            list_artifacts(registry)
            return 0
        skipped: dict[str, str] = {}
        names = select(args.artifacts, registry, skipped)
        check_cache_dir()
        distributed.init()
        if distributed.is_main():
            for name, reason in skipped.items():
                print(f"python -m wsbook: note: skipping {name} ({reason})", file=sys.stderr)
        if not distributed.is_main():
            os.environ["WSBOOK_PROGRESS"] = "0"        # one progress bar: rank 0's
        config.tune_allocator()
        try:
            compute(names, registry)
        finally:
            distributed.close()
        return 0
    except CLIError as err:
        print(f"python -m wsbook: error: {err}", file=sys.stderr)
        return err.code


__all__ = ["Artifact", "CLIError", "artifacts", "groups", "select", "is_cached", "list_artifacts", "compute", "main"]
