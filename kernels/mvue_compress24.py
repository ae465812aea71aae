"""Kernels 10 and 19: MVUE 2:4 of the output gradient along the tokens, written straight into cuSPARSELt's
layout (kernel 19: cast to FP8 on the way).

The idea
    The sparse weight gradient is ``dW = MVUE(dZ^T) X`` with ``A = MVUE(dZ^T)`` (out, tokens) the
    compressed operand. Two kernels (``mvue24(dZ, dim=0)`` then ``compress24`` of its transposed view)
    write the dense MVUE(dZ) and read it back: for 16384 tokens x 16384 outputs that is 1 GiB of
    traffic on top of the one read of dZ. Here one program loads 64 output columns x 4*BLOCK_G tokens
    of dZ, draws exactly what ``mvue24(dZ, dim=0, seed)`` (kernel 4) draws (same
    counters, same Philox outputs, same "level" arithmetic, same rounding to dZ's dtype) and writes
    the kept values and metadata as ``compress24`` would: the bytes are identical to the two-kernel
    path (tested), the dense MVUE(dZ) never exists.

    RNG bookkeeping: ``mvue24``'s strided kernel takes one Philox call per 4 neighbouring columns of
    dZ (counter ``g * ceil(N / 4) + n // 4`` for token group g and column n, output ``n % 4``); here
    a tile's 64 columns are 16 such quads, so the program makes one call per (quad, token group) and
    spreads the four outputs over the columns with a join / permute / reshape.

    Kernel 19 (``mvue_compress24_fp8``) is the same program for the FP8 backend's weight gradient: the
    drawn values, rounded to dZ's dtype as ``mvue24`` stores them, are cast to E4M3 with the given
    scale before the compressed store, and each program writes the amax of its values for the scaling
    recipe. Unfused that is three kernels (MVUE, cast, compress) and two round trips of the dense
    MVUE(dZ) and q through memory. ``mvue24_amax`` is the same draw writing only the amax (current
    scaling needs it before the cast).

Bytes (dZ of T x N, element size s)
    read ``s T N``; write ``s T N / 2`` (values) + ``T N / 8`` (metadata). FP8: write ``T N / 2 + T N / 8``.
    Unfused FP8 (bfloat16 dZ): ``4 T N`` (MVUE) + ``3 T N`` (cast) + ``1.625 T N`` (compress) = 8.6 T N
    bytes against 2.6 T N here.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_device, check_tensor
from .compress24 import _pick, _store_compressed
from .fp8_cast import check_fp8_device
from .mvue24 import _load_seed, _mvue_group_level, _mvue_level_picks, _signed, _unit_float, check_seed
from .prepare24 import _fp8_bits, _groups_amax


@triton.jit
def _mvue_tokens_inputs(dz_ptr, row0, g0, n_tokens, n_cols, quads_per_row, seed, BLOCK_G: tl.constexpr,
                        EDGES: tl.constexpr = False):
    """The float32 inputs of the tile's groups and their uniforms: (x0, x1, x2, x3, u), each (64, BLOCK_G),
    x{j}[i, b] = dZ[4 (g0 + b) + j, row0 + i]. EDGES: entries past n_tokens or n_cols are read as zeros (their
    groups stay zero); without it the tile must lie inside dZ."""
    n = row0 + tl.arange(0, 64)[:, None]
    g = g0 + tl.arange(0, BLOCK_G)[None, :]
    base = dz_ptr + (4 * g) * n_cols + n  # dZ[4g + j, n]: contiguous along n
    if EDGES:
        t = 4 * g
        x0 = tl.load(base, mask=(n < n_cols) & (t < n_tokens), other=0.0).to(tl.float32)
        x1 = tl.load(base + n_cols, mask=(n < n_cols) & (t + 1 < n_tokens), other=0.0).to(tl.float32)
        x2 = tl.load(base + 2 * n_cols, mask=(n < n_cols) & (t + 2 < n_tokens), other=0.0).to(tl.float32)
        x3 = tl.load(base + 3 * n_cols, mask=(n < n_cols) & (t + 3 < n_tokens), other=0.0).to(tl.float32)
    else:
        x0 = tl.load(base).to(tl.float32)
        x1 = tl.load(base + n_cols).to(tl.float32)
        x2 = tl.load(base + 2 * n_cols).to(tl.float32)
        x3 = tl.load(base + 3 * n_cols).to(tl.float32)
    return x0, x1, x2, x3, _mvue_tokens_uniforms(row0, g0, quads_per_row, seed, BLOCK_G)


@triton.jit
def _mvue_tokens_uniforms(row0, g0, quads_per_row, seed, BLOCK_G: tl.constexpr):
    """The uniform u[i, b] of token group g0 + b of column row0 + i of dZ, (64, BLOCK_G): one Philox call per
    (quad of columns, token group), as mvue24's strided quads kernel makes them."""
    g = g0 + tl.arange(0, BLOCK_G)[None, :]
    quads = g * quads_per_row + (row0 // 4 + tl.arange(0, 16)[:, None])  # (16, BLOCK_G)
    r0, r1, r2, r3 = tl.randint4x(seed, quads)
    u4 = tl.join(tl.join(_unit_float(r0), _unit_float(r2)), tl.join(_unit_float(r1), _unit_float(r3)))
    return tl.reshape(tl.permute(tl.reshape(u4, [16, BLOCK_G, 4]), (0, 2, 1)), [64, BLOCK_G])  # column 4q + m


@triton.jit
def _mvue_tokens_tile(dz_ptr, row0, g0, n_tokens, n_cols, quads_per_row, seed, BLOCK_G: tl.constexpr,
                      EDGES: tl.constexpr = False):
    """MVUE(dZ) of columns row0 .. row0 + 63 of dZ (tokens, n_cols) and token groups g0 .. g0 + BLOCK_G - 1,
    rounded to dZ's dtype as ``mvue24(dz, dim=0, seed)`` stores it: four (64, BLOCK_G) tiles, y{j}[i, b] =
    MVUE(dZ)[4 (g0 + b) + j, row0 + i]. EDGES: as ``_mvue_tokens_inputs``."""
    x0, x1, x2, x3, u = _mvue_tokens_inputs(dz_ptr, row0, g0, n_tokens, n_cols, quads_per_row, seed, BLOCK_G, EDGES)
    y0, y1, y2, y3 = _mvue_group_level(x0, x1, x2, x3, u)
    dt = dz_ptr.dtype.element_ty
    return y0.to(dt), y1.to(dt), y2.to(dt), y3.to(dt)  # rounded as mvue24 stores them


@triton.jit
def _kept_value(x, level, kept):
    """MVUE's stored value of a kept entry, sign(x) max(|x|, L) (``_mvue_group_level``), +0.0 where not kept."""
    return tl.where(kept, _signed(tl.maximum(tl.abs(x), level), x), 0.0)


@triton.jit
def _mvue_tokens_picked(dz_ptr, row0, g0, n_tokens, n_cols, quads_per_row, seed, BLOCK_G: tl.constexpr,
                        EDGES: tl.constexpr = False):
    """The tile's MVUE picks and its two kept values per group: (first, second, p0, p1, p2, p3), each (64,
    BLOCK_G); first and second in dZ's dtype, rounded as ``_mvue_tokens_tile`` rounds them.

    MVUE keeps at most two entries of a group. first is the value of the first pick among entries 0-2 (+0.0 if
    none); second the value of entry 3 if picked, else of entry 2 if picked after another, else of entry 1 if
    picked after entry 0 (+0.0 if none). So ``_mvue_tokens_tile``'s y_k is first or second where p_k is set
    (``_picked_slot`` says which) and +0.0 elsewhere: two values are formed and rounded per group, not four.
    The non-zero flags of the compressed store are still taken from the rebuilt values, not from the picks: a
    picked value can round to zero where subnormals are flushed (Triton's interpreter does)."""
    x0, x1, x2, x3, u = _mvue_tokens_inputs(dz_ptr, row0, g0, n_tokens, n_cols, quads_per_row, seed, BLOCK_G, EDGES)
    level, p0, p1, p2, p3 = _mvue_level_picks(x0, x1, x2, x3, u)
    p01 = p0 | p1
    second2 = p2 & p01
    dt = dz_ptr.dtype.element_ty
    first = _kept_value(tl.where(p0, x0, tl.where(p1, x1, x2)), level, p01 | p2).to(dt)
    second = _kept_value(tl.where(p3, x3, tl.where(second2, x2, x1)), level, p3 | second2 | (p1 & p0)).to(dt)
    return first, second, p0, p1, p2, p3


@triton.jit
def _picked_slot(first, second, rest, p0, p1, p2, p3):
    """y_0 .. y_3 of the group rebuilt from ``_mvue_tokens_picked``'s two values (or any per-value image of them,
    e.g. their FP8 bytes): first or second where picked, ``rest`` (the image of +0.0) elsewhere."""
    p01 = p0 | p1
    return (tl.where(p0, first, rest), tl.where(p1, tl.where(p0, second, first), rest),
            tl.where(p2, tl.where(p01, second, first), rest), tl.where(p3, second, rest))


@triton.jit
def _mvue_tokens_fp8_pair(dz_ptr, row0, g0, n_tokens, n_cols, quads_per_row, seed, inv_scale_ptr, partial_ptr,
                          BLOCK_G: tl.constexpr, EDGES: tl.constexpr, WRITE_AMAX: tl.constexpr, FMAX: tl.constexpr,
                          MBITS: tl.constexpr, EMIN: tl.constexpr):
    """The E4M3 bytes of the tile's two kept values per group and MVUE's picks: (q(first), q(second), q(+0.0),
    p0, p1, p2, p3), cast with the scale at ``inv_scale_ptr`` as ``quantize_fp8_with_scale`` casts the stored
    values (kernels 19 and 23). WRITE_AMAX: also the program's amax of MVUE(dZ) as stored, at ``partial_ptr``
    (the unpicked entries are +0.0, so the amax of the four is that of the two)."""
    first, second, p0, p1, p2, p3 = _mvue_tokens_picked(dz_ptr, row0, g0, n_tokens, n_cols, quads_per_row, seed,
                                                        BLOCK_G, EDGES)
    if WRITE_AMAX:
        zero = tl.zeros_like(first)
        tl.store(partial_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1),
                 _groups_amax(first, second, zero, zero))
    inv_scale = tl.load(inv_scale_ptr)
    rest = _fp8_bits(tl.zeros([1, 1], dtype=first.dtype), inv_scale, FMAX, MBITS, EMIN)  # +0.0's byte
    return (_fp8_bits(first, inv_scale, FMAX, MBITS, EMIN), _fp8_bits(second, inv_scale, FMAX, MBITS, EMIN), rest,
            p0, p1, p2, p3)


