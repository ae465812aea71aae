"""The layout of ``torch._cslt_compress`` on sm90 (H100), mapped by measurement, and a reference.

Mapped from dumps of the op's output on the H100 (torch 2.11, cuSPARSELt 0.8.0;
``python -m benchmarks.cusparselt_layout_dump``): random 2:4 matrices of bf16 / fp16 /
fp8 e4m3 at 14 shapes from 32x64 to 2048x512, decoded offline; one formula reproduced every
metadata nibble of every dump. For A (rows, cols), 2:4 along its rows (groups of 4 columns):

values    the kept entries in row-major order, two per group (lower column first):
          ``rows * cols / 2`` elements of A's dtype.
metadata  right after the values, one 4-bit code per group: ``i | (j << 2)`` for kept columns
          i < j of the group (so (0,1) -> 4, (0,2) -> 8, (1,2) -> 9, (0,3) -> 12, (1,3) -> 13,
          (2,3) -> 14). Nibble ``p`` of the metadata is the low half of byte ``p // 2`` when p is
          even. Groups are tiled: 64 rows x T groups (T = 8 for 16-bit dtypes, 16 for 8-bit);
          tiles are stored column-tile-fastest, ``tile = R * col_tiles + C`` with R = row // 64,
          C = group // T, and within a tile the nibble index is a bit permutation of the row r
          (6 bits) and group g (3 or 4 bits) within the tile:

              16-bit: p = r3 | g2<<1 | g0<<2 | g1<<3 | r0<<4 | r1<<5 | r2<<6 | r4<<7 | r5<<8
              8-bit : p = g0 | r3<<1 | g3<<2 | g1<<3 | g2<<4 | r0<<5 | r1<<6 | r2<<7 | r4<<8 | r5<<9

          so ``nibble = tile * 64 * T + p``.

Shapes whose rows are not a multiple of 64 or whose columns are not a multiple of 64 (for 16-bit
dtypes too: 1056 columns got a padded allocation on the H100) are padded by cuSPARSELt, and the
padded allocation's size was not mapped: the fast compressor (``kernels/compress24.py``) takes only
rows and columns that are multiples of 64, for which the output is exactly
``rows * cols * 9 / 16`` (16-bit) or ``rows * cols * 10 / 16`` (8-bit) elements — the sizes
``_cslt_compress`` returns there. Other shapes keep using ``_cslt_compress`` (and say so).
"""
from __future__ import annotations

import torch

ROW_TILE = 64
# measured on the H100: 16-bit shapes whose columns are an odd number of 32-column tiles get a
# padded (larger) allocation from _cslt_compress, so the fast path asks 64 columns for every dtype
COL_MULTIPLE = 64
# per element size: groups per tile and the (source bit, destination bit) pairs of the permutation
_LAYOUTS = {
    2: dict(tile_groups=8, rows=((3, 0), (0, 4), (1, 5), (2, 6), (4, 7), (5, 8)), groups=((2, 1), (0, 2), (1, 3))),
    1: dict(tile_groups=16, rows=((3, 1), (0, 5), (1, 6), (2, 7), (4, 8), (5, 9)),
            groups=((0, 0), (3, 2), (1, 3), (2, 4))),
}
FAST_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)
CODES = {(0, 1): 4, (0, 2): 8, (1, 2): 9, (0, 3): 12, (1, 3): 13, (2, 3): 14}


def tile_groups(dtype: torch.dtype) -> int:
    """Groups of 4 columns per metadata tile: 8 for 16-bit dtypes, 16 for 8-bit ones."""
    return _LAYOUTS[torch.empty(0, dtype=dtype).element_size()]["tile_groups"]


def fast_layout_problem(rows: int, cols: int, dtype: torch.dtype) -> str | None:
    """Why (rows, cols, dtype) is outside the mapped whole-tile layout, or None when it is inside."""
    if dtype not in FAST_DTYPES:
        return f"dtype {dtype} is not one of {FAST_DTYPES}"
    col_mult = COL_MULTIPLE
    if rows % ROW_TILE or cols % col_mult:
        return (f"shape ({rows}, {cols}) is not whole tiles (rows a multiple of {ROW_TILE}, "
                f"cols a multiple of {col_mult} for {dtype})")
    return None


def compressed_shape(rows: int, cols: int, dtype: torch.dtype) -> tuple[int, int]:
    """The shape ``_cslt_compress`` returns on the H100 for whole-tile shapes (elements of ``dtype``)."""
    per_row = cols * 9 // 16 if torch.empty(0, dtype=dtype).element_size() == 2 else cols * 10 // 16
    return rows, per_row


