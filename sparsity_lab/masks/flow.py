"""Exact transposable N:M masks for any N:M: min-cost flow (OR-Tools) or linear programming (HiGHS).

Per M x M tile the mask is a maximum-weight b-matching between rows and columns:
    row node i  --(capacity 1, cost -|w_ij|)-->  column node j,
every row node supplies N units and every column node absorbs N (the source -> row (cap N) and
column -> sink (cap N) arcs of the textbook network are folded into node supplies).
Pushing N*M units at minimum cost keeps N per row and per column with the largest kept |w|.
All tiles go into one graph with disjoint components, built with numpy (no Python loop over tiles).

The LP relaxation of this network is integral (totally unimodular constraints), so a simplex
solver returns a 0/1 vertex: ``solve_lp`` is exact as well and uses the real-valued costs.

Resolution (what "exact" means here). Both solvers see each tile divided by its largest |w|:
the flow solver rounds those ratios to multiples of 1/COST_LEVELS (integer costs), HiGHS
decides with absolute tolerances of about 1e-7. So each tile's kept mass is the optimum up to
``N * M / COST_LEVELS`` (flow) or about ``1e-6`` (LP) times the tile's largest |w|: entries
smaller than that are ties, chosen arbitrarily. A tile whose entries span more than ~1e8 (one
outlier 1e8 times the rest) therefore gets its outlier right and the rest arbitrary. The
pattern search (2:4, 1:4, 2:5) resolves down to float rounding of the scores (2^-24 of the
tile max in float32); ``tests/test_properties_masks.py`` checks these bounds against brute force.
Without the per-tile scaling HiGHS compared raw magnitudes with its absolute tolerances:
weights of 1e-9 kept 0.76 of the optimal mass and 1e25 failed outright.
NaN/Inf rank as the largest magnitude (``tiles.finite_magnitudes``).
"""
from __future__ import annotations

import numpy as np
import torch

from .tiles import finite_magnitudes, from_tiles, to_tiles

# OR-Tools needs integer costs and scales them by (nodes + 1) internally: keep
# max_cost * nodes well inside int64. Costs are quantised per tile to this many levels.
COST_LEVELS = 10**8
_TILES_PER_GRAPH = 1 << 14
# HiGHS slows down super-linearly with LP size: small LPs of about this many variables each
# were fastest on a 2-core CPU (512x512 2:4, docs/measuring.md).
_LP_VARS_PER_CHUNK = 4096
# A simplex vertex of this LP is 0/1; anything further than this from 0 or 1 is a solver failure.
_LP_INTEGRALITY_TOL = 1e-6


def _tile_magnitudes(weight: torch.Tensor, m: int) -> np.ndarray:
    """(T, M*M) float64 |w| per tile, finite (NaN/Inf -> the float64 max)."""
    return to_tiles(finite_magnitudes(weight.detach().to(torch.float64)).cpu(), m).reshape(-1, m * m).numpy()


def scaled_to_tile_max(mags: np.ndarray) -> np.ndarray:
    """(T, K) magnitudes divided by each tile's max (all-zero tiles stay zero): values in [0, 1]."""
    top = mags.max(axis=1, keepdims=True)
    top[top == 0] = 1.0
    return mags / top


def integer_costs(mags: np.ndarray) -> np.ndarray:
    """(T, M*M) magnitudes -> int64 costs in [0, COST_LEVELS]: lower cost = larger |w|.

    Quantised per tile, so the kept mass is optimal up to N*M / COST_LEVELS of the tile's max |w|.
    """
    return np.rint((1.0 - scaled_to_tile_max(mags)) * COST_LEVELS).astype(np.int64)


