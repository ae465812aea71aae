"""Kernel 16: squared ReLU, y = relu(h)^2, forward and backward, one pass each.

The idea
    The dense squared-ReLU FFN (the lab GPT's ``relu2``, the baseline that 2:4 activations are
    measured against) written as ``F.relu(h).square()`` runs two elementwise passes forward (relu:
    read h, write r; square: read r, write y), and autograd's backward of it several more (2 r, the
    product with dy, relu's mask). One pass reads h and writes y; one pass reads h and dy and writes
    dh, recomputing relu(h) instead of storing it. ``sparsity_lab.references.relu2`` is the reference.

The arithmetic, in float32 on values loaded from any of fp16 / bf16 / fp32, rounded once on store:
    r  = h where h >= 0 or h is NaN, else 0    (h < 0 -> 0; NaN propagates as through F.relu)
    y  = r * r
    dh = dy * (2 r)  where r > 0 (NaN included), else +0
For 16-bit inputs r * r and dy * (2 r) are exact in float32 (at most 2 x 11 significant bits), so
rounding once gives what PyTorch's two passes give: bit for bit on a GPU (PyTorch also computes in
float32 and rounds once). ``2 r`` is rounded to the input dtype before the product, as autograd
stores it, so that it overflows where autograd's does (fp16 r > 32752). Under TRITON_INTERPRET=1 the
float32 -> bf16 cast truncates (``_common``), so bf16 outputs may differ by one ulp there.

Bytes (dtype size s, n elements)
    forward: read s n, write s n.   backward: read 2 s n (h, dy), write s n (dh).
Non-contiguous inputs are copied first (one more pass, ``_common.contiguous``); offsets are int64, so
any size runs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import HALF_AND_FLOAT, check_device

DEFAULT_BLOCK = 2048  # elements per program
DEFAULT_WARPS = 4


@triton.jit
def _relu(h):
    """relu in float32 keeping NaN (tl.maximum would drop it): h < 0 -> 0, else h (-0.0 stays -0.0)."""
    return tl.where(h < 0.0, 0.0, h)


@triton.jit
def _relu2_fwd_kernel(h_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    r = _relu(tl.load(h_ptr + offs, mask=ok, other=0.0).to(tl.float32))
    tl.store(y_ptr + offs, (r * r).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _relu2_bwd_kernel(h_ptr, dy_ptr, dh_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    dt = dh_ptr.dtype.element_ty
    r = _relu(tl.load(h_ptr + offs, mask=ok, other=0.0).to(tl.float32))
    dy = tl.load(dy_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    two_r = (2.0 * r).to(dt).to(tl.float32)  # autograd stores 2 r in the input dtype (fp16 may overflow)
    tl.store(dh_ptr + offs, tl.where(r <= 0.0, 0.0, dy * two_r).to(dt), mask=ok)


def _check(x, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in HALF_AND_FLOAT:
        names = ", ".join(str(d).replace("torch.", "") for d in HALF_AND_FLOAT)
        raise TypeError(f"{name} must have dtype in ({names}), got {x.dtype}")


def _launch_args(n: int, block: int) -> tuple[int]:
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 1, got {block}")
    return (triton.cdiv(n, block),)


def relu2_forward(h: torch.Tensor, block: int = DEFAULT_BLOCK, num_warps: int = DEFAULT_WARPS) -> torch.Tensor:
    """y = relu(h)^2, one pass: h of any shape (fp16 / bf16 / fp32) -> y of h's shape and dtype, contiguous."""
    _check(h, "h")
    check_device(_relu2_fwd_kernel, h=h)
    grid = _launch_args(h.numel(), block)
    h = h.contiguous()
    y = torch.empty_like(h)
    if h.numel():
        _relu2_fwd_kernel[grid](h, y, h.numel(), BLOCK=block, num_warps=num_warps)
    return y


def relu2_backward(grad_y: torch.Tensor, h: torch.Tensor, block: int = DEFAULT_BLOCK,
                   num_warps: int = DEFAULT_WARPS) -> torch.Tensor:
    """dh = 2 relu(h) dy (0 where relu(h) <= 0), one pass: grad_y and h of one shape and dtype -> dh like h."""
    _check(h, "h")
    _check(grad_y, "grad_y")
    if grad_y.shape != h.shape:
        raise ValueError(f"grad_y has shape {tuple(grad_y.shape)}, expected h's {tuple(h.shape)}")
    if grad_y.dtype != h.dtype:
        raise TypeError(f"grad_y has dtype {grad_y.dtype}, expected h's {h.dtype}")
    check_device(_relu2_bwd_kernel, h=h, grad_y=grad_y)
    grid = _launch_args(h.numel(), block)
    h, grad_y = h.contiguous(), grad_y.contiguous()
    dh = torch.empty_like(h)
    if h.numel():
        _relu2_bwd_kernel[grid](h, grad_y, dh, h.numel(), BLOCK=block, num_warps=num_warps)
    return dh
