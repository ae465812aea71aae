"""``python -m benchmarks lab-speed``: the plumbing on the CPU (``--smoke``) and its ratios. No speed asserted."""
import json

import pytest
from _lab_testing import exit_status

from benchmarks.lab_speed import ratios
from benchmarks.__main__ import main as bench_main
from sparsity_lab.lab.cli import main


def test_smoke_run_writes_every_variant(tmp_path, capsys):
    status = bench_main(["lab-speed", "--smoke", "--steps", "3", "--skip-steps", "1", "--log-interval", "1",
                   "--variants", "dense,dense_track_flips,sste_mvue,dense_graph,sste_mvue_graph_eager_masks",
                   "--out-dir", str(tmp_path)])
    assert status == 0
    result = json.loads((tmp_path / "lab_speed_smoke.json").read_text())
    assert result["smoke"] and "provenance" in result and result["matmul_probe"]["start"]["tflops"] > 0
    rec = {r["variant"]: r for r in result["records"]}
    assert rec["dense"]["tokens_per_s"] > 0 and rec["dense"]["rows_timed"] == 2
    assert "flip_rate_per_refresh" not in rec["dense"]  # the plain dense GPT: no masks
    assert rec["dense_track_flips"]["flip_rate_per_refresh"] is not None
    assert rec["sste_mvue"]["method_options"]["backend"] == "torch" and rec["sste_mvue"]["tokens_per_s"] > 0
    assert "CUDA GPU" in rec["dense_graph"]["error"]  # no graph on the CPU: recorded, the run goes on
    eager_masks = rec["sste_mvue_graph_eager_masks"]
    assert eager_masks["cuda_graph"] and eager_masks["masks_in_graph"] is False and "CUDA GPU" in eager_masks["error"]
    assert rec["dense_graph"]["masks_in_graph"] is False  # the default: eager refresh
    assert "sste_mvue" in result["ratios"]["64"] and "wrote" in capsys.readouterr().out


def test_bad_arguments_name_the_flag(tmp_path, capsys):
    assert exit_status(bench_main, ["lab-speed", "--smoke", "--variants", "nope", "--out-dir", str(tmp_path)]) == 2
    assert "--variants" in capsys.readouterr().err
    assert bench_main(["lab-speed", "--smoke", "--steps", "4", "--skip-steps", "4", "--out-dir", str(tmp_path)]) == 2
    assert "--skip-steps" in capsys.readouterr().err


def test_ratios_use_the_fastest_dense_and_the_same_mode():
    def rec(variant, tps):
        return {"variant": variant, "width": 2048, "tokens_per_step": 8192, "tokens_per_s": tps}
    records = [rec("dense", 180e3), rec("dense_graph", 200e3), rec("sste_mvue", 216e3), rec("sste_mvue_graph", 260e3),
               rec("dense_track_flips", 150e3)]
    r = ratios(records)["2048"]
    assert r["sste_mvue"]["fastest_dense"] == "graph"
    assert r["sste_mvue"]["speedup_vs_fastest_dense"] == pytest.approx(216 / 200)
    assert r["sste_mvue"]["speedup_vs_dense_same_mode"] == pytest.approx(216 / 180)
    assert r["sste_mvue_graph"]["speedup_vs_dense_same_mode"] == pytest.approx(260 / 200)
    assert r["dense_track_flips_cost"] == pytest.approx(1 - 150 / 180)
    assert "masks_in_graph_speedup" not in r  # only with both graphed S-STE variants
    with_both = ratios([*records[:3], {**rec("sste_mvue_graph", 260e3), "masks_in_graph": True},
                        records[4], {**rec("sste_mvue_graph_eager_masks", 240e3), "masks_in_graph": False}])["2048"]
    assert with_both["masks_in_graph_speedup"] == pytest.approx(260 / 240)
    assert with_both["sste_mvue_graph_eager_masks"]["speedup_vs_dense_same_mode"] == pytest.approx(240 / 200)


def test_fp8_variants_keep_their_backends_and_get_their_ratios(tmp_path):
    status = bench_main(["lab-speed", "--smoke", "--steps", "2", "--skip-steps", "1", "--log-interval", "1",
                   "--variants", "dense_fp8_graph,sste_mvue_fp8_graph", "--out-dir", str(tmp_path)])
    assert status == 0
    rec = {r["variant"]: r for r in json.loads((tmp_path / "lab_speed_smoke.json").read_text())["records"]}
    assert rec["dense_fp8_graph"]["method_options"]["backend"] == "fp8_dense"  # not --backend's "torch"
    assert rec["sste_mvue_fp8_graph"]["method_options"]["backend"] == "cusparselt_fp8"

    def r(variant, tps):
        return {"variant": variant, "width": 4096, "tokens_per_step": 8192, "tokens_per_s": tps}
    out = ratios([r("dense_graph", 80e3), r("dense_fp8_graph", 100e3), r("sste_mvue_fp8_graph", 120e3)])["4096"]
    assert out["fp8_24_vs_dense_fp8_graph"] == pytest.approx(1.2)
    assert out["dense_fp8_vs_dense_graph"] == pytest.approx(1.25)
    assert out["sste_mvue_fp8_graph"]["speedup_vs_dense_same_mode"] == pytest.approx(1.5)  # against bf16 dense
    assert "dense_fp8_graph" not in out  # a dense run is a baseline, not a 2:4 variant

