"""The functions notebook 02 (transposable masks) calls: the tile solvers' view, the tile editor
widget, the solver race, the mask diversity rows and the recorded benchmark reader."""
import itertools
from math import comb

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("plotly", reason="plotly is in the test extra; this file needs it")
pytest.importorskip("ipywidgets", reason="ipywidgets is in the test extra; this file needs it")

from sparsity_lab.course.live import time_solvers  # noqa: E402
from sparsity_lab.masks import is_transposable  # noqa: E402
from sparsity_lab.masks.quality import ROWWISE, gaussian_weight  # noqa: E402
from sparsity_lab.provenance import read_result  # noqa: E402
from sparsity_lab.course.viz.tile_solver_view import (  # noqa: E402
    PRESETS, TILE_SOLVERS, diversity_figure, diversity_rows, recorded_case_rows, solver_bars, tile_editor,
    at_most_n_gain, at_most_n_patterns, patterns_figure, tile_figure, tile_solutions,
)

REPO_TILE = [[10, 0, 0, 0], [0, .1, 5, 5], [0, 5, .1, 5], [0, 5, 5, .1]]


def _masks_with_line_sums(at_most: bool) -> torch.Tensor:
    """Every 4x4 0/1 matrix with exactly (or at most) 2 ones per row and column, by brute force."""
    bits = torch.tensor(list(itertools.product([0, 1], repeat=16)), dtype=torch.float64).reshape(-1, 4, 4)
    rows, cols = bits.sum(2), bits.sum(1)
    ok = ((rows <= 2) & (cols <= 2)) if at_most else ((rows == 2) & (cols == 2))
    return bits[ok.all(1)].reshape(-1, 16)


EXACT_N = _masks_with_line_sums(at_most=False)
AT_MOST_N = _masks_with_line_sums(at_most=True)


def test_brute_force_counts():
    assert EXACT_N.shape[0] == 90


tiles = st.lists(st.floats(-100, 100, allow_nan=False, width=32), min_size=16, max_size=16)


@settings(max_examples=40, deadline=None)
@given(tiles)
def test_tile_solutions_against_brute_force(values):
    tile = torch.tensor(values, dtype=torch.float64).reshape(4, 4)
    mags = tile.abs().reshape(16)
    exact_best = float((EXACT_N @ mags).max())
    at_most_best = float((AT_MOST_N @ mags).max())
    sols = {s["solver"]: s for s in tile_solutions(tile)}
    assert list(sols) == list(TILE_SOLVERS)
    for name, s in sols.items():
        mask = torch.tensor(s["mask"])
        assert is_transposable(mask, 2, 4, exact=name in ("patterns", "flow"))
        assert s["kept"] == pytest.approx(float((tile.abs() * mask).sum()))
        assert s["row_counts"] == mask.sum(1).tolist() and s["col_counts"] == mask.sum(0).tolist()
        assert s["exactly_n"] == (s["row_counts"] == [2] * 4 and s["col_counts"] == [2] * 4)
        assert s["kept"] <= at_most_best + 1e-9
    for name in ("patterns", "flow"):  # exact: the best of the 90 (flow up to its cost quantisation)
        assert sols[name]["kept"] == pytest.approx(exact_best, rel=1e-6, abs=1e-9)
    # greedy keep's guarantee: at least half of the at-most-N optimum (which it may exceed exact-N by)
    assert sols["greedy"]["kept"] >= 0.5 * at_most_best - 1e-9


def test_the_presets_show_what_their_names_say():
    sols = {s["solver"]: s for s in tile_solutions(REPO_TILE)}
    assert PRESETS["greedy keeps more than exact (at most N)"] == REPO_TILE
    assert sols["patterns"]["kept"] == pytest.approx(35) == sols["flow"]["kept"]
    assert sols["greedy"]["kept"] == pytest.approx(40) and not sols["greedy"]["exactly_n"]
    assert sols["greedy"]["row_counts"] == [1, 2, 2, 2] == sols["greedy"]["col_counts"]
    short = {s["solver"]: s["kept"] for s in tile_solutions(PRESETS["greedy falls short"])}
    assert short["patterns"] == pytest.approx(54) and short["greedy"] == pytest.approx(40)
    prune = {s["solver"]: s["kept"] for s in tile_solutions(PRESETS["greedy prune falls short"])}
    assert prune["patterns"] == pytest.approx(61) and prune["greedy_prune"] == pytest.approx(34)
    assert all(s["fraction"] is None for s in tile_solutions(torch.zeros(4, 4)))


@pytest.mark.parametrize("bad, err", [([[1, 2], [3, 4]], ValueError), (torch.full((4, 4), float("nan")), ValueError)])
def test_tile_functions_reject_bad_tiles(bad, err):
    with pytest.raises(err, match="tile"):
        tile_solutions(bad)


def _kept_in_panel(fig, k):
    return torch.tensor([[v is None for v in row] for row in fig.data[2 * k + 1].z])


def test_tile_figure_draws_each_solvers_mask():
    fig = tile_figure(REPO_TILE)
    for k, s in enumerate(tile_solutions(REPO_TILE)):
        assert torch.equal(_kept_in_panel(fig, k), torch.tensor(s["mask"]))
        assert f"kept {s['kept']:.4g}" in fig.layout.annotations[k].text
    assert "at most 2" in fig.layout.annotations[2].text and "exactly 2" in fig.layout.annotations[0].text
    # every panel's axes tick the tile's own indices 0-3 and stop at the tile (no axis running to 4)
    for axis in (fig.layout.xaxis, fig.layout.xaxis4, fig.layout.yaxis, fig.layout.yaxis3):
        assert list(axis.tickvals) == [0, 1, 2, 3]
    assert fig.layout.xaxis.constrain == "domain"


