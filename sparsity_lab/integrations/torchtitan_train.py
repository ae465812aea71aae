"""``python -m sparsity_lab.integrations.torchtitan_train ARGS``: torchtitan 0.3's trainer (``python -m
torchtitan.train``, same arguments), started so that it also runs with torch 2.11 and 2.13.

torchtitan 0.3.0 was released against a newer torch and uses two names these releases lack:

- ``torch.distributed.fsdp.DataParallelMeshDims`` (2.13 has it, 2.11 not), imported with the trainer.
  torchtitan builds one only under its ``full_dtensor`` parameter backend, which the 2:4 configs refuse
  (they set ``partial_dtensor``): where it is missing, a stand-in that raises if built is put there.
- ``torch.distributed.set_timeout(timeout, group)`` (in neither), called after the first step to shorten
  the process groups' timeouts: where it is missing it is torch's own ``distributed_c10d._set_pg_timeout``,
  which does that.

Each addition is printed once by rank 0, so a run says what it changed. Where torch has both names this
is exactly ``python -m torchtitan.train``.
"""
from __future__ import annotations

import os

import torch.distributed as dist
import torch.distributed.fsdp as fsdp
from torch.distributed import distributed_c10d


class MissingDataParallelMeshDims:
    """Where torch has no ``DataParallelMeshDims``: importable, never usable."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("torch.distributed.fsdp.DataParallelMeshDims needs a newer torch than this one; torchtitan "
                           "uses it only with --parallelism.spmd_backend full_dtensor, which the 2:4 configs refuse")


def install_compat() -> list[str]:
    """Put the stand-ins torchtitan 0.3.0 needs into this torch; returns the names it added."""
    added = []
    if not hasattr(fsdp, "DataParallelMeshDims"):
        fsdp.DataParallelMeshDims = MissingDataParallelMeshDims
        added.append("torch.distributed.fsdp.DataParallelMeshDims")
    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = distributed_c10d._set_pg_timeout
        added.append("torch.distributed.set_timeout")
    return added


def main() -> None:
    added = install_compat()
    if added and os.environ.get("RANK", "0") == "0":
        print(f"sparsity_lab: torchtitan 0.3.0 on torch without {', '.join(added)}: stand-ins added "
              "(sparsity_lab/integrations/torchtitan_train.py says which and why)", flush=True)
    from torchtitan.train import main as titan_main

    titan_main()


if __name__ == "__main__":
    main()
