"""The kernel benchmark figure of notebook 07: rows, provenance line and bars from a benchmarks kernels result."""
import pytest

pytest.importorskip("plotly", reason="plotly is in the test extra; this file needs it")

from benchmarks.kernels import Report  # noqa: E402
from sparsity_lab.provenance import RESULTS_DIR, provenance, read_result  # noqa: E402
from sparsity_lab.course.viz.kernel_bench_view import (copy_fraction_rows, kernel_bench_figure,  # noqa: E402
                                                kernel_bench_provenance, speedup_rows)


def _result(smoke=False, failed=()):
    """A result built by the benchmark's own Report class (the format a live run writes)."""
    rep = Report(copy_gbps=2000.0)
    rep.memory_bound("1 prune24", "values + mask", (8, 16), 4000, 0.004, {"block": 512})
    rep.ratio("1 prune24", "values + mask vs PyTorch", (8, 16), 0.004, "nm_mask(w) * w", 0.4, None)
    rep.ratio("2 transposable24", "mask + W + W^T, W^T by separate", (8, 16), 0.01, "", None, None, nbytes=7000)
    rep.ratio("2 transposable24", "mask + W + W^T (separate)", (8, 16), 0.01, "semi", 0.02, 1.0, nbytes=7000)
    rep.memory_bound("7 fp8", "current amax (2 passes)", (8, 16), 3000, 0.003, {}, counts_for_target=False)
    return {"provenance": provenance("benchmarks kernels --test"), "smoke": smoke, "main_tensor_mib": 0.5,
            "summary": rep.summary(), "failed_checks": list(failed), "rows": rep.rows}


def test_rows_fractions_and_deduplication():
    rows = copy_fraction_rows(_result())
    # the repeated timing is shown once; the labels name the kernels without the benchmark's numbers
    assert [r["label"] for r in rows] == ["prune24: values + mask", "transposable24: mask + W + W^T, W^T by separate",
                                         "fp8: current amax (2 passes)"]
    assert [r["kernel"] for r in rows] == ["1 prune24", "2 transposable24", "7 fp8"]
    assert rows[0]["fraction"] == pytest.approx(4000 / 0.004 / 1e6 / 2000.0)
    assert [r["counts_for_target"] for r in rows] == [True, False, False]
    assert [r["speedup"] for r in speedup_rows(_result())] == pytest.approx([100.0, 2.0])


def test_figure_bars_and_lines():
    data = _result()
    fig = kernel_bench_figure(data)
    assert list(fig.data[0].x) == [r["fraction"] for r in copy_fraction_rows(data)]
    assert list(fig.data[0].marker.color) == ["#1f77b4", "#9e9e9e", "#9e9e9e"]
    assert [s.x0 for s in fig.layout.shapes] == [1.0, 0.7]
    assert "2000 GB/s" in fig.layout.title.text


def test_kernel_bench_provenance_flags_smoke_runs_and_failed_checks():
    line = kernel_bench_provenance(_result())
    assert "benchmarks kernels --test" in line and "SMOKE" not in line
    assert "SMOKE RUN" in kernel_bench_provenance(_result(smoke=True))
    assert "checks FAILED" in kernel_bench_provenance(_result(failed=["3. soft threshold"]))
    with pytest.raises(ValueError, match="benchmarks kernels result"):
        copy_fraction_rows({"rows": []})
    with pytest.raises(ValueError, match="no rows with a fraction"):
        kernel_bench_figure({"provenance": {}, "rows": []})


@pytest.mark.skipif(not (RESULTS_DIR / "kernels_h100.json").exists(), reason="no recorded results/kernels_h100.json")
def test_recorded_h100_result_is_consistent():
    """Whatever the recorded file holds: every fraction is its GB/s over the run's copy ceiling."""
    data = read_result("kernels_h100")
    rows = copy_fraction_rows(data)
    assert rows and data["provenance"]["gpu"]
    for r in rows:
        assert r["fraction"] == pytest.approx(r["gbps"] / data["summary"]["copy_gbps"], rel=1e-9)
        assert r["gbps"] == pytest.approx(r["bytes"] / r["ms"] / 1e6, rel=1e-9)
    assert len(kernel_bench_figure(data).data[0].x) == len(rows)
