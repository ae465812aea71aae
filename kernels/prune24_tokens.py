"""Kernel 17: gather permuted tokens of chosen features, prune to 2:4 along the tokens, compress, one pass.

The idea
    The FFN's weight gradients with 2:4 activations, dW1 = dH^T x and dW2 = dY^T A24, sum over the
    tokens; as cuSPARSELt's structured operand the activation must then be 2:4 along the tokens.
    ``sparsity_lab.references.act24_tokens`` writes out the approximation (after Haziza et al. 2025,
    https://arxiv.org/abs/2503.16672): the tokens are shuffled by a permutation P and, for the sparse
    features S, the 2 largest |values| of every 4 consecutive permuted tokens are kept. The operand is
    B^T = top2of4_tokens(A[P][:, S])^T, (|S|, tokens).

    Unfused that is a gather (A[P][:, S]), a prune along the tokens and ``compress24`` of the
    transposed view: three passes over (tokens, |S|). Here one program gathers 64 features x
    ``4 * BLOCK_G`` permuted tokens straight from A (row P[t], column S[f], any strides), ranks each
    group's four magnitudes in float32 (``keep_top2``: ties to the lowest permuted position, NaN
    first) and stores the kept raw values with their codes in cuSPARSELt's layout
    (``compress24``'s store). Values are copied bit for bit: nothing is rounded.

    Tokens are padded with zeros to a multiple of 64 (cuSPARSELt's tiles): the other operand G[P] is
    padded with zero rows to match.

    Reference: ``references.act24_tokens.top2of4_tokens_mask``; the bytes equal
    ``compress24_reference`` of the reference's pruned B^T (tested).

Bytes (A of 16-bit, |S| features, T tokens)
    read 2 |S| T (+ 8 T of indices per feature tile); write |S| T (values) + |S| T / 8 (codes).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_device, check_tensor, keep_top2
from .compress24 import _pick, _store_compressed

ROW_TILE = 64


@triton.jit
def _gather_member(a_ptr, perm_ptr, feat, g, j: tl.constexpr, tokens, stride_t, stride_h):
    """A[P[4g + j], S[f]] for a (64, 1) column of features and a (1, BLOCK_G) row of token groups;
    zero for the padding tokens 4g + j >= tokens."""
    t = 4 * g + j
    real = t < tokens
    tok = tl.load(perm_ptr + t, mask=real, other=0).to(tl.int64)
    return tl.load(a_ptr + tok * stride_t + feat * stride_h, mask=real, other=0.0)


@triton.jit
def _prune24_tokens_kernel(a_ptr, perm_ptr, feat_ptr, vals_ptr, meta_ptr, tokens, stride_t, stride_h,
                           half_cols, col_tiles, BLOCK_G: tl.constexpr):
    row0 = tl.program_id(0) * 64  # rows of B^T = the sparse features
    g0 = tl.program_id(1) * BLOCK_G  # groups of 4 permuted tokens
    feat = tl.load(feat_ptr + row0 + tl.arange(0, 64)).to(tl.int64)[:, None]
    g = g0 + tl.arange(0, BLOCK_G)[None, :]
    x0 = _gather_member(a_ptr, perm_ptr, feat, g, 0, tokens, stride_t, stride_h)
    x1 = _gather_member(a_ptr, perm_ptr, feat, g, 1, tokens, stride_t, stride_h)
    x2 = _gather_member(a_ptr, perm_ptr, feat, g, 2, tokens, stride_t, stride_h)
    x3 = _gather_member(a_ptr, perm_ptr, feat, g, 3, tokens, stride_t, stride_h)
    # float32 magnitudes: exact for 16-bit inputs, so the ranking equals the reference's
    k0, k1, k2, k3 = keep_top2(tl.abs(x0.to(tl.float32)), tl.abs(x1.to(tl.float32)),
                               tl.abs(x2.to(tl.float32)), tl.abs(x3.to(tl.float32)))
    b0 = tl.where(k0, x0.to(tl.int16, bitcast=True), 0)
    b1 = tl.where(k1, x1.to(tl.int16, bitcast=True), 0)
    b2 = tl.where(k2, x2.to(tl.int16, bitcast=True), 0)
    b3 = tl.where(k3, x3.to(tl.int16, bitcast=True), 0)
    v0, v1, code = _pick(b0.to(tl.int16), b1.to(tl.int16), b2.to(tl.int16), b3.to(tl.int16), 0x7FFF)
    _store_compressed(vals_ptr, meta_ptr, row0, g0, v0, v1, code, half_cols, col_tiles, False, BLOCK_G)


def padded_tokens(tokens: int) -> int:
    """The token count rounded up to a whole tile of cuSPARSELt's layout (64)."""
    return -(-tokens // ROW_TILE) * ROW_TILE


def prune24_tokens(a: torch.Tensor, perm: torch.Tensor, features: torch.Tensor, check: bool = False,
                   num_warps: int = 4) -> torch.Tensor:
    """cuSPARSELt's compressed form of B^T = top2of4_tokens(A[P][:, S])^T, (|S|, tokens padded to 64).

    a: (tokens, hidden) bfloat16 / float16, any strides. perm: (tokens,) int32 / int64 on a's device, a
    permutation of the tokens (checked only with ``check=True``: an extra pass and a synchronisation).
    features: (|S|,) int32 / int64 column indices of a, |S| a multiple of 64. Padding tokens (after
    the permuted real ones) are zeros. Returns ``cusparselt_layout.compressed_shape(|S|, padded_tokens(tokens),
    a.dtype)``: the structured operand of C[S] = B^T G[P] (G[P] padded with zero rows).
    """
    from sparsity_lab.references import cusparselt_layout as layout

    check_tensor(a, "a", (torch.bfloat16, torch.float16))
    if a.dim() != 2:
        raise ValueError(f"a must be 2-D (tokens, hidden), got shape {tuple(a.shape)}")
    tokens, hidden = a.shape
    for name, idx, length in (("perm", perm, tokens), ("features", features, None)):
        if not isinstance(idx, torch.Tensor) or idx.dim() != 1 or idx.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be a 1-D int32 / int64 tensor, got {type(idx).__name__} "
                            f"{getattr(idx, 'dtype', '')} {tuple(getattr(idx, 'shape', ()))}")
        if length is not None and idx.numel() != length:
            raise ValueError(f"{name} must have one entry per token ({length}), got {idx.numel()}")
    n_feat = features.numel()
    if n_feat == 0 or n_feat % ROW_TILE:
        raise ValueError(f"features must hold a positive multiple of {ROW_TILE} columns (whole tiles of "
                         f"cuSPARSELt's layout), got {n_feat}")
    if (tokens - 1) * abs(a.stride(0)) + (hidden - 1) * abs(a.stride(1)) > 2**31 - 1:
        raise ValueError(f"a with shape {tuple(a.shape)} and strides {a.stride()} exceeds int32 offsets")
    if check:
        if not torch.equal(torch.sort(perm).values.cpu(), torch.arange(tokens, dtype=perm.dtype)):
            raise ValueError(f"perm must be a permutation of range({tokens})")
        if int(features.min()) < 0 or int(features.max()) >= hidden:
            raise ValueError(f"features must be column indices in [0, {hidden})")
    check_device(_prune24_tokens_kernel, a=a, perm=perm, features=features)
    cols = padded_tokens(tokens)
    groups = cols // 4
    block = next(b for b in (32, 16) if groups % b == 0)
    out = torch.empty(layout.compressed_shape(n_feat, cols, a.dtype), dtype=a.dtype, device=a.device)
    n_values = n_feat * cols // 2
    values = out.view(torch.int16).reshape(-1)[:n_values]
    meta = out.view(torch.uint8).reshape(-1)[2 * n_values:]
    _prune24_tokens_kernel[(n_feat // ROW_TILE, groups // block)](
        a, perm, features, values, meta, tokens, a.stride(0), a.stride(1), cols // 2, groups // 8,
        BLOCK_G=block, num_warps=num_warps)
    return out
