"""FP8 (E4M3) 2:4 forward product on sparse tensor cores, with per-tensor scales.

    Z = (s_x s_w) * ( q(X) q(S(W))^T )        q: E4M3 with a per-tensor scale, s = amax / 448

cuSPARSELt multiplies E4M3 operands with float32 accumulation and writes bfloat16. The sparse
operand is q(S(W)) (out, in), 2:4 along ``in``, compressed by ``kernels/compress24.py`` (the fp8
layout has 64-column tiles: ``in`` a multiple of 64, ``out`` of 64); X is passed as the ``.t()``
view of the contiguous q(X) and ``transpose_result=True`` returns Z (tokens, out) row-major. The
scales multiply the bfloat16 result afterwards (one elementwise pass): ``_cslt_sparse_mm``'s
``alpha`` is read with ``.item()``, a host sync that would also break CUDA-graph capture.
Dense references: ``torch._scaled_mm`` (FP8 tensor cores) and bfloat16 ``F.linear``.
"""
from __future__ import annotations

import torch

from ...references.fp8 import quantize_fp8


def quantize_sparse_weight_e4m3(sparse_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): E4M3 of the 2:4 weight (zeros stay zeros, so the 2:4 pattern survives)."""
    return quantize_fp8(sparse_weight, "e4m3")


def fp8_sparse_linear(x_q: torch.Tensor, x_scale: torch.Tensor, w_compressed: torch.Tensor,
                      w_scale: torch.Tensor, alg_id: int = 0, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Z (tokens, out) in ``out_dtype`` from E4M3 q(X) (tokens, in), contiguous, and compressed q(S(W))."""
    if x_q.dtype != torch.float8_e4m3fn:
        raise TypeError(f"x_q must be float8_e4m3fn, got {x_q.dtype}")
    if not x_q.is_contiguous():
        raise ValueError("x_q must be contiguous (it is passed to cuSPARSELt as its transposed view)")
    z = torch._cslt_sparse_mm(w_compressed, x_q.t(), out_dtype=out_dtype, transpose_result=True, alg_id=alg_id)
    return z * (x_scale * w_scale).to(out_dtype)


def scaled_mm_dense(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                    out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The dense FP8 reference: ``torch._scaled_mm(q(X), q(W)^T)`` with the same per-tensor scales."""
    return torch._scaled_mm(x_q, w_q.t(), scale_a=x_scale.float(), scale_b=w_scale.float(), out_dtype=out_dtype)
