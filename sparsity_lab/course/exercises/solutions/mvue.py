"""Worked solutions: MVUE 2:4 (notebook 06)."""
from __future__ import annotations

import torch


def mvue_probabilities(groups: torch.Tensor) -> torch.Tensor:
    r"""$p_i = \min(1, c|x_i|)$ with $\sum_i p_i = 2$ (water-filling). Either nothing is capped,
    $p = 2|x| / \sum|x|$, or only the largest is: $p = 1$ for it and $|x_i| / (\text{sum of the other
    three})$ for the rest. Groups with fewer than two non-zeros keep their non-zeros ($p = 1$)."""
    a = groups.abs().double()
    total = a.sum(-1, keepdim=True)
    largest, where = a.max(-1, keepdim=True)
    rest = total - largest
    uncapped = 2 * a / total.clamp_min(1e-300)
    capped = (a / rest.clamp_min(1e-300)).scatter(-1, where, 1.0)
    p = torch.where(largest > rest, capped, uncapped)
    few = (a > 0).sum(-1, keepdim=True) < 2
    return torch.where(few, (a > 0).double(), p)


def mvue24(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One MVUE 2:4 draw along the last dimension: systematic sampling, one uniform per group.

    Entry i owns the interval [P_{i-1}, P_i) of [0, 2), P = cumsum(p); u ~ U[0, 1) and u + 1 each fall
    in one interval, never the same one (every p_i <= 1), so exactly the entry owning each is kept and
    P(keep i) = p_i.
    """
    groups = x.double().reshape(*x.shape[:-1], -1, 4)
    p = mvue_probabilities(groups)
    hi = torch.cumsum(p, -1)
    hi[..., -1] = 2.0                                            # no rounding gap at the end
    lo = torch.cat([torch.zeros_like(hi[..., :1]), hi[..., :-1]], -1)
    u = torch.rand(groups.shape[:-1] + (1,), generator=generator, dtype=torch.float64)
    keep = ((lo <= u) & (u < hi)) | ((lo <= u + 1) & (u + 1 < hi))
    out = torch.where(keep & (p > 0), groups / p.clamp_min(1e-300), torch.zeros_like(groups))
    return out.reshape(x.shape).to(x.dtype)


def mvue_variance(groups: torch.Tensor) -> torch.Tensor:
    r"""$\sum_i x_i^2 (1/p_i - 1)$ per group, entries with $x_i = 0$ left out."""
    x = groups.double()
    p = mvue_probabilities(x)
    return torch.where(x != 0, x * x * (1 / p.clamp_min(1e-300) - 1), torch.zeros_like(x)).sum(-1)
