"""The book as a reader sees it: every page of the course's book opened in headless chromium (no
network) and checked, with a screenshot of each page.

On every page:
- each plotly figure is drawn and it, and each of its subplot panels, lies inside the text column;
  its titles, annotations and legend entries do not overlap and none is cut off at its edge; a plotly
  table shows all its rows, and no cell's text runs past its column;
- no text or HTML output is wider than its box unless it scrolls (a scrollbar), and nothing makes the
  page itself scroll sideways; every code box (a cell's code, a fenced block) holds a line of
  MAX_CODE_LINE (100) characters, the notebooks' limit, at 1280 px (book/_static/sparsity-lab.css);
- no raw Markdown shows as text (table rules ``|---|``, ``**bold**``, ``# heading`` lines, ``[a](b)``)
  and the maths is typeset (MathJax is served with the book);
- no internal word shows (nbval markers, papermill's cells, work-item or design-note names).

A failure names the page, the section and the figure or output. Screenshots go to a temporary folder
(the whole page where a check failed, the first screen of the others) and, when
$SPARSITY_LAB_SCREENSHOTS is set, every whole page goes to that folder as well. The session's book is shared with
tests/test_notebooks.py (conftest.py: ``course_book``); a tiny book built here checks the
mechanism on synthetic trouble (a wide two-panel figure, a wide table, displayed Markdown, markers).
"""
from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

from _notebooks import tiny_notebook
from test_browser import CHROMIUM, require_browser
from test_notebook_prose import MAX_CODE_LINE

CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--disable-background-networking",
                 "--no-first-run"]
VIEWPORT = {"width": 1280, "height": 900}

# Words of the project's own machinery that a reader must not see.
INTERNAL = re.compile(r"(?-i:ALGORITHMS\.md|FACTS\.md|STYLE\.md|NBVAL)|\bissue \d+|\bsession \d+|injected-parameters"
                      r"|papermill", re.IGNORECASE)
# Jupyter Book 1 writes sphinx-thebe's configuration script twice into every page (its own bug; the
# book has no live kernel, so thebe is unused): that one script error is expected.
KNOWN_SCRIPT_ERRORS = ("Identifier 'THEBE_JS_URL' has already been declared",)
# What a check prints only after a failed attempt (sparsity_lab/course/exercises/checking.py).
HINT = re.compile(r"^\s*Hint: |A worked solution: ", re.MULTILINE)
# Markdown syntax that was not rendered.
RAW_MARKDOWN = {
    "a table rule": re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)+\|?\s*$", re.MULTILINE),
    "**bold** markers": re.compile(r"\*\*[^\s*][^*\n]*?\*\*"),
    "a '#' heading line": re.compile(r"^#{1,6} \S", re.MULTILINE),
    "a [text](link)": re.compile(r"\[[^\]\n]+\]\((https?://|\.{0,2}/)?[^)\s]+\)"),
    "maths not typeset": re.compile(r"\\\(|\\\[|\$\$|\\(frac|mathbb|lVert|odot|top)\b"),
}

