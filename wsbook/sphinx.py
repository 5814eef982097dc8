"""Sphinx extension used by the book build: ship ``plotly.min.js`` with the HTML (no CDN, no require.js),
and stamp the book with its version, build date and scale.

Figures rendered by :class:`wsbook.figures.BookRenderer` are plain divs plus a ``Plotly.newPlot`` call,
so the library must be loaded, synchronously, before the page body; this extension copies the copy of
plotly.js that ships with the installed ``plotly`` package into ``_static`` and links it in the ``<head>``
of the pages that draw a figure, and only those (about 4.6 MB that a page without figures never loads).
A page whose figures use only the trace types of one of plotly.js's partial bundles (:data:`PARTIAL_BUNDLES`:
the cartesian one for 2-D figures, 1.5 MB; the gl3d one for 3-D scenes with scatter plots, 1.75 MB; both in
``_static/plotly``, kept at the installed plotly.js's version) loads that bundle instead (:func:`plotly_bundle`);
pages that mix 3-D scenes with other 2-D trace types load the full one. The theme's Font Awesome script
(1.5 MB of JavaScript that redraws the icons as SVG) is not linked: the theme's stylesheet draws the same
icons from Font Awesome's web fonts (:func:`_drop_fontawesome_js`).

The build stamp is available to every page as the MyST substitutions ``{{ wsbook_version }}``,
``{{ build_date }}`` and ``{{ build_scale }}``, and is shown in the footer of every page; the cite page's
BibTeX entry is the directive ``wsbook-bibtex`` (:func:`bibtex_entry`, nothing to fill in by hand), and
``{{ default_chapter_times }}`` sums up the measured ``default`` run times for the introduction.

Every chapter page (``chapters/*``) opens with a "Run this chapter" box, collapsed: how to open it in
JupyterLab, at which scale, how to precompute what it reads, what JupyterLab does not render, and its run
time at ``ci`` and ``default`` as measured and recorded in one data file, ``book/chapter_times.csv``
(columns ``chapter, scale, seconds, machine, date``); the chapters themselves carry no numbers.

Launch buttons (a chapter opened on a JupyterHub after nbgitpuller cloned the book's repository) appear
only when a repository is configured: ``repository.url`` in ``_config.yml`` (empty by default) or the
environment variable ``WSBOOK_REPOSITORY_URL``. Without one, the pages have no launch button and the box
says how to run the chapter from a clone (:func:`launch_theme_options`).
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
from pathlib import Path

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

#: The measured run times of the chapters, relative to the book's root.
CHAPTER_TIMES = "book/chapter_times.csv"
TIME_COLUMNS = ("chapter", "scale", "seconds", "machine", "date")
#: Scales whose run time every chapter box reports ("not measured" when the file has no number).
BOX_SCALES = ("ci", "default")
#: The chapters whose artifacts ``python -m wsbook chapter/<prefix>`` computes ahead (the groups of
#: ``wsbook.cli.groups``; a test keeps the two in step, the ground floor cannot import the CLI).
PRECOMPUTE_GROUPS = ("chapter/02", "chapter/05", "chapter/06", "chapter/08", "chapter/08b", "chapter/08c",
                     "chapter/08d", "chapter/09")
#: The environment variable that names the book's repository (wins over ``repository.url``).
REPOSITORY_ENV = "WSBOOK_REPOSITORY_URL"
#: The repository jupyter-book fills in when ``_config.yml`` names none: not the book's, never linked.
JUPYTER_BOOK_DEFAULT_REPOSITORY = "https://github.com/executablebooks/jupyter-book"
#: The ``launch_buttons`` keys of sphinx-book-theme that make a launch button.
LAUNCH_PROVIDERS = ("binderhub_url", "jupyterhub_url", "colab_url", "deepnote_url", "jupyterlite_url", "thebe")
#: plotly.js's cartesian partial bundle, relative to the book's ``_static`` (see its README.txt there).
PARTIAL_PLOTLY = "plotly/plotly-cartesian.min.js"
#: The trace types that bundle draws (``plotly.js-cartesian-dist-min``).
CARTESIAN_TRACES = frozenset({"bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour",
                              "image", "pie", "scatter", "scatterternary", "violin"})
#: plotly.js's gl3d partial bundle (``plotly.js-gl3d-dist-min``) and the trace types it draws.
GL3D_PLOTLY = "plotly/plotly-gl3d.min.js"
GL3D_TRACES = frozenset({"cone", "isosurface", "mesh3d", "scatter", "scatter3d", "streamtube", "surface", "volume"})
#: The partial bundles in the book's ``_static``, smallest first, with the trace types each draws.
PARTIAL_BUNDLES = {PARTIAL_PLOTLY: CARTESIAN_TRACES, GL3D_PLOTLY: GL3D_TRACES}


def _plotly_js() -> Path:
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.exists():
        raise FileNotFoundError(f"plotly.min.js not found in the installed plotly package ({path})")
    return path


def plotly_js_version(path: Path) -> str | None:
    """The plotly.js version a bundle names in its first lines (``v4.1.1`` -> ``"4.1.1"``), if any."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        head = handle.read(400)
    found = re.search(r"plotly\.js(?: \([^)]*\))? v(\d+\.\d+\.\d+)", head)
    return found.group(1) if found else None


