"""Kernel 13: the backward of 2:4 squared-ReLU activations, dH = dA24 * M * 2 relu(H), compressed.

The idea
    In the FFN's backward (``sparsity_lab.references.act24`` writes out all six products) the
    gradient reaching the up projection's output is dH = dA24 * M * 2 relu(H): zero wherever the
    forward pruned A (straight-through on the kept entries only), so dH is 2:4 along the hidden
    dimension in the forward's own pattern. The input gradient dx = dH W1 sums over the hidden
    dimension, so dH can be cuSPARSELt's sparse operand there with no approximation at all.

    One program loads a 64-row tile of H and of dA24, recomputes the forward's selection M from H in
    registers (the same ``_relu2_top2`` as kernel 12: no mask is stored between the passes), forms
    dH in float32, rounds once, and stores it compressed (for dx) and, when asked, dense (for the
    weight gradient dW1 = dH^T x, which sums over the tokens and cannot use the pattern).

    Reference: ``sparsity_lab.references.act24.act24_grad``; the compressed bytes equal
    ``compress24(dH)`` (tested).

Bytes (16-bit, rows x cols): read 4 rows cols; write 9/8 rows cols compressed (+ 2 rows cols dense).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_device, check_same_shape, check_tensor
from .act24 import _TL_DTYPES, ROW_TILE, _block_groups, _relu2_top2, check_activation_shape, compressed_outputs
from .compress24 import _pick, _store_compressed


@triton.jit
def _act24_backward_kernel(h_ptr, da_ptr, vals_ptr, meta_ptr, dense_ptr, stride_r, stride_c, da_stride_r,
                           da_stride_c, cols, col_tiles,
                           WRITE_DENSE: tl.constexpr, BLOCK_G: tl.constexpr, OUT_DTYPE: tl.constexpr):
    row0 = tl.program_id(0) * 64
    g0 = tl.program_id(1) * BLOCK_G
    a0, a1, a2, a3, k0, k1, k2, k3 = _relu2_top2(h_ptr, row0, g0, stride_r, stride_c, BLOCK_G)
    rows = row0 + tl.arange(0, 64)
    cidx = 4 * g0 + tl.arange(0, 4 * BLOCK_G)
    da = tl.load(da_ptr + rows[:, None] * da_stride_r + cidx[None, :] * da_stride_c).to(tl.float32)
    e, o = tl.split(tl.reshape(da, [64, BLOCK_G, 2, 2]))
    d0, d2 = tl.split(e)
    d1, d3 = tl.split(o)
    # 2 relu(h) = 2 sqrt(a) would cost a root: reload h instead (it is in cache)
    h = tl.load(h_ptr + rows[:, None] * stride_r + cidx[None, :] * stride_c).to(tl.float32)
    two_relu = tl.where(h <= 0.0, 0.0, 2.0 * h)
    he, ho = tl.split(tl.reshape(two_relu, [64, BLOCK_G, 2, 2]))
    r0, r2 = tl.split(he)
    r1, r3 = tl.split(ho)
    v0 = tl.where(k0, d0 * r0, 0.0).to(OUT_DTYPE)
    v1 = tl.where(k1, d1 * r1, 0.0).to(OUT_DTYPE)
    v2 = tl.where(k2, d2 * r2, 0.0).to(OUT_DTYPE)
    v3 = tl.where(k3, d3 * r3, 0.0).to(OUT_DTYPE)
    if WRITE_DENSE:
        tile = tl.reshape(tl.join(tl.join(v0, v2), tl.join(v1, v3)), [64, 4 * BLOCK_G])
        tl.store(dense_ptr + rows[:, None] * cols + cidx[None, :], tile)
    p0, p1, code = _pick(v0.to(tl.int16, bitcast=True), v1.to(tl.int16, bitcast=True),
                         v2.to(tl.int16, bitcast=True), v3.to(tl.int16, bitcast=True), 0x7FFF)
    _store_compressed(vals_ptr, meta_ptr, row0, g0, p0, p1, code, cols // 2, col_tiles, False, BLOCK_G)


def act24_backward(h: torch.Tensor, grad_a24: torch.Tensor, out_dtype: torch.dtype | None = None,
                   dense: bool = True, num_warps: int | None = None,
                   block_groups: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(compressed dH, dense dH or None) for dH = grad_a24 * top2of4(relu(h)^2) * 2 relu(h).

    h: (tokens, hidden) the forward's pre-activation, grad_a24 (tokens, hidden) = dY W2; bfloat16 /
    float16 / float32, any strides; tokens and hidden multiples of 64. out_dtype: bfloat16 / float16
    (default grad_a24's dtype). block_groups: as :func:`~sparsity_lab.kernels.act24.act24`. num_warps:
    default 8 for blocks of 32 groups, else 4 (the fastest on the H100 at 16384 x 16384, see
    docs/measuring.md and ``results/act24_kernels_sweep_h100.json``).
    """
    check_tensor(h, "h", (torch.bfloat16, torch.float16, torch.float32))
    check_tensor(grad_a24, "grad_a24", (torch.bfloat16, torch.float16, torch.float32))
    check_activation_shape(h)
    check_same_shape(grad_a24, "grad_a24", h, "h")
    out_dtype = out_dtype or grad_a24.dtype
    if out_dtype not in _TL_DTYPES:
        raise TypeError(f"out_dtype must be bfloat16 or float16 (a product dtype), got {out_dtype}")
    check_device(_act24_backward_kernel, h=h, grad_a24=grad_a24)
    rows, cols = h.shape
    groups = cols // 4
    out, values, meta, dh = compressed_outputs(rows, cols, out_dtype, h.device, dense)
    block = _block_groups(groups, block_groups)
    if num_warps is None:
        num_warps = 8 if block == 32 else 4
    _act24_backward_kernel[(rows // ROW_TILE, groups // block)](
        h, grad_a24, values, meta, dh if dense else values, h.stride(0), h.stride(1), grad_a24.stride(0),
        grad_a24.stride(1), cols, groups // 8,
        WRITE_DENSE=dense, BLOCK_G=block, OUT_DTYPE=_TL_DTYPES[out_dtype], num_warps=num_warps)
    return out, dh
