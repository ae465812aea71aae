"""Running the course notebooks: where they are, the small sizes CI runs them at, executing them.

Each notebook keeps its CI sizes in its own metadata, so adding a notebook touches one file::

    nb.metadata["sparsity_lab"] = {"ci_parameters": {"steps": 20, ...}}

papermill injects them into the notebook's ``parameters`` cell (the tests, the headless course run
and the book build all use :func:`execute`). The notebooks are read from ``NOTEBOOK_DIR`` (the
checkout's ``notebooks/`` or the wheel's copy, see :mod:`sparsity_lab.shipped`) and never written:
executed copies, and whatever they write, go to the folder the caller names.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Sequence

from ..shipped import NOTEBOOK_DIR

SIZES = ("ci", "full")
# how to get what the course needs (papermill, JupyterLab, Jupyter Book, plotly: the "lab" extra)
INSTALL_LAB = "install the lab extra: pip install -e '.[lab]' in a clone, pip install '<the wheel>[lab]' from a wheel"


class NotebookFailed(RuntimeError):
    """A notebook raised while it ran; the message names the notebook, the cell and the error."""

    def __init__(self, message: str, notebook: Path, cell: int | None, executed_copy: Path):
        super().__init__(message)
        self.notebook, self.cell, self.executed_copy = notebook, cell, executed_copy


def _reading_key(path: Path) -> tuple[str, int, str]:
    """A notebook's place: its number, or right after notebook ``read_after`` when its metadata names one
    (``nb.metadata["sparsity_lab"]["read_after"] = "07"``: a later notebook read earlier, without
    renumbering the ones in between)."""
    import json

    after = json.loads(Path(path).read_text()).get("metadata", {}).get("sparsity_lab", {}).get("read_after")
    if after is not None and not (isinstance(after, str) and re.fullmatch(r"\d\d", after)):
        raise ValueError(f"{Path(path).name}: read_after must be a notebook number like '07', got {after!r}")
    number = Path(path).name[:2]
    return (after, 1, number) if after else (number, 0, "")


def notebooks(directory: Path = NOTEBOOK_DIR) -> list[Path]:
    """The course notebooks in reading order: by the number their file names start with, a notebook
    whose metadata says ``read_after`` right after that one."""
    return sorted(Path(directory).glob("[0-9][0-9]_*.ipynb"), key=_reading_key)


def select_notebooks(sources: Sequence[Path], wanted: Sequence[str]) -> list[Path]:
    """The notebooks of ``sources`` that ``wanted`` names, in reading order: by number (``"02"``,
    ``"2"``) or by file name (``"02_transposable_masks"``, with or without ``.ipynb``).

    Raises ValueError naming what matched no notebook, with the numbers there are.
    """
    def number(path: Path) -> str:
        return Path(path).name.split("_", 1)[0]

    chosen, unknown = set(), []
    for item in wanted:
        item = str(item).strip()
        hits = [p for p in sources if item in (Path(p).name, Path(p).stem)
                or (item.isdigit() and int(item) == int(number(p)))]
        if hits:
            chosen.update(hits)
        else:
            unknown.append(item)
    if unknown:
        raise ValueError(f"--only {' '.join(unknown)}: no such notebook (there are "
                         f"{', '.join(number(p) for p in sources) or 'none'})")
    return [p for p in sources if p in chosen]


def ci_parameters(path: Path) -> dict:
    """The small sizes stored in ``path``'s metadata (``sparsity_lab.ci_parameters``)."""
    import nbformat

    nb = nbformat.read(Path(path), as_version=4)
    meta = nb.metadata.get("sparsity_lab", {})
    if "ci_parameters" not in meta:
        raise KeyError(f"{Path(path).name} has no metadata.sparsity_lab.ci_parameters "
                       "(the small sizes CI injects into its parameters cell)")
    return dict(meta["ci_parameters"])


def parameters_for(path: Path, sizes: str) -> dict:
    """What papermill injects: the CI sizes for ``"ci"``, nothing (the notebook's defaults) for ``"full"``."""
    if sizes not in SIZES:
        raise ValueError(f"sizes must be 'ci' or 'full', got {sizes!r}")
    return ci_parameters(path) if sizes == "ci" else {}


def _papermill():
    try:
        import papermill
    except ImportError as err:
        raise ImportError(f"running the notebooks needs papermill: {INSTALL_LAB}") from err
    return papermill


def _kernel_config():
    """The kernel talks to papermill over local sockets where the OS has them (Linux, macOS): a kernel
    on TCP without encryption prints a warning per notebook, and TCP is not needed on one machine."""
    from traitlets.config import Config

    config = Config()
    if os.name == "posix":
        config.KernelManager.transport = "ipc"
    return config


def finished_kernel_manager():
    """The kernel manager papermill starts each notebook's kernel with: jupyter_client's, except that a
    shutdown sends no interrupt first. jupyter_client interrupts a kernel before asking it to shut down, to
    stop code still running; papermill shuts a kernel down only after its last reply, so the SIGINT could
    land only inside the kernel's handler of that last request, and its log line ("KeyboardInterrupt
    caught in kernel") reached the terminal of ``course --headless``. An interrupt outside a shutdown (a
    cell's timeout) is sent as before."""
    from jupyter_client import AsyncKernelManager

    class FinishedKernelManager(AsyncKernelManager):
        async def _async_interrupt_kernel(self) -> None:
            if self.shutting_down:
                return
            await super()._async_interrupt_kernel()

    return FinishedKernelManager


