"""The speedups notebook's helpers: the FFN table's schema check and plots (on a made-up table built
here, never written under results/), the recorded kernel/MVUE/DYAD figures, and the live FFN timing
(run on the CPU here: it must run and compute its ratios right; its times mean nothing)."""
import math

import pytest
import torch

pytest.importorskip("plotly", reason="plotly is in the test extra; this file needs it")
pytest.importorskip("ipywidgets", reason="ipywidgets is in the test extra; this file needs it")

from sparsity_lab.course.live import measure_ffn  # noqa: E402
from sparsity_lab.course.viz._provenance import provenance_line  # noqa: E402
from sparsity_lab.course.viz.speedup_view import (check_ffn_rows, dyad_speedup_figure, ffn_explorer,  # noqa: E402
                                           ffn_speedup_figure, ffn_wins_heatmap, kernel_vs_pytorch_figure,
                                           mvue_variants_figure, ours_vs_pytorch, ours_vs_pytorch_figure, recorded, shape_label,
                                           step_speedup, wins_and_losses)

SHAPES = [(16384, 4096, 16384), (2048, 1024, 4096), (8192, 4096, 16384)]  # deliberately not in size order
# made-up speedups over dense per (variant, phase), one per shape in SHAPES' order
SPEEDUPS = {
    ("ours_fixed_mask", "fwd"): (1.5, 0.6, 1.2), ("ours_fixed_mask", "fwd_bwd"): (1.3, 0.7, 1.1),
    ("ours_mask_every_step", "fwd"): (1.2, 0.4, 0.9), ("ours_mask_every_step", "fwd_bwd"): (1.1, 0.5, 0.95),
    ("pytorch_semi_structured", "fwd"): (0.8, 0.3, 0.7),
}
DENSE_MS = {"fwd": 2.0, "fwd_bwd": 6.0}


def ffn_table() -> dict:
    rows = []
    for i, (tokens, d, f) in enumerate(SHAPES):
        scale = tokens * d * f / SHAPES[1][0] / SHAPES[1][1] / SHAPES[1][2]
        for phase, ms in DENSE_MS.items():
            rows.append({"tokens": tokens, "d_model": d, "ffn": f, "variant": "dense", "phase": phase,
                         "ms": ms * scale, "speedup_vs_dense": 1.0})
        for (variant, phase), speeds in SPEEDUPS.items():
            rows.append({"tokens": tokens, "d_model": d, "ffn": f, "variant": variant, "phase": phase,
                         "ms": DENSE_MS[phase] * scale / speeds[i], "speedup_vs_dense": speeds[i]})
    return {"provenance": {"gpu": "Test GPU", "date": "2026-01-01T00:00:00+00:00"}, "rows": rows}


BY_SIZE = ["2048x1024x4096", "8192x4096x16384", "16384x4096x16384"]
ORDER = [1, 2, 0]  # SHAPES indices in size order


def test_check_ffn_rows_accepts_the_schema_and_names_what_is_wrong():
    table = ffn_table()
    assert check_ffn_rows(table) is table["rows"] and check_ffn_rows(table["rows"]) is table["rows"]
    bad = [
        ({"ms": None}, "rows\\[0\\]\\['ms'\\] must be a finite number > 0"),
        ({"ms": -1.0}, "'ms'"),
        ({"speedup_vs_dense": math.nan}, "speedup_vs_dense"),
        ({"variant": "ours_magic"}, "one of"),
        ({"phase": "bwd"}, "phase"),
        ({"tokens": True}, "tokens"),
        ({"d_model": 0}, "d_model"),
    ]
    for change, message in bad:
        rows = [dict(r) for r in table["rows"]]
        rows[0].update(change)
        with pytest.raises(ValueError, match=message):
            check_ffn_rows(rows)
    rows = [dict(r) for r in table["rows"]]
    del rows[3]["ffn"]
    with pytest.raises(ValueError, match=r"rows\[3\] lacks \['ffn'\]"):
        check_ffn_rows(rows)
    with pytest.raises(ValueError, match="non-empty"):
        check_ffn_rows([])
    with pytest.raises(ValueError, match="no 'rows'"):
        check_ffn_rows({"provenance": {}})


