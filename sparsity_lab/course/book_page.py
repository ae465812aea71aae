"""How an executed notebook becomes a book page: :func:`book_notebook`, and the pieces it applies,
one function each.

- :func:`run_banner`: the note on top of every page saying at which sizes the page was run.
- :func:`strip_test_markers`: ``# NBVAL_CHECK_OUTPUT`` and the other nbval markers are for the tests,
  not for the reader.
- :func:`responsive_plotly_html`: a plotly figure redrawn to fill the text column (no fixed width,
  ``responsive`` config), without the CDN script tags of the notebook renderer.
- :func:`demote_headings`: Markdown that a cell displays (``display(Markdown(...))``) is part of an
  output: its headings must not open new sections of the page.
- :func:`rewrite_links`: relative links between repository files (``../docs/algorithms.md`` from a
  notebook) pointed at the book's copy of the target, or, for a file the book does not contain, the
  link text with the file's path in the repository.
"""
from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path
from typing import Callable, Mapping

# nbval's cell markers: the first line of a cell whose output the tests check (or ignore).
TEST_MARKER = re.compile(r"^[ \t]*#[ \t]*NBVAL_[A-Z_]+[^\n]*(\n|$)", re.MULTILINE)

# A plotly figure output of the "notebook_connected" renderer that only loads plotly.js from the CDN
# (the renderer's first output in a kernel): the book serves plotly.js itself.
PLOTLY_LOADER = re.compile(r"window\.PlotlyConfig|cdn\.plot\.ly")

# [text](target) and ![alt](target), target without spaces; the title part ("...") is kept.
MARKDOWN_LINK = re.compile(r"(!?)\[([^\]\n]*)\]\(([^)\s]+)((?:\s+\"[^\"]*\")?)\)")
FENCE = re.compile(r"^(```|~~~)", re.MULTILINE)

PLOTLY_JSON = "application/vnd.plotly.v1+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def run_banner(parameters: Mapping | None, machine: str, sizes: str | None = None) -> str:
    """A MyST admonition saying how the page was run.

    ``parameters``: what papermill injected into the page's notebook (its CI sizes); empty or None
    for the notebook's own defaults (its full sizes). ``machine``: where it ran, e.g. ``"a CPU"``.
    ``sizes`` ("ci" or "full") without parameters: the book-wide note of the first page.
    """
    recorded = ("Figures and tables of recorded full-size runs (read from `results/`) say so in their "
                "titles.")
    if parameters:
        values = ", ".join(f"`{k} = {v!r}`" for k, v in parameters.items())
        title = "Run at CI sizes"
        body = (f"This page was run at the course's **small CI sizes** on {machine}: {values} (the "
                "notebook's own defaults are in its parameters cell). Runs this small check that the code "
                f"works; they are too small to judge a method. {recorded}")
    elif sizes == "ci":
        title = "Run at CI sizes"
        body = (f"Every page was run at the course's **small CI sizes** on {machine} (each page lists "
                "its sizes): runs this small check that the code works and are too small to judge a "
                f"method. {recorded} For the full sizes run "
                "`python -m sparsity_lab course --headless --sizes full` (best on a GPU).")
    elif sizes == "full":
        title = "Run at full sizes"
        body = (f"Every page was run at its notebook's **full sizes** (the defaults in its parameters "
                f"cell) on {machine}. {recorded}")
    else:
        title = "Run at full sizes"
        body = (f"This page was run at the notebook's **full sizes** (the defaults in its parameters "
                f"cell) on {machine}. {recorded}")
    return f":::{{admonition}} {title}\n:class: sl-run-banner\n{body}\n:::\n"


def strip_test_markers(source: str) -> str:
    """``source`` without its nbval marker lines (``# NBVAL_CHECK_OUTPUT`` ...)."""
    return TEST_MARKER.sub("", source)


def is_plotly_loader(data: Mapping) -> bool:
    """True for an output that only loads plotly.js (no figure in it)."""
    page = data.get("text/html", "")
    if isinstance(page, list):
        page = "".join(page)
    return set(data) <= {"text/html", "text/plain"} and bool(PLOTLY_LOADER.search(page)) \
        and "plotly-graph-div" not in page


