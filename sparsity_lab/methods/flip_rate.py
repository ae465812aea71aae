"""Flip rate (Hu et al. 2024): how much of a mask changed between two mask computations.

    r_t = ||m_t XOR m_{t-1}||_1 / D

per layer (D = the layer's weight count) and over all sparse layers (flips and D summed).
A dense run gives the reference curve from its would-be masks.
"""
from __future__ import annotations

import torch


def mask_flips_tensor(previous: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """Number of entries that differ between two masks, as a 0-d int64 tensor on their device (no
    host sync: a training step can count flips and read them later)."""
    if previous.shape != current.shape:
        raise ValueError(f"masks differ in shape: {tuple(previous.shape)} vs {tuple(current.shape)}")
    if previous.dtype == current.dtype == torch.bool:
        return (previous ^ current).sum()
    return ((previous != 0) ^ (current != 0)).sum()


def mask_flips(previous: torch.Tensor, current: torch.Tensor) -> int:
    """Number of entries that differ between two masks of the same shape."""
    return int(mask_flips_tensor(previous, current))


def flip_rate(previous: torch.Tensor, current: torch.Tensor) -> float:
    """r = ||m_prev XOR m_cur||_1 / D."""
    return mask_flips(previous, current) / previous.numel()


def overall_flip_rate(flips_and_sizes: list[tuple[int, int]]) -> float:
    """Flip rate over several layers: sum of flips / sum of sizes (NaN when nothing is given)."""
    flips = sum(f for f, _ in flips_and_sizes)
    size = sum(d for _, d in flips_and_sizes)
    return flips / size if size else float("nan")
