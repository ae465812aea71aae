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

    Masked decay on gradients (``MaskedDecay``, Hu et al. 2024's placement: after clipping, right before the
    update) joins the same pass where asked (``masked_decays``): g + decay * (1 - m) * W, with W the bf16
    weight rebuilt from the master by the same rounding (the bf16 weight is always the master rounded),
    so only the mask's byte is read on top. Kernel 5 would otherwise read the gradient, W and the mask and
    write the gradient back, rounded to bf16, before this pass reads it again.

Bytes (n weights)
    read ``2 n`` (gradient) + ``12 n`` (master, two moments); write ``12 n`` + ``2 n`` (bf16 weight).
    With the masked decay ``n`` more read (the mask); kernel 5 apart reads ``5 n`` and writes ``2 n``.
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
def _bf16_bits(p):
    """The bf16 bits (int32, low 16 bits) of float32 p rounded to nearest even on the bits: add 0x7FFF plus the
    kept part's lowest bit, keep the top 16; NaN stays a NaN."""
    bits = p.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return tl.where(p != p, 0x7FC0, rounded)


@triton.jit
def _adamw_update(g, p, m, v, keep, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt, eps):
    """One AdamW step of float32 tiles (any one shape): (p, m, v) after it, in the reference's order (module
    docstring of ``sparsity_lab.references.adamw_master``). Shared by kernels 20 and 26."""
    p = p * keep
    m = beta1 * m + one_minus_beta1 * g
    v = beta2 * v + one_minus_beta2 * g * g
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    p = p - tl.div_rn(step_size * m, denom)
    return p, m, v


@triton.jit
def _adamw_master_kernel(g_ptr, p_ptr, m_ptr, v_ptr, low_ptr, n, keep, beta1, one_minus_beta1, beta2,
                         one_minus_beta2, step_size, bc2_sqrt, eps, mask_ptr, decay, BLOCK: tl.constexpr,
                         MASKED_DECAY: tl.constexpr = False):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    # the bf16 and mask bytes read and written in runs of 4 weights a thread, as the float32 tensors are: with one
    # layout for all, no value goes through shared memory (offline sm_90 SASS, Triton 3.9: no barrier and 76
    # instructions a weight, against 11 barriers and 80 when each tensor's accesses are 16 bytes wide)
    offs4 = tl.max_contiguous(offs, 4)
    g = tl.load(g_ptr + offs4, mask=ok, other=0.0).to(tl.float32)
    p = tl.load(p_ptr + offs, mask=ok, other=0.0)
    m = tl.load(m_ptr + offs, mask=ok, other=0.0)
    v = tl.load(v_ptr + offs, mask=ok, other=0.0)
    if MASKED_DECAY:  # g + decay * (1 - mask) * W, W the bf16 weight (the master rounded, rebuilt here): kernel 5
        kept = tl.load(mask_ptr + offs4, mask=ok, other=1)
        w = (_bf16_bits(p) << 16).to(tl.float32, bitcast=True)
        g = tl.where(kept != 0, g, g + decay * w)
    p, m, v = _adamw_update(g, p, m, v, keep, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt,
                            eps)
    tl.store(p_ptr + offs, p, mask=ok)
    tl.store(m_ptr + offs, m, mask=ok)
    tl.store(v_ptr + offs, v, mask=ok)
    tl.store(low_ptr + offs4, _bf16_bits(p).to(tl.int16), mask=ok)


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


def _check_masked_decays(masked_decays: dict | None, masters: Sequence[torch.Tensor]) -> dict:
    """{weight index: (bool mask of its shape, contiguous; decay float)}, checked."""
    if masked_decays is None:
        return {}
    if not isinstance(masked_decays, dict):
        raise TypeError("masked_decays must be a dict {weight index: (mask, decay)}, got "
                        f"{type(masked_decays).__name__}")
    for i, entry in masked_decays.items():
        if not (isinstance(i, int) and 0 <= i < len(masters)):
            raise ValueError(f"masked_decays: key {i!r} is not the index of one of the {len(masters)} weights")
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise TypeError(f"masked_decays[{i}] must be a (mask, decay) pair, got {entry!r}")
        mask, decay = entry
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"masked_decays[{i}]'s mask must be a torch.bool tensor, got "
                            f"{getattr(mask, 'dtype', type(mask).__name__)}")
        if mask.shape != masters[i].shape or not mask.is_contiguous():
            raise ValueError(f"masked_decays[{i}]'s mask must be contiguous with masters[{i}]'s shape "
                             f"{tuple(masters[i].shape)}, got {tuple(mask.shape)}")
        if isinstance(decay, bool) or not isinstance(decay, (int, float)):
            raise TypeError(f"masked_decays[{i}]'s decay must be a number, got {decay!r}")
    return masked_decays


def adamw_master_(lows: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], masters: Sequence[torch.Tensor],
                  exp_avgs: Sequence[torch.Tensor], exp_avg_sqs: Sequence[torch.Tensor], *, step: int, lr: float,
                  beta1: float, beta2: float, eps: float, weight_decay: float, masked_decays: dict | None = None,
                  block: int = DEFAULT_BLOCK, num_warps: int = DEFAULT_WARPS) -> None:
    """One AdamW step of every weight i, in place, one launch per weight: masters[i], exp_avgs[i], exp_avg_sqs[i]
    (float32) from grads[i] (bf16), then lows[i] (bf16) <- masters[i] rounded to nearest. Each weight's
    five tensors share a shape; every tensor contiguous, all on one device. step: the step count after
    this update (>= 1), the same for every weight here.

    masked_decays: {i: (mask, decay)}: weight i's gradient first takes the masked decay of kernel 5,
    g + decay * (1 - mask) * W with W = lows[i] (the master rounded), in float32 inside the same pass, where
    kernel 5 would round it to bf16 and write it back first (5 bytes per weight read and 2 written saved;
    the mask's byte is read here)."""
    lists = {"lows": lows, "grads": grads, "masters": masters, "exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs}
    count = _check_lists(lists)
    decays = _check_masked_decays(masked_decays, masters)
    if count == 0:
        return
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16, got {block}")
    device = check_device(_adamw_master_kernel, **{f"{name}[{i}]": x for name, ts in lists.items()
                                                   for i, x in enumerate(ts)})
    if decays:
        masks = {f"masked_decays[{i}]": mask for i, (mask, _) in decays.items()}
        check_device(_adamw_master_kernel, masters=masters[0], **masks)
    s = adamw_scalars(step, lr, beta1, beta2, weight_decay)
    for i, (g, p, m, v, low) in enumerate(zip(grads, masters, exp_avgs, exp_avg_sqs, lows)):
        n = p.numel()
        mask, decay = decays.get(i, (p, 0.0))  # no decay: an unused pointer (MASKED_DECAY off)
        # plain pointer arguments: triton sees their 16-byte alignment and reads whole vectors
        _adamw_master_kernel[(triton.cdiv(n, block),)](
            g, p, m, v, low.view(torch.int16), n, s["keep"], beta1, 1.0 - beta1, beta2, 1.0 - beta2,
            s["step_size"], s["bc2_sqrt"], eps, mask.view(torch.uint8) if i in decays else mask, float(decay),
            BLOCK=block, MASKED_DECAY=i in decays, num_warps=num_warps)
