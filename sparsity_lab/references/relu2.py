"""Squared ReLU, y = relu(h)^2, and its gradient, in plain PyTorch: the ground truth for ``kernels/relu2.py``.

Squared ReLU (So et al. 2021, https://arxiv.org/abs/2109.08668) is the activation of the lab GPT's
``relu2`` FFN. For h of any shape and upstream gradient dy of the same shape:

    y  = relu(h)^2                         forward
    dh = 2 relu(h) dy   where relu(h) > 0, else 0      backward

The two functions below are written so that, on any device and in any dtype, they give bit for bit
what autograd gives for the two-pass expression ``F.relu(h).square()``: the forward is that
expression, and the backward follows autograd's two steps (``square``'s gradient ``dy * (2 r)``,
then ``relu``'s, which zeroes the entries where r = relu(h) <= 0 and keeps the rest, NaN included).
For 16-bit h the square is exact in float32 and PyTorch rounds it once to h's dtype; so does
``dy * (2 r)``, which is what a fused kernel computing in float32 and rounding once reproduces.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def relu2(h: torch.Tensor) -> torch.Tensor:
    """Squared ReLU, relu(h)^2 (same shape and dtype as h)."""
    return F.relu(h).square()


def relu2_grad(h: torch.Tensor, grad_y: torch.Tensor) -> torch.Tensor:
    """dh = 2 relu(h) dy where relu(h) > 0, else 0; h and grad_y of one shape, dh in grad_y's dtype.

    A NaN in h propagates (relu(NaN) = NaN is not <= 0), as it does through autograd of
    ``F.relu(h).square()``; entries with h <= 0 (-0.0 included) get an exact +0 whatever grad_y holds.
    """
    if grad_y.shape != h.shape:
        raise ValueError(f"grad_y has shape {tuple(grad_y.shape)}, expected h's {tuple(h.shape)}")
    r = F.relu(h)
    return (grad_y * (2 * r)).masked_fill(r <= 0, 0)
