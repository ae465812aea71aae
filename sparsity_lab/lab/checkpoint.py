"""Checkpoints that load with ``torch.load(weights_only=True)``: tensors and plain containers only.

A checkpoint is one dict: ``format``, ``step``, ``config`` (primitives), ``model``, ``optimizer``,
``scheduler``, ``sampler``, the torch RNG states and ``sha256``, a digest of everything else
(every key, primitive and tensor byte, in order). ``load_checkpoint`` recomputes the digest and
refuses a checkpoint whose content changed on disk (a flipped byte in a tensor otherwise loads
silently as different weights). The file is written atomically (``atomic_io.write_atomic``:
temporary file, fsync, rename), so a run killed while saving keeps its previous checkpoint.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from .atomic_io import write_atomic

FORMAT = "sparsity-lab-checkpoint/2"  # /1: the same without the sha256 digest
REQUIRED = ("format", "step", "config", "model", "optimizer", "scheduler", "sampler", "torch_rng", "sha256")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not belong to this run."""


def _first_line(err: BaseException, limit: int = 200) -> str:
    """``Type: first line of the message`` (an empty message, e.g. a bare EOFError, gives the type)."""
    lines = str(err).splitlines()
    return f"{type(err).__name__}: {lines[0][:limit]}" if lines else type(err).__name__


def _feed(h: "hashlib._Hash", x: Any) -> None:
    """Add x to the digest: its type, then its content (dict order is kept by pickling)."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(x, dict):
        h.update(f"D{len(x)}".encode())
        for k, v in x.items():
            _feed(h, k)
            _feed(h, v)
    elif isinstance(x, (list, tuple)):
        h.update(f"{type(x).__name__[0]}{len(x)}".encode())
        for v in x:
            _feed(h, v)
    else:  # str, int, float (repr round-trips), bool, None, torch.dtype, torch.Size...
        h.update(f"{type(x).__name__}:{x!r};".encode())


def state_digest(state: dict) -> str:
    """sha256 over every entry of ``state`` except ``sha256`` itself."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in state.items() if k != "sha256"})
    return h.hexdigest()


def save_checkpoint(path: str | Path, state: dict) -> Path:
    """Write ``state`` (plus format and digest) to ``path`` atomically; OutputError names the path."""
    full = {"format": FORMAT, **state}
    full["sha256"] = state_digest(full)
    return write_atomic(path, lambda fh: torch.save(full, fh), what="checkpoint")


def load_checkpoint(path: str | Path) -> dict:
    """Read a checkpoint (to the CPU) with weights_only=True and verify its digest.

    Clear CheckpointErrors for empty, truncated, corrupt, foreign or altered files.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {str(path)!r} is empty (0 bytes): the save that wrote it did not finish")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types (RuntimeError, UnpicklingError, EOFError, ...)
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read: it is corrupt, truncated or not a "
                              f"torch checkpoint ({_first_line(err)})") from err
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        older = " (an older format without an integrity digest; re-run to write a current one)" \
            if found == "sparsity-lab-checkpoint/1" else ""
        raise CheckpointError(f"checkpoint {str(path)!r} is not a {FORMAT} checkpoint (found {found!r}){older}")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r} lacks {missing}; it is incomplete")
    if state_digest(state) != state["sha256"]:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: its content does not match the sha256 "
                              "digest stored in it (bytes changed on disk after it was written)")
    return state
