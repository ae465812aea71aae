"""Kernel 26: kernel 20's AdamW step of a 2:4 weight that also writes the next step's S(W) and S(W)^T (kernel 11).

The idea
    With bf16 weights, float32 masters and a mask kept for several steps (``mask_refresh_interval`` > 1), each
    step of a 2:4 layer on cuSPARSELt runs two passes over its weight: the optimizer (kernel 20) reads the
    gradient, master and moments and writes them back with the bf16 weight W; then the next forward's kernel 11
    reads W and the mask again to write the compressed operands S(W) (forward) and S(W)^T (input gradient).
    Here one program takes a 64 x 64 tile of the weight through both: the AdamW step of kernel 20 (the same
    helper, the same float32 arithmetic), the bf16 W rounded from the new master, then S of that tile from
    the mask (S-STE's ``beta * soft_threshold`` or the STE family's ``m * W``, kernel 11's helpers) stored
    compressed twice in cuSPARSELt's layout. W is not read back, and the launch of kernel 11 is gone.

    What is exact: the compressed forms are kernel 11's of the bf16 weight this kernel writes, bit for bit (the
    same helpers on the same bf16 values). The master, the moments and W are kernel 20's step: bit for bit in
    the CPU interpreter; on the GPU both may contract a * b + c into one fused multiply-add, a few float32 ulps
    of the operands away from the reference (and up to lr where a decayed gradient cancels to zero, which AdamW
    normalises; ``tests/_kernel_testing.AdamwMagnitudes``).

    Optional masked decay (``decay``): ``MaskedDecay``'s g + decay * (1 - m) * W in float32, as kernel 20 adds
    it; the mask is read once for both uses.

Bytes (W of O x I weights)
    kernel 20: read 2 (gradient) + 12 (master, moments), write 12 + 2 (W): 28 per weight; here also read 1 (the
    mask) and write 2 * (2 / 2 + 1 / 8) = 2.25 (two compressed bf16 forms): 31.25. Kernels 20 and 11 apart:
    28 + 5.25 = 33.25, in two launches, the second issue-bound (``kernels/NOTES.md``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparsity_lab.references.adamw_master import adamw_scalars

from ._common import check_device
from .adamw_master import _adamw_update, _bf16_bits
from .compress24 import _pick, _store_compressed
from .prepare24 import TILE, _join_groups, _operand_bits, _sparse_groups, _split_groups, check_beta, compressed_buffers

DEFAULT_WARPS = 16


@triton.jit
def _adamw_prepare24_kernel(g_ptr, p_ptr, m_ptr, v_ptr, low_ptr, mask_ptr, beta_ptr, vals_ptr, meta_ptr, vals_t_ptr,
                            meta_t_ptr, n_rows, n_cols, keep, beta1, one_minus_beta1, beta2, one_minus_beta2,
                            step_size, bc2_sqrt, eps, decay, SOFT: tl.constexpr, MASKED_DECAY: tl.constexpr,
                            SIGN_OFF: tl.constexpr = 0x7FFF, TILE_COLS: tl.constexpr = 32):
    r0 = tl.program_id(0) * 64
    c0 = tl.program_id(1) * 64
    offs = (r0 + tl.arange(0, 64))[:, None] * n_cols + (c0 + tl.arange(0, 64))[None, :]  # every tensor contiguous
    g = tl.load(g_ptr + offs).to(tl.float32)
    p = tl.load(p_ptr + offs)
    m = tl.load(m_ptr + offs)
    v = tl.load(v_ptr + offs)
    kept = tl.load(mask_ptr + offs)
    if MASKED_DECAY:  # kernel 20's term: W is the master rounded, rebuilt from it
        w_old = (_bf16_bits(p) << 16).to(tl.float32, bitcast=True)
        g = tl.where(kept != 0, g, g + decay * w_old)
    p, m, v = _adamw_update(g, p, m, v, keep, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt,
                            eps)
    tl.store(p_ptr + offs, p)
    tl.store(m_ptr + offs, m)
    tl.store(v_ptr + offs, v)
    bits = _bf16_bits(p)
    tl.store(low_ptr + offs, bits.to(tl.int16))
    w = (bits.to(tl.int16)).to(tl.bfloat16, bitcast=True)  # the bf16 W just written, as kernel 11 would read it
    s0, s1, s2, s3 = _sparse_groups(w, kept, beta_ptr, SOFT, tl.bfloat16)
    b0, b1, b2, b3 = _operand_bits(s0, s1, s2, s3, beta_ptr, False, 448.0, 3, -6)
    v0, v1, code = _pick(b0, b1, b2, b3, SIGN_OFF)  # S(W): rows r0.., groups c0 / 4..
    _store_compressed(vals_ptr, meta_ptr, r0, c0 // 4, v0, v1, code, n_cols // 2, n_cols // TILE_COLS, False, 16)
    t0, t1, t2, t3 = _split_groups(tl.trans(_join_groups(b0, b1, b2, b3)))  # S(W)^T: rows c0.., groups r0 / 4..
    v0t, v1t, code_t = _pick(t0, t1, t2, t3, SIGN_OFF)
    _store_compressed(vals_t_ptr, meta_t_ptr, c0, r0 // 4, v0t, v1t, code_t, n_rows // 2, n_rows // TILE_COLS,
                      False, 16)


def _check(tensors: dict[str, torch.Tensor], dtypes: dict[str, torch.dtype]) -> tuple[int, int]:
    shape = tensors["master"].shape
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != dtypes[name]:
            raise TypeError(f"{name} must be {dtypes[name]}, got {x.dtype}")
        if x.shape != shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, master {tuple(shape)}: every tensor of the weight "
                             "shares its shape")
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous (it is read or updated in place)")
    if len(shape) != 2 or shape[0] % TILE or shape[1] % TILE:
        raise ValueError(f"the weight must be 2-D (out, in) with both sizes multiples of {TILE}, got {tuple(shape)} "
                         "(other shapes: adamw_master_, and the operands compressed by the backend's own path)")
    if shape[0] * shape[1] > 2**31 - 1:
        raise ValueError(f"the weight {tuple(shape)} exceeds int32 offsets")
    return shape[0], shape[1]


def adamw_master_prepare24_(low: torch.Tensor, grad: torch.Tensor, master: torch.Tensor, exp_avg: torch.Tensor,
                            exp_avg_sq: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | float | None, *,
                            step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                            decay: float | None = None, num_warps: int = DEFAULT_WARPS
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """One AdamW step of a 2:4 weight, in place, and its next compressed operands: ``(S(W), S(W)^T)``.

    low: the bf16 weight W (out, in), written as the new master rounded to nearest; grad: its bf16 gradient;
    master, exp_avg, exp_avg_sq: float32, updated (``adamw_master_``'s step, ``step`` >= 1 the count after it);
    out and in multiples of 64, every tensor contiguous. mask: bool (out, in), transposable 2:4 (not checked:
    the mask kernels make it so). beta: the S-STE scale (float or 0-d float tensor on the device) for
    ``beta * soft_threshold(W, mask)``, or None for ``W * mask``. decay: MaskedDecay's lambda, added to the
    gradient as ``decay * (1 - mask) * W`` before the moments (None: no term).

    Returns the compressed S(W) (out, in) and S(W)^T (in, out) in cuSPARSELt's layout, bit for bit
    ``prepare24(low, mask, beta)`` of the ``low`` written here."""
    tensors = {"low": low, "grad": grad, "master": master, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq, "mask": mask}
    rows, cols = _check(tensors, {"low": torch.bfloat16, "grad": torch.bfloat16, "master": torch.float32,
                                  "exp_avg": torch.float32, "exp_avg_sq": torch.float32, "mask": torch.bool})
    if decay is not None and (isinstance(decay, bool) or not isinstance(decay, (int, float))):
        raise TypeError(f"decay must be a number or None, got {decay!r}")
    beta = check_beta(beta, master.device)
    if beta is not None:
        tensors["beta"] = beta
    check_device(_adamw_prepare24_kernel, **tensors)
    s = adamw_scalars(step, lr, beta1, beta2, weight_decay)
    fwd, fwd_vals, fwd_meta = compressed_buffers(rows, cols, torch.bfloat16, master.device)
    bwd, bwd_vals, bwd_meta = compressed_buffers(cols, rows, torch.bfloat16, master.device)
    mask_u8 = mask.view(torch.uint8)
    beta_t = beta.reshape(()).float() if beta is not None else master
    _adamw_prepare24_kernel[(rows // TILE, cols // TILE)](
        grad, master, exp_avg, exp_avg_sq, low.view(torch.int16), mask_u8, beta_t, fwd_vals, fwd_meta, bwd_vals,
        bwd_meta, rows, cols, s["keep"], beta1, 1.0 - beta1, beta2, 1.0 - beta2, s["step_size"], s["bc2_sqrt"], eps,
        float(decay or 0.0), SOFT=beta is not None, MASKED_DECAY=decay is not None, num_warps=num_warps)
    return fwd, bwd
