"""Open every page of the built book in a real headless Chromium (Debian's package).

Fails on any JavaScript console error or uncaught exception, checks that pages with figures contain
plotly-rendered SVG and that pages with math were typeset by MathJax, and saves screenshots to
``_build/screenshots/``. On every chapter page it also checks what a reader meets (issue 11): every
figure has axis titles and a numbered caption, no code cell is wider than the page, no cell leaves a
stray plain-text result (``True``, ``16``), the executed ``.ipynb`` download link works, and plotly.js is
loaded only by pages that draw a figure (the 2-D ones get the cartesian partial bundle, no page gets the
theme's fontawesome.js); no figure draws two different series alike, and lines and annotations on log axes
sit at their values. The HTML directory comes from ``WSBOOK_HTML_DIR`` (set by ``tests/gates.py``).

Also at phone width (400 px): no page scrolls sideways, panel grids are stacked, legends sit below the
plot, hover labels are formatted and the "Run this chapter" box is collapsed; and a chapter opens as a
notebook in this environment's JupyterLab. Launch links, if any, clone the configured repository.
"""
from __future__ import annotations

import functools
import http.server
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parent.parent
HTML = Path(os.environ.get("WSBOOK_HTML_DIR", ROOT / "_build" / "html"))
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
         "--no-first-run", "--disable-component-update", "--disable-sync"]


def pages() -> list[Path]:
    skip = {"search.html", "genindex.html"}
    return sorted(p for p in HTML.rglob("*.html") if "_static" not in p.parts and p.name not in skip
                  and not p.name.startswith("_"))


@pytest.fixture(scope="module")
def server():
    if not (HTML / "index.html").exists():
        pytest.fail(f"no built book at {HTML}: run the book gate first")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args, **kwargs):
            pass

    handler = functools.partial(Quiet, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail("Debian chromium is not installed: `make browser-deps` installs it")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield b
        b.close()


# A page that draws 3-D scenes renders them in software here (headless, no GPU): chapter 7 takes about 15 s
# to load on a quiet two-core machine and can pass 30 s (playwright's default) while another worker loads a page.
PAGE_LOAD_MS = 120_000


def new_tab(browser, width: int = 1280, height: int = 900, **options):
    """A fresh browser context and its tab, with the page-load timeout above."""
    context = browser.new_context(viewport={"width": width, "height": height}, **options)
    context.set_default_navigation_timeout(PAGE_LOAD_MS)
    return context, context.new_page()


def chapter_pages() -> list[Path]:
    return [p for p in pages() if p.parent.name == "chapters"]


def wait_for_figures(tab, n_figures: int) -> None:
    if n_figures:
        tab.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {n_figures}",
                              timeout=60_000)


# For every plotly figure: is there a visible x / y axis without a title, and is it inside a captioned figure?
FIGURE_CHECK = """
() => Array.from(document.querySelectorAll('.js-plotly-plot')).map((el, i) => {
  const L = el._fullLayout || {};
  const axes = Object.keys(L).filter(k => /^[xy]axis[0-9]*$/.test(k) && L[k] && L[k].visible !== false);
  const titled = k => !!(L[k].title && L[k].title.text);
  const missing = ['x', 'y'].filter(a => axes.some(k => k[0] === a) && !axes.some(k => k[0] === a && titled(k)));
  const fig = el.closest('figure');
  const caption = fig ? fig.querySelector('figcaption') : null;
  return {index: i, title: (L.title && L.title.text) || '', missing: missing,
          caption: caption ? caption.innerText.trim() : ''};
})
"""

# Hidden (hide-input) cells are opened first: a reader who expands them should not have to scroll either.
WIDE_CODE = """
() => { document.querySelectorAll('details').forEach(d => { d.open = true; });
  return Array.from(document.querySelectorAll('.cell_input pre')).filter(el => el.scrollWidth > el.clientWidth + 1)
  .map(el => el.textContent.split('\\n').sort((a, b) => b.length - a.length)[0].slice(0, 100)); }
"""


