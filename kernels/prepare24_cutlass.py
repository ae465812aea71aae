"""Kernel 22: a step's sparse weight operands, S(W) and S(W)^T, straight into CUTLASS's SM90 layout.

The idea
    Kernel 11 (``prepare24.py``) writes S(W) (out, in), 2:4 along ``in``, and S(W)^T (in, out), 2:4
    along ``out``, compressed for cuSPARSELt from one read of W and the mask. The CUTLASS backends
    (``backends/cutlass``) need the same two operands in CUTLASS's layout, which CUTLASS's own
    compressor made from a dense S(W) (and a transposed copy of it for S(W)^T). This program is kernel
    11's with CUTLASS's stores: it loads a 64 x 64 tile of W and of the mask, computes S there with
    kernel 11's helpers (``_sparse_groups``: the S-STE soft threshold times beta, or ``w.to(dtype) *
    mask``; ``_operand_bits``: the FP8 cast with a given scale, kernel 18's), and stores it compressed
    as it is (rows of S(W)) and transposed in registers (rows of S(W)^T). The dense S(W) never exists.

    The layout (``sparsity_lab/references/cutlass_layout.py``, checked against the compressor's bytes
    on the H200): the kept values row-major (m, k / 2); one 4-bit code ``i | j << 2`` per group, the
    two codes of one byte being groups g, g + 1 of one row, so a program's 16 groups per row are 8
    whole bytes and no two programs touch one byte; each byte's place is a bit permutation of (row,
    group) inside 64-row x 128-column atoms, the atoms going down the rows first. Two choices differ
    from cuSPARSELt's (``_pick_cutlass``): a slot whose entry is zero holds +0.0 (the compressor
    never copies a -0.0) and an empty group's code is 0.

    Shapes: any m; k (``in`` for S(W), ``out`` for S(W)^T) a multiple of 16 (bf16) or 32 (E4M3), the
    compressed rows being whole 16-byte rows. Partial tiles are masked; the metadata's padding (rows
    to a multiple of 64, columns to 128) is written as zeros by programs past the edge, so every byte
    of the outputs is written once and nothing is cleared first.

Bytes (W of O x I elements, weight element size s, operand element size p: 2 for bf16, 1 for E4M3)
    read ``s O I`` (W) + ``O I`` (bool mask); write ``2 * (p O I / 2 + O I / 8)`` (plus the padding of
    the metadata). The path it replaces: ``(s + 1 + p) O I`` for S(W), ``2 p O I`` for the transposed
    copy CUTLASS's row-major compressor needs, ``p O I`` read by each of the two compressions, then the
    same writes: ``4 p O I`` more (16 bytes per element for bf16).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparsity_lab.references.fp8 import fp8_format

from ._common import check_device
from .compress24 import _pick
from .fp8_cast import _GRID, check_fp8_device
from .prepare24 import (TILE, _TL_DTYPES, _groups_amax, _join_groups, _operand_bits, _sparse_groups, _split_groups,
                        check_weight_mask_beta)


@triton.jit
def _pick_cutlass(x0, x1, x2, x3, SIGN_OFF: tl.constexpr, TABLE: tl.constexpr = True):
    """CUTLASS's compressor's choice for each group (raw bits, each (64, 16)): kernel 8's kept columns and
    code, with a zero slot holding +0.0 (a -0.0 is not copied) and code 0 for a group with no non-zero.
    TABLE: as ``_pick``."""
    v0, v1, code = _pick(x0, x1, x2, x3, SIGN_OFF, TABLE)
    k0 = (v0 & SIGN_OFF) != 0
    k1 = (v1 & SIGN_OFF) != 0
    zero = tl.zeros_like(v0)
    return tl.where(k0, v0, zero), tl.where(k1, v1, zero), tl.where(k0 | k1, code, 0)


@triton.jit
def _cutlass_nibble(r, g, atoms_down, EIGHT_BIT: tl.constexpr):
    """The metadata nibble of group g of row r: ``cutlass_layout.metadata_nibble_index``."""
    rw = r % 64
    gw = g % 32
    atom = (g // 32) * atoms_down + r // 64
    if EIGHT_BIT:
        p = gw | (rw << 5)
    else:
        p = ((gw & 3) | (((rw >> 3) & 1) << 2) | (((gw >> 3) & 3) << 3) | ((rw & 7) << 5) | (((gw >> 2) & 1) << 8)
             | ((rw >> 4) << 9))
    return atom * 2048 + p


@triton.jit
def _store_cutlass(vals_ptr, meta_ptr, row0, g0, v0, v1, code, n_rows, n_cols, EIGHT_BIT: tl.constexpr,
                   GROUPS: tl.constexpr, ROWS: tl.constexpr = 64, ROW_STEP: tl.constexpr = 1):
    """Write ROWS rows (row0, row0 + ROW_STEP, ...) x GROUPS groups (even) of an (n_rows, n_cols) operand: kept
    values (v0, v1) and codes, each (ROWS, GROUPS). Values outside the operand are not stored; codes are, inside
    the metadata's padded extent (zeros there)."""
    rows = row0 + ROW_STEP * tl.arange(0, ROWS)[:, None]
    half = n_cols // 2
    vcols = 2 * g0 + tl.arange(0, 2 * GROUPS)[None, :]
    tl.store(vals_ptr + rows * half + vcols, tl.reshape(tl.join(v0, v1), [ROWS, 2 * GROUPS]),
             mask=(rows < n_rows) & (vcols < half))
    lo, hi = tl.split(tl.reshape(code, [ROWS, GROUPS // 2, 2]))  # a byte holds groups (g, g + 1) of one row: lo = even g
    g = g0 + 2 * tl.arange(0, GROUPS // 2)[None, :]
    meta_rows = (n_rows + 63) // 64 * 64
    nib = _cutlass_nibble(rows, g, meta_rows // 64, EIGHT_BIT)
    tl.store(meta_ptr + (nib >> 1), (lo | (hi << 4)).to(tl.uint8),
             mask=(rows < meta_rows) & (g < (n_cols + 127) // 128 * 32))


@triton.jit
def _prepare24_cutlass_kernel(w_ptr, mask_ptr, beta_ptr, vals_ptr, meta_ptr, vals_t_ptr, meta_t_ptr,
                              inv_scale_ptr, partial_ptr, stride_r, stride_c, n_rows, n_cols,
                              SOFT: tl.constexpr, WRITE_W: tl.constexpr, WRITE_T: tl.constexpr,
                              OUT_DTYPE: tl.constexpr, FP8: tl.constexpr = False, WRITE_AMAX: tl.constexpr = False,
                              FMAX: tl.constexpr = 448.0, MBITS: tl.constexpr = 3, EMIN: tl.constexpr = -6,
                              SIGN_OFF: tl.constexpr = 0x7FFF):
    r0 = tl.program_id(0) * 64
    c0 = tl.program_id(1) * 64
    rows = (r0 + tl.arange(0, 64))[:, None]
    cols = (c0 + tl.arange(0, 64))[None, :]
    inside = (rows < n_rows) & (cols < n_cols)  # outside: w = 0, unkept, so S = 0 and the codes 0 (padding)
    w = tl.load(w_ptr + rows * stride_r + cols * stride_c, mask=inside, other=0.0)
    m = tl.load(mask_ptr + rows * n_cols + cols, mask=inside, other=0)
    s0, s1, s2, s3 = _sparse_groups(w, m, beta_ptr, SOFT, OUT_DTYPE)
    if WRITE_AMAX:
        tl.store(partial_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), _groups_amax(s0, s1, s2, s3))
    b0, b1, b2, b3 = _operand_bits(s0, s1, s2, s3, inv_scale_ptr, FP8, FMAX, MBITS, EMIN)
    if WRITE_W:  # S(W): rows r0.., groups c0 / 4.. of the (n_rows, n_cols) operand
        v0, v1, code = _pick_cutlass(b0, b1, b2, b3, SIGN_OFF)
        _store_cutlass(vals_ptr, meta_ptr, r0, c0 // 4, v0, v1, code, n_rows, n_cols, FP8, 16)
    if WRITE_T:  # S(W)^T: rows c0.., groups r0 / 4.. of the (n_cols, n_rows) operand
        t0, t1, t2, t3 = _split_groups(tl.trans(_join_groups(b0, b1, b2, b3)))
        v0t, v1t, code_t = _pick_cutlass(t0, t1, t2, t3, SIGN_OFF)
        _store_cutlass(vals_t_ptr, meta_t_ptr, c0, r0 // 4, v0t, v1t, code_t, n_cols, n_rows, FP8, 16)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _grid(rows: int, cols: int, forward: bool, transposed: bool) -> tuple[int, int]:
    """Programs over W: enough to write both forms' metadata padding (rows to 64, columns to 128)."""
    return (_round_up(rows, 2 * TILE if transposed else TILE) // TILE,
            _round_up(cols, 2 * TILE if forward else TILE) // TILE)


def _check_forms(w: torch.Tensor, dtype: torch.dtype, forward: bool, transposed: bool) -> None:
    """Each form asked for is an operand ``ops.compress`` takes (k a multiple of 16 / 32 elements)."""
    from sparsity_lab.references import cutlass_layout as layout

    out_f, in_f = w.shape
    for wanted, rows, cols, what in ((forward, out_f, in_f, "S(W) (out, in): k = in"),
                                     (transposed, in_f, out_f, "S(W)^T (in, out): k = out")):
        problem = layout.layout_problem(rows, cols, dtype) if wanted else None
        if problem:
            raise ValueError(f"w has shape {tuple(w.shape)}; {what}: {problem}")
    if _round_up(out_f, 2 * TILE) * _round_up(in_f, 2 * TILE) > 2**31 - 1:
        raise ValueError(f"w with shape {tuple(w.shape)} exceeds int32 offsets (padded to 128 x 128 tiles)")


def fp8_constexprs(fp8: bool) -> dict:
    """The operand's compile-time constants of kernels 22 and 24: E4M3's grid (FMAX, MBITS, EMIN) and the mask of
    the bits that make an entry non-zero (SIGN_OFF: all but the sign)."""
    mbits, emin = _GRID["e4m3"]
    return dict(FP8=fp8, FMAX=fp8_format("e4m3")[1], MBITS=mbits, EMIN=emin, SIGN_OFF=0x7F if fp8 else 0x7FFF)


def empty_forms(rows: int, cols: int, fp8: bool, forward: bool, transposed: bool, device):
    """Uncleared outputs of kernels 22 and 24: S(W) (rows, cols) and S(W)^T compressed, each (values, metadata) or
    None where not asked, and the kernel's arguments for them (the values' raw bits: int16 / uint8; a stand-in
    where a form is not written)."""
    from sparsity_lab.references import cutlass_layout as layout

    operand_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16

    def empty(r: int, c: int):
        shape = layout.compressed_shape(r, c, operand_dtype)
        values = torch.empty(shape.values, dtype=operand_dtype, device=device)
        return values, torch.empty(shape.metadata_bytes, dtype=torch.uint8, device=device)

    fwd = empty(rows, cols) if forward else None
    bwd = empty(cols, rows) if transposed else None
    stand_in = torch.empty(1, dtype=torch.uint8, device=device)
    args = []
    for form in (fwd, bwd):
        args += [form[0].view(torch.uint8 if fp8 else torch.int16), form[1]] if form else [stand_in, stand_in]
    return fwd, bwd, args


def check_inv_scale(w: torch.Tensor, inv_scale) -> None:
    """The E4M3 cast's scale of kernels 22 and 24: a float32 one-element tensor on w's device."""
    if not isinstance(inv_scale, torch.Tensor) or inv_scale.numel() != 1 or inv_scale.dtype != torch.float32:
        raise TypeError("inv_scale must be a float32 tensor with one element (fp8_max / amax)")
    check_device(_prepare24_cutlass_kernel, w=w, inv_scale=inv_scale)


def _launch(w, mask, beta, dtype, inv_scale, forward, transposed, num_warps):
    """Run kernel 22: bf16 forms (``inv_scale`` None) or E4M3 ones; returns (forward (values, metadata) or
    None, transposed likewise or None, amax of S as a float32 0-d tensor)."""
    rows, cols = w.shape
    fp8 = inv_scale is not None
    if fp8:
        check_fp8_device(w.device)
    mask_u8 = mask.contiguous().view(torch.uint8)
    beta_t = beta.reshape(()).float() if beta is not None else w
    grid = _grid(rows, cols, forward, transposed)
    partial = torch.empty(grid[0] * grid[1], dtype=torch.float32, device=w.device)
    fwd, bwd, form_args = empty_forms(rows, cols, fp8, forward, transposed, w.device)
    _prepare24_cutlass_kernel[grid](
        w, mask_u8, beta_t, *form_args, inv_scale if fp8 else partial, partial, w.stride(0), w.stride(1), rows, cols,
        SOFT=beta is not None, WRITE_W=forward, WRITE_T=transposed, OUT_DTYPE=_TL_DTYPES[dtype], WRITE_AMAX=True,
        **fp8_constexprs(fp8), num_warps=num_warps)
    return fwd, bwd, partial.amax()


def prepare24_cutlass(w: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | float | None = None,
                      out_dtype: torch.dtype = torch.bfloat16, forward: bool = True, transposed: bool = True,
                      num_warps: int = 4):
    """Compressed S(W) and S(W)^T in CUTLASS's SM90 layout (bfloat16), in one pass over W.

    w: (out, in) float32 / bfloat16 / float16, any strides; in (for S(W)) and out (for S(W)^T) multiples
    of 16. mask: bool (out, in), contiguous, transposable 2:4 (not checked: the mask kernel makes it so).
    beta: None for ``w.to(bfloat16) * mask`` (STE family), else the S-STE scale (a float or a 0-d float
    tensor on w's device) for ``beta * soft_threshold(w, mask)``. out_dtype: bfloat16 (CUTLASS's 16-bit
    sparse GEMMs here take no other). forward / transposed: which forms to write (the other is None).

    Returns ``(cutlass_layout.compress(S), cutlass_layout.compress(S.t()))`` bit for bit, each a pair
    (values (m, k / 2) bfloat16, metadata uint8), S the dense masked weight in bfloat16; what
    ``ops.compress`` returns for the same S.
    """
    if out_dtype != torch.bfloat16:
        raise TypeError(f"out_dtype must be torch.bfloat16 (CUTLASS's 16-bit sparse operand here), got {out_dtype}")
    beta = check_weight_mask_beta(w, mask, beta, out_dtype, "out_dtype", whole_tiles=False)
    if not (forward or transposed):
        raise ValueError("nothing to write: forward and transposed are both False")
    _check_forms(w, out_dtype, forward, transposed)
    fwd, bwd, _ = _launch(w, mask, beta, out_dtype, None, forward, transposed, num_warps)
    return fwd, bwd


def prepare24_cutlass_fp8(w: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | float | None,
                          inv_scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16, forward: bool = True,
                          transposed: bool = True, num_warps: int = 4):
    """Compressed q(S(W)) and q(S(W))^T in CUTLASS's SM90 E4M3 layout, and amax(S(W)), in one pass over W.

    Arguments as :func:`prepare24_cutlass`, with in / out multiples of 32; inv_scale: float32 one-element
    tensor on w's device, ``fp8_max / amax`` (read on the device); dtype: what S is rounded to before the
    cast (the layer's compute dtype, bfloat16 or float16), as ``prepare24_fp8``.

    Returns ``(compress(q), compress(q.t()), amax)`` with ``q, amax = quantize_fp8_with_scale(S, inv_scale,
    "e4m3")`` and ``compress`` = ``cutlass_layout.compress``, bit for bit; amax a float32 0-d tensor.
    """
    beta = check_weight_mask_beta(w, mask, beta, dtype, "dtype", whole_tiles=False)
    check_inv_scale(w, inv_scale)
    if not (forward or transposed):
        raise ValueError("nothing to write: forward and transposed are both False")
    _check_forms(w, torch.float8_e4m3fn, forward, transposed)
    return _launch(w, mask, beta, dtype, inv_scale.reshape(()), forward, transposed, num_warps)


def prepare24_cutlass_amax(w: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | float | None,
                           dtype: torch.dtype = torch.bfloat16, num_warps: int = 4) -> torch.Tensor:
    """amax(S(W)) (S rounded to ``dtype``) as a float32 0-d tensor, from one read of W and the mask (the
    first pass of current scaling), at any shape. Arguments as :func:`prepare24_cutlass_fp8`."""
    beta = check_weight_mask_beta(w, mask, beta, dtype, "dtype", whole_tiles=False)
    if w.shape[0] * w.shape[1] == 0:
        raise ValueError(f"w has shape {tuple(w.shape)}: no entries to take the amax of")
    return _launch(w, mask, beta, dtype, None, False, False, num_warps)[2]
