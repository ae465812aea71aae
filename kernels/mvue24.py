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

Why this arithmetic and this RNG
    The kernel must run at the copy rate: it reads and writes each element once and does nothing
    else to memory, so its instructions per group decide its speed. Two choices keep them few:
    the "water level" arithmetic (``_mvue_group_level``: no division, no cap flags, no non-zero
    count, and no ``total - top`` cancellation) and one Philox call for 4 groups (``tl.randint4x``:
    four 32-bit outputs, one uniform per group). Both were chosen on the H100 against the measured
    baselines kept in ``benchmarks/baselines/mvue24.py`` (``python -m benchmarks mvue_variants``;
    the figures are in docs/measuring.md and results/mvue_variants_h100.json).

    Where the four uniforms of one Philox call go ("a quad" of 4 groups): groups along the last
    dim, groups 4q .. 4q+3 (16 consecutive elements); other dims, the groups of 4 neighbouring
    columns. The quad's counter depends only on its position, so draws stay independent of the
    block size. 32 random bits become ``u = 1.f x 2^0 - 1`` (23 bits, ``u`` a multiple of 2^-23):
    every inclusion probability is realised to within about 2^-23.

    A layout constraint shapes the kernels: triton gives the Philox chain its default layout (one
    element per thread, round robin) and converts its four outputs through shared memory when the
    data has several quads per thread (it recomputes a single-output chain like ``tl.rand`` in the
    data's layout, not a four-output one). So every thread holds exactly one quad per repetition:
    last dim, two [QUADS, 8] loads (16 bytes each in bf16); other dims, 4 columns per thread
    (``block = 128 * num_warps``, 8-byte accesses in bf16). Other block sizes are correct, only
    slower. ``LAUNCH`` holds the launch constants that meet it.

Bytes (x of dtype size s, numel n)
    read ``s * n``; write ``s * n``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import HALF_AND_FLOAT, check_device, check_tensor, contiguous, join4, split4

MAX_SEED = 2**31 - 1

# Launch constants per group layout, (block, num_warps): block counts groups per program along the
# last dim (512 groups = 128 quads, one quad per thread with 4 warps) and columns per program along
# other dims (4 columns = one quad per thread with 4 warps). Chosen on the H100 (docs/measuring.md).
LAUNCH = {
    "last dim": (512, 4),
    "other dims": (512, 4),
}
DEFAULT_BLOCK = LAUNCH["last dim"][0]


@triton.jit
def _signed(magnitude, x):
    """magnitude (>= 0) with the sign of x."""
    return tl.where(x < 0, -magnitude, magnitude)


@triton.jit
def _mvue_level_picks(x0, x1, x2, x3, u):
    """The "water level" L of each group and which of its entries MVUE keeps (``_mvue_group_level`` says how):
    returns (level, pick0, pick1, pick2, pick3). At most two picks are set; a picked entry has |x_i| > 0."""
    a0 = tl.abs(x0)
    a1 = tl.abs(x1)
    a2 = tl.abs(x2)
    a3 = tl.abs(x3)
    hi01 = tl.maximum(a0, a1)
    hi23 = tl.maximum(a2, a3)
    top = tl.maximum(hi01, hi23)
    rest = (tl.minimum(a0, a1) + tl.minimum(a2, a3)) + tl.minimum(hi01, hi23)
    level = tl.where(top > rest, rest, 0.5 * (top + rest))
    level = tl.where(rest > 0, level, top)
    e0 = tl.minimum(a0, level)
    e1 = e0 + tl.minimum(a1, level)
    e2 = e1 + tl.minimum(a2, level)
    lo = u * level
    hi = lo + level
    # pointer p lands in entry i's interval [e_{i-1}, e_i) when p >= e_{i-1} and p < e_i. hi >= level >= e0
    # (lo >= 0), so hi is never in the first interval and "hi >= e0" needs no compare; "p >= e_{i-1}" is
    # "not p < e_{i-1}" (with a NaN p or e both forms end false: p < e_i is false too). Five compares for the first
    # three picks, not nine.
    lo_in0 = lo < e0
    lo_below1 = lo < e1
    hi_below1 = hi < e1
    lo_below2 = lo < e2
    hi_below2 = hi < e2
    pick0 = lo_in0
    pick1 = (lo_below1 & ~lo_in0) | hi_below1
    pick2 = (lo_below2 & ~lo_below1) | (hi_below2 & ~hi_below1)
    pick3 = (hi >= e2) & (a3 > 0)  # a zero entry's interval is empty (the last one is closed at +inf)
    return level, pick0, pick1, pick2, pick3


@triton.jit
def _mvue_group_level(x0, x1, x2, x3, u):
    """MVUE of groups through the "water level" L: p_i = min(1, |x_i| / L), no division.

    L is the level at which sum_i min(|x_i|, L) = 2 L (i.e. sum p = 2): with top the largest |x_i|
    and rest the sum of the other three, L = rest when top > rest (the largest is capped at p = 1,
    the reference's test), else L = (top + rest) / 2. A kept entry is x_i / p_i = sign(x_i) max(|x_i|, L).
    Systematic sampling in units of L: entry i owns [e_{i-1}, e_i) with e_i = sum_{j<=i} min(|x_j|, L)
    (length p_i L); the two pointers are u L and u L + L. The intervals partition [0, inf) (the
    last is closed at +inf), so each pointer picks exactly one entry: never more than 2 kept.
    rest is summed from the three smaller entries (no total - top cancellation). Groups with < 2
    non-zeros (rest == 0) use L = top: the non-zero, if any, owns [0, top) and is kept as it is.
    """
    level, pick0, pick1, pick2, pick3 = _mvue_level_picks(x0, x1, x2, x3, u)
    y0 = tl.where(pick0, _signed(tl.maximum(tl.abs(x0), level), x0), 0.0)
    y1 = tl.where(pick1, _signed(tl.maximum(tl.abs(x1), level), x1), 0.0)
    y2 = tl.where(pick2, _signed(tl.maximum(tl.abs(x2), level), x2), 0.0)
    y3 = tl.where(pick3, _signed(tl.maximum(tl.abs(x3), level), x3), 0.0)
    return y0, y1, y2, y3


@triton.jit
def _unit_float(bits):
    """32 random bits -> u in [0, 1), a multiple of 2^-23: the top 23 bits as the mantissa of a
    float in [1, 2), minus 1 (exact). Three integer/float instructions, no int -> float conversion."""
    one_point = (bits >> 9) | 0x3F800000
    return one_point.to(tl.float32, bitcast=True) - 1.0


@triton.jit
def _load_seed(seed, SEED_PTR: tl.constexpr):
    """The Philox seed: the int argument itself, or (SEED_PTR) the int64 it points to. A seed read
    from device memory lets a CUDA graph replay draw a new seed each step: the host writes the
    buffer before each replay, the captured kernel reads it."""
    if SEED_PTR:
        return tl.load(seed)
    else:
        return seed


@triton.jit
def _uniforms4(seed, counter):
    """Four uniforms per counter from one Philox call."""
    r0, r1, r2, r3 = tl.randint4x(seed, counter)
    return _unit_float(r0), _unit_float(r1), _unit_float(r2), _unit_float(r3)


@triton.jit
def _split_pair(a, QUADS: tl.constexpr):
    """[QUADS, 8] (two groups of 4 per row) -> member j of group h as x{j}{h}, each [QUADS]."""
    even, odd = tl.split(tl.reshape(a, [QUADS, 2, 2, 2]))  # [q, h, j // 2] for j even / odd
    m0, m2 = tl.split(even)
    m1, m3 = tl.split(odd)
    x00, x01 = tl.split(m0)
    x10, x11 = tl.split(m1)
    x20, x21 = tl.split(m2)
    x30, x31 = tl.split(m3)
    return x00, x01, x10, x11, x20, x21, x30, x31


@triton.jit
def _join_pair(y00, y01, y10, y11, y20, y21, y30, y31, QUADS: tl.constexpr):
    """Inverse of :func:`_split_pair`."""
    even = tl.join(tl.join(y00, y01), tl.join(y20, y21))
    odd = tl.join(tl.join(y10, y11), tl.join(y30, y31))
    return tl.reshape(tl.join(even, odd), [QUADS, 8])


@triton.jit
def _mvue24_lastdim_quads_kernel(x_ptr, out_ptr, n_groups, seed, QUADS: tl.constexpr, SEED_PTR: tl.constexpr = False):
    seed = _load_seed(seed, SEED_PTR)
    # a program: QUADS quads of 4 groups (16 elements); member j of group g of quad q at 16 q + 4 g + j.
    # Two [QUADS, 8] loads (groups 0-1 and 2-3 of each quad, 16 bytes each in bf16) keep a whole
    # quad in one thread, in the layout of the Philox outputs: no shuffle through shared memory.
    pid = tl.program_id(0)
    quads = pid * QUADS + tl.arange(0, QUADS)
    first = quads[:, None] * 16 + tl.arange(0, 8)[None, :]
    second = first + 8
    n = n_groups * 4
    a = tl.load(x_ptr + first, mask=first < n, other=0.0).to(tl.float32)
    b = tl.load(x_ptr + second, mask=second < n, other=0.0).to(tl.float32)
    x00, x01, x10, x11, x20, x21, x30, x31 = _split_pair(a, QUADS)  # x{j}{g}: member j of group g
    x02, x03, x12, x13, x22, x23, x32, x33 = _split_pair(b, QUADS)
    u0, u1, u2, u3 = _uniforms4(seed, quads)  # u_g for group 4 q + g
    y00, y10, y20, y30 = _mvue_group_level(x00, x10, x20, x30, u0)
    y01, y11, y21, y31 = _mvue_group_level(x01, x11, x21, x31, u1)
    y02, y12, y22, y32 = _mvue_group_level(x02, x12, x22, x32, u2)
    y03, y13, y23, y33 = _mvue_group_level(x03, x13, x23, x33, u3)
    dt = out_ptr.dtype.element_ty
    tl.store(out_ptr + first, _join_pair(y00, y01, y10, y11, y20, y21, y30, y31, QUADS).to(dt), mask=first < n)
    tl.store(out_ptr + second, _join_pair(y02, y03, y12, y13, y22, y23, y32, y33, QUADS).to(dt), mask=second < n)


@triton.jit
def _mvue24_strided_quads_kernel(x_ptr, out_ptr, inner, seed, BLOCK: tl.constexpr, SEED_PTR: tl.constexpr = False):
    seed = _load_seed(seed, SEED_PTR)
    # program (g, j): group-row g, columns j*BLOCK..; one Philox call per 4 neighbouring columns
    # (column 4 k + m takes the call's output m; quads counted over ceil(inner / 4) per group-row)
    g = tl.program_id(0)
    col0 = tl.program_id(1) * BLOCK
    cols = col0 + tl.arange(0, BLOCK)
    ok = cols < inner
    base = g * 4 * inner + cols
    x0 = tl.load(x_ptr + base, mask=ok, other=0.0).to(tl.float32)
    x1 = tl.load(x_ptr + base + inner, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + 2 * inner, mask=ok, other=0.0).to(tl.float32)
    x3 = tl.load(x_ptr + base + 3 * inner, mask=ok, other=0.0).to(tl.float32)
    quads = g * ((inner + 3) // 4) + col0 // 4 + tl.arange(0, BLOCK // 4)
    u0, u1, u2, u3 = _uniforms4(seed, quads)
    x00, x01, x02, x03 = split4(x0, BLOCK // 4)  # x{k}{m}: row k of the group-row, column 4 q + m
    x10, x11, x12, x13 = split4(x1, BLOCK // 4)
    x20, x21, x22, x23 = split4(x2, BLOCK // 4)
    x30, x31, x32, x33 = split4(x3, BLOCK // 4)
    y00, y10, y20, y30 = _mvue_group_level(x00, x10, x20, x30, u0)
    y01, y11, y21, y31 = _mvue_group_level(x01, x11, x21, x31, u1)
    y02, y12, y22, y32 = _mvue_group_level(x02, x12, x22, x32, u2)
    y03, y13, y23, y33 = _mvue_group_level(x03, x13, x23, x33, u3)
    dt = out_ptr.dtype.element_ty
    tl.store(out_ptr + base, join4(y00, y01, y02, y03, BLOCK // 4).to(dt), mask=ok)
    tl.store(out_ptr + base + inner, join4(y10, y11, y12, y13, BLOCK // 4).to(dt), mask=ok)
    tl.store(out_ptr + base + 2 * inner, join4(y20, y21, y22, y23, BLOCK // 4).to(dt), mask=ok)
    tl.store(out_ptr + base + 3 * inner, join4(y30, y31, y32, y33, BLOCK // 4).to(dt), mask=ok)


def group_layout(x: torch.Tensor, dim: int) -> int:
    """``inner``: the product of the sizes after ``dim`` (1 when the groups run along the last dim)."""
    inner = 1
    for size in x.shape[dim + 1:]:
        inner *= size
    return inner


def launch(x: torch.Tensor, out: torch.Tensor, inner: int, seed, block: int, num_warps: int | None) -> None:
    """The flat kernel for groups along the last dim (``inner == 1``, ``QUADS = block / 4``), else the
    strided one (a program per group-row and ``block`` columns); x, out contiguous, arguments checked."""
    seed_ptr = isinstance(seed, torch.Tensor)  # the seed is a device tensor that the kernel reads
    if inner == 1:
        n_groups = x.numel() // 4
        warps = num_warps or LAUNCH["last dim"][1]
        _mvue24_lastdim_quads_kernel[(triton.cdiv(n_groups, block),)](x, out, n_groups, seed, QUADS=block // 4,
                                                                     SEED_PTR=seed_ptr, num_warps=warps)
        return
    grid = (x.numel() // (4 * inner), triton.cdiv(inner, block))
    _mvue24_strided_quads_kernel[grid](x, out, inner, seed, BLOCK=block, SEED_PTR=seed_ptr,
                                       num_warps=num_warps or LAUNCH["other dims"][1])


def check_seed(seed, x: torch.Tensor) -> None:
    """seed: an int in [0, MAX_SEED], or a 0-d int64 tensor on x's device holding one (read by the
    kernel, for CUDA-graph replays; its value is not checked here: that would sync with the GPU)."""
    if isinstance(seed, torch.Tensor):
        if seed.dim() != 0 or seed.dtype != torch.int64 or seed.device != x.device:
            raise ValueError(f"a seed tensor must be a 0-d int64 tensor on {x.device}, got shape "
                             f"{tuple(seed.shape)}, {seed.dtype} on {seed.device}")
        return
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be an int in [0, {MAX_SEED}] (or a 0-d int64 device tensor), got {seed!r}")


def check_block(block: int) -> None:
    if block < 4 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 4 (one Philox call serves 4 groups), got {block}")


def checked(x: torch.Tensor, dim: int, seed, block: int) -> tuple[torch.Tensor, int]:
    """The argument checks of :func:`mvue24`; returns (contiguous x, dim in [0, x.dim()))."""
    check_tensor(x, "x", HALF_AND_FLOAT)
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim={dim} is out of range for a {x.dim()}-D tensor")
    dim %= x.dim()
    if x.shape[dim] % 4:
        raise ValueError(f"x has size {x.shape[dim]} along dim {dim}, which is not divisible by 4 "
                         "(MVUE 2:4 needs groups of 4)")
    check_seed(seed, x)
    check_device(_mvue24_lastdim_quads_kernel, x=x)
    check_block(block)
    return contiguous(x), dim


def mvue24(x: torch.Tensor, dim: int = -1, seed: int = 0, block: int | None = None,
           num_warps: int | None = None) -> torch.Tensor:
    """Unbiased 2:4 sparsification of ``x`` with groups of 4 along ``dim``.

    x: float16/bfloat16/float32, ``x.shape[dim] % 4 == 0`` (non-contiguous inputs are copied).
    seed: int in [0, 2**31 - 1]; the same seed gives the same result for any block. Or a 0-d int64
    tensor on x's device holding such an int (read on the device: CUDA-graph safe).
    block: groups per program (last dim) or columns per program (other dims), a power of two >= 4;
    None takes ``LAUNCH``'s. num_warps: None takes ``LAUNCH``'s.
    Returns a tensor like x (contiguous) with at most 2 non-zeros per group and ``E[result] = x``.
    """
    x, dim = checked(x, dim, seed, DEFAULT_BLOCK if block is None else block)
    inner = group_layout(x, dim)
    if block is None:
        block = LAUNCH["last dim" if inner == 1 else "other dims"][0]
    out = torch.empty_like(x)
    launch(x, out, inner, seed, block, num_warps)
    return out
