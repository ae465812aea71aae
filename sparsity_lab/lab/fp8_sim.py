"""Simulated FP8 products for S-STE's FP8 recipe: the reference backend with fake-quantized operands.

Each product operand is quantized to FP8 with a per-tensor current-amax scale and dequantized
again (``sparsity_lab.fp8``), then the product runs in the usual dtype (float32 accumulation):
    forward          Z  = q4(X) q4(S(W))^T           q4: E4M3 (max 448, 3 mantissa bits)
    input gradient   dX = q5(dZ) q4(S(W))             q5: E5M2 (max 57344, 2 mantissa bits)
    weight gradient  dW = q5(dZ)^T q4(X)              (MVUE, when on, acts on q5(dZ))
The gradient dZ is E5M2; the operand it meets keeps its E4M3 forward quantization (the usual
hybrid recipe; ALGORITHMS.md says "backward products in E5M2" without naming the second operand).
This simulates the numerics only: nothing runs faster. Registered as backend "torch_fp8sim".
"""
from __future__ import annotations

import torch

from ..backends import register_backend
from ..backends.torch_reference import TorchBackend
from ..fp8 import dequantize_fp8, quantize_fp8

NAME = "torch_fp8sim"


def fake_fp8(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """dequantize(quantize(x)): x rounded to the FP8 grid of its own per-tensor scale, in x's dtype."""
    q, scale = quantize_fp8(x, fmt)
    return dequantize_fp8(q, scale, x.dtype)


class FP8SimBackend(TorchBackend):
    name = NAME

    def prepare(self, sparse_weight):
        return fake_fp8(sparse_weight, "e4m3")  # once per optimizer step

    def linear(self, x, operand, bias):
        return super().linear(fake_fp8(x, "e4m3"), operand, bias)

    def grad_input(self, grad_out, operand):
        return super().grad_input(fake_fp8(grad_out, "e5m2"), operand)

    def grad_weight(self, grad_out, x, mvue, generator):
        return super().grad_weight(fake_fp8(grad_out, "e5m2"), fake_fp8(x, "e4m3"), mvue, generator)


register_backend(NAME, FP8SimBackend)
