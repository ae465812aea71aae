"""Kernel 18: a step's FP8 2:4 weight operands, q(S(W)) and q(S(W))^T, compressed straight from W.

The idea
    The FP8 2:4 backend needs, every optimizer step, S(W) cast to E4M3 with the weight's per-tensor
    scale and compressed twice (as it is for the forward, transposed for the input gradient). Unfused
    that is four passes: the soft threshold writes S(W) in bfloat16, the cast reads it and writes
    q(S(W)) (returning its amax for the scaling recipe), and ``compress24`` reads q twice. Kernel 11
    (``prepare24``) already computes S in registers from a 64 x 64 tile of W and the mask and stores
    it compressed in both forms; here it also casts S to FP8 before the stores (the same arithmetic as
    ``quantize_fp8_with_scale``: S rounded to the operand dtype first, times ``inv_scale``, clamped,
    rounded to the FP8 grid) and writes one amax per program. The dense S(W) and q(S(W)) never exist.

    With a scale known before the pass (delayed scaling) that is one pass. Current scaling needs the
    amax of S(W) before the first cast: ``prepare24_amax`` is the same kernel writing only the amax
    (one read of W and the mask), then ``prepare24_fp8`` with the scale made from it.

    The bytes equal the unfused path's (tested): ``compress24(q)`` and ``compress24(q.t())`` with
    ``q, amax = quantize_fp8_with_scale(S, inv_scale)``, S = ``soft_threshold24(w, mask, beta,
    out_dtype=dtype)`` (S-STE) or ``w.to(dtype) * mask`` (the STE family).

Bytes (W of O x I elements, weight element size s)
    read ``s O I`` (W) + ``O I`` (mask); write ``2 * (O I / 2 + O I / 8)`` (two compressed FP8 forms).
    Unfused, with bfloat16 S: ``(s + 1 + 2) O I`` (threshold) + ``3 O I`` (cast) + ``2 * (1 + 1 / 2 + 1 / 8)
    O I`` (two compressions): for float32 W 13.25 bytes per element against 6.25 here.
"""
from __future__ import annotations

import torch

from sparsity_lab.references.fp8 import fp8_format

from ._common import check_device
from .fp8_cast import _GRID, check_fp8_device
from .prepare24 import TILE, _TL_DTYPES, _prepare24_kernel, check_weight_mask_beta



def _launch(w, mask, beta, dtype, inv_scale, fmt, forward, transposed, num_warps):
    """Run kernel 11 in its FP8 mode; returns (forward form or None, transposed form or None, amax)."""
    from sparsity_lab.references import cusparselt_layout as layout

    rows, cols = w.shape
    fp8_dtype, fmax = fp8_format(fmt)
    mbits, emin = _GRID[fmt]
    mask_u8 = mask.contiguous().view(torch.uint8)
    beta_t = beta.reshape(()).float() if beta is not None else w
    grid = (rows // TILE, cols // TILE)
    partial = torch.empty(grid[0] * grid[1], dtype=torch.float32, device=w.device)

    def empty(r: int, c: int):
        out = torch.empty(layout.compressed_shape(r, c, fp8_dtype), dtype=fp8_dtype, device=w.device)
        flat = out.view(torch.uint8).reshape(-1)
        return out, flat[:r * c // 2], flat[r * c // 2:]

    fwd, fwd_vals, fwd_meta = empty(rows, cols) if forward else (None, mask_u8, mask_u8)
    bwd, bwd_vals, bwd_meta = empty(cols, rows) if transposed else (None, mask_u8, mask_u8)
    if inv_scale is not None:
        check_fp8_device(w.device)
    _prepare24_kernel[grid](
        w, mask_u8, beta_t, fwd_vals, fwd_meta, bwd_vals, bwd_meta,
        inv_scale if inv_scale is not None else partial, partial, w.stride(0), w.stride(1), rows, cols,
        SOFT=beta is not None, WRITE_W=forward, WRITE_T=transposed, OUT_DTYPE=_TL_DTYPES[dtype],
        FP8=inv_scale is not None, WRITE_AMAX=True, FMAX=fmax, MBITS=mbits, EMIN=emin,
        SIGN_OFF=0x7F, TILE_COLS=64, num_warps=num_warps)
    return fwd, bwd, partial.amax()


def prepare24_fp8(w: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | float | None, inv_scale: torch.Tensor,
                  dtype: torch.dtype = torch.bfloat16, forward: bool = True,
                  transposed: bool = True, num_warps: int = 4
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """Compressed q(S(W)) and q(S(W))^T in cuSPARSELt's FP8 layout, and amax(S(W)), in one pass over W.

    w: (out, in) float32 / bfloat16 / float16, any strides; out and in multiples of 64. mask: bool
    (out, in), transposable 2:4 (not checked). beta: None (STE family: ``w.to(dtype) * mask``) or the
    S-STE scale (``beta * soft_threshold(w, mask)``). inv_scale: float32 one-element tensor on w's
    device, ``fp8_max / amax`` (read on the device). dtype: what S is rounded to before the cast
    (the layer's compute dtype). forward / transposed: which forms to write (the other is None).
    The format is E4M3: cuSPARSELt takes no E5M2 operand.

    Returns ``(compress24(q), compress24(q.t()), amax)`` with ``q, amax = quantize_fp8_with_scale(S,
    inv_scale, "e4m3")``, bit for bit; amax is a float32 0-d tensor.
    """
    beta = check_weight_mask_beta(w, mask, beta, dtype, "dtype")
    if not isinstance(inv_scale, torch.Tensor) or inv_scale.numel() != 1 or inv_scale.dtype != torch.float32:
        raise TypeError("inv_scale must be a float32 tensor with one element (fp8_max / amax)")
    check_device(_prepare24_kernel, w=w, inv_scale=inv_scale)
    if not (forward or transposed):
        raise ValueError("nothing to write: forward and transposed are both False")
    return _launch(w, mask, beta, dtype, inv_scale.reshape(()), "e4m3", forward, transposed, num_warps)


def prepare24_amax(w: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | float | None,
                   dtype: torch.dtype = torch.bfloat16, num_warps: int = 4) -> torch.Tensor:
    """amax(S(W)) (S rounded to ``dtype``) as a float32 0-d tensor, from one read of W and the mask:
    the first pass of current scaling. Arguments as :func:`prepare24_fp8`."""
    beta = check_weight_mask_beta(w, mask, beta, dtype, "dtype")
    return _launch(w, mask, beta, dtype, None, "e4m3", False, False, num_warps)[2]
