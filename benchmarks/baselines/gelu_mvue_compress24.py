"""BASELINE, not shipped: GELU's backward with kernel 10's MVUE draw of its result, dZ and the compressed
MVUE(dZ)^T from one read of dH and Z. It was measured against the pair it would replace and did not pay.

The idea
    In the FFN ``H = gelu(Z)``, ``Z = X W1^T``, the up projection's weight gradient is ``MVUE(dZ^T) X``, and dZ
    is made by GELU's backward, ``dZ = dH * gelu'(Z)``. Unfused, GELU's backward reads dH and Z and writes dZ,
    then kernel 10 (``sparsity_lab.kernels.mvue_compress24``) reads dZ back to draw MVUE and write the compressed
    operand. Here one program reads a tile of dH and Z, forms dZ in registers, stores it (the input gradient
    ``dZ W1`` still needs the dense dZ), rounds it to dZ's dtype and draws from those rounded values exactly what
    kernel 10 draws from the stored dZ (the same counters, Philox outputs and level arithmetic): the compressed
    bytes equal ``mvue_compress24(dz, seed)`` of the dZ written (tested). One read of dZ fewer per FFN and step.

    gelu'(z) = Phi(z) + z phi(z) with Phi(z) = (1 + erf(z / sqrt 2)) / 2 and phi(z) = exp(-z^2 / 2) / sqrt(2 pi),
    the exact (erf) GELU of ``F.gelu(z)`` (approximate="none"), in float32 as kernel 6 computes it.

Why it lost
    Kernel 10 is instruction-bound, not memory-bound (about 34 sm_90 instructions an element); the erf and exp
    of GELU's derivative add about 42 more. PyTorch's GELU backward hides that arithmetic under its memory time;
    fused, the sum is issued by one program and the saved read of dZ does not cover it. ``python -m
    benchmarks.kernel_configs --sections gelu`` times every launch beside the pair (docs/measuring.md).

Bytes (T x N, element size s)
    read ``2 s T N`` (dH, Z); write ``s T N`` (dZ) + ``s T N / 2`` + ``T N / 8`` (the compressed operand).
    Unfused: ``3 s T N`` (GELU's backward) + ``s T N`` + ``s T N / 2`` + ``T N / 8`` (kernel 10): one ``s T N``
    more.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparsity_lab.kernels._common import check_device, check_tensor
from sparsity_lab.kernels.compress24 import _pick, _store_compressed
from sparsity_lab.kernels.gated import _act_and_grad
from sparsity_lab.kernels.mvue24 import _load_seed, _mvue_group_level, check_seed
from sparsity_lab.kernels.mvue_compress24 import _mvue_tokens_uniforms

DEFAULT_WARPS = 8  # kernel 10's default: the same tile and the same draw


@triton.jit
def _gelu_grad_rows(dh_ptr, z_ptr, dz_ptr, offs):
    """dZ = dH gelu'(Z) at ``offs``, stored in dZ's dtype; returns the stored values as float32 (what kernel 10
    would read back)."""
    dh = tl.load(dh_ptr + offs).to(tl.float32)
    z = tl.load(z_ptr + offs).to(tl.float32)
    _, slope = _act_and_grad(z, 1)
    dz = (dh * slope).to(dz_ptr.dtype.element_ty)
    tl.store(dz_ptr + offs, dz)
    return dz.to(tl.float32)


@triton.jit
def _gelu_mvue_compress24_kernel(dh_ptr, z_ptr, dz_ptr, vals_ptr, meta_ptr, n_cols, quads_per_row, half_cols, seed,
                                 col_tiles, BLOCK_G: tl.constexpr, SEED_PTR: tl.constexpr = False):
    seed = _load_seed(seed, SEED_PTR)
    row0 = tl.program_id(0) * 64  # rows of A = columns n of dZ
    g0 = tl.program_id(1) * BLOCK_G  # groups of A = token groups of dZ
    n = row0 + tl.arange(0, 64)[:, None]
    g = g0 + tl.arange(0, BLOCK_G)[None, :]
    offs = (4 * g) * n_cols + n  # dZ[4g + j, n] at offs + j n_cols: contiguous along n
    x0 = _gelu_grad_rows(dh_ptr, z_ptr, dz_ptr, offs)
    x1 = _gelu_grad_rows(dh_ptr, z_ptr, dz_ptr, offs + n_cols)
    x2 = _gelu_grad_rows(dh_ptr, z_ptr, dz_ptr, offs + 2 * n_cols)
    x3 = _gelu_grad_rows(dh_ptr, z_ptr, dz_ptr, offs + 3 * n_cols)
    u = _mvue_tokens_uniforms(row0, g0, quads_per_row, seed, BLOCK_G)
    y0, y1, y2, y3 = _mvue_group_level(x0, x1, x2, x3, u)
    dt = dz_ptr.dtype.element_ty  # rounded as mvue24 stores them, then picked as kernel 10 picks
    v0, v1, code = _pick(y0.to(dt).to(tl.int16, bitcast=True), y1.to(dt).to(tl.int16, bitcast=True),
                         y2.to(dt).to(tl.int16, bitcast=True), y3.to(dt).to(tl.int16, bitcast=True), 0x7FFF, False)
    _store_compressed(vals_ptr, meta_ptr, row0, g0, v0, v1, code, half_cols, col_tiles, False, BLOCK_G)


def gelu_backward_mvue_compress24(dh: torch.Tensor, z: torch.Tensor, seed=0, block_groups: int | None = None,
                                  num_warps: int = DEFAULT_WARPS) -> tuple[torch.Tensor, torch.Tensor]:
    """GELU's backward and the compressed MVUE of its result, in one pass: ``(dz, a)``.

    dh: the gradient of ``gelu(z)``; z: GELU's input; both (tokens, n) contiguous, the same bfloat16 / float16
    dtype, tokens and n multiples of 64. seed: an int, or a 0-d int64 tensor on dh's device holding it (read on
    the device: CUDA-graph safe).

    Returns dz (tokens, n), ``dh * gelu'(z)`` in dh's dtype (the exact GELU, ``F.gelu``'s default), and a, the
    cuSPARSELt compressed form of ``MVUE(dz)^T`` with groups of 4 along the tokens: bit for bit
    ``mvue_compress24(dz, seed)`` of the dz returned, shape ``compressed_shape(n, tokens, dtype)``.
    """
    from sparsity_lab.references import cusparselt_layout as layout

    check_tensor(dh, "dh", (torch.bfloat16, torch.float16))
    if not isinstance(z, torch.Tensor) or z.shape != dh.shape or z.dtype != dh.dtype:
        raise ValueError(f"z must be a tensor of dh's shape {tuple(dh.shape)} and dtype {dh.dtype}, got "
                         f"{tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__}"
                         f"{'' if not isinstance(z, torch.Tensor) else ' ' + str(z.dtype)}")
    if dh.dim() != 2:
        raise ValueError(f"dh must be 2-D (tokens, n), got shape {tuple(dh.shape)}")
    if not (dh.is_contiguous() and z.is_contiguous()):
        raise ValueError("dh and z must be contiguous (tokens, n): they are read column tile by column tile")
    tokens, n_cols = dh.shape
    if tokens % 64 or n_cols % 64:
        raise ValueError(f"dh has shape {tuple(dh.shape)}; tokens and n must be multiples of 64 (run GELU's "
                         "backward, then mvue24 and compress24, for other shapes)")
    if dh.numel() > 2**31 - 1:
        raise ValueError(f"dh has {dh.numel()} elements; int32 offsets allow at most {2**31 - 1}")
    check_seed(seed, dh)
    groups = tokens // 4
    if block_groups is None:
        block_groups = 32 if groups % 32 == 0 else 16
    if block_groups not in (8, 16, 32) or groups % block_groups:
        raise ValueError(f"block_groups must be one of (8, 16, 32) and divide tokens / 4 = {groups}, "
                         f"got {block_groups}")
    check_device(_gelu_mvue_compress24_kernel, dh=dh, z=z)
    dz = torch.empty_like(dh)
    a = torch.empty(layout.compressed_shape(n_cols, tokens, dh.dtype), dtype=dh.dtype, device=dh.device)
    n_values = n_cols * tokens // 2
    values = a.view(torch.int16).reshape(-1)[:n_values]
    meta = a.view(torch.uint8).reshape(-1)[n_values * a.element_size():]
    grid = (n_cols // 64, groups // block_groups)
    _gelu_mvue_compress24_kernel[grid](dh, z, dz, values, meta, n_cols, n_cols // 4, tokens // 2, seed, groups // 8,
                                       BLOCK_G=block_groups, SEED_PTR=isinstance(seed, torch.Tensor),
                                       num_warps=num_warps)
    return dz, a
