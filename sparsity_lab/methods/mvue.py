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
Groups with fewer than 2 non-zeros keep those exactly (p = 1); all-zero groups stay zero. Both
probability functions return the true inclusion probabilities of their sampler, so sum p = 2 in
every group (the leftover picks land on zeros).
"""
from __future__ import annotations

import torch

from ..validation import check_divisible, check_float_tensor, normalize_dim

_HUGE = 2.0 ** 1020  # a float64 group whose max exceeds this may have a sum of |x| beyond float64


def _scaled_magnitudes(groups: torch.Tensor) -> torch.Tensor:
    """float64 |x| per group, groups with a max above 2^1020 divided by 16: the inclusion
    probabilities are scale-invariant, and the sum of four such values would overflow (every p
    became 0 and the group was silently dropped). Scaling every group to its max instead would
    flush subnormal neighbours to zero; only the groups that need it are scaled."""
    a = groups.abs().double()
    return torch.where(a.amax(-1, keepdim=True) > _HUGE, a / 16, a)


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den where den > 0, else 0. Exact zero tests, no epsilon: gradients of 1e-35 are real
    values and must keep their exact inclusion probabilities (an epsilon clamp made them biased)."""
    positive = den > 0
    return torch.where(positive, num / torch.where(positive, den, torch.ones_like(den)), torch.zeros_like(num))