def responsive_plotly_html(figure: Mapping) -> str:
    """HTML of the plotly ``figure`` (a figure dict: data, layout) filling its container's width.

    A fixed ``layout.width`` wider than the text column pushes the right-hand panels off the page;
    without it (``autosize``) plotly sizes the figure to its container and, with ``responsive``,
    resizes it with the window. The height is kept. plotly.js is not included: the book serves it.
    """
    import plotly.io as pio

    figure = dict(figure)
    layout = dict(figure.get("layout") or {})
    layout.pop("width", None)
    layout["autosize"] = True
    figure["layout"] = layout
    config = dict(figure.pop("config", None) or {})
    config["responsive"] = True
    height = layout.get("height")
    return pio.to_html(figure, config=config, include_plotlyjs=False, include_mathjax=False, full_html=False,
                       default_width="100%", default_height=f"{height}px" if height else "100%",
                       validate=False)


def demote_headings(markdown: str, top: int = 4) -> str:
    """``markdown`` with its ATX headings shifted so that the largest becomes level ``top`` (at most 6).

    The page's own sections are the notebook's headings; a heading inside displayed Markdown (a
    results/ note shown by a cell) would open a new section in the middle of an output.
    """
    lines, in_fence = markdown.split("\n"), False
    levels = []
    for line in lines:
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (m := re.match(r"^(#{1,6})\s", line)):
            levels.append(len(m.group(1)))
    if not levels:
        return markdown
    shift = max(0, top - min(levels))
    out, in_fence = [], False
    for line in lines:
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (m := re.match(r"^(#{1,6})(\s.*)$", line)):
            line = "#" * min(6, len(m.group(1)) + shift) + m.group(2)
        out.append(line)
    return "\n".join(out)


def rewrite_links(text: str, here: str, book_path: Callable[[str], str | None]) -> str:
    """Point the relative links of ``text`` (Markdown in the repository file ``here``, a repo-relative
    posix path) at the book.

    ``book_path(repo_path)`` gives the book-source path of a repository file the book contains, or
    None. A link to a contained file is rewritten relative to ``here``'s own place in the book; a link
    to any other repository file (results/, the library's code) becomes its text and the file's path,
    since the book does not serve it. URLs, anchors (``#...``) and links inside code are kept.
    """
    here_in_book = book_path(here) or here
    parts = re.split(r"(```.*?```|~~~.*?~~~)", text, flags=re.DOTALL)
    for i in range(0, len(parts), 2):  # even parts are outside fenced code
        spans = [m.span() for m in re.finditer(r"`[^`\n]*`", parts[i])]

        def relink(m: re.Match) -> str:
            if any(start < m.start() < end for start, end in spans):
                return m.group(0)  # a link written inside inline code is code
            return _relink(m, here, here_in_book, book_path)

        parts[i] = MARKDOWN_LINK.sub(relink, parts[i])
    return "".join(parts)


def _relink(m: re.Match, here: str, here_in_book: str, book_path) -> str:
    bang, label, target, title = m.groups()
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return m.group(0)
    path, _, anchor = target.partition("#")
    repo_target = posixpath.normpath(posixpath.join(posixpath.dirname(here), path))
    if repo_target.startswith("../"):
        return m.group(0)  # outside the repository: left to the build, which reports it
    in_book = book_path(repo_target)
    if in_book is not None:
        new = posixpath.relpath(in_book, posixpath.dirname(here_in_book) or ".")
        return f"{bang}[{label}]({new}{'#' + anchor if anchor else ''}{title})"
    if bang:
        return f"*({label or 'image'}: `{repo_target}` in the repository)*"
    shown = label.strip("`* ")
    if shown == repo_target or shown.endswith(posixpath.basename(repo_target)) and "/" in shown:
        return f"`{repo_target}`"
    return f"{label} (`{repo_target}` in the repository)"


