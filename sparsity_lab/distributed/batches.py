"""Each rank's share of a global batch."""
from __future__ import annotations

import torch


def local_batch(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rows ``rank * b : (rank + 1) * b`` of a global batch of ``world_size * b`` rows (dim 0).

    With the loss a mean over each rank's rows, the averaged gradient of data parallelism equals the
    gradient of the mean loss over the global batch. A world size that does not divide the batch
    would weight the ranks unequally, so it is refused."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    rows = batch.shape[0]
    if rows % world_size:
        raise ValueError(f"the global batch has {rows} rows, not divisible by the world size {world_size}: choose a "
                         f"batch size that is a multiple of {world_size} (or run on a world size that divides {rows})")
    per_rank = rows // world_size
    return batch[rank * per_rank:(rank + 1) * per_rank]
