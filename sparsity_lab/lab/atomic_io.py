"""Writes that are all or nothing: a file is either its previous version or the complete new one.

``write_atomic(path, writer)`` writes through ``writer(file)`` into a temporary file beside
``path``, flushes and fsyncs it, renames it over ``path`` (atomic on POSIX) and fsyncs the
folder, so that a process killed at any point (SIGKILL, power loss after the rename returned)
leaves either the old file or the new one, never a torn mix. A failing write (full disk,
unwritable folder) raises :class:`OutputError` naming the path, and the temporary file is
removed: nothing half-written is left where a reader would take it for valid.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Callable


class OutputError(OSError):
    """A run's output (checkpoint, log, summary) could not be written; the message names the path."""


def fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (a no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def ensure_folder(folder: str | Path, what: str) -> Path:
    """Create ``folder`` (and parents) or raise OutputError naming it (e.g. a regular file in the way)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot create the {what} folder {str(folder)!r}: {err.strerror or err}") from err
    if not folder.is_dir():
        raise OutputError(f"the {what} folder {str(folder)!r} is not a folder")
    return folder


def write_atomic(path: str | Path, writer: Callable[[BinaryIO], None], what: str = "file") -> Path:
    """Write ``path`` all or nothing through ``writer(binary_file)``; returns the path."""
    path = Path(path)
    ensure_folder(path.parent, what)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            writer(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:  # incl. KeyboardInterrupt: never leave the temporary file behind
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(err, OSError) and not isinstance(err, OutputError):
            raise OutputError(f"cannot write the {what} {str(path)!r}: {err.strerror or err}; "
                              "the previous version, if any, is unchanged") from err
        raise
    fsync_folder(path.parent)
    for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a process killed mid-write
        try:
            stale.unlink()
        except OSError:
            pass
    return path


def write_text_atomic(path: str | Path, text: str, what: str = "file") -> Path:
    return write_atomic(path, lambda fh: fh.write(text.encode()), what)