@pytest.mark.parametrize("page", chapter_pages(), ids=lambda p: p.name)
def test_chapter_page_reads_cleanly(server, browser, loads_dir, page):
    """Issue 11: figures with axis titles and numbered captions, no code wider than the page, no stray
    outputs, a working .ipynb download."""
    import json
    import urllib.request

    found = desktop_load(server, browser, loads_dir, page)
    figures, wide, stray, links, run_box = (found[k] for k in ("figures", "wide", "stray", "links", "run_box"))
    problems = [f"figure {f['index']} ({f['title'][:50]!r}): no {'/'.join(f['missing'])}-axis title"
                for f in figures if f["missing"]]
    problems += [f"figure {f['index']} ({f['title'][:50]!r}): no caption" for f in figures
                 if not f["caption"]]
    problems += [f"code cell wider than the page: {line!r}" for line in wide]
    problems += [f"stray output: {text!r}" for text in stray]
    if len(run_box) != 1:
        problems.append(f"{len(run_box)} 'Run this chapter' boxes on the page (expected one)")
    elif not re.search(r"\bci: \d+ (s|min)", run_box[0]) or "make lab" not in run_box[0]:
        problems.append(f"the 'Run this chapter' box lacks the command or the measured ci time: {run_box[0]!r}")
    assert links, "no .ipynb download link on the page"
    with urllib.request.urlopen(links[0]) as response:
        notebook = json.loads(response.read())
    if not notebook.get("cells"):
        problems.append(f"the downloaded notebook {links[0]} has no cells")
    assert not problems, "\n".join(problems)


# The results pages show the networks themselves, not only tables: figure name -> what it draws.
RESULT_FIGURES = {
    "07_method.html": ("fig-wf-moons-panels", "fig-wf-moons-motion"),
    "08_results.html": ("fig-res-verdict",),
    "08b_mnist.html": ("fig-mn-accuracy", "fig-mn-pca", "fig-mn-first-layer", "fig-mn-training",
                       "fig-mn-along-training"),
    "08c_posterior.html": ("fig-post-points", "fig-post-reliability"),
    "08d_cnn.html": ("fig-cnn-accuracy", "fig-cnn-filters"),
}


@pytest.mark.parametrize("page", [p for p in chapter_pages() if p.name in RESULT_FIGURES], ids=lambda p: p.name)
def test_result_pages_show_the_networks(server, browser, loads_dir, page):
    """Flow samples' decision boundaries beside trained networks and the flow in motion (chapter 7); the
    verdict as a dot plot with intervals (chapter 8); per-network accuracies, principal components of aligned
    weights, first layers as images and the fields' training curves (MNIST page); the predictive test point
    by test point and a reliability diagram (posterior page): each a named, captioned figure whose plot is
    drawn."""
    found = desktop_load(server, browser, loads_dir, page)["named"]
    problems = [f"{f['id']}: no figure with that name" for f in found if not f["figure"]]
    problems += [f"{f['id']}: the plot is not drawn" for f in found if f["figure"] and not f["drawn"]]
    problems += [f"{f['id']}: no caption" for f in found if f["figure"] and not f["caption"]]
    assert not problems, "\n".join(problems)


# Figures with a slider over plotly frames (chapter 7's flow in motion): every step names a frame, and the
# slider moves the figure in the static page, without a kernel.
SLIDER_CHECK = """
async () => { const out = [];
  for (const gd of Array.from(document.querySelectorAll('.js-plotly-plot'))) {
    const L = gd._fullLayout || {};
    if (!L.sliders || !L.sliders.length) { continue; }
    const frames = ((gd._transitionData || {})._frames || []).map(f => f.name);
    const steps = L.sliders[0].steps.map(s => (s.args && s.args[0] || [])[0]);
    const z = () => (gd.querySelector('.cartesianlayer') || gd).innerHTML;   // what the panels draw
    let error = null, moved = null;
    try {
      const go = name => Plotly.animate(gd, [name], {frame: {duration: 0, redraw: true}, mode: 'immediate',
                                                     transition: {duration: 0}});
      await go(steps[0]); const first = z();
      await go(steps[steps.length - 1]); moved = z() !== first;
    } catch (e) { error = String(e); }
    out.push({title: (L.title && L.title.text) || '', frames: frames, steps: steps, moved: moved, error: error});
  }
  return out; }
"""


