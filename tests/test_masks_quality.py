"""Quality figures of the mask solvers (masks.quality) on small Gaussian weights.

Invariants are asserted exactly; figures from docs/algorithms.md ("Transposable N:M masks":
transposable 2:4 about 0.70 of |W|, row-wise 2:4 about 0.74; "Approximate solver: greedy keep": greedy
about 0.985 of the optimum) get ranges a few standard errors wide
at these sizes (measured: 0.700-0.702, 0.743-0.745, 0.984-0.986 at 128-256 square, seeds 0-2).
"""
import json
import math

import pytest
import torch

from sparsity_lab.masks import nm_mask, transposable_mask
from sparsity_lab.masks.quality import (
    ROWWISE, applicable_solvers, exact_agreement, expected_rowwise_kept_fraction, gaussian_solver_quality,
    gaussian_weight, line_shortfall, quality_rows, solver_quality, transposability_cost,
)


@pytest.fixture(scope="module")
def rows_24():
    return gaussian_solver_quality(2, 4, size=192, seed=0)


@pytest.fixture(scope="module")
def rows_48():
    return gaussian_solver_quality(4, 8, size=96, seed=0)


def by_solver(rows):
    return {r["solver"]: r for r in rows}


def test_rows_cover_every_solver_and_are_plain_data(rows_24, rows_48):
    assert [r["solver"] for r in rows_24] == ["patterns", "flow", "lp", "greedy", "greedy_prune", ROWWISE]
    assert [r["solver"] for r in rows_48] == ["flow", "lp", "greedy", "greedy_prune", ROWWISE]
    json.dumps(rows_24)  # plain numbers and strings only


@pytest.mark.parametrize("fixture", ["rows_24", "rows_48"])
def test_invariants(fixture, request):
    rows = request.getfixturevalue(fixture)
    s = by_solver(rows)
    exact = [r for r in rows if r["exact"] and r["transposable"]]
    # every exact solver keeps the same mass (flow up to its 1e-8 cost quantisation)
    assert exact_agreement(rows) < 1e-7
    for r in exact:
        assert r["relative_to_optimum"] == pytest.approx(1.0, abs=1e-7)
        assert r["short_row_fraction"] == r["short_col_fraction"] == 0.0
        assert r["tiles_above_optimum"] == 0.0
    # every transposable mask is at most N per row group: row-wise N:M keeps at least as much
    for r in rows:
        assert r["kept_fraction"] <= s[ROWWISE]["kept_fraction"] + 1e-12
    # kept fractions are fractions; keeping the N largest of M keeps at least N/M of the mass
    n, m = rows[0]["n"], rows[0]["m"]
    assert n / m <= s[ROWWISE]["kept_fraction"] <= 1.0


def test_greedy_against_exact_on_gaussian(rows_24, rows_48):
    for rows in (rows_24, rows_48):
        s = by_solver(rows)
        # not an invariant (greedy solves "at most N" and can beat the exact optimum on a tile),
        # but on Gaussian weights the total stays below it, well above the 1/2 guarantee
        assert 0.97 < s["greedy"]["relative_to_optimum"] < 1.0
        assert 0.5 < s["greedy_prune"]["relative_to_optimum"] < s["greedy"]["relative_to_optimum"]
    greedy = by_solver(rows_24)["greedy"]["relative_to_optimum"]
    assert greedy == pytest.approx(0.984, abs=0.006)  # docs/algorithms.md (greedy keep): about 0.985


def test_figures_from_the_spec_2_4(rows_24):
    s = by_solver(rows_24)
    assert s["patterns"]["kept_fraction"] == pytest.approx(0.70, abs=0.01)
    assert s[ROWWISE]["kept_fraction"] == pytest.approx(0.74, abs=0.01)
    cost = transposability_cost(rows_24)
    assert cost["transposable_kept"] == s["patterns"]["kept_fraction"]
    assert cost["rowwise_kept"] == s[ROWWISE]["kept_fraction"]
    assert 0.93 < cost["ratio"] < 0.96 and cost["mass_lost"] == pytest.approx(0.04, abs=0.01)