def _degenerate_probabilities(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For groups with fewer than 2 non-zeros: (mask of such groups, their inclusion probabilities).

    Non-zeros are kept (p = 1); the remaining picks fall uniformly on the zeros, which add nothing.
    That keeps sum p = 2 in every group, the inclusion probabilities of both samplers below.
    """
    nonzero = (a > 0).sum(-1, keepdim=True)
    few = nonzero < 2
    on_zeros = (2 - nonzero).double() / (4 - nonzero).double()
    return few, torch.where(a > 0, torch.ones_like(a), on_zeros)


def mvue_probabilities(groups: torch.Tensor) -> torch.Tensor:
    """Minimum-variance inclusion probabilities for groups (..., 4): p in [0, 1], sum 2.

    Minimising sum_i x_i^2 (1/p_i - 1) subject to sum p = 2, p <= 1 gives p_i = min(1, c |x_i|)
    (water-filling). Either nothing is capped (p = 2|x| / sum|x|), or only the largest is
    (p = 1 for it, |x_i| / (sum of the other three) for the rest, which are then all <= 1).
    Returns float64 (float32/16 inputs never underflow there; a float64 entry below ~1e-300 of its
    group's sum would get p = 0).
    """
    a = _scaled_magnitudes(groups)
    srt, order = torch.sort(a, dim=-1, descending=True, stable=True)
    total = srt.sum(-1, keepdim=True)
    rest = srt[..., 1:].sum(-1, keepdim=True)
    p_uncapped = _safe_div(2 * srt, total)
    p_capped = torch.cat([torch.ones_like(srt[..., :1]), _safe_div(srt[..., 1:], rest)], -1)
    # the largest is capped when 2 a_0 / total > 1, i.e. a_0 > the sum of the other three
    p_sorted = torch.where(srt[..., :1] > rest, p_capped, p_uncapped)
    few, p_few = _degenerate_probabilities(srt)
    p_sorted = torch.where(few, p_few, p_sorted)
    p = torch.empty_like(p_sorted)
    p.scatter_(-1, order, p_sorted)
    return p


def sequential_probabilities(groups: torch.Tensor) -> torch.Tensor:
    """Inclusion probabilities of "draw one by |x|, then one by |x| among the other three".

    p_i = q_i + sum_{j != i} q_j * a_i / (S - a_j), with q = a / S and S = sum a. S - a_j is summed
    from the other three entries (not computed as 1 - q_j, which cancels catastrophically when
    one entry dominates). Groups with fewer than 2 non-zeros: see the sampler (sum p = 2).
    Returns float64.
    """
    a = _scaled_magnitudes(groups)
    total = a.sum(-1, keepdim=True)
    q = _safe_div(a, total)
    eye = torch.eye(4, dtype=torch.bool, device=groups.device)
    # others[..., j] = sum of a over the entries other than j
    others = a.unsqueeze(-2).expand(*a.shape[:-1], 4, 4).masked_fill(eye, 0).sum(-1)
    second = q.unsqueeze(-1) * _safe_div(a.unsqueeze(-2), others.unsqueeze(-1))  # [j, i]
    p = q + second.masked_fill(eye, 0).sum(-2)
    few, p_few = _degenerate_probabilities(a)
    return torch.where(few, p_few, p).clamp(0.0, 1.0)


def _systematic_pick(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Bool keep mask of two entries per group; entry i is kept with probability p_i exactly.

    Entry i owns [lo_i, hi_i) with hi = cumsum p; it is picked if u or u + 1 falls in it. lo is
    the previous hi (not hi - p) so the intervals tile [0, 2) without rounding gaps, and the last
    hi is set to 2 so that u + 1 always lands somewhere.
    """
    hi = torch.cumsum(p, -1)
    hi = torch.cat([hi[..., :-1], torch.full_like(hi[..., -1:], 2.0)], -1)
    lo = torch.cat([torch.zeros_like(hi[..., :1]), hi[..., :-1]], -1)
    return ((lo <= u) & (u < hi)) | ((lo <= u + 1) & (u + 1 < hi))


def _sequential_pick(groups: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """Bool keep mask: one index drawn by |x|, a second by |x| among the other three (uniform
    over the zeros when no non-zero is left)."""
    a = _scaled_magnitudes(groups)
    # non-finite groups are passed through by the caller; keep multinomial's weights finite
    flat = torch.where(torch.isfinite(a), a, torch.ones_like(a)).reshape(-1, 4)
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
    which then skips the step); groups holding NaN/Inf are then passed through unchanged, so the
    overflow still reaches dW and the scaler sees it (dropping it would hide it).
    Range: a kept value becomes x_i / p_i, up to the sum of |x| over its group, which can overflow
    a finite float16 x (four entries of 4e4 give 8e4 > 65504). check=True raises a clear error
    then; check=False returns inf there, which a GradScaler sees as an overflow (step skipped).
    """
    if check:
        check_float_tensor(x, "x", allow_meta=True)
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
    scaled = torch.where(keep, _safe_div(groups.double(), p), torch.zeros_like(p))
    if not check:
        non_finite = ~torch.isfinite(groups).all(-1, keepdim=True)
        scaled = torch.where(non_finite, groups.double(), scaled)
    out = scaled.to(x.dtype)
    if check and not x.is_meta and not bool(torch.isfinite(out).all()):
        # a kept x_i / p_i can exceed the dtype's range (float16: 65504) although x is finite
        bad = int((~torch.isfinite(out)).any(-1).sum())
        raise ValueError(f"mvue24: the rescaled kept values x / p overflow {x.dtype} (largest finite "
                         f"{torch.finfo(x.dtype).max:.6g}) in {bad} group(s) of 4; {_wider_advice(x.dtype)}")
    return out.reshape(moved.shape).movedim(-1, dim)


def _wider_advice(dtype: torch.dtype) -> str:
    """What to do about an overflow of ``dtype``: a wider dtype where there is one, else a smaller x."""
    wider = {torch.float16: ("x.float()", "float32"), torch.bfloat16: ("x.float()", "float32"),
             torch.float32: ("x.double()", "float64")}.get(dtype)
    if wider is None:
        return "scale x down (no wider dtype holds it)"
    return f"pass {wider[0]} (the result is then {wider[1]}) or scale x down"


def top2_24(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Deterministic top-2 magnitude 2:4 pruning (biased): the baseline MVUE is compared with."""
    from ..masks.nm import nm_mask
    return x * nm_mask(x, 2, 4, dim)
