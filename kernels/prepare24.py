"""Kernel 11: a step's sparse weight operands, S(W) and S(W)^T, straight into cuSPARSELt's layout.

The idea
    Every optimizer step the cuSPARSELt backend needs the masked weight in two compressed forms:
    S(W) (out, in), 2:4 along ``in``, for the forward product, and S(W)^T (in, out), 2:4 along
    ``out`` (the mask is transposable), for the input gradient. Unfused that is three passes:
    ``soft_threshold24`` (or ``W.to(dtype) * mask``) writes the dense S(W) in the product dtype,
    then ``compress24`` reads it twice, once as S(W) and once as its transposed view. Here one
    program loads a 64 x 64 tile of W and of the mask, computes S there, and stores it compressed
    twice: as it is (rows of S(W)) and transposed in registers (rows of S(W)^T). The dense S(W)
    never exists.

    S is exactly what the unfused path computes, so the bytes are identical (tested):
    * S-STE (``beta`` given): ``beta * m * sign(w) * max(|w| - t, 0)``, t the largest pruned ``|w|``
      of the group of 4 along the row, float32, one rounding to the product dtype
      (``soft_threshold24``'s arithmetic);
    * the STE family (``beta=None``): ``w.to(dtype) * m`` (a pruned negative weight is -0.0, as in
      PyTorch; the compressor ignores the sign of zero when it picks the kept entries).

    Kernel 18 (``prepare24_fp8.py``) runs this same program with ``FP8=True``: S is cast to FP8 with a
    given scale before the two stores (``_fp8_bits``), and each program writes the amax of its S.
    Kernel 22 (``prepare24_cutlass.py``) computes S with the same helpers (``_sparse_groups``,
    ``_operand_bits``, ``_groups_amax``) and stores it in CUTLASS's SM90 layout instead.

Bytes (W of O x I elements, weight element size s, product element size p = 2)
    read ``s O I`` (W) + ``O I`` (bool mask); write ``2 * (p O I / 2 + O I / 8)`` (two compressed
    forms). Unfused: ``(s + 1 + p) O I`` then ``2 * (p + p / 2 + 1 / 8) O I``: for bf16 weights
    11.25 bytes per element against 5.25 here.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import HALF_AND_FLOAT, check_device, check_same_shape, check_tensor
from .compress24 import _pick, _store_compressed
from .fp8_cast import _finite_product, _fp8_byte
from .soft_threshold24 import _shrink

TILE = 64


@triton.jit
def _split_groups(x):
    """A (64, 64) tile into its groups' four members along the columns, each (64, 16)."""
    even, odd = tl.split(tl.reshape(x, [64, 16, 2, 2]))
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


@triton.jit
def _join_groups(x0, x1, x2, x3):
    """The inverse of ``_split_groups``."""
    return tl.reshape(tl.join(tl.join(x0, x2), tl.join(x1, x3)), [64, 64])


