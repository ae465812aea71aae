"""Building the course into an HTML book (Jupyter Book 1) from executed notebooks.

The book is built from executed copies, with execution off and ``-W``, so the pages show exactly
the run that was checked::

    build_course(out=Path("book"), sizes="ci")    # -> book/_build/html/index.html

Its configuration (``_config.yml``, ``intro.md``, ``_static/``) is read from ``BOOK_CONFIG_DIR``
and its reference chapters from ``DOCS_DIR`` (the checkout's ``book/`` and ``docs/``, or the wheel's
copies, see :mod:`sparsity_lab.shipped`); everything the build writes goes under ``out``.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from ..shipped import BOOK_CONFIG_DIR
from ..shipped import DOCS_DIR, NOTEBOOK_DIR
from . import book_page
from .book_page import book_notebook
from .running import INSTALL_LAB, execute_all, notebooks, strip_ansi

# where build_book and build_course put the book when not told: book/ of the current directory
DEFAULT_OUT = Path("book")


class BookBuildFailed(RuntimeError):
    """``jupyter-book build -W`` exited non-zero; the message carries its warnings and errors."""


def write_book_source(executed: Sequence[Path], source_dir: Path, sizes: str = "ci",
                      docs_dir: Path | None = None) -> Path:
    """Lay out the book's source in ``source_dir`` (emptied first): ``_config.yml``, ``intro.md`` and
    ``_static/`` (the page style) from ``BOOK_CONFIG_DIR``, the executed notebooks as
    :func:`book_notebook` shows them, the Markdown pages of ``docs_dir`` (default ``DOCS_DIR``, the
    shipped ``docs/``, when present) in ``docs/``, a ``_toc.yml`` listing the notebooks in order and
    then the docs pages, and plotly.js in ``_static/`` and MathJax in ``_mathjax/`` so the figures and
    the maths draw without a network."""
    import nbformat

    if not executed:
        raise ValueError("the book needs at least one executed notebook")
    docs_dir = DOCS_DIR if docs_dir is None else Path(docs_dir)
    docs = sorted(docs_dir.glob("*.md")) if docs_dir.is_dir() else []
    source_dir = Path(source_dir)
    if source_dir.exists():
        shutil.rmtree(source_dir)
    shutil.copytree(BOOK_CONFIG_DIR / "_static", source_dir / "_static")
    shutil.copy(BOOK_CONFIG_DIR / "_config.yml", source_dir / "_config.yml")
    _copy_plotly_js(source_dir / "_static")
    _copy_mathjax(source_dir / "_mathjax")

    pages = {f"notebooks/{Path(p).name}": Path(p).name for p in executed}
    pages.update({f"docs/{d.name}": f"docs/{d.name}" for d in docs})
    pages["book/intro.md"] = "intro.md"
    machine = _machine()
    intro = book_page.rewrite_links((BOOK_CONFIG_DIR / "intro.md").read_text(), "book/intro.md", pages.get)
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
    toc = ["# written by sparsity_lab.course.book.write_book_source", "format: jb-book", "root: intro", "parts:",
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
        raise ImportError(f"the book's maths needs jupyter-server-mathjax: {INSTALL_LAB}") from err
    source = Path(jupyter_server_mathjax.__file__).parent / "static"
    # the English messages only: the other languages are three quarters of the files
    skip = shutil.ignore_patterns(*[p.name for p in (source / "localization").iterdir() if p.name != "en"])
    shutil.copytree(source, folder / "mathjax", ignore=skip)


def _copy_plotly_js(static: Path) -> None:
    try:
        import plotly
    except ImportError as err:
        raise ImportError(f"the book's figures need plotly: {INSTALL_LAB}") from err
    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", static / "plotly.min.js")


def build_book(executed: Sequence[Path], out: Path = DEFAULT_OUT, sizes: str = "ci",
               docs_dir: Path | None = None) -> Path:
    """Build the HTML book from executed notebooks (and the ``docs_dir`` pages, see
    :func:`write_book_source`): source in ``out/_build/source``, pages in ``out/_build/html``
    (``out`` defaults to ``book/`` of the current directory). Runs
    ``jupyter-book build -W`` (any warning fails the build) and returns the path of ``index.html``;
    raises :class:`BookBuildFailed` with the build's warnings."""
    try:
        import jupyter_book  # noqa: F401
    except ImportError as err:
        raise ImportError(f"building the book needs Jupyter Book 1: {INSTALL_LAB}") from err
    out = Path(out)
    source = write_book_source(executed, out / "_build" / "source", sizes, docs_dir)
    html = out / "_build" / "html"
    if html.exists():
        shutil.rmtree(html)  # a fresh build: no page of a removed notebook survives
    cmd = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()", "build", str(source),
           "--path-output", str(out), "--builder", "html", "-W", "--keep-going", "--all"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        log = strip_ansi(done.stdout + done.stderr)
        problems = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line or "Error" in line]
        raise BookBuildFailed("jupyter-book build -W failed:\n" + "\n".join(problems or log.splitlines()[-40:]))
    index = html / "index.html"
    if not index.exists():
        raise BookBuildFailed(f"jupyter-book reported success but wrote no {index}")
    return index


def build_course(out: Path = DEFAULT_OUT, sizes: str = "ci", directory: Path = NOTEBOOK_DIR,
                 executed_dir: Path | None = None, reuse: bool = False, progress: bool = True,
                 sources: Sequence[Path] | None = None) -> Path:
    """Execute every notebook of ``directory`` (or only ``sources``, when given) at ``sizes`` and
    build the book; returns ``index.html``.

    Executed copies go to ``executed_dir`` (default ``out/_build/executed-<sizes>``); ``out`` defaults
    to ``book/`` of the current directory.
    """
    sources = notebooks(directory) if sources is None else list(sources)
    if not sources:
        raise FileNotFoundError(f"no course notebooks (NN_name.ipynb) in {directory}")
    executed_dir = Path(executed_dir) if executed_dir else Path(out) / "_build" / f"executed-{sizes}"
    executed = execute_all(sources, executed_dir, sizes=sizes, reuse=reuse, progress=progress)
    return build_book(executed, out, sizes)
