"""Kernel 25: a 2:4 weight's optimizer step and the next step's mask refresh in one pass (kernels 20 and 21).

The idea
    In a step with bf16 weights and float32 masters, every 2:4 weight is passed over twice: kernel 20
    (``adamw_master.py``) updates its master and moments and writes the bf16 W, then, at the next
    forward, kernel 21 (``refresh24.py``) reads W back for the transposable mask, the flips and both
    compressed forms of S(W). The first pass is bound by memory (28 bytes a weight, little arithmetic),
    the second by the SMs (the 90-pattern search: 85-91 % SM throughput, about 30 % of DRAM's,
    ``results/ncu_step_kernels_h200.json``). Run on two CUDA streams they hardly overlap
    (``results/optimizer_overlap_h200.json``: 2-10 % of the refresh hidden).

    Here one program owns a 64 x 64 block of the weight and does both, so while some programs of an SM
    wait for their block's memory, others search theirs:
    * AdamW on the block, kernel 20's arithmetic in its order, loaded and stored as four (16, 64) row
      slices (rows 4a + r of the block: row r of each 4 x 4 tile), the bf16 W rounded to nearest on the
      bits and stored;
    * those bf16 values, split into the tiles' 16 entries (``refresh24._load_block``'s layout), go
      through kernel 21's code unchanged: the mask search, the flips, S and the two compressed forms.
    The results equal ``adamw_master_`` followed by ``refresh24`` on the updated W, bit for bit (tested).

Bytes (W of n elements)
    read ``2 n`` (gradient) + ``12 n`` (master, moments) + ``n`` (mask); write ``12 n`` + ``2 n`` (bf16 W)
    + ``n`` (mask) + ``2.25 n`` (two compressed forms): 32.25 bytes a weight, against 34.25 for the two
    kernels (kernel 21 reads W again).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparsity_lab.references.adamw_master import adamw_scalars

from ._common import check_device
from .prepare24 import TILE, check_weight_mask_beta
from .refresh24 import _block_values, _compressed_outputs, _refresh_mask_words, _store_forms, check_mask_in_place
from .transposable24 import _pattern_code, _split4_2d

DEFAULT_WARPS = 4


@triton.jit
def _adamw_slice(g_ptr, p_ptr, m_ptr, v_ptr, low_ptr, offs, keep, beta1, one_minus_beta1, beta2, one_minus_beta2,
                 step_size, bc2_sqrt, eps):
    """Kernel 20's update of the elements at ``offs`` (one (16, 64) row slice); returns the bf16 W written."""
    g = tl.load(g_ptr + offs).to(tl.float32)
    p = tl.load(p_ptr + offs)
    m = tl.load(m_ptr + offs)
    v = tl.load(v_ptr + offs)
    p = p * keep
    m = beta1 * m + one_minus_beta1 * g
    v = beta2 * v + one_minus_beta2 * g * g
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    p = p - tl.div_rn(step_size * m, denom)
    tl.store(p_ptr + offs, p)
    tl.store(m_ptr + offs, m)
    tl.store(v_ptr + offs, v)
    bits = p.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even, as kernel 20
    low = tl.where(p != p, 0x7FC0, rounded).to(tl.int16)
    tl.store(low_ptr + offs, low)
    return low.to(tl.bfloat16, bitcast=True)


@triton.jit
def _adamw_refresh24_kernel(g_ptr, p_ptr, m_ptr, v_ptr, low_ptr, mask_ptr, beta_ptr, flips_ptr, vals_ptr, meta_ptr,
                            vals_t_ptr, meta_t_ptr, n_rows, n_cols, keep, beta1, one_minus_beta1, beta2,
                            one_minus_beta2, step_size, bc2_sqrt, eps, SOFT: tl.constexpr, COUNT: tl.constexpr,
                            WRITE_W: tl.constexpr, WRITE_T: tl.constexpr):
    r0 = tl.program_id(0) * 64
    c0 = tl.program_id(1) * 64
    offs = (r0 + 4 * tl.arange(0, 16))[:, None] * n_cols + (c0 + tl.arange(0, 64))[None, :]
    w00, w01, w02, w03 = _split4_2d(_adamw_slice(g_ptr, p_ptr, m_ptr, v_ptr, low_ptr, offs, keep, beta1,
                                                 one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt, eps),
                                    16, 16)
    offs += n_cols
    w10, w11, w12, w13 = _split4_2d(_adamw_slice(g_ptr, p_ptr, m_ptr, v_ptr, low_ptr, offs, keep, beta1,
                                                 one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt, eps),
                                    16, 16)
    offs += n_cols
    w20, w21, w22, w23 = _split4_2d(_adamw_slice(g_ptr, p_ptr, m_ptr, v_ptr, low_ptr, offs, keep, beta1,
                                                 one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt, eps),
                                    16, 16)
    offs += n_cols
    w30, w31, w32, w33 = _split4_2d(_adamw_slice(g_ptr, p_ptr, m_ptr, v_ptr, low_ptr, offs, keep, beta1,
                                                 one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt, eps),
                                    16, 16)
    # from here kernel 21 on the bf16 W just written (refresh24._refresh_block after its load)
    code = _pattern_code(w00, w01, w02, w03, w10, w11, w12, w13, w20, w21, w22, w23, w30, w31, w32, w33)
    _refresh_mask_words(mask_ptr, flips_ptr, code, r0, c0, n_rows, n_cols, COUNT, False)
    s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33 = _block_values(
        w00, w01, w02, w03, w10, w11, w12, w13, w20, w21, w22, w23, w30, w31, w32, w33, code, beta_ptr, SOFT,
        tl.bfloat16)
    _store_forms(s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33, beta_ptr, vals_ptr,
                 meta_ptr, vals_t_ptr, meta_t_ptr, r0, c0, n_rows, n_cols, WRITE_W, WRITE_T)


