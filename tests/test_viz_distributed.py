"""The per-rank storage figure of notebook 12."""
import pytest
import torch

pytest.importorskip("plotly")

from sparsity_lab.masks import nm_mask  # noqa: E402
from sparsity_lab.course.viz.distributed_view import sharding_figure, stored_rows  # noqa: E402


def test_stored_rows_follow_torch_chunk():
    assert stored_rows(8, 2) == [(0, 4), (4, 8)]
    assert stored_rows(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert stored_rows(3, 4) == [(0, 1), (1, 2), (2, 3), (3, 3)]  # a rank may store nothing


def test_sharding_figure_blanks_the_rows_a_rank_does_not_store():
    mask = nm_mask(torch.randn(8, 16), 2, 4, dim=1)
    fig = sharding_figure(mask, world=2)
    assert len(fig.data) == 4  # in order: DDP rank 0, FSDP2 rank 0, DDP rank 1, FSDP2 rank 1
    z_fsdp_rank1 = fig.data[3].z
    assert all(v is None or v != v for v in z_fsdp_rank1[0])  # row 0 is rank 0's: blank on rank 1 (NaN)
    assert list(z_fsdp_rank1[7]) == mask[7].float().tolist()
    assert [list(row) for row in fig.data[2].z] == mask.float().tolist()  # DDP: rank 1 stores every row


def test_sharding_figure_rejects_bad_input():
    with pytest.raises(ValueError, match="bool"):
        sharding_figure(torch.ones(4, 4), 2)
    with pytest.raises(ValueError, match="world"):
        sharding_figure(torch.ones(4, 4, dtype=torch.bool), 0)