def page_trace_types(body: str) -> set[str]:
    """The plotly trace types of every figure drawn in a page's HTML body: the data (second argument) of each
    ``Plotly.newPlot`` call and of each ``Plotly.addFrames`` call (a trace without a type is a scatter)."""
    decoder = json.JSONDecoder()
    types: set[str] = set()
    for call in re.finditer(r"Plotly\.(newPlot|addFrames)\(\s*(\"[^\"]*\"|'[^']*')\s*,\s*", body):
        try:
            value, _ = decoder.raw_decode(body, call.end())
        except ValueError:
            types.add("unknown")   # not plain JSON: the full bundle
            continue
        traces = value if call.group(1) == "newPlot" else [t for frame in value for t in frame.get("data", [])]
        types |= {str(t.get("type") or "scatter") for t in traces if isinstance(t, dict)}
    return types


def plotly_bundle(types: set[str], static: Path) -> str:
    """The plotly.js file, relative to ``_static``, for a page whose figures use the trace ``types``: the
    first partial bundle of :data:`PARTIAL_BUNDLES` in the book's ``static`` folder that draws them all and is
    the installed plotly.js's version, else the installed full bundle (``plotly.min.js``)."""
    for name, drawn in PARTIAL_BUNDLES.items():
        partial = static / name
        if types <= drawn and partial.exists() and plotly_js_version(partial) == plotly_js_version(_plotly_js()):
            return name
    return "plotly.min.js"


_FONTAWESOME_JS = re.compile(r'[ \t]*<script defer src="[^"]*_static/scripts/fontawesome\.js[^"]*"></script>\n?')


def _drop_fontawesome_js(text: str) -> str:
    """A page without the theme's ``fontawesome.js`` link (pydata-sphinx-theme links it "so that users can
    add custom icons", which this book does not; its stylesheet draws the icons from the web fonts)."""
    return _FONTAWESOME_JS.sub("", text)


def _finish_html(app, exc) -> None:
    if exc is None and app.builder.format == "html":
        _dedupe_inline_scripts(Path(app.outdir))
        static = Path(app.outdir) / "_static"
        static.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_plotly_js(), static / "plotly.min.js")
        # Browsers also ask for /favicon.ico on pages without an icon link (the root redirect page).
        favicon = Path(app.srcdir) / (app.config.html_favicon or "")
        if app.config.html_favicon and favicon.suffix == ".ico" and favicon.exists():
            shutil.copyfile(favicon, Path(app.outdir) / "favicon.ico")


def _dedupe_inline_scripts(outdir: Path) -> None:
    # jupyter-book 1.x emits sphinx-thebe's inline config twice in every page's <head>, which throws
    # "Identifier 'THEBE_JS_URL' has already been declared"; keep the first copy of each inline script.
    for page in outdir.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        head_end = text.find("</head>")
        if head_end < 0:
            continue
        seen, kept = set(), []
        for line in text[:head_end].split("\n"):
            key = line.strip()
            if key.startswith("<script>") and key.endswith("</script>"):
                if key in seen:
                    continue
                seen.add(key)
            kept.append(line)
        fixed = _drop_fontawesome_js("\n".join(kept)) + text[head_end:]
        if fixed != text:
            page.write_text(fixed, encoding="utf-8")


_CITE_HREF = "@wsbook-cite-page@"   # replaced by the page-relative link to book/cite


def build_stamp() -> dict[str, str]:
    """``wsbook_version``, ``build_date`` (UTC, ISO) and ``build_scale`` of this build."""
    import datetime

    import wsbook

    try:
        from importlib.metadata import version

        release = version("wsbook")
    except Exception:  # not installed as a distribution (PYTHONPATH checkout)
        release = getattr(wsbook, "__version__", "unknown")
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return {"wsbook_version": release, "build_date": date, "build_scale": wsbook.scale()}