@triton.jit
def _mvue_tokens_fp8_bytes(dz_ptr, row0, g0, n_tokens, n_cols, quads_per_row, seed, inv_scale_ptr, partial_ptr,
                           BLOCK_G: tl.constexpr, EDGES: tl.constexpr, WRITE_AMAX: tl.constexpr, FMAX: tl.constexpr,
                           MBITS: tl.constexpr, EMIN: tl.constexpr):
    """The E4M3 bytes of the tile's MVUE(dZ), q(y_0) .. q(y_3), each (64, BLOCK_G): ``_mvue_tokens_fp8_pair``'s
    two bytes put back in their slots (``_picked_slot``; unpicked entries take the byte of +0.0). Kernel 23
    compresses these four; kernel 19 takes the pair straight (``_compressed_pair``)."""
    b_first, b_second, rest, p0, p1, p2, p3 = _mvue_tokens_fp8_pair(
        dz_ptr, row0, g0, n_tokens, n_cols, quads_per_row, seed, inv_scale_ptr, partial_ptr, BLOCK_G, EDGES,
        WRITE_AMAX, FMAX, MBITS, EMIN)
    return _picked_slot(b_first, b_second, rest, p0, p1, p2, p3)


@triton.jit
def _compressed_pair(b_first, b_second, rest, p0, p1, p2, p3, SIGN_OFF: tl.constexpr):
    """``_pick`` of the group rebuilt by ``_picked_slot`` (the same v0, v1 and code, bit for bit), from the two
    images and the picks, without rebuilding the four slots.

    The first pick sits at a (0, 1 or 2), the second at b > a. ``_pick``'s non-zero flags can only be set at a and
    b: nf = q(first) is non-zero, ns = q(second) is (a kept value can still round to a signed zero, so the flags
    come from the images, not from the picks). Then _pick keeps (i, j) = (a, b) when both are non-zero (the usual
    case); (a, 3) when only the first is; (b, 3) when only the second is and b < 3; else (0, 3), whose slots hold
    q(first) at 0 when p0 and q(second) at 3 when p3, +0.0's image elsewhere."""
    nf = (b_first & SIGN_OFF) != 0
    ns = (b_second & SIGN_OFF) != 0
    a = tl.where(p0, 0, tl.where(p1, 1, 2))
    b = tl.where(p3, 3, tl.where(p2 & (p0 | p1), 2, 1))
    lead_second = ns & ~p3 & ~nf  # only the second is non-zero, and it is not at 3: it leads
    i = tl.where(nf, a, tl.where(lead_second, b, 0))
    j = tl.where(nf & ns, b, 3)
    v0 = tl.where(nf | (p0 & ~lead_second), b_first, tl.where(lead_second, b_second, rest))
    v1 = tl.where((nf & ns) | p3, b_second, rest)
    return v0, v1, i | (j << 2)


