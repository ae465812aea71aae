"""Simulated FP8 products around any backend: FP8-rounded operands, the inner backend's operations.

S-STE's FP8 recipe (docs/algorithms.md, "FP8 per-tensor scaling"): each product operand is quantized
to FP8 with a per-tensor current-amax scale and dequantized again (``sparsity_lab.references.fp8``); the product then runs on the inner
backend in the usual dtype (float32 accumulation):
    forward          Z  = q4(X) q4(S(W))^T           q4: E4M3 (max 448, 3 mantissa bits)
    input gradient   dX = q5(dZ) q4(S(W))             q5: E5M2 (max 57344, 2 mantissa bits)
    weight gradient  dW = q5(dZ)^T q4(X)              (MVUE, when on, acts on q5(dZ))
The gradient dZ is E5M2; the operand it meets keeps its E4M3 forward quantization (the usual
hybrid recipe; S-STE's reference code quantizes both backward operands to E5M2 instead, see
docs/algorithms.md, "FP8 per-tensor scaling").
Mask, sparse weight (m * W or beta * S(W)) and masked decay act on the full-precision master weight,
so they pass straight to the inner backend.

This simulates the numerics only: nothing runs faster than the inner backend. Registered as
"<inner>_fp8sim": "torch_fp8sim" (the reference) and "triton_fp8sim" (the Triton kernels for the
mask, soft threshold, MVUE and masked decay); ``register_fp8_sim`` adds one for a new backend.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..references.fp8 import dequantize_fp8, quantize_fp8
from .base import Backend, available_backends, get_backend, register_backend
from .report import BackendReport

SUFFIX = "_fp8sim"


def fp8_sim_name(inner: str) -> str:
    """The registry name of the FP8 simulation around backend ``inner``: ``inner + "_fp8sim"``."""
    return inner + SUFFIX


NAME = fp8_sim_name("torch")  # "torch_fp8sim": the name runs and checkpoints already carry


def fake_fp8(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """dequantize(quantize(x)): x rounded to the FP8 grid of its own per-tensor scale, in x's dtype."""
    q, scale = quantize_fp8(x, fmt)
    return dequantize_fp8(q, scale, x.dtype)


@dataclass
class _DenseOperand:
    """A dense phase's W (out, in), rounded to E4M3: multiplied by plain matmuls."""

    weight: torch.Tensor


class FP8SimBackend(Backend, BackendReport):
    """Backend ``inner`` with every product operand rounded to FP8 first (see the module docstring).
    In a dense phase (a Dense method, the dense fine-tune) the dense products are simulated too."""

    products_in_dense_phase = True

    def __init__(self, inner: str) -> None:
        if not isinstance(inner, str) or inner.endswith(SUFFIX):
            raise ValueError(f"inner must be the name of a backend that runs products (not an FP8 simulation "
                             f"itself), got {inner!r}")
        self.name = fp8_sim_name(inner)
        try:
            self.inner = get_backend(inner)
        except RuntimeError as err:  # e.g. triton without a GPU or the interpreter
            raise RuntimeError(f"backend {self.name!r} runs its products on backend {inner!r}, which could "
                               f"not be created: {err}") from err

    def mask(self, weight, n, m, transposable):
        return self.inner.mask(weight, n, m, transposable)

    def sparse_weight(self, weight, mask, beta, n, m):
        return self.inner.sparse_weight(weight, mask, beta, n, m)

    def prepare(self, sparse_weight):
        return self.inner.prepare(fake_fp8(sparse_weight, "e4m3"))  # once per optimizer step

    def prepare_dense(self, weight, dtype):
        # a dense phase: plain products of the rounded operands (the inner backend may only run 2:4 ones)
        return _DenseOperand(fake_fp8(weight.to(dtype), "e4m3"))

    def linear(self, x, operand, bias):
        if isinstance(operand, _DenseOperand):
            return F.linear(fake_fp8(x, "e4m3"), operand.weight, bias)
        return self.inner.linear(fake_fp8(x, "e4m3"), operand, bias)

    def grad_input(self, grad_out, operand):
        if isinstance(operand, _DenseOperand):
            return fake_fp8(grad_out, "e5m2") @ operand.weight
        return self.inner.grad_input(fake_fp8(grad_out, "e5m2"), operand)

    def grad_weight(self, grad_out, x, mvue, seed):
        return self.inner.grad_weight(fake_fp8(grad_out, "e5m2"), fake_fp8(x, "e4m3"), mvue, seed)

    def masked_decay_(self, grad, weight, mask, decay):
        self.inner.masked_decay_(grad, weight, mask, decay)


def register_fp8_sim(inner: str) -> str:
    """Register "<inner>_fp8sim" for the registered backend ``inner`` (created on first use). Returns the name."""
    if inner not in available_backends():
        raise ValueError(f"inner must be a registered backend, one of {available_backends()}, got {inner!r}")
    name = fp8_sim_name(inner)
    register_backend(name, lambda: FP8SimBackend(inner))
    return name


def fp8_sim_backend_for(backend: str) -> str:
    """The registered FP8 simulation around ``backend`` (``backend`` itself when it already is one)."""
    registered = available_backends()
    if isinstance(backend, str) and backend.endswith(SUFFIX) and backend in registered:
        return backend
    name = fp8_sim_name(backend) if isinstance(backend, str) else None
    if name not in registered:
        inners = [b[:-len(SUFFIX)] for b in registered if b.endswith(SUFFIX)]
        raise ValueError(f"backend must be one that FP8 simulation wraps, one of {inners}, got {backend!r}")
    return name