# Runs in the page. Returns the figures and outputs that do not fit, each with where it is (the
# nearest heading above it), and the texts to scan: prose (rendered Markdown, code excluded), the text
# outputs, and everything a reader sees.
CHECK_JS = r"""() => {
    const CODE_LINE = %d;
    // a figure's titles, axis titles, annotations and legend entries (tick labels left out)
    const LABELS = '.infolayer .gtitle, .infolayer [class*="title"] text, .annotation-text-g text, .legendtext';
    // benchmark-internal names: FFN variants (ours_mvue, auto), kernel numbers ("1 prune24: ..."), and a
    // method key with a number where a legend should name the method ("srste 1e-02")
    const INTERNAL_NAME = /\bours_\w+|\bauto(_refresh\d+)?\b|^\d+ [a-z_]+\d*: |^(srste|sste|ste|masked_decay\w*) \d/;
    const article = document.querySelector('article.bd-article');
    const col = article.getBoundingClientRect();
    const inside = r => r.width > 0 && r.left >= col.left - 1 && r.right <= col.right + 1;
    const box = r => `[${Math.round(r.left)}, ${Math.round(r.right)}] px`;
    const column = `the text column [${Math.round(col.left)}, ${Math.round(col.right)}] px`;
    const where = el => {
        let section = el.closest('section'), text = '';
        while (section && !text) {
            const h = section.querySelector(':scope > h1, :scope > h2, :scope > h3, :scope > h4');
            text = h ? h.textContent.replace('#', '').trim() : '';
            section = section.parentElement && section.parentElement.closest('section');
        }
        return text ? `in section '${text}'` : 'at the top';
    };
    const problems = [];
    article.querySelectorAll('.js-plotly-plot').forEach((fig, i) => {
        const title = ((fig.querySelector('.gtitle') || {}).textContent || '').slice(0, 60);
        const name = `figure ${i + 1}${title ? " '" + title + "'" : ''} ${where(fig)}`;
        if (!fig.querySelector('.main-svg')) { problems.push(`${name}: not drawn`); return; }
        const r = fig.getBoundingClientRect(), drawn = fig.querySelector('.main-svg').getBoundingClientRect();
        if (!inside(r)) problems.push(`${name}: spans ${box(r)}, outside ${column}`);
        const outer = fig.parentElement.getBoundingClientRect();
        if (drawn.bottom > Math.min(r.bottom, outer.bottom) + 1)
            problems.push(`${name}: drawn ${Math.round(drawn.height)} px tall in a ${Math.round(Math.min(r.bottom, outer.bottom) - r.top)} px box (it covers what follows)`);
        const table = fig.querySelector('.table-control-view');
        if (table && table.__data__ && table.__data__.rowBlocks) {
            const d = table.__data__;
            const rows = blocks => blocks.reduce((s, b) => s + b.rows.reduce((t, r) => t + r.rowHeight, 0), 0);
            const hidden = rows(d.headerRowBlocks) + rows(d.rowBlocks) - d.groupHeight;
            if (hidden > 2) problems.push(`${name}: ${Math.round(hidden)} px of its table rows hide behind the table's scrollbar`);
        }
        // plotly wraps a table cell at spaces only: a longer word runs under the next column, cut
        fig.querySelectorAll('.table .column-cell').forEach(cell => {
            const rect = cell.querySelector('rect'), text = cell.querySelector('text');
            if (!rect || !text || !text.textContent.trim()) return;
            const c = rect.getBoundingClientRect(), t = text.getBoundingClientRect();
            if (t.width > 0 && (t.right > c.right + 1 || t.left < c.left - 1))
                problems.push(`${name}: table cell '${text.textContent.trim().slice(0, 40)}' is cut off at its column's edge`);
        });
        const labels = Array.from(fig.querySelectorAll(LABELS)).filter(t => t.textContent.trim())
            .map(t => ({text: t.textContent.trim().slice(0, 50), r: t.getBoundingClientRect()})).filter(t => t.r.width > 0);
        labels.filter(t => t.r.left < drawn.left - 1 || t.r.right > drawn.right + 1)
            .forEach(t => problems.push(`${name}: '${t.text}' is cut off at the figure's edge`));
        // a benchmark's own names for its variants and kernels are not a reader's: a legend entry, a title
        // or a category label says what the run is
        Array.from(fig.querySelectorAll(LABELS + ', .ytick text, .xtick text')).map(t => t.textContent.trim())
            .filter(t => INTERNAL_NAME.test(t))
            .forEach(t => problems.push(`${name}: the internal name '${t.slice(0, 50)}' in a label`));
        // crowded labels of a log axis are tilted by plotly: too many ticks for the axis
        const full = fig._fullLayout || {};
        Object.keys(full).filter(k => /^[xy]axis\d*$/.test(k) && full[k].type === 'log').forEach(k => {
            const angle = (full[k]._tickAngles || {})[full[k]._id + 'tick'];
            if (angle) problems.push(`${name}: the tick labels of its log axis ${k} are crowded (tilted ${angle} degrees)`);
        });
        labels.forEach((a, k) => labels.slice(k + 1).forEach(b => {
            const w = Math.min(a.r.right, b.r.right) - Math.max(a.r.left, b.r.left);
            const h = Math.min(a.r.bottom, b.r.bottom) - Math.max(a.r.top, b.r.top);
            if (w > 2 && h > 2) problems.push(`${name}: '${a.text}' is drawn over '${b.text}'`);
        }));
        fig.querySelectorAll('.main-svg, .draglayer .nsewdrag').forEach((panel, j) => {
            const p = panel.getBoundingClientRect();
            if (!inside(p)) problems.push(`${name}: ${panel.classList.contains('main-svg') ? 'its drawing' : 'subplot panel ' + j}`
                                          + ` spans ${box(p)}, outside ${column}`);
        });
    });
    article.querySelectorAll('div.cell_output pre, div.cell_output div.output, div.cell_output table').forEach(el => {
        const r = el.getBoundingClientRect();
        const text = el.textContent.trim().slice(0, 60).replace(/\s+/g, ' ');
        const name = `output '${text}' ${where(el)}`;
        if (r.width > 0 && !inside(r)) problems.push(`${name}: spans ${box(r)}, outside ${column}`);
        const scrolls = ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
        if (el.scrollWidth > el.clientWidth + 1 && !scrolls && el.closest('.js-plotly-plot') === null)
            problems.push(`${name}: ${el.scrollWidth} px wide in a ${el.clientWidth} px box with no scrollbar`);
    });
    // a code box (a cell's code, a fenced block in the text) holds a 100-character line (MAX_CODE_LINE)
    // (a box inside a list item or a note is narrower by its indent: the rule is for the column's own)
    article.querySelectorAll('div.highlight pre').forEach(pre => {
        if (pre.closest('li, blockquote, .admonition')) return;
        const style = getComputedStyle(pre), probe = document.createElement('span');
        probe.textContent = 'x'.repeat(CODE_LINE);
        pre.appendChild(probe);
        const needed = probe.getBoundingClientRect().width;
        probe.remove();
        const room = pre.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
        if (pre.clientWidth > 0 && needed > room + 1)
            problems.push(`code box '${pre.textContent.trim().slice(0, 40).replace(/\s+/g, ' ')}' ${where(pre)}: `
                          + `holds ${Math.floor(CODE_LINE * room / needed)} characters, ${CODE_LINE} wanted`);
    });
    if (document.documentElement.scrollWidth > window.innerWidth + 1)
        problems.push(`the page scrolls sideways (${document.documentElement.scrollWidth} px in a ${window.innerWidth} px window)`);

    const prose = [];
    // (typeset maths is kept: its text is glyphs; maths left as TeX shows its backslashes)
    const skip = 'pre, code, .cell_input, script, style, .highlight, .MathJax_Preview, .js-plotly-plot';
    article.querySelectorAll('p, li, td, th, h1, h2, h3, h4, h5, h6, dt, dd, .admonition-title, .sl-text').forEach(el => {
        if (el.closest(skip)) return;
        const clone = el.cloneNode(true);
        clone.querySelectorAll(skip).forEach(n => n.remove());
        prose.push({text: clone.textContent, where: where(el)});
    });
    const outputs = Array.from(article.querySelectorAll('div.cell_output pre'))
        .map(el => ({text: el.textContent, where: where(el)}));
    return {problems, prose, outputs, seen: document.body.innerText};
}""" % MAX_CODE_LINE

