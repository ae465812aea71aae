"""Kernel 12: squared ReLU, 2:4 selection and cuSPARSELt compression of the FFN activation, one pass.

The idea
    With 2:4 activation sparsity (Haziza et al. 2025, https://arxiv.org/abs/2503.16672) the down
    projection's input A = relu(H)^2 is pruned to the 2 largest of every 4 along the hidden dimension
    and multiplied as cuSPARSELt's sparse operand. Unfused that is three passes over (tokens, hidden):
    the activation, the prune, and ``compress24``. Here one program loads a 64-row x ``4 * BLOCK_G``
    tile of H, computes A in float32 in registers, keeps the top 2 of each group (``keep_top2``: ties
    to the lowest index), rounds the kept values once to the product dtype and stores them straight
    in cuSPARSELt's layout (``compress24``'s store). The dense pruned A24 is written too when asked
    (the backward's weight gradient dW2 = dY^T A24 reads it); the unpruned A never exists.

    The reference is ``sparsity_lab.references.act24.act24`` (selection on the float32 A, one rounding);
    the compressed bytes equal ``compress24(A24)`` (tested, bit for bit where the rounding agrees).

Bytes (H of rows x cols, 16-bit): read 2 rows cols; write rows cols + rows cols / 8 (compressed),
plus 2 rows cols for the dense A24. Unfused (activation, prune, compress): 2 + 2, 2 + 2 + 1/4, 2 +
9/8: about 9.4 bytes per element against 3.1 (5.1 with the dense A24).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_device, check_tensor, keep_top2
from .compress24 import _pick, _store_compressed

ROW_TILE = 64
_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _relu2_top2(h_ptr, row0, g0, stride_r, stride_c, BLOCK_G: tl.constexpr):
    """Load a (64, 4 * BLOCK_G) tile of H; return A = relu(H)^2 (float32) split into the four members
    of each group, each (64, BLOCK_G), and the four keep flags of the 2:4 selection."""
    rows = row0 + tl.arange(0, 64)
    h = tl.load(h_ptr + rows[:, None] * stride_r + (4 * g0 + tl.arange(0, 4 * BLOCK_G))[None, :] * stride_c)
    h = h.to(tl.float32)
    a = tl.where(h <= 0.0, 0.0, h * h)  # relu(h)^2; a NaN stays NaN (h <= 0 is False), as torch.relu
    even, odd = tl.split(tl.reshape(a, [64, BLOCK_G, 2, 2]))  # even[r, g, i] = member 2i of group g
    a0, a2 = tl.split(even)
    a1, a3 = tl.split(odd)
    k0, k1, k2, k3 = keep_top2(a0, a1, a2, a3)
    return a0, a1, a2, a3, k0, k1, k2, k3


@triton.jit
def _act24_kernel(h_ptr, vals_ptr, meta_ptr, dense_ptr, stride_r, stride_c, cols, col_tiles,
                  WRITE_DENSE: tl.constexpr, BLOCK_G: tl.constexpr, OUT_DTYPE: tl.constexpr):
    row0 = tl.program_id(0) * 64
    g0 = tl.program_id(1) * BLOCK_G
    a0, a1, a2, a3, k0, k1, k2, k3 = _relu2_top2(h_ptr, row0, g0, stride_r, stride_c, BLOCK_G)
    v0 = tl.where(k0, a0, 0.0).to(OUT_DTYPE)
    v1 = tl.where(k1, a1, 0.0).to(OUT_DTYPE)
    v2 = tl.where(k2, a2, 0.0).to(OUT_DTYPE)
    v3 = tl.where(k3, a3, 0.0).to(OUT_DTYPE)
    if WRITE_DENSE:
        rows = row0 + tl.arange(0, 64)
        tile = tl.reshape(tl.join(tl.join(v0, v2), tl.join(v1, v3)), [64, 4 * BLOCK_G])
        tl.store(dense_ptr + rows[:, None] * cols + (4 * g0 + tl.arange(0, 4 * BLOCK_G))[None, :], tile)
    b0 = v0.to(tl.int16, bitcast=True)
    b1 = v1.to(tl.int16, bitcast=True)
    b2 = v2.to(tl.int16, bitcast=True)
    b3 = v3.to(tl.int16, bitcast=True)
    p0, p1, code = _pick(b0, b1, b2, b3, 0x7FFF)
    _store_compressed(vals_ptr, meta_ptr, row0, g0, p0, p1, code, cols // 2, col_tiles, False, BLOCK_G)


def _block_groups(groups: int, requested: int | None = None) -> int:
    """Groups of 4 per program: ``requested`` (checked), else the largest of 32, 16, 8 dividing ``groups``."""
    if requested is None:
        return next(b for b in (32, 16, 8) if groups % b == 0)
    if requested not in (8, 16, 32) or groups % requested:
        raise ValueError(f"block_groups must be 8, 16 or 32 and divide hidden / 4 = {groups}, got {requested}")
    return requested


def check_activation_shape(h: torch.Tensor, name: str = "h") -> None:
    """2-D, rows and columns multiples of 64 (whole tiles of cuSPARSELt's layout), int32 offsets."""
    if h.dim() != 2:
        raise ValueError(f"{name} must be 2-D (tokens, hidden), got shape {tuple(h.shape)}")
    rows, cols = h.shape
    if rows % ROW_TILE or cols % ROW_TILE:
        raise ValueError(f"{name} has shape {tuple(h.shape)}; tokens and hidden must be multiples of {ROW_TILE} "
                         "(whole tiles of cuSPARSELt's compressed layout): pad the tokens, or use the reference "
                         "sparsity_lab.references.act24")
    if rows * cols > 2**31 - 1 or (rows - 1) * abs(h.stride(0)) + (cols - 1) * abs(h.stride(1)) > 2**31 - 1:
        raise ValueError(f"{name} with shape {tuple(h.shape)} and strides {h.stride()} exceeds int32 offsets")


def compressed_outputs(rows: int, cols: int, out_dtype: torch.dtype, device: torch.device, dense: bool):
    """(out, values, meta, dense_out): the compressed (rows, cols) 2:4 buffer in cuSPARSELt's layout
    with its int16 value and uint8 metadata views (what the kernels store into), and the dense
    (rows, cols) output when asked (else None)."""
    from sparsity_lab.references import cusparselt_layout as layout

    out = torch.empty(layout.compressed_shape(rows, cols, out_dtype), dtype=out_dtype, device=device)
    n_values = rows * cols // 2
    values = out.view(torch.int16).reshape(-1)[:n_values]
    meta = out.view(torch.uint8).reshape(-1)[2 * n_values:]
    dense_out = torch.empty(rows, cols, dtype=out_dtype, device=device) if dense else None
    return out, values, meta, dense_out


def act24(h: torch.Tensor, out_dtype: torch.dtype | None = None, dense: bool = True,
          num_warps: int = 4, block_groups: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(compressed A24, dense A24 or None) for A24 = top2of4(relu(h)^2) along h's rows.

    h: (tokens, hidden) bfloat16 / float16 / float32, any strides; tokens and hidden multiples of 64.
    out_dtype: bfloat16 / float16, the product dtype (default h's dtype). Returns the compressed
    operand (``cusparselt_layout.compressed_shape(tokens, hidden, out_dtype)``, what
    ``torch._cslt_compress(A24)`` gives) and, with ``dense=True``, A24 itself (tokens, hidden).
    block_groups: groups of 4 per program along hidden (8, 16 or 32 dividing hidden / 4; default the largest).
    """
    check_tensor(h, "h", (torch.bfloat16, torch.float16, torch.float32))
    check_activation_shape(h)
    out_dtype = out_dtype or h.dtype
    if out_dtype not in _TL_DTYPES:
        raise TypeError(f"out_dtype must be bfloat16 or float16 (a product dtype), got {out_dtype}")
    check_device(_act24_kernel, h=h)
    rows, cols = h.shape
    groups = cols // 4
    out, values, meta, a24 = compressed_outputs(rows, cols, out_dtype, h.device, dense)
    block = _block_groups(groups, block_groups)
    _act24_kernel[(rows // ROW_TILE, groups // block)](
        h, values, meta, a24 if dense else values, h.stride(0), h.stride(1), cols, groups // 8,
        WRITE_DENSE=dense, BLOCK_G=block, OUT_DTYPE=_TL_DTYPES[out_dtype], num_warps=num_warps)
    return out, a24
