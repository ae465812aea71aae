"""The functions notebook 01 (why 2:4) calls: the unstructured mask, the kept-magnitude figures and
the mask explorer widget."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("plotly", reason="plotly is in the test extra; this file needs it")
pytest.importorskip("ipywidgets", reason="ipywidgets is in the test extra; this file needs it")

from sparsity_lab.masks import is_nm, is_transposable, kept_fraction, nm_mask, transposable_mask  # noqa: E402
from sparsity_lab.masks.quality import gaussian_weight  # noqa: E402
from sparsity_lab.course.viz.mask_view import (  # noqa: E402
    NM_CHOICES, SOLVER_KEYS, compute_mask, expected_unstructured_kept_fraction, kept_magnitude_figure,
    kept_magnitude_rows, mask_explorer, mask_heatmap, pruned_layer, unstructured_mask,
)


def reference_unstructured(weight, density):
    """Plain reference: rank every entry by (-|w|, flat index) in Python and keep the first k."""
    flat = weight.abs().reshape(-1).tolist()
    k = round(density * len(flat))
    keep = sorted(range(len(flat)), key=lambda i: (-flat[i], i))[:k]
    mask = torch.zeros(len(flat), dtype=torch.bool)
    mask[keep] = True
    return mask.reshape(weight.shape)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.integers(1, 13), st.sampled_from([0.25, 0.5, 0.75, 1.0, 0.3]),
       st.integers(0, 2**31 - 1), st.booleans())
def test_unstructured_mask_matches_the_reference(rows, cols, density, seed, ties):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g)
    if ties:  # few distinct magnitudes: the tie rule decides
        w = torch.randint(-2, 3, (rows, cols), generator=g).float()
    mask = unstructured_mask(w, density)
    assert torch.equal(mask, reference_unstructured(w, density))
    assert int(mask.sum()) == round(density * w.numel())
    if mask.any() and (~mask).any():  # every kept |w| is at least every pruned |w|
        assert float(w.abs()[mask].min()) >= float(w.abs()[~mask].max())


@pytest.mark.parametrize("bad", [0.0, 1.5, -0.1, "half", True])
def test_unstructured_mask_rejects_bad_density(bad):
    with pytest.raises(ValueError, match="density"):
        unstructured_mask(torch.randn(4, 4), bad)
    with pytest.raises(ValueError, match="density"):
        expected_unstructured_kept_fraction(bad)


def test_expected_unstructured_fraction_matches_sampling():
    w = torch.randn(1_000_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for density in (0.25, 0.5, 0.75):
        sampled = kept_fraction(w, unstructured_mask(w, density))
        assert sampled == pytest.approx(expected_unstructured_kept_fraction(density), abs=2e-3)
    assert expected_unstructured_kept_fraction(1.0) == pytest.approx(1.0)
    assert expected_unstructured_kept_fraction(0.5) == pytest.approx(math.exp(-0.674489750196 ** 2 / 2), rel=1e-9)


@pytest.mark.parametrize("n, m", NM_CHOICES)
def test_compute_mask_gives_each_solver_its_structure(n, m):
    w = gaussian_weight(16, 24, seed=3)
    masks = {s: compute_mask(w, n, m, s) for s in SOLVER_KEYS}
    assert torch.equal(masks["rowwise"], nm_mask(w, n, m, dim=1)) and is_nm(masks["rowwise"], n, m, dim=1)
    assert torch.equal(masks["auto"], transposable_mask(w, n, m))
    for s in ("auto", "flow"):
        assert is_transposable(masks[s], n, m)
    assert is_transposable(masks["greedy"], n, m, exact=False)
    assert int(masks["unstructured"].sum()) == w.numel() * n // m
    # exact solvers agree on the kept mass; unstructured >= row-wise >= transposable
    assert kept_fraction(w, masks["flow"]) == pytest.approx(kept_fraction(w, masks["auto"]), abs=1e-6)
    kept = {s: kept_fraction(w, mk) for s, mk in masks.items()}
    assert kept["unstructured"] >= kept["rowwise"] >= kept["auto"] - 1e-12


def test_compute_mask_rejects_unknown_solver():
    with pytest.raises(ValueError, match="solver must be one of"):
        compute_mask(torch.randn(4, 4), 2, 4, "magic")


def test_kept_magnitude_rows_follow_the_gaussian_figures():
    rows = kept_magnitude_rows(gaussian_weight(256, 256, seed=0))
    assert [(r["n"], r["m"]) for r in rows] == list(NM_CHOICES)
    for r in rows:
        assert r["unstructured"] >= r["rowwise"] >= r["transposable"]
        assert r["unstructured"] == pytest.approx(r["expected_unstructured"], abs=0.01)
        assert r["rowwise"] == pytest.approx(r["expected_rowwise"], abs=0.01)
    two_four = rows[1]
    assert two_four["exact_solver"] == "patterns" and rows[2]["exact_solver"] == "flow"
    # docs/algorithms.md, "Transposable N:M masks": transposable 2:4 about 0.70, row-wise about 0.74
    assert 0.69 < two_four["transposable"] < 0.71 and 0.735 < two_four["rowwise"] < 0.755
    fig = kept_magnitude_figure(rows)
    assert [list(t.y) for t in fig.data] == [[r[k] for r in rows] for k in ("unstructured", "rowwise", "transposable")]


def test_mask_heatmap_greys_out_exactly_the_pruned_entries():
    w = gaussian_weight(8, 8, seed=1)
    mask = nm_mask(w, 2, 4)
    fig = mask_heatmap(w, mask, 4, tiles=True)
    z = fig.data[1].z
    assert all((z[i][j] is None) == bool(mask[i, j]) for i in range(8) for j in range(8))
    assert [list(r) for r in fig.data[0].z] == w.tolist()
    assert len(fig.layout.shapes) == 2  # one column boundary, one row boundary
    assert len(mask_heatmap(w, mask, 4, tiles=False).layout.shapes) == 1
    assert pruned_layer(torch.tensor([[True, False]])) == [[None, 1]]
    # square cells, and the axes end at the matrix: no empty range of columns -5..20 beside a 16-wide one
    assert fig.layout.yaxis.scaleanchor == "x"
    assert fig.layout.xaxis.constrain == fig.layout.yaxis.constrain == "domain"


def _greyed(fig):
    return torch.tensor([[v is not None for v in row] for row in fig.data[1].z])


def test_mask_explorer_follows_its_controls():
    box = mask_explorer(size=16, n=2, m=4, solver="rowwise", seed=0)
    (nm_box, solver_box, seed_box), fig, summary = box.children[0].children, box.children[1], box.children[2]
    w0 = gaussian_weight(16, 16, 0)
    assert torch.equal(~_greyed(fig), nm_mask(w0, 2, 4, dim=1))
    assert f"{kept_fraction(w0, nm_mask(w0, 2, 4, dim=1)):.3f}" in summary.value
    solver_box.value = "auto"
    assert torch.equal(~_greyed(fig), transposable_mask(w0, 2, 4))
    assert "auto ran 'patterns'" in summary.value and len(fig.layout.shapes) == 6
    nm_box.value = (4, 8)
    assert torch.equal(~_greyed(fig), transposable_mask(w0, 4, 8))
    assert "auto ran 'flow'" in summary.value and "4:8" in fig.layout.title.text
    solver_box.value = "unstructured"
    assert int((~_greyed(fig)).sum()) == 128 and len(fig.layout.shapes) == 1
    seed_box.value = 5
    w5 = gaussian_weight(16, 16, 5)
    assert [list(r) for r in fig.data[0].z] == w5.tolist()
    assert torch.equal(~_greyed(fig), unstructured_mask(w5, 0.5))


@pytest.mark.parametrize("kwargs, match", [({"size": 12}, "size"), ({"n": 3, "m": 4}, r"\(n, m\)"),
                                           ({"solver": "lp"}, "solver")])
def test_mask_explorer_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mask_explorer(**kwargs)
