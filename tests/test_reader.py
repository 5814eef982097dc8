"""What a reader meets besides the chapters' content (issue 11): the "Run this chapter" box and its one
file of measured run times (wsbook/sphinx.py), and the figures' phone-width reflow and hover number
format (wsbook/figures/style.py). The browser gate checks the same in the built pages."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ run-time box
def test_every_chapter_has_a_measured_ci_time_and_a_default_row():
    from gates import toc_files

    from wsbook import sphinx

    times = sphinx.read_chapter_times(ROOT / sphinx.CHAPTER_TIMES)
    chapters = [p.stem for p in toc_files()]
    assert chapters, "no chapters in _toc.yml"
    missing = [c for c in chapters if (times.get(c, {}).get("ci") or {}).get("seconds") is None]
    assert not missing, f"no measured ci run time in {sphinx.CHAPTER_TIMES} for {missing}"
    assert not [c for c in chapters if "default" not in times.get(c, {})], "a chapter has no default row"
    stale = sorted(set(times) - set(chapters))
    assert not stale, f"{sphinx.CHAPTER_TIMES} lists chapters that are not in _toc.yml: {stale}"
    for chapter, scales in times.items():
        for scale, entry in scales.items():
            if entry["seconds"] is not None:
                assert entry["machine"] and entry["date"], f"{chapter} at {scale}: where and when measured?"


def test_precompute_groups_are_the_clis_chapter_groups():
    from wsbook import cli, sphinx

    assert set(sphinx.PRECOMPUTE_GROUPS) == {g for g in cli.groups() if g.startswith("chapter/")}
    assert sphinx.precompute_group("08b_mnist") == "chapter/08b"
    assert sphinx.precompute_group("08_results") == "chapter/08"
    assert sphinx.precompute_group("03_flow_matching") is None


def test_durations_read_naturally():
    from wsbook.sphinx import format_duration

    assert format_duration(23.4) == "23 s"
    assert format_duration(1130) == "19 min"
    assert format_duration(4500) == "1 h 15 min"
    assert format_duration(None) == "not measured"


def test_malformed_time_files_are_errors(tmp_path):
    from wsbook.sphinx import read_chapter_times

    bad = tmp_path / "t.csv"
    bad.write_text("chapter,seconds\n01,3\n")
    with pytest.raises(ValueError, match="columns"):
        read_chapter_times(bad)
    bad.write_text("chapter,scale,seconds,machine,date\n01,ci,3,m,d\n01,ci,4,m,d\n")
    with pytest.raises(ValueError, match="twice"):
        read_chapter_times(bad)
    bad.write_text("chapter,scale,seconds,machine,date\n01,huge,3,m,d\n")
    with pytest.raises(ValueError, match="scale"):
        read_chapter_times(bad)


def test_run_box_says_how_and_how_long():
    from wsbook.sphinx import run_box

    times = {"08b_mnist": {"ci": {"seconds": 61.0, "machine": "2 cores", "date": "2026-11-23"},
                           "default": {"seconds": None, "machine": "", "date": ""}}}
    text = run_box("08b_mnist", times, "ci").astext()
    for needle in ("make lab", "08b_mnist.md", "WSBOOK_SCALE=ci", "python -m wsbook chapter/08b --scale full",
                   "61 s (2 cores, 2026-11-23)", "not measured"):
        assert needle in text, f"{needle!r} missing from the box:\n{text}"
    assert "python -m wsbook chapter" not in run_box("03_flow_matching", {}, "ci").astext()


def test_run_box_is_collapsed_and_says_what_jupyterlab_does_not_render():
    from wsbook.sphinx import run_box

    box = run_box("03_flow_matching", {}, "ci")
    assert "dropdown" in box["classes"], "the box should be collapsed (sphinx-togglebutton's dropdown)"
    text = box.astext()
    for needle in ("citations show as their keys", "{glue}", "shows its key"):
        assert needle in text, f"{needle!r} missing from the box:\n{text}"
    # no launch button: how to run it from a clone, and where the GPU-server recipe is
    assert "no launch button" in text and "Running on a GPU server" in text and "make lab" in text
    with_launch = run_box("03_flow_matching", {}, "ci", launch=True).astext()
    assert "launch button" in with_launch and "no launch button" not in with_launch


# ------------------------------------------------------------------ launch buttons
def _theme_options(config: dict) -> dict:
    """``html_theme_options`` as jupyter-book 1.x makes them from a ``_config.yml`` (with its defaults)."""
    from jupyter_book.config import get_final_config

    sphinx_config, _ = get_final_config(user_yaml=config, sourcedir=ROOT, validate=False,
                                        cli_config={"latex_individualpages": False})
    return sphinx_config["html_theme_options"]


def _launch_repos(options: dict) -> list[str]:
    """The repository every launch button of these theme options would clone ([] when there is none)."""
    from wsbook.sphinx import LAUNCH_PROVIDERS

    buttons = options.get("launch_buttons") or {}
    return [options.get("repository_url", "") for key in LAUNCH_PROVIDERS if buttons.get(key)]


def test_launch_buttons_only_point_to_a_configured_repository():
    """No launch link to a repository nobody configured: not the empty default of ``_config.yml``, not
    jupyter-book's own repository (its fallback for a missing ``repository.url``)."""
    import yaml

    from wsbook.sphinx import REPOSITORY_ENV, launch_enabled, launch_theme_options

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    configured = (config.get("repository") or {}).get("url") or ""
    assert "github.com/wsbook/wsbook" not in configured, "that repository does not exist"
    fork = "https://github.com/example/wsbook-fork"
    missing = {**config, "repository": {k: v for k, v in config["repository"].items() if k != "url"}}
    for cfg, environ, expected in [
        (config, {}, configured),                                    # the book as committed
        (missing, {}, ""),                                           # no repository.url at all
        ({**config, "repository": {**config["repository"], "url": fork}}, {}, fork),
        (config, {REPOSITORY_ENV: fork}, fork),                      # the environment names one
    ]:
        options = launch_theme_options(_theme_options(cfg), environ=environ)
        repos = _launch_repos(options)
        if expected:
            assert launch_enabled(options) and repos and set(repos) == {expected}, (environ, repos)
        else:
            assert not launch_enabled(options) and not repos, f"launch buttons to {repos} ({environ})"
            assert not options.get("repository_url")
    # the hub stays configured for when a repository is named
    assert (config["launch_buttons"] or {}).get("jupyterhub_url")


