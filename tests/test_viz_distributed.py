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


def _run(world, dense_tps, sparse_tps, smoke=False, width=1024, gpu="NVIDIA H100 80GB HBM3"):
    rows = [{"method": m, "parallel": p, "median_step_s": 8192 * world / t, "tokens_per_s_per_gpu": t / world,
             "tokens_per_s_total": t} for p in ("none", "ddp") for m, t in (("dense", dense_tps), ("sste_mvue", sparse_tps))]
    return {"world_size": world, "smoke": smoke, "rows": rows, "settings": {"width": width}, "gpu": gpu}


def test_recorded_scaling_reads_every_world_size_and_skips_smoke_runs(tmp_path):
    import json

    from sparsity_lab.course.viz.distributed_view import recorded_scaling

    assert recorded_scaling(tmp_path) == []  # none recorded: an empty list, no error
    for world, smoke in ((4, False), (1, False), (2, True)):
        (tmp_path / f"distributed_speed_{world}gpu.json").write_text(json.dumps(_run(world, 100.0, 50.0, smoke)))
    assert [r["world_size"] for r in recorded_scaling(tmp_path)] == [1, 4]


def test_scaling_rows_ratios_and_table_width():
    from sparsity_lab.course.viz.distributed_view import scaling_rows, scaling_table

    rows = scaling_rows([_run(1, 100.0, 50.0), _run(2, 180.0, 120.0)])
    two = {(r["method"], r["parallel"]): r for r in rows if r["world"] == 2}
    assert two[("sste_mvue", "ddp")]["vs_dense"] == pytest.approx(120 / 180)
    assert two[("dense", "ddp")]["vs_dense"] is None
    assert two[("dense", "ddp")]["vs_one_gpu"] == pytest.approx(0.9)  # 90 per GPU against 100 on one GPU
    assert all(len(line) <= 80 for line in scaling_table([_run(1, 100.0, 50.0), _run(2, 180.0, 120.0)]).splitlines())
    assert scaling_table([]) == "no recorded multi-GPU run"


def test_runs_of_different_widths_are_never_compared():
    from sparsity_lab.course.viz.distributed_view import scaling_rows, scaling_table

    runs = [_run(1, 100.0, 50.0), _run(2, 180.0, 120.0), _run(2, 400.0, 440.0, width=4096),
            _run(4, 760.0, 840.0, width=4096)]
    rows = {(r["width"], r["world"], r["method"], r["parallel"]): r for r in scaling_rows(runs)}
    assert {r["gpu"] for r in rows.values()} == {"H100"}
    assert rows[(4096, 2, "sste_mvue", "ddp")]["vs_dense"] == pytest.approx(440 / 400)
    assert rows[(4096, 2, "dense", "ddp")]["vs_one_gpu"] == pytest.approx(1.0)  # its own smallest world: 2
    assert rows[(4096, 4, "dense", "ddp")]["vs_one_gpu"] == pytest.approx(190 / 200)
    assert rows[(1024, 2, "dense", "ddp")]["vs_one_gpu"] == pytest.approx(0.9)
    table = scaling_table(runs).splitlines()
    assert all(len(line) <= 80 for line in table) and table[0].split()[:2] == ["GPU", "width"]


def test_runs_on_different_gpu_models_are_never_compared():
    from sparsity_lab.course.viz.distributed_view import scaling_rows

    runs = [_run(1, 100.0, 50.0), _run(2, 180.0, 120.0, gpu="NVIDIA H200"), _run(4, 300.0, 360.0, gpu="NVIDIA H200")]
    rows = {(r["gpu"], r["world"], r["method"], r["parallel"]): r for r in scaling_rows(runs)}
    assert rows[("H200", 2, "dense", "ddp")]["vs_one_gpu"] == pytest.approx(1.0)  # its own smallest: 2 H200s
    assert rows[("H200", 4, "dense", "ddp")]["vs_one_gpu"] == pytest.approx(75 / 90)
    assert rows[("H100", 1, "sste_mvue", "ddp")]["vs_dense"] == pytest.approx(0.5)
