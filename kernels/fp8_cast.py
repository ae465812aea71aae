"""Kernel 7: FP8 per-tensor quantization (amax, scale, cast to E4M3/E5M2) and dequantization.

The idea
    ``sparsity_lab.references.fp8`` is the reference and fixes the convention: ``scale = amax / fp8_max``
    (what ``torch._scaled_mm`` takes), ``q = fp8(clamp(x * (fp8_max / amax)))``, ``x ~= q * scale``, and
    NaN for an x that is not finite (``_finite_product``, ``_to_fp8_or_nan``).

    Current scaling needs the amax of the whole tensor before the first element can be cast, so it
    is two passes over x: ``_amax_kernel`` writes one max per program (a few thousand floats,
    reduced by torch), the scales are two scalar ops on the device (no host sync), and
    ``_quantize_kernel`` casts. A tensor of 64 MiB does not fit in the 50 MB L2 of an H100, so the
    second pass re-reads x from memory: with bytes counted as "x read once, q written once"
    (bf16 -> fp8: 3 bytes per element) the two passes move 5 bytes, a ceiling of 3/5 = 0.6 of the
    copy bandwidth for this operation. ``quantize_fp8_with_scale`` is the one-pass alternative
    (delayed scaling): it casts with a given scale and returns this tensor's amax for the next step.

    Rounding: the product ``y = x * inv_scale`` is rounded to the FP8 grid explicitly in float32
    (round to nearest even: adding and subtracting ``1.5 * 2**(23 + e - mantissa_bits)`` leaves y
    rounded to a multiple of its FP8 ulp ``2**(e - mantissa_bits)``, e = max(exponent of y, the
    format's smallest normal exponent)), so the final cast converts an exactly representable value.
    That makes the result independent of the cast's own rounding (triton 3.9's interpreter carries
    mantissa overflow wrongly in fp32 -> fp8 casts: 124.8 became 64 instead of 128).

Bytes (x of dtype size s, numel n)
    amax: read s n.  quantize: read s n, write n.  current scaling in all: read 2 s n, write n.
    dequantize: read n, write s n.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparsity_lab.references.fp8 import fp8_format, scales_from_amax

from ._common import HALF_AND_FLOAT, check_device, check_tensor, contiguous

DEFAULT_BLOCK = 4096  # elements per program
DEFAULT_WARPS = 8
# (mantissa bits, smallest normal exponent) of each format
_GRID = {"e4m3": (3, -6), "e5m2": (2, -14)}


@triton.jit
def _round_to_fp8_grid(y, MBITS: tl.constexpr, EMIN: tl.constexpr):
    """y (float32, |y| <= fp8_max) rounded to nearest even on the FP8 grid, still float32."""
    bits = y.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, EMIN)
    magic = (((e - MBITS + 150) << 23) | 0x400000).to(tl.float32, bitcast=True)  # 1.5 * 2**(e - MBITS + 23)
    r = (tl.abs(y) + magic) - magic
    # put y's sign bit back with integer ops: values that round to zero keep it (-0.0, as torch);
    # a float negation would not (triton lowers -r to 0 - r, which is +0.0 for r = 0)
    sign = (bits >> 31) << 31
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


F32_MAX = tl.constexpr(3.4028234663852886e38)  # the largest finite float32 (a constexpr: a jit function reads it)


@triton.jit
def _finite_product(x, y):
    """True where x is finite and y (= x * inv_scale) is a number: the entries that quantize to a value;
    the others quantize to NaN (``references.fp8``: an overflow upstream is never saturated)."""
    return (tl.abs(x) <= F32_MAX) & (y == y)


@triton.jit
def _to_fp8_or_nan(y, keep, FP8: tl.constexpr):
    """y (on the FP8 grid) converted to the FP8 dtype where ``keep``, NaN (the byte 0x7F, what torch's
    conversion gives a NaN in both formats) elsewhere. Chosen on the bytes: a float max/min may drop a
    NaN, the hardware's conversion saturates inf, and the interpreter's turns a NaN into a number."""
    byte = tl.where(keep, y.to(FP8).to(tl.uint8, bitcast=True), 0x7F).to(tl.uint8)
    return byte.to(FP8, bitcast=True)


@triton.jit
def _amax_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(partial_ptr + tl.program_id(0), tl.max(tl.abs(x), axis=0))


@triton.jit
def _quantize_kernel(x_ptr, q_ptr, inv_scale_ptr, partial_ptr, n, FMAX: tl.constexpr, MBITS: tl.constexpr,
                     EMIN: tl.constexpr, WRITE_AMAX: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    y = x * tl.load(inv_scale_ptr)
    keep = _finite_product(x, y)
    y = _round_to_fp8_grid(tl.minimum(tl.maximum(tl.where(keep, y, 0.0), -FMAX), FMAX), MBITS, EMIN)
    tl.store(q_ptr + offs, _to_fp8_or_nan(y, keep, q_ptr.dtype.element_ty), mask=ok)
    if WRITE_AMAX:
        tl.store(partial_ptr + tl.program_id(0), tl.max(tl.abs(x), axis=0))


@triton.jit
def _dequantize_kernel(q_ptr, scale_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    q = tl.load(q_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (q * tl.load(scale_ptr)).to(out_ptr.dtype.element_ty), mask=ok)


def _check_block(block: int) -> None:
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 1, got {block}")


def amax(x: torch.Tensor, block: int = DEFAULT_BLOCK, num_warps: int = DEFAULT_WARPS) -> torch.Tensor:
    """max |x| as a float32 0-d tensor on x's device (one pass; the partial maxima reduced by torch)."""
    check_tensor(x, "x", HALF_AND_FLOAT)
    check_device(_amax_kernel, x=x)
    _check_block(block)
    x = contiguous(x)
    n_prog = triton.cdiv(x.numel(), block)
    partial = torch.empty(n_prog, dtype=torch.float32, device=x.device)
    _amax_kernel[(n_prog,)](x, partial, x.numel(), BLOCK=block, num_warps=num_warps)
    return partial.amax()