# ------------------------------------------------------------------ cite page and introduction
def test_cite_page_bibtex_needs_no_hand_edits():
    from pybtex.database import parse_string

    from wsbook.sphinx import bibtex_entry

    stamp = {"wsbook_version": "0.1.0", "build_date": "2027-01-05", "build_scale": "default"}
    for url in ("", "https://github.com/example/wsbook-fork"):
        entry = bibtex_entry("Flows over Neural-Network Weights", stamp, url)
        (key, parsed), = parse_string(entry, "bibtex").entries.items()
        assert key == "wsbook2027" and parsed.type == "misc"
        assert parsed.fields["title"] == "Flows over Neural-Network Weights"
        assert parsed.fields["year"] == "2027"
        assert parsed.fields["note"] == "wsbook 0.1.0, built 2027-01-05 at scale default"
        assert str(parsed.persons["author"][0]) == "{wsbook contributors}"
        assert parsed.fields.get("url", "") == url
    page = (ROOT / "book" / "cite.md").read_text()
    assert "```{wsbook-bibtex}" in page and "```bibtex" not in page


def test_book_pages_use_only_known_substitutions_outside_code():
    """A substitution inside inline code or a code block is printed literally (``{{ build_scale }}``)."""
    import re

    known = {"wsbook_version", "build_date", "build_scale", "default_chapter_times"}
    for path in sorted((ROOT / "book").glob("*.md")):
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        names = set(re.findall(r"{{\s*(\w+)\s*}}", text))
        assert names <= known, f"{path.name}: unknown substitutions {names - known}"
        literal = [m for m in re.findall(r"`[^`\n]*`", text) if "{{" in m]
        assert not literal, f"{path.name}: substitutions inside inline code stay literal: {literal}"
        fenced = [m for m in re.findall(r"```.*?```", path.read_text(), flags=re.S) if "{{" in m]
        assert not fenced, f"{path.name}: substitutions inside a code block stay literal"


def test_intro_run_times_come_from_the_measurements():
    from wsbook import sphinx

    intro = (ROOT / "book" / "intro.md").read_text()
    assert "{{ default_chapter_times }}" in intro and "a few minutes per chapter" not in intro
    times = sphinx.read_chapter_times(ROOT / sphinx.CHAPTER_TIMES)
    text = sphinx.chapter_time_summary(times)
    seconds = [row["default"]["seconds"] for row in times.values() if row.get("default", {}).get("seconds")]
    assert f"to {sphinx.format_duration(max(seconds))} a chapter" in text
    assert f"about {sphinx.format_duration(sum(seconds) / 2)} for the whole book" in text
    fake = {"a": {"default": {"seconds": 30.0, "machine": "m", "date": "d"}},
            "b": {"default": {"seconds": 1200.0, "machine": "m", "date": "d"}}}
    assert sphinx.chapter_time_summary(fake).startswith("from 30 s to 20 min a chapter")
    assert sphinx.chapter_time_summary({}) == "not measured yet"


