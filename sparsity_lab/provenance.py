"""Provenance for recorded figures: every JSON under results/ says where its numbers came from.

:func:`write_result` writes to the folder it is given, by default ``results/`` under the current
directory (never into the installed package). :func:`read_result` reads the recorded figures that ship
with the library (``RESULTS_DIR``: the checkout's ``results/`` or the wheel's copy, see
:mod:`sparsity_lab.shipped`) unless given another folder.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch

from .shipped import RESULTS_DIR, build_commit, source_checkout

# where write_result puts a JSON when no folder is given: results/ of the current directory
OUTPUT_DIR = Path("results")


def _git_commit() -> str:
    """The commit of the code that runs: the checkout's HEAD (``+dirty`` with uncommitted changes to
    tracked files), the commit an installed wheel was built from, or ``"unknown"``.

    git is asked only inside the source checkout of this package: an installed package may sit in a
    virtual environment inside some other repository, whose commit says nothing about this code.
    """
    root = source_checkout()
    if root is None:
        return build_commit() or "unknown"
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def command_line(argv: list[str] | None = None) -> str:
    """The command that is running, as a user would type it: ``python -m MODULE ...`` for a module run
    with ``-m`` (Python puts the module's file path in ``sys.argv[0]``), else argv as it is."""
    argv = list(sys.argv if argv is None else argv)
    main = sys.modules.get("__main__")
    module = getattr(getattr(main, "__spec__", None), "name", None) if argv is sys.argv or argv == sys.argv else None
    if module:
        module = module.removesuffix(".__main__")
        argv = ["python", "-m", module, *argv[1:]]
    return " ".join(shlex.quote(a) for a in argv)


def provenance(command: str | None = None) -> dict:
    """GPU/CPU name, library versions, date, git commit and the exact command."""
    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": os.environ.get("SPARSITY_LAB_COMMIT") or _git_commit(),
        "command": command or command_line(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        info["cuda"] = torch.version.cuda
        cslt = getattr(torch.backends, "cusparselt", None)
        info["cusparselt"] = cslt.version() if cslt is not None and cslt.is_available() else None
        if info["cusparselt"] is not None:  # the library loaded may be another (a newer one preloaded)
            try:
                from .backends.cusparselt.direct import loaded_library
                loaded = loaded_library()
                info["cusparselt_loaded"], info["cusparselt_library"] = loaded["version"], loaded["path"]
            except Exception as err:  # the binding's errors are named; provenance must not stop a run
                info["cusparselt_loaded"] = f"unknown ({type(err).__name__}: {err})"
    else:
        info["gpu"] = None
    return info


def write_result(name: str, payload: dict, command: str | None = None, directory: Path | None = None) -> Path:
    """Write ``{"provenance": ..., **payload}`` to ``directory/<name>.json`` (default: ``results/`` of
    the current directory) and return the path."""
    directory = Path(directory) if directory is not None else OUTPUT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps({"provenance": provenance(command), **payload}, indent=2, default=str) + "\n")
    return path


def read_result(name: str, directory: Path | None = None) -> dict:
    """``directory/<name>.json`` (default: the recorded results shipped with the library, RESULTS_DIR)."""
    directory = Path(directory) if directory is not None else RESULTS_DIR
    path = directory / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no recorded result {path}; run the benchmark that writes it on a GPU machine")
    return json.loads(path.read_text())
