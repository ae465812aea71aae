"""Provenance for recorded figures: every JSON under results/ says where its numbers came from."""
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

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "results"


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(command: str | None = None) -> dict:
    """GPU/CPU name, library versions, date, git commit and the exact command."""
    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": os.environ.get("SPARSITY_LAB_COMMIT") or _git_commit(),
        "command": command or " ".join(shlex.quote(a) for a in sys.argv),
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
    else:
        info["gpu"] = None
    return info


def write_result(name: str, payload: dict, command: str | None = None, directory: Path | None = None) -> Path:
    """Write ``{"provenance": ..., **payload}`` to results/<name>.json and return the path."""
    directory = Path(directory) if directory is not None else RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps({"provenance": provenance(command), **payload}, indent=2, default=str) + "\n")
    return path


def read_result(name: str, directory: Path | None = None) -> dict:
    directory = Path(directory) if directory is not None else RESULTS_DIR
    path = directory / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"no recorded result {path}; run the benchmark that writes it on a GPU machine")
    return json.loads(path.read_text())