@pytest.mark.parametrize("page", chapter_pages(), ids=lambda p: p.name)
def test_slider_figures_move_without_a_kernel(server, browser, loads_dir, page):
    """A figure with a slider has one frame per slider step (at least two), and moving from the first step
    to the last redraws its panels, in the static HTML page."""
    if '"sliders"' not in page.read_text():
        pytest.skip("no slider figure on this page")
    loaded = desktop_load(server, browser, loads_dir, page)
    found, errors = loaded["sliders"], [e for e in loaded["errors"] if e.startswith("uncaught")]
    assert found, "the page has a slider in its HTML but no plotly figure with one"
    problems = list(errors)
    for f in found:
        name = f"figure {f['title'][:50]!r}"
        if len(f["steps"]) < 2 or sorted(f["steps"]) != sorted(f["frames"]):
            problems.append(f"{name}: slider steps {f['steps']} do not name its frames {f['frames']}")
        if f["error"] or not f["moved"]:
            problems.append(f"{name}: moving the slider did not redraw the figure ({f['error']})")
    assert not problems, "\n".join(problems)


# hrefs of sphinx-book-theme's launch buttons: JupyterHub (nbgitpuller), Binder, Colab, Deepnote
LAUNCH_HREF = re.compile(r'href="([^"]*(?:/git-pull\?|/v2/(?:gh|gl|git)/|colab\.research\.google\.com/github/'
                         r'|deepnote\.com/launch)[^"]*)"')


def test_launch_links_point_to_the_configured_repository():
    """A launch button clones the repository the build names (``repository.url`` in ``_config.yml`` or
    ``WSBOOK_REPOSITORY_URL``, which ``tests/gates.py`` hands to the build and to this test alike); a build
    that names none has no launch button at all."""
    import html as html_lib
    from urllib.parse import parse_qs, urlsplit

    import yaml

    from wsbook.sphinx import LAUNCH_PROVIDERS, repository_url

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    expected = repository_url({"repository_url": (config.get("repository") or {}).get("url") or ""}).rstrip("/")
    providers = any((config.get("launch_buttons") or {}).get(key) for key in LAUNCH_PROVIDERS)
    problems = []
    for page in chapter_pages():
        text = page.read_text()
        links = [html_lib.unescape(url) for url in LAUNCH_HREF.findall(text)]
        if not expected:
            if links or "dropdown-launch-buttons" in text:
                problems.append(f"{page.name}: launch buttons ({links}) although no repository is configured")
            continue
        if providers and not links:
            problems.append(f"{page.name}: no launch button although {expected} is configured")
        for url in links:
            repo = parse_qs(urlsplit(url).query).get("repo", [""])[0]
            ok = repo.rstrip("/") == expected if repo else "/".join(expected.split("/")[-2:]) in url
            if not ok:
                problems.append(f"{page.name}: launch link {url} does not clone {expected}")
    assert not problems, "\n".join(problems)


PLOTLY_SCRIPT = re.compile(r'<script src="[^"]*_static/(plotly\.min\.js|plotly/plotly-(?:cartesian|gl3d)\.min\.js)')


def test_plotly_only_on_pages_with_figures():
    """Issue 11: plotly.js (megabytes) is linked only by the pages that draw a figure, once; a page whose
    figures are all 2-D links the cartesian partial bundle (1.5 MB instead of 4.8 MB), a page of 3-D scenes and
    scatter plots the gl3d one (1.75 MB), when the book ships them at the installed plotly.js's version, and
    the full bundle only where a page needs both kinds of trace."""
    from wsbook import sphinx

    shipped = {name: drawn for name, drawn in sphinx.PARTIAL_BUNDLES.items()
               if sphinx.plotly_bundle(set(drawn), ROOT / "_static") == name}
    problems = []
    for page in pages():
        html = page.read_text()
        if "http-equiv=\"Refresh\"" in html:
            continue
        loads = PLOTLY_SCRIPT.findall(html)
        draws = "Plotly.newPlot" in html
        if len(loads) != (1 if draws else 0):
            problems.append(f"{page.name}: links plotly.js {loads}, draws a figure: {draws}")
            continue
        if draws:
            types = sphinx.page_trace_types(html[html.find("<body"):])
            wanted = next((name for name, drawn in shipped.items() if types <= drawn), "plotly.min.js")
            if loads[0] != wanted:
                problems.append(f"{page.name}: trace types {sorted(types)} load {loads[0]}, not {wanted}")
    assert not problems, "\n".join(problems)


