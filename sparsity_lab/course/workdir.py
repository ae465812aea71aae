"""The learner's working copy of the course: the shipped notebooks copied to a folder of their own.

JupyterLab saves into the files it serves (autosave writes outputs, a learner's edits), and a
notebook's relative paths (``runs/`` of notebook 09) are resolved from the notebook's folder; serving
the shipped notebooks would write both into the source tree (or into the installed package).
``sparsity-lab course`` serves this copy instead::

    WORKDIR/notebooks/NN_name.ipynb   the course notebooks (the learner's to edit and run)
    WORKDIR/docs/*.md                 the method reference and bibliography the notebooks link to
    WORKDIR/.sparsity-lab-course.json which shipped version each file was copied from (sha256)

A file is never overwritten once the learner changed it. :func:`sync` copies what is missing,
updates a file the learner has not touched when the shipped one changed, and keeps an edited one
(reporting that the shipped version differs). ``refresh=True`` replaces every file that differs
from the shipped one, after saving edited ones to ``WORKDIR/backup-<UTC time>/``.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_WORKDIR = Path("sparsity-lab-course")
MANIFEST = ".sparsity-lab-course.json"


@dataclass
class SyncReport:
    """What :func:`sync` did, by relative path (``notebooks/01_why_24.ipynb``)."""

    workdir: Path
    copied: list[str] = field(default_factory=list)      # were missing
    updated: list[str] = field(default_factory=list)     # shipped changed, learner had not edited
    kept: list[str] = field(default_factory=list)        # edited by the learner: left as they are
    refreshed: list[str] = field(default_factory=list)   # replaced on request (edited ones backed up)
    backup: Path | None = None

    def lines(self) -> list[str]:
        """Human-readable summary, one line per kind of action."""
        out = []
        for label, names in (("copied", self.copied), ("updated from the shipped version (you had not edited them)",
                                                        self.updated),
                             ("replaced by the shipped version (--refresh)", self.refreshed)):
            if names:
                out.append(f"{label}: {', '.join(Path(n).name for n in names)}")
        if self.backup is not None:
            out.append(f"your edited copies were saved to {self.backup}")
        if self.kept:
            out.append(f"kept your edited copies of {', '.join(Path(n).name for n in self.kept)} (they differ from "
                       "the shipped versions; `sparsity-lab course --refresh` replaces them, saving yours to a backup)")
        return out


def _digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def shipped_files(notebooks: Path, docs: Path | None = None) -> dict[str, Path]:
    """Relative path in the working copy -> shipped file: the NN_*.ipynb of ``notebooks`` and the
    Markdown files of ``docs`` (when that folder exists)."""
    files = {f"notebooks/{p.name}": p for p in sorted(Path(notebooks).glob("[0-9][0-9]_*.ipynb"))}
    if docs is not None and Path(docs).is_dir():
        files.update({f"docs/{p.relative_to(docs).as_posix()}": p for p in sorted(Path(docs).rglob("*.md"))})
    return files


def sync(workdir: Path, notebooks: Path, docs: Path | None = None, refresh: bool = False) -> SyncReport:
    """Bring ``workdir`` up to date with the shipped files without losing the learner's edits.

    Raises ValueError when there are no notebooks to copy or ``workdir`` is a file.
    """
    workdir = Path(workdir)
    files = shipped_files(notebooks, docs)
    if not any(rel.startswith("notebooks/") for rel in files):
        raise ValueError(f"no course notebooks (NN_name.ipynb) in {notebooks}")
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"--workdir {workdir} is a file, not a folder")
    manifest_path = workdir / MANIFEST
    recorded = json.loads(manifest_path.read_text()).get("files", {}) if manifest_path.exists() else {}
    report = SyncReport(workdir=workdir)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for rel, source in files.items():
        local, shipped = workdir / rel, _digest(source)
        if not local.exists():
            report.copied.append(rel)
        else:
            current = _digest(local)
            if current == shipped:
                recorded[rel] = shipped
                continue
            edited = current != recorded.get(rel)
            if edited and not refresh:
                report.kept.append(rel)
                continue
            if edited:  # refresh: save the learner's version first
                report.backup = workdir / f"backup-{stamp}"
                (report.backup / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(local, report.backup / rel)
            (report.refreshed if refresh else report.updated).append(rel)
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, local)
        recorded[rel] = shipped
    manifest_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps({"source": str(Path(notebooks).resolve()), "files": recorded}, indent=1) + "\n")
    return report