WAIT_JS = """() => document.documentElement.dataset.slOutputsFitted === '1'
    && document.documentElement.dataset.slFiguresFitted === '1'
    && ['1', 'none'].includes(document.documentElement.dataset.slMathTypeset)
    && Array.from(document.querySelectorAll('.js-plotly-plot, .plotly-graph-div'))
        .every(f => f.querySelector('.main-svg'))"""


def book_pages(index: Path) -> list[Path]:
    """Every page of the book: the intro, the chapters (notebooks, docs/), nothing of Sphinx's own."""
    html = index.parent
    return sorted(p for p in html.rglob("*.html")
                  if p.name not in ("index.html", "search.html", "genindex.html")
                  and not p.relative_to(html).parts[0].startswith("_"))


def text_problems(prose: list[dict], outputs: list[dict], seen: str) -> list[str]:
    """Raw Markdown in the prose or in text outputs, and internal words anywhere a reader looks."""
    found = []
    for where_from, blocks in (("text", prose), ("output", outputs)):
        for block in blocks:
            for what, pattern in RAW_MARKDOWN.items():
                if where_from == "output" and what in ("a [text](link)", "maths not typeset"):
                    continue  # printed text is not Markdown: lists, backslashes, dollars stay as printed
                m = pattern.search(block["text"])
                if m:
                    found.append(f"raw Markdown ({what}) in the {where_from} {block['where']}: "
                                 f"{_line_around(block['text'], m.start())!r}")
    for m in INTERNAL.finditer(seen):
        found.append(f"internal word {m.group(0)!r}: {_line_around(seen, m.start())!r}")
    for block in outputs:  # the book runs every exercise untouched: a hint there gives the answer away
        m = HINT.search(block["text"])
        if m:
            found.append(f"an exercise hint in the output {block['where']}: {_line_around(block['text'], m.start())!r}")
    return found


