"""Where the files that ship beside the code are: the course notebooks, the docs they link to, the
book's configuration and the recorded results (``results/``) that notebooks and figures read.

- From a source checkout (``pip install -e .``): the repository's own ``notebooks/``, ``docs/``,
  ``book/`` and ``results/``.
- From an installed wheel: read-only copies inside the package, ``sparsity_lab/_shipped/`` with the
  same four folders, which ``setup.py`` lays out when it builds the wheel (with ``BUILD_COMMIT``,
  the commit the wheel was built from).

The library reads these and never writes here: runs, new results and books go to paths the caller
names or under the current directory.
"""
from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SHIPPED_DIR = PACKAGE_DIR / "_shipped"
BUILD_COMMIT_FILE = "BUILD_COMMIT"


def source_checkout() -> Path | None:
    """The repository root when this package is imported from its source checkout, else None.

    A checkout is recognised by the files around the package, not by git: the repository's
    ``pyproject.toml`` naming this project and its ``notebooks/`` beside ``sparsity_lab/``.
    """
    root = PACKAGE_DIR.parent
    pyproject = root / "pyproject.toml"
    if not (pyproject.is_file() and (root / "notebooks").is_dir()):
        return None
    return root if 'name = "sparsity-lab"' in pyproject.read_text(errors="replace") else None


def material_root() -> Path:
    """The folder holding ``notebooks/``, ``docs/``, ``book/`` and ``results/``: the wheel's
    ``_shipped/`` when it is there, else the source checkout. When neither is found this is the
    missing ``_shipped/``, and the messages of whoever reads from it name that path."""
    if SHIPPED_DIR.is_dir():
        return SHIPPED_DIR
    return source_checkout() or SHIPPED_DIR


def installed_from() -> str:
    """``"wheel"`` (the shipped copies), ``"checkout"`` (a source tree) or ``"unknown"``."""
    if SHIPPED_DIR.is_dir():
        return "wheel"
    return "checkout" if source_checkout() is not None else "unknown"


def build_commit() -> str | None:
    """The git commit the installed wheel was built from (``setup.py`` records it), or None."""
    path = SHIPPED_DIR / BUILD_COMMIT_FILE
    if not path.is_file():
        return None
    return path.read_text().strip() or None


ROOT = material_root()
NOTEBOOK_DIR = ROOT / "notebooks"
DOCS_DIR = ROOT / "docs"
BOOK_CONFIG_DIR = ROOT / "book"
RESULTS_DIR = ROOT / "results"