def test_tile_editor_re_solves_on_every_edit_and_preset():
    box = tile_editor()
    preset_box, grid, fig, table = box.children
    assert "<td>40</td><td>1.143</td>" in table.value  # greedy: 40 against the exact 35
    assert "7343 masks): <b>40</b>" in table.value  # ... and 40 is the at-most-2 optimum
    grid.children[0].value = 1.0  # shrink the 10: the at-most-N advantage disappears
    tile = [row[:] for row in REPO_TILE]
    tile[0][0] = 1.0
    for k, s in enumerate(tile_solutions(tile)):
        assert torch.equal(_kept_in_panel(fig, k), torch.tensor(s["mask"]))
        assert fig.layout.annotations[k].text == tile_figure(tile).layout.annotations[k].text
    assert fig.data[0].z[0][0] == 1.0 and "<td>40</td>" not in table.value
    preset_box.value = "greedy falls short"
    assert [b.value for b in grid.children] == [float(v) for row in PRESETS["greedy falls short"] for v in row]
    for k, s in enumerate(tile_solutions(PRESETS["greedy falls short"])):
        assert torch.equal(_kept_in_panel(fig, k), torch.tensor(s["mask"]))
    assert "<td>40</td><td>0.741</td>" in table.value
    with pytest.raises(ValueError, match="preset"):
        tile_editor("no such preset")


def test_time_solvers_rows_and_bars():
    w = gaussian_weight(32, 32, seed=0)
    rows = time_solvers(w, repeats=2)
    assert [r["solver"] for r in rows] == ["patterns", "flow", "lp", "greedy", "greedy_prune", ROWWISE]
    exact = [r["kept_fraction"] for r in rows if r["exact"] and r["transposable"]]
    assert max(exact) - min(exact) < 1e-6
    assert all(r["median_s"] > 0 and 1 <= r["runs"] <= 2 for r in rows)
    assert rows[-1]["kept_fraction"] >= max(exact)  # row-wise is the upper bound of transposable
    fig = solver_bars(rows)
    assert list(fig.data[0].y) == [r["kept_fraction"] for r in rows]
    assert list(fig.data[1].y) == [r["median_s"] for r in rows]
    assert [r["solver"] for r in time_solvers(w, 4, 8, repeats=1)][0] == "flow"  # no pattern search for 4:8
    with pytest.raises(ValueError, match="divisible"):
        time_solvers(torch.randn(6, 8))


def test_diversity_rows_are_the_five_exact_counts():
    rows = diversity_rows()
    assert [r["count"] for r in rows] == [comb(64, 32), comb(8, 4) ** 8, comb(4, 2) ** 16, 116_963_796_250, 90 ** 4]
    assert list(diversity_figure(rows).data[0].y) == [float(r["count"]) for r in rows]


def test_recorded_case_rows_reads_the_benchmark():
    data = read_result("mask_solvers_cpu")
    rows = recorded_case_rows(data, 2, 4)
    assert {r["solver"] for r in rows} >= {"patterns", "flow", "greedy", ROWWISE}
    assert all(r["n"] == 2 and r["m"] == 4 for r in rows)
    with pytest.raises(ValueError, match="no recorded rows for 3:7"):
        recorded_case_rows(data, 3, 7)


def test_at_most_n_patterns_count_by_an_independent_construction():
    lines = [c for k in range(3) for c in itertools.combinations(range(4), k)]  # rows with 0, 1 or 2 ones
    count = sum(1 for rows in itertools.product(lines, repeat=4)
                if all(sum(j in r for r in rows) <= 2 for j in range(4)))
    assert at_most_n_patterns().shape == (count, 16) == (7343, 16)


def test_at_most_n_gain_on_known_tiles_and_gaussian():
    w = torch.cat([torch.tensor(REPO_TILE), torch.ones(4, 4)], dim=1)  # (4, 8): two tiles
    gain = at_most_n_gain(w)
    assert gain["tiles"] == 2 and gain["tiles_better"] == 0.5
    assert gain["mass_ratio"] == pytest.approx((40 + 8) / (35 + 8))
    g = gaussian_weight(64, 64, seed=0)
    gain = at_most_n_gain(g)
    assert gain["mass_ratio"] >= 1.0 and 0.0 <= gain["tiles_better"] < 0.2
    with pytest.raises(ValueError, match="divisible"):
        at_most_n_gain(torch.randn(6, 8))


def test_patterns_figure_draws_all_90():
    z = patterns_figure().data[0].z
    cells = [v for row in z for v in row if v is not None]
    assert len(cells) == 90 * 16 and sum(cells) == 90 * 8


def test_tile_editor_solves_a_preset_once_not_once_per_box(monkeypatch):
    import sparsity_lab.course.viz.tile_solver_view as view

    box = tile_editor()
    calls = []
    real = view.tile_solutions
    monkeypatch.setattr(view, "tile_solutions", lambda *a, **k: calls.append(1) or real(*a, **k))
    box.children[0].value = "Gaussian (seed 0)"  # writes all 16 boxes
    assert len(calls) == 2  # one re-solve: the figure's titles and the table
    assert box.children[2].data[0].z[0][0] == abs(PRESETS["Gaussian (seed 0)"][0][0])
