"""Kernel 20: AdamW over float32 master weights, reading bf16 gradients and writing the bf16 weights, one pass.

The idea
    With bf16 weights and float32 masters (``sparsity_lab.lab.master_weights``) an optimizer step made of
    PyTorch's parts is three passes over every lowered weight: copy the bf16 gradient into a float32
    master gradient, run the fused AdamW on the masters, copy the masters back into the bf16 weights.
    The two copies move 12 bytes per weight on top of AdamW's 28 (about a third of the optimizer's time
    in the H100 profile of the lab GPT, results/step_profile_h100.json). Here one program
    reads a block of the bf16 gradient, the master and both moments, updates them in float32 and
    writes the master, the moments and the master rounded to bf16: 28 bytes per weight, what AdamW over
    float32 weights moves, and the bf16 weight is written where a float32 run would cast it again in
    every forward.

    One launch per lowered tensor (a few dozen per step, a few microseconds each): a first version
    served every tensor from one launch through a table of addresses and measured slower on the H100
    than the three passes it replaced (docs/measuring.md), probably because loads through pointers
    read from memory are not vectorised. The rounding to bf16 is done on the bits (round to
    nearest even, NaN kept a NaN), so it is the same on the GPU and in the CPU interpreter (whose own
    float32 -> bf16 cast truncates). Square root and division are the IEEE ones (``sqrt_rn``,
    ``div_rn``). Reference: ``sparsity_lab.references.adamw_master.adamw_master_step_``.

Bytes (n weights)
    read ``2 n`` (gradient) + ``12 n`` (master, two moments); write ``12 n`` + ``2 n`` (bf16 weight).
"""
from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from sparsity_lab.references.adamw_master import adamw_scalars

from ._common import MAX_NUMEL, check_device

DEFAULT_BLOCK = 2048  # weights per program
DEFAULT_WARPS = 4


@triton.jit
def _adamw_master_kernel(g_ptr, p_ptr, m_ptr, v_ptr, low_ptr, n, keep, beta1, one_minus_beta1, beta2,
                         one_minus_beta2, step_size, bc2_sqrt, eps, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    g = tl.load(g_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    p = tl.load(p_ptr + offs, mask=ok, other=0.0)
    m = tl.load(m_ptr + offs, mask=ok, other=0.0)
    v = tl.load(v_ptr + offs, mask=ok, other=0.0)
    p = p * keep
    m = beta1 * m + one_minus_beta1 * g
    v = beta2 * v + one_minus_beta2 * g * g
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    p = p - tl.div_rn(step_size * m, denom)
    tl.store(p_ptr + offs, p, mask=ok)
    tl.store(m_ptr + offs, m, mask=ok)
    tl.store(v_ptr + offs, v, mask=ok)
    # round to nearest even on the bits: add 0x7FFF plus the kept part's lowest bit, keep the top 16
    bits = p.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    low = tl.where(p != p, 0x7FC0, rounded).to(tl.int16)
    tl.store(low_ptr + offs, low, mask=ok)


def _check_lists(lists: dict[str, Sequence[torch.Tensor]]) -> int:
    counts = {name: len(ts) for name, ts in lists.items()}
    if len(set(counts.values())) != 1:
        raise ValueError(f"the tensor lists must have one entry per weight, got lengths {counts}")
    dtypes = {"grads": torch.bfloat16, "lows": torch.bfloat16, "masters": torch.float32,
              "exp_avgs": torch.float32, "exp_avg_sqs": torch.float32}
    for name, ts in lists.items():
        for i, x in enumerate(ts):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name}[{i}] must be a torch.Tensor, got {type(x).__name__}")
            if x.dtype != dtypes[name]:
                raise TypeError(f"{name}[{i}] must be {dtypes[name]}, got {x.dtype}")
            if not x.is_contiguous():
                raise ValueError(f"{name}[{i}] must be contiguous (it is updated in place)")
            if x.shape != lists["masters"][i].shape:
                raise ValueError(f"{name}[{i}] has shape {tuple(x.shape)}, masters[{i}] {tuple(lists['masters'][i].shape)}")
            if x.numel() == 0 or x.numel() > MAX_NUMEL:
                raise ValueError(f"{name}[{i}] has {x.numel()} elements; expected 1 to {MAX_NUMEL} (int32 offsets)")
    return next(iter(counts.values()))


def adamw_master_(lows: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], masters: Sequence[torch.Tensor],
                  exp_avgs: Sequence[torch.Tensor], exp_avg_sqs: Sequence[torch.Tensor], *, step: int, lr: float,
                  beta1: float, beta2: float, eps: float, weight_decay: float, block: int = DEFAULT_BLOCK,
                  num_warps: int = DEFAULT_WARPS) -> None:
    """One AdamW step of every weight i, in place, one launch per weight: masters[i], exp_avgs[i], exp_avg_sqs[i]
    (float32) from grads[i] (bf16), then lows[i] (bf16) <- masters[i] rounded to nearest. Each weight's
    five tensors share a shape; every tensor contiguous, all on one device. step: the step count after
    this update (>= 1), the same for every weight here."""
    lists = {"lows": lows, "grads": grads, "masters": masters, "exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs}
    count = _check_lists(lists)
    if count == 0:
        return
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16, got {block}")
    device = check_device(_adamw_master_kernel, **{f"{name}[{i}]": x for name, ts in lists.items()
                                                   for i, x in enumerate(ts)})
    s = adamw_scalars(step, lr, beta1, beta2, weight_decay)
    for g, p, m, v, low in zip(grads, masters, exp_avgs, exp_avg_sqs, lows):
        n = p.numel()
        # plain pointer arguments: triton sees their 16-byte alignment and reads whole vectors
        _adamw_master_kernel[(triton.cdiv(n, block),)](
            g, p, m, v, low.view(torch.int16), n, s["keep"], beta1, 1.0 - beta1, beta2, 1.0 - beta2,
            s["step_size"], s["bc2_sqrt"], eps, BLOCK=block, num_warps=num_warps)