@triton.jit
def _mvue_compress24_kernel(dz_ptr, vals_ptr, meta_ptr, n_cols, quads_per_row, half_cols, seed, col_tiles,
                            inv_scale_ptr, partial_ptr, BLOCK_G: tl.constexpr, SEED_PTR: tl.constexpr = False,
                            FP8: tl.constexpr = False, WRITE_VALUES: tl.constexpr = True,
                            WRITE_AMAX: tl.constexpr = False, FMAX: tl.constexpr = 448.0,
                            MBITS: tl.constexpr = 3, EMIN: tl.constexpr = -6):
    seed = _load_seed(seed, SEED_PTR)
    row0 = tl.program_id(0) * 64  # rows of A = columns n of dZ
    g0 = tl.program_id(1) * BLOCK_G  # groups of A = token groups of dZ
    if WRITE_VALUES and FP8:  # kernel 19
        b_first, b_second, rest, p0, p1, p2, p3 = _mvue_tokens_fp8_pair(
            dz_ptr, row0, g0, 2 * half_cols, n_cols, quads_per_row, seed, inv_scale_ptr, partial_ptr, BLOCK_G, False,
            WRITE_AMAX, FMAX, MBITS, EMIN)
        v0, v1, code = _compressed_pair(b_first, b_second, rest, p0, p1, p2, p3, 0x7F)
        _store_compressed(vals_ptr, meta_ptr, row0, g0, v0, v1, code, half_cols, col_tiles, FP8, BLOCK_G)
        return
    y0, y1, y2, y3 = _mvue_tokens_tile(dz_ptr, row0, g0, 2 * half_cols, n_cols, quads_per_row, seed, BLOCK_G)
    if WRITE_AMAX:  # amax of MVUE(dZ) as stored: what the unfused cast of it returns
        tl.store(partial_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), _groups_amax(y0, y1, y2, y3))
    if WRITE_VALUES:  # bf16 / fp16 (E4M3 returned above); the compare-and-select pick is faster here (``_pick``)
        v0, v1, code = _pick(y0.to(tl.int16, bitcast=True), y1.to(tl.int16, bitcast=True),
                             y2.to(tl.int16, bitcast=True), y3.to(tl.int16, bitcast=True), 0x7FFF, False)
        _store_compressed(vals_ptr, meta_ptr, row0, g0, v0, v1, code, half_cols, col_tiles, False, BLOCK_G)


