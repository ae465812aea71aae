"""``python -m benchmarks.torchtitan_train ARGS``: torchtitan 0.3's trainer (``python -m torchtitan.train``,
same arguments), started so that it also runs with torch 2.11 and, for the smoke run, on the CPU.

- torch 2.11 and 2.13: torchtitan 0.3.0 uses two names that these releases lack.
  ``torch.distributed.fsdp.DataParallelMeshDims`` (2.13 has it, 2.11 not) is imported with the trainer;
  torchtitan passes one to FSDP only under its ``full_dtensor`` parameter backend, which the 2:4 configs
  refuse (they set ``partial_dtensor``), so where it is missing a stand-in is put there that raises if
  anything builds one. ``torch.distributed.set_timeout(timeout, group)`` (in neither) is called after the
  first step to shorten the process groups' timeouts; where it is missing it is given as torch's own
  ``distributed_c10d._set_pg_timeout``, which does that.
- ``SPARSITY_LAB_TITAN_DEVICE=cpu``: torchtitan's device choice pointed at the CPU
  (``benchmarks/torchtitan_cpu.py``) before the trainer is imported.
"""
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
    install_compat()
    if os.environ.get("SPARSITY_LAB_TITAN_DEVICE") == "cpu":
        from benchmarks.torchtitan_cpu import use_cpu
        use_cpu()
    from torchtitan.train import main as titan_main

    titan_main()


if __name__ == "__main__":
    main()