def test_no_fontawesome_script_and_the_icons_still_drawn(server, browser):
    """The theme's fontawesome.js (1.5 MB of JavaScript on every page) is not linked; its stylesheet draws
    the header's icons from Font Awesome's web font instead: each icon has a glyph of that font and a size."""
    linked = [p.name for p in pages() if "scripts/fontawesome.js" in p.read_text()]
    assert not linked, f"pages still link fontawesome.js: {linked[:5]}"
    page = next(p for p in chapter_pages() if p.name.startswith("01_"))
    context, tab = new_tab(browser)
    tab.goto(f"{server}/{page.relative_to(HTML).as_posix()}", wait_until="load")
    tab.evaluate("document.fonts.ready")
    icons = tab.evaluate("""() => Array.from(document.querySelectorAll(
        '.header-article i[class*="fa-"], .bd-header i[class*="fa-"], .theme-switch-button i[class*="fa-"]'
        )).map(el => {
          const before = getComputedStyle(el, '::before'), box = el.getBoundingClientRect();
          return {cls: el.className, font: before.fontFamily, content: before.content,
                  visible: el.offsetParent !== null, width: box.width,
                  loaded: document.fonts.check('900 16px "Font Awesome 6 Free"')}; })""")
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SHOTS / "icons__header.png"), clip={"x": 0, "y": 0, "width": 1280, "height": 120})
    context.close()
    shown = [i for i in icons if i["visible"]]
    assert shown, f"no Font Awesome icon in the page header: {icons}"
    bad = [i for i in shown if "Font Awesome" not in i["font"] or i["content"] in ("none", "normal", '""')
           or i["width"] < 4 or not i["loaded"]]
    assert not bad, f"icons not drawn from the web font: {bad}"


# For every figure: series (legend entries, named boxes) that a reader cannot tell apart (same colour, dash,
# marker symbol, fill and kind of mark) although they are different series, and the colour of each named
# series (a series keeps its colour in every figure of the page); annotations and shapes on a log
# axis drawn outside the plotted range, or an annotation placed at a line's value as if the axis were linear
# (plotly places annotations on a log axis at the log10 of their coordinate, shapes at the value itself).
FIGURE_MARKS = """
() => Array.from(document.querySelectorAll('.js-plotly-plot')).map((gd) => {
  const L = gd._fullLayout || {}, problems = [];
  const fig = gd.closest('figure');
  const norm = c => (typeof c === 'string') ? c.replace(/\\s/g, '').toLowerCase() : null;
  const looks = {}, colours = {};
  for (const t of gd._fullData || []) {
    const series = t.legendgroup || t.name;
    if (!series || !(t.showlegend || t.type === 'box' || t.type === 'violin')) continue;
    const m = t.marker || {}, l = t.line || {}, mode = t.mode || '';
    let colour, look;
    if (['bar', 'histogram', 'barpolar'].includes(t.type)) {
      colour = norm(m.color); look = [t.type, colour, (m.pattern || {}).shape || ''];
    } else if (t.type === 'box' || t.type === 'violin') {
      colour = norm(l.color || m.color); look = [t.type, colour, norm(t.fillcolor), m.symbol || ''];
    } else {
      const lines = mode.includes('lines') || mode === '' , markers = mode.includes('markers');
      colour = norm(lines && l.color ? l.color : m.color);
      look = [t.type, colour, lines ? (l.dash || 'solid') : '', markers ? (m.symbol || 'circle') : '',
              lines, markers, norm(t.fill && t.fill !== 'none' ? t.fillcolor : null)];
    }
    if (!colour) continue;
    if (t.name) colours[t.name] = colour;
    const key = JSON.stringify(look);
    (looks[key] = looks[key] || new Set()).add(series);
  }
  for (const [key, names] of Object.entries(looks))
    if (names.size > 1) problems.push(`series drawn alike (${JSON.parse(key).slice(0, 2).join(' ')}): ${[...names].join(' | ')}`);
  const axis = ref => (!ref || ref === 'paper' || / domain$/.test(ref)) ? null : L[ref[0] + 'axis' + ref.slice(1)];
  const lines = {};
  for (const s of L.shapes || []) for (const d of ['x', 'y']) {
    const ax = axis(s[d + 'ref']);
    if (!ax || ax.type !== 'log') continue;
    for (const v of [s[d + '0'], s[d + '1']]) {
      const lv = Math.log10(v), r = ax.range;
      (lines[ax._id] = lines[ax._id] || []).push(v);
      if (!(lv >= Math.min(...r) - 1e-9 && lv <= Math.max(...r) + 1e-9))
        problems.push(`a line at ${d} = ${v} is outside the log axis ${ax._id} (10^${r.map(x => x.toFixed(2))})`);
    }
  }
  for (const a of L.annotations || []) for (const d of ['x', 'y']) {
    const ax = axis(a[d + 'ref']);
    if (!ax || ax.type !== 'log') continue;
    const v = a[d], r = ax.range;
    if (!(v >= Math.min(...r) - 1e-9 && v <= Math.max(...r) + 1e-9))
      problems.push(`annotation '${a.text}' at ${d} = 10^${v} is outside the log axis ${ax._id}`);
    else if ((lines[ax._id] || []).some(w => Math.abs(w - v) < 1e-9 && Math.abs(Math.log10(w) - v) > 1e-6))
      problems.push(`annotation '${a.text}' at ${d} = 10^${v}, not at its line (${v}): give log10 of the value`);
  }
  return {id: fig ? fig.id || (fig.querySelector('[id]') || {}).id || '' : '',
          title: (L.title && L.title.text) || '', problems: problems, colours: colours};
})
"""