# ------------------------------------------------------------------ code that fits the page
CODE_COLUMN = 84  # characters a code cell shows without a horizontal scroll bar in the book's layout


def test_shown_code_fits_the_page():
    """The browser gate measures this in the built pages; here it fails in seconds, on the source."""
    import jupytext
    from gates import toc_files

    wide = []
    for path in toc_files():
        for cell in jupytext.read(path).cells:
            if cell.cell_type != "code" or "remove-input" in cell.metadata.get("tags", []):
                continue
            wide += [f"{path.name}: {line}" for line in cell.source.splitlines() if len(line) > CODE_COLUMN]
    assert not wide, "code lines wider than the page:\n" + "\n".join(wide)


# ------------------------------------------------------------------ figures at phone width
@pytest.fixture
def book_style():
    import plotly.io as pio

    from wsbook import figures

    before = (pio.templates.default, pio.renderers.default)
    figures.setup()
    yield
    pio.templates.default, pio.renderers.default = before


def test_hover_values_are_formatted(book_style):
    import numpy as np
    import plotly.io as pio

    from wsbook import figures

    layout = pio.templates[figures.TEMPLATE].layout
    assert layout.xaxis.hoverformat == layout.yaxis.hoverformat == figures.style.HOVER_FORMAT
    assert layout.scene.zaxis.hoverformat == figures.style.HOVER_FORMAT
    grid = figures.heatmap_grid({"a": np.ones((2, 2))}, np.arange(2), np.arange(2))
    assert grid.layout.template.data.heatmap[0].zhoverformat == figures.style.HOVER_FORMAT
    # the figure as the page gets it carries the format
    html = figures.BookRenderer().to_mimebundle(grid.to_dict())["text/html"]
    assert f'"hoverformat":"{figures.style.HOVER_FORMAT}"' in html


def test_panel_grids_stack_into_one_column(book_style):
    import numpy as np

    from wsbook import figures
    from wsbook.figures.style import narrow_relayout

    z = {name: np.ones((3, 3)) for name in ("hmc", "vi", "ensemble", "sgld", "laplace")}
    fig = figures.heatmap_grid(z, np.arange(3), np.arange(3), cols=3)
    fig.update_yaxes(title_text="x<sub>2</sub>", col=1)
    reflow = narrow_relayout(json.loads(fig.to_json()))
    on, off = reflow["on"], reflow["off"]
    # five drawn panels in one column, top to bottom in reading order; the sixth, empty, hidden
    tops = [on[f"yaxis{k if k > 1 else ''}.domain"][1] for k in range(1, 6)]
    assert tops == sorted(tops, reverse=True) and tops[0] == 1.0
    assert all(on[f"xaxis{k if k > 1 else ''}.domain"] == [0, 1] for k in range(1, 6))
    assert on["xaxis6.visible"] is False and on["yaxis6.visible"] is False
    # subplot titles move with their panels; panels of the second column get the row's y-axis title
    assert on["annotations[1].x"] == 0.5 and on["annotations[1].y"] == tops[1]
    assert on["yaxis2.title.text"] == "x<sub>2</sub>"
    assert on["height"] > fig.layout.height and off["height"] == fig.layout.height
    assert set(on) <= set(off), "every narrow change has its wide value to go back to"
    # one column already: nothing to reflow
    assert narrow_relayout(json.loads(figures.curves_with_bands([0, 1], {"hmc": ([0, 1],)}).to_json())) is None
    # a long title wraps on a narrow screen, with room above the plot; a short one is left alone
    long = figures.curves_with_bands([0, 1], {"hmc": ([0, 1],)}, title="Predictive mean and two standard "
                                     "deviations of every method")
    wrapped = narrow_relayout(json.loads(long.to_json()))
    assert wrapped["on"]["title.text"].count("<br>") == 1 and wrapped["off"]["title.text"] == long.layout.title.text
    assert wrapped["on"]["margin.t"] > 70 and wrapped["on"]["height"] > 450
    assert narrow_relayout(json.loads(figures.curves_with_bands([0, 1], {"hmc": ([0, 1],)},
                                                                title="Short").to_json())) is None
    # the page runs the reflow and the legend fit after drawing the figure
    html = figures.BookRenderer().to_mimebundle(fig.to_dict())["text/html"]
    assert "wsbookFit" in html and '"yaxis2.title.text"' in html


