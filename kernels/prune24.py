"""Kernel 1: row-wise 2:4 magnitude pruning, with a compact mask.

The idea
    Along the last dimension, every group of 4 consecutive weights keeps its 2 largest ``|w|``
    (ties to the lowest index, exactly like ``sparsity_lab.masks.nm_mask``). One pass: each program
    loads ``4 * BLOCK`` consecutive elements, ranks the four members of each group in registers
    (six comparisons, see ``_common.keep_top2``) and writes

    * the pruned values ``m * w`` (same dtype and shape as ``w``; zeros where pruned), and
    * the mask as **one uint8 per group**: bit j (value ``1 << j``) is set when member j is kept,
      so exactly two of the low four bits are set and the high four are zero. Shape
      ``(..., K // 4)``. ``unpack_mask24`` turns it into a bool mask, ``pack_mask24`` back.

Bytes (w of dtype size s, numel n)
    read ``s * n``; write ``s * n`` (values) + ``n / 4`` (mask). bf16: 2.25 bytes out per 2 in.
    ``values=False`` writes the mask only (the mask refresh of a training step).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (HALF_AND_FLOAT, check_device, check_last_dim_divisible, check_tensor, contiguous, join4,
                      keep_top2, split4)

DEFAULT_BLOCK = 512  # groups per program (2048 elements); best measured on the H100
DEFAULT_WARPS = 8


@triton.jit
def _prune24_kernel(w_ptr, out_ptr, bits_ptr, n_groups,
                    WRITE_VALUES: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    groups = pid * BLOCK + tl.arange(0, BLOCK)
    elems = pid * BLOCK * 4 + tl.arange(0, BLOCK * 4)
    in_range = elems < n_groups * 4
    w = tl.load(w_ptr + elems, mask=in_range, other=0.0)
    w0, w1, w2, w3 = split4(w, BLOCK)
    # float32 magnitudes: exact for every input dtype, so the ranking equals the reference's
    k0, k1, k2, k3 = keep_top2(tl.abs(w0.to(tl.float32)), tl.abs(w1.to(tl.float32)),
                               tl.abs(w2.to(tl.float32)), tl.abs(w3.to(tl.float32)))
    bits = k0.to(tl.int32) | (k1.to(tl.int32) << 1) | (k2.to(tl.int32) << 2) | (k3.to(tl.int32) << 3)
    tl.store(bits_ptr + groups, bits.to(tl.uint8), mask=groups < n_groups)
    if WRITE_VALUES:
        zero = tl.zeros_like(w0)
        pruned = join4(tl.where(k0, w0, zero), tl.where(k1, w1, zero), tl.where(k2, w2, zero),
                       tl.where(k3, w3, zero), BLOCK)
        tl.store(out_ptr + elems, pruned, mask=in_range)


def prune24(w: torch.Tensor, values: bool = True, block: int = DEFAULT_BLOCK,
            num_warps: int = DEFAULT_WARPS) -> tuple[torch.Tensor | None, torch.Tensor]:
    """2:4 magnitude pruning of ``w`` along its last dimension.

    w: (..., K) float16/bfloat16/float32, K divisible by 4 (non-contiguous inputs are copied).
    Returns ``(pruned, bits)``: pruned like ``w`` (None when ``values=False``) and the uint8
    group mask (..., K // 4), bit j = member j kept.
    """
    check_tensor(w, "w", HALF_AND_FLOAT)
    check_last_dim_divisible(w, "w")
    check_device(_prune24_kernel, w=w)
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 1, got {block}")
    w = contiguous(w)
    n_groups = w.numel() // 4
    bits = torch.empty(*w.shape[:-1], w.shape[-1] // 4, dtype=torch.uint8, device=w.device)
    out = torch.empty_like(w) if values else None
    grid = (triton.cdiv(n_groups, block),)
    _prune24_kernel[grid](w, out if values else w, bits, n_groups, WRITE_VALUES=values, BLOCK=block,
                          num_warps=num_warps)
    return out, bits


def unpack_mask24(bits: torch.Tensor) -> torch.Tensor:
    """uint8 group mask (..., G) -> bool mask (..., 4 * G)."""
    if bits.dtype != torch.uint8:
        raise TypeError(f"bits must be uint8 (one byte per group of 4), got {bits.dtype}")
    shifts = torch.arange(4, device=bits.device, dtype=torch.uint8)
    return ((bits.unsqueeze(-1) >> shifts) & 1).bool().flatten(-2)


def pack_mask24(mask: torch.Tensor) -> torch.Tensor:
    """bool mask (..., K), K divisible by 4 -> uint8 group mask (..., K // 4)."""
    check_last_dim_divisible(mask, "mask")
    weights = torch.tensor([1, 2, 4, 8], device=mask.device, dtype=torch.uint8)
    groups = (mask != 0).to(torch.uint8).reshape(*mask.shape[:-1], -1, 4)
    return (groups * weights).sum(-1, dtype=torch.uint8)
