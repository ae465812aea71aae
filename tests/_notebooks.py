"""Notebook test helpers.

The course notebooks are committed without outputs. nbval's ``# NBVAL_CHECK_OUTPUT`` needs expected
outputs, so each notebook has a reference copy in tests/nbval_reference/: the notebook executed by
papermill at its CI sizes (so it carries papermill's injected-parameters cell), keeping only the
outputs of its checked cells (printed facts). A test keeps the copies' sources equal to the
notebooks'; after editing a notebook, refresh its copy (or all of them):

    python tests/_notebooks.py [01_why_24.ipynb ...]
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from sparsity_lab.course import execute, notebooks  # noqa: E402

REFERENCE = Path(__file__).resolve().parent / "nbval_reference"
CHECK = "# NBVAL_CHECK_OUTPUT"


# Tiny course notebooks for the course and book tests (a parameters cell n = 50, CI size n = 3).
FIGURE_CELL = """import plotly.graph_objects as go
import plotly.io as pio
pio.renderers.default = "plotly_mimetype+notebook_connected"
print("points:", n)
go.Figure(go.Scatter(y=list(range(n))))"""
WIDGET_CELL = """import ipywidgets as widgets
import plotly.graph_objects as go
print("points:", n)
widgets.VBox([widgets.IntSlider(description="steps"), go.FigureWidget(go.Scatter(y=list(range(n))))])"""


def tiny_notebook(folder: Path, name: str = "01_tiny.ipynb", body: str | list[str] = FIGURE_CELL) -> Path:
    """A course notebook: a heading, a parameters cell (n = 50; CI: n = 3), the code cell(s) ``body``."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["sparsity_lab"] = {"ci_parameters": {"n": 3}}
    nb.cells = [nbformat.v4.new_markdown_cell("# A tiny notebook\n\nOne figure."),
                nbformat.v4.new_code_cell("n = 50", metadata={"tags": ["parameters"]}),
                *(nbformat.v4.new_code_cell(b) for b in ([body] if isinstance(body, str) else body))]
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / name)
    return folder / name


def _is_injected(cell) -> bool:
    return "injected-parameters" in cell.get("metadata", {}).get("tags", [])


def code_sources(path: Path) -> list[str]:
    """The cells' sources, without papermill's injected-parameters cell."""
    nb = nbformat.read(path, as_version=4)
    return [c.source for c in nb.cells if not _is_injected(c)]


def has_outputs(path: Path) -> bool:
    nb = nbformat.read(path, as_version=4)
    return any(c.get("outputs") or c.get("execution_count") for c in nb.cells if c.cell_type == "code")


def make_reference(path: Path) -> Path:
    """Execute ``path`` at its CI sizes and write its reference copy, keeping only the checked cells' outputs."""
    with tempfile.TemporaryDirectory() as tmp:
        executed = Path(tmp) / path.name
        execute(path, executed, sizes="ci")
        nb = nbformat.read(executed, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and CHECK not in cell.source:
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("papermill", None)
    nb.metadata.pop("widgets", None)  # saved widget state carries ~5 MB of JavaScript
    for cell in nb.cells:
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
    REFERENCE.mkdir(exist_ok=True)
    out = REFERENCE / path.name
    nbformat.write(nb, out)
    return out


if __name__ == "__main__":
    wanted = set(sys.argv[1:])
    chosen = [p for p in notebooks() if not wanted or p.name in wanted]
    missing = wanted - {p.name for p in chosen}
    if missing:
        sys.exit(f"no such notebooks: {', '.join(sorted(missing))}")
    for nb_path in chosen:
        print("wrote", make_reference(nb_path))
