"""Worked solutions: S-STE (notebook 05)."""
from __future__ import annotations

import torch


def soft_threshold(w: torch.Tensor) -> torch.Tensor:
    r"""$S(w)_i = m_i\,\mathrm{sign}(w_i)\max(|w_i| - t, 0)$ per group of 4 along the last dimension,
    $t$ = the largest pruned $|w|$ of the group (for 2:4: the second smallest)."""
    a = w.abs()
    groups = a.reshape(*w.shape[:-1], -1, 4)
    order = torch.sort(groups, dim=-1, descending=True, stable=True).indices
    keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, order[..., :2], True)   # the 2:4 mask
    t = groups.masked_fill(keep, 0).amax(dim=-1, keepdim=True)                              # largest pruned
    soft = torch.where(keep, (groups - t).clamp_min(0), torch.zeros_like(groups))
    return torch.sign(w) * soft.reshape(w.shape)


def sste_beta(w: torch.Tensor, s: torch.Tensor) -> float:
    r"""$\beta = \arg\min_b \lVert W - b\,S \rVert^2 = \langle W, S\rangle / \langle S, S\rangle$ (1 when S = 0)."""
    w, s = w.double(), s.double()
    den = (s * s).sum()
    return float((w * s).sum() / den) if den > 0 else 1.0


def sste_weight(w: torch.Tensor, beta) -> torch.Tensor:
    """Value beta * S(w); gradient straight through to w: the detached difference adds the value
    without adding anything to the graph."""
    return w + (beta * soft_threshold(w.detach()) - w).detach()
