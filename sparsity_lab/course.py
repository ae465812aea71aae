"""The notebook course: where the notebooks are, the small sizes CI runs them at, and running them.

Each notebook in ``notebooks/`` keeps its CI sizes in its own metadata, so adding a notebook touches
one file::

    nb.metadata["sparsity_lab"] = {"ci_parameters": {"steps": 20, ...}}

papermill injects them into the notebook's ``parameters`` cell (the tests, the headless course run
and the book build all use :func:`execute`).
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"


def notebooks(directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """The course notebooks in reading order (their file names start with the number)."""
    return sorted(Path(directory).glob("[0-9][0-9]_*.ipynb"))


def ci_parameters(path: Path) -> dict:
    """The small sizes stored in ``path``'s metadata (``sparsity_lab.ci_parameters``)."""
    import nbformat

    nb = nbformat.read(Path(path), as_version=4)
    meta = nb.metadata.get("sparsity_lab", {})
    if "ci_parameters" not in meta:
        raise KeyError(f"{Path(path).name} has no metadata.sparsity_lab.ci_parameters "
                       "(the small sizes CI injects into its parameters cell)")
    return dict(meta["ci_parameters"])


def execute(path: Path, out: Path, sizes: str = "ci", cwd: Path = ROOT, progress_bar: bool = False):
    """Run notebook ``path`` with papermill and write the executed copy to ``out``.

    ``sizes="ci"`` injects the notebook's CI parameters; ``"full"`` runs its own defaults (GPU sizes
    where the notebook has them). A failing cell raises ``papermill.PapermillExecutionError``.
    """
    try:
        import papermill
    except ImportError as err:
        raise ImportError("running the notebooks needs papermill: pip install 'sparsity-lab[lab]'") from err
    if sizes not in ("ci", "full"):
        raise ValueError(f"sizes must be 'ci' or 'full', got {sizes!r}")
    parameters = ci_parameters(path) if sizes == "ci" else {}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    return papermill.execute_notebook(str(path), str(out), parameters=parameters, kernel_name="python3",
                                      cwd=str(cwd), progress_bar=progress_bar)
