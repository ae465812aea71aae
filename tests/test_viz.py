"""The functions the DYAD and prune-and-regrow notebooks' widgets call."""
import pytest
import torch

pytest.importorskip("plotly", reason="plotly is in the test extra; this file needs it")
pytest.importorskip("ipywidgets", reason="ipywidgets is in the test extra; this file needs it")

from sparsity_lab.structures.dyad import DyadLinear  # noqa: E402
from sparsity_lab.course.viz import (block_mask_figure, dyad_explorer, dyad_structure, mask_changes,  # noqa: E402
                              prune_regrow_explorer, prune_regrow_trace)


@pytest.mark.parametrize("variant", ["it", "ot", "dt"])
@pytest.mark.parametrize("n", [2, 4])
def test_dyad_structure_matches_the_explicit_dense_matrix(variant, n):
    codes = dyad_structure(16, n, variant)
    layer = DyadLinear(16, 16, n, variant, bias=False)
    with torch.no_grad():  # one term at a time through the entry-by-entry construction
        layer.blocks_a.fill_(1.0)
        layer.blocks_b.zero_()
        a = layer.dense_weight() != 0
        layer.blocks_a.zero_()
        layer.blocks_b.fill_(1.0)
        b = layer.dense_weight() != 0
    assert torch.equal(codes, a.to(torch.int8) + 2 * b.to(torch.int8))
    assert int((codes > 0).sum()) <= 2 * 16 * 16 // n


def test_dyad_explorer_redraws_when_n_or_variant_change():
    box = dyad_explorer(width=16, n_blocks=4, variant="it")
    (n_box, v_box), fig, summary = box.children[0].children, box.children[1], box.children[2]
    before, text = [list(r) for r in fig.data[0].z], summary.value
    n_box.value = 2
    assert [list(r) for r in fig.data[0].z] == dyad_structure(16, 2, "it").tolist() != before
    assert summary.value != text and "2/n = 1" in summary.value
    v_box.value = "ot"
    assert [list(r) for r in fig.data[0].z] == dyad_structure(16, 2, "ot").tolist()
    assert "DYAD-OT" in fig.layout.title.text


def test_mask_changes_codes():
    prev = torch.tensor([[True, True], [False, False]])
    cur = torch.tensor([[True, False], [True, False]])
    assert mask_changes(prev, cur).tolist() == [[1, 3], [2, 0]]


def test_prune_regrow_trace_keeps_live_blocks_and_records_every_update():
    run = prune_regrow_trace(block=8, sparsity=0.75, width=32, steps=20, update_every=5)
    assert len(run["masks"]) == 1 + 4 == 1 + len(run["history"])
    assert all(int(m.sum()) == run["live"] for m in run["masks"])
    assert any(not torch.equal(a, b) for a, b in zip(run["masks"], run["masks"][1:]))
    fig = block_mask_figure(run["masks"], 1)
    assert "update 1 of 4" in fig.layout.title.text
    assert fig.layout.xaxis.dtick == 1 and fig.layout.yaxis.dtick == 1  # whole blocks, not -0.5, 0, 0.5


def test_prune_regrow_explorer_follows_its_controls():
    box = prune_regrow_explorer(block=8, sparsity=0.75, width=32, steps=20, update_every=5)
    (block_box, sparsity_box), update_box, fig, info = box.children[0].children, *box.children[1:]
    update_box.value = 2
    assert "update 2" in fig.layout.title.text
    live_before = info.value.split()[0]
    sparsity_box.value = 0.5  # re-runs the short training with twice the live blocks
    assert info.value.split()[0] != live_before
    block_box.value = 4
    assert len(fig.data[0].z) == 2 * 32 // 4
