"""Kernel 24: a step's mask refresh in one pass over W, its operands in CUTLASS's SM90 layout (bf16 or E4M3).

The idea
    The CUTLASS backends (``backends/cutlass``) refresh a transposable mask every step with kernel 2 (read W,
    write the new mask), kernel 9 (read both masks, count the flips), a copy of the new mask into the layer's
    buffer and kernel 22 (read W and the mask again, write S(W) and S(W)^T compressed in CUTLASS's layout).
    Kernel 21 (``refresh24.py``) does that chain in one pass for cuSPARSELt's layout; this is kernel 21's
    program with kernel 22's stores:

    * one program owns a 64 x 64 block of W, held as the 16 entries w{r}{c} (each (16, 16)) of its 4x4
      tiles (``_load_block``; kernel 21's ``_refresh_block`` does this and the next two points); the mask is kernel 2's search (``_pattern_code``: the 90 patterns, float32
      scores, power-of-two tile scaling, lowest-index ties), so it is kernel 2's bit for bit;
    * the flips against the mask stored now go to one int64 device counter and the new mask is written over
      the old one, in place, as int32 words (``_refresh_mask_words``, kernel 21's);
    * S is kernel 11's arithmetic on the same values (``_block_values``): ``beta * soft_threshold(w, m)``
      (S-STE) or ``w.to(dtype) * m``, rounded once to ``dtype``; for E4M3 cast with the given ``inv_scale``
      (``_operand_bits``, kernel 18's cast) and the block's amax of S written for the wrapper's reduction;
    * the operands are stored with kernel 22's choices and layout (``_pick_cutlass``: +0.0 in a zero slot,
      code 0 for an empty group; ``_store_cutlass``): S(W) one row slice at a time (rows r0 + 4a + r: the
      tiles' rows are groups along ``in``), S(W)^T one column slice at a time (W's column c0 + 4b + c is row
      c0 + 4b + c of S(W)^T, its groups the tiles' columns) through a (16, 16) register transpose.

    The result equals ``transposable_mask24(w, pruned=False)`` -> ``count_flips(old, new)`` ->
    ``mask.copy_(new)`` -> ``prepare24_cutlass(w, mask, beta)`` (or ``prepare24_cutlass_fp8(w, mask, beta,
    inv_scale, dtype)``), tested bit for bit. E4M3 needs the scale before the pass: with delayed scaling it
    is the recipe's; current scaling needs amax(S) of the new mask first (kernel 22's amax pass after the
    refresh), which this kernel cannot give.

Shapes
    W (out, in), any strides: out and in multiples of 4 (whole 4x4 tiles), and for each form written its k
    (``in`` for S(W), ``out`` for S(W)^T) a multiple of 16 (bf16) or 32 (E4M3), kernel 22's rule. Blocks
    past W's edge are masked (zeros there: no kept entry, codes 0); the grid covers the metadata's padding
    (rows to 64, columns to 128) as kernel 22's does, so every byte of the outputs is written once.

Bytes (W of O x I elements n, element size s; operand element size p: 2 for bf16, 1 for E4M3)
    read ``s n`` (W) + ``n`` (previous mask); write ``n`` (new mask) + ``2 (p n / 2 + n / 8)`` (two compressed
    forms, plus the metadata's padding). bf16 W, bf16 operands: 6.25 bytes per element, against 12.25 for
    the chain (kernel 2: 3n, kernel 9: 2n, the mask copy: 2n, kernel 22: 5.25n); E4M3: 5.25 against 11.25.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import HALF_AND_FLOAT, check_tensor
from .fp8_cast import check_fp8_device
from .prepare24 import _TL_DTYPES, _groups_amax, _operand_bits, check_weight_mask_beta
from .prepare24_cutlass import (_check_forms, _grid, _pick_cutlass, _store_cutlass, check_inv_scale, empty_forms,
                                fp8_constexprs)
from .refresh24 import _refresh_block, check_mask_in_place

DEFAULT_WARPS = 4


@triton.jit
def _store_slice(vals_ptr, meta_ptr, row0, g0, x0, x1, x2, x3, n_rows, n_cols, TRANSPOSE: tl.constexpr,
                 FP8: tl.constexpr, SIGN_OFF: tl.constexpr):
    """One slice of an (n_rows, n_cols) operand: groups x0..x3 (raw bits, each (16, 16), [a, b]) of rows
    row0 + 4a, groups g0 + b; TRANSPOSE: of rows row0 + 4b, groups g0 + a. CUTLASS's choice, then its layout."""
    v0, v1, code = _pick_cutlass(x0, x1, x2, x3, SIGN_OFF)
    if TRANSPOSE:
        v0 = tl.trans(v0)
        v1 = tl.trans(v1)
        code = tl.trans(code)
    _store_cutlass(vals_ptr, meta_ptr, row0, g0, v0, v1, code, n_rows, n_cols, FP8, 16, 16, 4)