def test_the_book_build_reads_the_longest_chapters_first(monkeypatch):
    from wsbook import book

    docs = ["book/intro", "chapters/01_short", "chapters/08_long", "book/cite"]
    seconds = {"01_short": 10.0, "08_long": 900.0}
    assert book.reading_order(docs, seconds, 1) == [
        ["chapters/08_long"], ["book/cite"], ["book/intro"], ["chapters/01_short"]]
    # every chapter of the book has a recorded default time, so the schedule is informed
    seconds = book.recorded_seconds(ROOT, "default")
    chapters = sorted(p.stem for p in (ROOT / "chapters").glob("*.md"))
    assert chapters and all(ch in seconds for ch in chapters), set(chapters) - set(seconds)
    monkeypatch.setenv("WSBOOK_BOOK_JOBS", "3")
    assert book.default_jobs() == 3
    monkeypatch.setenv("WSBOOK_BOOK_JOBS", "0")
    with pytest.raises(ValueError, match="WSBOOK_BOOK_JOBS"):
        book.default_jobs()


def _record_start(arg):
    name, log, seconds = arg
    with open(log, "a") as fh:
        fh.write(name + "\n")
    time.sleep(seconds)


def test_sphinx_starts_the_book_chapters_in_the_wanted_order(tmp_path):
    """reading_order relies on how Sphinx's ParallelTasks picks waiting tasks; check the start order it
    really produces: the longest first, two at a time."""
    from sphinx.util.parallel import ParallelTasks

    from wsbook import book

    seconds = {"a": 50.0, "b": 40.0, "c": 30.0, "d": 20.0, "e": 10.0}
    log = str(tmp_path / "starts.txt")
    tasks = ParallelTasks(2)
    for (doc,) in book.reading_order(["chapters/" + k for k in "cadeb"], seconds, 2):
        tasks.add_task(_record_start, (doc, log, seconds[doc[-1]] / 100))
    tasks.join()
    started = Path(log).read_text().split()
    # the two longest start together (in either order), then the others as processes free up
    assert set(started[:2]) == {"chapters/a", "chapters/b"} and started[2:] == ["chapters/" + k for k in "cde"]


# ------------------------------------------------------------------ API reference
#: The library modules with a page in the book's "API reference" part: {page (book/api/<page>.md): module}.
API_PAGES = {"nets": "nets", "manifolds": "manifolds", "flows": "flows", "bayes": "bayes", "symmetry": "symmetry",
             "graphs": "graphs", "weightflow": "weightflow", "experiments": "experiments.protocol"}
API_DIRECTIVE = re.compile(r"^\.\. (automodule|autoclass|autofunction):: (\S+)\n((?:   :[^\n]*\n)*)", re.M)


def _toc_entries() -> list[str]:
    from gates import toc_entries

    return toc_entries()


def test_every_library_package_has_an_api_page_in_the_toc():
    """One page per package, in _toc.yml, generated from the docstrings (autodoc in _config.yml), whose
    opening line names only chapters that really use the package."""
    import yaml

    entries = _toc_entries()
    missing = [p for p in API_PAGES if f"book/api/{p}" not in entries]
    assert not missing, f"no API page in _toc.yml for {missing}"
    extensions = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["extra_extensions"]
    assert {"sphinx.ext.autodoc", "sphinx.ext.napoleon"} <= set(extensions)
    for name, module in API_PAGES.items():
        page = (ROOT / "book" / "api" / f"{name}.md").read_text()
        assert f".. automodule:: wsbook.{module}\n   :members:\n" in page, f"book/api/{name}.md"
        chapters = re.findall(r"\{doc\}`/(chapters/\w+)`", page.split("```", 1)[0])
        assert chapters, f"book/api/{name}.md does not name the chapters that use wsbook.{module}"
        parent, _, leaf = f"wsbook.{module}".rpartition(".")
        named = rf"wsbook\.{re.escape(module)}\b|from {re.escape(parent)} import [^\n]*\b{leaf}\b"
        for chapter in chapters:
            assert chapter in entries, f"book/api/{name}.md names {chapter}, which is not in _toc.yml"
            source = (ROOT / f"{chapter}.md").read_text()
            assert re.search(named, source), \
                f"book/api/{name}.md says {chapter} uses wsbook.{module}; the chapter never names it"


