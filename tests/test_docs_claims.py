"""The measured statements of docs/algorithms.md about the two greedy transposable-mask solvers.

Each test recomputes one statement at a small size, so the page cannot drift from the code:
greedy keep's 1/2 bound on the kept mass (tight example), greedy prune's factor-2 bound on the
pruned mass, how often each ends a line short on Gaussian 2:4 tiles, their mean kept fraction, and
the near-uniform tile on which greedy prune keeps only 4 of 8.
"""
from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from sparsity_lab.masks.greedy import solve_greedy_keep, solve_greedy_prune
from sparsity_lab.masks.quality import line_shortfall
from sparsity_lab.masks.tiles import to_tiles

N, M = 2, 4


@lru_cache(maxsize=None)
def at_most_patterns() -> torch.Tensor:
    """All 4x4 0/1 tiles with at most 2 per row and column, as (P, 16) float64."""
    bits = (torch.arange(1 << 16).unsqueeze(1) >> torch.arange(16)) & 1
    tiles = bits.double().view(-1, 4, 4)
    ok = (tiles.sum(1) <= N).all(1) & (tiles.sum(2) <= N).all(1)
    return tiles[ok].reshape(-1, 16)


def kept_and_optimum(weight: torch.Tensor, mask: torch.Tensor, patterns: torch.Tensor):
    """Per tile: kept |w|, the best kept |w| over ``patterns``, and the tile's total |w|."""
    mags = to_tiles(weight.abs().double(), M).reshape(-1, 16)
    kept = (mags * to_tiles(mask, M).reshape(-1, 16).double()).sum(1)
    return kept, (mags @ patterns.T).max(1).values, mags.sum(1)


@pytest.fixture(scope="module")
def gaussian():
    return torch.randn(128, 128, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_keep_half_bound_is_tight_for_1_2():
    w = torch.tensor([[1.0, 1.001], [0.0, 1.0]], dtype=torch.float64)
    kept = float((w.abs() * solve_greedy_keep(w, 1, 2)).sum())
    assert kept == pytest.approx(1.001)  # the optimum keeps the diagonal, 2.0: ratio 1.001 / 2


def test_keep_kept_mass_at_least_half_and_prune_pruned_mass_at_most_twice(gaussian):
    loose = at_most_patterns()
    for solver in (solve_greedy_keep, solve_greedy_prune):
        kept, best_loose, total = kept_and_optimum(gaussian, solver(gaussian, N, M), loose)
        assert (kept <= best_loose + 1e-9).all()  # both keep at most N per line
        if solver is solve_greedy_keep:
            assert (kept >= 0.5 * best_loose - 1e-9).all()
        else:
            least_pruned = total - best_loose  # the smallest pruned mass of any at-most-N mask
            assert ((total - kept) <= 2 * least_pruned + 1e-9).all()


def test_short_lines_and_mean_kept_fraction_on_gaussian_tiles(gaussian):
    # docs: keep ends a line short in about 16 % of tiles and keeps about 0.985 of the optimum;
    # prune ends short in about 98 % and keeps about 0.90
    loose = at_most_patterns()
    keep_mask, prune_mask = solve_greedy_keep(gaussian, N, M), solve_greedy_prune(gaussian, N, M)
    keep_short = line_shortfall(keep_mask, N, M)["short_tile_fraction"]
    prune_short = line_shortfall(prune_mask, N, M)["short_tile_fraction"]
    assert 0.12 < keep_short < 0.20, keep_short
    assert prune_short > 0.95, prune_short
    kept, best, _ = kept_and_optimum(gaussian, keep_mask, loose)
    assert float((kept / best).mean()) == pytest.approx(0.985, abs=0.005)
    kept, best, _ = kept_and_optimum(gaussian, prune_mask, loose)
    assert float((kept / best).mean()) == pytest.approx(0.90, abs=0.01)


def test_prune_can_keep_only_four_of_eight():
    ranks = torch.tensor([[2, 0, 6, 3], [15, 13, 10, 5], [4, 7, 8, 1], [12, 9, 14, 11]], dtype=torch.float64)
    w = 1.0 + 1e-3 * ranks  # a near-uniform tile; the ranks set the visiting order
    prune = solve_greedy_prune(w, N, M)
    assert int(prune.sum()) == 4
    assert prune[0].sum() == 0 and prune[2].sum() == 0  # two whole rows pruned
    assert int(solve_greedy_keep(w, N, M).sum()) >= 7