#: pages whose figures are known to draw series alike or to recolour a series, with what must change there;
#: remove an entry once its page passes
KNOWN_ALIKE: dict[str, str] = {}


@pytest.mark.parametrize("page", chapter_pages(), ids=lambda p: p.name)
def test_figures_tell_series_apart_and_place_log_marks(server, browser, loads_dir, page, request):
    """Two different series of a figure never look the same (colour, dash, symbol, fill), so the legend can be
    read; a series keeps its colour from one figure of the page to the next; lines and annotations on log
    axes sit where their values are."""
    if not page.read_text().count("Plotly.newPlot"):
        pytest.skip("no figure on this page")
    if page.name in KNOWN_ALIKE:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_ALIKE[page.name], strict=False))
    found = desktop_load(server, browser, loads_dir, page)["marks"]
    problems = [f"{f['id'] or f['title'][:50]!r}: {p}" for f in found for p in f["problems"]]
    seen: dict[str, dict[str, list[str]]] = {}
    for f in found:
        for name, colour in f["colours"].items():
            seen.setdefault(name, {}).setdefault(colour, []).append(f["id"] or f["title"][:30])
    problems += [f"series {name!r} changes colour between figures: {by}" for name, by in seen.items()
                 if len(by) > 1]
    assert not problems, "\n".join(problems)


def test_tables_against_hmc_have_an_hmc_reference():
    """A column labelled "... with HMC" / "... to HMC" (``figures.label`` of ``agreement`` and ``tv``) is only
    used by a table that has an HMC row: a table whose reference is not HMC says so in its own words."""
    problems = []
    for page in chapter_pages():
        for table in re.findall(r"<table.*?</table>", page.read_text(), flags=re.S):
            headers = [h.strip() for h in re.findall(r"<th[^>]*>(.*?)</th>", table, flags=re.S)]
            against = [h for h in headers if re.search(r"\b(with|to) HMC\b", h)]
            if against and "HMC" not in headers:
                problems.append(f"{page.name}: columns {against} in a table without an HMC row")
    assert not problems, "\n".join(problems)


def test_there_are_pages():
    assert len(pages()) >= 3, f"expected the built book's pages in {HTML}"
    missing = set(RESULT_FIGURES) - {p.name for p in chapter_pages()}
    assert not missing, f"no chapter pages {sorted(missing)} in {HTML} (RESULT_FIGURES names them)"


