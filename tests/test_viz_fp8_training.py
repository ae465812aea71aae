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
