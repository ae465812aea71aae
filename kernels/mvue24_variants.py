"""BASELINES, not shipped: the measured MVUE 2:4 variants other than the philox4 ones.

``kernels/mvue24.py`` is the shipped kernel (``level_philox4``) and explains every variant; the
kernels here were measured against it (results/mvue_variants_h100.json, kernels/NOTES.md) and are
kept as the baselines of that measurement, reachable through ``mvue24(x, variant=...)``:

    v2, level               one ``tl.rand`` uniform per group (``_uniform``): the flat last-dim
                            kernel and the strided kernel, with v2's or the level arithmetic
    level_philox4_tile16    other dims: tiles of 4 group-rows (16 rows) x BLOCK columns, one
                            column per thread; along the last dim it is ``level_philox4``

Importing this module adds their launchers to ``mvue24.LAUNCHERS`` (the package does it).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._common import MAX_NUMEL, join4, split4
from .mvue24 import DEFAULT_STRIDED_WARPS, LAUNCHERS, _load_seed, _mvue, _mvue_group_level, _uniforms4, launch_pair


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


def _launch_tile16(x: torch.Tensor, out: torch.Tensor, inner: int, seed, block: int, num_warps: int | None,
                   constant_u: bool) -> None:
    """Variant "level_philox4_tile16": the tile kernel for other dims, level_philox4 along the last dim."""
    if inner == 1:
        LAUNCHERS["level_philox4"](x, out, inner, seed, block, num_warps, constant_u)
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


_ONE_UNIFORM = (_mvue24_lastdim_kernel, _mvue24_strided_kernel, False)  # variants "v2" and "level"
LAUNCHERS.update({
    "v2": functools.partial(launch_pair, *_ONE_UNIFORM, level=False),
    "level": functools.partial(launch_pair, *_ONE_UNIFORM, level=True),
    "level_philox4_tile16": _launch_tile16,
})
