"""AdamW on a float32 master weight fed a bf16 gradient, the bf16 working weight written back: plain PyTorch.

One step for one tensor, in the order of the kernel ``sparsity_lab.kernels.adamw_master_`` (and of
PyTorch's fused AdamW), every operation in float32:

    g  <- g + decay * (1 - mask) * low            masked decay, only where a mask is given (low: the bf16 weight)
    p  <- p * (1 - lr * wd)                       decoupled weight decay
    m  <- beta1 * m + (1 - beta1) * g             g: the bf16 gradient, exactly in float32
    v  <- beta2 * v + (1 - beta2) * g * g
    p  <- p - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)     bc_i = 1 - beta_i ** step
    low <- p rounded to nearest even in bf16

The bias corrections are computed in float64 from the step number and rounded once to float32 (as
``torch.optim.AdamW`` computes them on the host).
"""
from __future__ import annotations

import math

import torch


def adamw_scalars(step: int, lr: float, beta1: float, beta2: float, weight_decay: float) -> dict[str, float]:
    """The per-step scalars of one AdamW step (step counts from 1), as Python floats."""
    if step < 1:
        raise ValueError(f"step must be >= 1 (the count after this update), got {step}")
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    return {"keep": 1.0 - lr * weight_decay, "step_size": lr / bc1, "bc2_sqrt": math.sqrt(bc2)}


@torch.no_grad()
def adamw_master_step_(low: torch.Tensor, grad: torch.Tensor, master: torch.Tensor, exp_avg: torch.Tensor,
                       exp_avg_sq: torch.Tensor, step: int, lr: float, beta1: float, beta2: float, eps: float,
                       weight_decay: float, mask: torch.Tensor | None = None, decay: float = 0.0) -> None:
    """One AdamW step in place on ``master``, ``exp_avg``, ``exp_avg_sq`` (float32) from ``grad`` (bf16),
    then ``low`` (bf16, the same shape) <- master rounded to nearest. ``step``: this update's count (>= 1).
    mask (bool, the same shape): the gradient first takes the masked decay ``decay * (1 - mask) * low``, in
    float32 (``low`` as it is before the step: the master rounded)."""
    s = adamw_scalars(step, lr, beta1, beta2, weight_decay)
    f32 = torch.float32

    def c(x: float) -> torch.Tensor:  # a scalar rounded to float32 once, as the kernel receives it
        return torch.tensor(x, dtype=f32)
    g = grad.to(f32)
    if mask is not None:
        g = torch.where(mask, g, g + c(decay) * low.to(f32))
    p = master * c(s["keep"])
    m = c(beta1) * exp_avg + c(1.0 - beta1) * g
    v = c(beta2) * exp_avg_sq + (c(1.0 - beta2) * g) * g
    # the float32 square root correctly rounded, as the kernel's sqrt_rn: through float64, which rounds it exactly
    # once more (53 >= 2 * 24 + 2 bits). torch.sqrt on a CPU need not round correctly: torch 2.13's missed by one ulp
    # on about 16 % of random inputs on an AMD EPYC machine, AVX2 and AVX512 paths alike.
    denom = v.double().sqrt().float() / c(s["bc2_sqrt"]) + c(eps)
    p = p - (c(s["step_size"]) * m) / denom
    master.copy_(p)
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)
    low.copy_(p)  # float32 -> bf16 rounds to nearest even
