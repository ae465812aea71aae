"""Checkpoints that load with ``torch.load(weights_only=True)``: tensors and plain containers only.

A checkpoint is one dict: ``format``, ``step``, ``config`` (primitives), ``model``, ``optimizer``,
``scheduler``, ``sampler`` and the torch RNG states. It is written to a temporary file and renamed,
so a run killed while saving leaves the previous checkpoint intact.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

FORMAT = "sparsity-lab-checkpoint/1"
REQUIRED = ("format", "step", "config", "model", "optimizer", "scheduler", "sampler", "torch_rng")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not belong to this run."""


def save_checkpoint(path: str | Path, state: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"format": FORMAT, **state}, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path) -> dict:
    """Read a checkpoint (to the CPU) with weights_only=True; clear errors for missing or corrupt files."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types (RuntimeError, UnpicklingError, EOFError, ...)
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read: it is corrupt, truncated or not a "
                              f"torch checkpoint ({type(err).__name__}: {str(err).splitlines()[0][:200]})") from err
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"checkpoint {str(path)!r} is not a {FORMAT} checkpoint (found {found!r})")
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r} lacks {missing}; it is incomplete")
    return state
