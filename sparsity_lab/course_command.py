"""``sparsity-lab course``: open the notebook course in JupyterLab, or run it headless into a book.

    sparsity-lab course                          # JupyterLab on notebooks/, prints the URL
    sparsity-lab course --no-browser --port 9999 -- --ServerApp.allow_root=True   # after --: to jupyter lab
    sparsity-lab course --headless [--sizes ci|full] [--out DIR]   # run every notebook, build the book
    sparsity-lab course --headless --sizes full --no-book --report results/course_full.json   # GPU run, timed
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

from .course import (BOOK_DIR, NOTEBOOK_DIR, SIZES, BookBuildFailed, NotebookFailed, build_course, notebooks,
                     run_report)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOK_DIR, metavar="DIR",
                        help=f"folder of the course notebooks (default {NOTEBOOK_DIR})")
    headless = parser.add_argument_group("headless (no screen): execute every notebook and build the book")
    headless.add_argument("--headless", action="store_true", help="run the notebooks and build the HTML book")
    headless.add_argument("--sizes", choices=SIZES, default=None,
                          help="'ci': the small sizes CI uses (default); 'full': the notebooks' own sizes (GPU)")
    headless.add_argument("--out", type=Path, default=None, metavar="DIR",
                          help=f"book folder; the pages land in DIR/_build/html (default {BOOK_DIR})")
    headless.add_argument("--no-book", action="store_true",
                          help="only execute the notebooks (no Jupyter Book needed); goes on past a failing one")
    headless.add_argument("--report", type=Path, default=None, metavar="FILE",
                          help="with --no-book: write each notebook's time and status, with provenance, as JSON")
    lab = parser.add_argument_group("JupyterLab")
    lab.add_argument("--port", type=int, default=None, help="port (default 8888, or a free one if it is taken)")
    lab.add_argument("--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    lab.add_argument("--no-browser", action="store_true", help="do not open a browser (open the printed URL)")
    lab.add_argument("lab_args", nargs=argparse.REMAINDER, metavar="-- LAB_ARGS",
                     help="anything after -- goes to jupyter lab unchanged (e.g. -- --ServerApp.allow_root=True)")


def check_arguments(args) -> None:
    """Options of one mode given to the other are mistakes; say which (ValueError)."""
    lab_args = _lab_args(args)
    if args.headless:
        given = [name for name, on in (("--port", args.port is not None), ("--no-browser", args.no_browser),
                                       ("-- LAB_ARGS", bool(lab_args))) if on]
        if given:
            raise ValueError(f"{', '.join(given)}: JupyterLab options, not used with --headless")
    else:
        given = [name for name, value in (("--sizes", args.sizes), ("--out", args.out), ("--report", args.report))
                 if value is not None] + (["--no-book"] if args.no_book else [])
        if given:
            raise ValueError(f"{', '.join(given)}: only used with --headless (which runs the notebooks "
                             "and builds the book)")
    if args.report is not None and not args.no_book:
        raise ValueError("--report goes with --no-book (the book build stops at the first failing notebook)")
    if lab_args and not lab_args[0].startswith("-"):
        raise ValueError(f"unexpected argument {lab_args[0]!r}: put options for jupyter lab after --")
    if args.port is not None and not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    if not Path(args.notebooks).is_dir():
        raise ValueError(f"--notebooks: no such folder {args.notebooks} (the course notebooks live in "
                         "notebooks/ of a source checkout: pip install -e '.[lab]' from the repository)")


def _lab_args(args) -> list[str]:
    extra = list(args.lab_args or [])
    return extra[1:] if extra[:1] == ["--"] else extra


def free_port(ip: str = "127.0.0.1", preferred: int | None = None) -> int:
    """``preferred`` when nothing listens on it, else a port the OS reports free."""
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket() as s:
            try:
                s.bind((ip, port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError(f"no free port on {ip}")


def lab_command(root: Path, ip: str, port: int, no_browser: bool = False, extra: list[str] = ()) -> list[str]:
    """The ``jupyter lab`` command serving ``root`` on exactly ``ip:port`` (no silent move to another port)."""
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}", f"--ServerApp.ip={ip}",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0"]
    return cmd + (["--no-browser"] if no_browser else []) + list(extra)


def lab_url(ip: str, port: int, token: str) -> str:
    host = "127.0.0.1" if ip in ("", "0.0.0.0", "localhost") else ip
    return f"http://{host}:{port}/lab?token={token}"


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def run_lab(args) -> int:
    if importlib.util.find_spec("jupyterlab") is None:
        print("the course needs JupyterLab: python -m pip install -e '.[lab]'", file=sys.stderr)
        return 1
    port = args.port if args.port is not None else free_port(args.ip, preferred=8888)
    # The token travels in the environment (jupyter reads JUPYTER_TOKEN), not on the command line.
    env = dict(os.environ)
    token = env.setdefault("JUPYTER_TOKEN", secrets.token_hex(24))
    extra = _lab_args(args)
    if _is_root() and not any("allow_root" in a or a == "--allow-root" for a in extra):
        # jupyter refuses to start as root (containers, cloud machines) unless told: say so and allow it
        print("running as root: starting JupyterLab with --ServerApp.allow_root=True", flush=True)
        extra = extra + ["--ServerApp.allow_root=True"]
    cmd = lab_command(Path(args.notebooks).resolve(), args.ip, port, args.no_browser, extra)
    print(f"The course in JupyterLab: {lab_url(args.ip, port, token)}\n(stop it with Ctrl+C)", flush=True)
    proc = subprocess.Popen(cmd, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:  # jupyter got the same Ctrl+C and shuts itself down
        return proc.wait()


def run_headless(args) -> int:
    out = args.out if args.out is not None else BOOK_DIR
    sizes = args.sizes or "ci"
    if args.no_book:
        return run_notebooks_only(args, out, sizes)
    try:
        index = build_course(out=out, sizes=sizes, directory=args.notebooks)
    except (NotebookFailed, BookBuildFailed) as err:
        print(f"course --headless: {err}", file=sys.stderr)
        return 1
    print(f"Every notebook ran at {sizes} sizes; executed copies in {Path(out) / '_build' / ('executed-' + sizes)}")
    print(f"The book: {index.resolve()}  (open file://{index.resolve()})")
    return 0


def run_notebooks_only(args, out: Path, sizes: str) -> int:
    import json

    from .provenance import provenance

    executed_dir = Path(out) / "_build" / f"executed-{sizes}"
    report = run_report(notebooks(args.notebooks), executed_dir, sizes=sizes)
    for row in report["notebooks"]:
        print(f"{row['notebook']:<34} {row['seconds']:>7.1f} s  {'ok' if row['ok'] else 'FAILED'}")
        if not row["ok"]:
            print("    " + row["error"].replace("\n", "\n    "), file=sys.stderr)
    if args.report is not None:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps({"provenance": provenance(), **report}, indent=2) + "\n")
        print(f"report: {args.report}")
    print(f"executed copies in {executed_dir}")
    return 1 if report["failed"] else 0


def run(args) -> int:
    try:
        check_arguments(args)
    except ValueError as err:
        print(f"sparsity-lab course: error: {err}", file=sys.stderr)
        return 2
    return run_headless(args) if args.headless else run_lab(args)