def _quantize(x, inv_scale, fmt, write_amax, block, num_warps):
    dtype, fmax = fp8_format(fmt)
    mbits, emin = _GRID[fmt]
    x = contiguous(x)
    n_prog = triton.cdiv(x.numel(), block)
    q = torch.empty(x.shape, dtype=dtype, device=x.device)
    partial = torch.empty(n_prog if write_amax else 1, dtype=torch.float32, device=x.device)
    _quantize_kernel[(n_prog,)](x, q, inv_scale, partial, x.numel(), FMAX=fmax, MBITS=mbits, EMIN=emin,
                                WRITE_AMAX=write_amax, BLOCK=block, num_warps=num_warps)
    return q, (partial.amax() if write_amax else None)


def quantize_fp8(x: torch.Tensor, fmt: str = "e4m3", block: int = DEFAULT_BLOCK,
                 num_warps: int = DEFAULT_WARPS) -> tuple[torch.Tensor, torch.Tensor]:
    """Current-amax per-tensor quantization: (q, scale) with x ~= q.float() * scale.

    x: float16/bfloat16/float32, any shape. q: float8_e4m3fn ("e4m3") or float8_e5m2 ("e5m2"),
    shape of x; scale: float32 0-d tensor on x's device. Equal to ``sparsity_lab.references.fp8.quantize_fp8``.
    """
    fp8_format(fmt)
    check_tensor(x, "x", HALF_AND_FLOAT)
    check_device(_quantize_kernel, x=x)
    _check_block(block)
    scale, inv_scale = scales_from_amax(amax(x, block, num_warps), fmt)
    q, _ = _quantize(x, inv_scale, fmt, False, block, num_warps)
    return q, scale


def quantize_fp8_with_scale(x: torch.Tensor, inv_scale: torch.Tensor, fmt: str = "e4m3", block: int = DEFAULT_BLOCK,
                            num_warps: int = DEFAULT_WARPS) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass: q = fp8(clamp(x * inv_scale)) with a given (e.g. last step's) scale, and amax(x).

    inv_scale: float32 0-d tensor on x's device (``fp8_max / amax``). Returns (q, amax of x).
    """
    fp8_format(fmt)
    check_tensor(x, "x", HALF_AND_FLOAT)
    if not isinstance(inv_scale, torch.Tensor) or inv_scale.numel() != 1 or inv_scale.dtype != torch.float32:
        raise TypeError("inv_scale must be a float32 tensor with one element (fp8_max / amax)")
    check_device(_quantize_kernel, x=x, inv_scale=inv_scale)
    _check_block(block)
    return _quantize(x, inv_scale.reshape(()), fmt, True, block, num_warps)


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32,
                   block: int = DEFAULT_BLOCK, num_warps: int = DEFAULT_WARPS) -> torch.Tensor:
    """x_hat = q * scale (float32 product) as ``dtype``."""
    check_tensor(q, "q", (torch.float8_e4m3fn, torch.float8_e5m2))
    if dtype not in HALF_AND_FLOAT:
        raise TypeError(f"dtype must be float16, bfloat16 or float32, got {dtype}")
    if not isinstance(scale, torch.Tensor) or scale.numel() != 1 or scale.dtype != torch.float32:
        raise TypeError("scale must be a float32 tensor with one element (amax / fp8_max)")
    check_device(_dequantize_kernel, q=q, scale=scale)
    _check_block(block)
    q = contiguous(q)
    out = torch.empty(q.shape, dtype=dtype, device=q.device)
    _dequantize_kernel[(triton.cdiv(q.numel(), block),)](q, scale.reshape(()), out, q.numel(), BLOCK=block,
                                                        num_warps=num_warps)
    return out
