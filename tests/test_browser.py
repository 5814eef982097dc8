"""Open every page of the built book in a real headless Chromium (Debian's package).

Fails on any JavaScript console error or uncaught exception, checks that pages with figures contain
plotly-rendered SVG and that pages with math were typeset by MathJax, and saves screenshots to
``_build/screenshots/``. The HTML directory comes from ``WSBOOK_HTML_DIR`` (set by ``tests/gates.py``).
"""
from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import threading
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
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(HTML))
    handler.log_message = lambda *a, **k: None
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


def test_there_are_pages():
    assert len(pages()) >= 3, f"expected the built book's pages in {HTML}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(HTML)))
def test_page_renders(server, browser, page):
    url = f"{server}/{page.relative_to(HTML).as_posix()}"
    errors: list[str] = []
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
    tab.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    tab.on("requestfailed", lambda req: errors.append(f"request failed: {req.url} ({req.failure})"))
    html = page.read_text()
    redirect = re.search(r'http-equiv="Refresh" content="0; url=([^"]+)"', html)
    if redirect:  # the root index.html only forwards to the first page: follow it and check that page
        target = (page.parent / redirect.group(1)).resolve()
        assert target.exists(), f"{page.name} redirects to a missing page {redirect.group(1)}"
        with tab.expect_navigation(url=f"**/{redirect.group(1)}", wait_until="load"):
            tab.goto(url)
        html = target.read_text()
    else:
        tab.goto(url, wait_until="load")
    n_figures = html.count("Plotly.newPlot")
    if n_figures:
        tab.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {n_figures}",
                              timeout=60_000)
    has_math = "math notranslate" in html or "\\(" in html
    if has_math:
        tab.wait_for_function("document.querySelectorAll('mjx-container').length > 0", timeout=60_000)
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SHOTS / f"{page.relative_to(HTML).as_posix().replace('/', '__')}.png"), full_page=True)
    rendered = tab.evaluate("document.querySelectorAll('.js-plotly-plot .main-svg').length")
    typeset = tab.evaluate("document.querySelectorAll('mjx-container').length")
    context.close()
    assert not errors, "\n".join(errors)
    if n_figures:
        assert rendered >= n_figures, f"{n_figures} plotly figures in the page, {rendered} rendered"
    if has_math:
        assert typeset > 0, "the page has math but MathJax typeset nothing"