def test_api_reference_shows_weightflow(server, browser):
    """The API reference (book/api/, autodoc) is built: the weightflow page shows the class WeightFlow with
    its signature and methods."""
    page = HTML / "book" / "api" / "weightflow.html"
    assert page.exists(), f"no API page for wsbook.weightflow at {page}"
    context, tab = new_tab(browser)
    tab.goto(f"{server}/{page.relative_to(HTML).as_posix()}", wait_until="load")
    text = tab.evaluate("document.querySelector('main').innerText")
    signatures = tab.evaluate("Array.from(document.querySelectorAll('dt.sig')).map(el => el.id)")
    context.close()
    assert "WeightFlow" in text, "the weightflow API page does not show WeightFlow"
    assert "wsbook.weightflow.WeightFlow" in signatures and "wsbook.weightflow.WeightFlow.fit" in signatures, \
        signatures[:20]


@pytest.fixture(scope="session")
def loads_dir(tmp_path_factory, worker_id) -> Path:
    """Where :func:`desktop_load` keeps what it found, one file a page: the parent of the workers' temporary
    directories is this run's own and shared by its pytest-xdist workers."""
    root = tmp_path_factory.getbasetemp()
    return (root if worker_id == "master" else root.parent) / "desktop-loads"

NAMED_FIGURES = """ids => ids.map(id => { const el = document.getElementById(id);
    const fig = el && (el.tagName === 'FIGURE' ? el : el.closest('figure') || el.querySelector('figure'));
    const cap = fig && fig.querySelector('figcaption');
    return {id: id, figure: !!fig, drawn: !!(fig && fig.querySelector('.js-plotly-plot .main-svg')),
            caption: cap ? cap.innerText.trim() : ''}; })"""


def desktop_load(server, browser, loads_dir: Path, page: Path) -> dict:
    """Open ``page`` once at desktop width (1280 px) and read everything the desktop tests check: console
    errors, uncaught exceptions and failed requests, drawn figures and typeset math, a full-page screenshot;
    on a chapter page also its figures' titles and captions, marks, named result figures, stray outputs,
    download links, the "Run this chapter" box, code wider than the page (with hidden cells opened) and,
    last since it moves them, the slider figures. A page of 3-D scenes takes half a minute to load here, so
    every test of a page reads this one load, whichever worker runs it (a file lock per page)."""
    import json

    from filelock import FileLock

    loads_dir.mkdir(parents=True, exist_ok=True)
    path = loads_dir / f"{page.relative_to(HTML).as_posix().replace('/', '__')}.json"
    with FileLock(f"{path}.lock"):
        if not path.exists():
            path.write_text(json.dumps(_desktop_load(server, browser, page)))
        return json.loads(path.read_text())


def _desktop_load(server, browser, page: Path) -> dict:
    url = f"{server}/{page.relative_to(HTML).as_posix()}"
    errors: list[str] = []
    context, tab = new_tab(browser)
    tab.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
    tab.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    tab.on("requestfailed", lambda req: errors.append(f"request failed: {req.url} ({req.failure})"))
    html = page.read_text()
    redirect = re.search(r'http-equiv="Refresh" content="0; url=([^"]+)"', html)
    found: dict = {"redirect": redirect and redirect.group(1)}
    if redirect:  # the root index.html only forwards to the first page: follow it and check that page
        target = (page.parent / redirect.group(1)).resolve()
        found["redirect_exists"] = target.exists()
        if target.exists():
            with tab.expect_navigation(url=f"**/{redirect.group(1)}", wait_until="load"):
                tab.goto(url)
            html = target.read_text()
    else:
        tab.goto(url, wait_until="load")
    found["n_figures"] = n_figures = html.count("Plotly.newPlot")
    wait_for_figures(tab, n_figures)
    found["has_math"] = has_math = "math notranslate" in html or "\\(" in html
    if has_math:
        tab.wait_for_function("document.querySelectorAll('mjx-container').length > 0", timeout=60_000)
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SHOTS / f"{page.relative_to(HTML).as_posix().replace('/', '__')}.png"), full_page=True)
    found["rendered"] = tab.evaluate("document.querySelectorAll('.js-plotly-plot .main-svg').length")
    found["typeset"] = tab.evaluate("document.querySelectorAll('mjx-container').length")
    if page.parent.name == "chapters":
        found["figures"] = tab.evaluate(FIGURE_CHECK)
        found["marks"] = tab.evaluate(FIGURE_MARKS)
        found["named"] = tab.evaluate(NAMED_FIGURES, list(RESULT_FIGURES.get(page.name, ())))
        found["stray"] = tab.evaluate("Array.from(document.querySelectorAll('.cell_output .output.text_plain'))"
                                      ".map(el => el.innerText.trim().slice(0, 60))")
        found["links"] = tab.evaluate("Array.from(document.querySelectorAll('a[href$=\".ipynb\"]')).map(a => a.href)")
        # textContent: the box is collapsed, and innerText leaves out what is hidden
        found["run_box"] = tab.evaluate("Array.from(document.querySelectorAll('.wsbook-run')).map(el => el.textContent)")
        found["wide"] = tab.evaluate(WIDE_CODE)
        found["sliders"] = None
        if '"sliders"' in html:
            # a figure with frames plays once when the page opens: let it finish before moving the slider
            tab.wait_for_function("Array.from(document.querySelectorAll('.js-plotly-plot'))"
                                  ".every(gd => !gd._transitionData || !gd._transitionData._animationRaf)",
                                  timeout=60_000)
            found["sliders"] = tab.evaluate(SLIDER_CHECK)
    context.close()
    found["errors"] = errors
    return found


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(HTML)))
def test_page_renders(server, browser, loads_dir, page):
    found = desktop_load(server, browser, loads_dir, page)
    if found["redirect"]:
        assert found["redirect_exists"], f"{page.name} redirects to a missing page {found['redirect']}"
    assert not found["errors"], "\n".join(found["errors"])
    if found["n_figures"]:
        assert found["rendered"] >= found["n_figures"], \
            f"{found['n_figures']} plotly figures in the page, {found['rendered']} rendered"
    if found["has_math"]:
        assert found["typeset"] > 0, "the page has math but MathJax typeset nothing"


