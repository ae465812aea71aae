"""S-STE's soft threshold and its frozen per-tensor scale (Hu, Zhu, Chen 2024).

Per group of M along the rows, with the N:M mask m of the group:
    t   = the largest pruned |w| of the group (for 2:4 row-wise masks: the 2nd smallest |w|)
    S(w)_i = m_i * sign(w_i) * max(|w_i| - t, 0)
S is continuous in w: when two magnitudes cross, both sit at the threshold, so the entry that
leaves the mask and the one that enters it are both 0 there. Hard thresholding (m * w) jumps.
With a transposable mask the same t (largest pruned |w| in the row group) is used; the result is
still N:M both ways (it only zeros entries), but the continuity argument is for row-wise masks.

beta = <W, S(W)> / <S(W), S(W)> (least squares) rescales S(W) towards W; it is computed once at
conversion and frozen. Gaussian W gives beta ~ 1.48.
"""
from __future__ import annotations

import math

import torch

from ..masks.nm import nm_mask
from ..validation import check_2d, check_divisible, check_float_tensor, check_has_values, check_nm


def soft_threshold(weight: torch.Tensor, mask: torch.Tensor | None = None, n: int = 2, m: int = 4,
                   check: bool = True) -> torch.Tensor:
    """S(W) for a 2-D weight (out, in), groups of M along ``in``. Returns a tensor like weight.

    mask: the N:M keep mask to use (bool, same shape); None computes the row-wise magnitude mask.
    check=False skips the argument checks (hot paths).
    """
    if check:
        check_nm(n, m)
        check_float_tensor(weight, "weight", allow_meta=True)
        check_2d(weight, "weight")
        check_divisible(weight.shape[1], m, "weight", 1)
    if mask is None:
        mask = nm_mask(weight, n, m, check=check)
    else:  # cheap checks (no device sync), kept even with check=False
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise TypeError(f"mask must be a bool tensor (True = kept), got {got}")
        if mask.shape != weight.shape:
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected weight's {tuple(weight.shape)}")
    a = weight.abs()
    pruned = a.masked_fill(mask, 0).reshape(weight.shape[0], -1, m)
    t = pruned.amax(dim=-1, keepdim=True).expand(-1, -1, m).reshape(weight.shape)
    return torch.where(mask, torch.sign(weight) * (a - t).clamp_min(0), torch.zeros_like(weight))


def sste_beta(weight: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
    """beta = <W, S(W)> / <S(W), S(W)>, as a float32 scalar tensor (1.0 when S(W) = 0).

    weight and soft: same shape (no broadcasting: a mismatch would give a silently wrong beta).
    """
    check_has_values(weight, "weight", "sste_beta")
    check_has_values(soft, "soft", "sste_beta")
    if soft.shape != weight.shape:
        raise ValueError(f"soft has shape {tuple(soft.shape)}, expected weight's {tuple(weight.shape)}")
    w, s = weight.detach().double(), soft.detach().double()
    # beta is scale-invariant: divide both by a power of two near max |w| first, so that the dot
    # products neither overflow (float64 weights near 1e307 gave inf / inf = NaN) nor underflow
    # (subnormal S gave <S, S> = 0 and beta = 1)
    top = float(w.abs().max())
    if 0 < top < math.inf:
        shift = math.frexp(top)[1]
        exponent = torch.tensor(-shift, device=w.device)  # on the weight's device (CUDA weights too)
        w, s = torch.ldexp(w, exponent), torch.ldexp(s, exponent)
    den = (s * s).sum()
    beta = (w * s).sum() / den if den > 0 else torch.ones((), dtype=torch.float64, device=w.device)
    return beta.float()
