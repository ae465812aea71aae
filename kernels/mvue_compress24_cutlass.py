"""Kernel 23: MVUE 2:4 of the output gradient along the tokens, written straight into CUTLASS's SM90 layout
(bf16, or E4M3 with a given scale and the amax).

The idea
    The CUTLASS backends' weight gradient is ``dW = MVUE(dZ^T) X`` with ``A = MVUE(dZ^T)`` (out, tokens),
    2:4 along the tokens, the compressed operand. Unfused it takes three passes: ``mvue24(dZ, dim=0)``
    writes the dense MVUE(dZ), a transposing copy makes it row-major (CUTLASS's compressor reads rows),
    and the compressor reads it again; FP8 adds a cast between them. Kernel 10 (``mvue_compress24.py``)
    removed those passes for cuSPARSELt's layout; this is the same program with kernel 22's stores
    (``prepare24_cutlass.py``): one program loads 64 output columns x 4 * BLOCK_G tokens of dZ and draws
    what ``mvue24(dz, dim=0, seed)`` draws (kernel 10's ``_mvue_tokens_tile``: same Philox counters,
    same level arithmetic, same rounding to dZ's dtype), then picks the kept pair of each group by
    CUTLASS's compressor's rule (``_pick_cutlass``: a zero slot holds +0.0, an empty group's code is 0)
    and stores values and metadata as ``_store_cutlass`` lays them out. The dense MVUE(dZ) never exists.

Tokens and padding
    The operand's k (tokens) must be a multiple of 16 (bf16) / 32 (E4M3): the weight-gradient paths
    pad dZ and X with zero rows. Here the padding is not written into dZ first: ``tokens`` (default: the
    dZ rows rounded up to that multiple) is the operand's k, the rows past dZ's are read as zeros, and
    their groups are zero (MVUE keeps a zero group as it is); the groups inside dZ draw as in
    ``mvue24`` of the padded dZ (a group's counter depends on its index and the width only). The
    metadata is padded to 64 rows x 128 tokens: programs past the edges write its zeros, so every byte
    of the outputs is written once and nothing is cleared first.

Bytes (dZ of T x N, element size s; operand element size p: 2 for bf16, 1 for E4M3)
    read ``s T N``; write ``p T N / 2`` (values) + ``T N / 8`` (metadata, plus its padding). Unfused bf16:
    ``2 s T N`` (MVUE) + ``2 p T N`` (transposed copy) + ``p T N`` (the compressor's read), then the
    same writes: ``s T N + 3 p T N`` = 8 T N bytes more for a bf16 dZ (FP8 adds the cast's ``(s + p) T N``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparsity_lab.references.fp8 import fp8_format

from ._common import check_device, check_tensor
from .fp8_cast import _GRID, check_fp8_device
from .mvue24 import _load_seed, check_seed
from .mvue_compress24 import _mvue_tokens_fp8_bytes, _mvue_tokens_tile
from .prepare24 import _groups_amax, _operand_bits
from .prepare24_cutlass import _pick_cutlass, _round_up, _store_cutlass

BLOCK_GROUPS = (16, 32)  # token groups per program: whole metadata bytes, and 128-token atoms divide evenly


@triton.jit
def _mvue_compress24_cutlass_kernel(dz_ptr, vals_ptr, meta_ptr, inv_scale_ptr, partial_ptr, n_tokens, n_cols,
                                    k_tokens, seed, BLOCK_G: tl.constexpr, SEED_PTR: tl.constexpr = False,
                                    FP8: tl.constexpr = False, WRITE_VALUES: tl.constexpr = True,
                                    WRITE_AMAX: tl.constexpr = False, FMAX: tl.constexpr = 448.0,
                                    MBITS: tl.constexpr = 3, EMIN: tl.constexpr = -6,
                                    SIGN_OFF: tl.constexpr = 0x7FFF):
    seed = _load_seed(seed, SEED_PTR)
    row0 = tl.program_id(0) * 64  # rows of A = columns of dZ
    g0 = tl.program_id(1) * BLOCK_G  # groups of A = token groups of dZ
    if WRITE_VALUES and FP8:  # E4M3: the two kept values cast, the four bytes rebuilt from the picks
        b0, b1, b2, b3 = _mvue_tokens_fp8_bytes(dz_ptr, row0, g0, n_tokens, n_cols, (n_cols + 3) // 4, seed,
                                                inv_scale_ptr, partial_ptr, BLOCK_G, True, WRITE_AMAX, FMAX, MBITS,
                                                EMIN)
        v0, v1, code = _pick_cutlass(b0, b1, b2, b3, SIGN_OFF)
        _store_cutlass(vals_ptr, meta_ptr, row0, g0, v0, v1, code, n_cols, k_tokens, FP8, BLOCK_G)
        return
    y0, y1, y2, y3 = _mvue_tokens_tile(dz_ptr, row0, g0, n_tokens, n_cols, (n_cols + 3) // 4, seed, BLOCK_G, True)
    if WRITE_AMAX:  # amax of MVUE(dZ) as stored: what the unfused cast of it returns
        tl.store(partial_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), _groups_amax(y0, y1, y2, y3))
    if WRITE_VALUES:
        b0, b1, b2, b3 = _operand_bits(y0, y1, y2, y3, inv_scale_ptr, FP8, FMAX, MBITS, EMIN)
        v0, v1, code = _pick_cutlass(b0, b1, b2, b3, SIGN_OFF, False)  # the chains: faster here (``_pick``)
        _store_cutlass(vals_ptr, meta_ptr, row0, g0, v0, v1, code, n_cols, k_tokens, FP8, BLOCK_G)


def _checked(dz: torch.Tensor, seed, tokens: int | None, block_groups: int | None, dtypes, operand_dtype
             ) -> tuple[int, int]:
    """The argument checks every mode shares; returns (the operand's tokens k, token groups per program)."""
    from sparsity_lab.references import cutlass_layout as layout

    check_tensor(dz, "dz", dtypes)
    if dz.dim() != 2:
        raise ValueError(f"dz must be 2-D (tokens, out), got shape {tuple(dz.shape)}")
    if not dz.is_contiguous():
        raise ValueError("dz must be contiguous (tokens, out): it is read 64 columns by 4 * block_groups tokens")
    rows, out_f = dz.shape
    if out_f < 2:  # mvue24 draws a single column as groups along the last dim: other Philox counters
        raise ValueError(f"dz has shape {tuple(dz.shape)}; out must be at least 2 (mvue24 numbers the groups of "
                         "one column otherwise)")
    multiple = layout.row_multiple(operand_dtype)
    k = _round_up(rows, multiple) if tokens is None else tokens
    if isinstance(k, bool) or not isinstance(k, int) or k < rows or k % multiple:
        raise ValueError(f"tokens must be an int >= dz's {rows} rows and a multiple of {multiple} (the operand's k "
                         f"for {operand_dtype}), got {tokens!r}")
    check_seed(seed, dz)
    block_groups = (16 if operand_dtype == torch.float8_e4m3fn else 32) if block_groups is None else block_groups
    if block_groups not in BLOCK_GROUPS:
        raise ValueError(f"block_groups must be one of {BLOCK_GROUPS}, got {block_groups}")
    if _round_up(k, layout.ATOM_COLS) * _round_up(out_f, layout.ATOM_ROWS) > 2**31 - 1:
        raise ValueError(f"dz with shape {tuple(dz.shape)} padded to {k} tokens exceeds int32 offsets")
    check_device(_mvue_compress24_cutlass_kernel, dz=dz)
    return k, block_groups


def _launch(dz, seed, k, block_groups, num_warps, inv_scale=None, write_values=True):
    """Run kernel 23: bf16 values (``inv_scale`` None) or E4M3; returns ((values, metadata) or None, amax of
    MVUE(dZ) as a float32 0-d tensor or None)."""
    from sparsity_lab.references import cutlass_layout as layout

    rows, out_f = dz.shape
    fp8 = inv_scale is not None
    if fp8:
        check_fp8_device(dz.device)
    operand_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    grid = (triton.cdiv(out_f, 64), _round_up(k, layout.ATOM_COLS) // (4 * block_groups))
    form = None
    values_bits = meta = dz
    if write_values:
        shape = layout.compressed_shape(out_f, k, operand_dtype)
        form = (torch.empty(shape.values, dtype=operand_dtype, device=dz.device),
                torch.empty(shape.metadata_bytes, dtype=torch.uint8, device=dz.device))
        values_bits, meta = form[0].view(torch.uint8 if fp8 else torch.int16), form[1]
    write_amax = fp8 or not write_values
    partial = torch.empty(grid[0] * grid[1] if write_amax else 1, dtype=torch.float32, device=dz.device)
    mbits, emin = _GRID["e4m3"]
    _mvue_compress24_cutlass_kernel[grid](
        dz, values_bits, meta, inv_scale if fp8 else partial, partial, rows, out_f, k, seed, BLOCK_G=block_groups,
        SEED_PTR=isinstance(seed, torch.Tensor), FP8=fp8, WRITE_VALUES=write_values, WRITE_AMAX=write_amax,
        FMAX=fp8_format("e4m3")[1], MBITS=mbits, EMIN=emin, SIGN_OFF=0x7F if fp8 else 0x7FFF, num_warps=num_warps)
    return form, (partial.amax() if write_amax else None)


def mvue_compress24_cutlass(dz: torch.Tensor, seed=0, tokens: int | None = None, block_groups: int | None = None,
                            num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """CUTLASS's compressed form of ``MVUE(dZ)^T`` (out, tokens), groups of 4 along the tokens, in one pass.

    dz: (T, out) contiguous bfloat16, any T >= 1 and out >= 2. seed: an int, or a 0-d int64 tensor on dz's
    device holding it (read on the device: CUDA-graph safe). tokens: the operand's k, a multiple of 16 and
    >= T (default: T rounded up to 16); rows T .. tokens - 1 stand for zero rows of dZ. block_groups: 16 or
    32 token groups per program (default 32).

    Returns ``cutlass_layout.compress(mvue24(dz_padded, dim=0, seed=seed).t())`` bit for bit, dz_padded being
    dz with zero rows up to ``tokens``: values (out, tokens / 2) bfloat16 and metadata uint8, what
    ``ops.compress`` returns for that operand.
    """
    k, block_groups = _checked(dz, seed, tokens, block_groups, (torch.bfloat16,), torch.bfloat16)
    return _launch(dz, seed, k, block_groups, num_warps)[0]


def _check_inv_scale(inv_scale, dz: torch.Tensor) -> None:
    if not isinstance(inv_scale, torch.Tensor) or inv_scale.numel() != 1 or inv_scale.dtype != torch.float32:
        raise TypeError("inv_scale must be a float32 tensor with one element (fp8_max / amax)")
    check_device(_mvue_compress24_cutlass_kernel, dz=dz, inv_scale=inv_scale)


def mvue_compress24_cutlass_fp8(dz: torch.Tensor, seed, inv_scale: torch.Tensor, tokens: int | None = None,
                                block_groups: int | None = None, num_warps: int = 4):
    """The FP8 weight-gradient operand q(MVUE(dZ))^T in CUTLASS's SM90 E4M3 layout, and amax(MVUE(dZ)), in one pass.

    dz: (T, out) contiguous bfloat16 / float16; seed as :func:`mvue_compress24_cutlass`; tokens: a multiple of
    32 and >= T (default: T rounded up to 32); block_groups 16 (default) or 32. inv_scale: float32 one-element
    tensor on dz's device (``fp8_max / amax``, read on the device). The draw and its rounding to dz's dtype
    are ``mvue24``'s; each kept value is cast to E4M3 as ``quantize_fp8_with_scale`` casts.

    Returns ``(values, metadata, amax)``: ``cutlass_layout.compress(q.t())`` and ``amax`` bit for bit, with
    ``q, amax = quantize_fp8_with_scale(mvue24(dz_padded, dim=0, seed=seed), inv_scale)``; amax float32 0-d.
    """
    k, block_groups = _checked(dz, seed, tokens, block_groups, (torch.bfloat16, torch.float16), torch.float8_e4m3fn)
    _check_inv_scale(inv_scale, dz)
    form, amax = _launch(dz, seed, k, block_groups, num_warps, inv_scale.reshape(()))
    return form[0], form[1], amax


def mvue_compress24_cutlass_amax(dz: torch.Tensor, seed, block_groups: int | None = None,
                                 num_warps: int = 4) -> torch.Tensor:
    """amax of ``mvue24(dz_padded, dim=0, seed=seed)`` (float32 0-d tensor; dz_padded: dz with zero rows up to a
    multiple of 4) from one read of dZ, nothing else written: the first pass of current scaling before
    :func:`mvue_compress24_cutlass_fp8`, at any shape. Arguments as there."""
    k, block_groups = _checked(dz, seed, None, block_groups, (torch.bfloat16, torch.float16), torch.float8_e4m3fn)
    return _launch(dz, seed, k, block_groups, num_warps, write_values=False)[1]
