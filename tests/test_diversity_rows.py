"""diversity_rows on other blocks than 8x8: the structures a block cannot hold are left out with a
warning that names them (a 4x8 block holds no 8x8 tile for transposable 4:8); counts stay exact."""
from math import comb

import pytest

pytest.importorskip("plotly", reason="the figures need plotly (lab/test extra)")
from sparsity_lab.course.viz.tile_solver_view import diversity_figure, diversity_rows  # noqa: E402


def test_a_4x8_block_leaves_out_transposable_4_8_and_says_so():
    with pytest.warns(UserWarning, match=r"leaves out transposable 4:8 \(block rows \(4\) must be divisible by m=8"):
        rows = diversity_rows(block=(4, 8))
    assert {r["mask"]: r["count"] for r in rows} == {
        "unstructured 50 %": comb(32, 16), "4:8": comb(8, 4) ** 4, "2:4": comb(4, 2) ** 8, "transposable 2:4": 90 ** 2}
    assert "one 4x8 block" in diversity_figure(rows).layout.title.text


def test_an_8x16_block_has_every_structure_and_counts_scale_with_the_tiles(recwarn):
    rows = {r["mask"]: r["count"] for r in diversity_rows(block=(8, 16))}
    eight = {r["mask"]: r["count"] for r in diversity_rows(block=(8, 8))}
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]
    assert rows["transposable 4:8"] == eight["transposable 4:8"] ** 2 and rows["2:4"] == eight["2:4"] ** 2


@pytest.mark.parametrize("block, message", [((3, 5), "holds none of the structures"),
                                            ((4, 0), "two positive ints"), ("8x8", "two positive ints")])
def test_a_block_that_holds_nothing_is_a_clear_error(block, message):
    with pytest.raises(ValueError, match=message):
        diversity_rows(block=block)
