"""Kernel 14: FP8 cast that writes q and its transpose q^T in one pass (a cast-transpose).

The idea
    The weight gradient of an FP8 layer, dW = s_g s_x q(G)^T q(X), reads q(X) transposed:
    cuSPARSELt's FP8 2:4 product takes its dense operand B only as the ``.t()`` of a contiguous
    (n, k), i.e. q(X)^T contiguous (in, tokens), and ``torch._scaled_mm`` wants mat2 column-major,
    which is the same memory. The forward reads q(X) as it is. Casting X once and copying q(X) into
    its transpose afterwards costs a second read and write of q(X) (and PyTorch's transpose copy of
    a float8 tensor is far from the copy bandwidth). Here each program loads one
    ``BLOCK_R x BLOCK_C`` tile of x, casts it once (``fp8_cast._fp8_byte``, the same conversion as
    ``quantize_fp8_with_scale``, so q is bit for bit that kernel's), stores the
    tile at (r, c) of q and its transpose at (c, r) of q^T (Triton turns the tile around in shared
    memory, so both stores are coalesced), and writes the tile's max |x| for the amax.

    Reference: ``sparsity_lab.references.fp8.quantize_with_inv_scale`` and ``.t()`` of its result.

Bytes (x of dtype size s, shape (R, C), n = R C)
    read s n, write 2 n (q and q^T); plus one float32 per program for the amax.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparsity_lab.references.fp8 import fp8_format

from ._common import HALF_AND_FLOAT, check_device, check_tensor
from .fp8_cast import _GRID, _finite_product, _fp8_byte, check_fp8_device

DEFAULT_BLOCK_R = 64
DEFAULT_BLOCK_C = 64
DEFAULT_WARPS = 4


@triton.jit
def _cast_transpose_kernel(x_ptr, q_ptr, qt_ptr, inv_scale_ptr, partial_ptr, R, C, stride_xr,
                           FMAX: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                           BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(x_ptr + rows[:, None] * stride_xr + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    y = x * tl.load(inv_scale_ptr)
    keep = _finite_product(x, y)  # False where x is not finite: NaN there
    q = _fp8_byte(y, keep, FMAX, MBITS, EMIN).to(q_ptr.dtype.element_ty, bitcast=True)
    tl.store(q_ptr + rows[:, None] * C + cols[None, :], q, mask=ok)
    tl.store(qt_ptr + cols[:, None] * R + rows[None, :], tl.trans(q), mask=tl.trans(ok))
    tl.store(partial_ptr + pid_r * tl.num_programs(1) + pid_c, tl.max(tl.max(tl.abs(x), axis=1), axis=0))


def quantize_fp8_transposed(x: torch.Tensor, inv_scale: torch.Tensor, fmt: str = "e4m3",
                            block_r: int = DEFAULT_BLOCK_R, block_c: int = DEFAULT_BLOCK_C,
                            num_warps: int = DEFAULT_WARPS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, q^T, amax): q = fp8(clamp(x * inv_scale)) (R, C) contiguous, q^T (C, R) contiguous (the same
    values), amax = max |x| (float32 0-d). x: 2-D float16/bfloat16/float32 with unit column stride;
    inv_scale: float32 tensor with one element on x's device (``fp8_max / amax``)."""
    fmt_dtype, fmax = fp8_format(fmt)
    check_tensor(x, "x", HALF_AND_FLOAT)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (rows, cols), got shape {tuple(x.shape)}")
    if not isinstance(inv_scale, torch.Tensor) or inv_scale.numel() != 1 or inv_scale.dtype != torch.float32:
        raise TypeError("inv_scale must be a float32 tensor with one element (fp8_max / amax)")
    check_device(_cast_transpose_kernel, x=x, inv_scale=inv_scale)
    check_fp8_device(x.device)
    for name, b in (("block_r", block_r), ("block_c", block_c)):
        if b < 16 or b & (b - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {b}")
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, cols = x.shape
    mbits, emin = _GRID[fmt]
    q = torch.empty((rows, cols), dtype=fmt_dtype, device=x.device)
    q_t = torch.empty((cols, rows), dtype=fmt_dtype, device=x.device)
    grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c))
    partial = torch.empty(grid[0] * grid[1], dtype=torch.float32, device=x.device)
    _cast_transpose_kernel[grid](x, q, q_t, inv_scale.reshape(()), partial, rows, cols, x.stride(0), FMAX=fmax,
                                 MBITS=mbits, EMIN=emin, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=num_warps)
    return q, q_t, partial.amax()
