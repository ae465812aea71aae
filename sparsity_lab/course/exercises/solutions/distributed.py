"""Worked solutions: notebook 12 (2:4 across GPUs)."""
from __future__ import annotations

import math

import torch


def shard_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """Pieces of ceil(rows / world) rows, as torch.chunk cuts them; the last ranks may get fewer or none."""
    size = math.ceil(rows / world)
    start = min(rank * size, rows)
    return start, min(start + size, rows)


def masked_decay_shard(grad: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor, decay: float) -> torch.Tensor:
    """g + lambda (1 - m) W on the rank's rows: elementwise, so the rows need nothing from other ranks."""
    return grad + decay * (~mask) * weight


def total_flips(old_parts: list[torch.Tensor], new_parts: list[torch.Tensor]) -> int:
    """Each rank counts its rows' flips; all_reduce(SUM) adds the counts."""
    return sum(int((old ^ new).sum()) for old, new in zip(old_parts, new_parts))
