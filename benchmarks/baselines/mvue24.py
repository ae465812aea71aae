"""BASELINES, not shipped: the MVUE 2:4 variants measured against the shipped kernel.

``sparsity_lab.kernels.mvue24`` ships one kernel ("level_philox4": the water-level arithmetic, one
Philox call per 4 groups). It was chosen on the H100 against the variants here
(``python -m benchmarks mvue_variants``; figures in docs/measuring.md, results/mvue_variants_h100.json),
which are kept as that measurement's baselines and reached through :func:`mvue24` with ``variant=``
("level_philox4" runs the shipped kernel itself). The two ``v2`` variants warn when selected: they
compute "the other three" as ``total - top`` in float32, which cancels (a group [1, 1e-10, 0, 0]
never keeps its 1e-10, although p = 1), and on the H100 ``v2`` kept 3 entries in some group of a
128 MiB tensor.

v2 is not memory-bound: its SASS (sm_90, compiled offline by triton 3.9) issues about 200
instructions per group, 50 per element: one Philox call per group (10 rounds of 2 IMAD.HI + 2 IMAD
+ 2 LOP3: ~64 instructions) plus ~136 for the probabilities (a full-precision division), the picks,
predicate juggling and the bf16 conversions. At 132 SMs x 4 schedulers x 32 lanes x ~1.75 GHz the
issue time of 16.8 M groups exceeds the memory floor (docs/measuring.md). The variants cut
instructions per group (offline sm_90 SASS counts, bf16, benchmark configurations):

==========================  ========  ========  ===============================================
variant                     last dim  other     what changes
==========================  ========  ========  ===============================================
``v2``                      200       198       (``_mvue_group``, ``tl.rand`` per group)
``v2_philox4``              192       184       one Philox call for 4 groups (4 x 32 bits)
``level``                   144       138       ``_mvue_group_level``: no division, no cap
                                                flags, no non-zero count; v2's uniforms, so
                                                v2's draws up to rounding at interval ends
``level_philox4``           102       100       both (the shipped kernel)
``level_philox4_tile16``    102       120       other dims: tiles of 4 group-rows (16 rows) x
                                                BLOCK columns, one column per thread, the 4
                                                uniforms of one Philox call to the 4 group-rows
==========================  ========  ========  ===============================================

Without any RNG (``u = 0.5``, :func:`mvue24_constant_u_for_timing`, a timing diagnostic only) the
level arithmetic and the memory instructions are ~80 per group, v2's ~130.

Kernels here: the one-uniform-per-group kernels (``v2``, ``level``), the quad kernels with either
arithmetic and an optional constant u (``v2_philox4``; every philox4 variant's diagnostic) and the
``tile16`` kernel. They import the shipped kernel's helpers; the library never imports them.
"""
from __future__ import annotations

import functools
import warnings
from typing import Callable

import torch
import triton
import triton.language as tl

from sparsity_lab.kernels._common import HALF_AND_FLOAT, MAX_NUMEL, check_device, check_tensor, contiguous, join4, split4
from sparsity_lab.kernels.mvue24 import (LAUNCH, _join_pair, _load_seed, _mvue_group_level, _split_pair, _unit_float,
                                         check_seed, group_layout)
from sparsity_lab.kernels.mvue24 import launch as launch_shipped

from .mvue24_v2 import _mvue_group

VARIANTS = ("v2", "v2_philox4", "level", "level_philox4", "level_philox4_tile16")
SHIPPED_VARIANT = "level_philox4"
BASELINE_VARIANTS = ("v2", "v2_philox4")  # known wrong: the measurement's baseline only
DEFAULT_BLOCK = 512
DEFAULT_WARPS = 8  # the one-uniform last-dim kernel (2 groups per thread)
DEFAULT_STRIDED_WARPS = LAUNCH["other dims"][1]
DEFAULT_QUAD_WARPS = LAUNCH["last dim"][1]


@triton.jit
def _mvue(x0, x1, x2, x3, u, LEVEL: tl.constexpr):
    """Either group arithmetic on float32 inputs (LEVEL picks ``_mvue_group_level``, else v2's)."""
    if LEVEL:
        y0, y1, y2, y3 = _mvue_group_level(x0, x1, x2, x3, u)
    else:
        y0, y1, y2, y3 = _mvue_group(x0, x1, x2, x3, u)
    return y0, y1, y2, y3


