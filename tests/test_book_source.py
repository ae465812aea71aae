"""The book's source as sparsity_lab.course writes it from executed notebooks (no build, no browser):
what a reader must not see is gone, what the reader needs is there."""
import json

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is in the test extra")
pytest.importorskip("plotly", reason="plotly is in the test extra")

from sparsity_lab.course import book_page  # noqa: E402
from sparsity_lab.course import PLOTLY_JSON, book_notebook, write_book_source  # noqa: E402


def test_test_markers_are_taken_out_of_the_code():
    source = "# NBVAL_CHECK_OUTPUT\nprint(1)\n  # NBVAL_IGNORE_OUTPUT\nx = 2  # NBVAL is only a word here"
    assert book_page.strip_test_markers(source) == "print(1)\nx = 2  # NBVAL is only a word here"


def test_displayed_markdown_headings_go_below_the_page_sections():
    text = "# Notes\n\n```bash\n# a comment, not a heading\n```\n\n## Setup\n\n###### deep"
    shown = book_page.demote_headings(text)
    assert shown.splitlines()[0] == "#### Notes" and "##### Setup" in shown and "###### deep" in shown
    assert "# a comment, not a heading" in shown.splitlines()
    assert book_page.demote_headings("no heading | here") == "no heading | here"


@pytest.mark.parametrize("link, expected", [
    ("[the methods](../docs/algorithms.md#ste)", "[the methods](docs/algorithms.md#ste)"),
    ("[lesson 3](03_ste.ipynb)", "[lesson 3](03_ste.ipynb)"),
    ("[notes](../results/run/NOTES.md)", "notes (`results/run/NOTES.md` in the repository)"),
    ("[`results/run/NOTES.md`](../results/run/NOTES.md)", "`results/run/NOTES.md`"),
    ("![curve](../results/run/curve.png)", "*(curve: `results/run/curve.png` in the repository)*"),
    ("[paper](https://arxiv.org/abs/2102.04010)", "[paper](https://arxiv.org/abs/2102.04010)"),
    ("[below](#setup)", "[below](#setup)"),
    ("`[not](../a/link.md)`", "`[not](../a/link.md)`"),
])
def test_links_reach_the_books_pages_or_name_the_repository_file(link, expected):
    pages = {"notebooks/01_a.ipynb": "01_a.ipynb", "notebooks/03_ste.ipynb": "03_ste.ipynb",
             "docs/algorithms.md": "docs/algorithms.md"}
    assert book_page.rewrite_links(link, "notebooks/01_a.ipynb", pages.get) == expected


def test_links_from_docs_pages_go_back_to_the_notebooks():
    pages = {"notebooks/03_ste.ipynb": "03_ste.ipynb", "docs/algorithms.md": "docs/algorithms.md"}
    assert book_page.rewrite_links("[STE](../notebooks/03_ste.ipynb)", "docs/algorithms.md", pages.get) == \
        "[STE](../03_ste.ipynb)"


def test_figures_are_redrawn_without_their_fixed_width():
    figure = {"data": [{"type": "scatter", "y": [1, 2]}], "layout": {"width": 980, "height": 430}}
    page = book_page.responsive_plotly_html(figure)
    spec = json.loads(page.split("Plotly.newPlot(", 1)[1].split(",", 1)[1].rsplit(")", 1)[0].join("[]"))
    layout, config = spec[1], spec[2]
    assert "width" not in layout and layout["autosize"] is True and layout["height"] == 430
    assert config["responsive"] is True
    assert "cdn.plot.ly" not in page and "<script src" not in page, "the book serves plotly.js itself"
    assert "height:430px; width:100%" in page


def test_only_the_plotly_loader_output_is_dropped():
    loader = {"text/html": "<script>window.PlotlyConfig = {};</script><script type=\"module\">"
                           "import \"https://cdn.plot.ly/plotly-3.0.1.min\"</script>"}
    assert book_page.is_plotly_loader(loader)
    assert not book_page.is_plotly_loader({"text/html": '<div class="plotly-graph-div"></div> cdn.plot.ly'})
    assert not book_page.is_plotly_loader({"text/html": "<table></table>"})