# At phone width: how far the page scrolls sideways, and for every figure whether its legend (the book's
# default: horizontal, below the plot) clears the plot areas and x-axis titles, whether it stays inside
# the figure and the page, and whether the numeric axes format their hover labels.
PHONE_CHECK = """
() => ({scroll: document.scrollingElement.scrollWidth, width: window.innerWidth,
  figures: Array.from(document.querySelectorAll('.js-plotly-plot')).map((gd, i) => {
    const L = gd._fullLayout || {}, box = gd.getBoundingClientRect();
    const legend = gd.querySelector('g.legend');
    const below = Array.from(gd.querySelectorAll('.nsewdrag'))
      .concat(Array.from(gd.querySelectorAll('text')).filter(t => /^x[0-9]*title$/.test(t.getAttribute('class'))))
      .map(e => e.getBoundingClientRect().bottom);
    const axes = Object.keys(L).filter(k => /^[xy]axis[0-9]*$/.test(k) && L[k] && L[k].visible !== false
                                            && ['linear', 'log'].includes(L[k].type));
    const ownLegend = !!(legend && L.showlegend && L.legend && L.legend.orientation === 'h'
                         && L.legend.yref === 'container');
    const lb = legend ? legend.getBoundingClientRect() : null;
    return {index: i, title: (L.title && L.title.text) || '', right: box.right, bottom: box.bottom,
            legend: ownLegend ? {top: lb.top, bottom: lb.bottom, right: lb.right} : null,
            plotBottom: below.length ? Math.max(...below) : null,
            unformatted: axes.filter(k => !L[k].hoverformat)};
  })})
"""


