"""The notebook course: where the notebooks are, the small sizes CI runs them at, running them, and
building them into a book.

Each notebook in ``notebooks/`` keeps its CI sizes in its own metadata, so adding a notebook touches
one file::

    nb.metadata["sparsity_lab"] = {"ci_parameters": {"steps": 20, ...}}

papermill injects them into the notebook's ``parameters`` cell (the tests, the headless course run
and the book build all use :func:`execute`). The book is built from executed copies (Jupyter Book 1
with execution off and ``-W``), so the pages show exactly the run that was checked::

    build_course(out=BOOK_DIR, sizes="ci")    # -> book/_build/html/index.html
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
BOOK_DIR = ROOT / "book"
SIZES = ("ci", "full")
PLOTLY_JSON = "application/vnd.plotly.v1+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


class NotebookFailed(RuntimeError):
    """A notebook raised while it ran; the message names the notebook, the cell and the error."""

    def __init__(self, message: str, notebook: Path, cell: int | None, executed_copy: Path):
        super().__init__(message)
        self.notebook, self.cell, self.executed_copy = notebook, cell, executed_copy


class BookBuildFailed(RuntimeError):
    """``jupyter-book build -W`` exited non-zero; the message carries its warnings and errors."""


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


def parameters_for(path: Path, sizes: str) -> dict:
    """What papermill injects: the CI sizes for ``"ci"``, nothing (the notebook's defaults) for ``"full"``."""
    if sizes not in SIZES:
        raise ValueError(f"sizes must be 'ci' or 'full', got {sizes!r}")
    return ci_parameters(path) if sizes == "ci" else {}


def _papermill():
    try:
        import papermill
    except ImportError as err:
        raise ImportError("running the notebooks needs papermill: pip install -e '.[lab]'") from err
    return papermill


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
                                          extra_arguments=[f"--IPKernelApp.exec_lines={KERNEL_LINE}"])
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
    tail = _strip_ansi("\n".join(err.traceback)).strip().splitlines()[-12:]
    message = (f"{path.name} failed in {where} (the code cell beginning {first_line!r}): "
               f"{err.ename}: {err.evalue}\n" + "\n".join("    " + line for line in tail) +
               f"\nexecuted copy with the full traceback: {out}")
    return NotebookFailed(message, path, cell, out)


def _strip_ansi(text: str) -> str:
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


def book_notebook(nb, machine: str = "a CPU", book_path=None):
    """The executed notebook as the book shows it (a static page, no kernel).

    - A banner under the title says at which sizes the page was run (papermill's injected
      parameters: the CI sizes; none: the notebook's full sizes) and on which ``machine``.
    - papermill's injected-parameters cell is removed (the banner lists its values) and the nbval
      marker lines (``# NBVAL_CHECK_OUTPUT``) are taken out of the code.
    - A plotly figure is redrawn from its JSON bundle to fill the text column (no fixed width,
      responsive); the output that only loads plotly.js from the CDN is dropped (the book serves it).
    - Markdown that a cell displays keeps its headings below the page's sections.
    - Relative links go to the book's copy of their target (``book_path(repo_path)``; by default the
      notebooks are found by file name) or, for a file the book does not serve, show its path.
    - A widget holding FigureWidgets shows its static snapshot (``widget_snapshot``) instead of the
      live view, whose saved state has no trace data; the widget state keeps only the models that
      the remaining widget views use.
    """
    from . import book_page

    book_path = book_path or _notebook_book_path
    name = nb.metadata.get("papermill", {}).get("input_path") or "notebook.ipynb"
    here = f"notebooks/{Path(name).name}"
    parameters = nb.metadata.get("papermill", {}).get("parameters")
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = book_page.rewrite_links(cell.source, here, book_path)
        elif cell.cell_type == "code":
            cell.source = book_page.strip_test_markers(cell.source)
            cell["outputs"] = [o for o in cell.get("outputs", []) if not book_page.is_plotly_loader(o.get("data", {}))]
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if PLOTLY_JSON in data:
                data["text/html"] = book_page.responsive_plotly_html(data.pop(PLOTLY_JSON))
            if WIDGET_VIEW in data and "text/html" in data:
                del data[WIDGET_VIEW]
            if "text/markdown" in data:
                shown = "".join(data["text/markdown"]) if isinstance(data["text/markdown"], list) else data["text/markdown"]
                data["text/markdown"] = book_page.rewrite_links(book_page.demote_headings(shown), here, book_path)
    _add_banner(nb, book_page.run_banner(parameters, machine))
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


def _add_banner(nb, banner: str) -> None:
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
    import json

    keep, todo = {}, [r for r in roots if r in state]
    while todo:
        model_id = todo.pop()
        if model_id in keep:
            continue
        keep[model_id] = state[model_id]
        refs = re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(state[model_id]["state"]))
        todo += [r for r in refs if r in state]
    return keep


