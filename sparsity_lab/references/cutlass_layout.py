"""The layout of CUTLASS's SM90 structured-sparse operand (``backends/cutlass/ops.compress``), and a reference.

Derived from the CUTLASS 4.2 headers (``cutlass/gemm/collective/builders/sm90_sparse_config.inl``:
``Sm90GemmSparseConfig`` with the GEMMs' K tile of 128; ``cutlass/transform/kernel/
sm90_sparse_gemm_compressor.hpp``: the compressor) and checked against the compressor's output on the
H200 (``python -m benchmarks.cutlass_layout_dump``: random 2:4 matrices, bit planes of the group index,
the six pair codes and base-16 digits of the group index as values, bf16 and E4M3, 13 shapes from 64x64
to 1024x1024; every byte reproduced, ``tests/test_cutlass_layout.py``). For A (m, k), 2:4 along k
(groups of 4 columns):

values    (m, k / 2) of A's dtype, row-major: group g of row r keeps its two entries at columns
          2g, 2g + 1 (lower column first). No padding (k / 2 is a whole number of 16-byte rows).
metadata  one byte per 8 columns: ``round_up(m, 64) * round_up(k, 128) / 8`` bytes (uint8), one 4-bit
          code per group, ``i | (j << 2)`` for kept columns i, j (the same codes as cuSPARSELt:
          (0,1) -> 4, (0,2) -> 8, (1,2) -> 9, (0,3) -> 12, (1,3) -> 13, (2,3) -> 14). Nibble ``p`` is
          the low half of byte ``p // 2`` when p is even. The metadata is tiled in atoms of 64 rows x 128
          columns (32 groups, 1024 bytes); atoms go down the rows first
          (``atom = (g // 32) * (round_up(m, 64) / 64) + r // 64``), and inside one the nibble is a bit
          permutation of the row r (6 bits) and group g (5 bits) within it:

              16-bit: p = g0 | g1<<1 | r3<<2 | g3<<3 | g4<<4 | r0<<5 | r1<<6 | r2<<7 | g2<<8 | r4<<9 | r5<<10
              8-bit : p = g0 | g1<<1 | g2<<2 | g3<<3 | g4<<4 | r0<<5 | ... | r5<<10   (row-major: g + 32 r)

          so ``nibble = atom * 2048 + p``. Rows past m and groups past k / 4 (the padding) hold 0.

Which entries are kept: the non-zero ones, a signed zero counted as zero (the compressor masks the sign
bit). A group with fewer than two non-zeros is filled with +0.0 and named by the compressor's rule:
none -> columns (0, 0), code 0 (not a pair, with both values zero: CUTLASS's products take it, as
tests/test_cutlass_backend.py's -0.0 test multiplies such groups); one in column c < 3 -> (c, 3) with
the value first; one in column 3 -> (0, 3) with the value second. A -0.0 is never copied: its slot
holds +0.0. (``cusparselt_layout.kept_pairs`` names an empty group (0, 3) and copies a -0.0 slot as it is.)

A group with more than two non-zeros is not 2:4: the compressor's output is undefined, and
:func:`compress` refuses it.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

DTYPES = (torch.bfloat16, torch.float8_e4m3fn)
ATOM_ROWS = 64  # rows of a metadata atom
ATOM_COLS = 128  # columns of a metadata atom: the K tile of every GEMM variant (32 groups)
ATOM_NIBBLES = ATOM_ROWS * ATOM_COLS // 4
# (source bit, destination bit) of the nibble permutation inside an atom, per element size
_ROW_BITS = {2: ((3, 2), (0, 5), (1, 6), (2, 7), (4, 9), (5, 10)), 1: tuple((b, 5 + b) for b in range(6))}
_GROUP_BITS = {2: ((0, 0), (1, 1), (3, 3), (4, 4), (2, 8)), 1: tuple((b, b) for b in range(5))}
_SIGN_OFF = {2: 0x7FFF, 1: 0x7F}


class CompressedShape(NamedTuple):
    """What ``sl_cutlass_compressed_shape`` reports: the values (m, k / 2) in elements of A's dtype and the
    metadata (rows, bytes per row), uint8."""

    values: tuple[int, int]
    metadata: tuple[int, int]

    @property
    def metadata_bytes(self) -> int:
        return self.metadata[0] * self.metadata[1]


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def row_multiple(dtype: torch.dtype) -> int:
    """k must be a multiple of this: the compressed rows (k / 2 elements) are whole 16-byte rows."""
    return 32 // torch.empty((), dtype=dtype).element_size()


def layout_problem(m: int, k: int, dtype: torch.dtype) -> str | None:
    """Why (m, k, dtype) is not a shape ``ops.compress`` takes, or None."""
    if dtype not in DTYPES:
        return f"dtype must be one of {DTYPES}, got {dtype}"
    if m <= 0 or k <= 0:
        return f"the shape must be positive, got ({m}, {k})"
    if k % row_multiple(dtype):
        return (f"k={k} must be a multiple of {row_multiple(dtype)} for {dtype} (the compressed rows hold k/2 "
                "elements, 16-byte aligned)")
    return None


def _check(m: int, k: int, dtype: torch.dtype, what: str) -> None:
    problem = layout_problem(m, k, dtype)
    if problem:
        raise ValueError(f"{what}: {problem}")


def compressed_shape(m: int, k: int, dtype: torch.dtype) -> CompressedShape:
    """The shapes ``ops.compress`` allocates for an (m, k) operand (metadata padded to whole atoms)."""
    _check(m, k, dtype, "compressed_shape")
    return CompressedShape((m, k // 2), (_round_up(m, ATOM_ROWS), _round_up(k, ATOM_COLS) // 8))


def metadata_nibble_index(m: int, k: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """int64 (m, k // 4): the metadata nibble that each group's code goes to."""
    _check(m, k, dtype, "metadata_nibble_index")
    size = torch.empty((), dtype=dtype).element_size()
    r = torch.arange(m, device=device)[:, None]
    g = torch.arange(k // 4, device=device)[None, :]
    within = torch.zeros(m, k // 4, dtype=torch.int64, device=device)
    for src, dst in _ROW_BITS[size]:
        within |= ((r >> src) & 1) << dst
    for src, dst in _GROUP_BITS[size]:
        within |= ((g >> src) & 1) << dst
    atom = (g // (ATOM_COLS // 4)) * (_round_up(m, ATOM_ROWS) // ATOM_ROWS) + r // ATOM_ROWS
    return atom * ATOM_NIBBLES + within


def _int_view(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.uint8)


def kept_columns(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(i, j, counts), each int64 (m, k // 4): the two columns each group's metadata names (the compressor's
    rule for groups with fewer than two non-zeros: module docstring) and how many non-zeros it has."""
    m, k = a.shape
    nz = (_int_view(a).to(torch.int32) & _SIGN_OFF[a.element_size()]).ne(0).reshape(m, k // 4, 4)
    counts = nz.sum(-1)
    col = torch.arange(4, device=a.device)
    first = torch.where(nz, col, 4).amin(-1)  # 4 where none
    last = torch.where(nz, col, -1).amax(-1)
    i = torch.where(counts == 0, 0, torch.where((counts == 1) & (first == 3), 0, first))
    j = torch.where(counts == 0, 0, torch.where(counts == 1, 3, last))
    return i, j, counts


def compress(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-PyTorch equivalent of ``ops.compress(a)`` (any device): ``(values, metadata)``.

    a: (m, k) bfloat16 / float8_e4m3fn, at most 2 non-zeros per group of 4 along k (any strides).
    Returns values (m, k / 2) of a's dtype and metadata uint8 (``compressed_shape(...).metadata_bytes``,)
    as the compressor writes them, byte for byte."""
    if a.dim() != 2:
        raise ValueError(f"a must be 2-D (m, k), got shape {tuple(a.shape)}")
    m, k = a.shape
    _check(m, k, a.dtype, "a")
    i, j, counts = kept_columns(a)
    if bool((counts > 2).any()):
        raise ValueError("a is not 2:4 along k: some group of 4 has more than 2 non-zeros (a signed zero counts "
                         "as zero)")
    bits = _int_view(a).reshape(m, k // 4, 4)
    keep = (bits.to(torch.int32) & _SIGN_OFF[a.element_size()]).ne(0)
    bits = torch.where(keep, bits, torch.zeros_like(bits))  # a -0.0 is not copied: its slot holds +0.0
    v0 = bits.gather(-1, i[..., None])[..., 0]
    v1 = bits.gather(-1, j[..., None])[..., 0]
    v1 = torch.where(i == j, torch.zeros_like(v1), v1)  # an empty group names (0, 0): both slots zero
    values = torch.stack([v0, v1], -1).reshape(m, k // 2).view(a.dtype)
    shape = compressed_shape(m, k, a.dtype)
    nibbles = torch.zeros(2 * shape.metadata_bytes, dtype=torch.uint8, device=a.device)
    nibbles[metadata_nibble_index(m, k, a.dtype, a.device).reshape(-1)] = (i | (j << 2)).to(torch.uint8).reshape(-1)
    return values, nibbles[0::2] | (nibbles[1::2] << 4)


def decompress(values: torch.Tensor, metadata: torch.Tensor, m: int, k: int) -> torch.Tensor:
    """The dense (m, k) matrix that a compressed operand stands for (the inverse of :func:`compress`).
    Refuses a metadata code the compressor does not write (i >= j other than an empty group's (0, 0))."""
    dtype = values.dtype
    shape = compressed_shape(m, k, dtype)
    if tuple(values.shape) != shape.values:
        raise ValueError(f"values has shape {tuple(values.shape)}, expected {shape.values}")
    if metadata.dtype != torch.uint8 or metadata.numel() != shape.metadata_bytes:
        raise ValueError(f"metadata must be {shape.metadata_bytes} uint8 bytes, got {metadata.numel()} "
                         f"{metadata.dtype}")
    meta = metadata.reshape(-1)
    nibbles = torch.stack([meta & 15, meta >> 4], -1).reshape(-1)
    codes = nibbles[metadata_nibble_index(m, k, dtype, meta.device)].long()
    i, j = codes & 3, codes >> 2
    pairs = _int_view(values.contiguous()).reshape(m, k // 4, 2)
    empty = (i == 0) & (j == 0) & pairs.eq(0).all(-1)
    if bool(((i >= j) & ~empty).any()):
        raise ValueError("metadata holds a code that is not i | j << 2 with i < j (nor an empty group's 0)")
    dense = torch.zeros(m, k // 4, 4, dtype=pairs.dtype, device=values.device)
    dense.scatter_(-1, j[..., None], pairs[..., 1:])
    dense.scatter_(-1, i[..., None], pairs[..., :1])  # after j: an empty group's (0, 0) keeps the zero
    return dense.reshape(m, k).view(dtype)
