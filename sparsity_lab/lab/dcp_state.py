"""Reading the DCP checkpoint of a run across processes (``DistributedTrainer.save``) into a trainer: by the
processes of another ``torchrun`` (any world size) or by one process (``Trainer.resume`` of OUT/checkpoint.dcp).

The directory holds the model and optimizer (``distributed/checkpoint.py``) and, as its ``extra`` bytes, the
trainer's own state: config, corpus identity, scheduler, sampler and step.
"""
from __future__ import annotations

import io
import warnings
from pathlib import Path

import torch

from .checkpoint import CheckpointError


def read_dcp_extra(path: str | Path) -> dict:
    """The trainer state saved beside the model in a DCP checkpoint (config, corpus, scheduler, sampler, step)."""
    from ..distributed.checkpoint import read_extra  # torch.distributed.checkpoint: loaded when needed

    try:
        return torch.load(io.BytesIO(read_extra(path)), weights_only=True)
    except (FileNotFoundError, ValueError) as err:
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read: {err}") from err


def check_corpus(trainer, saved: dict) -> None:
    if saved["sha256"] != trainer.corpus.fingerprint:
        raise CheckpointError(f"the data differ from the checkpoint's: {trainer.corpus.source!r} has sha256 "
                              f"{trainer.corpus.fingerprint[:12]}..., the run was trained on {saved['source']!r} "
                              f"with sha256 {saved['sha256'][:12]}...; restore the data or start a new run")


def restore_from_dcp(trainer, model, path: str | Path, extra: dict, no_dist: bool) -> None:
    """Load a DCP checkpoint (``DistributedTrainer.save``) into ``trainer``: model, optimizer, schedule, data
    position and step. no_dist: this process alone (a one-process run resuming a torchrun checkpoint)."""
    from ..distributed.checkpoint import load_distributed

    check_corpus(trainer, extra["corpus"])
    with warnings.catch_warnings():
        if no_dist:  # DCP says it loads in a single process: that is the intent
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        load_distributed(path, model, trainer.optimizer, no_dist=no_dist)
    trainer.scheduler.load_state_dict(extra["scheduler"])
    trainer.sampler.load_state_dict(extra["sampler"])
    trainer.step = int(extra["step"])
    trainer.log.truncate_after(trainer.step)
