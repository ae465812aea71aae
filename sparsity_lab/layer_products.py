"""The products of one SparseLinear call, apart from the layer's state.

For Z = X W^T with W (out, in) and X (tokens, in), the three products of a training step are
    forward         Z  = X S(W)^T + b
    input gradient  dX = dZ S(W)
    weight gradient dW = dZ^T X          (or MVUE(dZ^T) X, groups of 4 along the tokens)
``SparseLinear.call_plan`` gathers what they need besides tensors (the backend, the prepared operand,
SR-STE's decay, the MVUE seed) into a ``CallPlan``; ``products_forward`` and ``products_backward``
run them, eagerly through ``SparseLinearFn`` and under torch.compile through the custom ops of
``custom_ops.py``. Nothing here reads or writes the layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .backends.base import Backend, MvueSeed


@dataclass
class CallPlan:
    """What one call's products need besides tensors (the forward's, kept for its backward)."""

    backend: Backend
    operand: Any
    dtype: torch.dtype  # the products' dtype (the autocast dtype under autocast)
    mask: torch.Tensor
    decay: float
    mvue: bool
    seed: MvueSeed | None  # the MVUE draw's generator (eager) or device seed tensor (CUDA-graph step)
    # when set, operand and mask were dropped after the forward and are rebuilt in the backward
    # (a sharded layer under FSDP2 with recompute_operands: nothing full-size lives in between)
    rebuild: Callable[[], tuple[Any, torch.Tensor]] | None = None


def compute_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the products run in, as nn.Linear would: the autocast dtype under autocast
    (float64 is left alone, as autocast does), else the common dtype of x and W (which must agree)."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev) and x.dtype != torch.float64:
        return torch.get_autocast_dtype(dev)
    if x.dtype != weight.dtype:
        raise TypeError(f"x has dtype {x.dtype} but the layer's weight is {weight.dtype}; cast x "
                        "(or the layer) or run under torch.autocast")
    return x.dtype


def products_forward(x2: torch.Tensor, bias: torch.Tensor | None, plan: CallPlan) -> torch.Tensor:
    """Z = X S(W)^T + b for x2 (tokens, in) already in the products' dtype. Returns (tokens, out)."""
    b = bias.to(plan.dtype) if bias is not None else None
    with torch.autocast(x2.device.type, enabled=False):
        return plan.backend.linear(x2, plan.operand, b)


def products_backward(plan: CallPlan, grad_out: torch.Tensor, x2: torch.Tensor, x_shape: torch.Size,
                       x_dtype: torch.dtype, weight: torch.Tensor, bias_dtype: torch.dtype | None,
                       needs: tuple[bool, bool, bool]):
    """(dX, dW, db) of ``products_forward`` (None where ``needs`` is False): dX = dZ S(W) in x's dtype
    and shape, dW = dZ^T X or MVUE(dZ^T) X (+ SR-STE's decay) in W's dtype, db = dZ summed over tokens."""
    dz = grad_out.reshape(-1, grad_out.shape[-1]).to(plan.dtype)
    grad_x = grad_w = grad_b = None
    # a sharded layer may have dropped its operand and full mask after the forward: rebuild them
    operand, mask = plan.rebuild() if plan.rebuild is not None else (plan.operand, plan.mask)
    with torch.autocast(dz.device.type, enabled=False):
        if needs[0]:
            grad_x = plan.backend.grad_input(dz, operand).to(x_dtype).reshape(x_shape)
        if needs[1]:
            grad_w = plan.backend.grad_weight(dz, x2, plan.mvue, plan.seed).to(weight.dtype)
            if plan.decay:
                plan.backend.masked_decay_(grad_w, weight, mask, plan.decay)
        if bias_dtype is not None and needs[2]:
            # accumulate half/bf16 in fp32; float64 stays float64
            acc = torch.float32 if dz.element_size() < 4 else dz.dtype
            grad_b = dz.sum(0, dtype=acc).to(bias_dtype)
    return grad_x, grad_w, grad_b


class SparseLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, plan: CallPlan):
        x2 = x.reshape(-1, x.shape[-1]).to(plan.dtype)
        ctx.save_for_backward(x2, weight)
        ctx.plan, ctx.shape, ctx.x_dtype = plan, x.shape, x.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        z = products_forward(x2, bias, plan)
        return z.reshape(*x.shape[:-1], z.shape[-1])

    @staticmethod
    def backward(ctx, grad_out):
        x2, weight = ctx.saved_tensors
        grads = products_backward(ctx.plan, grad_out, x2, ctx.shape, ctx.x_dtype, weight, ctx.bias_dtype,
                                   ctx.needs_input_grad[:3])
        return (*grads, None)