_STATE_DTYPES = {"low": torch.bfloat16, "grad": torch.bfloat16, "master": torch.float32, "exp_avg": torch.float32,
                 "exp_avg_sq": torch.float32}


def _check_state(**tensors: torch.Tensor) -> None:
    """The optimizer state of one weight: tensors of the expected dtypes, contiguous, of low's shape."""
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != _STATE_DTYPES[name]:
            raise TypeError(f"{name} must be {_STATE_DTYPES[name]}, got {x.dtype}")
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous (it is read or updated in place as a flat array)")
        if x.shape != tensors["low"].shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, low {tuple(tensors['low'].shape)}")


def adamw_refresh24_(low: torch.Tensor, grad: torch.Tensor, master: torch.Tensor, exp_avg: torch.Tensor,
                     exp_avg_sq: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | float | None = None, *,
                     step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                     forward: bool = True, transposed: bool = True, count: bool = True,
                     num_warps: int = DEFAULT_WARPS
                     ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """One AdamW step of a 2:4 weight and the refresh of its transposable mask on the updated W, one pass.

    low: the bf16 weight (out, in), written; grad: its bf16 gradient; master, exp_avg, exp_avg_sq: float32,
    updated in place; all five contiguous, out and in multiples of 64. mask: bool (out, in), contiguous, the
    previous mask on entry and the new one on return. beta, forward, transposed, count: as ``refresh24``
    (the forms in bf16). step, lr, beta1, beta2, eps, weight_decay: as ``adamw_master_``.

    Returns ``(flips, fwd, bwd)``, the results of::

        adamw_master_([low], [grad], [master], [exp_avg], [exp_avg_sq], step=step, ...)
        flips, fwd, bwd = refresh24(low, mask, beta, torch.bfloat16, forward, transposed, count)
    """
    _check_state(low=low, grad=grad, master=master, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq)
    if low.dim() != 2 or low.shape[0] % TILE or low.shape[1] % TILE:
        raise ValueError(f"low has shape {tuple(low.shape)}; expected a 2-D (out, in) weight with out and in multiples "
                         f"of {TILE} (whole 64 x 64 tiles): run adamw_master_ and refresh24 separately for others")
    beta = check_weight_mask_beta(low, mask, beta, torch.bfloat16, "the forms' dtype")
    check_mask_in_place(mask)
    check_device(_adamw_refresh24_kernel, low=low, grad=grad, master=master, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq,
                 mask=mask)
    s = adamw_scalars(step, lr, beta1, beta2, weight_decay)
    rows, cols = low.shape
    flips = torch.zeros((), dtype=torch.int64, device=low.device) if count else None
    fwd, fwd_vals, fwd_meta = _compressed_outputs(rows, cols, torch.bfloat16, low.device) if forward else (None, low, low)
    bwd, bwd_vals, bwd_meta = _compressed_outputs(cols, rows, torch.bfloat16, low.device) if transposed else (None, low, low)
    mask_words = mask.view(torch.int32)
    _adamw_refresh24_kernel[(rows // TILE, cols // TILE)](
        grad, master, exp_avg, exp_avg_sq, low.view(torch.int16), mask_words,
        beta.reshape(()).float() if beta is not None else master, flips if count else mask_words,
        fwd_vals, fwd_meta, bwd_vals, bwd_meta, rows, cols, s["keep"], beta1, 1.0 - beta1, beta2, 1.0 - beta2,
        s["step_size"], s["bc2_sqrt"], eps, SOFT=beta is not None, COUNT=count, WRITE_W=forward,
        WRITE_T=transposed, num_warps=num_warps)
    torch.autograd.graph.increment_version(mask)  # written in place, as refresh24 says
    return flips, fwd, bwd
