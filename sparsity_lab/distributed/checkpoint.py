"""Distributed checkpoints (``torch.distributed.checkpoint``, DCP) of a sparse model and its optimizer.

What is saved, in one checkpoint directory:
* the model's state dict from ``get_state_dict`` (FQN keys, the same for a plain, DDP or FSDP2
  model): weights, every sparse layer's mask and beta, and its counters (step, mask step, mask
  updates, flips, MVUE seed and draw counter: the ``_extra_state``), which drive the refresh
  interval, the dense fine-tune switch and the MVUE draws;
* the optimizer state (FQN keys, so it re-shards like the weights);
* each rank's torch RNG state (restored only when the world size is the same: a different world
  size has different ranks, and a warning says so) and a ``meta`` dict of the caller's (plain JSON
  data: step, data position, ...).

Sharded tensors (FSDP2 weights, masks and optimizer moments) are saved as the ranks' shards and
loaded into whatever sharding the loading model has: save with 2 ranks, load with 1 or 4.
One process without a process group saves and loads too (``no_dist``).
"""
from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

FORMAT = "sparsity-lab-dcp/1"


def _world(no_dist: bool | None = None) -> tuple[int, int, bool]:
    """(rank, world size, whether to act collectively); no_dist=True: this process alone."""
    if not no_dist and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), True
    return 0, 1, False


def _rng_states(no_dist: bool | None) -> list[bytes]:
    """Every rank's torch CPU RNG state, as bytes (identical list on every rank: DCP writes it once)."""
    mine = bytes(torch.get_rng_state().numpy().tobytes())
    rank, world, distributed = _world(no_dist)
    if not distributed:
        return [mine]
    every: list = [None] * world
    dist.all_gather_object(every, mine)
    return every


def save_distributed(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                     meta: dict | None = None, no_dist: bool | None = None, extra: bytes = b"") -> Path:
    """Save model, optimizer, RNG states and ``meta`` (plain data) to the directory ``path``.
    Every rank calls it (it is collective), unless ``no_dist=True``: this process alone saves its
    model (a plain, unsharded one) while a process group runs. ``extra``: bytes of the caller's
    (e.g. a ``torch.save`` of a scheduler's state), read back by ``read_extra``. Returns the path."""
    path = Path(path)
    model_state, optim_state = get_state_dict(model, optimizer)
    _, world, distributed = _world(no_dist)
    state = {"model": model_state, "optimizer": optim_state,
             "info": {"format": FORMAT, "world_size": world, "rng": _rng_states(no_dist),
                      "meta": json.dumps(meta or {}),  # one string: DCP would flatten (and drop) an empty dict
                      "extra": bytes(extra)}}
    # written beside, then swapped in by rank 0: a run killed while saving keeps the previous checkpoint
    fresh = path.with_name(path.name + ".writing")
    if rank_zero := _world(no_dist)[0] == 0:
        shutil.rmtree(fresh, ignore_errors=True)
    if distributed:
        dist.barrier()
    dcp.save(state, storage_writer=FileSystemWriter(str(fresh), overwrite=True), no_dist=not distributed)
    if rank_zero:
        stale = path.with_name(path.name + ".old")
        shutil.rmtree(stale, ignore_errors=True)
        if path.exists():
            os.replace(path, stale)
        os.replace(fresh, path)
        shutil.rmtree(stale, ignore_errors=True)
    if distributed:
        dist.barrier()  # nobody reads the checkpoint before it is in place
    return path


def load_distributed(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                     no_dist: bool | None = None) -> dict:
    """Load a ``save_distributed`` checkpoint into ``model`` and ``optimizer`` (plain, DDP or FSDP2,
    any world size; build, sparsify, wrap the model and create the optimizer first). Every rank
    calls it, unless ``no_dist=True`` (this process alone, into a plain model). Returns the saved ``meta``."""
    path = Path(path)
    if not (path / ".metadata").is_file():
        raise FileNotFoundError(f"{str(path)!r} is not a torch.distributed.checkpoint directory (no .metadata)")
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state,
             "info": {"format": None, "world_size": None, "rng": None, "meta": None, "extra": None}}
    rank, world, distributed = _world(no_dist)
    dcp.load(state, checkpoint_id=str(path), no_dist=not distributed)
    info = state["info"]
    if info["format"] != FORMAT:
        raise ValueError(f"{str(path)!r} is not a {FORMAT} checkpoint (found {info['format']!r})")
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    if info["world_size"] == world:
        torch.set_rng_state(torch.frombuffer(bytearray(info["rng"][rank]), dtype=torch.uint8))
    else:
        warnings.warn(f"checkpoint saved by {info['world_size']} process(es), loaded by {world}: model and optimizer "
                      "are re-sharded, the per-rank torch RNG states are not restored", stacklevel=2)
    return json.loads(info["meta"])


def read_extra(path: str | Path) -> bytes:
    """The ``extra`` bytes of a ``save_distributed`` checkpoint, without a model (each process reads alone)."""
    path = Path(path)
    if not (path / ".metadata").is_file():
        raise FileNotFoundError(f"{str(path)!r} is not a torch.distributed.checkpoint directory (no .metadata)")
    state = {"info": {"format": None, "extra": None}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP warns that it loads in a single process: that is the intent
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    if state["info"]["format"] != FORMAT:
        raise ValueError(f"{str(path)!r} is not a {FORMAT} checkpoint (found {state['info']['format']!r})")
    return state["info"]["extra"]