@triton.jit
def _refresh24_cutlass_kernel(w_ptr, mask_ptr, beta_ptr, flips_ptr, vals_ptr, meta_ptr, vals_t_ptr, meta_t_ptr,
                              inv_scale_ptr, partial_ptr, stride_r, stride_c, n_rows, n_cols,
                              SOFT: tl.constexpr, COUNT: tl.constexpr, WRITE_W: tl.constexpr, WRITE_T: tl.constexpr,
                              OUT_DTYPE: tl.constexpr, EDGE: tl.constexpr, FP8: tl.constexpr, FMAX: tl.constexpr,
                              MBITS: tl.constexpr, EMIN: tl.constexpr, SIGN_OFF: tl.constexpr):
    # EDGE: some block reaches past W (a partial block, or one that only writes the metadata's padding)
    r0 = tl.program_id(0) * 64
    c0 = tl.program_id(1) * 64
    s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33 = _refresh_block(
        w_ptr, mask_ptr, beta_ptr, flips_ptr, r0, c0, stride_r, stride_c, n_rows, n_cols, SOFT, COUNT, OUT_DTYPE,
        EDGE)
    if FP8:  # the block's amax of S (zeros outside W), reduced by the wrapper: what the recipe records
        a = tl.maximum(tl.maximum(_groups_amax(s00, s01, s02, s03), _groups_amax(s10, s11, s12, s13)),
                       tl.maximum(_groups_amax(s20, s21, s22, s23), _groups_amax(s30, s31, s32, s33)))
        tl.store(partial_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), a)
    b00, b01, b02, b03 = _operand_bits(s00, s01, s02, s03, inv_scale_ptr, FP8, FMAX, MBITS, EMIN)
    b10, b11, b12, b13 = _operand_bits(s10, s11, s12, s13, inv_scale_ptr, FP8, FMAX, MBITS, EMIN)
    b20, b21, b22, b23 = _operand_bits(s20, s21, s22, s23, inv_scale_ptr, FP8, FMAX, MBITS, EMIN)
    b30, b31, b32, b33 = _operand_bits(s30, s31, s32, s33, inv_scale_ptr, FP8, FMAX, MBITS, EMIN)
    if WRITE_W:  # S(W): row slice r is rows r0 + 4a + r, groups c0 / 4 + b
        _store_slice(vals_ptr, meta_ptr, r0, c0 // 4, b00, b01, b02, b03, n_rows, n_cols, False, FP8, SIGN_OFF)
        _store_slice(vals_ptr, meta_ptr, r0 + 1, c0 // 4, b10, b11, b12, b13, n_rows, n_cols, False, FP8, SIGN_OFF)
        _store_slice(vals_ptr, meta_ptr, r0 + 2, c0 // 4, b20, b21, b22, b23, n_rows, n_cols, False, FP8, SIGN_OFF)
        _store_slice(vals_ptr, meta_ptr, r0 + 3, c0 // 4, b30, b31, b32, b33, n_rows, n_cols, False, FP8, SIGN_OFF)
    if WRITE_T:  # S(W)^T: column slice c is rows c0 + 4b + c, groups r0 / 4 + a
        _store_slice(vals_t_ptr, meta_t_ptr, c0, r0 // 4, b00, b10, b20, b30, n_cols, n_rows, True, FP8, SIGN_OFF)
        _store_slice(vals_t_ptr, meta_t_ptr, c0 + 1, r0 // 4, b01, b11, b21, b31, n_cols, n_rows, True, FP8,
                     SIGN_OFF)
        _store_slice(vals_t_ptr, meta_t_ptr, c0 + 2, r0 // 4, b02, b12, b22, b32, n_cols, n_rows, True, FP8,
                     SIGN_OFF)
        _store_slice(vals_t_ptr, meta_t_ptr, c0 + 3, r0 // 4, b03, b13, b23, b33, n_cols, n_rows, True, FP8,
                     SIGN_OFF)


def _checked(w, mask, beta, dtype, dtype_name, operand_dtype, forward, transposed):
    """The checks both wrappers share; returns beta as a float tensor on w's device (or None)."""
    check_tensor(w, "w", HALF_AND_FLOAT)
    if w.dim() == 2 and (w.shape[0] % 4 or w.shape[1] % 4):
        raise ValueError(f"w has shape {tuple(w.shape)}; out and in must be multiples of 4 (whole 4x4 tiles of the "
                         "transposable mask)")
    beta = check_weight_mask_beta(w, mask, beta, dtype, dtype_name, whole_tiles=False)
    check_mask_in_place(mask)
    _check_forms(w, operand_dtype, forward, transposed)
    return beta


def _launch(w, mask, beta, dtype, inv_scale, forward, transposed, count, num_warps):
    """Run kernel 24: bf16 forms (``inv_scale`` None) or E4M3 ones; returns (flips or None, forward (values,
    metadata) or None, transposed likewise or None, amax of S (E4M3) or None)."""
    rows, cols = w.shape
    fp8 = inv_scale is not None
    if fp8:
        check_fp8_device(w.device)
    grid = _grid(rows, cols, forward, transposed)
    edge = grid[0] * 64 != rows or grid[1] * 64 != cols
    flips = torch.zeros((), dtype=torch.int64, device=w.device) if count else None
    partial = torch.empty(grid[0] * grid[1] if fp8 else 1, dtype=torch.float32, device=w.device)
    fwd, bwd, form_args = empty_forms(rows, cols, fp8, forward, transposed, w.device)
    mask_words = mask.view(torch.int32)  # (out, in / 4): in is a multiple of 4
    _refresh24_cutlass_kernel[grid](
        w, mask_words, beta.reshape(()).float() if beta is not None else partial, flips if count else partial,
        *form_args, inv_scale if fp8 else partial, partial, w.stride(0), w.stride(1), rows, cols,
        SOFT=beta is not None, COUNT=count, WRITE_W=forward, WRITE_T=transposed, OUT_DTYPE=_TL_DTYPES[dtype],
        EDGE=edge, **fp8_constexprs(fp8), num_warps=num_warps)
    # the kernel wrote the mask in place: its version counter says so, as mask.copy_(new) would
    torch.autograd.graph.increment_version(mask)
    return flips, fwd, bwd, partial.amax() if fp8 else None


def refresh24_cutlass(w: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | float | None = None,
                      forward: bool = True, transposed: bool = True, count: bool = True,
                      num_warps: int = DEFAULT_WARPS):
    """The transposable 2:4 mask of ``w`` written into ``mask`` in place, its flips, and S(W), S(W)^T compressed
    in CUTLASS's SM90 layout (bfloat16), in one pass over W.

    w: (out, in) float32 / bfloat16 / float16, any strides; out and in multiples of 4, and of 16 where a form
    needs it (in for S(W), out for S(W)^T). mask: bool (out, in), contiguous, on a 4-byte boundary: the
    previous mask on entry, the new one on return. beta: None for ``w.to(bfloat16) * mask`` (STE family),
    else the S-STE scale (a float or a 0-d float tensor on w's device). forward / transposed: which forms to
    write (each may be left out, both too: then only the mask and its flips). count: count the flips.

    Returns ``(flips, fwd, bwd)``, the results of the chain::

        new = transposable_mask24(w, pruned=False)[0]
        flips = count_flips(mask, new)          # 0-d int64 on w's device; None when count=False
        mask.copy_(new)
        fwd, bwd = prepare24_cutlass(w, mask, beta, forward=forward, transposed=transposed)

    fwd, bwd: (values (m, k / 2) bfloat16, metadata uint8) as kernel 22 returns them, None where not asked.
    """
    beta = _checked(w, mask, beta, torch.bfloat16, "out_dtype", torch.bfloat16, forward, transposed)
    flips, fwd, bwd, _ = _launch(w, mask, beta, torch.bfloat16, None, forward, transposed, count, num_warps)
    return flips, fwd, bwd


def refresh24_cutlass_fp8(w: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | float | None,
                          inv_scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16, forward: bool = True,
                          transposed: bool = True, count: bool = True, num_warps: int = DEFAULT_WARPS):
    """:func:`refresh24_cutlass` with E4M3 operands: the mask in place, its flips, q(S(W)) and q(S(W))^T
    compressed in CUTLASS's SM90 E4M3 layout, and amax(S(W)), in one pass over W.

    Arguments as :func:`refresh24_cutlass`, with out / in multiples of 32 where a form needs it; inv_scale:
    float32 one-element tensor on w's device, ``fp8_max / amax`` (read on the device: the recipe's delayed
    scale); dtype: what S is rounded to before the cast (the layer's compute dtype, bfloat16 or float16).

    Returns ``(flips, fwd, bwd, amax)``: the chain kernel 2 -> ``count_flips`` -> the copy ->
    ``prepare24_cutlass_fp8(w, mask, beta, inv_scale, dtype, forward, transposed)``, bit for bit; amax a
    float32 0-d tensor (the amax of S of the new mask, in ``dtype``), also when neither form is written.
    """
    beta = _checked(w, mask, beta, dtype, "dtype", torch.float8_e4m3fn, forward, transposed)
    check_inv_scale(w, inv_scale)
    return _launch(w, mask, beta, dtype, inv_scale.reshape(()), forward, transposed, count, num_warps)