@pytest.mark.parametrize("page", chapter_pages(), ids=lambda p: p.name)
def test_chapter_page_at_phone_width(server, browser, page):
    """Issue 11: at 400 px the page does not scroll sideways, figures fit, legends sit below the plot
    (never over it, never cut off) and hover labels are formatted (no ``10.83285p``)."""
    context, tab = new_tab(browser, 400, 850, device_scale_factor=1)
    tab.goto(f"{server}/{page.relative_to(HTML).as_posix()}", wait_until="load")
    n_figures = page.read_text().count("Plotly.newPlot")
    wait_for_figures(tab, n_figures)
    if n_figures:
        tab.wait_for_timeout(500)   # the reflow and legend fit are relayouts after the first draw
    found = tab.evaluate(PHONE_CHECK)
    box = tab.evaluate("""() => { const el = document.querySelector('.wsbook-run');
        return el && {hidden: el.classList.contains('toggle-hidden'), height: el.getBoundingClientRect().height}; }""")
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SHOTS / f"phone__{page.name}.png"), full_page=True)
    context.close()
    problems = []
    # the "Run this chapter" box starts collapsed: its title, not a first screen of instructions
    if not box or not box["hidden"] or box["height"] > 850 / 3:
        problems.append(f"the 'Run this chapter' box is not collapsed at 400 px: {box}")
    if found["scroll"] > found["width"] + 1:
        problems.append(f"the page scrolls sideways: {found['scroll']} px wide at {found['width']} px")
    for f in found["figures"]:
        name = f"figure {f['index']} ({f['title'][:50]!r})"
        if f["right"] > found["width"] + 1:
            problems.append(f"{name} is wider than the screen (right edge at {f['right']:.0f} px)")
        legend = f["legend"]
        if legend and f["plotBottom"] is not None and legend["top"] < f["plotBottom"] - 1:
            problems.append(f"{name}: the legend (top {legend['top']:.0f}) overlaps the plot or its x-axis title "
                            f"(bottom {f['plotBottom']:.0f})")
        if legend and legend["bottom"] > f["bottom"] + 1:
            problems.append(f"{name}: the legend is cut off at the bottom of the figure")
        if f["unformatted"]:
            problems.append(f"{name}: no hover number format on {f['unformatted']}")
    assert n_figures == 0 or found["figures"], "the page draws figures but none was found"
    assert not problems, "\n".join(problems)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_chapter_opens_as_notebook_in_jupyterlab(browser, tmp_path):
    """Issue 11: in JupyterLab from this environment (``make lab``) a chapter's ``.md`` opens as a
    notebook (jupytext is the default viewer, book/jupyterlab-overrides.json installed by ``make install``)."""
    lab = Path(sys.executable).parent / "jupyter-lab"
    assert lab.exists(), f"no jupyter-lab next to {sys.executable}"
    chapter = "03_flow_matching.md"
    assert (ROOT / "chapters" / chapter).exists()
    token, port = secrets.token_hex(16), _free_port()
    # a private Jupyter home: the user's own settings and workspaces must not decide the viewer
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_DATA_DIR=str(tmp_path / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"), WSBOOK_PROGRESS="0")
    # every cell in the page (no windowing), so that all of the chapter's code cells can be counted
    tracker = tmp_path / "settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text('{"windowingMode": "none"}')
    n_code = (ROOT / "chapters" / chapter).read_text().count("```{code-cell}")
    log = open(tmp_path / "lab.log", "w")
    server = subprocess.Popen(
        [str(lab), "--no-browser", "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={ROOT / 'chapters'}", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 40
        while True:
            assert server.poll() is None, f"jupyter lab exited:\n{(tmp_path / 'lab.log').read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"jupyter lab did not start:\n{(tmp_path / 'lab.log').read_text()[-2000:]}"
            time.sleep(0.5)
        context, tab = new_tab(browser)
        tab.goto(f"{base}/lab/tree/{chapter}?token={token}", wait_until="load")
        try:
            tab.wait_for_function(f"document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-CodeCell')"
                                  f".length >= {n_code}", timeout=45_000)
        except Exception:
            SHOTS.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=str(SHOTS / "jupyterlab__failed.png"))
            editors = tab.evaluate("document.querySelectorAll('.jp-FileEditor').length")
            pytest.fail(f"{chapter} did not open as a notebook in JupyterLab ({editors} text editors open; "
                        "is .venv/share/jupyter/lab/settings/overrides.json installed?)")
        opened = tab.evaluate("""() => ({code: document.querySelectorAll('.jp-Notebook .jp-CodeCell').length,
            markdown: document.querySelectorAll('.jp-Notebook .jp-MarkdownCell').length,
            tab: Array.from(document.querySelectorAll('.lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel'))
                 .map(el => el.textContent)})""")
        context.close()
        assert opened["code"] == n_code and opened["markdown"] >= 1, (n_code, opened)
        assert chapter in opened["tab"], f"the current tab is {opened['tab']}, not {chapter}"
    finally:
        try:
            urllib.request.urlopen(urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST"),
                                   timeout=5).close()
        except OSError:
            pass
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait()
        log.close()
