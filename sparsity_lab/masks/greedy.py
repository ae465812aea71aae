"""Approximate transposable N:M masks: greedy keep and the paper's greedy prune.

Both visit the M*M entries of every tile in magnitude order, vectorised across tiles (the only
Python loop is over the M*M positions).

* greedy keep: descending |w|; keep an entry while its row and its column both have room.
  Keeps at least 1/2 of the optimal mass (tight for 1:2 on [[1, 1.001], [0, 1]]). It can get
  stuck one short: a row and a column each with room whose shared entry is already kept.
* greedy prune (Hubara et al. 2021's 2-approximation, stated on the *pruned* mass): ascending |w|;
  prune an entry while its row or its column still holds more than N. It can leave fewer than N
  kept in a row or column, so its masks satisfy only the "at most N" form of the constraint.
"""
from __future__ import annotations

import torch

from .tiles import from_tiles, to_tiles


def _greedy(weight: torch.Tensor, n: int, m: int, keep_mode: bool) -> torch.Tensor:
    mags = to_tiles(weight.detach().abs().float(), m).reshape(-1, m * m)
    t = mags.shape[0]
    order = torch.sort(mags, dim=1, descending=keep_mode, stable=True).indices
    rows_of, cols_of = order // m, order % m
    tile_idx = torch.arange(t, device=weight.device)
    if keep_mode:
        keep = torch.zeros(t, m * m, dtype=torch.bool, device=weight.device)
        row_n = torch.zeros(t, m, dtype=torch.int32, device=weight.device)
        col_n = torch.zeros_like(row_n)
    else:
        keep = torch.ones(t, m * m, dtype=torch.bool, device=weight.device)
        row_n = torch.full((t, m), m, dtype=torch.int32, device=weight.device)
        col_n = torch.full_like(row_n, m)
    for k in range(m * m):
        r, c = rows_of[:, k], cols_of[:, k]
        rn, cn = row_n[tile_idx, r], col_n[tile_idx, c]
        act = (rn < n) & (cn < n) if keep_mode else (rn > n) | (cn > n)
        step = act.to(torch.int32) if keep_mode else -act.to(torch.int32)
        keep[tile_idx, order[:, k]] = act if keep_mode else ~act
        row_n[tile_idx, r] += step
        col_n[tile_idx, c] += step
    return from_tiles(keep.reshape(-1, m, m), tuple(weight.shape))


def solve_greedy_keep(weight: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Greedy keep: at most N per row and column of each tile; >= 1/2 of the optimal mass."""
    return _greedy(weight, n, m, keep_mode=True)


def solve_greedy_prune(weight: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """The paper's greedy prune: at most N per row and column; may keep fewer than N."""
    return _greedy(weight, n, m, keep_mode=False)
