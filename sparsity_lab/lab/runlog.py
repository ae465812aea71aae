"""The per-step training log: one JSON object per line (JSONL), ready for pandas.

    rows = read_log("runs/ste/log.jsonl")          # list of dicts
    df = pandas.read_json("runs/ste/log.jsonl", lines=True)

Columns: step, tokens, loss, val_loss, lr, grad_norm, flip_rate, flip/<layer> (one per sparse
layer), beta, density, dense_phase, tokens_per_s. Values that do not exist at a step (val_loss
between evaluations, a flip rate when no mask was computed) are null, never a made-up number.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


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
    """Append-only JSONL writer. ``truncate_after(step)`` drops rows past a checkpoint on resume."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self._fh = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def truncate_after(self, step: int) -> None:
        """Keep only rows with row["step"] <= step (a resumed run rewrites what follows)."""
        if self.path is None or not self.path.exists():
            return
        rows = [r for r in read_log(self.path) if r["step"] <= step]
        self.path.write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in rows))

    def write(self, row: dict) -> None:
        if self.path is None:
            return
        if self._fh is None:
            self._fh = self.path.open("a")
        self._fh.write(json.dumps(clean_row(row), allow_nan=False) + "\n")

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_log(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"log {str(path)!r} does not exist")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
