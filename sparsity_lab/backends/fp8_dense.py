"""The three FP8 products of a training step on dense FP8 tensor cores (``torch._scaled_mm``).

The dense FP8 recipe an FP8 user would pick (backend "fp8_dense", and the baseline the FP8 2:4
products are measured against). Same operands and equations as
``sparsity_lab.references.fp8_products``; ``torch._scaled_mm`` takes mat1 row-major and mat2
column-major, so the operands it needs transposed come from the cast that makes them (kernel 14, a
cast-transpose, as Transformer Engine's recipe does; a transposing copy of an FP8 tensor is PyTorch's
slow elementwise copy) and are copied here only when the caller has no transposed form. Output bfloat16.
"""
from __future__ import annotations

import torch


def _mm(a, b, s_a, s_b):
    # cuBLASLt refuses a scale that is a view at an unaligned offset of a larger buffer (the delayed
    # scales are entries of one (4,) buffer): CUBLAS_STATUS_NOT_SUPPORTED on the H100. A copy is aligned.
    return torch._scaled_mm(a, b, scale_a=s_a.float().reshape(()).clone(), scale_b=s_b.float().reshape(()).clone(),
                            out_dtype=torch.bfloat16)


def scaled_mm_forward(q_x, s_x, q_w, s_w):
    """Z = s_x s_w q_x q_w^T; q_w (out, in) contiguous, so ``.t()`` is column-major."""
    return _mm(q_x, q_w.t(), s_x, s_w)


def scaled_mm_grad_input(q_dz, s_dz, q_w_t, s_w):
    """dX = s_dz s_w q_dz q_w; q_w_t = q_w^T contiguous (in, out), so ``.t()`` is (out, in) column-major."""
    return _mm(q_dz, q_w_t.t(), s_dz, s_w)


def scaled_mm_grad_weight(q_g, s_g, q_x, s_x, q_x_t=None, q_g_t=None):
    """dW = s_g s_x q_g^T q_x. q_x_t: q_x^T contiguous (in, tokens), q_g_t: q_g^T contiguous (out, tokens),
    each when the caller has it (else copied)."""
    b = (q_x_t if q_x_t is not None else q_x.t().contiguous()).t()
    return _mm(q_g_t if q_g_t is not None else q_g.t().contiguous(), b, s_g, s_x)
