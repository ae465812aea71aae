"""Kernel 15: multiply a product in place by two per-tensor scales read on the device.

The idea
    An FP8 product computes ``q_a q_b`` and must return ``s_a s_b q_a q_b``. cuSPARSELt 0.8 applies
    neither per-tensor scale to an FP8 2:4 product on the H100 (``backends/cusparselt/fp8_direct.py``),
    and the scales live on the device (delayed scaling updates them there, a CUDA graph replays
    with them), so the result is multiplied once afterwards. ``d.mul_(s)`` with a 0-d CUDA tensor
    ``s`` is a broadcast operand for PyTorch's elementwise loop, which then takes a slower path
    than a plain copy; here each program loads the two scalars once and streams a contiguous block
    of ``d`` with wide loads and stores, in float32 arithmetic, rounded once to d's dtype.

    Reference: ``(d.float() * (s_a * s_b)).to(d.dtype)`` (the product of the scales in float32).

Bytes (d of dtype size s, numel n)
    read s n, write s n (the copy bandwidth is the ceiling).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import HALF_AND_FLOAT, check_device, check_tensor

DEFAULT_BLOCK = 8192
DEFAULT_WARPS = 8


@triton.jit
def _scale_kernel(d_ptr, s_a_ptr, s_b_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    s = tl.load(s_a_ptr).to(tl.float32) * tl.load(s_b_ptr).to(tl.float32)
    d = tl.load(d_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(d_ptr + offs, (d * s).to(d_ptr.dtype.element_ty), mask=ok)


def scale_product_(d: torch.Tensor, s_a: torch.Tensor, s_b: torch.Tensor, block: int = DEFAULT_BLOCK,
                   num_warps: int = DEFAULT_WARPS) -> torch.Tensor:
    """In place: d <- d * (s_a * s_b), the scales float32 tensors with one element on d's device.
    d: contiguous float16/bfloat16/float32. Returns d."""
    check_tensor(d, "d", HALF_AND_FLOAT)
    if not d.is_contiguous():
        raise ValueError("d must be contiguous (it is scaled in place, as one flat run)")
    for name, s in (("s_a", s_a), ("s_b", s_b)):
        if not isinstance(s, torch.Tensor) or s.numel() != 1 or s.dtype != torch.float32:
            raise TypeError(f"{name} must be a float32 tensor with one element (a per-tensor scale)")
    check_device(_scale_kernel, d=d, s_a=s_a, s_b=s_b)
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 1, got {block}")
    _scale_kernel[(triton.cdiv(d.numel(), block),)](d, s_a.reshape(()), s_b.reshape(()), d.numel(), BLOCK=block,
                                                    num_warps=num_warps)
    return d
