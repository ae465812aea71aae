"""N:M magnitude masks along one dimension.

An N:M mask keeps the N largest ``|w|`` of every M consecutive elements along ``dim``.
Ties go to the lowest index, so the mask is a deterministic function of the weights.

Non-finite weights (reachable only with ``check=False``, the hot path of training): NaN ranks
as the largest magnitude, like +-Inf (ties to the lowest index), so the mask has exactly N
kept per group whatever the input; the Triton kernels follow the same rule. A meta tensor gives
a meta mask (shape only).
"""
from __future__ import annotations

import torch

from ..validation import check_divisible, check_float_tensor, check_has_values, check_nm, normalize_dim

# Up to this group size the rank is computed by pairwise comparison (an (.., M, M) tensor);
# beyond it a stable sort is cheaper in memory.
_PAIRWISE_MAX_M = 8


def group_keep_rank(groups: torch.Tensor) -> torch.Tensor:
    """Rank of each element inside its group by descending magnitude, ties to the lowest index.

    groups: (..., M) magnitudes. Returns int64 ranks (..., M) in 0..M-1 (rank 0 = largest).
    rank_i = #{j : a_j > a_i} + #{j < i : a_j == a_i}
    """
    m = groups.shape[-1]
    if m <= _PAIRWISE_MAX_M:
        a_i = groups.unsqueeze(-1)  # (..., M, 1)
        a_j = groups.unsqueeze(-2)  # (..., 1, M)
        idx = torch.arange(m, device=groups.device)
        earlier = idx.unsqueeze(0) < idx.unsqueeze(1)  # [i, j] = j < i
        beats = (a_j > a_i) | ((a_j == a_i) & earlier)
        return beats.sum(dim=-1)
    order = torch.sort(groups, dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, torch.arange(m, device=groups.device).expand_as(order))
    return ranks


def nm_mask(weight: torch.Tensor, n: int = 2, m: int = 4, dim: int = -1, check: bool = True) -> torch.Tensor:
    """Magnitude N:M mask of ``weight`` along ``dim``.

    weight: any shape, floating point, finite; ``weight.shape[dim] % m == 0``.
    Returns a bool tensor of the same shape with exactly ``n`` True in every group of ``m``
    consecutive elements along ``dim``. Works on non-contiguous views and on any device.
    check=False skips the argument checks (the NaN/Inf scan costs a pass and a sync): for hot
    paths whose inputs were checked once already.
    """
    if check:
        check_nm(n, m)
        check_float_tensor(weight, "weight", allow_meta=True)
    dim = normalize_dim(dim, weight.dim())
    check_divisible(weight.shape[dim], m, "weight", dim)
    if weight.is_meta:
        return torch.empty(weight.shape, dtype=torch.bool, device="meta")
    a = weight.detach().abs()
    # NaN compares false with everything and would break the ranks (3 kept, or 1): rank it as +Inf
    a = torch.where(torch.isnan(a), torch.full_like(a, float("inf")), a)
    moved = a.movedim(dim, -1)
    groups = moved.reshape(*moved.shape[:-1], moved.shape[-1] // m, m)
    keep = group_keep_rank(groups) < n
    return keep.reshape(moved.shape).movedim(-1, dim)


def is_nm(mask: torch.Tensor, n: int = 2, m: int = 4, dim: int = -1, exact: bool = True) -> bool:
    """True when every group of ``m`` along ``dim`` holds exactly (or, exact=False, at most) ``n`` ones."""
    check_nm(n, m)
    check_has_values(mask, "mask", "is_nm")
    dim = normalize_dim(dim, mask.dim())
    if mask.shape[dim] % m != 0:
        return False
    moved = (mask != 0).movedim(dim, -1)
    counts = moved.reshape(*moved.shape[:-1], moved.shape[-1] // m, m).sum(-1)
    return bool((counts == n).all()) if exact else bool((counts <= n).all())


def kept_fraction(weight: torch.Tensor, mask: torch.Tensor) -> float:
    """sum |w| over kept entries / sum |w|. ``mask`` must have ``weight``'s shape (no broadcasting)."""
    check_float_tensor(weight, "weight")
    if not isinstance(mask, torch.Tensor) or mask.shape != weight.shape:
        got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a tensor of weight's shape {tuple(weight.shape)}, got {got}")
    a = weight.detach().abs().double()
    total = a.sum()
    if total == 0:
        raise ValueError("weight is all zeros: the kept fraction of |w| is undefined")
    return float((a * (mask != 0)).sum() / total)
