"""Kernel 8: compress a 2:4 matrix into cuSPARSELt's sm90 layout, at memory speed.

The idea
    ``torch._cslt_compress`` is slow on the H100: far below the copy rate, so that compressing a
    large weight every step costs more than the sparse product saves (docs/measuring.md;
    ``results/kernels_h100.json``, the "8 compress24" row against ``_cslt_compress``).
    Its output layout on sm90 was mapped by measurement (``sparsity_lab/references/cusparselt_layout.py`` states it and holds the plain
    PyTorch reference ``compress24_reference``): the kept values row-major, then one 4-bit code
    ``i | j << 2`` per group, placed by a bit permutation of (row, group) inside 64-row tiles.
    This kernel writes exactly those bytes in one pass.

    Each program loads 64 rows x ``4 * BLOCK_G`` columns in one 2-D load, splits the groups' four
    members in registers and stores each row's kept values as one contiguous run. The two nibbles
    of a metadata byte belong to rows r and r + 8 of the same group (16-bit dtypes) or to groups g
    and g + 1 of the same row (8-bit): a reshape (and for 16-bit a permute) pairs them in
    registers, so the program writes whole bytes and no two programs touch one byte. Values and codes are computed on the raw bits (int16 / uint8), so
    bf16, fp16 and fp8 share the code path and values are copied exactly; "kept" means non-zero
    ignoring the sign bit (a pruned ``-w * 0`` is ``-0.0``).

    The input may have any strides: compressing ``W.t()`` (for the input-gradient product) or
    ``MVUE(dZ).t()`` (the weight gradient's 2:4 operand) reads the transposed view directly, with
    no transpose copy.

Bytes (A of rows x cols, element size s)
    read ``s * rows * cols``; write ``s * rows * cols / 2`` (values) + ``rows * cols / 8`` (codes).

Precondition: at most two non-zeros per group of 4 along the rows (a 2:4-pruned matrix); the
wrapper does not check it (``check=True`` does, at the cost of an extra pass).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_device, check_tensor

ROW_TILE = 64


# The 4-bit code i | j << 2 of a group from its non-zero flags b = n0 | n1 << 1 | n2 << 2 | n3 << 3, one nibble per
# b: _PICK_CODES_LO for b < 8, _PICK_CODES_HI for b >= 8 (n3 set: j = 3). Derived from the rule in _pick's
# docstring (tests/test_kernels_compress24.py checks every b): one table lookup instead of compare-and-select chains.
_PICK_CODES_LO = tl.constexpr(0x898E4DCC)
_PICK_CODES_HI = tl.constexpr(0xCDCECDCC)


@triton.jit
def _pick(x0, x1, x2, x3, SIGN_OFF: tl.constexpr, TABLE: tl.constexpr = True):
    """Kept columns (i < j) of each group, their raw values and the 4-bit code i | j << 2.

    i is the first non-zero of x0, x1, x2 (0 if none), j the first non-zero after i looking from x3 down to x1
    (3 if none): groups with fewer than two non-zeros keep zeros in the free slots, as cuSPARSELt's compressor
    does. TABLE: the code from a table over the four flags and the values selected by the same rule; else the
    compare-and-select chains over i and j. Both give the same bytes. Which is faster depends on the kernel
    around it (Triton 3.6 on the H200, ``results/kernels_ab_h200_*.json``): the table in the weight kernels (11,
    21, 22, 24), the chains in the MVUE kernels' bf16 form (10, 23).
    """
    n0 = (x0 & SIGN_OFF) != 0
    n1 = (x1 & SIGN_OFF) != 0
    n2 = (x2 & SIGN_OFF) != 0
    n3 = (x3 & SIGN_OFF) != 0
    if TABLE:
        shift = tl.where(n0, 4, 0) + tl.where(n1, 8, 0) + tl.where(n2, 16, 0)
        code = (tl.where(n3, _PICK_CODES_HI, _PICK_CODES_LO) >> shift) & 0xF
        # i = 1: n1 first; i = 2: n2 first; else i = 0. j = 3: n3 or nothing found; j = 2: n2 after a non-zero i
        v0 = tl.where(n1 & ~n0, x1, tl.where(n2 & ~(n0 | n1), x2, x0))
        v1 = tl.where(n3, x3, tl.where(n2 & (n0 | n1), x2, tl.where(n1 & n0, x1, x3)))
    else:
        i = tl.where(n0, 0, tl.where(n1, 1, tl.where(n2, 2, 0)))
        j = tl.where(n3 & (i < 3), 3, tl.where(n2 & (i < 2), 2, tl.where(n1 & (i < 1), 1, 3)))
        v0 = tl.where(i == 0, x0, tl.where(i == 1, x1, x2))
        v1 = tl.where(j == 3, x3, tl.where(j == 2, x2, x1))
        code = i | (j << 2)
    return v0, v1, code


@triton.jit
def _nibble(r, g, col_tiles, EIGHT_BIT: tl.constexpr):
    """The metadata nibble index of group (r, g): cusparselt_layout.metadata_nibble_index."""
    rw = r % 64
    if EIGHT_BIT:
        gw = g % 16
        tile = (r // 64) * col_tiles + g // 16
        p = ((gw & 1) | (((rw >> 3) & 1) << 1) | (((gw >> 3) & 1) << 2) | (((gw >> 1) & 1) << 3)
             | (((gw >> 2) & 1) << 4) | ((rw & 1) << 5) | (((rw >> 1) & 1) << 6) | (((rw >> 2) & 1) << 7)
             | (((rw >> 4) & 1) << 8) | (((rw >> 5) & 1) << 9))
        return tile * 1024 + p
    else:
        gw = g % 8
        tile = (r // 64) * col_tiles + g // 8
        p = (((rw >> 3) & 1) | (((gw >> 2) & 1) << 1) | ((gw & 1) << 2) | (((gw >> 1) & 1) << 3)
             | ((rw & 1) << 4) | (((rw >> 1) & 1) << 5) | (((rw >> 2) & 1) << 6) | (((rw >> 4) & 1) << 7)
             | (((rw >> 5) & 1) << 8))
        return tile * 512 + p


@triton.jit
def _store_compressed(vals_ptr, meta_ptr, row0, g0, v0, v1, code, half_cols, col_tiles,
                      EIGHT_BIT: tl.constexpr, BLOCK_G: tl.constexpr, STEP: tl.constexpr = 1,
                      OFFSET: tl.constexpr = 0):
    """Write a 64-row x BLOCK_G-group tile: kept values (v0, v1) and 4-bit codes, each (64, BLOCK_G).

    STEP, OFFSET: the tile's rows row0 + OFFSET + STEP * i, i < 64 / STEP, only (v0, v1, code then have
    64 / STEP rows): kernel 21 writes every fourth row of a tile at a time (16-bit dtypes, STEP 1 or 4)."""
    rows = row0 + OFFSET + STEP * tl.arange(0, 64 // STEP)
    # values: (v0, v1) of group g at columns 2g, 2g + 1 of the row: one contiguous store per row
    tl.store(vals_ptr + rows[:, None] * half_cols + (2 * g0 + tl.arange(0, 2 * BLOCK_G))[None, :],
             tl.reshape(tl.join(v0, v1), [64 // STEP, 2 * BLOCK_G]))
    if EIGHT_BIT:  # a byte holds groups (g, g + 1) of one row: lo = even groups
        lo, hi = tl.split(tl.reshape(code, [64 // STEP, BLOCK_G // 2, 2]))
        nib = _nibble(rows[:, None], g0 + 2 * tl.arange(0, BLOCK_G // 2)[None, :], col_tiles, EIGHT_BIT)
    else:  # a byte holds rows (r, r + 8) of one group: r = 16a + 8b + c, lo = b == 0
        # each (4, 8 / STEP, BLOCK_G)
        lo, hi = tl.split(tl.permute(tl.reshape(code, [4, 2, 8 // STEP, BLOCK_G]), (0, 2, 3, 1)))
        r_lo = row0 + OFFSET + 16 * tl.arange(0, 4)[:, None, None] + STEP * tl.arange(0, 8 // STEP)[None, :, None]
        nib = _nibble(r_lo, g0 + tl.arange(0, BLOCK_G)[None, None, :], col_tiles, EIGHT_BIT)
    tl.store(meta_ptr + (nib >> 1), (lo | (hi << 4)).to(tl.uint8))


@triton.jit
def _compress24_kernel(a_ptr, vals_ptr, meta_ptr, stride_r, stride_c, half_cols, col_tiles,
                       EIGHT_BIT: tl.constexpr, BLOCK_G: tl.constexpr, SIGN_OFF: tl.constexpr):
    row0 = tl.program_id(0) * 64
    g0 = tl.program_id(1) * BLOCK_G
    rows = tl.arange(0, 64)
    # one 2-D load of 64 rows x 4*BLOCK_G columns (coalesced along whichever axis has stride 1)
    x = tl.load(a_ptr + (row0 + rows)[:, None] * stride_r + (4 * g0 + tl.arange(0, 4 * BLOCK_G))[None, :] * stride_c)
    even, odd = tl.split(tl.reshape(x, [64, BLOCK_G, 2, 2]))  # even[r, g, a] = member 2a of group g
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    v0, v1, code = _pick(x0, x1, x2, x3, SIGN_OFF)  # each (64, BLOCK_G)
    _store_compressed(vals_ptr, meta_ptr, row0, g0, v0, v1, code, half_cols, col_tiles, EIGHT_BIT, BLOCK_G)


def _layout():  # the package's layout description (imported lazily: kernels never import backends at load)
    from sparsity_lab.references import cusparselt_layout
    return cusparselt_layout


def compress24(a: torch.Tensor, block_groups: int | None = None, check: bool = False,
               num_warps: int = 4) -> torch.Tensor:
    """cuSPARSELt's compressed form of the 2:4 matrix ``a``, bit for bit as ``torch._cslt_compress``.

    a: (rows, cols) bfloat16 / float16 / float8_e4m3fn, any strides, at most 2 non-zeros per group
    of 4 along each row; rows and cols multiples of 64
    (``cusparselt_layout.fast_layout_problem`` says why a shape is refused).
    Returns ``cusparselt_layout.compressed_shape(rows, cols, a.dtype)`` of a's dtype.
    """
    layout = _layout()
    check_tensor(a, "a", layout.FAST_DTYPES)
    if a.dim() != 2:
        raise ValueError(f"a must be 2-D (rows, cols), got shape {tuple(a.shape)}")
    rows, cols = a.shape
    problem = layout.fast_layout_problem(rows, cols, a.dtype)
    if problem:
        raise ValueError(f"a: {problem}; use torch._cslt_compress for such shapes")
    if rows * cols > 2**31 - 1 or (rows - 1) * abs(a.stride(0)) + (cols - 1) * abs(a.stride(1)) > 2**31 - 1:
        raise ValueError(f"a with shape {tuple(a.shape)} and strides {a.stride()} exceeds int32 offsets")
    if check:
        counts = (a.reshape(rows, cols // 4, 4) != 0).sum(-1)
        if int(counts.max()) > 2:
            raise ValueError("a is not 2:4 along its rows: some group of 4 has more than 2 non-zeros")
    check_device(_compress24_kernel, a=a)
    eight_bit = a.element_size() == 1
    tile_groups = 16 if eight_bit else 8
    groups = cols // 4
    if block_groups is None:
        block_groups = next(b for b in (32, 16, 8) if b >= tile_groups and groups % b == 0)
    if block_groups % tile_groups or groups % block_groups or block_groups & (block_groups - 1):
        raise ValueError(f"block_groups must be a power of two, a multiple of {tile_groups} dividing "
                         f"{groups}, got {block_groups}")
    out = torch.empty(layout.compressed_shape(rows, cols, a.dtype), dtype=a.dtype, device=a.device)
    int_type = torch.uint8 if eight_bit else torch.int16
    flat = out.view(int_type).reshape(-1)
    n_values = rows * cols // 2
    values = flat[:n_values]
    meta = out.view(torch.uint8).reshape(-1)[n_values * a.element_size():]
    grid = (rows // ROW_TILE, groups // block_groups)
    _compress24_kernel[grid](a.view(int_type), values, meta, a.stride(0), a.stride(1), cols // 2,
                             groups // tile_groups, EIGHT_BIT=eight_bit, BLOCK_G=block_groups,
                             SIGN_OFF=0x7F if eight_bit else 0x7FFF, num_warps=num_warps)
    return out