def execute(path: Path, out: Path, sizes: str = "ci", cwd: Path | None = None, progress_bar: bool = False,
            prepare_only: bool = False):
    """Run notebook ``path`` with papermill and write the executed copy to ``out``.

    The kernel runs in ``cwd``, by default the folder of ``out``: whatever the notebook writes to a
    relative path (notebook 09's ``runs/``) lands beside the executed copy, never in the source tree.

    ``sizes="ci"`` injects the notebook's CI parameters; ``"full"`` runs its own defaults (GPU sizes
    where the notebook has them). ``prepare_only=True`` writes the parametrized copy without running
    it (for opening in JupyterLab). A failing cell raises :class:`NotebookFailed`, naming the notebook
    and the cell; the copy at ``out`` keeps the full traceback. The kernel first runs
    ``widget_snapshot.KERNEL_LINE``: widgets holding plotly FigureWidgets get a static HTML snapshot
    for the book.
    """
    from .widget_snapshot import KERNEL_LINE

    papermill = _papermill()
    parameters = parameters_for(path, sizes)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    cwd = Path(out).parent if cwd is None else Path(cwd)
    try:
        return papermill.execute_notebook(str(path), str(out), parameters=parameters, kernel_name="python3",
                                          cwd=str(cwd), progress_bar=progress_bar, prepare_only=prepare_only,
                                          extra_arguments=[f"--IPKernelApp.exec_lines={KERNEL_LINE}"],
                                          config=_kernel_config(), kernel_manager_class=finished_kernel_manager())
    except papermill.PapermillExecutionError as err:
        raise _cell_failure(Path(path), Path(out), err) from err
    except Exception as err:  # a dead kernel or a timeout: no cell index to report
        raise NotebookFailed(f"{Path(path).name} failed at {sizes} sizes: {type(err).__name__}: {err}\n"
                             f"executed copy: {out}", Path(path), None, Path(out)) from err


def _cell_failure(path: Path, out: Path, err) -> NotebookFailed:
    """Name the failing cell as the user's notebook numbers it (the executed copy has papermill's
    injected-parameters cell and error banners in addition)."""
    import nbformat

    added = ("injected-parameters", "papermill-error-cell-tag")
    cells = [c for c in nbformat.read(out, as_version=4).cells
             if not any(tag in c.metadata.get("tags", []) for tag in added)]
    failed = [i for i, c in enumerate(cells) if any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    cell = failed[0] if failed else None
    where = f"cell {cell + 1} of {len(cells)}" if cell is not None else f"the cell In [{err.exec_count}]"
    first_line = next((line for line in err.source.splitlines() if line.strip()), "")
    tail = strip_ansi("\n".join(err.traceback)).strip().splitlines()[-12:]
    message = (f"{path.name} failed in {where} (the code cell beginning {first_line!r}): "
               f"{err.ename}: {err.evalue}\n" + "\n".join("    " + line for line in tail) +
               f"\nexecuted copy with the full traceback: {out}")
    return NotebookFailed(message, path, cell, out)


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes (tracebacks and build logs carry them)."""
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


def _code_sources(nb) -> list[str]:
    return [c.source for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]


def is_current(executed: Path, source: Path, sizes: str) -> bool:
    """True when ``executed`` is a successful papermill run of ``source``'s present cells at ``sizes``."""
    import nbformat

    if not Path(executed).exists():
        return False
    run = nbformat.read(executed, as_version=4)
    meta = run.metadata.get("papermill", {})
    return (bool(meta.get("end_time")) and not meta.get("exception")
            and meta.get("parameters") == parameters_for(source, sizes)
            and _code_sources(run) == _code_sources(nbformat.read(source, as_version=4)))


def execute_all(sources: Sequence[Path], out_dir: Path, sizes: str = "ci", reuse: bool = False,
                progress: bool = True) -> list[Path]:
    """Execute every notebook of ``sources`` into ``out_dir`` (same file names), in order.

    ``reuse=True`` keeps an executed copy that :func:`is_current` accepts (the tests run each notebook
    once and the book reuses the copies). Stops at the first failure with :class:`NotebookFailed`.
    """
    from tqdm import tqdm

    if not sources:
        raise ValueError("no notebooks to execute (sources is empty)")
    out_dir = Path(out_dir)
    done = []
    bar = tqdm(sources, desc=f"notebooks ({sizes} sizes)", unit="nb", disable=not progress, file=sys.stderr)
    for path in bar:
        bar.set_postfix_str(Path(path).name)
        target = out_dir / Path(path).name
        if not (reuse and is_current(target, path, sizes)):
            execute(path, target, sizes=sizes)
        done.append(target)
    return done


def run_report(sources: Sequence[Path], out_dir: Path, sizes: str = "ci", progress: bool = True) -> dict:
    """Execute every notebook of ``sources`` into ``out_dir`` and time each one; go on past a failure.

    Returns ``{"sizes", "notebooks": [{"notebook", "seconds", "ok", "error"}], "failed": [names]}``
    (what ``course --headless --report`` writes, with provenance, after a full-size run on a GPU).
    """
    import time

    from tqdm import tqdm

    rows = []
    bar = tqdm(list(sources), desc=f"notebooks ({sizes} sizes)", unit="nb", disable=not progress, file=sys.stderr)
    for path in bar:
        bar.set_postfix_str(Path(path).name)
        start = time.perf_counter()
        error = None
        try:
            execute(path, Path(out_dir) / Path(path).name, sizes=sizes)
        except NotebookFailed as err:
            error = str(err)
        rows.append({"notebook": Path(path).name, "seconds": round(time.perf_counter() - start, 1),
                     "ok": error is None, "error": error})
    return {"sizes": sizes, "notebooks": rows, "failed": [r["notebook"] for r in rows if not r["ok"]]}
