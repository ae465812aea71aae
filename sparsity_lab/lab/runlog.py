"""The per-step training log: one JSON object per line (JSONL), ready for pandas.

    rows = read_log("runs/ste/log.jsonl")          # list of dicts
    df = pandas.read_json("runs/ste/log.jsonl", lines=True)

Columns: step, tokens, loss, val_loss, lr, grad_norm, flip_rate, flip/<layer> (one per sparse
layer), beta, density, dense_phase, tokens_per_s. Values that do not exist at a step (val_loss
between evaluations, a flip rate when no mask was computed) are null, never a made-up number.
"""
from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path
from typing import Any

from .atomic_io import OutputError, ensure_folder, write_text_atomic


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def finite_json(x: Any) -> Any:
    """x with every non-finite float (nested in dicts, lists, tuples) replaced by None, for strict JSON."""
    if isinstance(x, dict):
        return {k: finite_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_json(v) for v in x]
    return _clean(x)


def clean_row(row: dict) -> dict:
    """NaN/inf (a statistic that does not exist at this step) become None (JSON null)."""
    return {k: _clean(v) for k, v in row.items()}


class RunLog:
    """Append-only JSONL writer. ``truncate_after(step)`` drops rows past a checkpoint on resume.

    Crash consistency: ``flush()`` (called before every checkpoint) fsyncs the rows written so
    far, so a checkpoint at step s always has the rows 1..s on disk; a run killed later leaves
    rows past s, possibly a torn last line, which ``truncate_after(s)`` removes on resume (it
    rewrites the log atomically). Write failures raise OutputError naming the log's path.
    """

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self._fh = None
        if self.path is not None:
            ensure_folder(self.path.parent, "run log")

    def truncate_after(self, step: int) -> None:
        """Keep only rows with row["step"] <= step (a resumed run rewrites what follows)."""
        if self.path is None or not self.path.exists():
            return
        rows = [r for r in read_log(self.path, torn_tail_ok=True) if r["step"] <= step]
        write_text_atomic(self.path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in rows), "run log")

    def _drop_torn_tail(self) -> None:
        """Cut an unfinished last line (a run killed mid-write) so that appended rows start on a line
        of their own instead of gluing onto it."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with self.path.open("rb+") as fh:
            data = fh.read()
            if not data.endswith(b"\n"):
                fh.truncate(data.rfind(b"\n") + 1)

    def _failed(self, err: OSError) -> OutputError:
        return OutputError(f"cannot write the run log {str(self.path)!r}: {err.strerror or err}")

    def write(self, row: dict) -> None:
        if self.path is None:
            return
        line = json.dumps(clean_row(row), allow_nan=False) + "\n"
        try:
            if self._fh is None:
                self._drop_torn_tail()
                self._fh = self.path.open("a")
            self._fh.write(line)
        except OSError as err:
            raise self._failed(err) from err

    def flush(self) -> None:
        """Flush and fsync the rows written so far (before each checkpoint and at the end)."""
        if self._fh is not None:
            try:
                self._fh.flush()
                os.fsync(self._fh.fileno())
            except OSError as err:
                raise self._failed(err) from err

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def log_exists(path: str | Path) -> bool:
    """Whether ``read_log(path)`` finds a log: the file itself or its gzip-compressed copy
    (``path + ".gz"``, what an installed wheel ships)."""
    path = Path(path)
    return path.is_file() or path.with_name(path.name + ".gz").is_file()


def read_log(path: str | Path, torn_tail_ok: bool = False) -> list[dict]:
    """The rows of a JSONL log. A line that is not a JSON object raises ValueError naming the file
    and line, except (torn_tail_ok) an unfinished last line: the trace of a run killed mid-write.

    Where ``path`` is missing but ``path + ".gz"`` exists, that is read: an installed wheel ships the
    recorded logs gzip-compressed, without the per-layer ``flip/<layer>`` columns (setup.py)."""
    path = Path(path)
    packed = path.with_name(path.name + ".gz")
    if not path.is_file() and packed.is_file():
        text = gzip.decompress(packed.read_bytes()).decode(errors="replace")
    elif not path.is_file():
        raise FileNotFoundError(f"log {str(path)!r} does not exist")
    else:
        text = path.read_text(errors="replace")
    lines = text.split("\n")
    rows = []
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or "step" not in row:
                raise ValueError("not a row object with a 'step'")
        except ValueError as err:
            if torn_tail_ok and k == len(lines) - 1:  # no newline after it: the write never finished
                break
            raise ValueError(f"log {str(path)!r} line {k + 1} is not a log row ({err}); the file is corrupt") from err
        rows.append(row)
    return rows
