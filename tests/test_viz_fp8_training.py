"""The FP8 training figure and the summary of the recorded H100 run."""
import pytest

pytest.importorskip("plotly")

from sparsity_lab.course.viz.fp8_training_view import recorded_summary, scaling_figure  # noqa: E402
from sparsity_lab.course.viz.speedup_view import recorded  # noqa: E402


def _rows(n, grow):
    return [{"step": t, "amax_x": 1.0 + grow * t, "range_x": 1.0 + grow * max(t - 1, 0), "scales": [0.1, 0.2, 0.3, 0.4]}
            for t in range(n)]


def test_scaling_figure_draws_every_recipe_and_the_four_scales():
    fig = scaling_figure({"delayed": _rows(5, 0.5), "current": _rows(5, 0.5)})
    names = [t.name for t in fig.data]
    assert names[0] == "amax of X" and sum("range of the X scale" in n for n in names) == 2
    assert sum(n.startswith("scale of") for n in names) == 4


def test_scaling_figure_refuses_bad_runs():
    with pytest.raises(ValueError, match="non-empty dict"):
        scaling_figure({})
    with pytest.raises(ValueError, match="keys step"):
        scaling_figure({"a": [{"step": 0}]})
    with pytest.raises(ValueError, match="delayed must be one of"):
        scaling_figure({"a": _rows(2, 1.0)}, delayed="b")


def test_recorded_summary_reads_the_committed_result():
    data = recorded("fp8_training_h100")
    assert data is not None, "results/fp8_training_h100.json is committed"
    s = recorded_summary(data)
    assert "H100" in s["where"] and s["forward"]["fp8_dense_tflops"] > 0
    assert set(s["targets"]) <= {"forward_fp8_24_vs_fp8_dense", "ffn_fp8_24_vs_fp8_dense", "ffn_fp8_24_vs_bf16_dense"}
    with pytest.raises(ValueError, match="provenance"):
        recorded_summary({})
    ffn = recorded("fp8_training_ffn_h100")
    assert ffn is not None, "results/fp8_training_ffn_h100.json is committed"
    both = recorded_summary(data, ffn)
    assert both["forward"] == s["forward"] and "H100" in both["ffn_where"]
    assert both["ffn"]["fp8_24_vs_fp8_dense"] == ffn["ffn"]["fp8_24_vs_fp8_dense"]
    assert both["targets"]["ffn_fp8_24_vs_fp8_dense"] == ffn["judged"]["ffn_fp8_24_vs_fp8_dense"]


# --- where the scale of an FP8 product lives (notebook 06, section 4) ----------------------------------
def test_scale_pass_bytes_reads_and_writes_the_output_once():
    from sparsity_lab.course.viz.fp8_training_view import scale_pass_bytes
    assert scale_pass_bytes(16384, 16384) == 2 ** 30  # bf16 in and out: 4 bytes per entry
    assert scale_pass_bytes(3, 5, bytes_in=4, bytes_out=1) == 75
    with pytest.raises(ValueError, match="bytes_in"):
        scale_pass_bytes(3, 5, bytes_in=0)


def test_scale_placement_summary_reads_the_fields_of_both_recorded_runs():
    from sparsity_lab.course.viz.fp8_training_view import scale_placement_summary
    s = scale_placement_summary()
    ha, cu = recorded("fp8_training_host_alpha_h100"), recorded("cutlass_h200")
    assert ha is not None and cu is not None, "both results are committed"
    ffn = s["ffn"]
    assert "H100" in ffn["gpu"] and "H100" in ffn["where"]
    ratios = ha["ffn"]["dense_ratios"]
    assert ffn["scale_pass"] == ratios["fp8_24"]["fp8_dense"]["speedup"]
    assert ffn["host_alpha"] == ratios["fp8_24_host_alpha"]["fp8_dense"]["speedup"]
    assert ffn["dense_tflops"] == ha["ffn"]["variants"]["fp8_dense"]["tflops"]
    assert ffn["host_alpha_ms"] == ha["ffn"]["variants"]["fp8_24_host_alpha"]["ms"]
    products = s["products"]
    assert "H200" in products["gpu"]
    assert [(r["m"], r["n"], r["k"]) for r in products["rows"]] == [(16384, 16384, 4096), (4096, 16384, 16384)]
    up = products["rows"][0]
    fp8 = next(r for r in cu["shapes"] if (r["m"], r["n"], r["k"]) == (16384, 16384, 4096))["fp8"]
    assert up["dense_tflops"] == fp8["scaled_mm_fp8"]["tflops"]
    assert up["cusparselt_pass"] == fp8["cusparselt_fp8"]["vs_dense_same_kind"]
    assert up["cusparselt_host_alpha"] == fp8["cusparselt_fp8_host_alpha"]["vs_dense_same_kind"]
    assert up["cutlass_fast"] == fp8["cutlass_fp8[128x256x128.1x2.coopfast]"]["vs_dense_same_kind"]
    assert up["cutlass_promoted"] == max(v["vs_dense_same_kind"] for k, v in fp8.items()
                                         if k.startswith("cutlass_fp8[") and not k.endswith("fast]"))


def test_scale_placement_summary_says_which_file_is_missing_and_which_field(tmp_path):
    import json
    import shutil

    from sparsity_lab.course.viz.fp8_training_view import scale_placement_summary
    from sparsity_lab.provenance import RESULTS_DIR
    with pytest.raises(FileNotFoundError, match=r"fp8_training_host_alpha_h100\.json is not here.*benchmarks fp8-training"):
        scale_placement_summary(tmp_path)
    shutil.copy(RESULTS_DIR / "fp8_training_host_alpha_h100.json", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"cutlass_h200\.json is not here.*benchmarks cutlass"):
        scale_placement_summary(tmp_path)
    data = json.loads((RESULTS_DIR / "cutlass_h200.json").read_text())
    for row in data["shapes"]:
        row["fp8"].pop("cusparselt_fp8_host_alpha")
    (tmp_path / "cutlass_h200.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="no field cusparselt_fp8_host_alpha"):
        scale_placement_summary(tmp_path)
