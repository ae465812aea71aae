"""Kernel 21: a step's mask refresh in one pass over W: the transposable mask, its flips, S(W) and S(W)^T.

The idea
    A 2:4 layer whose transposable mask is recomputed every step runs, per step, kernel 2 (read W,
    write the new mask), kernel 9 (read the old and the new mask, count the flips), a copy of the new
    mask into the layer's mask buffer and kernel 11 (read W and the mask again, write S(W) and S(W)^T
    compressed in cuSPARSELt's layout). Here one program owns a 64 x 64 tile of W and does all of it:

    * it loads row r of every 4x4 tile of its block (rows 4a + r, a < 16: four (16, 64) loads of W)
      and splits each load into the tiles' four columns, so entry (r, c) of the 16 x 16 tiles is a
      (16, 16) tensor w{r}{c}, as kernel 2 holds them;
    * the mask is kernel 2's own code (``_pattern_code``: the 90-pattern search with its float32
      scores, power-of-two tile scaling and lowest-index ties), so the masks are kernel 2's bit for bit;
    * it reads the previous mask of the tile, counts the entries that differ and adds the count to one
      int64 device counter (kernel 9's count), then writes the new mask over the old one, in place; both
      masks are handled as one int32 word per tile row (its four bool bytes), in the tiles' own layout,
      so the count is a few integer operations per word (see ``_row_word`` and ``_byte_sum``);
    * S is kernel 11's arithmetic on the same values (``_masked_values``): beta * soft threshold, or
      w * m, rounded once to the product dtype; S(W) is compressed from each row slice (rows 4a + r:
      groups of 4 along W's rows are the tiles' rows) and S(W)^T from each column slice (column
      4b + c of W is row 4b + c of S(W)^T; its groups are the tiles' columns), the latter through a
      (16, 16) register transpose. ``compress24``'s store writes both, one row slice at a time, so
      the bytes are those kernel 11 writes.

    The result equals ``transposable_mask24(w, pruned=False)`` -> ``count_flips(old, new)`` ->
    ``mask.copy_(new)`` -> ``prepare24(w, mask, beta)`` (tested, bit for bit).

    ``refresh24_fp8`` is the same pass with kernel 18's E4M3 cast before the stores (S rounded to the
    compute dtype, times ``inv_scale``, rounded to the E4M3 grid) and the block's amax of S written for the
    recipe: the chain with ``prepare24_fp8`` instead of ``prepare24``. It needs the scale before the pass
    (delayed scaling); current scaling needs amax(S) of the new mask first, which this pass cannot give.

Bytes (W of O x I elements n, element size s; products in a 16-bit dtype)
    read ``s n`` (W) + ``n`` (previous mask); write ``n`` (new mask) + ``2 (n + n / 8)`` (two compressed
    forms, values and metadata). bf16 W: 6.25 bytes per element, against 12.25 for the unfused
    chain (kernel 2: 3n, kernel 9: 2n, the mask copy: 2n, kernel 11: 5.25n). E4M3 forms: ``n + n / 4``
    written for both; bf16 W 5.25 bytes per element against 11.25 for the chain with kernel 18.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparsity_lab.references.fp8 import fp8_format

from ._common import HALF_AND_FLOAT, check_device, check_tensor
from .compress24 import _pick, _store_compressed
from .fp8_cast import _GRID, check_fp8_device
from .prepare24 import _TL_DTYPES, TILE, _groups_amax, _masked_values, _operand_bits, check_weight_mask_beta
from .transposable24 import _keep_flags, _pattern_code, _split4_2d

DEFAULT_WARPS = 4


@triton.jit
def _row_word(code, r: tl.constexpr):
    """Row r of every tile of the mask as its 4 bytes in one little-endian int32 word: byte c is bit 4r + c of
    the tile's code. (nibble * 0x204081 puts bit c at bit 8c; the four shifted copies do not overlap.)"""
    return (((code >> (4 * r)) & 0xF) * 0x204081) & 0x01010101


@triton.jit
def _nonzero_bytes(x):
    """1 in each byte of the int32 words ``x`` that is non-zero, 0 in the others (a bool's byte: any non-zero is
    True), folded down inside each byte: high nibble onto low, then bits 2-3 onto 0-1, then bit 1 onto 0."""
    t = (x | (x >> 4)) & 0x0F0F0F0F
    t = t | (t >> 2)
    return (t | (t >> 1)) & 0x01010101


