"""Kernel 5: masked decay, in place: ``g += lambda * (1 - m) * w``.

The idea
    SR-STE (Zhou et al. 2021) and masked decay on gradients (Hu et al. 2024) pull the *pruned*
    weights towards zero by adding ``lambda * (1 - m) * w`` to the gradient of W. In PyTorch that is
    ``w * ~m`` (a temporary) and then ``g.add_(..., alpha=lambda)``: two passes and a temporary.
    Here one pass reads g, w and m and writes g. Float32 arithmetic, one rounding to g's dtype
    (the reference ``sparsity_lab.backends.torch_reference.TorchBackend.masked_decay_``).

Bytes (g of dtype size s_g, w of size s_w, bool mask, numel n)
    read ``(s_g + s_w + 1) * n``; write ``s_g * n``. fp32 g and w: 13 bytes per element.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import HALF_AND_FLOAT, check_device, check_same_shape, check_tensor, contiguous

DEFAULT_BLOCK = 4096  # elements per program
DEFAULT_WARPS = 8


@triton.jit
def _masked_decay_kernel(g_ptr, w_ptr, m_ptr, decay, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    g = tl.load(g_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=ok, other=1)
    g = tl.where(m != 0, g, g + decay * w)
    tl.store(g_ptr + offs, g.to(g_ptr.dtype.element_ty), mask=ok)


def masked_decay_(grad: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor, decay: float,
                  block: int = DEFAULT_BLOCK, num_warps: int = DEFAULT_WARPS) -> torch.Tensor:
    """In place ``grad += decay * (1 - mask) * weight``; returns ``grad``.

    grad: contiguous float16/bfloat16/float32 (it is written in place, so it is never copied);
    weight: same shape, any of those dtypes; mask: bool, same shape (True = kept, not decayed).
    """
    check_tensor(grad, "grad", HALF_AND_FLOAT)
    check_tensor(weight, "weight", HALF_AND_FLOAT)
    check_tensor(mask, "mask", (torch.bool,))
    check_same_shape(weight, "weight", grad, "grad")
    check_same_shape(mask, "mask", grad, "grad")
    if not grad.is_contiguous():
        raise ValueError("grad must be contiguous: the kernel updates it in place "
                         f"(got strides {grad.stride()} for shape {tuple(grad.shape)})")
    if isinstance(decay, torch.Tensor) or not isinstance(decay, (int, float)) or decay != decay:
        raise TypeError(f"decay must be a finite Python float, got {decay!r}")
    check_device(_masked_decay_kernel, grad=grad, weight=weight, mask=mask)
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 1, got {block}")
    if decay == 0:
        return grad
    weight = contiguous(weight.detach())
    mask_u8 = contiguous(mask).view(torch.uint8)
    n = grad.numel()
    _masked_decay_kernel[(triton.cdiv(n, block),)](grad, weight, mask_u8, float(decay), n, BLOCK=block,
                                                   num_warps=num_warps)
    return grad