@triton.jit
def _uniforms4(seed, counter, CONSTANT_U: tl.constexpr):
    """Four uniforms per counter from one Philox call (CONSTANT_U: all 0.5, a timing diagnostic)."""
    if CONSTANT_U:
        u0 = tl.full(counter.shape, 0.5, tl.float32)
        u1 = u0
        u2 = u0
        u3 = u0
    else:
        r0, r1, r2, r3 = tl.randint4x(seed, counter)
        u0 = _unit_float(r0)
        u1 = _unit_float(r1)
        u2 = _unit_float(r2)
        u3 = _unit_float(r3)
    return u0, u1, u2, u3


@triton.jit
def _mvue24_lastdim_quads_kernel(x_ptr, out_ptr, n_groups, seed, QUADS: tl.constexpr, LEVEL: tl.constexpr,
                                 CONSTANT_U: tl.constexpr, SEED_PTR: tl.constexpr = False):
    """The shipped last-dim kernel with either arithmetic and an optional constant u."""
    seed = _load_seed(seed, SEED_PTR)
    pid = tl.program_id(0)
    quads = pid * QUADS + tl.arange(0, QUADS)
    first = quads[:, None] * 16 + tl.arange(0, 8)[None, :]
    second = first + 8
    n = n_groups * 4
    a = tl.load(x_ptr + first, mask=first < n, other=0.0).to(tl.float32)
    b = tl.load(x_ptr + second, mask=second < n, other=0.0).to(tl.float32)
    x00, x01, x10, x11, x20, x21, x30, x31 = _split_pair(a, QUADS)
    x02, x03, x12, x13, x22, x23, x32, x33 = _split_pair(b, QUADS)
    u0, u1, u2, u3 = _uniforms4(seed, quads, CONSTANT_U)
    y00, y10, y20, y30 = _mvue(x00, x10, x20, x30, u0, LEVEL)
    y01, y11, y21, y31 = _mvue(x01, x11, x21, x31, u1, LEVEL)
    y02, y12, y22, y32 = _mvue(x02, x12, x22, x32, u2, LEVEL)
    y03, y13, y23, y33 = _mvue(x03, x13, x23, x33, u3, LEVEL)
    dt = out_ptr.dtype.element_ty
    tl.store(out_ptr + first, _join_pair(y00, y01, y10, y11, y20, y21, y30, y31, QUADS).to(dt), mask=first < n)
    tl.store(out_ptr + second, _join_pair(y02, y03, y12, y13, y22, y23, y32, y33, QUADS).to(dt), mask=second < n)


