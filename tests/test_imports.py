"""The package map of DESIGN.md, enforced: every import of every module of ``wsbook`` (read with ``ast``,
lazy imports inside functions included) points down the map, importing ``wsbook`` changes no global
state, and no function falls back on a random seed of its own."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "wsbook"

#: The floors of the package map, bottom first. A module may import its own package and any floor below.
GROUND = ("config", "data", "cache", "distributed", "report", "loop", "sphinx")
FLOORS = (GROUND, ("nets",), ("manifolds",), ("flows",), ("bayes",), ("symmetry",), ("graphs",), ("weightflow",),
          ("figures",), ("experiments",), ("cli", "book"), ("__main__",))
#: Math packages: they never import experiments or figures (also implied by the floors; kept explicit).
MATH = ("nets", "manifolds", "flows", "bayes", "symmetry", "graphs", "weightflow")
#: Imports forbidden although they point down the map.
FORBIDDEN = {
    "symmetry": {"bayes"},                  # the group action needs no posterior machinery
    "manifolds": {"nets"},                  # flows and manifolds know nothing about neural networks
    "flows": {"nets", "bayes"},
    "weightflow": {"bayes"},                # training targets are populations handed to it
}


def floor_of(unit: str) -> int:
    for level, names in enumerate(FLOORS):
        if unit in names:
            return level
    raise KeyError(unit)


def unit_of(module: str) -> str:
    """The map entry of a dotted module name: ``wsbook.graphs.align`` -> ``graphs``; ``wsbook`` -> ``config``
    (the package root may only import the ground floor)."""
    parts = module.split(".")
    if parts[0] != "wsbook":
        raise ValueError(module)
    return parts[1] if len(parts) > 1 else "config"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def wsbook_imports(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """``(line, imported wsbook module)`` for every import statement of ``source``; ``from wsbook import x``
    counts as an import of ``wsbook.x`` when ``x`` is a submodule, relative imports are resolved."""
    out = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "wsbook"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "wsbook":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                is_module = (PACKAGE.parent / Path(*sub.split("."))).with_suffix(".py").exists() or \
                    (PACKAGE.parent / Path(*sub.split(".")) / "__init__.py").exists()
                out.append((node.lineno, sub if is_module else target))
    return out


def violations(module: str, imports: list[tuple[int, str]]) -> list[str]:
    """Every broken rule of the package map among ``imports`` of ``module``."""
    unit = unit_of(module)
    level = floor_of(unit)
    found = []
    for line, target in imports:
        other = unit_of(target)
        if other == unit:
            continue
        try:
            other_level = floor_of(other)
        except KeyError:
            found.append(f"{module}:{line} imports {target}, which is not on the package map")
            continue
        if unit in GROUND and other not in GROUND:
            found.append(f"{module}:{line} imports {target}: the ground floor imports only the ground floor")
        elif other_level >= level and not (unit in GROUND and other in GROUND):
            found.append(f"{module}:{line} imports {target}: {unit} may import only floors below it "
                         f"({', '.join(n for f in FLOORS[:level] for n in f) or 'none'})")
        elif unit in MATH and other in ("experiments", "figures"):
            found.append(f"{module}:{line} imports {target}: math packages never import {other}")
        elif other in FORBIDDEN.get(unit, ()):
            found.append(f"{module}:{line} imports {target}: {unit} must not import {other}")
    return found


def all_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_is_on_the_package_map():
    units = {unit_of(module_name(p)) for p in all_modules()}
    unknown = [u for u in units if not any(u in f for f in FLOORS)]
    assert not unknown, f"modules outside the package map of DESIGN.md: {unknown}"


def test_imports_follow_the_package_map():
    found = []
    for path in all_modules():
        module = module_name(path)
        found += violations(module, wsbook_imports(path.read_text(encoding="utf-8"), module,
                                                   path.name == "__init__.py"))
    assert not found, "imports that break the package map (DESIGN.md):\n" + "\n".join(found)


@pytest.mark.parametrize("module, source, broken", [
    ("wsbook.symmetry.canonical", "from wsbook.bayes.vi import fit_mean_field", "symmetry must not import bayes"),
    ("wsbook.symmetry.canonical", "def f():\n    from wsbook.bayes import vi", "symmetry must not import bayes"),
    ("wsbook.nets", "from wsbook import manifolds", "may import only floors below"),
    ("wsbook.bayes.model", "from wsbook.figures import style", "may import only floors below"),
    ("wsbook.graphs.models", "import wsbook.experiments.zoos", "may import only floors below"),
    ("wsbook.flows.train", "from wsbook.nets import MLPSpec", "flows must not import nets"),
    ("wsbook.manifolds", "from wsbook.nets import MLPSpec", "manifolds must not import nets"),
    ("wsbook.cache", "from wsbook.nets import MLPSpec", "ground floor imports only the ground floor"),
    ("wsbook", "from wsbook import nets", "ground floor imports only the ground floor"),
    ("wsbook.figures.bayes", "from ..experiments import tasks", "may import only floors below"),
    ("wsbook.symmetry.lmc", "import wsbook.mystery", "not on the package map"),
])
def test_the_rule_check_catches_forbidden_imports(module, source, broken):
    is_package = module in ("wsbook",) or module.count(".") == 0
    found = violations(module, wsbook_imports(source, module, is_package))
    assert any(broken in v for v in found), found


@pytest.mark.parametrize("module, source", [
    ("wsbook.experiments.tasks", "from wsbook.bayes import hmc\nfrom wsbook import cache, config"),
    ("wsbook.figures.flows", "from wsbook.manifolds import Sphere\nfrom wsbook.figures import style"),
    ("wsbook.symmetry.canonical", "from wsbook.manifolds import Product\nfrom . import actions"),
    ("wsbook.cache", "from wsbook import config"),
])
def test_the_rule_check_allows_downward_imports(module, source):
    assert violations(module, wsbook_imports(source, module, False)) == []


_STATE_PROBE = r"""
import ctypes, json, random, sys
calls = []
real_cdll = ctypes.CDLL
class Spy:
    def __init__(self, *a, **k):
        self._lib = real_cdll(*a, **k)
    def __getattr__(self, name):
        calls.append(name)
        return getattr(self._lib, name)