def _line_around(text: str, at: int) -> str:
    start, end = text.rfind("\n", 0, at) + 1, text.find("\n", at)
    line = text[start:end if end >= 0 else None].strip()
    return line if len(line) <= 120 else line[max(0, at - start - 50):at - start + 70]


def check_book(index: Path, shots: Path) -> dict[str, list[str]]:
    """Open every page of the book at ``index`` offline; returns {page: problems}; saves screenshots."""
    from playwright.sync_api import sync_playwright

    shots.mkdir(parents=True, exist_ok=True)
    found = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.route("http*://**", lambda route: route.abort())  # offline: the book serves what it needs
            errors = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            for path in book_pages(index):
                name = path.relative_to(index.parent).as_posix()
                errors.clear()
                page.goto(path.as_uri())
                page.wait_for_function(WAIT_JS, timeout=30_000)
                result = page.evaluate(CHECK_JS)
                problems = result["problems"] + text_problems(result["prose"], result["outputs"], result["seen"])
                problems += [f"a script failed: {e[:200]}" for e in errors if e not in KNOWN_SCRIPT_ERRORS]
                # the whole page where something is wrong or when asked for; the first screen otherwise
                # (a full-page screenshot of a long page costs seconds of CI time)
                page.screenshot(path=str(shots / (name.replace("/", "__") + ".png")),
                                full_page=bool(problems or os.environ.get("SPARSITY_LAB_SCREENSHOTS")))
                if problems:
                    found[name] = problems
        finally:
            browser.close()
    return found


def _report(found: dict[str, list[str]]) -> str:
    return "\n".join(f"{page}:\n" + "\n".join(f"  - {p}" for p in problems) for page, problems in found.items())


def _keep_screenshots(shots: Path) -> None:
    target = os.environ.get("SPARSITY_LAB_SCREENSHOTS")
    if target:
        shutil.copytree(shots, target, dirs_exist_ok=True)
    print(f"screenshots: {shots}" + (f" and {target}" if target else ""))


@pytest.fixture(scope="module")
def browser_ready():
    require_browser()


def test_every_page_of_the_course_book_fits_its_column_and_reads_clean(course_book, browser_ready, tmp_path):
    start = time.perf_counter()
    shots = tmp_path / "screenshots"
    found = check_book(course_book, shots)
    _keep_screenshots(shots)
    print(f"{len(book_pages(course_book))} pages checked in {time.perf_counter() - start:.1f} s")
    assert not found, "the book's pages, as a reader sees them:\n" + _report(found)


# --- the mechanism, on a tiny book with the trouble the course's pages had ---------------------------

