"""2:4 activation sparsity with squared ReLU, in plain PyTorch: the ground truth for the fast path.

Haziza et al. 2025 (https://arxiv.org/abs/2503.16672) replace the FFN's gated activation by squared
ReLU, whose outputs are mostly exact zeros, and prune them to 2:4 along the hidden dimension so that
the down projection runs on sparse tensor cores with the *activation* as the sparse operand.

For x (tokens, d), W1 (h, d), W2 (d, h), one FFN is

    H   = x W1^T + b1                      (tokens, h)     up projection, dense
    A   = relu(H)^2                        (tokens, h)     squared ReLU
    M   = top2of4(A)                       (tokens, h)     bool, the 2 largest of every 4 along h
    A24 = A * M                            (tokens, h)     2:4 along h
    y   = A24 W2^T + b2                    (tokens, d)     down projection: A24 is the sparse operand

Backward, straight-through on the kept entries (the pruned ones get no gradient), dY (tokens, d):

    dA24 = dY W2                           (tokens, h)     dense x dense: no operand is sparse
    dW2  = dY^T A24                        (d, h)          sums over tokens; A24 is 2:4 along h, not
                                                           along tokens: this product cannot use it
    dH   = dA24 * M * 2 relu(H)            (tokens, h)     elementwise; exactly 2:4 in A24's pattern
    dx   = dH W1                           (tokens, d)     sums over h: dH is the sparse operand (free:
                                                           the same pattern, no approximation)
    dW1  = dH^T x                          (h, d)          sums over tokens: same problem as dW2

So 2 of the 6 products run sparse at no cost in accuracy (y and dx); the two weight gradients sum over
the tokens, and a 2:4 operand there must be 2:4 along the tokens (the transposed pattern), which the
activation does not give. ``docs/algorithms.md`` and notebook 13 discuss how the paper treats them.

Selection rule (the Triton kernel ``kernels/act24.py`` follows it bit for bit): A is computed in
float32 from H, the two largest values of each group of 4 are kept (A >= 0, so largest = largest
magnitude), ties go to the lowest index, a NaN counts as the largest; the kept values are rounded
once to the output dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .relu2 import relu2  # the one definition of squared ReLU (Act24MLP imports it from here)

GROUP = 4


def _wide(x: torch.Tensor) -> torch.Tensor:
    """x in float32, or float64 when it is float64 (the arithmetic precision of the reference)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _check_groups(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {type(x).__name__} "
                        f"{getattr(x, 'dtype', '')}".rstrip())
    if x.dim() == 0 or x.shape[-1] % GROUP:
        raise ValueError(f"{name} must have a last (hidden) dimension divisible by {GROUP} (groups of 4), "
                         f"got shape {tuple(x.shape)}")


def top2of4_mask(a: torch.Tensor) -> torch.Tensor:
    """Keep the 2 largest of every 4 consecutive values along the last dimension.

    a: (..., h), h % 4 == 0, non-negative (squared ReLU) or signed (then: largest |a|). Returns a bool
    tensor of a's shape with exactly two True per group; ties go to the lowest index; NaN ranks first.
    rank_i = #{j : a_j > a_i} + #{j < i : a_j == a_i}, keep_i = rank_i < 2.
    """
    _check_groups(a, "a")
    g = _wide(a.detach()).abs().reshape(*a.shape[:-1], -1, GROUP)
    g = torch.where(torch.isnan(g), torch.full_like(g, float("inf")), g)
    a_i, a_j = g.unsqueeze(-1), g.unsqueeze(-2)  # (..., 4, 1), (..., 1, 4)
    idx = torch.arange(GROUP, device=a.device)
    earlier = idx[None, :] < idx[:, None]  # [i, j]: j < i
    rank = ((a_j > a_i) | ((a_j == a_i) & earlier)).sum(-1)
    return (rank < 2).reshape(a.shape)


def act24(h: torch.Tensor, out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(A24, M): squared ReLU of h pruned to 2:4 along the last dimension, and its mask.

    h: (..., hidden), hidden % 4 == 0. A = relu(h)^2 in float32 (float64 for float64 h); M = top2of4(A); A24 = (A * M) rounded
    once to ``out_dtype`` (default h's dtype). Entries of a group with fewer than two non-zeros are
    kept as zeros (M still has two True per group).
    """
    _check_groups(h, "h")
    a = relu2(_wide(h))
    mask = top2of4_mask(a)
    return (a * mask).to(out_dtype or h.dtype), mask


def act24_grad(h: torch.Tensor, grad_a24: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """dH = dA24 * M * 2 relu(H), straight-through on the kept entries, in float32, rounded once.

    h, grad_a24: (..., hidden) of one shape; M is recomputed from h exactly as ``act24`` does. Returns
    dH in ``out_dtype`` (default grad_a24's dtype): 2:4 along hidden, in A24's pattern.
    """
    _check_groups(h, "h")
    if grad_a24.shape != h.shape:
        raise ValueError(f"grad_a24 has shape {tuple(grad_a24.shape)}, expected h's {tuple(h.shape)}")
    hf = _wide(h)
    mask = top2of4_mask(relu2(hf))
    return (_wide(grad_a24) * mask * (2 * F.relu(hf))).to(out_dtype or grad_a24.dtype)


def natural_24_stats(a: torch.Tensor) -> dict[str, float]:
    """How sparse relu^2 activations already are: the fraction of exact zeros, and the fraction of
    groups of 4 (along the last dimension) with at most 2 non-zeros (those lose nothing to 2:4)."""
    _check_groups(a, "a")
    nz = (a.detach() != 0).reshape(-1, GROUP)
    return {"zero_fraction": 1.0 - nz.float().mean().item(),
            "groups_at_most_2_fraction": (nz.sum(-1) <= 2).float().mean().item()}


class Act24Down(torch.autograd.Function):
    """y = act24(H) W2^T + b2, with the backward written out (see the module docstring).

    forward(h (tokens, hidden), w2 (d, hidden), b2 (d,) or None) -> y (tokens, d). Products are plain
    dense products of the pruned activation (the reference); the fast path swaps them.
    """

    @staticmethod
    def forward(ctx, h, w2, b2):
        a24, _ = act24(h)
        ctx.save_for_backward(h, a24, w2)
        ctx.has_bias = b2 is not None
        return F.linear(a24, w2, b2)

    @staticmethod
    def backward(ctx, dy):
        h, a24, w2 = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        da24 = dy @ w2                                              # (tokens, h)
        dh = act24_grad(h, da24, h.dtype)                           # straight-through on kept entries
        dw2 = dy2.t() @ a24.reshape(-1, a24.shape[-1])              # (d, h)
        db2 = dy2.sum(0) if ctx.has_bias else None
        return dh, dw2, db2


class Act24FFN(nn.Module):
    """up projection -> squared ReLU -> 2:4 prune along hidden -> down projection (reference).

    ``sparse=False`` gives the dense squared-ReLU FFN (the twin to compare against). Input (..., d),
    output (..., d); hidden % 4 == 0.
    """

    def __init__(self, d_model: int, hidden: int, bias: bool = False, sparse: bool = True) -> None:
        super().__init__()
        if hidden % GROUP:
            raise ValueError(f"hidden={hidden} must be divisible by {GROUP} for 2:4 activations")
        self.up = nn.Linear(d_model, hidden, bias=bias)
        self.down = nn.Linear(hidden, d_model, bias=bias)
        self.sparse = sparse

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if not self.sparse:
            return self.down(relu2(h))
        return Act24Down.apply(h, self.down.weight, self.down.bias)
