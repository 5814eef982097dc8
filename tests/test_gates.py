"""`make test`'s gates (tests/gates.py): what each runs, checked without running it."""
from __future__ import annotations

import gates


def test_make_test_executes_the_chapters_once_in_the_strict_book_build(monkeypatch, tmp_path):
    """With the book gate in the same run, the chapters gate runs only the command line, and the book build
    executes the chapters under the strict cache; on its own the chapters gate still runs them under nbval."""
    calls = []
    monkeypatch.setattr(gates, "run", lambda cmd, env=None, cwd=None: calls.append((cmd, dict(env or {}))) or 0)
    monkeypatch.setattr(gates, "BOOK_ENV", {})
    monkeypatch.setattr(gates, "CI_BUILD", tmp_path / "ci")                  # the book gate clears it first
    monkeypatch.setenv("WSBOOK_STRICT_CHAPTERS", "1")
    monkeypatch.delenv("WSBOOK_CACHE_STRICT", raising=False)

    assert gates.main(["chapters", "book"]) == 0
    commands = [" ".join(cmd) for cmd, _ in calls]
    assert len(calls) == 2 and "-m wsbook chapter/" in commands[0] and "-m wsbook.book" in commands[1]
    assert not any("nbval" in c for c in commands)
    assert calls[1][1]["WSBOOK_CACHE_STRICT"] == gates.STRICT_PREFIXES        # the build cannot train a flow

    calls.clear()
    monkeypatch.setattr(gates, "BOOK_ENV", {})
    assert gates.main(["chapters"]) == 0
    nbval = [env for cmd, env in calls if "--nbval-lax" in cmd]
    assert len(nbval) == 1 and nbval[0]["WSBOOK_CACHE_STRICT"] == gates.STRICT_PREFIXES


def test_make_book_precomputes_the_artifacts_before_the_build():
    """`make book` first runs the command line over every artifact, one worker per core, then the build."""
    import subprocess

    lines = subprocess.run(["make", "-n", "book"], cwd=gates.ROOT, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    precompute = [i for i, line in enumerate(lines) if "-m wsbook all --jobs auto" in line]
    build = [i for i, line in enumerate(lines) if "-m wsbook.book" in line]
    assert len(precompute) == 1 and len(build) == 1 and precompute[0] < build[0], lines


def test_strict_prefixes_cover_every_cached_function():
    """The strict chapters gate refuses to compute any cached entry: every cached function of the library
    (imported in full) has a name under one of :data:`gates.STRICT_PREFIXES`."""
    import importlib
    import pkgutil

    import wsbook
    from wsbook import cache

    for module in pkgutil.walk_packages(wsbook.__path__, "wsbook."):
        importlib.import_module(module.name)
    prefixes = tuple(p for p in gates.STRICT_PREFIXES.split(",") if p)
    names = {n for n, owner in cache._REGISTRY.items() if owner.startswith("wsbook.")}   # not the tests' own
    assert {"zoo/trained", "models/trained", "flows/trained", "posterior/run"} <= names
    assert not {n for n in names if not n.startswith(prefixes)}