def _checked_dz(dz: torch.Tensor, seed, block_groups: int | None, tile_groups: int) -> int:
    """The argument checks every mode shares; returns the block of token groups per program."""
    check_tensor(dz, "dz", (torch.bfloat16, torch.float16))
    if dz.dim() != 2:
        raise ValueError(f"dz must be 2-D (tokens, out), got shape {tuple(dz.shape)}")
    if not dz.is_contiguous():
        raise ValueError("dz must be contiguous (tokens, out): it is read column tile by column tile")
    tokens, out_f = dz.shape
    if tokens % 64 or out_f % 64:
        raise ValueError(f"dz has shape {tuple(dz.shape)}; tokens and out must be multiples of 64 "
                         "(use mvue24 then _cslt_compress for other shapes)")
    check_seed(seed, dz)
    groups = tokens // 4
    if block_groups is None:
        block_groups = 32 if groups % 32 == 0 else 16
    allowed = tuple(b for b in (8, 16, 32) if b >= tile_groups)
    if block_groups not in allowed or groups % block_groups:
        raise ValueError(f"block_groups must be one of {allowed} and divide tokens / 4 = {groups}, got {block_groups}")
    if dz.numel() > 2**31 - 1:
        raise ValueError(f"dz has {dz.numel()} elements; int32 offsets allow at most {2**31 - 1}")
    check_device(_mvue_compress24_kernel, dz=dz)
    return block_groups


