"""Kernel 7: FP8 per-tensor quantization (amax, scale, cast to E4M3/E5M2) and dequantization.

The idea
    ``sparsity_lab.references.fp8`` is the reference and fixes the convention: ``scale = amax / fp8_max``
    (what ``torch._scaled_mm`` takes), ``q = fp8(clamp(x * (fp8_max / amax)))``, ``x ~= q * scale``, and
    NaN for an x that is not finite (``_finite_product``, ``_fp8_byte``).

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
    format's smallest normal exponent)), and the byte is assembled from that value's bits. The
    interpreter needs this: triton 3.9's interpreter carries mantissa overflow wrongly in fp32 -> fp8
    casts (124.8 became 64 instead of 128). A compiled kernel lets the GPU convert instead
    (``HARDWARE_FP8_CAST``): ``cvt.rn.satfinite`` (sm_89 and later) rounds to nearest even and
    saturates to the format's largest finite value, the same byte in one instruction instead of about
    thirty (``benchmarks.sass_counts`` counts them).

Bytes (x of dtype size s, numel n)
    amax: read s n.  quantize: read s n, write n.  current scaling in all: read 2 s n, write n.
    dequantize: read n, write s n.
"""
from __future__ import annotations

import functools
import os

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


def _interpreting() -> bool:
    """Whether Triton runs kernels through its CPU interpreter (TRITON_INTERPRET, read as Triton reads it)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


# Compiled kernels convert with the GPU's instruction; the interpreter rounds in float32 (module docstring).
HARDWARE_FP8_CAST = tl.constexpr(not _interpreting())
MIN_FP8_CAPABILITY = (8, 9)  # cvt.rn.satfinite.{e4m3,e5m2}x2.f32: Ada and Hopper onwards


@functools.lru_cache(maxsize=None)
def _fp8_conversion_problem(index: int) -> str | None:
    """Why GPU ``index`` cannot run the compiled FP8 casts, or None (asked once per GPU: launches call it)."""
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) >= MIN_FP8_CAPABILITY:
        return None
    return (f"the FP8 kernels need a GPU of compute capability 8.9 or later (its FP8 conversion instruction); "
            f"{torch.cuda.get_device_name(index)} is {major}.{minor}")


def check_fp8_device(device: torch.device) -> None:
    """A compiled FP8 cast needs the GPU's FP8 conversion (compute capability 8.9 or later)."""
    if device.type == "cuda":
        problem = _fp8_conversion_problem(device.index if device.index is not None else torch.cuda.current_device())
        if problem:
            raise RuntimeError(problem)


@triton.jit
def _hardware_fp8_byte(y, MBITS: tl.constexpr):
    """The FP8 byte of float32 y by the GPU's conversion: round to nearest even, saturated to the largest
    finite value, -0.0 kept (int32, 0..255). MBITS 3: E4M3, 2: E5M2."""
    if MBITS == 3:
        asm: tl.constexpr = "{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, $1, $1; cvt.u32.u16 $0, t; }"
    else:
        asm: tl.constexpr = "{ .reg .b16 t; cvt.rn.satfinite.e5m2x2.f32 t, $1, $1; cvt.u32.u16 $0, t; }"
    both = tl.inline_asm_elementwise(asm, "=r,r", [y], dtype=tl.int32, is_pure=True, pack=1)
    return both & 0xFF  # both halves hold the same byte


@triton.jit
def _fp8_byte(y, keep, FMAX: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr):
    """The FP8 byte (uint8) of float32 y = x * inv_scale: clamped to +-FMAX, rounded to nearest even, -0.0
    kept as the sign bit alone, where ``keep``; 0x7F (NaN in both formats, as torch's conversion gives it)
    elsewhere. Chosen on the bytes: a float max/min may drop a NaN and the conversion saturates inf.

    Compiled: the GPU's conversion. Interpreted: y rounded on the FP8 grid in float32 and the byte
    assembled with integer ops (sign, exponent rebiased to 1 - EMIN, the top MBITS of the mantissa;
    subnormals as multiples of 2**(EMIN - MBITS))."""
    y = tl.where(keep, y, 0.0)
    if HARDWARE_FP8_CAST:
        byte = _hardware_fp8_byte(y, MBITS)
    else:
        r = _round_to_fp8_grid(tl.minimum(tl.maximum(y, -FMAX), FMAX), MBITS, EMIN)
        bits = r.to(tl.int32, bitcast=True)
        sign = ((bits >> 31) & 1) << 7
        e = ((bits >> 23) & 0xFF) - 127
        normal = (((e + 1 - EMIN) << MBITS) | ((bits >> (23 - MBITS)) & ((1 << MBITS) - 1)))
        subnormal = (tl.abs(r) * (1 << (MBITS - EMIN))).to(tl.int32)  # exact: r is on the subnormal grid
        byte = sign | tl.where(e >= EMIN, normal, subnormal)
    return tl.where(keep, byte, 0x7F).to(tl.uint8)


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
    byte = _fp8_byte(y, _finite_product(x, y), FMAX, MBITS, EMIN)
    tl.store(q_ptr + offs, byte.to(q_ptr.dtype.element_ty, bitcast=True), mask=ok)
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
    check_fp8_device(x.device)
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