def merge_streams(outputs: list) -> list:
    """``outputs`` with each run of consecutive stream outputs of one stream (stdout, stderr) joined."""
    merged = []
    for output in outputs:
        last = merged[-1] if merged else {}
        if output.get("output_type") == "stream" and last.get("output_type") == "stream" \
                and last.get("name") == output.get("name"):
            last["text"] = "".join(last["text"]) + "".join(output["text"])
        else:
            merged.append(output)
    return merged


def book_notebook(nb, machine: str = "a CPU", book_path=None):
    """The executed notebook as the book shows it (a static page, no kernel).

    - A banner under the title says at which sizes the page was run (papermill's injected
      parameters: the CI sizes; none: the notebook's full sizes) and on which ``machine``.
    - papermill's injected-parameters cell is removed (the banner lists its values) and the nbval
      marker lines (``# NBVAL_CHECK_OUTPUT``) are taken out of the code.
    - A plotly figure is redrawn from its JSON bundle to fill the text column (no fixed width,
      responsive); the output that only loads plotly.js from the CDN is dropped (the book serves it).
    - Consecutive prints to one stream are one output, as JupyterLab shows them (the book would draw
      a box for each flushed line).
    - Markdown that a cell displays keeps its headings below the page's sections.
    - Relative links go to the book's copy of their target (``book_path(repo_path)``; by default the
      notebooks are found by file name) or, for a file the book does not serve, show its path.
    - A widget holding FigureWidgets shows its static snapshot (``widget_snapshot``) instead of the
      live view, whose saved state has no trace data; the widget state keeps only the models that
      the remaining widget views use.
    """
    book_path = book_path or _notebook_book_path
    name = nb.metadata.get("papermill", {}).get("input_path") or "notebook.ipynb"
    here = f"notebooks/{Path(name).name}"
    parameters = nb.metadata.get("papermill", {}).get("parameters")
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = rewrite_links(cell.source, here, book_path)
        elif cell.cell_type == "code":
            cell.source = strip_test_markers(cell.source)
            cell["outputs"] = merge_streams([o for o in cell.get("outputs", [])
                                             if not is_plotly_loader(o.get("data", {}))])
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if PLOTLY_JSON in data:
                data["text/html"] = responsive_plotly_html(data.pop(PLOTLY_JSON))
            if WIDGET_VIEW in data and "text/html" in data:
                del data[WIDGET_VIEW]
            if "text/markdown" in data:
                shown = data["text/markdown"]
                shown = "".join(shown) if isinstance(shown, list) else shown
                data["text/markdown"] = rewrite_links(demote_headings(shown), here, book_path)
    add_banner(nb, run_banner(parameters, machine))
    widgets = nb.metadata.get("widgets", {}).get(WIDGET_STATE)
    if widgets:
        roots = [out["data"][WIDGET_VIEW]["model_id"] for c in nb.cells for out in c.get("outputs", [])
                 if WIDGET_VIEW in out.get("data", {})]
        widgets["state"] = _reachable(widgets["state"], roots)
        if not widgets["state"]:
            del nb.metadata["widgets"]
    return nb


def _notebook_book_path(repo_path: str) -> str | None:
    """Where the book keeps a repository file: course notebooks at the top, nothing else."""
    folder, _, name = repo_path.rpartition("/")
    return name if folder == "notebooks" and name.endswith(".ipynb") else None


def add_banner(nb, banner: str) -> None:
    """Put ``banner`` right under the page title (the first heading of the first markdown cell)."""
    import nbformat

    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        lines = cell.source.split("\n")
        title = next((i for i, line in enumerate(lines) if line.startswith("# ")), None)
        if title is None:
            break
        cell.source = "\n".join(lines[:title + 1] + ["", banner] + lines[title + 1:])
        return
    nb.cells.insert(0, nbformat.v4.new_markdown_cell(banner))


def _reachable(state: dict, roots: list[str]) -> dict:
    """The models of ``state`` that ``roots`` reference, directly or through "IPY_MODEL_<id>" values."""
    keep, todo = {}, [r for r in roots if r in state]
    while todo:
        model_id = todo.pop()
        if model_id in keep:
            continue
        keep[model_id] = state[model_id]
        refs = re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(state[model_id]["state"]))
        todo += [r for r in refs if r in state]
    return keep