WIDE_FIGURE_CELL = """import plotly.io as pio
from plotly.subplots import make_subplots
import plotly.graph_objects as go
pio.renderers.default = "plotly_mimetype+notebook_connected"
fig = make_subplots(rows=1, cols=2, subplot_titles=["left panel", "right panel"])
fig.add_trace(go.Scatter(y=[1, 3, 2]), row=1, col=1)
fig.add_trace(go.Scatter(y=[2, 1, 3]), row=1, col=2)
fig.update_layout(width=1400, height=380, title="two panels, drawn 1400 px wide")
fig"""
WIDE_OUTPUT_CELL = """# NBVAL_CHECK_OUTPUT
for name in ("normal, std 1", "gradient-like: normal, std 1e-6"):
    print(f"{name:<40}  E4M3  amax: clipped   0.0%, zeroed   0.0%, median error  2.19% | "
          f"no scale: clipped   0.0%, zeroed 100.0%, median error 100.00% | last column")
print("A long sentence of prose printed by a cell, " * 6)"""
MARKDOWN_CELL = """from IPython.display import Markdown, display
display(Markdown("# Recorded run\\n\\nThe **largest** model.\\n\\n| method | loss |\\n|---|---|\\n| dense | 3.1 |\\n\\n"
                 "See [the algorithms](../docs/algorithms.md)."))"""
SLIDER_CELL = """import ipywidgets as widgets
import plotly.graph_objects as go
fig = go.FigureWidget(go.Scatter(y=[1, 2, 3]), layout={"width": 1300, "height": 300})
widgets.VBox([widgets.FloatSlider(value=0.25, description="decay"), fig, widgets.HTML("<b>flip rate 0.5</b>")])"""
DOCS = {"algorithms.md": "# Algorithms\n\nThe methods. Lessons: [the tiny one](../notebooks/01_tiny.ipynb).\n\n"
                         "## Flip rate\n\nThe fraction of mask entries that changed.\n",
        "bibliography.md": "# Bibliography\n\n- A paper, <https://arxiv.org/abs/2102.04010>.\n"}


@pytest.fixture(scope="module")
def tiny_book(tmp_path_factory):
    """A one-notebook book with a wide two-panel figure, wide text outputs, displayed Markdown with a
    heading, a table and a link to docs/, a widget snapshot, a test marker, and docs/ pages (placeholders
    written here, not the repository's)."""
    import nbformat

    from sparsity_lab import course

    root = tmp_path_factory.mktemp("tiny-book")
    notebook = tiny_notebook(root / "notebooks", body=[WIDE_FIGURE_CELL, WIDE_OUTPUT_CELL, MARKDOWN_CELL, SLIDER_CELL])
    nb = nbformat.read(notebook, as_version=4)
    nb.cells[0].source += "\n\nThe method is in [the algorithms page](../docs/algorithms.md) (its " \
                          "[flip rate](../docs/algorithms.md#flip-rate)); code in " \
                          "[the book module](../sparsity_lab/course/book.py)."
    nbformat.write(nb, notebook)
    for name, text in DOCS.items():
        (root / "docs").mkdir(exist_ok=True)
        (root / "docs" / name).write_text(text)
    executed = course.execute_all([notebook], root / "executed", progress=False)
    index = course.build_book(executed, root / "book", docs_dir=root / "docs")
    return index, root / "book" / "_build" / "source"


def test_tiny_book_has_the_docs_as_chapters_and_links_resolved(tiny_book):
    index, _ = tiny_book
    html = index.parent
    for doc in ("algorithms", "bibliography"):
        assert (html / "docs" / f"{doc}.html").exists(), f"docs/{doc}.md is not a chapter of the book"
        assert f'href="docs/{doc}.html"' in (html / "intro.html").read_text(), f"docs/{doc} is not in the contents"
    page = (html / "01_tiny.html").read_text()
    assert 'href="docs/algorithms.html"' in page, "the notebook's ../docs/algorithms.md link does not reach the page"
    assert 'href="docs/algorithms.html#flip-rate"' in page, "a link to a heading of a docs page does not reach it"
    assert '<span class="pre">sparsity_lab/course/book.py</span></code> in the repository' in page, \
        "a link to a repository file outside the book shows its path"
    assert 'href="../01_tiny.html"' in (html / "docs" / "algorithms.html").read_text()


def test_tiny_book_source_hides_markers_and_the_injected_cell_and_says_how_it_ran(tiny_book):
    import nbformat

    _, source = tiny_book
    nb = nbformat.read(source / "01_tiny.ipynb", as_version=4)
    assert not any("injected-parameters" in c.metadata.get("tags", []) for c in nb.cells)
    assert not any("NBVAL" in c.source for c in nb.cells)
    assert "Run at CI sizes" in nb.cells[0].source and "`n = 3`" in nb.cells[0].source
    assert nb.cells[0].source.index("# A tiny notebook") < nb.cells[0].source.index("Run at CI sizes")