@triton.jit
def _mvue24_strided_quads_kernel(x_ptr, out_ptr, inner, seed, BLOCK: tl.constexpr, LEVEL: tl.constexpr,
                                 CONSTANT_U: tl.constexpr, SEED_PTR: tl.constexpr = False):
    """The shipped other-dims kernel with either arithmetic and an optional constant u."""
    seed = _load_seed(seed, SEED_PTR)
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
    u0, u1, u2, u3 = _uniforms4(seed, quads, CONSTANT_U)
    x00, x01, x02, x03 = split4(x0, BLOCK // 4)
    x10, x11, x12, x13 = split4(x1, BLOCK // 4)
    x20, x21, x22, x23 = split4(x2, BLOCK // 4)
    x30, x31, x32, x33 = split4(x3, BLOCK // 4)
    y00, y10, y20, y30 = _mvue(x00, x10, x20, x30, u0, LEVEL)
    y01, y11, y21, y31 = _mvue(x01, x11, x21, x31, u1, LEVEL)
    y02, y12, y22, y32 = _mvue(x02, x12, x22, x32, u2, LEVEL)
    y03, y13, y23, y33 = _mvue(x03, x13, x23, x33, u3, LEVEL)
    dt = out_ptr.dtype.element_ty
    tl.store(out_ptr + base, join4(y00, y01, y02, y03, BLOCK // 4).to(dt), mask=ok)
    tl.store(out_ptr + base + inner, join4(y10, y11, y12, y13, BLOCK // 4).to(dt), mask=ok)
    tl.store(out_ptr + base + 2 * inner, join4(y20, y21, y22, y23, BLOCK // 4).to(dt), mask=ok)
    tl.store(out_ptr + base + 3 * inner, join4(y30, y31, y32, y33, BLOCK // 4).to(dt), mask=ok)


@triton.jit
def _uniform(seed, counter, CONSTANT_U: tl.constexpr):
    """v2's uniform per group: tl.rand (CONSTANT_U: 0.5, a timing diagnostic without the RNG)."""
    if CONSTANT_U:
        u = tl.full(counter.shape, 0.5, tl.float32)
    else:
        u = tl.rand(seed, counter)
    return u


@triton.jit
def _mvue24_lastdim_kernel(x_ptr, out_ptr, n_groups, seed, BLOCK: tl.constexpr, LEVEL: tl.constexpr,
                           CONSTANT_U: tl.constexpr, SEED_PTR: tl.constexpr = False):
    seed = _load_seed(seed, SEED_PTR)
    pid = tl.program_id(0)
    groups = pid * BLOCK + tl.arange(0, BLOCK)
    elems = pid * BLOCK * 4 + tl.arange(0, BLOCK * 4)
    in_range = elems < n_groups * 4
    x = tl.load(x_ptr + elems, mask=in_range, other=0.0)
    x0, x1, x2, x3 = split4(x, BLOCK)
    u = _uniform(seed, groups, CONSTANT_U)
    y0, y1, y2, y3 = _mvue(x0.to(tl.float32), x1.to(tl.float32), x2.to(tl.float32), x3.to(tl.float32), u, LEVEL)
    tl.store(out_ptr + elems, join4(y0, y1, y2, y3, BLOCK).to(out_ptr.dtype.element_ty), mask=in_range)


@triton.jit
def _mvue24_strided_kernel(x_ptr, out_ptr, inner, seed, BLOCK: tl.constexpr, LEVEL: tl.constexpr,
                           CONSTANT_U: tl.constexpr, SEED_PTR: tl.constexpr = False):
    seed = _load_seed(seed, SEED_PTR)
    # program (g, j): group-row g (4 consecutive indices along the group dim), columns j*BLOCK..
    g = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inner
    base = g * 4 * inner + cols  # (outer, L, inner) flattened: group-row g starts at 4 g inner
    x0 = tl.load(x_ptr + base, mask=ok, other=0.0).to(tl.float32)
    x1 = tl.load(x_ptr + base + inner, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + 2 * inner, mask=ok, other=0.0).to(tl.float32)
    x3 = tl.load(x_ptr + base + 3 * inner, mask=ok, other=0.0).to(tl.float32)
    u = _uniform(seed, g * inner + cols, CONSTANT_U)  # group index: unique per (group-row, column)
    y0, y1, y2, y3 = _mvue(x0, x1, x2, x3, u, LEVEL)
    dt = out_ptr.dtype.element_ty
    tl.store(out_ptr + base, y0.to(dt), mask=ok)
    tl.store(out_ptr + base + inner, y1.to(dt), mask=ok)
    tl.store(out_ptr + base + 2 * inner, y2.to(dt), mask=ok)
    tl.store(out_ptr + base + 3 * inner, y3.to(dt), mask=ok)


@triton.jit
def _load_group_row(x_ptr, base, inner, ok):
    """The 4 rows of one group-row at ``base`` (its first row), as float32."""
    x0 = tl.load(x_ptr + base, mask=ok, other=0.0).to(tl.float32)
    x1 = tl.load(x_ptr + base + inner, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + 2 * inner, mask=ok, other=0.0).to(tl.float32)
    x3 = tl.load(x_ptr + base + 3 * inner, mask=ok, other=0.0).to(tl.float32)
    return x0, x1, x2, x3


@triton.jit
def _store_group_row(out_ptr, base, inner, ok, y0, y1, y2, y3):
    dt = out_ptr.dtype.element_ty
    tl.store(out_ptr + base, y0.to(dt), mask=ok)
    tl.store(out_ptr + base + inner, y1.to(dt), mask=ok)
    tl.store(out_ptr + base + 2 * inner, y2.to(dt), mask=ok)
    tl.store(out_ptr + base + 3 * inner, y3.to(dt), mask=ok)


@triton.jit
def _mvue24_strided_tile16_kernel(x_ptr, out_ptr, n_group_rows, inner, seed, BLOCK: tl.constexpr,
                                  CONSTANT_U: tl.constexpr, SEED_PTR: tl.constexpr = False):
    seed = _load_seed(seed, SEED_PTR)
    # program (t, j): group-rows 4 t .. 4 t + 3 (16 rows), columns j*BLOCK..; one Philox call per
    # column gives the 4 group-rows' uniforms. All 16 rows are loaded before any store (the
    # compiler may not move a load above a store to a possibly aliasing pointer).
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_cols = cols < inner
    b0 = 16 * t * inner + cols  # first row of group-row 4 t + i: b_i
    b1 = b0 + 4 * inner
    b2 = b1 + 4 * inner
    b3 = b2 + 4 * inner
    # a group-row exists iff its first row's index is inside the tensor (cols < inner)
    n_elems = n_group_rows * 4 * inner
    ok0 = in_cols & (b0 < n_elems)
    ok1 = in_cols & (b1 < n_elems)
    ok2 = in_cols & (b2 < n_elems)
    ok3 = in_cols & (b3 < n_elems)
    x00, x01, x02, x03 = _load_group_row(x_ptr, b0, inner, ok0)  # x{i}{k}: row k of group-row 4 t + i
    x10, x11, x12, x13 = _load_group_row(x_ptr, b1, inner, ok1)
    x20, x21, x22, x23 = _load_group_row(x_ptr, b2, inner, ok2)
    x30, x31, x32, x33 = _load_group_row(x_ptr, b3, inner, ok3)
    u0, u1, u2, u3 = _uniforms4(seed, t * inner + cols, CONSTANT_U)
    y00, y01, y02, y03 = _mvue_group_level(x00, x01, x02, x03, u0)
    y10, y11, y12, y13 = _mvue_group_level(x10, x11, x12, x13, u1)
    y20, y21, y22, y23 = _mvue_group_level(x20, x21, x22, x23, u2)
    y30, y31, y32, y33 = _mvue_group_level(x30, x31, x32, x33, u3)
    _store_group_row(out_ptr, b0, inner, ok0, y00, y01, y02, y03)
    _store_group_row(out_ptr, b1, inner, ok1, y10, y11, y12, y13)
    _store_group_row(out_ptr, b2, inner, ok2, y20, y21, y22, y23)
    _store_group_row(out_ptr, b3, inner, ok3, y30, y31, y32, y33)


def launch_pair(lastdim_kernel, strided_kernel, quads: bool, x: torch.Tensor, out: torch.Tensor, inner: int, seed,
                block: int, num_warps: int | None, constant_u: bool, level: bool) -> None:
    """A variant's two kernels: the flat one for groups along the last dim (``inner == 1``), else the
    strided one (a program per group-row and BLOCK columns). quads: the flat kernel holds whole quads
    of groups (``QUADS = block / 4``, the philox4 variants)."""
    # SEED_PTR: the seed is a device tensor that the kernel reads
    flags = dict(LEVEL=level, CONSTANT_U=constant_u, SEED_PTR=isinstance(seed, torch.Tensor))
    if inner == 1:
        n_groups = x.numel() // 4
        size = dict(QUADS=block // 4) if quads else dict(BLOCK=block)
        warps = num_warps or (DEFAULT_QUAD_WARPS if quads else DEFAULT_WARPS)
        lastdim_kernel[(triton.cdiv(n_groups, block),)](x, out, n_groups, seed, **size, **flags, num_warps=warps)
        return
    grid = (x.numel() // (4 * inner), triton.cdiv(inner, block))
    strided_kernel[grid](x, out, inner, seed, BLOCK=block, **flags, num_warps=num_warps or DEFAULT_STRIDED_WARPS)


_PHILOX4 = (_mvue24_lastdim_quads_kernel, _mvue24_strided_quads_kernel, True)
_ONE_UNIFORM = (_mvue24_lastdim_kernel, _mvue24_strided_kernel, False)  # variants "v2" and "level"


def _launch_shipped(x, out, inner, seed, block, num_warps, constant_u) -> None:
    """"level_philox4": the shipped kernel itself; with a constant u, the same arithmetic here."""
    if constant_u:
        launch_pair(*_PHILOX4, x, out, inner, seed, block, num_warps, True, level=True)
    else:
        launch_shipped(x, out, inner, seed, block, num_warps)


def _launch_tile16(x: torch.Tensor, out: torch.Tensor, inner: int, seed, block: int, num_warps: int | None,
                   constant_u: bool) -> None:
    """Variant "level_philox4_tile16": the tile kernel for other dims, level_philox4 along the last dim."""
    if inner == 1:
        _launch_shipped(x, out, inner, seed, block, num_warps, constant_u)
        return
    # the last tile's row offsets run up to 12 rows past the end: keep them inside int32
    if x.numel() + 12 * inner > MAX_NUMEL:
        raise ValueError(f"x has {x.numel()} elements; variant 'level_philox4_tile16' needs numel + 12 * "
                         f"{inner} <= {MAX_NUMEL} (int32 offsets)")
    n_group_rows = x.numel() // (4 * inner)
    grid = (triton.cdiv(n_group_rows, 4), triton.cdiv(inner, block))
    _mvue24_strided_tile16_kernel[grid](x, out, n_group_rows, inner, seed, BLOCK=block, CONSTANT_U=constant_u,
                                        SEED_PTR=isinstance(seed, torch.Tensor),
                                        num_warps=num_warps or DEFAULT_STRIDED_WARPS)


# variant -> launch(x, out, inner, seed, block, num_warps, constant_u)
LAUNCHERS: dict[str, Callable] = {
    "v2": functools.partial(launch_pair, *_ONE_UNIFORM, level=False),
    "level": functools.partial(launch_pair, *_ONE_UNIFORM, level=True),
    "v2_philox4": functools.partial(launch_pair, *_PHILOX4, level=False),
    "level_philox4": _launch_shipped,
    "level_philox4_tile16": _launch_tile16,
}


def _check_variant(variant: str, block: int) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if variant in BASELINE_VARIANTS:
        warnings.warn(f"MVUE variant {variant!r} is a measurement baseline with known errors (float32 "
                      f"cancellation; it kept 3 of 4 on the H100); use {SHIPPED_VARIANT!r}", stacklevel=3)
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 1, got {block}")
    if "philox4" in variant and block < 4:
        raise ValueError(f"block must be >= 4 for variant {variant!r} (one Philox call serves 4 groups), got {block}")


def _checked(x: torch.Tensor, dim: int, seed, block: int, variant: str) -> tuple[torch.Tensor, int]:
    """The shipped kernel's argument checks, with the variant's block rule."""
    check_tensor(x, "x", HALF_AND_FLOAT)
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim={dim} is out of range for a {x.dim()}-D tensor")
    dim %= x.dim()
    if x.shape[dim] % 4:
        raise ValueError(f"x has size {x.shape[dim]} along dim {dim}, which is not divisible by 4 "
                         "(MVUE 2:4 needs groups of 4)")
    check_seed(seed, x)
    check_device(_mvue24_lastdim_kernel, x=x)
    _check_variant(variant, block)
    return contiguous(x), dim


def _launch(x, dim, seed, block, num_warps, variant, constant_u=False) -> torch.Tensor:
    out = torch.empty_like(x)
    LAUNCHERS[variant](x, out, group_layout(x, dim), seed, block, num_warps, constant_u)
    return out


def mvue24(x: torch.Tensor, dim: int = -1, seed: int = 0, block: int = DEFAULT_BLOCK,
           num_warps: int | None = None, variant: str = SHIPPED_VARIANT) -> torch.Tensor:
    """MVUE 2:4 of ``x`` (groups of 4 along ``dim``) by ``variant``, one of ``VARIANTS``. Arguments as
    the shipped ``sparsity_lab.kernels.mvue24.mvue24`` (block: a power of two, >= 4 for the philox4
    variants; num_warps None: 8 for the one-uniform last-dim kernel, 4 otherwise). "level_philox4"
    runs the shipped kernel."""
    x, dim = _checked(x, dim, seed, block, variant)
    return _launch(x, dim, seed, block, num_warps, variant)


def mvue24_constant_u_for_timing(x: torch.Tensor, dim: int = -1, block: int = DEFAULT_BLOCK,
                                 num_warps: int | None = None, variant: str = SHIPPED_VARIANT) -> torch.Tensor:
    """NOT an MVUE: ``variant`` with every uniform replaced by 0.5 (deterministic picks, biased).

    A timing diagnostic only (benchmarks.mvue_variants): the gap between this and :func:`mvue24`
    with the same variant is what the random numbers cost.
    """
    x, dim = _checked(x, dim, 0, block, variant)
    return _launch(x, dim, 0, block, num_warps, variant, constant_u=True)
