"""FP8 per-tensor quantization with current-amax scaling: the plain PyTorch reference.

S-STE's FP8 recipe (docs/algorithms.md, "FP8 per-tensor scaling"): forward product in E4M3 (X and W),
backward products in E5M2, one scale per tensor from the tensor's current ``amax = max |x|``,
float32 accumulation.

Scale convention (the one ``torch._scaled_mm`` takes for ``scale_a`` / ``scale_b``):

    scale     = amax / fp8_max              (the dequantization scale, float32)
    q         = fp8( clamp(x * (fp8_max / amax), -fp8_max, fp8_max) )     round to nearest even
    x ~= q * scale

so the largest magnitude of x lands on the largest finite FP8 value. E4M3 (``float8_e4m3fn``) has
max 448 and 3 mantissa bits (more precision, forward); E5M2 (``float8_e5m2``) max 57344 and 2 mantissa
bits (more range, gradients). ``amax == 0`` (an all-zero tensor) is treated as ``amax = 1e-12``
so that the scale stays finite and q = 0. ``inv_scale = fp8_max / amax`` is computed once in float32
and multiplied (never divided per element), so kernels reproduce q bit for bit.

Non-finite inputs: an entry of x that is +-inf or NaN quantizes to NaN, whatever the scale (both FP8
formats, current and delayed scaling, here and in every FP8 cast kernel). The clamp saturates finite
values only: an overflow upstream must stay visible downstream (NaN products, a non-finite loss or
gradient norm that stops training), never become +-fp8_max. With current scaling such a tensor's amax is
itself not finite, so its scale is too and every product with it is NaN; with delayed scaling (a scale
from the history) the NaN stays in the entries the non-finite values reach.
"""
from __future__ import annotations

import torch

FP8_FORMATS: dict[str, tuple[torch.dtype, float]] = {
    "e4m3": (torch.float8_e4m3fn, 448.0),
    "e5m2": (torch.float8_e5m2, 57344.0),
}
AMAX_FLOOR = 1e-12


def fp8_format(fmt: str) -> tuple[torch.dtype, float]:
    """(torch dtype, largest finite value) of "e4m3" or "e5m2"."""
    if fmt not in FP8_FORMATS:
        raise ValueError(f"fmt must be one of {sorted(FP8_FORMATS)}, got {fmt!r}")
    return FP8_FORMATS[fmt]


def amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| as a float32 0-d tensor on x's device."""
    return x.detach().abs().amax().float()


def scales_from_amax(a: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, inv_scale) float32 0-d tensors: scale = amax / fp8_max, inv_scale = fp8_max / amax."""
    _, fmax = fp8_format(fmt)
    a = a.float().clamp_min(AMAX_FLOOR)
    return a / fmax, fmax / a


def quantize_with_inv_scale(x: torch.Tensor, inv_scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """q = fp8(clamp(x * inv_scale, -fp8_max, fp8_max)) (float32 product, round to nearest even); NaN where
    x is not finite (module docstring: an overflow upstream is never saturated to a finite value)."""
    dtype, fmax = fp8_format(fmt)
    y = (x.float() * inv_scale.float()).clamp(-fmax, fmax)
    return torch.where(torch.isfinite(x), y, torch.nan).to(dtype)


def quantize_fp8(x: torch.Tensor, fmt: str = "e4m3") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor current-amax quantization: returns (q, scale) with x ~= q.float() * scale."""
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise TypeError(f"x must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    scale, inv_scale = scales_from_amax(amax(x), fmt)
    return quantize_with_inv_scale(x, inv_scale, fmt), scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x_hat = q * scale (float32 product), cast to ``dtype``."""
    if q.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"q must be float8_e4m3fn or float8_e5m2, got {q.dtype}")
    return (q.float() * scale.float()).to(dtype)