def metadata_nibble_index(rows: int, cols: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """int64 (rows, cols // 4): the metadata nibble each group's code goes to (whole-tile shapes)."""
    problem = fast_layout_problem(rows, cols, dtype)
    if problem:
        raise ValueError(problem)
    layout = _LAYOUTS[torch.empty(0, dtype=dtype).element_size()]
    t = layout["tile_groups"]
    r = torch.arange(rows, device=device)[:, None]
    g = torch.arange(cols // 4, device=device)[None, :]
    within = torch.zeros(rows, cols // 4, dtype=torch.int64, device=device)
    for src, dst in layout["rows"]:
        within |= ((r >> src) & 1) << dst
    for src, dst in layout["groups"]:
        within |= ((g >> src) & 1) << dst
    tile = (r // ROW_TILE) * (cols // 4 // t) + g // t
    return tile * (ROW_TILE * t) + within


def kept_pairs(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(i, j), each int64 (rows, cols // 4): the two kept columns of each group, i < j.

    Kept = non-zero (a signed zero counts as zero). A group with fewer than two non-zeros gets the
    first non-zero of columns 0..2 (else 0) and the last non-zero after it (else 3): the kept
    values that are zero make the product the same whichever columns are named.
    """
    rows, cols = a.shape
    nz = (a.reshape(rows, cols // 4, 4) != 0)
    n0, n1, n2, n3 = nz.unbind(-1)
    i = torch.where(n0, 0, torch.where(n1, 1, torch.where(n2, 2, 0)))
    j = torch.where(n3 & (i < 3), 3, torch.where(n2 & (i < 2), 2, torch.where(n1 & (i < 1), 1, 3)))
    return i, j


def compress24_reference(a: torch.Tensor) -> torch.Tensor:
    """Plain-PyTorch equivalent of ``_cslt_compress(a)`` for whole-tile shapes (any device).

    a: (rows, cols) bfloat16 / float16 / float8_e4m3fn, at most 2 non-zeros per group of 4 along
    the rows (any strides). Returns ``compressed_shape(rows, cols, a.dtype)`` of a's dtype.
    """
    if a.dim() != 2:
        raise ValueError(f"a must be 2-D (rows, cols), got shape {tuple(a.shape)}")
    rows, cols = a.shape
    problem = fast_layout_problem(rows, cols, a.dtype)
    if problem:
        raise ValueError(f"a: {problem}")
    bits = a.view(torch.int16 if a.element_size() == 2 else torch.uint8)
    i, j = kept_pairs(a)
    grouped = bits.reshape(rows, cols // 4, 4)
    values = torch.stack([grouped.gather(-1, i[..., None])[..., 0], grouped.gather(-1, j[..., None])[..., 0]], -1)
    codes = (i | (j << 2)).to(torch.uint8)
    nibbles = torch.empty(rows * cols // 4, dtype=torch.uint8, device=a.device)
    nibbles[metadata_nibble_index(rows, cols, a.dtype, a.device).reshape(-1)] = codes.reshape(-1)
    meta = nibbles[0::2] | (nibbles[1::2] << 4)
    out = torch.empty(compressed_shape(rows, cols, a.dtype), dtype=a.dtype, device=a.device)
    flat = out.view(torch.uint8).reshape(-1)
    value_bytes = values.reshape(-1).contiguous().view(torch.uint8)
    flat[:value_bytes.numel()] = value_bytes
    flat[value_bytes.numel():] = meta
    return out


def decompress24_reference(compressed: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The dense (rows, cols) matrix a compressed operand stands for (the inverse of the layout)."""
    dtype = compressed.dtype
    problem = fast_layout_problem(rows, cols, dtype)
    if problem:
        raise ValueError(problem)
    if tuple(compressed.shape) != compressed_shape(rows, cols, dtype):
        raise ValueError(f"compressed has shape {tuple(compressed.shape)}, expected {compressed_shape(rows, cols, dtype)}")
    int_type = torch.int16 if compressed.element_size() == 2 else torch.uint8
    flat = compressed.contiguous().view(torch.uint8).reshape(-1)
    n_value_bytes = rows * cols // 2 * compressed.element_size()
    values = flat[:n_value_bytes].view(int_type).reshape(rows, cols // 4, 2)
    meta = flat[n_value_bytes:]
    nibbles = torch.stack([meta & 15, meta >> 4], -1).reshape(-1)
    codes = nibbles[metadata_nibble_index(rows, cols, dtype, compressed.device)].long()
    i, j = codes & 3, codes >> 2
    if bool((i >= j).any()):
        raise ValueError("compressed holds a metadata code that is not i | j << 2 with i < j")
    dense = torch.zeros(rows, cols // 4, 4, dtype=int_type, device=compressed.device)
    dense.scatter_(-1, i[..., None], values[..., :1])
    dense.scatter_(-1, j[..., None], values[..., 1:])
    return dense.reshape(rows, cols).view(dtype)
