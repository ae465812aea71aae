"""Kernel 3: S-STE's 2:4 soft threshold fused with the frozen scale beta (forward weight).

The idea
    S-STE (Hu, Zhu, Chen 2024) replaces hard 2:4 pruning by a continuous soft threshold per group of
    4 along the rows: with ``t`` the largest *pruned* magnitude of the group (for a row-wise 2:4
    mask: the 2nd smallest ``|w|``),

        S(w)_i = m_i * sign(w_i) * max(|w_i| - t, 0),

    and the layer uses ``beta * S(W)`` with a per-tensor beta frozen at initialisation. One pass
    computes the mask (or reads a given one, e.g. a transposable mask), the threshold, the shrink and
    the scale: ``sparsity_lab.methods.soft_threshold`` is the reference.

    beta is read from a device pointer (a 0-d float32 tensor), so no host sync is needed. The
    arithmetic is float32 with one rounding to the output dtype at the end (the reference rounds
    ``|w| - t`` to the weight dtype first, then the product: for bf16/fp16 the two can differ by one
    ulp; for float32 they are identical).

Bytes (w of dtype size s, numel n)
    read ``s * n`` (+ ``n`` for a given bool mask); write ``s * n``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (HALF_AND_FLOAT, check_device, check_last_dim_divisible, check_same_shape, check_tensor,
                      contiguous, join4, keep_top2, split4)

DEFAULT_BLOCK = 1024  # groups per program
DEFAULT_WARPS = 8


@triton.jit
def _shrink(w, keep, t):
    """m * sign(w) * max(|w| - t, 0), float32."""
    shrunk = tl.maximum(tl.abs(w) - t, 0.0)
    return tl.where(keep, tl.where(w < 0, -shrunk, shrunk), 0.0)


@triton.jit
def _soft_threshold24_kernel(w_ptr, mask_ptr, beta_ptr, out_ptr, n_groups,
                             HAS_MASK: tl.constexpr, HAS_BETA: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    elems = pid * BLOCK * 4 + tl.arange(0, BLOCK * 4)
    in_range = elems < n_groups * 4
    w = tl.load(w_ptr + elems, mask=in_range, other=0.0)
    w0, w1, w2, w3 = split4(w, BLOCK)
    w0 = w0.to(tl.float32)
    w1 = w1.to(tl.float32)
    w2 = w2.to(tl.float32)
    w3 = w3.to(tl.float32)
    a0 = tl.abs(w0)
    a1 = tl.abs(w1)
    a2 = tl.abs(w2)
    a3 = tl.abs(w3)
    if HAS_MASK:
        m = tl.load(mask_ptr + elems, mask=in_range, other=0)
        m0, m1, m2, m3 = split4(m, BLOCK)
        k0 = m0 != 0
        k1 = m1 != 0
        k2 = m2 != 0
        k3 = m3 != 0
    else:
        k0, k1, k2, k3 = keep_top2(a0, a1, a2, a3)
    # t = largest pruned magnitude of the group (0 when nothing is pruned)
    t = tl.maximum(tl.maximum(tl.where(k0, 0.0, a0), tl.where(k1, 0.0, a1)),
                   tl.maximum(tl.where(k2, 0.0, a2), tl.where(k3, 0.0, a3)))
    s0 = _shrink(w0, k0, t)
    s1 = _shrink(w1, k1, t)
    s2 = _shrink(w2, k2, t)
    s3 = _shrink(w3, k3, t)
    if HAS_BETA:
        beta = tl.load(beta_ptr).to(tl.float32)
        s0 = s0 * beta
        s1 = s1 * beta
        s2 = s2 * beta
        s3 = s3 * beta
    out = join4(s0, s1, s2, s3, BLOCK)
    tl.store(out_ptr + elems, out.to(out_ptr.dtype.element_ty), mask=in_range)


def soft_threshold24(w: torch.Tensor, mask: torch.Tensor | None = None, beta: torch.Tensor | float | None = None,
                     block: int = DEFAULT_BLOCK, num_warps: int = DEFAULT_WARPS,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``beta * S(w)`` with groups of 4 along the last dimension.

    w: (..., K) float16/bfloat16/float32, K divisible by 4. mask: None (row-wise 2:4 magnitude mask
    computed in the kernel, ties to the lowest index) or a bool tensor like ``w`` whose kept
    entries define the threshold (any mask with at most 2 kept per group, e.g. transposable).
    beta: None (1), a float, or a 0-d / 1-element tensor on w's device. Returns a tensor like w.
    """
    check_tensor(w, "w", HALF_AND_FLOAT)
    check_last_dim_divisible(w, "w")
    tensors = {"w": w}
    if mask is not None:
        check_tensor(mask, "mask", (torch.bool,))
        check_same_shape(mask, "mask", w, "w")
        tensors["mask"] = mask
    if beta is not None and not isinstance(beta, torch.Tensor):
        beta = torch.tensor(float(beta), dtype=torch.float32, device=w.device)
    if beta is not None:
        if beta.numel() != 1:
            raise ValueError(f"beta must be a scalar (one element), got shape {tuple(beta.shape)}")
        if not beta.dtype.is_floating_point:
            raise TypeError(f"beta must be a floating-point scalar, got dtype {beta.dtype}")
        tensors["beta"] = beta
    check_device(_soft_threshold24_kernel, **tensors)
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 1, got {block}")
    w = contiguous(w)
    mask_u8 = contiguous(mask).view(torch.uint8) if mask is not None else w
    beta_t = beta.reshape(()).float() if beta is not None else w
    if out_dtype is not None and out_dtype not in HALF_AND_FLOAT:
        raise TypeError(f"out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    # out_dtype: write the product dtype directly (one rounding of the float32 result), saving the
    # separate cast pass of an fp32 master weight
    out = torch.empty_like(w, dtype=out_dtype or w.dtype)
    n_groups = w.numel() // 4
    _soft_threshold24_kernel[(triton.cdiv(n_groups, block),)](
        w, mask_u8, beta_t, out, n_groups, HAS_MASK=mask is not None, HAS_BETA=beta is not None,
        BLOCK=block, num_warps=num_warps)
    return out
