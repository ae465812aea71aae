"""Worked solutions: N:M masks (notebook 01) and transposable masks (notebook 02).

Plain PyTorch, written to be read: each function is the few lines the notebook asks for.
"""
from __future__ import annotations

import itertools
import math

import torch


def nm_mask(w: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Keep the n largest |w| of every m consecutive entries along the last dimension.

    A stable descending sort ranks each group; ties keep their order, so the lower index wins.
    """
    groups = w.abs().reshape(*w.shape[:-1], w.shape[-1] // m, m)          # (..., K/m, m)
    order = torch.sort(groups, dim=-1, descending=True, stable=True).indices
    keep = torch.zeros_like(groups, dtype=torch.bool)
    keep.scatter_(-1, order[..., :n], True)                                 # the first n of each group
    return keep.reshape(w.shape)


def kept_fraction(w: torch.Tensor, mask: torch.Tensor) -> float:
    r"""$\sum_{ij} |w_{ij}| m_{ij} / \sum_{ij} |w_{ij}|$."""
    a = w.abs().double()
    return float((a * mask).sum() / a.sum())


def unstructured_mask(w: torch.Tensor, density: float) -> torch.Tensor:
    """Keep the round(density * numel) largest |w| of the whole tensor (ties: lowest row-major index)."""
    flat = w.abs().reshape(-1)
    order = torch.sort(flat, descending=True, stable=True).indices
    keep = torch.zeros(flat.numel(), dtype=torch.bool)
    keep[order[:round(density * flat.numel())]] = True
    return keep.reshape(w.shape)


def expected_unstructured_kept(density: float) -> float:
    r"""$e^{-t^2/2}$ with $t = \sqrt{2}\,\mathrm{erfinv}(1 - d)$: $P(|w| > t) = d$ for $w \sim N(0, 1)$ and
    $E[|w|; |w| > t] = \sqrt{2/\pi}\, e^{-t^2/2}$, while $E|w| = \sqrt{2/\pi}$."""
    t = math.sqrt(2.0) * float(torch.special.erfinv(torch.tensor(1.0 - density, dtype=torch.float64)))
    return math.exp(-t * t / 2.0)


def transposable_patterns(n: int, m: int) -> torch.Tensor:
    """Every m x m 0/1 tile with n ones per row and per column: choose each row's n columns, keep the
    choices whose column sums are all n (2:4: 6^4 = 1296 candidates, 90 survive)."""
    row_choices = [torch.zeros(m, dtype=torch.bool).index_fill(0, torch.tensor(cols), True)
                   for cols in itertools.combinations(range(m), n)]
    found = [torch.stack(rows) for rows in itertools.product(row_choices, repeat=m)
             if bool((torch.stack(rows).sum(0) == n).all())]
    return torch.stack(found)


def transposable_mask_search(w: torch.Tensor) -> torch.Tensor:
    """Exact transposable 2:4 mask: the best of the 90 patterns on every 4x4 tile."""
    o, i = w.shape
    tiles = w.abs().reshape(o // 4, 4, i // 4, 4).permute(0, 2, 1, 3).reshape(-1, 16)   # (T, 16)
    patterns = transposable_patterns(2, 4).reshape(-1, 16)                              # (90, 16)
    best = (tiles.double() @ patterns.double().T).argmax(dim=1)                         # (T,)
    return patterns[best].reshape(o // 4, i // 4, 4, 4).permute(0, 2, 1, 3).reshape(o, i)


def greedy_keep(w: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Greedy transposable mask (Hubara et al. 2021): per tile, visit by descending |w| and keep an entry
    while its row and its column hold fewer than n. Plain loops: clear, not fast."""
    o, i = w.shape
    keep = torch.zeros(o, i, dtype=torch.bool)
    for a in range(0, o, m):
        for b in range(0, i, m):
            tile = w[a:a + m, b:b + m].abs().reshape(-1)
            rows, cols = [0] * m, [0] * m
            for p in torch.sort(tile, descending=True, stable=True).indices.tolist():
                r, c = divmod(p, m)
                if rows[r] < n and cols[c] < n:
                    keep[a + r, b + c] = True
                    rows[r] += 1
                    cols[c] += 1
    return keep
