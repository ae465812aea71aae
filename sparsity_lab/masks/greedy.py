"""Approximate transposable N:M masks: greedy keep (Hubara et al. 2021) and a greedy prune variant.

Both visit the M*M entries of every tile in magnitude order, vectorised across tiles (the only
Python loop is over the M*M positions). Ties are visited lowest index first (stable sort).

* greedy keep: descending |w|; keep an entry while its row and its column both have room. This
  is the fast approximation of Hubara et al. 2021 (https://arxiv.org/abs/2102.08124), as the
  authors' code does it (``update_mask_approx2`` in
  https://github.com/papers-submission/structured_transposable_masks, dynamic_TNM/src/sparse_ops.py).
  It keeps at least 1/2 of the optimal mass: the masks with at most N per row and per column are
  the common independent sets of two partition matroids, and greedy on the intersection of k
  matroids keeps at least 1/k of the optimum (Fisher, Nemhauser, Wolsey 1978). The bound is tight
  (1:2 on [[1, 1.001], [0, 1]]: greedy keeps 1.001, the optimum 2). It can get stuck short: a row
  and a column each with room whose shared entry is already kept, every other column of that row
  full. For 2:4 a line ends at most one short; for larger N it can end further short.
* greedy prune: ascending |w|; prune an entry while its row or its column still holds more than
  N. A variant of ours, kept for comparison; we know no approximation bound for it (the worst
  tile we found keeps about 0.54 of the optimum) and it often strips a line below N, even to 0.

Because both may keep fewer than N, their kept mass is bounded by the optimum of the *at most N*
problem, not of the exact-N one: on some tiles they keep more than the exact optimum, e.g. 2:4 on
[[10,0,0,0],[0,.1,5,5],[0,5,.1,5],[0,5,5,.1]] greedy keeps 40 (one entry in row 0), exact 35.
"""
from __future__ import annotations

import torch

from .tiles import from_tiles, to_tiles


def _greedy(weight: torch.Tensor, n: int, m: int, keep_mode: bool) -> torch.Tensor:
    # float64 stays float64: rounding it to float32 would merge distinct magnitudes into ties
    # (e.g. 6e-194 -> 0) and change the visiting order; fp16/bf16 -> fp32 is exact
    mags = weight.detach().abs()
    mags = to_tiles(mags if mags.dtype == torch.float64 else mags.float(), m).reshape(-1, m * m)
    t = mags.shape[0]
    order = torch.sort(mags, dim=1, descending=keep_mode, stable=True).indices  # (T, M*M)
    # flat indices (one 1-D gather/scatter per step: faster than 2-D indexing on a CPU):
    # visit k of tile b touches row counter b*M + r, column counter b*M + c, mask entry b*M*M + p
    base = torch.arange(t, device=weight.device).unsqueeze(1) * m
    row_at = (order // m + base).T.contiguous()  # (M*M, T)
    col_at = (order % m + base).T.contiguous()
    pos_at = (order + base * m).T.contiguous()
    keep = torch.full((t * m * m,), not keep_mode, dtype=torch.bool, device=weight.device)
    row_n = torch.full((t * m,), 0 if keep_mode else m, dtype=torch.int32, device=weight.device)
    col_n = torch.full_like(row_n, 0 if keep_mode else m)
    for k in range(m * m):
        r, c = row_at[k], col_at[k]
        rn, cn = row_n[r], col_n[c]
        if keep_mode:
            act = (rn < n) & (cn < n)  # both lines have room: keep
            keep[pos_at[k]] = act
            step = act.to(torch.int32)
        else:
            act = (rn > n) | (cn > n)  # either line still over N: prune
            keep[pos_at[k]] = ~act
            step = -act.to(torch.int32)
        # r (and c) are distinct across tiles within one step, so plain indexed += is safe
        row_n[r] += step
        col_n[c] += step
    return from_tiles(keep.reshape(-1, m, m), tuple(weight.shape))


def solve_greedy_keep(weight: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Greedy keep (Hubara et al. 2021's fast approximation): at most N per row and column of each
    tile; >= 1/2 of the optimal mass (module docstring)."""
    return _greedy(weight, n, m, keep_mode=True)


def solve_greedy_prune(weight: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Greedy prune (our variant, for comparison): at most N per row and column; may keep fewer
    than N, down to 0 in a line; no approximation bound is claimed."""
    return _greedy(weight, n, m, keep_mode=False)
