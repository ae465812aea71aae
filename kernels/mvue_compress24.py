"""Kernel 10: MVUE 2:4 of the output gradient along the tokens, written straight into cuSPARSELt's layout.

The idea
    The sparse weight gradient is ``dW = MVUE(dZ^T) X`` with ``A = MVUE(dZ^T)`` (out, tokens) the
    compressed operand. Two kernels (``mvue24(dZ, dim=0)`` then ``compress24`` of its transposed view)
    write the dense MVUE(dZ) and read it back: for 16384 tokens x 16384 outputs that is 1 GiB of
    traffic on top of the one read of dZ. Here one program loads 64 output columns x 4*BLOCK_G tokens
    of dZ, draws exactly what ``mvue24(dZ, dim=0, seed, variant="level_philox4")`` draws (same
    counters, same Philox outputs, same "level" arithmetic, same rounding to dZ's dtype) and writes
    the kept values and metadata as ``compress24`` would: the bytes are identical to the two-kernel
    path (tested), the dense MVUE(dZ) never exists.

    RNG bookkeeping: ``mvue24``'s strided kernel takes one Philox call per 4 neighbouring columns of
    dZ (counter ``g * ceil(N / 4) + n // 4`` for token group g and column n, output ``n % 4``); here
    a tile's 64 columns are 16 such quads, so the program makes one call per (quad, token group) and
    spreads the four outputs over the columns with a join / permute / reshape.

Bytes (dZ of T x N, element size s)
    read ``s T N``; write ``s T N / 2`` (values) + ``T N / 8`` (metadata).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_device, check_tensor
from .compress24 import _pick, _store_compressed
from .mvue24 import _load_seed, _mvue_group_level, _unit_float, check_seed


@triton.jit
def _mvue_compress24_kernel(dz_ptr, vals_ptr, meta_ptr, n_cols, quads_per_row, half_cols, seed, col_tiles,
                            BLOCK_G: tl.constexpr, SEED_PTR: tl.constexpr = False):
    seed = _load_seed(seed, SEED_PTR)
    row0 = tl.program_id(0) * 64  # rows of A = columns n of dZ
    g0 = tl.program_id(1) * BLOCK_G  # groups of A = token groups of dZ
    n = row0 + tl.arange(0, 64)[:, None]
    g = g0 + tl.arange(0, BLOCK_G)[None, :]
    base = dz_ptr + (4 * g) * n_cols + n  # dZ[4g + j, n]: contiguous along n
    x0 = tl.load(base).to(tl.float32)
    x1 = tl.load(base + n_cols).to(tl.float32)
    x2 = tl.load(base + 2 * n_cols).to(tl.float32)
    x3 = tl.load(base + 3 * n_cols).to(tl.float32)
    # one Philox call per (quad of columns, token group), as mvue24's strided quads kernel makes them
    quads = g * quads_per_row + (row0 // 4 + tl.arange(0, 16)[:, None])  # (16, BLOCK_G)
    r0, r1, r2, r3 = tl.randint4x(seed, quads)
    u4 = tl.join(tl.join(_unit_float(r0), _unit_float(r2)), tl.join(_unit_float(r1), _unit_float(r3)))
    u = tl.reshape(tl.permute(tl.reshape(u4, [16, BLOCK_G, 4]), (0, 2, 1)), [64, BLOCK_G])  # column 4q + m
    y0, y1, y2, y3 = _mvue_group_level(x0, x1, x2, x3, u)
    dt = dz_ptr.dtype.element_ty
    b0 = y0.to(dt).to(tl.int16, bitcast=True)  # rounded as mvue24 stores them, then as raw bits
    b1 = y1.to(dt).to(tl.int16, bitcast=True)
    b2 = y2.to(dt).to(tl.int16, bitcast=True)
    b3 = y3.to(dt).to(tl.int16, bitcast=True)
    v0, v1, code = _pick(b0, b1, b2, b3, 0x7FFF)
    _store_compressed(vals_ptr, meta_ptr, row0, g0, v0, v1, code, half_cols, col_tiles, False, BLOCK_G)


def mvue_compress24(dz: torch.Tensor, seed: int = 0, block_groups: int | None = None,
                    num_warps: int = 4) -> torch.Tensor:
    """cuSPARSELt's compressed form of ``MVUE(dZ)^T`` (groups of 4 along the tokens), in one pass.

    dz: (tokens, out) contiguous bfloat16 / float16; tokens and out multiples of 64. seed: an int, or a
    0-d int64 tensor on dz's device holding it (read on the device: CUDA-graph safe). The bytes equal
    ``compress24(mvue24(dz, dim=0, seed=seed).t())`` (``mvue24``'s default variant, level_philox4).
    Returns ``cusparselt_layout.compressed_shape(out, tokens, dz.dtype)`` of dz's dtype.
    """
    from sparsity_lab.references import cusparselt_layout as layout

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
    if block_groups not in (8, 16, 32) or groups % block_groups:
        raise ValueError(f"block_groups must be 8, 16 or 32 and divide tokens / 4 = {groups}, got {block_groups}")
    if dz.numel() > 2**31 - 1:
        raise ValueError(f"dz has {dz.numel()} elements; int32 offsets allow at most {2**31 - 1}")
    check_device(_mvue_compress24_kernel, dz=dz)
    out = torch.empty(layout.compressed_shape(out_f, tokens, dz.dtype), dtype=dz.dtype, device=dz.device)
    n_values = out_f * tokens // 2
    values = out.view(torch.int16).reshape(-1)[:n_values]
    meta = out.view(torch.uint8).reshape(-1)[2 * n_values:]
    grid = (out_f // 64, groups // block_groups)
    _mvue_compress24_kernel[grid](dz, values, meta, out_f, out_f // 4, tokens // 2, seed, groups // 8,
                                  BLOCK_G=block_groups, SEED_PTR=isinstance(seed, torch.Tensor), num_warps=num_warps)
    return out