def repository_url(theme_options: dict, environ=None) -> str:
    """The book's repository: ``$WSBOOK_REPOSITORY_URL`` if set, else ``repository.url`` of ``_config.yml``
    (``html_theme_options["repository_url"]``); ``""`` when neither names one (jupyter-book's own
    repository, which it fills in for a missing ``repository.url``, counts as none)."""
    environ = os.environ if environ is None else environ
    url = (environ.get(REPOSITORY_ENV) or "").strip() or str(theme_options.get("repository_url") or "").strip()
    return "" if url.rstrip("/") == JUPYTER_BOOK_DEFAULT_REPOSITORY else url


def launch_theme_options(theme_options: dict, environ=None) -> dict:
    """``html_theme_options`` with launch buttons only if a repository is configured (:func:`repository_url`):
    with one, ``repository_url`` is set to it; without one, every launch provider is switched off and
    ``repository_url`` dropped, so no page links to a repository that does not exist."""
    options = dict(theme_options)
    buttons = dict(options.get("launch_buttons") or {})
    url = repository_url(options, environ)
    if url:
        options["repository_url"] = url
    else:
        options.pop("repository_url", None)
        for key in LAUNCH_PROVIDERS:
            if key in buttons:
                buttons[key] = False if key == "thebe" else ""
    options["launch_buttons"] = buttons
    return options


def launch_enabled(theme_options: dict) -> bool:
    """Whether the pages get a launch button under these (already filtered) theme options."""
    buttons = theme_options.get("launch_buttons") or {}
    return bool(theme_options.get("repository_url")) and any(buttons.get(k) for k in LAUNCH_PROVIDERS)


def chapter_time_summary(times: dict[str, dict[str, dict]], scale: str = "default", jobs: int = 2) -> str:
    """One phrase for the introduction: the shortest and longest measured run time of a chapter at ``scale``
    and the whole book's, the chapters ``jobs`` at a time (as ``make book`` runs them)."""
    seconds = [row[scale]["seconds"] for row in times.values()
               if scale in row and row[scale]["seconds"] is not None]
    if not seconds:
        return "not measured yet"
    book = format_duration(sum(seconds) / jobs)
    return (f"from {format_duration(min(seconds))} to {format_duration(max(seconds))} a chapter on a 2-core "
            f"CPU and about {book} for the whole book, {jobs} chapters at a time, as measured in "
            f"`{CHAPTER_TIMES}`")


def _stamp(app, config) -> None:
    stamp = build_stamp()
    subs = dict(getattr(config, "myst_substitutions", None) or {})
    subs.update(stamp)
    path = Path(app.srcdir) / CHAPTER_TIMES
    subs["default_chapter_times"] = chapter_time_summary(read_chapter_times(path)) if path.exists() \
        else "not measured yet"
    config.myst_substitutions = subs
    config.html_theme_options = launch_theme_options(dict(config.html_theme_options or {}))
    options = dict(config.html_theme_options or {})
    footer = (f"wsbook {stamp['wsbook_version']}, built {stamp['build_date']} at scale "
              f"<code>{stamp['build_scale']}</code> (<a href=\"{_CITE_HREF}\">how to cite</a>)")
    options["extra_footer"] = (options.get("extra_footer") or "") + f"<p>{footer}</p>"
    config.html_theme_options = options
    # the partial plotly.js bundles in _static are linked by the pages that need them (_page_context), not by
    # all (jupyter-book links every .js file it finds in _static)
    config.html_js_files = [f for f in (config.html_js_files or [])
                            if (f[0] if isinstance(f, (tuple, list)) else f) not in PARTIAL_BUNDLES]


def _page_context(app, pagename, templatename, context, doctree) -> None:
    # Plotly only where a figure is drawn; the page body is already rendered here.
    body = context.get("body") or ""
    if "Plotly.newPlot" in body:
        app.add_js_file(None, body="window.PlotlyConfig = {MathJaxConfig: 'local'};", priority=100)
        static = Path(app.srcdir) / "_static"
        app.add_js_file(plotly_bundle(page_trace_types(body), static), priority=101)
    # The footer's "how to cite" link is relative to the page.
    theme = context.get("theme_extra_footer")
    if theme and _CITE_HREF in theme and "pathto" in context:
        context["theme_extra_footer"] = theme.replace(_CITE_HREF, context["pathto"]("book/cite"))


def _ipynb_download(app, pagename, templatename, context, doctree) -> None:
    # sphinx-book-theme offers a text notebook's executed .ipynb for download only from its launch-button
    # code (it copies the notebook into _sources there); without launch buttons do the same here, before
    # the theme's header buttons are made (priority 501).
    if not pagename.startswith("chapters/") or "kernelspec" not in app.env.metadata.get(pagename, {}):
        return
    executed = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if not executed.exists():
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(executed, target)
    context["ipynb_source"] = f"{pagename}.ipynb"


