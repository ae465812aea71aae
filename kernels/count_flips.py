"""Kernel 9: count the entries where two masks differ (the flip count of a mask refresh).

The idea
    The flip rate ``||m_prev XOR m_new||_1 / D`` (Hu et al. 2024) is logged at every mask refresh.
    In PyTorch, ``(prev ^ new).sum()`` over bool masks casts the XOR to int64 before reducing (an
    8-byte temporary per entry: on the H100 it took longer than reading the masks does, see
    docs/measuring.md). Here each program XORs a block of both masks as bytes, sums it in int32 and adds
    it to one int64 counter with an atomic: one read of each mask, no temporary, and the count
    stays on the device (reading it is the caller's choice, so a training step has no host sync).
    Reference: ``sparsity_lab.methods.flip_rate.mask_flips_tensor``.

Bytes (two bool masks of n entries)
    read ``2 n``; write 8 (the counter).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_device, check_same_shape, check_tensor, contiguous

DEFAULT_BLOCK = 8192  # mask bytes per program
DEFAULT_WARPS = 8


@triton.jit
def _count_flips_kernel(prev_ptr, new_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    a = tl.load(prev_ptr + offs, mask=ok, other=0)
    b = tl.load(new_ptr + offs, mask=ok, other=0)
    flips = tl.sum(((a != 0) != (b != 0)).to(tl.int32), axis=0)
    tl.atomic_add(out_ptr, flips.to(tl.int64))


def count_flips(previous: torch.Tensor, current: torch.Tensor, block: int = DEFAULT_BLOCK,
                num_warps: int = DEFAULT_WARPS) -> torch.Tensor:
    """0-d int64 tensor on the masks' device: how many entries of the two bool masks differ."""
    check_tensor(previous, "previous", (torch.bool,))
    check_tensor(current, "current", (torch.bool,))
    check_same_shape(current, "current", previous, "previous")
    check_device(_count_flips_kernel, previous=previous, current=current)
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 1, got {block}")
    out = torch.zeros((), dtype=torch.int64, device=previous.device)
    n = previous.numel()
    _count_flips_kernel[(triton.cdiv(n, block),)](contiguous(previous).view(torch.uint8),
                                                  contiguous(current).view(torch.uint8), out, n,
                                                  BLOCK=block, num_warps=num_warps)
    return out