@triton.jit
def _byte_sum(x):
    """The sum of the four bytes of each int32 word (each at most 1 here): the top byte of x * 0x01010101."""
    return ((x * 0x01010101) >> 24) & 0xFF


@triton.jit
def _load_inside(ptr, inside, EDGE: tl.constexpr):
    """``tl.load(ptr)``; with EDGE (a block reaching past W) zeros where not ``inside``."""
    if EDGE:
        x = tl.load(ptr, mask=inside, other=0)
    else:
        x = tl.load(ptr)
    return x


@triton.jit
def _store_inside(ptr, x, inside, EDGE: tl.constexpr):
    """``tl.store(ptr, x)``; with EDGE only where ``inside``."""
    if EDGE:
        tl.store(ptr, x, mask=inside)
    else:
        tl.store(ptr, x)


@triton.jit
def _load_block(w_ptr, r0, c0, stride_r, stride_c, n_rows, n_cols, EDGE: tl.constexpr):
    """The 64 x 64 block of W at (r0, c0) as the 16 entries of its 16 x 16 tiles: w{r}{c}[a, b] =
    W[r0 + 4a + r, c0 + 4b + c], each (16, 16), from four (16, 64) loads (row r of every tile). EDGE: zeros
    outside W (out is a multiple of 4, so row 4a + r is inside exactly when row 4a is)."""
    tile_row0 = (r0 + 4 * tl.arange(0, 16))[:, None]  # row 0 of each of the block's 16 tile-rows
    cols = (c0 + tl.arange(0, 64))[None, :]
    w_at = w_ptr + tile_row0 * stride_r + cols * stride_c
    inside = (tile_row0 < n_rows) & (cols < n_cols)
    w00, w01, w02, w03 = _split4_2d(_load_inside(w_at, inside, EDGE), 16, 16)
    w10, w11, w12, w13 = _split4_2d(_load_inside(w_at + stride_r, inside, EDGE), 16, 16)
    w20, w21, w22, w23 = _split4_2d(_load_inside(w_at + 2 * stride_r, inside, EDGE), 16, 16)
    w30, w31, w32, w33 = _split4_2d(_load_inside(w_at + 3 * stride_r, inside, EDGE), 16, 16)
    return w00, w01, w02, w03, w10, w11, w12, w13, w20, w21, w22, w23, w30, w31, w32, w33