def test_tiny_book_pages_pass_the_reader_checks(tiny_book, browser_ready, tmp_path):
    index, _ = tiny_book
    found = check_book(index, tmp_path / "screenshots")
    _keep_screenshots(tmp_path / "screenshots")
    assert not found, _report(found)
    page = (index.parent / "01_tiny.html").read_text()
    assert "decay</span>: 0.25" in page and "<b>flip rate 0.5</b>" in page, "the snapshot shows its readouts"


BROKEN_PAGE = """<!DOCTYPE html><html><body style="margin:0"><main><article class="bd-article" style="width:600px">
<section><h1>Broken</h1>
<p>A **raw** word and a raw [link](other.md).</p>
<p># Not a heading</p>
<div class="cell_output"><div class="output"><pre style="overflow-x: visible; white-space: pre">{wide}</pre></div></div>
<div class="highlight" style="width:500px"><pre>print("a code line")</pre></div>
<div class="cell_output"><pre>| a | b |
|---|---|</pre></div>
<div class="js-plotly-plot" style="width:900px;height:100px"><svg class="main-svg" width="900" height="100">
<g class="infolayer"><text class="gtitle" x="820" y="50">a title running past the edge</text></g>
<g class="legend"><text class="legendtext" x="10" y="90">2:4 + MVUE (ours_mvue)</text></g></svg>
<div class="draglayer"><svg class="nsewdrag" style="position:absolute;left:700px" width="150" height="50"></svg></div>
<svg width="300" height="60"><g class="annotation-text-g"><text x="10" y="20">first label</text></g>
<g class="annotation-text-g"><text x="14" y="24">second label</text></g></svg></div>
<div class="js-plotly-plot" style="width:300px;height:60px"><svg class="main-svg" width="300" height="60">
<g class="table"><g class="y-column"><g class="column-cell"><rect width="60" height="24"></rect>
<text x="8" y="16">masked_decay_weights</text></g></g></g></svg></div>
<p>Recorded in issue 5 with papermill; raw maths \\(x^2\\).</p>
</section></article></main></body></html>"""


def test_the_checks_catch_each_kind_of_trouble(tmp_path, browser_ready):
    """The page checks are not vacuous: a page with every fault is reported for each of them."""
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "broken.html").write_text(BROKEN_PAGE.format(wide="x" * 400))
    (tmp_path / "book" / "index.html").write_text("<html></html>")
    script = ("<script>document.documentElement.dataset.slOutputsFitted = '1';"
              "document.documentElement.dataset.slFiguresFitted = '1';"
              "document.documentElement.dataset.slMathTypeset = '1';</script>")
    page = tmp_path / "book" / "broken.html"
    page.write_text(page.read_text().replace("</body>", script + "</body>"))
    found = check_book(tmp_path / "book" / "index.html", tmp_path / "shots")["broken.html"]
    report = "\n".join(found)
    for expected in ("figure 1", "subplot panel", "no scrollbar", "**bold** markers", "a table rule",
                     "a '#' heading line", "a [text](link)", "'issue 5'", "'papermill'", "scrolls sideways",
                     "'first label' is drawn over 'second label'", "maths not typeset", "100 wanted",
                     "cut off at the figure's edge", "table cell 'masked_decay_weights' is cut off",
                     "the internal name '2:4 + MVUE (ours_mvue)' in a label"):
        assert expected in report, f"the checks missed {expected!r}:\n{report}"


def test_a_hint_in_an_output_is_reported():
    """The book runs every exercise untouched: a check that printed its hint there would give it away."""
    failed = {"text": "[FAIL] nm_mask:\n  - wrong entry\n  Hint: rank |w| in each group", "where": "in section 'x'"}
    untouched = {"text": "[TODO] nm_mask: keep the n largest |w| of every m: not attempted yet.", "where": "here"}
    assert any("exercise hint" in p for p in text_problems([], [failed], ""))
    assert not text_problems([], [untouched], "")