def test_rowwise_matches_the_gaussian_expectation(rows_24, rows_48):
    # independent check of nm_mask + kept_fraction: the order-statistics integral
    assert by_solver(rows_24)[ROWWISE]["kept_fraction"] == pytest.approx(expected_rowwise_kept_fraction(2, 4), abs=0.005)
    assert by_solver(rows_48)[ROWWISE]["kept_fraction"] == pytest.approx(expected_rowwise_kept_fraction(4, 8), abs=0.005)


def test_expected_rowwise_closed_forms():
    assert expected_rowwise_kept_fraction(3, 3) == pytest.approx(1.0)
    # max of two |N(0,1)| has mean 2/sqrt(pi); E|N(0,1)| = sqrt(2/pi): fraction 1/sqrt(2)
    assert expected_rowwise_kept_fraction(1, 2) == pytest.approx(1 / math.sqrt(2), rel=1e-9)
    assert expected_rowwise_kept_fraction(2, 4) == pytest.approx(0.7445, abs=5e-4)


def test_shortfall_figures(rows_24):
    s = by_solver(rows_24)
    # measured on Gaussian 2:4: greedy about 4 % of rows short (never empty), prune-greedy about 43 %
    assert 0.01 < s["greedy"]["short_row_fraction"] < 0.08
    assert s["greedy"]["min_line_count"] == 1
    assert 0.3 < s["greedy_prune"]["short_row_fraction"] < 0.6
    assert s["greedy_prune"]["min_line_count"] == 0
    # greedy keeps more than the exact optimum on some tiles (it keeps fewer entries there)
    assert s["greedy"]["tiles_above_optimum"] > 0.0


def test_line_shortfall_by_hand():
    mask = torch.zeros(4, 8, dtype=torch.bool)
    mask[:, :4] = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1], [1, 0, 0, 1]], dtype=torch.bool)
    mask[:, 4:] = torch.tensor([[1, 0, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1], [0, 0, 0, 1]], dtype=torch.bool)
    out = line_shortfall(mask, 2, 4)
    assert out["short_row_fraction"] == pytest.approx(2 / 8)  # rows 0 and 3 of tile 1
    assert out["short_col_fraction"] == pytest.approx(2 / 8)  # columns 0 and 1 of tile 1
    assert out["short_tile_fraction"] == pytest.approx(0.5)
    assert out["min_line_count"] == 1


def test_quality_rows_with_given_masks_and_optimum():
    w = gaussian_weight(32, 32, seed=3)
    opt = transposable_mask(w, 2, 4, solver="lp")
    rows = quality_rows(w, {"rowwise_as_mask": nm_mask(w), "lp": opt}, 2, 4, optimum=opt)
    s = by_solver(rows)
    assert s["lp"]["relative_to_optimum"] == 1.0
    # a row-wise mask passed as if it were a tile mask: more mass, but columns short of N
    assert s["rowwise_as_mask"]["relative_to_optimum"] > 1.0
    assert s["rowwise_as_mask"]["short_row_fraction"] == 0.0
    assert s["rowwise_as_mask"]["short_col_fraction"] > 0.0
    assert s["rowwise_as_mask"]["kept_fraction"] == s[ROWWISE]["kept_fraction"]
    assert solver_quality(w, 2, 4, ["patterns"])[0]["kept_fraction"] == pytest.approx(s["lp"]["kept_fraction"])


def test_applicable_solvers_and_errors():
    assert "patterns" in applicable_solvers(2, 4) and "patterns" not in applicable_solvers(4, 8)
    with pytest.raises(ValueError, match="rows need an exact solver"):
        transposability_cost([{"solver": "greedy", "kept_fraction": 0.6, "exact": False}])