def test_speedup_figure_one_panel_per_phase_shapes_by_size():
    fig = ffn_speedup_figure(ffn_table())
    fwd = {t.legendgroup: t for t in fig.data if t.xaxis == "x"}  # legendgroup: the variant; name: its reader name
    both = {t.legendgroup: t for t in fig.data if t.xaxis == "x2"}
    assert [t.name for t in fwd.values()] == ["2:4, mask fixed", "2:4, mask every step", "PyTorch semi-structured"]
    assert list(fwd) == ["ours_fixed_mask", "ours_mask_every_step", "pytorch_semi_structured"]
    assert list(both) == ["ours_fixed_mask", "ours_mask_every_step"]  # PyTorch's path has no fwd_bwd rows here
    assert list(fwd["ours_fixed_mask"].x) == BY_SIZE
    assert list(fwd["ours_fixed_mask"].y) == [SPEEDUPS[("ours_fixed_mask", "fwd")][i] for i in ORDER]
    assert list(both["ours_mask_every_step"].y) == [SPEEDUPS[("ours_mask_every_step", "fwd_bwd")][i] for i in ORDER]
    assert fig.layout.annotations[0].text == "forward" and fig.layout.annotations[1].text == "forward + backward"


def test_wins_heatmap_and_summary():
    table = ffn_table()
    heat = ffn_wins_heatmap(table, "fwd").data[0]
    assert list(heat.y) == ["ours_fixed_mask", "ours_mask_every_step", "pytorch_semi_structured"]
    assert list(heat.x) == BY_SIZE and heat.zmid == 1.0
    assert [list(r) for r in heat.z] == [[SPEEDUPS[(v, "fwd")][i] for i in ORDER] for v in heat.y]
    with pytest.raises(ValueError, match="recorded phases"):
        ffn_wins_heatmap(table, "bwd")
    summary = {(s["variant"], s["phase"]): s for s in wins_and_losses(table)}
    assert len(summary) == 5
    s = summary[("ours_mask_every_step", "fwd_bwd")]
    assert (s["shapes"], s["wins"], s["best"], s["best_shape"]) == (3, 1, 1.1, "16384x4096x16384")
    assert (s["worst"], s["worst_shape"]) == (0.5, "2048x1024x4096")
    assert summary[("pytorch_semi_structured", "fwd")]["wins"] == 0


def test_ours_against_pytorch():
    table = ffn_table()
    got = ours_vs_pytorch(table)
    assert [(g["shape"], g["phase"]) for g in got] == [(s, "fwd") for s in BY_SIZE]  # only fwd has PyTorch rows
    for g, i in zip(got, ORDER):
        best = max(SPEEDUPS[("ours_fixed_mask", "fwd")][i], SPEEDUPS[("ours_mask_every_step", "fwd")][i])
        assert g["best_ours"] == "ours_fixed_mask"
        assert g["ours_over_pytorch"] == pytest.approx(best / SPEEDUPS[("pytorch_semi_structured", "fwd")][i])
    fig = ours_vs_pytorch_figure(table)
    assert list(fig.data[0].y) == [g["ours_over_pytorch"] for g in got]
    no_torch = [r for r in table["rows"] if r["variant"] != "pytorch_semi_structured"]
    with pytest.raises(ValueError, match="pytorch_semi_structured"):
        ours_vs_pytorch_figure(no_torch)


def test_explorer_follows_the_phase():
    box = ffn_explorer(ffn_table())
    phase, fig, summary = box.children
    assert phase.value == "fwd_bwd" and len(fig.data[0].y) == 2
    assert "faster than dense at 2 of 3 shapes" in summary.value  # ours_fixed_mask, fwd_bwd: 1.3, 1.1 win
    phase.value = "fwd"
    assert list(fig.data[0].y) == ["ours_fixed_mask", "ours_mask_every_step", "pytorch_semi_structured"]
    assert [list(r) for r in fig.data[0].z][2] == [SPEEDUPS[("pytorch_semi_structured", "fwd")][i] for i in ORDER]
    assert "forward" in fig.layout.title.text and "pytorch_semi_structured" in summary.value


def test_step_speedup_is_amdahls_law():
    assert step_speedup(1.0, 2.0) == 2.0 and step_speedup(0.0, 2.0) == 1.0
    assert step_speedup(0.5, 2.0) == pytest.approx(1 / 0.75)
    assert step_speedup(0.8, 1e9) == pytest.approx(5.0)  # the other 20 % bounds it
    with pytest.raises(ValueError, match="product_fraction"):
        step_speedup(1.5, 2.0)
    with pytest.raises(ValueError, match="product_speedup"):
        step_speedup(0.5, 0)


def test_shape_label():
    assert shape_label({"tokens": 16384, "d_model": 4096, "ffn": 16384}) == "16384x4096x16384"