def write_book_source(executed: Sequence[Path], source_dir: Path, sizes: str = "ci",
                      docs_dir: Path | None = None) -> Path:
    """Lay out the book's source in ``source_dir`` (emptied first): ``_config.yml``, ``intro.md`` and
    ``_static/`` (the page style) from ``book/``, the executed notebooks as :func:`book_notebook`
    shows them, the Markdown pages of ``docs_dir`` (default: the repository's ``docs/``, when present)
    in ``docs/``, a ``_toc.yml`` listing the notebooks in order and then the docs pages, and plotly.js
    in ``_static/`` and MathJax in ``_mathjax/`` so the figures and the maths draw without a network."""
    import nbformat

    from . import book_page

    if not executed:
        raise ValueError("the book needs at least one executed notebook")
    docs_dir = ROOT / "docs" if docs_dir is None else Path(docs_dir)
    docs = sorted(docs_dir.glob("*.md")) if docs_dir.is_dir() else []
    source_dir = Path(source_dir)
    if source_dir.exists():
        shutil.rmtree(source_dir)
    shutil.copytree(BOOK_DIR / "_static", source_dir / "_static")
    shutil.copy(BOOK_DIR / "_config.yml", source_dir / "_config.yml")
    _copy_plotly_js(source_dir / "_static")
    _copy_mathjax(source_dir / "_mathjax")

    pages = {f"notebooks/{Path(p).name}": Path(p).name for p in executed}
    pages.update({f"docs/{d.name}": f"docs/{d.name}" for d in docs})
    pages["book/intro.md"] = "intro.md"
    machine = _machine()
    intro = book_page.rewrite_links((BOOK_DIR / "intro.md").read_text(), "book/intro.md", pages.get)
    lines = intro.split("\n")
    title = next((i for i, line in enumerate(lines) if line.startswith("# ")), -1)
    banner = book_page.run_banner(None, machine, sizes=sizes)
    (source_dir / "intro.md").write_text("\n".join(lines[:title + 1] + ["", banner] + lines[title + 1:]))
    for path in executed:
        nb = book_notebook(nbformat.read(path, as_version=4), machine=machine, book_path=pages.get)
        nbformat.write(nb, source_dir / Path(path).name)
    if docs:
        (source_dir / "docs").mkdir()
    for doc in docs:
        text = book_page.rewrite_links(doc.read_text(), f"docs/{doc.name}", pages.get)
        (source_dir / "docs" / doc.name).write_text(text)
    toc = ["# written by sparsity_lab.course.write_book_source", "format: jb-book", "root: intro", "parts:",
           "- caption: Notebooks", "  chapters:"]
    toc += [f"  - file: {Path(p).stem}" for p in executed]
    if docs:
        toc += ["- caption: Reference", "  chapters:"] + [f"  - file: docs/{d.stem}" for d in docs]
    (source_dir / "_toc.yml").write_text("\n".join(toc) + "\n")
    return source_dir


def _machine() -> str:
    """What the pages ran on, for their banner: this machine (the book is built where it was run)."""
    import torch

    return f"a GPU ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "a CPU"


def _copy_mathjax(folder: Path) -> None:
    """MathJax 2 (from the jupyter-server-mathjax package) into ``folder/mathjax``: the book's maths
    renders without a network (``book/_config.yml`` publishes ``folder`` beside the pages and points
    ``mathjax_path`` at it)."""
    try:
        import jupyter_server_mathjax
    except ImportError as err:
        raise ImportError("the book's maths needs jupyter-server-mathjax: pip install -e '.[lab]'") from err
    source = Path(jupyter_server_mathjax.__file__).parent / "static"
    # the English messages only: the other languages are three quarters of the files
    skip = shutil.ignore_patterns(*[p.name for p in (source / "localization").iterdir() if p.name != "en"])
    shutil.copytree(source, folder / "mathjax", ignore=skip)


def _copy_plotly_js(static: Path) -> None:
    try:
        import plotly
    except ImportError as err:
        raise ImportError("the book's figures need plotly: pip install -e '.[lab]'") from err
    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", static / "plotly.min.js")


def build_book(executed: Sequence[Path], out: Path = BOOK_DIR, sizes: str = "ci",
               docs_dir: Path | None = None) -> Path:
    """Build the HTML book from executed notebooks (and the ``docs_dir`` pages, see
    :func:`write_book_source`): source in ``out/_build/source``, pages in ``out/_build/html``. Runs ``jupyter-book build -W`` (any warning fails the build) and returns the
    path of ``index.html``; raises :class:`BookBuildFailed` with the build's warnings."""
    try:
        import jupyter_book  # noqa: F401
    except ImportError as err:
        raise ImportError("building the book needs Jupyter Book 1: pip install -e '.[lab]'") from err
    out = Path(out)
    source = write_book_source(executed, out / "_build" / "source", sizes, docs_dir)
    html = out / "_build" / "html"
    if html.exists():
        shutil.rmtree(html)  # a fresh build: no page of a removed notebook survives
    cmd = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()", "build", str(source),
           "--path-output", str(out), "--builder", "html", "-W", "--keep-going", "--all"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        log = _strip_ansi(done.stdout + done.stderr)
        problems = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line or "Error" in line]
        raise BookBuildFailed("jupyter-book build -W failed:\n" + "\n".join(problems or log.splitlines()[-40:]))
    index = html / "index.html"
    if not index.exists():
        raise BookBuildFailed(f"jupyter-book reported success but wrote no {index}")
    return index


def build_course(out: Path = BOOK_DIR, sizes: str = "ci", directory: Path = NOTEBOOK_DIR,
                 executed_dir: Path | None = None, reuse: bool = False, progress: bool = True) -> Path:
    """Execute every notebook of ``directory`` at ``sizes`` and build the book; returns ``index.html``.

    Executed copies go to ``executed_dir`` (default ``out/_build/executed-<sizes>``).
    """
    sources = notebooks(directory)
    if not sources:
        raise FileNotFoundError(f"no course notebooks (NN_name.ipynb) in {directory}")
    executed_dir = Path(executed_dir) if executed_dir else Path(out) / "_build" / f"executed-{sizes}"
    executed = execute_all(sources, executed_dir, sizes=sizes, reuse=reuse, progress=progress)
    return build_book(executed, out, sizes)

