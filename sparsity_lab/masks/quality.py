"""Quality figures of N:M masks on Gaussian weights: kept |W| mass, optimality, shortfall.

For a weight W (O, I) and a mask S the kept fraction is ``sum |w| S / sum |w|``. Figures returned:
* every transposable solver's kept fraction, and its kept mass relative to the exact optimum
  (the exact transposable N:M mask, ``solver="auto"``);
* plain row-wise N:M (``nm_mask``), which is the upper bound for every transposable mask: an exact
  transposable mask is row-wise N:M, and the greedy ones keep at most N per row group;
* the cost of transposability: transposable optimum against row-wise (Gaussian 2:4: about 0.70
  against 0.74; docs/algorithms.md, "Transposable N:M masks");
* how often the greedy solvers leave fewer than N in a row or column of a tile, and on how many
  tiles they keep *more* than the exact optimum (possible because they may keep fewer than N
  entries: they solve the "at most N" problem, whose optimum is at least the exact-N one).

Everything is returned as plain dicts (one per solver) for notebooks, the CLI and JSON.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .flow import COST_LEVELS
from .nm import kept_fraction, nm_mask
from .tiles import tile_line_counts, to_tiles
from .transposable import EXACT_SOLVERS, SOLVERS, transposable_mask

ROWWISE = "rowwise"  # the name of the plain row-wise N:M row in the tables


def gaussian_weight(rows: int = 1024, cols: int = 1024, seed: int = 0) -> torch.Tensor:
    """(rows, cols) float32 standard-normal weights from a fixed seed (the figures' input)."""
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def expected_rowwise_kept_fraction(n: int = 2, m: int = 4) -> float:
    """E[kept |w|] / E[|w|] of a row-wise N:M magnitude mask on i.i.d. Gaussian weights.

    An entry of magnitude x is kept when at most N-1 of the M-1 others exceed it; with the
    half-normal F(x) = erf(x / sqrt 2), f = F':
        fraction = int x f(x) sum_{k<N} C(M-1, k) (1-F)^k F^(M-1-k) dx / E|w|,  E|w| = sqrt(2/pi).
    """
    from scipy.integrate import quad
    from scipy.special import erf

    def integrand(x: float) -> float:
        big_f = erf(x / math.sqrt(2.0))
        pdf = math.sqrt(2.0 / math.pi) * math.exp(-x * x / 2.0)
        keep = sum(math.comb(m - 1, k) * (1 - big_f) ** k * big_f ** (m - 1 - k) for k in range(n))
        return x * pdf * keep

    value, _ = quad(integrand, 0.0, math.inf)
    return value / math.sqrt(2.0 / math.pi)


def line_shortfall(mask: torch.Tensor, n: int, m: int) -> dict:
    """How often a mask keeps fewer than N in a row / column of an M x M tile (0 for exact masks)."""
    rows, cols = tile_line_counts(mask, m)
    return {
        "short_row_fraction": float((rows < n).float().mean()),
        "short_col_fraction": float((cols < n).float().mean()),
        "short_tile_fraction": float(((rows < n).any(1) | (cols < n).any(1)).float().mean()),
        "min_line_count": int(torch.minimum(rows.min(), cols.min())),
    }


def _tile_mass(mags: torch.Tensor, mask: torch.Tensor, m: int) -> torch.Tensor:
    return (mags * to_tiles(mask.cpu(), m).reshape(mags.shape).double()).sum(1)


def quality_rows(weight: torch.Tensor, masks: dict[str, torch.Tensor], n: int, m: int,
                 optimum: torch.Tensor | None = None) -> list[dict]:
    """One dict per mask in ``masks`` (solver name -> bool (O, I)), plus a row-wise N:M row.

    optimum: the exact transposable mask to compare against (computed with solver="auto" when
    None). Keys: solver, n, m, exact, transposable, kept_fraction, relative_to_optimum,
    tiles_above_optimum, short_row_fraction, short_col_fraction, short_tile_fraction, min_line_count.
    """
    if optimum is None:
        optimum = transposable_mask(weight, n, m)
    mags = to_tiles(weight.detach().abs().double().cpu(), m).reshape(-1, m * m)
    best = _tile_mass(mags, optimum, m)
    # optimum known up to flow's integer-cost quantisation (N*M levels of the tile maximum)
    tol = n * m / COST_LEVELS * mags.max(1).values + 1e-12
    rows = []
    for name, mask in masks.items():
        mass = _tile_mass(mags, mask, m)
        rows.append({
            "solver": name, "n": n, "m": m, "exact": name in EXACT_SOLVERS, "transposable": True,
            "kept_fraction": kept_fraction(weight, mask),
            "relative_to_optimum": float(mass.sum() / best.sum()),
            "tiles_above_optimum": float((mass > best + tol).float().mean()),
            **line_shortfall(mask, n, m),
        })
    rowwise = nm_mask(weight, n, m, dim=1)
    rows.append({
        "solver": ROWWISE, "n": n, "m": m, "exact": True, "transposable": False,
        "kept_fraction": kept_fraction(weight, rowwise),
        "relative_to_optimum": float(_tile_mass(mags, rowwise, m).sum() / best.sum()),
        # row-wise N:M is not a tile mask: per-tile comparisons and column counts do not apply
        "tiles_above_optimum": None, "short_row_fraction": 0.0, "short_col_fraction": None,
        "short_tile_fraction": None, "min_line_count": None,
    })
    return rows


def solver_quality(weight: torch.Tensor, n: int = 2, m: int = 4,
                   solvers: list[str] | None = None) -> list[dict]:
    """Run each transposable solver (default: all that apply to N:M) on ``weight``; see quality_rows."""
    if solvers is None:
        solvers = applicable_solvers(n, m)
    masks = {s: transposable_mask(weight, n, m, solver=s) for s in solvers}
    return quality_rows(weight, masks, n, m)


def applicable_solvers(n: int, m: int) -> list[str]:
    """Every solver in SOLVERS except 'patterns' where N:M has too many tile patterns."""
    from .patterns import pattern_count_small

    return [s for s in SOLVERS if s != "patterns" or pattern_count_small(n, m)]


def gaussian_solver_quality(n: int = 2, m: int = 4, size: int = 512, seed: int = 0,
                            solvers: list[str] | None = None) -> list[dict]:
    """solver_quality on a (size, size) Gaussian weight from ``seed``."""
    return solver_quality(gaussian_weight(size, size, seed), n, m, solvers)


def transposability_cost(rows: list[dict]) -> dict:
    """Kept fraction of the exact transposable mask against plain row-wise N:M, from quality rows."""
    by_name = {r["solver"]: r for r in rows}
    exact = next((by_name[s] for s in EXACT_SOLVERS if s in by_name), None)
    if exact is None or ROWWISE not in by_name:
        raise ValueError(f"rows need an exact solver (one of {EXACT_SOLVERS}) and the {ROWWISE!r} row")
    t, r = exact["kept_fraction"], by_name[ROWWISE]["kept_fraction"]
    return {"n": exact["n"], "m": exact["m"], "transposable_kept": t, "rowwise_kept": r,
            "ratio": t / r, "mass_lost": r - t}


def exact_agreement(rows: list[dict]) -> float:
    """Largest difference in kept fraction between the exact solvers in ``rows`` (0 if < 2)."""
    kept = np.array([r["kept_fraction"] for r in rows if r["exact"] and r["transposable"]])
    return float(kept.max() - kept.min()) if kept.size > 1 else 0.0
