"""Kernel 25: the end-of-step update of an FP8 layer's scaling state in one launch.

The idea
    ``FP8ScalingState.advance`` (``sparsity_lab/methods/fp8_scaling.py``, the reference) turns the amax
    history into the next scales and rolls the history: about two dozen small PyTorch operations on
    tensors of 4 to 64 floats. Each is a kernel launch, so for the lab GPT's 32 FP8 layers that is some
    700 launches a step, milliseconds of host time in an eager step whose host could barely keep the GPU fed
    (docs/measuring.md, the FP8 step's host time). Here one program does the whole update for one
    layer: it reads the history (L, 4), writes the scales and the rolled history. The bytes are a few
    hundred; the launch is the cost.

    The arithmetic is the reference's, to the bit:

    * amax per column over the window (``amax_compute="max"``, NaN if any entry is NaN, as ``torch.amax``)
      or row 0 (``"most_recent"``); a column is usable when its amax is finite and > 0;
    * "pass" (``LAG`` 0): ``scale = amax / fp8_max * 2**margin`` (two IEEE roundings, as in float32 torch),
      kept where not usable; ``inv_scale = 1 / scale`` (IEEE division);
    * "host_alpha" (``LAG`` 1): ``scale <- next_scale``, ``inv_scale = 1 / scale`` (exact: a power of two), then
      ``next_scale = 2**ceil(log2(amax / fp8_max)) * 2**margin`` where usable (``pow2_scale``), on the
      float32 bits: the exponent of ``r = amax / fp8_max``, plus one unless r is a power of two, plus the
      margin; subnormal, overflowing and underflowed (r = 0) cases as ``frexp`` and ``ldexp`` give them;
    * the history rolled up one row (``torch.roll(-1)``) and row 0 zeroed.

Bytes: read ``4 L + 12`` floats, write ``4 L + 12``: nothing; the launch is the cost.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_device

COLUMNS = 4  # x, w, dz, dz_mvue (``fp8_scaling.TENSORS``)


@triton.jit
def _pow2_at_or_above(r, MARGIN: tl.constexpr):
    """2**ceil(log2(r)) * 2**MARGIN for float32 r >= 0 finite, as ``pow2_scale`` computes it with frexp and ldexp:
    the result's float32 bits from r's exponent (a subnormal r's from its mantissa's leading bit; r = 0, an
    amax / fp8_max that underflowed, gives 2**MARGIN as frexp's exponent 0 does)."""
    bits = r.to(tl.int32, bitcast=True)
    field = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    # a subnormal r = mant * 2**-149: the exponent of mant as a float (exact: mant < 2**23) gives its leading bit
    lead = tl.maximum(((mant.to(tl.float32).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, 0)
    e = tl.where(field > 0, field - 127, lead - 149)  # r = 1.f * 2**e
    frac = tl.where(field > 0, mant, mant ^ (1 << lead))  # r's bits below its leading one
    k = e + (frac != 0).to(tl.int32) + MARGIN
    k = tl.where(bits == 0, MARGIN, k)  # amax / fp8_max underflowed to 0: frexp gives exponent 0, so 2**margin
    # shifts clamped into range: the lanes that would overflow them are not selected
    normal = (tl.minimum(tl.maximum(k, -126), 127) + 127) << 23
    subnormal = 1 << tl.minimum(tl.maximum(k + 149, 0), 22)
    out = tl.where(k > 127, 0x7F800000, tl.where(k >= -126, normal, tl.where(k >= -149, subnormal, 0)))
    return out.to(tl.float32, bitcast=True)


@triton.jit
def _scale_update_kernel(hist_ptr, fmax_ptr, scale_ptr, inv_ptr, next_ptr, L: tl.constexpr, ROWS: tl.constexpr,
                         MOST_RECENT: tl.constexpr, LAG: tl.constexpr, MARGIN: tl.constexpr):
    rows = tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, 4)[None, :]
    inside = (rows < L) & (cols < 4)
    h = tl.load(hist_ptr + rows * 4 + cols, mask=inside, other=0.0)  # (ROWS, 4); amaxes are >= 0
    shifted = tl.load(hist_ptr + ((rows + 1) % L) * 4 + cols, mask=inside, other=0.0)  # torch.roll(-1)
    c = tl.arange(0, 4)
    if MOST_RECENT:
        a = tl.load(hist_ptr + c)
    else:
        nan = tl.max((h != h).to(tl.int32), axis=0) > 0
        a = tl.where(nan, float("nan"), tl.max(h, axis=0))
    usable = (a > 0) & (a < float("inf"))  # false for NaN
    safe = tl.where(usable, a, 1.0)
    fmax = tl.load(fmax_ptr + c)
    if LAG:
        old_next = tl.load(next_ptr + c)
        tl.store(scale_ptr + c, old_next)
        tl.store(inv_ptr + c, tl.math.div_rn(tl.full([4], 1.0, tl.float32), old_next))
        tl.store(next_ptr + c, tl.where(usable, _pow2_at_or_above(tl.math.div_rn(safe, fmax), MARGIN), old_next))
    else:
        new = tl.math.div_rn(safe, fmax) * (2.0 ** MARGIN)
        scale = tl.where(usable, new, tl.load(scale_ptr + c))
        tl.store(scale_ptr + c, scale)
        tl.store(inv_ptr + c, tl.math.div_rn(tl.full([4], 1.0, tl.float32), scale))
    tl.debug_barrier()  # every row read before any is overwritten
    tl.store(hist_ptr + rows * 4 + cols, tl.where(rows == 0, 0.0, shifted), mask=inside)


def _check_vector(t, name: str, device) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.shape != (COLUMNS,) or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous float32 tensor of shape ({COLUMNS},), got "
                         f"{getattr(t, 'dtype', type(t))} {tuple(getattr(t, 'shape', ()))}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the history on {device}")


def fp8_scale_update_(history: torch.Tensor, fp8_max: torch.Tensor, scale: torch.Tensor, inv_scale: torch.Tensor,
                      next_scale: torch.Tensor | None = None, most_recent: bool = False, margin: int = 0) -> None:
    """In place, one launch: ``FP8ScalingState.advance``'s device work (the module docstring says what).

    history: (L, 4) contiguous float32 amax history (row 0 the step that ends). fp8_max, scale, inv_scale:
    (4,) float32. next_scale: (4,) float32 for the "host_alpha" recipe (scale <- next_scale, next_scale <- the
    power of two of the window's amax), None for "pass". most_recent: ``amax_compute="most_recent"``.
    margin: the recipe's int >= 0."""
    if not isinstance(history, torch.Tensor) or history.dtype != torch.float32 or history.dim() != 2 \
            or history.shape[1] != COLUMNS or history.shape[0] < 1 or not history.is_contiguous():
        raise ValueError(f"history must be a contiguous float32 (L, {COLUMNS}) tensor with L >= 1, got "
                         f"{getattr(history, 'dtype', type(history))} {tuple(getattr(history, 'shape', ()))}")
    for t, name in ((fp8_max, "fp8_max"), (scale, "scale"), (inv_scale, "inv_scale")):
        _check_vector(t, name, history.device)
    if next_scale is not None:
        _check_vector(next_scale, "next_scale", history.device)
    if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
        raise ValueError(f"margin must be an int >= 0, got {margin!r}")
    check_device(_scale_update_kernel, history=history)
    rows = history.shape[0]
    _scale_update_kernel[(1,)](history, fp8_max, scale, inv_scale, next_scale if next_scale is not None else scale,
                               L=rows, ROWS=max(triton.next_power_of_2(rows), 2), MOST_RECENT=bool(most_recent),
                               LAG=next_scale is not None, MARGIN=margin, num_warps=1)