def _launch(dz, seed, block_groups, num_warps, out_dtype, inv_scale=None, write_values=True):
    """Run the kernel; returns (compressed operand or None, amax of MVUE(dZ) or None)."""
    from sparsity_lab.references import cusparselt_layout as layout

    tokens, out_f = dz.shape
    fp8 = out_dtype == torch.float8_e4m3fn
    tile_groups = 16 if fp8 else 8
    groups = tokens // 4
    grid = (out_f // 64, groups // block_groups)
    out, values, meta = None, dz, dz
    if write_values:
        out = torch.empty(layout.compressed_shape(out_f, tokens, out_dtype), dtype=out_dtype, device=dz.device)
        n_values = out_f * tokens // 2
        values = out.view(torch.uint8 if fp8 else torch.int16).reshape(-1)[:n_values]
        meta = out.view(torch.uint8).reshape(-1)[n_values * out.element_size():]
    write_amax = fp8 or not write_values
    if fp8:
        check_fp8_device(dz.device)
    partial = torch.empty(grid[0] * grid[1] if write_amax else 1, dtype=torch.float32, device=dz.device)
    _mvue_compress24_kernel[grid](dz, values, meta, out_f, out_f // 4, tokens // 2, seed, groups // tile_groups,
                                  inv_scale if inv_scale is not None else partial, partial,
                                  BLOCK_G=block_groups, SEED_PTR=isinstance(seed, torch.Tensor), FP8=fp8,
                                  WRITE_VALUES=write_values, WRITE_AMAX=write_amax, num_warps=num_warps)
    return out, (partial.amax() if write_amax else None)


def mvue_compress24(dz: torch.Tensor, seed: int = 0, block_groups: int | None = None,
                    num_warps: int = 8) -> torch.Tensor:
    """cuSPARSELt's compressed form of ``MVUE(dZ)^T`` (groups of 4 along the tokens), in one pass.

    dz: (tokens, out) contiguous bfloat16 / float16; tokens and out multiples of 64. seed: an int, or a
    0-d int64 tensor on dz's device holding it (read on the device: CUDA-graph safe). The bytes equal
    ``compress24(mvue24(dz, dim=0, seed=seed).t())`` (``mvue24``'s default variant, level_philox4).
    Returns ``cusparselt_layout.compressed_shape(out, tokens, dz.dtype)`` of dz's dtype.

    num_warps 8 by default: 1-3 % faster than 4 at the lab step's dZ on the H200
    (``results/kernels_ab_h200_k10_8_vs_4_warps.json``).
    """
    block_groups = _checked_dz(dz, seed, block_groups, 8)
    return _launch(dz, seed, block_groups, num_warps, dz.dtype)[0]


def mvue_compress24_fp8(dz: torch.Tensor, seed, inv_scale: torch.Tensor, block_groups: int | None = None,
                        num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel 19: the FP8 weight-gradient operand q(MVUE(dZ))^T compressed, and amax(MVUE(dZ)), in one pass.

    The MVUE draw and its rounding to dz's dtype are :func:`mvue_compress24`'s; each kept value is then
    cast to E4M3 as ``quantize_fp8_with_scale`` casts (times ``inv_scale``, clamped, rounded to the FP8
    grid) before the compressed store. dz, seed, block_groups (16 or 32): as :func:`mvue_compress24`.
    inv_scale: float32 one-element tensor on dz's device (``fp8_max / amax``, read on the device).
    block_groups: 16 (default) or 32.

    Returns ``(compress24(q.t()), amax)`` bit for bit, with ``q, amax = quantize_fp8_with_scale(
    mvue24(dz, dim=0, seed=seed), inv_scale)``: shape ``compressed_shape(out, tokens, float8_e4m3fn)``
    and a float32 0-d tensor. The dense MVUE(dZ) and q never exist.
    """
    # 16 groups per program by default: faster than 32 at 16384 x 16384 bf16 on the H100 (docs/measuring.md,
    # results/act24_kernels_sweep_h100.json); one 8-bit metadata tile is 16 groups wide
    block_groups = _checked_dz(dz, seed, 16 if block_groups is None else block_groups, 16)
    if not isinstance(inv_scale, torch.Tensor) or inv_scale.numel() != 1 or inv_scale.dtype != torch.float32:
        raise TypeError("inv_scale must be a float32 tensor with one element (fp8_max / amax)")
    check_device(_mvue_compress24_kernel, dz=dz, inv_scale=inv_scale)
    return _launch(dz, seed, block_groups, num_warps, torch.float8_e4m3fn, inv_scale.reshape(()))


def mvue24_amax(dz: torch.Tensor, seed, block_groups: int | None = None, num_warps: int = 4) -> torch.Tensor:
    """amax of ``mvue24(dz, dim=0, seed=seed)`` (float32 0-d tensor) from one read of dZ, nothing else
    written: the first pass of current scaling before :func:`mvue_compress24_fp8`. Arguments as there."""
    block_groups = _checked_dz(dz, seed, block_groups, 8)
    return _launch(dz, seed, block_groups, num_warps, dz.dtype, write_values=False)[1]