def _arc_layout(tiles: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Tail (row node) and head (column node) of every arc, tile-major then row-major."""
    base = (np.arange(tiles, dtype=np.int64) * 2 * m)[:, None, None]
    i = np.arange(m, dtype=np.int64)[None, :, None]
    j = np.arange(m, dtype=np.int64)[None, None, :]
    tails = np.broadcast_to(base + i, (tiles, m, m)).reshape(-1)
    heads = np.broadcast_to(base + m + j, (tiles, m, m)).reshape(-1)
    return tails, heads


def _flow_chunk(costs: np.ndarray, n: int, m: int) -> np.ndarray:
    from ortools.graph.python import min_cost_flow

    tiles = costs.shape[0]
    tails, heads = _arc_layout(tiles, m)
    smcf = min_cost_flow.SimpleMinCostFlow()
    arcs = smcf.add_arcs_with_capacity_and_unit_cost(
        tails, heads, np.ones(tails.size, dtype=np.int64), costs.reshape(-1)
    )
    nodes = np.arange(tiles * 2 * m, dtype=np.int64)
    supplies = np.tile(np.r_[np.full(m, n), np.full(m, -n)], tiles).astype(np.int64)
    smcf.set_nodes_supplies(nodes, supplies)
    status = smcf.solve()
    if status != smcf.OPTIMAL:
        raise RuntimeError(f"min-cost flow did not reach an optimum (OR-Tools status {status})")
    return smcf.flows(arcs).reshape(tiles, m * m) > 0


def solve_flow(weight: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Exact transposable N:M mask of a 2-D weight by min-cost flow. Returns bool (O, I)."""
    try:
        import ortools  # noqa: F401
    except ImportError as err:  # pragma: no cover - ortools is a core dependency
        raise ImportError("solver='flow' needs OR-Tools: pip install ortools") from err
    costs = integer_costs(_tile_magnitudes(weight, m))
    keep = np.concatenate([
        _flow_chunk(costs[s:s + _TILES_PER_GRAPH], n, m)
        for s in range(0, costs.shape[0], _TILES_PER_GRAPH)
    ])
    tiles = torch.from_numpy(keep).reshape(-1, m, m)
    return from_tiles(tiles, tuple(weight.shape)).to(weight.device)


def solve_lp(weight: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Exact transposable N:M mask by the LP relaxation (HiGHS dual simplex, real costs).

    maximise sum |w_ij| x_ij  s.t.  sum_j x_ij = N,  sum_i x_ij = N,  0 <= x_ij <= 1, per tile,
    with each tile's |w| divided by its max first (HiGHS's tolerances are absolute: see the
    module docstring for the resolution this gives).
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    mags = scaled_to_tile_max(_tile_magnitudes(weight, m))
    tiles = mags.shape[0]
    keep = np.empty((tiles, m * m), dtype=bool)
    per_chunk = max(1, _LP_VARS_PER_CHUNK // (m * m))
    for s in range(0, tiles, per_chunk):
        chunk = mags[s:s + per_chunk]
        t = chunk.shape[0]
        var = np.arange(t * m * m).reshape(t, m, m)
        # constraint rows: for each tile, M row-sums then M column-sums
        row_ids = (np.arange(t)[:, None, None] * 2 * m + np.arange(m)[None, :, None]).repeat(m, 2)
        col_ids = (np.arange(t)[:, None, None] * 2 * m + m + np.arange(m)[None, None, :]).repeat(m, 1)
        a_eq = coo_matrix(
            (np.ones(2 * var.size), (np.r_[row_ids.ravel(), col_ids.ravel()], np.r_[var.ravel(), var.ravel()])),
            shape=(t * 2 * m, var.size),
        ).tocsr()
        res = linprog(-chunk.ravel(), A_eq=a_eq, b_eq=np.full(t * 2 * m, float(n)),
                      bounds=(0, 1), method="highs-ds")
        if res.status != 0:
            raise RuntimeError(f"solver='lp' failed on tiles {s}..{s + t - 1} (HiGHS: {res.message}); "
                               "solver='flow' solves the same problem by min-cost flow")
        off = float(np.abs(res.x - np.rint(res.x)).max())
        if off > _LP_INTEGRALITY_TOL:  # never round a fractional LP answer silently
            raise RuntimeError(f"LP solver returned a fractional solution (max distance to 0/1: {off:.3g})")
        keep[s:s + t] = res.x.reshape(t, m * m) > 0.5
    tiles_t = torch.from_numpy(keep).reshape(-1, m, m)
    return from_tiles(tiles_t, tuple(weight.shape)).to(weight.device)