def test_kernel_vs_pytorch_lists_every_baseline_timed():
    data = {"provenance": {}, "rows": [
        {"kernel": "1 prune24", "variant": "mask", "ms": 0.1, "gbps": 2000.0, "fraction_of_copy": 0.66},
        {"kernel": "1 prune24", "variant": "vs PyTorch", "ms": 0.1, "baseline": "topk", "baseline_ms": 5.0,
         "speedup": 50.0},
        {"kernel": "2 t24", "variant": "sep", "ms": 0.2, "baseline": "a", "baseline_ms": 0.4, "speedup": 2.0},
        {"kernel": "2 t24", "variant": "sep", "ms": 0.2, "baseline": "b", "baseline_ms": 0.1, "speedup": 0.5},
        {"kernel": "3 x", "variant": "y", "ms": 0.2, "baseline": "c", "baseline_ms": None, "speedup": None},
    ]}
    fig = kernel_vs_pytorch_figure(data)
    assert list(fig.data[0].x) == [50.0, 2.0, 0.5]  # the baseline that could not run has no bar
    assert list(fig.data[0].y) == ["prune24: vs PyTorch (vs topk)", "t24: sep (vs a)", "t24: sep (vs b)"]
    with pytest.raises(ValueError, match="speedup"):
        kernel_vs_pytorch_figure({"provenance": {}, "rows": data["rows"][:1]})


def test_mvue_and_dyad_figures():
    mvue = {"shape": [8, 8], "dtype": "bfloat16", "rows": [
        {"variant": "a", "dim": 0, "block": 512, "num_warps": 4, "fraction_of_copy": 0.5, "correct": True},
        {"variant": "b", "dim": -1, "block": 512, "num_warps": 8, "fraction_of_copy": 0.6, "correct": False},
        {"variant": "c", "dim": 0, "block": 256, "num_warps": 4, "fraction_of_copy": 0.9, "correct": False,
         "diagnostic": True}]}
    fig = mvue_variants_figure(mvue)
    assert [t.name for t in fig.data] == ["correct", "failed a check", "diagnostic (not an MVUE)"]
    assert [list(t.x) for t in fig.data] == [[0.5], [0.6], [0.9]]
    dyad = {"rows": [{"width": w, "shape": s, "n_blocks": n, "variant": "dyad-it", "speedup": w / 1000 + n,
                      "tokens": 8192} for w in (2048, 768) for s in ("square", "ffn_up") for n in (4, 8)]}
    fig = dyad_speedup_figure(dyad, "ffn_up")
    assert [t.name for t in fig.data] == ["DYAD-IT, n = 4", "DYAD-IT, n = 8"]
    assert list(fig.data[1].x) == [768, 2048] and list(fig.data[1].y) == [8.768, 10.048]
    with pytest.raises(ValueError, match="shape must be one of"):
        dyad_speedup_figure(dyad, "ffn_down")


def test_the_recorded_tables_plot():
    for name, make in (("kernels_h100", kernel_vs_pytorch_figure),
                       ("mvue_variants_h100", mvue_variants_figure), ("dyad_h100", dyad_speedup_figure)):
        data = recorded(name)
        assert data is not None, f"results/{name}.json should be committed"
        assert make(data).data
        assert "H100" in provenance_line(data["provenance"])


def test_recorded_is_none_when_absent(tmp_path):
    assert recorded("cusparselt_ffn_h100", tmp_path) is None
    (tmp_path / "x.json").write_text('{"rows": []}')
    assert recorded("x", tmp_path) == {"rows": []}


def test_provenance_line_without_a_gpu():
    line = provenance_line({"cpu": "x86_64", "gpu": None, "date": "2026-01-01T10:20:30+00:00",
                            "git_commit": "0123456789abcdef+dirty", "torch": "2.13"})
    assert line == "CPU (x86_64, no GPU), 2026-01-01 10:20 UTC, commit 0123456789ab+dirty, torch 2.13"
    with pytest.raises(TypeError, match="provenance"):
        provenance_line("H100")


@pytest.mark.parametrize("shape", [(13, 16, 32), (8, 32, 64)])  # an odd token count too
def test_measure_ffn_on_cpu_gives_rows_of_the_schema(shape):
    rows = measure_ffn([shape], backend="torch", device="cpu", dtype=torch.float32)
    assert check_ffn_rows(rows) is rows
    assert [(r["variant"], r["phase"]) for r in rows] == [
        (v, p) for p in ("fwd", "fwd_bwd") for v in ("dense", "ours_fixed_mask", "ours_mask_every_step")]
    for r in rows:
        dense = next(d for d in rows if d["variant"] == "dense" and d["phase"] == r["phase"])
        assert r["speedup_vs_dense"] == pytest.approx(dense["ms"] / r["ms"])
        assert (r["tokens"], r["d_model"], r["ffn"]) == shape
        if r["variant"] != "dense" and r["phase"] == "fwd":
            assert r["rel_err"] < 1e-5  # the 2:4 output is the product with the masked weights
    figure = ffn_speedup_figure(rows)
    assert len(figure.data) == 4