def bibtex_entry(title: str, stamp: dict[str, str], url: str = "") -> str:
    """The BibTeX entry of this build: nothing to fill in. The year is the build date's, the note names
    the version, date and scale (a build at another scale computes other numbers), ``url`` only if given."""
    def esc(text: str) -> str:
        for char in "&%#_$":
            text = text.replace(char, "\\" + char)
        return text

    year = stamp["build_date"][:4]
    fields = [("title", esc(title)), ("author", "{wsbook contributors}"), ("year", year),
              ("note", esc(f"wsbook {stamp['wsbook_version']}, built {stamp['build_date']} at scale "
                           f"{stamp['build_scale']}"))]
    if url:
        fields.append(("url", url))
    width = max(len(name) for name, _ in fields)
    body = "".join(f"  {name.ljust(width)} = {{{value}}},\n" for name, value in fields)
    return f"@misc{{wsbook{year},\n{body}}}"


class BibtexDirective(SphinxDirective):
    """``wsbook-bibtex``: the BibTeX entry of this build as a code block (:func:`bibtex_entry`)."""

    has_content = False

    def run(self):
        config = self.env.config
        subs = getattr(config, "myst_substitutions", None) or {}
        stamp = subs if all(k in subs for k in ("wsbook_version", "build_date", "build_scale")) else build_stamp()
        url = repository_url(config.html_theme_options or {}, environ={})   # _stamp has applied the variable
        text = bibtex_entry(config.html_title or config.project, stamp, url)   # html_title: `title`
        block = nodes.literal_block(text, text, language="bibtex")
        return [block]


def _author_year_styles() -> None:
    """Register the pybtex style ``wsbook_author_year``: the bibliography's labels read like the citations
    in the text ("Frankle et al., 2020"), entries sorted by author, year and title."""
    from pybtex.plugin import register_plugin
    from pybtex.richtext import Text
    from pybtex.style.formatting.unsrt import Style as UnsrtStyle
    from pybtex.style.labels import BaseLabelStyle

    def last(person) -> str:
        return Text.from_latex(" ".join(person.prelast_names + person.last_names)).render_as("text")

    class AuthorYearLabels(BaseLabelStyle):
        def format_labels(self, sorted_entries):
            for entry in sorted_entries:
                people = entry.persons.get("author") or entry.persons.get("editor") or []
                if not people:
                    name = entry.key
                elif len(people) == 1:
                    name = last(people[0])
                elif len(people) == 2:
                    name = f"{last(people[0])} and {last(people[1])}"
                else:
                    name = f"{last(people[0])} et al."
                yield f"{name}, {entry.fields.get('year', 'n.d.')}"

    class AuthorYearStyle(UnsrtStyle):
        default_label_style = AuthorYearLabels
        default_sorting_style = "author_year_title"

    for group, plugin in (("pybtex.style.labels", AuthorYearLabels), ("pybtex.style.formatting", AuthorYearStyle)):
        try:
            register_plugin(group, "wsbook_author_year", plugin)
        except Exception:   # already registered (a second build in one process)
            pass


def read_chapter_times(path: Path) -> dict[str, dict[str, dict[str, str | float | None]]]:
    """``{chapter: {scale: {"seconds", "machine", "date"}}}`` from the run-time file; ``seconds`` is
    ``None`` where the file leaves it blank (not measured). A malformed file is an error."""
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != TIME_COLUMNS:
            raise ValueError(f"{path}: columns must be {', '.join(TIME_COLUMNS)}; got {reader.fieldnames}")
        out: dict[str, dict[str, dict]] = {}
        for line, row in enumerate(reader, start=2):
            chapter, scale = row["chapter"].strip(), row["scale"].strip()
            if scale not in ("ci", "default", "full"):
                raise ValueError(f"{path}:{line}: unknown scale {scale!r}")
            if scale in out.setdefault(chapter, {}):
                raise ValueError(f"{path}:{line}: {chapter} at {scale} is listed twice")
            text = row["seconds"].strip()
            seconds = float(text) if text else None
            if seconds is not None and not seconds > 0:
                raise ValueError(f"{path}:{line}: seconds must be positive; got {text}")
            out[chapter][scale] = {"seconds": seconds, "machine": row["machine"].strip(),
                                   "date": row["date"].strip()}
    return out