@triton.jit
def _masked_values(w0, w1, w2, w3, k0, k1, k2, k3, beta, SOFT: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """S of groups of 4 along W's rows, members w0..w3 (any float dtype, any one shape) kept where k0..k3:
    ``beta * m * sign(w) * max(|w| - t, 0)`` (SOFT; beta a float32 scalar) or ``w * m``, computed in float32
    and rounded once to OUT_DTYPE (the module docstring gives the two formulas)."""
    if SOFT:
        f0 = w0.to(tl.float32)
        f1 = w1.to(tl.float32)
        f2 = w2.to(tl.float32)
        f3 = w3.to(tl.float32)
        # t = largest pruned magnitude of the group (soft_threshold24's order of operations)
        t = tl.maximum(tl.maximum(tl.where(k0, 0.0, tl.abs(f0)), tl.where(k1, 0.0, tl.abs(f1))),
                       tl.maximum(tl.where(k2, 0.0, tl.abs(f2)), tl.where(k3, 0.0, tl.abs(f3))))
        s0 = (_shrink(f0, k0, t) * beta).to(OUT_DTYPE)
        s1 = (_shrink(f1, k1, t) * beta).to(OUT_DTYPE)
        s2 = (_shrink(f2, k2, t) * beta).to(OUT_DTYPE)
        s3 = (_shrink(f3, k3, t) * beta).to(OUT_DTYPE)
    else:  # w * m in float32, one rounding: round(w) * m exactly, -0.0 for a pruned negative w
        s0 = (w0.to(tl.float32) * k0.to(tl.float32)).to(OUT_DTYPE)
        s1 = (w1.to(tl.float32) * k1.to(tl.float32)).to(OUT_DTYPE)
        s2 = (w2.to(tl.float32) * k2.to(tl.float32)).to(OUT_DTYPE)
        s3 = (w3.to(tl.float32) * k3.to(tl.float32)).to(OUT_DTYPE)
    return s0, s1, s2, s3


@triton.jit
def _fp8_bits(s, inv_scale, FMAX: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr):
    """s (the operand dtype) cast to FP8 with ``inv_scale`` as ``quantize_fp8_with_scale`` casts it: the
    FP8 byte (uint8), -0.0 kept as the sign bit alone, 0x7F (NaN) for a value that is not finite.

    The byte stays an integer (``fp8_cast._fp8_byte``) rather than going through triton's FP8 dtype: on
    the H100 (triton 3.6) converting to FP8 and then bitcasting to uint8 before the compressed store put
    bytes at wrong positions (the interpreter did not), seen in the first GPU run of kernels 18 and 19."""
    x = s.to(tl.float32)
    y = x * inv_scale
    return _fp8_byte(y, _finite_product(x, y), FMAX, MBITS, EMIN)


@triton.jit
def _sparse_groups(w, m, beta_ptr, SOFT: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """S of a (64, 64) tile of W and of the mask, as its groups' four members s0..s3, each (64, 16) of
    OUT_DTYPE: ``beta * soft_threshold`` (SOFT) or ``w * m`` (module docstring)."""
    w0, w1, w2, w3 = _split_groups(w)
    m0, m1, m2, m3 = _split_groups(m)
    k0 = m0 != 0
    k1 = m1 != 0
    k2 = m2 != 0
    k3 = m3 != 0
    if SOFT:
        beta = tl.load(beta_ptr).to(tl.float32)
    else:
        beta = 1.0
    return _masked_values(w0, w1, w2, w3, k0, k1, k2, k3, beta, SOFT, OUT_DTYPE)


@triton.jit
def _groups_amax(s0, s1, s2, s3):
    """amax of S in the operand dtype (a float32 scalar), what the unfused cast of S would return."""
    a = tl.maximum(tl.maximum(tl.abs(s0.to(tl.float32)), tl.abs(s1.to(tl.float32))),
                   tl.maximum(tl.abs(s2.to(tl.float32)), tl.abs(s3.to(tl.float32))))
    return tl.max(tl.max(a, axis=1), axis=0)


@triton.jit
def _operand_bits(s0, s1, s2, s3, inv_scale_ptr, FP8: tl.constexpr, FMAX: tl.constexpr, MBITS: tl.constexpr,
                  EMIN: tl.constexpr):
    """The operand's raw bits: q(S) as FP8 bytes with the scale at ``inv_scale_ptr`` (FP8; zeros stay
    zeros), else S's own 16 bits (int16)."""
    if FP8:
        inv_scale = tl.load(inv_scale_ptr)
        b0 = _fp8_bits(s0, inv_scale, FMAX, MBITS, EMIN)
        b1 = _fp8_bits(s1, inv_scale, FMAX, MBITS, EMIN)
        b2 = _fp8_bits(s2, inv_scale, FMAX, MBITS, EMIN)
        b3 = _fp8_bits(s3, inv_scale, FMAX, MBITS, EMIN)
    else:
        b0 = s0.to(tl.int16, bitcast=True)
        b1 = s1.to(tl.int16, bitcast=True)
        b2 = s2.to(tl.int16, bitcast=True)
        b3 = s3.to(tl.int16, bitcast=True)
    return b0, b1, b2, b3


@triton.jit
def _prepare24_kernel(w_ptr, mask_ptr, beta_ptr, vals_ptr, meta_ptr, vals_t_ptr, meta_t_ptr,
                      inv_scale_ptr, partial_ptr, stride_r, stride_c, n_rows, n_cols,
                      SOFT: tl.constexpr, WRITE_W: tl.constexpr, WRITE_T: tl.constexpr,
                      OUT_DTYPE: tl.constexpr, FP8: tl.constexpr = False, WRITE_AMAX: tl.constexpr = False,
                      FMAX: tl.constexpr = 448.0, MBITS: tl.constexpr = 3, EMIN: tl.constexpr = -6,
                      SIGN_OFF: tl.constexpr = 0x7FFF,
                      TILE_COLS: tl.constexpr = 32):
    # TILE_COLS: columns of a metadata tile (8 groups of 16-bit values, 16 of 8-bit); SIGN_OFF masks the sign bit
    r0 = tl.program_id(0) * 64
    c0 = tl.program_id(1) * 64
    rows = (r0 + tl.arange(0, 64))[:, None]
    cols = (c0 + tl.arange(0, 64))[None, :]
    w = tl.load(w_ptr + rows * stride_r + cols * stride_c)
    m = tl.load(mask_ptr + rows * n_cols + cols)
    s0, s1, s2, s3 = _sparse_groups(w, m, beta_ptr, SOFT, OUT_DTYPE)
    if WRITE_AMAX:
        tl.store(partial_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), _groups_amax(s0, s1, s2, s3))
    b0, b1, b2, b3 = _operand_bits(s0, s1, s2, s3, inv_scale_ptr, FP8, FMAX, MBITS, EMIN)
    if WRITE_W:  # S(W): rows r0.., groups c0 / 4.. of the (n_rows, n_cols) operand
        v0, v1, code = _pick(b0, b1, b2, b3, SIGN_OFF)
        _store_compressed(vals_ptr, meta_ptr, r0, c0 // 4, v0, v1, code, n_cols // 2, n_cols // TILE_COLS, FP8, 16)
    if WRITE_T:  # S(W)^T: rows c0.., groups r0 / 4.. of the (n_cols, n_rows) operand
        s_t = tl.trans(_join_groups(b0, b1, b2, b3))
        t0, t1, t2, t3 = _split_groups(s_t)
        v0t, v1t, code_t = _pick(t0, t1, t2, t3, SIGN_OFF)
        _store_compressed(vals_t_ptr, meta_t_ptr, c0, r0 // 4, v0t, v1t, code_t, n_rows // 2, n_rows // TILE_COLS,
                          FP8, 16)


_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def check_weight_mask_beta(w: torch.Tensor, mask: torch.Tensor, beta, dtype: torch.dtype, dtype_name: str,
                           whole_tiles: bool = True):
    """The checks kernel 11's wrappers share (``prepare24`` and ``prepare24_fp8``; kernel 22's too, with
    ``whole_tiles=False``: it masks partial tiles and checks its own shape rule); returns beta as a
    float tensor on w's device (or None). dtype: what S is rounded to, named ``dtype_name`` in errors."""
    check_tensor(w, "w", HALF_AND_FLOAT)
    check_tensor(mask, "mask", (torch.bool,))
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D (out, in), got shape {tuple(w.shape)}")
    check_same_shape(mask, "mask", w, "w")
    if dtype not in _TL_DTYPES:
        raise TypeError(f"{dtype_name} must be bfloat16 or float16 (the product dtype S is rounded to), got {dtype}")
    rows, cols = w.shape
    if whole_tiles and (rows % TILE or cols % TILE):
        raise ValueError(f"w has shape {tuple(w.shape)}; out and in must be multiples of {TILE} "
                         "(use soft_threshold24 / w * mask, then torch._cslt_compress, for other shapes)")
    if rows * cols > 2**31 - 1 or (rows - 1) * abs(w.stride(0)) + (cols - 1) * abs(w.stride(1)) > 2**31 - 1:
        raise ValueError(f"w with shape {tuple(w.shape)} and strides {w.stride()} exceeds int32 offsets")
    tensors = {"w": w, "mask": mask}
    beta = check_beta(beta, w.device)
    if beta is not None:
        tensors["beta"] = beta
    check_device(_prepare24_kernel, **tensors)
    return beta


def check_beta(beta, device: torch.device) -> torch.Tensor | None:
    """S-STE's scale as a float tensor (a Python float goes to ``device``), or None; ValueError unless it is a
    floating-point scalar."""
    if beta is None:
        return None
    if not isinstance(beta, torch.Tensor):
        beta = torch.tensor(float(beta), dtype=torch.float32, device=device)
    if beta.numel() != 1 or not beta.dtype.is_floating_point:
        raise ValueError(f"beta must be a floating-point scalar, got shape {tuple(beta.shape)}, {beta.dtype}")
    return beta


def compressed_buffers(rows: int, cols: int, dtype: torch.dtype, device: torch.device):
    """An uninitialised compressed operand of a (rows, cols) 2:4 matrix in cuSPARSELt's layout, with the views
    the kernels write: (operand, its values as int16, its metadata bytes)."""
    from sparsity_lab.references import cusparselt_layout as layout

    out = torch.empty(layout.compressed_shape(rows, cols, dtype), dtype=dtype, device=device)
    n_values = rows * cols // 2
    return out, out.view(torch.int16).reshape(-1)[:n_values], out.view(torch.uint8).reshape(-1)[2 * n_values:]


def prepare24(w: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | float | None = None,
              out_dtype: torch.dtype | None = None, forward: bool = True, transposed: bool = True,
              num_warps: int = 8) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Compressed S(W) and S(W)^T in cuSPARSELt's layout, in one pass over W.

    w: (out, in) float32 / bfloat16 / float16, any strides; out and in multiples of 64.
    mask: bool (out, in), contiguous, transposable 2:4 (two kept per group of 4 along rows *and*
    columns; not checked here: the mask kernel makes it so). beta: None for ``w.to(dtype) * mask``
    (STE family), else the S-STE scale (a float or a 0-d float tensor on w's device) for
    ``beta * soft_threshold(w, mask)``. out_dtype: bfloat16 / float16 (default: w's dtype).
    forward / transposed: which of the two forms to write (the other is returned as None). num_warps: 8 by
    default, 9 % faster than 4 at both FFN weights of the lab GPT step on the H200
    (results/step_kernels_sweep_h200.json; the same bytes at every warp count).

    Returns ``(compress24(S), compress24(S.t()))`` bit for bit, S = the dense masked weight in
    out_dtype (``soft_threshold24(w, mask, beta, out_dtype=...)`` or ``w.to(out_dtype) * mask``).
    """
    out_dtype = out_dtype or w.dtype
    beta = check_weight_mask_beta(w, mask, beta, out_dtype, "out_dtype")
    if not (forward or transposed):
        raise ValueError("nothing to write: forward and transposed are both False")
    rows, cols = w.shape
    mask_u8 = mask.contiguous().view(torch.uint8)
    beta_t = beta.reshape(()).float() if beta is not None else w
    unused = (None, mask_u8, mask_u8)  # a form not written: its pointers are never stored to
    fwd, fwd_vals, fwd_meta = compressed_buffers(rows, cols, out_dtype, w.device) if forward else unused
    bwd, bwd_vals, bwd_meta = compressed_buffers(cols, rows, out_dtype, w.device) if transposed else unused
    _prepare24_kernel[(rows // TILE, cols // TILE)](
        w, mask_u8, beta_t, fwd_vals, fwd_meta, bwd_vals, bwd_meta, mask_u8, mask_u8, w.stride(0), w.stride(1),
        rows, cols,
        SOFT=beta is not None, WRITE_W=forward, WRITE_T=transposed, OUT_DTYPE=_TL_DTYPES[out_dtype], num_warps=num_warps)
    return fwd, bwd
