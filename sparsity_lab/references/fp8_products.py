"""The three FP8 products of a training step in float32 arithmetic: the ground truth of the FP8 backends.

For W (out, in), X (tokens, in), dZ (tokens, out), each operand quantized with its per-tensor scale
(``q_t = fp8(t / s_t)``, ``sparsity_lab.methods.fp8_scaling``):

    forward          Z  = s_x s_w   q_x  q_w^T                 (tokens, out)
    input gradient   dX = s_dz s_w  q_dz q_w                   (tokens, in)
    weight gradient  dW = s_g s_x   q_g^T q_x                  (out, in)    q_g = q(MVUE(dZ)) or q(dZ)

The FP8 values are exact in float32 and the sums are float32, as on the tensor cores; only the
order of the additions differs. Runs on any device; returns ``out_dtype``.

``alpha`` (a host float, optional): the two scales' product as the product's scalar alpha, which
multiplies the float32 sums in place of ``s_a s_b`` (what cuSPARSELt computes when a recipe gives it its
scales on the host: ``FP8Recipe(scale_in_product="host_alpha")``). With power-of-two scales the two are
the same number, so the results are equal bit for bit.
"""
from __future__ import annotations

import torch


def reference_forward(q_x: torch.Tensor, s_x: torch.Tensor, q_w: torch.Tensor, s_w: torch.Tensor,
                      out_dtype: torch.dtype, alpha: float | None = None) -> torch.Tensor:
    return (q_x.float() @ q_w.float().t() * (s_x * s_w if alpha is None else alpha)).to(out_dtype)


def reference_grad_input(q_dz: torch.Tensor, s_dz: torch.Tensor, q_w: torch.Tensor, s_w: torch.Tensor,
                         out_dtype: torch.dtype, alpha: float | None = None) -> torch.Tensor:
    return (q_dz.float() @ q_w.float() * (s_dz * s_w if alpha is None else alpha)).to(out_dtype)


def reference_grad_weight(q_g: torch.Tensor, s_g: torch.Tensor, q_x: torch.Tensor, s_x: torch.Tensor,
                          out_dtype: torch.dtype, alpha: float | None = None) -> torch.Tensor:
    return (q_g.float().t() @ q_x.float() * (s_g * s_x if alpha is None else alpha)).to(out_dtype)