def test_measure_ffn_rejects_bad_shapes():
    with pytest.raises(ValueError, match="triples"):
        measure_ffn([(16, 32)], backend="torch", device="cpu")
    with pytest.raises(ValueError, match="empty"):
        measure_ffn([], backend="torch", device="cpu")


def test_rows_that_record_an_error_are_listed_not_plotted():
    from sparsity_lab.course.viz.speedup_view import check_ffn_rows, ffn_errors
    ok = {"tokens": 4096, "d_model": 1024, "ffn": 4096, "variant": "dense", "phase": "fwd_bwd", "ms": 1.0,
          "speedup_vs_dense": 1.0}
    failed = dict(ok, variant="pytorch_semi_structured", ms=None, speedup_vs_dense=None, error="NotImplementedError: x")
    assert check_ffn_rows({"rows": [ok, failed]}) == [ok]
    assert ffn_errors({"rows": [ok, failed]}) == [failed]
    with pytest.raises(ValueError, match="finite number"):
        check_ffn_rows([ok, dict(failed, error="")])
    with pytest.raises(ValueError, match="nothing was measured"):
        check_ffn_rows([failed])


def _paired_table() -> dict:
    """Two shapes, dense and ours_mvue in three rounds each (made-up ms)."""
    rows = []
    for (tokens, d), dense_ms, ours_ms in (((16384, 4096), (20.0, 21.0, 19.0), (14.0, 15.0, 16.0)),
                                           ((4096, 1024), (0.4, 0.5, 0.4), (2.0, 1.0, 4.0))):
        ratios = [a / b for a, b in zip(dense_ms, ours_ms)]
        base = {"tokens": tokens, "d_model": d, "ffn": 4 * d, "phase": "fwd_bwd"}
        rows.append({**base, "variant": "dense", "round_ms": list(dense_ms), "round_speedups": [1.0] * 3,
                     "speedup_vs_dense": 1.0, "speedup_min": 1.0, "speedup_max": 1.0, "ms": sorted(dense_ms)[1]})
        rows.append({**base, "variant": "ours_mvue", "round_ms": list(ours_ms), "round_speedups": ratios,
                     "speedup_vs_dense": sorted(ratios)[1], "speedup_min": min(ratios), "speedup_max": max(ratios),
                     "ms": sorted(ours_ms)[1]})
    return {"provenance": {}, "rows": [], "paired": rows}


def test_paired_rounds_table_and_figure():
    from sparsity_lab.course.viz.speedup_view import paired_figure, paired_speedups

    table = paired_speedups(_paired_table())
    assert [(t["shape"], t["variant"]) for t in table] == [("16384x4096x16384", "ours_mvue"),
                                                           ("4096x1024x4096", "ours_mvue")]
    big = table[0]
    assert big["median"] == pytest.approx(21 / 15) and big["low"] == pytest.approx(19 / 16)
    assert big["high"] == pytest.approx(20 / 14) and big["rounds"] == 3
    fig = paired_figure(_paired_table())
    [bar] = fig.data
    assert list(bar.x) == ["16384x4096x16384", "4096x1024x4096"]
    assert list(fig.layout.xaxis.categoryarray) == ["4096x1024x4096", "16384x4096x16384"]  # smallest first
    assert bar.error_y.array[0] == pytest.approx(20 / 14 - 21 / 15)
    assert paired_speedups({"rows": []}) == [] and paired_speedups(None) == []
    with pytest.raises(ValueError, match="no paired rounds"):
        paired_figure({"rows": []})
    # a shape quoted from another run is left out; only the variants asked for are drawn
    [bar] = paired_figure(_paired_table(), variants=["ours_mvue"], leave_out=["16384x4096x16384"]).data
    assert list(bar.x) == ["4096x1024x4096"]
    with pytest.raises(ValueError, match="no paired rounds"):
        paired_figure(_paired_table(), variants=["auto"])
    with pytest.raises(ValueError, match="leaves no shape"):
        paired_figure(_paired_table(), leave_out=["16384x4096x16384", "4096x1024x4096"])
    with pytest.raises(ValueError, match="phase"):
        paired_speedups(_paired_table(), phase="backward")


def test_the_recorded_ffn_run_has_paired_rounds():
    from sparsity_lab.course.viz.speedup_view import paired_figure

    data = recorded("cusparselt_ffn_h100")
    assert data is not None and check_ffn_rows(data)
    assert paired_figure(data).data


def test_legends_use_reader_names_not_the_benchmark_variants():
    from sparsity_lab.course.viz.speedup_view import FFN_VARIANTS, READER_NAMES, paired_figure, recorded

    assert set(READER_NAMES) == set(FFN_VARIANTS)
    fig = paired_figure(recorded("cusparselt_ffn_h100"))
    names = [t.name for t in fig.data]
    assert names and not any("_" in n for n in names), names
