"""``sparsity-lab course``: open the notebook course in JupyterLab, or run it headless into a book.

    sparsity-lab course                          # JupyterLab on a working copy, ./sparsity-lab-course
    sparsity-lab course --workdir ~/course       # ... somewhere else; --refresh: the shipped notebooks again
    sparsity-lab course --no-browser --port 9999 -- --ServerApp.allow_root=True   # after --: to jupyter lab
    sparsity-lab course --headless [--sizes ci|full] [--out DIR]   # run every notebook, build the book
    sparsity-lab course --headless --sizes full --no-book --report results/course_full.json   # GPU run, timed
    sparsity-lab course --headless --no-book --only 02 05          # just these notebooks

The shipped notebooks are those of the source checkout or of the installed wheel
(:mod:`sparsity_lab.shipped`). JupyterLab serves the learner's working copy (:mod:`.workdir`), never
the shipped ones, so autosave, edits and the runs a notebook writes stay out of the source tree and
the installed package. The headless run reads the shipped notebooks and writes its executed copies,
their runs and the book under ``--out`` (default WORKDIR/book). A SIGTERM or SIGHUP to this command
is passed on to the Jupyter server, which then shuts down.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..shipped import NOTEBOOK_DIR
from .book import BookBuildFailed, build_course
from .running import INSTALL_LAB, SIZES, NotebookFailed, notebooks, run_report, select_notebooks
from .workdir import DEFAULT_WORKDIR, sync
from ..lab.arguments import as_path, existing_folder, output_file, output_folder, port_number

FORWARDED_SIGNALS = ("SIGTERM", "SIGHUP")  # Ctrl+C reaches the server already (same process group)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--notebooks", type=as_path(existing_folder), default=NOTEBOOK_DIR, metavar="DIR",
                        help="folder of the course notebooks to copy or run (default: the shipped ones, "
                             f"{NOTEBOOK_DIR})")
    parser.add_argument("--workdir", type=as_path(output_folder), default=DEFAULT_WORKDIR, metavar="DIR",
                        help="your working copy: JupyterLab opens the notebooks copied to DIR/notebooks, and runs "
                             "and the headless book are written under DIR (default ./sparsity-lab-course). "
                             "Copies you have edited are never overwritten")
    parser.add_argument("--refresh", action="store_true",
                        help="replace the working copy's notebooks by the shipped ones (edited copies are saved "
                             "to DIR/backup-<time>/ first)")
    headless = parser.add_argument_group("headless (no screen): execute every notebook and build the book")
    headless.add_argument("--headless", action="store_true", help="run the notebooks and build the HTML book")
    headless.add_argument("--sizes", choices=SIZES, default=None,
                          help="'ci': the small sizes CI uses (default); 'full': the notebooks' own sizes (GPU)")
    headless.add_argument("--out", type=as_path(output_folder), default=None, metavar="DIR",
                          help="book folder; the pages land in DIR/_build/html, executed notebooks and what they "
                               "write in DIR/_build/executed-<sizes> (default WORKDIR/book)")
    headless.add_argument("--only", nargs="+", default=None, metavar="NN",
                          help="run only these notebooks, by number (02) or file name (default: all of them)")
    headless.add_argument("--no-book", action="store_true",
                          help="only execute the notebooks (no Jupyter Book needed); goes on past a failing one")
    headless.add_argument("--report", type=as_path(output_file), default=None, metavar="FILE",
                          help="with --no-book: write each notebook's time and status, with provenance, as JSON")
    lab = parser.add_argument_group("JupyterLab")
    lab.add_argument("--port", type=port_number, default=None, help="port (default 8888, or a free one if it is taken)")
    lab.add_argument("--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    lab.add_argument("--no-browser", action="store_true", help="do not open a browser (open the printed URL)")
    lab.add_argument("lab_args", nargs=argparse.REMAINDER, metavar="-- LAB_ARGS",
                     help="anything after -- goes to jupyter lab unchanged (e.g. -- --ServerApp.allow_root=True)")


def check_arguments(args) -> None:
    """Options of one mode given to the other are mistakes; say which (ValueError)."""
    lab_args = _lab_args(args)
    if args.headless:
        given = [name for name, on in (("--port", args.port is not None), ("--no-browser", args.no_browser),
                                       ("--refresh", args.refresh), ("-- LAB_ARGS", bool(lab_args))) if on]
        if given:
            raise ValueError(f"{', '.join(given)}: JupyterLab options, not used with --headless")
    else:
        given = [name for name, value in (("--sizes", args.sizes), ("--out", args.out), ("--report", args.report),
                                          ("--only", args.only)) if value is not None]
        given += ["--no-book"] if args.no_book else []
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
        raise ValueError(f"--notebooks: no such folder {args.notebooks} (the course notebooks ship with the "
                         "wheel, or live in notebooks/ of a source checkout)")
    if args.only:
        select_notebooks(notebooks(args.notebooks), args.only)  # names what matches no notebook


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
        print(f"the course needs JupyterLab: {INSTALL_LAB}", file=sys.stderr)
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
    workdir = Path(args.workdir).resolve()
    try:
        report = sync(workdir, args.notebooks, _docs_beside(args.notebooks), refresh=args.refresh)
    except (ValueError, OSError) as err:
        print(f"sparsity-lab course: error: {err}", file=sys.stderr)
        return 2
    print(f"Your working copy of the course: {workdir / 'notebooks'}", flush=True)
    for line in report.lines():
        print(f"  {line}")
    print("  (JupyterLab saves your edits and outputs there; the shipped notebooks stay untouched)", flush=True)
    cmd = lab_command(workdir, args.ip, port, args.no_browser, extra)
    print(f"The course in JupyterLab: {lab_url(args.ip, port, token)}\n(stop it with Ctrl+C)", flush=True)
    proc = subprocess.Popen(cmd, env=env)
    return wait_forwarding_signals(proc)


def wait_forwarding_signals(proc: subprocess.Popen, grace_s: float = 20.0) -> int:
    """Wait for ``proc``, passing SIGTERM/SIGHUP on to it (a service manager or `kill` stopping this
    command must stop the server too); kill it if it has not exited ``grace_s`` after the signal."""
    received: list[int] = []

    def forward(signum, _frame):
        received.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {}
    for name in FORWARDED_SIGNALS:
        if hasattr(signal, name):
            previous[name] = signal.signal(getattr(signal, name), forward)
    deadline = None
    try:
        while True:
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if received and deadline is None:
                    deadline = time.monotonic() + grace_s
                if deadline is not None and time.monotonic() > deadline:
                    print(f"the Jupyter server did not stop within {grace_s:.0f} s of the signal: killing it",
                          file=sys.stderr, flush=True)
                    proc.kill()
                    deadline = float("inf")
            except KeyboardInterrupt:  # jupyter got the same Ctrl+C and asks, or shuts itself down
                continue
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)
    return 128 + received[0] if received else code


def _docs_beside(notebooks: Path) -> Path:
    """The docs/ folder next to the shipped notebooks/ (the method reference they link to)."""
    return Path(notebooks).resolve().parent / "docs"


def _sources(args) -> list[Path]:
    """The notebooks to run: every one of ``--notebooks``, or those ``--only`` names."""
    found = notebooks(args.notebooks)
    return select_notebooks(found, args.only) if args.only else found


def run_headless(args) -> int:
    out = args.out if args.out is not None else Path(args.workdir) / "book"
    sizes = args.sizes or "ci"
    if args.no_book:
        return run_notebooks_only(args, out, sizes)
    try:
        index = build_course(out=out, sizes=sizes, directory=args.notebooks, sources=_sources(args))
    except (NotebookFailed, BookBuildFailed) as err:
        print(f"course --headless: {err}", file=sys.stderr)
        return 1
    which = "The notebooks chosen" if args.only else "Every notebook"
    print(f"{which} ran at {sizes} sizes; executed copies in {Path(out) / '_build' / ('executed-' + sizes)}")
    print(f"The book: {index.resolve()}  (open file://{index.resolve()})")
    return 0


def run_notebooks_only(args, out: Path, sizes: str) -> int:
    import json

    from ..provenance import provenance

    executed_dir = Path(out) / "_build" / f"executed-{sizes}"
    report = run_report(_sources(args), executed_dir, sizes=sizes)
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