def format_duration(seconds: float | None) -> str:
    """``42 s``, ``6 min``, ``1 h 15 min``; ``not measured`` for ``None``."""
    if seconds is None:
        return "not measured"
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def precompute_group(chapter: str) -> str | None:
    """The ``python -m wsbook`` group that computes a chapter's artifacts ahead, if it has one
    (``08b_mnist`` -> ``chapter/08b``)."""
    group = f"chapter/{chapter.split('_')[0]}"
    return group if group in PRECOMPUTE_GROUPS else None


def run_box(chapter: str, times: dict[str, dict[str, dict]], build_scale: str,
            launch: bool = False) -> nodes.admonition:
    """The "Run this chapter" box of chapter ``chapter`` (a file stem such as ``07_method``), collapsed
    until the reader opens it (sphinx-togglebutton's ``dropdown`` admonition). ``launch``: whether the page
    has a launch button (a repository is configured); without one the box says how to run it from a clone."""

    def para(*parts) -> nodes.paragraph:
        out = nodes.paragraph()
        for part in parts:
            out += nodes.literal(part[1:-1], part[1:-1]) if part.startswith("`") else nodes.Text(part)
        return out

    box = nodes.admonition(classes=["tip", "dropdown", "wsbook-run"])
    box += nodes.title("", "Run this chapter")
    box += para("In JupyterLab: ", "`make lab`", " opens ", "`chapters/`", "; double-click ",
                f"`{chapter}.md`", " and it opens as a notebook. The scale is read when the kernel starts: ",
                "`WSBOOK_SCALE=ci make lab`", " (tiny, for the tests), ", "`default`",
                " (this book) or ", "`full`", " (a GPU server). This page was built at ", f"`{build_scale}`",
                ".")
    box += para("JupyterLab renders the math, but not everything this page resolves: citations show as "
                "their keys, and each ", "`{glue}`", " shows its key instead of the number (the number is "
                "the output of the cell that computes it, once that cell has run).")
    group = precompute_group(chapter)
    if group:
        box += para("Precompute what it reads (zoos, posteriors, flows) into the cache first: ",
                    f"`python -m wsbook {group} --scale full`", " (or under ", "`torchrun`",
                    "); ", "`python -m wsbook --list`", " shows what is cached.")
    if launch:
        box += para("Or open it on a JupyterHub: the launch button (the rocket at the top of the page) "
                    "clones the book's repository there and opens this chapter in JupyterLab.")
    else:
        box += para("This build has no launch button (it names no repository): run the chapter from a clone "
                    "with ", "`make lab`", " as above, or on a GPU server as the README's section "
                    "\u201cRunning on a GPU server\u201d says (precompute with ", "`python -m wsbook`",
                    ", then ", "`WSBOOK_SCALE=full make lab`", ").")
    measured = times.get(chapter, {})
    items = nodes.bullet_list()
    for scale in BOX_SCALES:
        entry = measured.get(scale) or {"seconds": None, "machine": "", "date": ""}
        where = ", ".join(v for v in (entry["machine"], entry["date"]) if v)
        item = para(f"`{scale}`", f": {format_duration(entry['seconds'])}" + (f" ({where})" if where else ""))
        items += nodes.list_item("", item)
    box += para("Run time, measured (",
                "`book/chapter_times.csv`", "):")
    box += items
    return box


def _chapter_box(app, doctree) -> None:
    docname = app.env.docname
    if not docname.startswith("chapters/"):
        return
    path = Path(app.srcdir) / CHAPTER_TIMES
    app.env.note_dependency(str(path))   # a new measurement rebuilds the pages
    times = read_chapter_times(path)
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        return
    at = 1 if section.children and isinstance(section[0], nodes.title) else 0
    import wsbook

    launch = launch_enabled(app.config.html_theme_options or {})
    section.insert(at, run_box(docname.split("/", 1)[1], times, wsbook.scale(), launch=launch))


def setup(app):
    _author_year_styles()
    app.connect("doctree-read", _chapter_box)
    # Keep plotly from reconfiguring the page's MathJax (it only needs MathJax for LaTeX labels); both
    # scripts are added per page in _page_context.
    app.connect("config-inited", _stamp)
    app.connect("html-page-context", _page_context)
    app.connect("html-page-context", _ipynb_download, priority=500)
    app.add_directive("wsbook-bibtex", BibtexDirective)
    app.connect("build-finished", _finish_html)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


class PlotlyJSONRenderer:
    """myst-nb MIME plugin: plotly's JSON bundle is for JupyterLab; in the book the ``text/html`` part of
    the same output draws the figure, so the JSON part renders to nothing (instead of a warning)."""

    mime_priority_overrides = [("*", "application/vnd.plotly.v1+json", None)]

    @staticmethod
    def handle_mime(renderer, data, inline):
        return [] if data.mime_type == "application/vnd.plotly.v1+json" else None