@triton.jit
def _refresh_mask_words(mask_ptr, flips_ptr, code, r0, c0, n_rows, n_cols, COUNT: tl.constexpr, EDGE: tl.constexpr):
    """The flips of the block's new mask (the tiles' ``code``) against the mask stored now, added to the int64
    counter at ``flips_ptr`` (COUNT), then the new mask written over the old one (each program owns its block).
    Both as one int32 word per tile row (its four bool bytes), in the layout of the tiles' codes. EDGE: the
    words outside the mask are neither read, counted nor written."""
    tile_row0 = (r0 + 4 * tl.arange(0, 16))[:, None]
    words = n_cols // 4
    word = (c0 // 4 + tl.arange(0, 16))[None, :]
    # word (a, b) of row slice r holds row r of tile (a, b), one byte per entry
    mask_at = mask_ptr + tile_row0 * words + word
    inside = (tile_row0 < n_rows) & (word < words)
    new0 = _row_word(code, 0)
    new1 = _row_word(code, 1)
    new2 = _row_word(code, 2)
    new3 = _row_word(code, 3)
    if COUNT:  # summed per tile, then one reduction over the block and one relaxed atomic per program
        d = (_byte_sum(_nonzero_bytes(_load_inside(mask_at, inside, EDGE)) ^ new0)
             + _byte_sum(_nonzero_bytes(_load_inside(mask_at + words, inside, EDGE)) ^ new1)
             + _byte_sum(_nonzero_bytes(_load_inside(mask_at + 2 * words, inside, EDGE)) ^ new2)
             + _byte_sum(_nonzero_bytes(_load_inside(mask_at + 3 * words, inside, EDGE)) ^ new3))
        if EDGE:
            d = tl.where(inside, d, 0)
        tl.atomic_add(flips_ptr, tl.sum(tl.sum(d, axis=1), axis=0).to(tl.int64), sem="relaxed")
        # should the loads and the stores lay the words out over the threads differently: every thread's
        # read of the old mask comes before any thread's write of the new one
        tl.debug_barrier()
    _store_inside(mask_at, new0, inside, EDGE)
    _store_inside(mask_at + words, new1, inside, EDGE)
    _store_inside(mask_at + 2 * words, new2, inside, EDGE)
    _store_inside(mask_at + 3 * words, new3, inside, EDGE)


@triton.jit
def _block_values(w00, w01, w02, w03, w10, w11, w12, w13, w20, w21, w22, w23, w30, w31, w32, w33, code, beta_ptr,
                  SOFT: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """S of the block for the tiles' mask ``code``: s{r}{c} like w{r}{c}, in OUT_DTYPE (``_masked_values``;
    the groups of 4 along W's rows are the tiles' rows: s{r}0..s{r}3)."""
    k00, k01, k02, k03, k10, k11, k12, k13, k20, k21, k22, k23, k30, k31, k32, k33 = _keep_flags(code)
    if SOFT:
        beta = tl.load(beta_ptr).to(tl.float32)
    else:
        beta = 1.0
    s00, s01, s02, s03 = _masked_values(w00, w01, w02, w03, k00, k01, k02, k03, beta, SOFT, OUT_DTYPE)
    s10, s11, s12, s13 = _masked_values(w10, w11, w12, w13, k10, k11, k12, k13, beta, SOFT, OUT_DTYPE)
    s20, s21, s22, s23 = _masked_values(w20, w21, w22, w23, k20, k21, k22, k23, beta, SOFT, OUT_DTYPE)
    s30, s31, s32, s33 = _masked_values(w30, w31, w32, w33, k30, k31, k32, k33, beta, SOFT, OUT_DTYPE)
    return s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33


@triton.jit
def _refresh_block(w_ptr, mask_ptr, beta_ptr, flips_ptr, r0, c0, stride_r, stride_c, n_rows, n_cols,
                   SOFT: tl.constexpr, COUNT: tl.constexpr, OUT_DTYPE: tl.constexpr, EDGE: tl.constexpr):
    """The refresh of the 64 x 64 block at (r0, c0) (kernels 21 and 24): its transposable mask (kernel 2's search)
    written over the stored one, the flips counted, and S of the new mask returned as s{r}{c} (``_block_values``;
    dead code the compiler drops when no form is written)."""
    w00, w01, w02, w03, w10, w11, w12, w13, w20, w21, w22, w23, w30, w31, w32, w33 = _load_block(
        w_ptr, r0, c0, stride_r, stride_c, n_rows, n_cols, EDGE)
    code = _pattern_code(w00, w01, w02, w03, w10, w11, w12, w13, w20, w21, w22, w23, w30, w31, w32, w33)
    _refresh_mask_words(mask_ptr, flips_ptr, code, r0, c0, n_rows, n_cols, COUNT, EDGE)
    return _block_values(w00, w01, w02, w03, w10, w11, w12, w13, w20, w21, w22, w23, w30, w31, w32, w33, code,
                         beta_ptr, SOFT, OUT_DTYPE)


@triton.jit
def _store_forms(s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33, inv_scale_ptr,
                 vals_ptr, meta_ptr, vals_t_ptr, meta_t_ptr, r0, c0, n_rows, n_cols, WRITE_W: tl.constexpr,
                 WRITE_T: tl.constexpr, FP8: tl.constexpr, FMAX: tl.constexpr, MBITS: tl.constexpr,
                 EMIN: tl.constexpr, SIGN_OFF: tl.constexpr, TILE_COLS: tl.constexpr):
    """S(W) (WRITE_W) and S(W)^T (WRITE_T) of the 64 x 64 block at (r0, c0), compressed in cuSPARSELt's layout
    from the block's values s{r}{c}: their 16-bit values, or (FP8) their E4M3 bytes cast with ``inv_scale``
    (kernel 18's cast). TILE_COLS: the columns of a metadata tile (32 for 16-bit values, 64 for 8-bit)."""
    b00, b01, b02, b03 = _operand_bits(s00, s01, s02, s03, inv_scale_ptr, FP8, FMAX, MBITS, EMIN)
    b10, b11, b12, b13 = _operand_bits(s10, s11, s12, s13, inv_scale_ptr, FP8, FMAX, MBITS, EMIN)
    b20, b21, b22, b23 = _operand_bits(s20, s21, s22, s23, inv_scale_ptr, FP8, FMAX, MBITS, EMIN)
    b30, b31, b32, b33 = _operand_bits(s30, s31, s32, s33, inv_scale_ptr, FP8, FMAX, MBITS, EMIN)
    if WRITE_W:  # S(W): row slice r holds rows r0 + 4a + r, groups c0 / 4 + b
        half, tiles = n_cols // 2, n_cols // TILE_COLS
        v0, v1, c = _pick(b00, b01, b02, b03, SIGN_OFF)
        _store_compressed(vals_ptr, meta_ptr, r0, c0 // 4, v0, v1, c, half, tiles, FP8, 16, 4, 0)
        v0, v1, c = _pick(b10, b11, b12, b13, SIGN_OFF)
        _store_compressed(vals_ptr, meta_ptr, r0, c0 // 4, v0, v1, c, half, tiles, FP8, 16, 4, 1)
        v0, v1, c = _pick(b20, b21, b22, b23, SIGN_OFF)
        _store_compressed(vals_ptr, meta_ptr, r0, c0 // 4, v0, v1, c, half, tiles, FP8, 16, 4, 2)
        v0, v1, c = _pick(b30, b31, b32, b33, SIGN_OFF)
        _store_compressed(vals_ptr, meta_ptr, r0, c0 // 4, v0, v1, c, half, tiles, FP8, 16, 4, 3)
    if WRITE_T:  # S(W)^T: column slice c is rows c0 + 4b + c, groups r0 / 4 + a, after a (16, 16) transpose
        half_t, tiles_t = n_rows // 2, n_rows // TILE_COLS
        v0, v1, c = _pick(b00, b10, b20, b30, SIGN_OFF)
        _store_compressed(vals_t_ptr, meta_t_ptr, c0, r0 // 4, tl.trans(v0), tl.trans(v1), tl.trans(c), half_t,
                          tiles_t, FP8, 16, 4, 0)
        v0, v1, c = _pick(b01, b11, b21, b31, SIGN_OFF)
        _store_compressed(vals_t_ptr, meta_t_ptr, c0, r0 // 4, tl.trans(v0), tl.trans(v1), tl.trans(c), half_t,
                          tiles_t, FP8, 16, 4, 1)
        v0, v1, c = _pick(b02, b12, b22, b32, SIGN_OFF)
        _store_compressed(vals_t_ptr, meta_t_ptr, c0, r0 // 4, tl.trans(v0), tl.trans(v1), tl.trans(c), half_t,
                          tiles_t, FP8, 16, 4, 2)
        v0, v1, c = _pick(b03, b13, b23, b33, SIGN_OFF)
        _store_compressed(vals_t_ptr, meta_t_ptr, c0, r0 // 4, tl.trans(v0), tl.trans(v1), tl.trans(c), half_t,
                          tiles_t, FP8, 16, 4, 3)


@triton.jit
def _refresh24_kernel(w_ptr, mask_ptr, beta_ptr, flips_ptr, vals_ptr, meta_ptr, vals_t_ptr, meta_t_ptr,
                      inv_scale_ptr, partial_ptr, stride_r, stride_c, n_rows, n_cols,
                      SOFT: tl.constexpr, COUNT: tl.constexpr, WRITE_W: tl.constexpr, WRITE_T: tl.constexpr,
                      OUT_DTYPE: tl.constexpr, FP8: tl.constexpr = False, FMAX: tl.constexpr = 448.0,
                      MBITS: tl.constexpr = 3, EMIN: tl.constexpr = -6, SIGN_OFF: tl.constexpr = 0x7FFF,
                      TILE_COLS: tl.constexpr = 32):
    r0 = tl.program_id(0) * 64
    c0 = tl.program_id(1) * 64
    s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33 = _refresh_block(
        w_ptr, mask_ptr, beta_ptr, flips_ptr, r0, c0, stride_r, stride_c, n_rows, n_cols, SOFT, COUNT, OUT_DTYPE,
        False)
    if FP8:  # the block's amax of S, reduced by the wrapper: what the recipe records
        a = tl.maximum(tl.maximum(_groups_amax(s00, s01, s02, s03), _groups_amax(s10, s11, s12, s13)),
                       tl.maximum(_groups_amax(s20, s21, s22, s23), _groups_amax(s30, s31, s32, s33)))
        tl.store(partial_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), a)
    _store_forms(s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33, inv_scale_ptr,
                 vals_ptr, meta_ptr, vals_t_ptr, meta_t_ptr, r0, c0, n_rows, n_cols, WRITE_W, WRITE_T, FP8, FMAX,
                 MBITS, EMIN, SIGN_OFF, TILE_COLS)


def check_mask_in_place(mask: torch.Tensor) -> None:
    """The mask a refresh kernel reads and writes in place as int32 words (kernels 21 and 24): contiguous, on a
    4-byte boundary."""
    if not mask.is_contiguous() or mask.storage_offset() % 4:
        raise ValueError(f"mask must be contiguous and start on a 4-byte boundary (the kernel reads and writes it in "
                         f"place as int32 words), got strides {mask.stride()} and storage offset "
                         f"{mask.storage_offset()} for shape {tuple(mask.shape)}")


def _compressed_outputs(rows: int, cols: int, dtype: torch.dtype, device):
    """An empty compressed operand of a (rows, cols) matrix and the two views the kernel writes: the
    values (int16) and the metadata (uint8) (``prepare24``'s layout)."""
    from sparsity_lab.references import cusparselt_layout as layout

    out = torch.empty(layout.compressed_shape(rows, cols, dtype), dtype=dtype, device=device)
    n_values = rows * cols // 2
    return out, out.view(torch.int16).reshape(-1)[:n_values], out.view(torch.uint8).reshape(-1)[2 * n_values:]


def refresh24(w: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | float | None = None,
              out_dtype: torch.dtype | None = None, forward: bool = True, transposed: bool = True,
              count: bool = True, num_warps: int = DEFAULT_WARPS
              ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The transposable 2:4 mask of ``w`` written into ``mask`` in place, its flips, and S(W), S(W)^T compressed.

    w: (out, in) float32 / bfloat16 / float16, any strides; out and in multiples of 64.
    mask: bool (out, in), contiguous: the previous mask on entry, the new one on return.
    beta: None for ``w.to(dtype) * mask`` (STE family), else the S-STE scale (a float or a 0-d float
    tensor on w's device). out_dtype: bfloat16 / float16 (default: w's dtype; unused when no form is written).
    forward / transposed: which compressed forms to write (each may be left out, both too: then only
    the mask and its flips). count: count the flips (a first mask has nothing to count against).

    Returns ``(flips, fwd, bwd)``, the results of the unfused chain::

        new = transposable_mask24(w, pruned=False)[0]
        flips = count_flips(mask, new)          # 0-d int64 on w's device; None when count=False
        mask.copy_(new)
        fwd, bwd = prepare24(w, mask, beta, out_dtype, forward, transposed)   # None where not asked
    """
    if not (forward or transposed):  # the mask and its flips only: no product dtype to check
        out_dtype = out_dtype or torch.bfloat16
    out_dtype = out_dtype or w.dtype
    check_tensor(w, "w", HALF_AND_FLOAT)
    if w.dim() == 2 and (w.shape[0] % TILE or w.shape[1] % TILE):
        raise ValueError(f"w has shape {tuple(w.shape)}; out and in must be multiples of {TILE} (whole 64 x 64 "
                         "tiles of the compressed layout): for other shapes run transposable_mask24, count_flips "
                         "and torch._cslt_compress separately")
    beta = check_weight_mask_beta(w, mask, beta, out_dtype, "out_dtype")
    check_mask_in_place(mask)
    rows, cols = w.shape
    mask_words = mask.view(torch.int32)  # (out, in / 4): in is a multiple of 64
    flips = torch.zeros((), dtype=torch.int64, device=w.device) if count else None
    fwd, fwd_vals, fwd_meta = _compressed_outputs(rows, cols, out_dtype, w.device) if forward else (None, w, w)
    bwd, bwd_vals, bwd_meta = _compressed_outputs(cols, rows, out_dtype, w.device) if transposed else (None, w, w)
    _refresh24_kernel[(rows // TILE, cols // TILE)](
        w, mask_words, beta.reshape(()).float() if beta is not None else w, flips if count else mask_words,
        fwd_vals, fwd_meta, bwd_vals, bwd_meta, w, w, w.stride(0), w.stride(1), rows, cols,
        SOFT=beta is not None, COUNT=count, WRITE_W=forward, WRITE_T=transposed, OUT_DTYPE=_TL_DTYPES[out_dtype],
        num_warps=num_warps)
    # the kernel wrote the mask in place: its version counter says so, as mask.copy_(new) would
    torch.autograd.graph.increment_version(mask)
    return flips, fwd, bwd



def refresh24_fp8(w: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | float | None, inv_scale: torch.Tensor,
                  dtype: torch.dtype = torch.bfloat16, forward: bool = True, transposed: bool = True,
                  count: bool = True, num_warps: int = DEFAULT_WARPS):
    """:func:`refresh24` with E4M3 operands: the mask in place, its flips, q(S(W)) and q(S(W))^T compressed in
    cuSPARSELt's FP8 layout, and amax(S(W)), in one pass over W.

    Arguments as :func:`refresh24`; inv_scale: float32 one-element tensor on w's device, ``fp8_max / amax``
    (read on the device: the recipe's delayed scale); dtype: what S is rounded to before the cast (the layer's
    compute dtype, bfloat16 or float16).

    Returns ``(flips, fwd, bwd, amax)``, the chain kernel 2 -> ``count_flips`` -> the copy ->
    ``prepare24_fp8(w, mask, beta, inv_scale, dtype, forward, transposed)``, bit for bit (fwd / bwd None where
    not asked); amax a float32 0-d tensor, the amax of S of the new mask in ``dtype``, also when neither form
    is written.
    """
    from sparsity_lab.references import cusparselt_layout as layout

    check_tensor(w, "w", HALF_AND_FLOAT)
    if w.dim() == 2 and (w.shape[0] % TILE or w.shape[1] % TILE):
        raise ValueError(f"w has shape {tuple(w.shape)}; out and in must be multiples of {TILE} (whole 64 x 64 "
                         "tiles of the compressed layout)")
    beta = check_weight_mask_beta(w, mask, beta, dtype, "dtype")
    if not isinstance(inv_scale, torch.Tensor) or inv_scale.numel() != 1 or inv_scale.dtype != torch.float32:
        raise TypeError("inv_scale must be a float32 tensor with one element (fp8_max / amax)")
    check_device(_refresh24_kernel, w=w, inv_scale=inv_scale)
    check_mask_in_place(mask)
    check_fp8_device(w.device)
    rows, cols = w.shape
    fp8_dtype, fmax = fp8_format("e4m3")
    mbits, emin = _GRID["e4m3"]
    grid = (rows // TILE, cols // TILE)
    partial = torch.empty(grid[0] * grid[1], dtype=torch.float32, device=w.device)
    flips = torch.zeros((), dtype=torch.int64, device=w.device) if count else None

    def empty(r: int, c: int):  # kernel 18's outputs: the values' bytes, then the metadata
        out = torch.empty(layout.compressed_shape(r, c, fp8_dtype), dtype=fp8_dtype, device=w.device)
        flat = out.view(torch.uint8).reshape(-1)
        return out, flat[:r * c // 2], flat[r * c // 2:]

    fwd, fwd_vals, fwd_meta = empty(rows, cols) if forward else (None, partial, partial)
    bwd, bwd_vals, bwd_meta = empty(cols, rows) if transposed else (None, partial, partial)
    _refresh24_kernel[grid](
        w, mask.view(torch.int32), beta.reshape(()).float() if beta is not None else partial,
        flips if count else partial, fwd_vals, fwd_meta, bwd_vals, bwd_meta, inv_scale.reshape(()), partial,
        w.stride(0), w.stride(1), rows, cols, SOFT=beta is not None, COUNT=count, WRITE_W=forward,
        WRITE_T=transposed, OUT_DTYPE=_TL_DTYPES[dtype], FP8=True, FMAX=fmax, MBITS=mbits, EMIN=emin, SIGN_OFF=0x7F,
        TILE_COLS=64, num_warps=num_warps)
    torch.autograd.graph.increment_version(mask)  # written in place, as mask.copy_(new) would say
    return flips, fwd, bwd, partial.amax()