def test_api_pages_name_only_what_exists():
    """Every module and object an API page names imports (autodoc would fail the book build otherwise, with
    -W, minutes later). Each page documents its package's ``__all__``, some submodules whole, and a few
    public names that the package does not export."""
    import importlib

    for page_name in API_PAGES:
        page = (ROOT / "book" / "api" / f"{page_name}.md").read_text()
        for kind, target, _ in API_DIRECTIVE.findall(page):
            if kind == "automodule":
                importlib.import_module(target)
            else:
                module, name = target.rsplit(".", 1)
                assert hasattr(importlib.import_module(module), name), f"book/api/{page_name}.md: no {target}"


#: words of the project, not of the book: a chapter explains and shows; it does not narrate how the page was
#: made (an earlier version, what was tried while building it) or name the tracker's vocabulary (issues,
#: sessions, the goal of an issue or a task)
LAB_LOG = re.compile(r"earlier version|(tried|found|seen) while building|while building this|\bsessions?\b|"
                     r"\bissues?\b|\bgoal of the (issue|task|session|brief|ticket)\b|"
                     r"(?-i:\bPLACE FOR\b)|\bTODO\b|\bFIXME\b|\bXXX\b", re.IGNORECASE)


def book_sources() -> list[Path]:
    """Every page source of the book: the chapters (appendices included) and the front and back matter."""
    return sorted((ROOT / "chapters").glob("*.md")) + sorted((ROOT / "book").glob("*.md"))


def test_chapters_read_as_a_book_not_a_lab_log():
    """No chapter, appendix or front/back-matter page, prose or code, narrates its own making."""
    from gates import toc_files

    assert set(toc_files()) <= set(book_sources()), "a chapter of the table of contents is not checked"
    hits = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}" for path in book_sources()
            for i, line in enumerate(path.read_text().splitlines(), 1) if LAB_LOG.search(line)]
    assert not hits, "project words or page history in the book's pages:\n" + "\n".join(hits)


@pytest.mark.parametrize("line", ["An earlier version of this chapter used Adam.", "as tried while building it",
                                  "see issue 11", "this session", "the goal of the issue", "TODO: plot"])
def test_lab_log_words_are_caught(line):
    assert LAB_LOG.search(line)


@pytest.mark.parametrize("line", ["The goal of the flow is a posterior.", "the accuracy goal is met",
                                  "every weight we tried", "the test run is opened"])
def test_book_words_pass(line):
    assert not LAB_LOG.search(line)


# ------------------------------------------------------------------ colours
def test_a_method_has_one_colour_under_every_name():
    """A method is drawn in its colour whether a figure names it by identifier or by label, and the posterior
    chapter's rows are each in a colour of their own, none an inference method's (they share its figures)."""
    from wsbook.figures import style

    for method, text in style.METHOD_LABELS.items():
        if method in style.METHOD_COLORS:
            assert style.color(text) == style.color(method), (method, text)
    rows = [name for name in style.SERIES_COLORS if name != "HMC, training run"]
    colours = [style.color(name) for name in rows]
    assert len(set(colours)) == len(colours), dict(zip(rows, colours))
    methods = ("hmc", "sgld", "sghmc", "vi", "laplace", "ensemble", "sgd_trajectory", "map")
    shared = {name: style.color(name) for name in rows if style.color(name) in {style.color(m) for m in methods}}
    assert not shared, f"rows in an inference method's colour: {shared}"
    assert style.color("adam") != style.color("normalized"), "Adam runs beside the normalized flow"


def _lab(hex_color: str) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB ``#rrggbb`` colour."""
    rgb = [int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    xyz = [sum(w * c for w, c in zip(row, lin)) / n for row, n in zip(
        ((0.4124, 0.3576, 0.1805), (0.2126, 0.7152, 0.0722), (0.0193, 0.1192, 0.9505)), (0.9505, 1.0, 1.089))]
    f = [t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116 for t in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def test_the_charts_colours_are_far_apart():
    """The three charts' flows share figures (chapter 8's solver-steps curves, its distance bars): their
    colours differ by more than 30 in CIE L*a*b* (a just-noticeable difference is about 2)."""
    from itertools import combinations

    from wsbook.figures import style

    for a, b in combinations(("euclidean", "normalized", "geometric"), 2):
        distance = sum((x - y) ** 2 for x, y in zip(_lab(style.color(a)), _lab(style.color(b)))) ** 0.5
        assert distance > 30, (a, b, style.color(a), style.color(b), round(distance, 1))
