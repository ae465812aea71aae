"""Notebook test helpers.

The course notebooks are committed without outputs. nbval's ``# NBVAL_CHECK_OUTPUT`` needs expected
outputs, so each notebook has a reference copy in tests/nbval_reference/ with the same cells and
only the outputs of its checked cells (printed facts). A test keeps the copies' sources equal to
the notebooks'; after editing a notebook, refresh the copies:

    python tests/_notebooks.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
REFERENCE = Path(__file__).resolve().parent / "nbval_reference"
CHECK = "# NBVAL_CHECK_OUTPUT"


def notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def code_sources(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    return [c.source for c in nb.cells]


def has_outputs(path: Path) -> bool:
    nb = nbformat.read(path, as_version=4)
    return any(c.get("outputs") or c.get("execution_count") for c in nb.cells if c.cell_type == "code")


def make_reference(path: Path) -> Path:
    """Execute ``path`` and write its reference copy, keeping only the checked cells' outputs."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    for cell in nb.cells:
        if cell.cell_type == "code" and CHECK not in cell.source:
            cell.outputs, cell.execution_count = [], None
    REFERENCE.mkdir(exist_ok=True)
    out = REFERENCE / path.name
    nbformat.write(nb, out)
    return out


if __name__ == "__main__":
    for nb_path in notebooks():
        print("wrote", make_reference(nb_path))
    sys.exit(0)
