"""Kernel 4: MVUE 2:4, an unbiased random 2:4 sparsification with a counter-based RNG.

The idea
    Each group of 4 keeps 2 entries at random and rescales them so that ``E[MVUE(x)] = x``
    (``sparsity_lab.methods.mvue`` is the reference, its "exact" method). The inclusion
    probabilities that minimise the variance are ``p_i = min(1, c |x_i|)`` with ``sum p = 2``:

    * if ``2 max|x| <= sum|x|``: ``p_i = 2 |x_i| / sum|x|`` (nothing capped);
    * else the largest is kept surely (``p = 1``) and the other three share one draw:
      ``p_i = |x_i| / (sum|x| - max|x|)`` (these are always <= 1);
    * groups with fewer than 2 non-zeros are returned unchanged (every non-zero has ``p = 1``).

    Two indices are drawn by systematic sampling with one uniform ``u`` per group: entry i is kept
    when ``u`` or ``u + 1`` falls in ``[P_{i-1}, P_i)`` (``P`` the running sum of ``p``). That keeps
    every entry with probability exactly ``p_i`` and never picks one twice since every ``p_i <= 1``.
    Kept entries become ``x_i / p_i``.

    ``u`` comes from Philox (``tl.rand(seed, group_index)``): a counter-based generator, so the
    draw of a group depends only on the seed and the group's index. Same seed, same result, on any
    grid or block size; a new seed per training step gives independent draws.

Groups along any dimension
    x is viewed as (outer, L, inner) with the group dimension L (divisible by 4). ``inner == 1``
    (groups along the last dimension): a flat kernel loads 4 * BLOCK contiguous elements and
    splits them in registers. ``inner > 1`` (e.g. the token dimension of dZ (tokens, out), which is
    what the weight gradient ``MVUE(dZ^T) X`` needs): each program loads the 4 rows of a group
    as 4 contiguous vectors of BLOCK elements along ``inner``.

Bytes (x of dtype size s, numel n)
    read ``s * n``; write ``s * n``. The arithmetic (a division per kept value, a few compares) is
    far below the memory time.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import HALF_AND_FLOAT, check_device, check_tensor, contiguous, join4, split4

# groups per program (last-dim kernel) / columns per program (strided kernel): best measured on the H100
DEFAULT_BLOCK = 512
DEFAULT_WARPS = 8
DEFAULT_STRIDED_WARPS = 4
MAX_SEED = 2**31 - 1


@triton.jit
def _mvue_group(x0, x1, x2, x3, u):
    """MVUE of groups given as four float32 tensors and one uniform u per group.

    No division per element: p_i = c |x_i| with one c per group (2 / sum|x|, or 1 / (sum|x| - max|x|)
    after capping the largest at 1), so a kept uncapped entry is x_i / p_i = sign(x_i) / c.
    """
    a0 = tl.abs(x0)
    a1 = tl.abs(x1)
    a2 = tl.abs(x2)
    a3 = tl.abs(x3)
    total = a0 + a1 + a2 + a3
    top = tl.maximum(tl.maximum(a0, a1), tl.maximum(a2, a3))
    nonzero = (a0 > 0).to(tl.int32) + (a1 > 0).to(tl.int32) + (a2 > 0).to(tl.int32) + (a3 > 0).to(tl.int32)
    uncapped = 2.0 * top <= total
    # the capped entry (second case): the first index holding the maximum
    cap0 = (a0 == top) & (~uncapped)
    cap1 = (a1 == top) & (a0 != top) & (~uncapped)
    cap2 = (a2 == top) & (a0 != top) & (a1 != top) & (~uncapped)
    cap3 = (a3 == top) & (a0 != top) & (a1 != top) & (a2 != top) & (~uncapped)
    inv_c = tl.where(uncapped, 0.5 * total, total - top)  # the value every kept uncapped entry gets
    c = 1.0 / tl.where(inv_c > 0, inv_c, 1.0)
    p0 = tl.where(cap0, 1.0, a0 * c)
    p1 = tl.where(cap1, 1.0, a1 * c)
    p2 = tl.where(cap2, 1.0, a2 * c)
    p3 = tl.where(cap3, 1.0, a3 * c)
    # systematic sampling: entry i is picked when u or u + 1 lies in [c_{i-1}, c_i); the last
    # interval is closed at +inf so float rounding of the sum (~2) never drops a pick
    c0 = p0
    c1 = c0 + p1
    c2 = c1 + p2
    v = u + 1.0
    pick0 = ((u < c0) | (v < c0)) & (a0 > 0)
    pick1 = (((u >= c0) & (u < c1)) | ((v >= c0) & (v < c1))) & (a1 > 0)
    pick2 = (((u >= c1) & (u < c2)) | ((v >= c1) & (v < c2))) & (a2 > 0)
    pick3 = ((u >= c2) | (v >= c2)) & (a3 > 0)
    few = nonzero < 2  # fewer than 2 non-zeros: kept as they are (every non-zero has p = 1)
    y0 = tl.where(few | cap0, x0, tl.where(pick0, tl.where(x0 < 0, -inv_c, inv_c), 0.0))
    y1 = tl.where(few | cap1, x1, tl.where(pick1, tl.where(x1 < 0, -inv_c, inv_c), 0.0))
    y2 = tl.where(few | cap2, x2, tl.where(pick2, tl.where(x2 < 0, -inv_c, inv_c), 0.0))
    y3 = tl.where(few | cap3, x3, tl.where(pick3, tl.where(x3 < 0, -inv_c, inv_c), 0.0))
    return y0, y1, y2, y3


@triton.jit
def _mvue24_lastdim_kernel(x_ptr, out_ptr, n_groups, seed, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    groups = pid * BLOCK + tl.arange(0, BLOCK)
    elems = pid * BLOCK * 4 + tl.arange(0, BLOCK * 4)
    in_range = elems < n_groups * 4
    x = tl.load(x_ptr + elems, mask=in_range, other=0.0)
    x0, x1, x2, x3 = split4(x, BLOCK)
    u = tl.rand(seed, groups)
    y0, y1, y2, y3 = _mvue_group(x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32), x3.to(tl.float32), u)
    tl.store(out_ptr + elems, join4(y0, y1, y2, y3, BLOCK).to(out_ptr.dtype.element_ty), mask=in_range)


@triton.jit
def _mvue24_strided_kernel(x_ptr, out_ptr, n_group_rows, inner, seed, BLOCK: tl.constexpr):
    # program (g, j): group-row g (4 consecutive indices along the group dim), columns j*BLOCK..
    g = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inner
    base = g * 4 * inner + cols  # (outer, L, inner) flattened: group-row g starts at 4 g inner
    x0 = tl.load(x_ptr + base, mask=ok, other=0.0).to(tl.float32)
    x1 = tl.load(x_ptr + base + inner, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + 2 * inner, mask=ok, other=0.0).to(tl.float32)
    x3 = tl.load(x_ptr + base + 3 * inner, mask=ok, other=0.0).to(tl.float32)
    u = tl.rand(seed, g * inner + cols)  # group index: unique per (group-row, column)
    y0, y1, y2, y3 = _mvue_group(x0, x1, x2, x3, u)
    dt = out_ptr.dtype.element_ty
    tl.store(out_ptr + base, y0.to(dt), mask=ok)
    tl.store(out_ptr + base + inner, y1.to(dt), mask=ok)
    tl.store(out_ptr + base + 2 * inner, y2.to(dt), mask=ok)
    tl.store(out_ptr + base + 3 * inner, y3.to(dt), mask=ok)


def mvue24(x: torch.Tensor, dim: int = -1, seed: int = 0, block: int = DEFAULT_BLOCK,
           num_warps: int | None = None) -> torch.Tensor:
    """Unbiased 2:4 sparsification of ``x`` with groups of 4 along ``dim``.

    x: float16/bfloat16/float32, ``x.shape[dim] % 4 == 0`` (non-contiguous inputs are copied).
    seed: int in [0, 2**31 - 1]; the same seed gives the same result. num_warps: None picks 8 for
    groups along the last dim, 4 otherwise (16-byte accesses per thread). Returns a tensor like x
    (contiguous) with at most 2 non-zeros per group and ``E[result] = x``.
    """
    check_tensor(x, "x", HALF_AND_FLOAT)
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim={dim} is out of range for a {x.dim()}-D tensor")
    dim %= x.dim()
    if x.shape[dim] % 4:
        raise ValueError(f"x has size {x.shape[dim]} along dim {dim}, which is not divisible by 4 "
                         "(MVUE 2:4 needs groups of 4)")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be an int in [0, {MAX_SEED}], got {seed!r}")
    check_device(_mvue24_lastdim_kernel, x=x)
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 1, got {block}")
    x = contiguous(x)
    out = torch.empty_like(x)
    inner = 1
    for size in x.shape[dim + 1:]:
        inner *= size
    if inner == 1:
        n_groups = x.numel() // 4
        _mvue24_lastdim_kernel[(triton.cdiv(n_groups, block),)](x, out, n_groups, seed, BLOCK=block,
                                                                 num_warps=num_warps or DEFAULT_WARPS)
    else:
        n_group_rows = x.numel() // (4 * inner)
        grid = (n_group_rows, triton.cdiv(inner, block))
        _mvue24_strided_kernel[grid](x, out, n_group_rows, inner, seed, BLOCK=block,
                                     num_warps=num_warps or DEFAULT_STRIDED_WARPS)
    return out