def test_consecutive_prints_to_one_stream_are_one_output():
    out, err = (lambda t: nbformat.v4.new_output("stream", name="stdout", text=t),
                lambda t: nbformat.v4.new_output("stream", name="stderr", text=t))
    shown = nbformat.v4.new_output("display_data", data={"text/plain": "x"})
    merged = book_page.merge_streams([out("a\n"), out(["b\n", "c\n"]), err("w\n"), out("d\n"), shown, out("e\n")])
    assert [(o.get("name"), o.get("text")) for o in merged] == [
        ("stdout", "a\nb\nc\n"), ("stderr", "w\n"), ("stdout", "d\n"), (None, None), ("stdout", "e\n")]


def _executed(parameters):
    nb = nbformat.v4.new_notebook()
    nb.metadata["papermill"] = {"parameters": parameters, "input_path": "notebooks/01_a.ipynb"}
    fig = nbformat.v4.new_output("display_data", data={
        PLOTLY_JSON: {"data": [], "layout": {"width": 1000}}, "text/html": '<div style="width:1000px"></div>'})
    loader = nbformat.v4.new_output("display_data", data={"text/html": "<script>window.PlotlyConfig = {};</script>"})
    notes = nbformat.v4.new_output("display_data", data={"text/markdown": "# Notes\n\nsee [x](../results/a.md)",
                                                         "text/plain": "<Markdown>"})
    nb.cells = [nbformat.v4.new_markdown_cell("# Lesson A\n\nIntro with [methods](../docs/algorithms.md)."),
                nbformat.v4.new_code_cell("steps = 300", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("# Parameters\nsteps = 20\n", metadata={"tags": ["injected-parameters"]}),
                nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nfig", outputs=[loader, fig]),
                nbformat.v4.new_code_cell("notes", outputs=[notes])]
    return nb


def test_book_copy_of_a_ci_run():
    pages = {"notebooks/01_a.ipynb": "01_a.ipynb", "docs/algorithms.md": "docs/algorithms.md"}
    nb = book_notebook(_executed({"steps": 20}), machine="a CPU", book_path=pages.get)
    sources = [c.source for c in nb.cells]
    assert not any("injected-parameters" in c.metadata.get("tags", []) for c in nb.cells)
    assert sources[0].startswith("# Lesson A\n") and "Run at CI sizes" in sources[0] and "`steps = 20`" in sources[0]
    assert "on a CPU" in sources[0] and "too small to judge" in sources[0]
    assert "[methods](docs/algorithms.md)" in sources[0]
    assert sources[2] == "fig", "the nbval marker is not shown"
    outputs = nb.cells[2].outputs
    assert len(outputs) == 1 and PLOTLY_JSON not in outputs[0]["data"], "the loader is dropped, the figure redrawn"
    assert '"responsive": true' in outputs[0]["data"]["text/html"] and "1000" not in outputs[0]["data"]["text/html"]
    assert nb.cells[3].outputs[0]["data"]["text/markdown"] == \
        "#### Notes\n\nsee x (`results/a.md` in the repository)"


def test_book_copy_of_a_full_size_run_says_so():
    nb = book_notebook(_executed({}), machine="a GPU (NVIDIA H100)")
    assert "Run at full sizes" in nb.cells[0].source and "NVIDIA H100" in nb.cells[0].source


def test_book_source_has_the_docs_pages_as_chapters(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "algorithms.md").write_text("# Algorithms\n\nSee [the STE lesson](../notebooks/01_a.ipynb).\n")
    (docs / "bibliography.md").write_text("# Bibliography\n")
    executed = tmp_path / "01_a.ipynb"
    nbformat.write(_executed({"steps": 20}), executed)
    source = write_book_source([executed], tmp_path / "source", docs_dir=docs)
    toc = (source / "_toc.yml").read_text()
    assert toc.index("file: 01_a") < toc.index("file: docs/algorithms") < toc.index("file: docs/bibliography")
    assert "[the STE lesson](../01_a.ipynb)" in (source / "docs" / "algorithms.md").read_text()
    assert (source / "_static" / "sparsity-lab.css").exists() and (source / "_static" / "sparsity-lab.js").exists()
    assert "Run at CI sizes" in (source / "intro.md").read_text()
    without = write_book_source([executed], tmp_path / "source2", docs_dir=tmp_path / "no-docs")
    assert "docs/" not in (without / "_toc.yml").read_text()