ctypes.CDLL = Spy

import numpy as np
import plotly.io as pio
import torch

def state():
    return {"renderer": pio.renderers.default, "template": str(pio.templates.default),
            "templates": sorted(pio.templates), "renderers": sorted(pio.renderers),
            "torch_rng": torch.get_rng_state().sum().item(), "numpy_rng": int(np.random.get_state()[1].sum()),
            "python_rng": hash(random.getstate()), "threads": torch.get_num_threads(),
            "dtype": str(torch.get_default_dtype()),
            "deterministic": torch.are_deterministic_algorithms_enabled()}

before = state()
import importlib, pkgutil
import wsbook
names = [m.name for m in pkgutil.walk_packages(wsbook.__path__, "wsbook.") if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
after = state()
print(json.dumps({"before": before, "after": after, "libc_calls": calls, "modules": names}))
"""


def test_importing_wsbook_changes_no_global_state():
    out = subprocess.run([sys.executable, "-c", _STATE_PROBE], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "wsbook.experiments.tasks" in result["modules"] and "wsbook.figures" in result["modules"]
    assert result["after"] == result["before"], "importing wsbook changed global state"
    assert "mallopt" not in result["libc_calls"], "importing wsbook tuned the allocator"


def test_setup_chapter_is_where_the_global_state_changes():
    probe = ("import json, plotly.io as pio\nfrom wsbook.experiments import setup_chapter\n"
             "import torch\ng = setup_chapter(seed=3)\n"
             "print(json.dumps([pio.renderers.default, str(pio.templates.default), g.initial_seed(),\n"
             "                  torch.are_deterministic_algorithms_enabled()]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    # on the CPU (the tests' device) chapters use torch's deterministic kernels
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["wsbook", "wsbook", 3, True]


def test_no_function_falls_back_on_a_seed_of_its_own():
    """A random function takes a generator; without one it draws from the book's seed
    (``config.generator()``, ``WSBOOK_SEED``), never from a fixed seed written into it."""
    private = re.compile(r"if generator is not None else torch\.Generator\([^)]*\)\.manual_seed\(")
    found = [f"{module_name(p)}:{i}" for p in all_modules()
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if private.search(line)]
    assert not found, "defaults with a private seed (use config.generator()):\n" + "\n".join(found)
