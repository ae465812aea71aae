"""MVUE 2:4: an unbiased random 2:4 sparsification of a gradient.

Each group of 4 keeps 2 entries at random and rescales them so that E[MVUE(x)] = x exactly.
Variance sum_i x_i^2 (1/p_i - 1) is minimised by inclusion probabilities p_i proportional to
|x_i|, capped at 1, summing to 2 ("exact" below). Kept entries become x_i / p_i.

* "exact": p from that water-filling; two indices drawn by systematic sampling (one uniform u,
  the picks are where the running sum of p crosses u and u + 1), which realises each p_i exactly
  and always picks 2 distinct entries since every p_i <= 1.
* "sequential": the cheaper scheme of the reference kernels: draw one index with probability
  q_i = |x_i| / sum|x|, then a second proportional to |x| among the other three; the matching
  inclusion probability is p_i = q_i + sum_{j != i} q_j q_i / (1 - q_j). Unbiased, a little more
  variance.
Groups with fewer than 2 non-zeros keep those exactly (p = 1); all-zero groups stay zero.
"""
from __future__ import annotations

import torch

from ..validation import check_divisible, check_float_tensor, normalize_dim

_EPS = 1e-30


def mvue_probabilities(groups: torch.Tensor) -> torch.Tensor:
    """Minimum-variance inclusion probabilities for groups (..., 4) of magnitudes: p in [0, 1], sum 2."""
    a = groups.abs().double()
    srt, order = torch.sort(a, dim=-1, descending=True, stable=True)
    total = srt.sum(-1, keepdim=True)
    # case 1: nothing capped; case 2: the largest capped at 1; case 3: the two largest at 1
    p1 = 2 * srt / total.clamp_min(_EPS)
    rest = srt[..., 1:].sum(-1, keepdim=True)
    p2 = torch.cat([torch.ones_like(srt[..., :1]), srt[..., 1:] / rest.clamp_min(_EPS)], -1)
    p3 = torch.cat([torch.ones_like(srt[..., :2]), torch.zeros_like(srt[..., 2:])], -1)
    cap1 = p1[..., :1] > 1
    cap2 = cap1 & (p2[..., 1:2] > 1) | (rest <= _EPS)
    p_sorted = torch.where(cap2, p3, torch.where(cap1, p2, p1))
    # an all-zero or single-non-zero group: spread the leftover mass over the zeros (they add 0)
    nonzero = (srt > 0).sum(-1, keepdim=True)
    few = nonzero < 2
    spread = torch.where(srt > 0, torch.ones_like(srt), (2 - nonzero).double() / (4 - nonzero).double())
    p_sorted = torch.where(few, spread, p_sorted)
    p = torch.empty_like(p_sorted)
    p.scatter_(-1, order, p_sorted)
    return p


def sequential_probabilities(groups: torch.Tensor) -> torch.Tensor:
    """Inclusion probabilities of "draw one by |x|, then one by |x| among the rest"."""
    a = groups.abs().double()
    q = a / a.sum(-1, keepdim=True).clamp_min(_EPS)
    second = (q.unsqueeze(-1) * q.unsqueeze(-2) / (1 - q.unsqueeze(-1)).clamp_min(_EPS))  # [j, i]
    eye = torch.eye(4, dtype=torch.bool, device=groups.device)
    p = q + second.masked_fill(eye, 0).sum(-2)
    return p.clamp_max(1.0)


def _systematic_pick(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Bool keep mask of two entries per group; entry i is kept with probability p_i exactly."""
    hi = torch.cumsum(p, -1)
    lo = hi - p
    # entry i is picked if u or u + 1 falls in [lo_i, hi_i)
    return ((lo <= u) & (u < hi)) | ((lo <= u + 1) & (u + 1 < hi))


def _sequential_pick(groups: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    a = groups.abs().double()
    flat = a.reshape(-1, 4)
    zero = flat.sum(-1) <= 0
    w1 = torch.where(zero.unsqueeze(-1), torch.ones_like(flat), flat)
    first = torch.multinomial(w1, 1, generator=gen)
    w2 = w1.scatter(-1, first, 0.0)
    w2 = torch.where(w2.sum(-1, keepdim=True) > 0, w2, torch.ones_like(w2).scatter(-1, first, 0.0))
    second = torch.multinomial(w2, 1, generator=gen)
    keep = torch.zeros_like(flat, dtype=torch.bool)
    keep.scatter_(-1, first, True)
    keep.scatter_(-1, second, True)
    return keep.reshape(groups.shape)


def mvue24(x: torch.Tensor, dim: int = -1, generator: torch.Generator | None = None,
           method: str = "exact", check: bool = True) -> torch.Tensor:
    """Unbiased 2:4 sparsification of x along ``dim`` (size divisible by 4).

    Returns a tensor like x with at most 2 non-zeros in every group of 4 along ``dim`` and
    E[result] = x. ``generator`` makes draws reproducible (it must live on x's device).
    check=False skips the NaN/Inf scan (a gradient may legitimately overflow under a GradScaler,
    which then skips the step).
    """
    if check:
        check_float_tensor(x, "x")
    dim = normalize_dim(dim, x.dim())
    check_divisible(x.shape[dim], 4, "x", dim)
    if method not in ("exact", "sequential"):
        raise ValueError(f"method must be 'exact' or 'sequential', got {method!r}")
    moved = x.movedim(dim, -1)
    groups = moved.reshape(*moved.shape[:-1], moved.shape[-1] // 4, 4)
    if method == "exact":
        p = mvue_probabilities(groups)
        u = torch.rand(groups.shape[:-1] + (1,), generator=generator, device=x.device, dtype=torch.float64)
        keep = _systematic_pick(p, u)
    else:
        p = sequential_probabilities(groups)
        keep = _sequential_pick(groups, generator)
    scaled = torch.where(keep & (p > 0), groups.double() / p.clamp_min(_EPS), torch.zeros_like(p))
    return scaled.to(x.dtype).reshape(moved.shape).movedim(-1, dim)


def top2_24(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Deterministic top-2 magnitude 2:4 pruning (biased): the baseline MVUE is compared with."""
    from ..masks.nm import nm_mask
    return x * nm_mask(x, 2, 4, dim)
