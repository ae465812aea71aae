"""``python -m benchmarks ffn``: the script's plumbing on the CPU (``--smoke``), its JSON schema, and that
the targets are judged from the measured rows. No speed is asserted here (smoke numbers mean nothing)."""
import json
import math

import pytest
from _lab_testing import exit_status
import torch

import statistics

from benchmarks.ffn.schema import GPT_VARIANTS, GRAPH_VARIANTS, OURS, PAIRED_VARIANTS, PHASES, VARIANTS
from benchmarks.ffn.settings import SMOKE
from benchmarks.ffn.targets import THRESHOLDS, judge_targets
from benchmarks.__main__ import main as bench_main
from sparsity_lab.lab.cli import main

ROW_KEYS = {"tokens", "d_model", "ffn", "variant", "phase", "ms", "speedup_vs_dense"}
# on the CPU these two cannot run: PyTorch's semi-structured tensors and CUDA graphs need a GPU
EXPECTED_CPU_ERRORS = ("pytorch_semi_structured build", "capture+replay")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("ffn")
    import contextlib
    import io
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = bench_main(["ffn", "--smoke", "--out-dir", str(out)])
    assert status == 0
    return json.loads((out / "cusparselt_ffn_smoke.json").read_text()), stdout.getvalue()


def _speedup_ok(row: dict, dense_ms: float | None) -> bool:
    if row["ms"] is None or not dense_ms:
        return row["speedup_vs_dense"] is None
    return math.isclose(row["speedup_vs_dense"], dense_ms / row["ms"], rel_tol=1e-9)


def test_smoke_json_has_the_schema_and_every_row(smoke):
    result, _ = smoke
    assert {"provenance", "rows", "graph", "gpt_step", "targets", "errors", "skipped", "shapes"} <= set(result)
    assert result["smoke"] is True
    assert result["backends"] == {"cusparselt": "torch", "cusparselt_auto": "torch", "dense_products": "torch",
                                  "cutlass": "torch", "sparse_auto": "torch"}
    assert result["unavailable"] == {} and result["library_setup_s"] >= 0
    grid = {(t, d) for t in SMOKE["tokens"] for d in SMOKE["d_model"]}
    keys = [(r["tokens"], r["d_model"], r["variant"], r["phase"]) for r in result["rows"]]
    assert sorted(keys) == sorted((t, d, v, p) for t, d in grid for v in VARIANTS for p in PHASES)
    dense = {(r["tokens"], r["d_model"], r["phase"]): r["ms"] for r in result["rows"] if r["variant"] == "dense"}
    for row in result["rows"]:
        assert ROW_KEYS <= set(row) and row["ffn"] == 4 * row["d_model"]
        assert _speedup_ok(row, dense[(row["tokens"], row["d_model"], row["phase"])])
        if row["variant"] == "pytorch_semi_structured":
            assert row["ms"] is None and "CUDA" in row["error"] and "weights fixed" in row["note"]
        else:
            assert row["ms"] > 0, row
        if row["variant"] in OURS:
            assert row["backend"] == "torch" and "transposable" in row["method"]
            assert isinstance(row["stats_per_step"], dict) and row["steps_counted"] >= 1
        if row["phase"] == "fwd" and row["variant"] != "dense" and row["ms"] is not None:
            assert row["rel_err_vs_masked_dense"] < 1e-2  # the same masked weights, dense
    assert {(s["tokens"], s["d_model"]) for s in result["shapes"]} == grid
    assert all(any(w in e["where"] for w in EXPECTED_CPU_ERRORS) for e in result["errors"]), result["errors"]


def test_smoke_graph_and_gpt_sections(smoke):
    result, _ = smoke
    modes = {(r["variant"], r["mode"]) for r in result["graph"]}
    assert modes == {(v, m) for v in GRAPH_VARIANTS for m in ("eager", "graph")}
    assert {(r["tokens"], r["d_model"]) for r in result["graph"]} == {(t, d) for t in SMOKE["tokens"]
                                                                      for d in SMOKE["d_model"]}
    for row in result["graph"]:
        if row["mode"] == "eager":
            assert row["ms"] > 0
        else:  # no CUDA graph on the CPU: the error is recorded, the run goes on
            assert row["ms"] is None and "CUDA" in row["error"]
    gpt = result["gpt_step"]
    assert set(gpt["variants"]) == set(GPT_VARIANTS)
    assert gpt["tokens_per_step"] == SMOKE["gpt"]["batch"] * SMOKE["gpt"]["context"]
    dense_ms = gpt["variants"]["dense"]["ms"]
    for name, record in gpt["variants"].items():
        assert record["ms"] > 0 and math.isfinite(record["loss_after"])
        assert math.isclose(record["tokens_per_s"], gpt["tokens_per_step"] / record["ms"] * 1e3)
        assert math.isclose(record["speedup_vs_dense"], dense_ms / record["ms"])
        if name != "dense":  # FFN linears (fc, proj), or every block linear (qkv, proj too)
            per_block = 4 if name.endswith("_all_linears") else 2
            assert record["sparse_layers"] == per_block * SMOKE["gpt"]["n_layer"]


def test_smoke_paired_rounds(smoke):
    """Every paired variant timed in every round; each round's speed-up is dense ms / its ms of that
    round, and the row's figure is their median."""
    result, _ = smoke
    assert result["rounds"] == 2
    rows = {(r["tokens"], r["d_model"], r["variant"], r["phase"]): r for r in result["paired"]}
    grid = {(t, d) for t in SMOKE["tokens"] for d in SMOKE["d_model"]}
    assert set(rows) == {(t, d, v, p) for t, d in grid for v in PAIRED_VARIANTS for p in PHASES}
    for (t, d, variant, phase), row in rows.items():
        assert len(row["round_ms"]) == 2
        dense = rows[(t, d, "dense", phase)]["round_ms"]
        expected = [a / b for a, b in zip(dense, row["round_ms"])]
        assert row["round_speedups"] == pytest.approx(expected)
        assert row["speedup_vs_dense"] == pytest.approx(statistics.median(expected))
        assert row["speedup_min"] <= row["speedup_vs_dense"] <= row["speedup_max"]


def test_smoke_targets_are_the_measured_rows(smoke):
    result, stdout = smoke
    t_tokens, t_d = SMOKE["target"]
    row = {(r["variant"], r["phase"]): r for r in result["rows"] if (r["tokens"], r["d_model"]) == (t_tokens, t_d)}
    paired = {(r["variant"], r["phase"]): r for r in result["paired"] if (r["tokens"], r["d_model"]) == (t_tokens, t_d)}
    targets = result["targets"]
    # the headline: the fastest dense of the run (alone at the start, grid, paired) over the paired median
    for key, variant in (("ffn_fwd_bwd_ours_mvue", "ours_mvue"), ("ffn_fwd_bwd_refresh40", "ours_mvue_refresh40")):
        t = targets[key]
        dense = min(result["baseline"]["dense_alone_ms"], row[("dense", "fwd_bwd")]["ms"],
                    paired[("dense", "fwd_bwd")]["ms"])
        assert t["dense_ms"] == dense and t["variant_ms"] == paired[(variant, "fwd_bwd")]["ms"]
        assert t["measured"] == pytest.approx(dense / paired[(variant, "fwd_bwd")]["ms"])
        assert t["paired_ratio"] == paired[(variant, "fwd_bwd")]["speedup_vs_dense"]
        assert t["unpaired"] == row[(variant, "fwd_bwd")]["speedup_vs_dense"]
        assert t["baseline_check"]["checked"]  # the products probe ran (its CPU number means nothing)
    assert "whole cycles of 40" in row[("ours_mvue_refresh40", "fwd_bwd")]["timing"]
    # auto against its own dense products: per grid point the median over rounds of their ms ratio
    fb_rows = {(r["tokens"], r["d_model"], r["variant"]): r["round_ms"] for r in result["paired"]
               if r["phase"] == "fwd_bwd"}
    worst = min(statistics.median(a / b for a, b in zip(fb_rows[(t, d, "ours_mvue_dense_products")],
                                                        fb_rows[(t, d, "auto")]))
                for t, d in {(t, d) for t, d, _ in fb_rows})
    auto = targets["auto_vs_dense_products"]
    assert auto["measured"] == pytest.approx(worst) and auto["complete"]
    assert all(p["source"] == "paired" for p in auto["points"])
    pair = result["gpt_step"]["paired"]
    for key, variant in (("gpt_step", "ours_mvue"), ("gpt_step_all_linears", "ours_mvue_all_linears")):
        by = pair["by_variant"][variant]
        assert by["round_speedups"] == pytest.approx([a / b for a, b in zip(pair["round_ms"]["dense"],
                                                                             pair["round_ms"][variant])])
        dense = min(result["gpt_step"]["variants"]["dense"]["ms"], statistics.median(pair["round_ms"]["dense"]))
        assert targets[key]["measured"] == pytest.approx(dense / statistics.median(pair["round_ms"][variant]))
        assert targets[key]["paired_ratio"] == by["speedup_vs_dense"]
    # no CUDA graph on the CPU: those targets are unmeasured, so not met
    assert targets["auto_vs_dense_products_graph"]["measured"] is None
    assert targets["auto_vs_dense_products_graph"]["status"] == "not measured"
    for name, target in targets.items():
        assert target["threshold"] == THRESHOLDS[name]
        assert target["met"] == (target["status"] == "met")
    last = stdout.strip().splitlines()[-len(targets):]
    assert all(line.startswith("target ") and "SMOKE" in line for line in last)
    assert all(("-> met" in line) == t["met"] for line, t in zip(last, targets.values()))


def test_smoke_compares_the_same_method_on_each_library_against_the_fastest_dense(smoke):
    """cutlass_mvue (the stand-in "torch" for CUTLASS here) beside ours_mvue: each against the fastest dense of
    the run with its TFLOP/s, the rule of the targets, and the two libraries against each other per paired round."""
    result, stdout = smoke
    comparison = result["library_comparison"]
    t_tokens, t_d = SMOKE["target"]
    assert (comparison["tokens"], comparison["d_model"]) == (t_tokens, t_d)
    assert set(comparison["variants"]) == {"ours_mvue", "cutlass_mvue"}
    mvue, target = comparison["variants"]["ours_mvue"], result["targets"]["ffn_fwd_bwd_ours_mvue"]
    assert mvue["speedup"] == target["measured"] and mvue["dense_ms"] == target["dense_ms"]
    flops = 12 * t_tokens * t_d * 4 * t_d
    paired = {(r["variant"], r["phase"]): r for r in result["paired"] if (r["tokens"], r["d_model"]) == (t_tokens, t_d)}
    for variant, c in comparison["variants"].items():
        assert c["backend"] == "torch" and c["variant_source"] == "paired median"
        assert c["variant_ms"] == paired[(variant, "fwd_bwd")]["ms"]
        assert c["speedup"] == pytest.approx(c["dense_ms"] / c["variant_ms"])
        assert c["variant_tflops"] == pytest.approx(flops / (c["variant_ms"] * 1e-3) / 1e12)
        assert c["dense_tflops"] == pytest.approx(flops / (c["dense_ms"] * 1e-3) / 1e12)
    between = comparison["between"]["cutlass_mvue_vs_ours_mvue"]
    rounds = zip(paired[("ours_mvue", "fwd_bwd")]["round_ms"], paired[("cutlass_mvue", "fwd_bwd")]["round_ms"])
    assert between == {"speedup": pytest.approx(statistics.median(a / b for a, b in rounds)), "source": "paired"}
    assert "S-STE + MVUE on each 2:4 library" in stdout and "cutlass_mvue (torch): " in stdout


@pytest.fixture
def missing_cutlass(monkeypatch):
    """A backend name whose factory raises CutlassUnavailable, as "cutlass" does without a Hopper GPU or nvcc."""
    from sparsity_lab.backends import base
    from sparsity_lab.backends.cutlass.build import CutlassUnavailable
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    monkeypatch.setattr(base, "_INSTANCES", {})

    def missing():
        raise CutlassUnavailable("backend 'cutlass' cannot run here: missing nvcc (a test's stand-in)")
    base.register_backend("cutlass_missing", missing)
    return "cutlass_missing"


def test_a_library_that_cannot_run_is_skipped_with_its_reason_never_dropped(missing_cutlass, capsys):
    import dataclasses

    from benchmarks.ffn.cli import benchmark
    from benchmarks.ffn.report import comparison_lines, format_table
    from benchmarks.ffn.settings import Settings
    s = Settings(smoke=True, device=torch.device("cpu"), dtype=torch.bfloat16, tokens=[32], d_models=[16],
                 target=(32, 16), reps=1, warmup=0, budget_s=600.0, graph=False, gpt=None, rounds=1,
                 backends={"cusparselt": "torch", "cusparselt_auto": "torch", "dense_products": "torch",
                           "cutlass": missing_cutlass, "sparse_auto": "torch"})
    result = benchmark(s)
    reason = "backend 'cutlass' cannot run here: missing nvcc (a test's stand-in)"
    assert result["unavailable"] == {"cutlass_mvue": reason}
    assert {"what": "cutlass_mvue (every section)", "reason": reason} in result["skipped"]
    for rows in (result["rows"], result["paired"]):
        skipped = [r for r in rows if r["variant"] == "cutlass_mvue"]
        assert {r["phase"] for r in skipped} == set(PHASES)  # reported, every phase: never dropped
        assert all(r["ms"] is None and r["skipped"] == reason and "error" not in r for r in skipped)
        assert all(r["ms"] > 0 for r in rows if r["variant"] in ("dense", "ours_mvue"))  # the run went on
    assert not any("cutlass" in e["where"] for e in result["errors"])  # a skip, not an error
    comparison = result["library_comparison"]["variants"]
    assert comparison["cutlass_mvue"]["skipped"] == reason and comparison["cutlass_mvue"]["speedup"] is None
    assert comparison["ours_mvue"]["speedup"] > 0
    assert result["library_comparison"]["between"]["cutlass_mvue_vs_ours_mvue"]["speedup"] is None
    assert any(line.startswith("  cutlass_mvue (not built): skipped: backend 'cutlass' cannot run here")
               for line in comparison_lines(result))
    table_rows = [line for line in format_table(result).splitlines() if line.split()[:3] == ["32", "16", "fwd_bwd"]]
    assert len(table_rows) == 1 and "skipped" in table_rows[0]  # the table's cell says it
    assert dataclasses.asdict(s)["backends"]["cutlass"] == missing_cutlass


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only reason")
def test_without_a_gpu_the_cutlass_variant_names_the_reason():
    from benchmarks.ffn.variants import backend_unavailable
    assert "no CUDA GPU" in backend_unavailable("cutlass") and backend_unavailable("torch") is None


def test_smoke_records_the_baseline_and_the_conditions(smoke):
    result, stdout = smoke
    base = result["baseline"]
    assert base["products_probe"]["ms"] > 0 and base["products_probe_end"]["ms"] > 0
    assert base["matmul_probe"]["shape"] == [SMOKE["target"][0], SMOKE["target"][1], 4 * SMOKE["target"][1]]
    assert base["dense_alone_ms"] > 0
    cond = result["conditions"]
    assert cond["source"].startswith("none") and "baseline (start)" in cond["sections"]
    assert "GPU conditions" in stdout


def _rows(values: dict) -> list[dict]:
    """Rows {(tokens, d, variant, phase): ms}."""
    return [{"tokens": t, "d_model": d, "ffn": 4 * d, "variant": v, "phase": p, "ms": ms, "speedup_vs_dense": None}
            for (t, d, v, p), ms in values.items()]


def _paired(values: dict) -> list[dict]:
    """Paired rows {(tokens, d, variant, phase): [round ms]}, with the ratios as measure_paired makes them."""
    rows = []
    for (t, d, v, p), rms in values.items():
        dense = values[(t, d, "dense", p)]
        ratios = [a / b for a, b in zip(dense, rms)]
        rows.append({"tokens": t, "d_model": d, "ffn": 4 * d, "variant": v, "phase": p, "round_ms": rms,
                     "ms": statistics.median(rms), "round_speedups": ratios,
                     "speedup_vs_dense": statistics.median(ratios), "speedup_min": min(ratios),
                     "speedup_max": max(ratios)})
    return rows


TARGET = (16384, 4096)
FLOPS = 12 * 16384 * 4096 * 16384  # one FFN step's products at the target shape


def _baseline(dense_alone_ms: float, probe_ms: float) -> dict:
    return {"dense_alone_ms": dense_alone_ms, "products_probe": {"ms": probe_ms, "tflops": FLOPS / probe_ms / 1e9}}


def test_the_headline_uses_the_fastest_dense_of_the_run():
    rows = _rows({(*TARGET, "dense", "fwd_bwd"): 20.0, (*TARGET, "ours_mvue", "fwd_bwd"): 14.0})
    paired = _paired({(*TARGET, "dense", "fwd_bwd"): [20.2, 20.4, 20.0], (*TARGET, "ours_mvue", "fwd_bwd"): [14.0, 14.2, 13.9]})
    t = judge_targets(rows, None, TARGET, [TARGET], paired, None, _baseline(19.1, 18.4))["ffn_fwd_bwd_ours_mvue"]
    assert t["dense_source"] == "alone" and t["dense_ms"] == 19.1 and t["variant_ms"] == 14.0
    assert t["measured"] == pytest.approx(19.1 / 14.0) and t["status"] == "missed"  # 1.364 < 1.40
    assert t["paired_ratio"] == pytest.approx(statistics.median([20.2 / 14.0, 20.4 / 14.2, 20.0 / 13.9]))
    assert t["against_each_dense"]["alternation"] == pytest.approx(20.2 / 14.0)
    assert t["dense_tflops"] == pytest.approx(FLOPS / 19.1 / 1e9)
    assert t["baseline_check"]["fraction"] == pytest.approx(18.4 / 19.1) and not t["baseline_check"]["flagged"]
    # a faster variant meets it; dense in alternation faster than alone: that one is the baseline
    paired = _paired({(*TARGET, "dense", "fwd_bwd"): [18.9, 19.0, 19.2], (*TARGET, "ours_mvue", "fwd_bwd"): [13.2, 13.3, 13.4]})
    t = judge_targets(rows, None, TARGET, [TARGET], paired, None, _baseline(19.1, 18.4))["ffn_fwd_bwd_ours_mvue"]
    assert t["dense_source"] == "alternation" and t["measured"] == pytest.approx(19.0 / 13.3) and t["met"]


def test_a_slow_dense_baseline_is_flagged_not_met():
    rows = _rows({(*TARGET, "dense", "fwd_bwd"): 21.5, (*TARGET, "ours_mvue", "fwd_bwd"): 14.0})
    # the fastest dense (21.5 ms) runs at 18.4 / 21.5 = 86 % of its products' start-of-run rate
    t = judge_targets(rows, None, TARGET, [TARGET], None, None, _baseline(None, 18.4))["ffn_fwd_bwd_ours_mvue"]
    assert t["measured"] == pytest.approx(21.5 / 14.0) and t["measured"] >= t["threshold"]
    assert t["status"] == "flagged" and not t["met"] and not t["recorded"]
    assert t["baseline_check"]["flagged"] and t["variant_source"] == "grid"


def test_refresh_interval_40_target():
    rows = _rows({(*TARGET, "dense", "fwd_bwd"): 19.0, (*TARGET, "ours_mvue_refresh40", "fwd_bwd"): 13.0})
    t = judge_targets(rows, None, TARGET, [TARGET], None, None, _baseline(None, 18.4))["ffn_fwd_bwd_refresh40"]
    assert t["measured"] == pytest.approx(19.0 / 13.0) and t["met"] and THRESHOLDS["ffn_fwd_bwd_refresh40"] == 1.45


def test_auto_against_the_dense_products_of_the_same_method():
    grid = [(8, 16), (8, 32)]
    rows = [{"tokens": 8, "d_model": d, "ffn": 4 * d, "variant": v, "phase": "fwd_bwd", "ms": ms,
             "speedup_vs_dense": None}
            for d, v, ms in ((16, "auto", 1.0), (16, "ours_mvue_dense_products", 0.98),
                             (32, "auto", 2.0), (32, "ours_mvue_dense_products", 3.0))]
    t = judge_targets(rows, None, (8, 32), grid)["auto_vs_dense_products"]
    assert t["measured"] == pytest.approx(0.98) and t["met"] and t["complete"]
    rows[1]["ms"] = 0.9  # auto 10 % slower than the dense products at one point
    t = judge_targets(rows, None, (8, 32), grid)["auto_vs_dense_products"]
    assert t["measured"] == pytest.approx(0.9) and not t["met"]
    t = judge_targets(rows[:2], None, (8, 32), grid)["auto_vs_dense_products"]  # one point not measured
    assert not t["complete"] and not t["met"]


def test_auto_under_graph_replay_is_judged_from_the_graph_rows():
    grid = [(8, 1024), (8, 2048), (8, 4096)]
    graph = [{"tokens": 8, "d_model": d, "variant": v, "mode": m, "ms": ms}
             for d, v, m, ms in ((1024, "dense", "graph", 1.0), (1024, "auto", "graph", 1.2),  # 0.83: below 2048
                                 (1024, "ours_mvue_dense_products", "graph", 1.25),
                                 (2048, "dense", "graph", 2.0), (2048, "auto", "graph", 2.04),
                                 (2048, "ours_mvue_dense_products", "graph", 2.1), (2048, "auto", "eager", 9.0),
                                 (4096, "dense", "graph", 4.0), (4096, "auto", "graph", 3.0),
                                 (4096, "ours_mvue_dense_products", "graph", 4.2))]
    t = judge_targets([], None, (8, 4096), grid, None, graph)
    vs_dense = t["auto_vs_dense_graph_from_2048"]
    assert vs_dense["measured"] == pytest.approx(2.0 / 2.04) and vs_dense["met"] and vs_dense["grid_points"] == 2
    vs_products = t["auto_vs_dense_products_graph"]
    assert vs_products["measured"] == pytest.approx(2.1 / 2.04) and vs_products["met"] and vs_products["complete"]
    t = judge_targets([], None, (8, 4096), grid, None, graph[:7])["auto_vs_dense_graph_from_2048"]
    assert not t["complete"] and not t["met"]


def test_auto_at_refresh_10_is_judged_against_dense_at_every_grid_point():
    grid = [(8, 1024), (8, 2048)]
    graph = [{"tokens": 8, "d_model": d, "variant": v, "mode": m, "ms": ms}
             for d, v, m, ms in ((1024, "dense", "graph", 1.0), (1024, "auto_refresh10", "graph", 1.02),
                                 (1024, "auto", "graph", 1.3), (1024, "auto_refresh10", "eager", 0.5),
                                 (2048, "dense", "graph", 2.0), (2048, "auto_refresh10", "graph", 1.6))]
    t = judge_targets([], None, (8, 2048), grid, None, graph)["auto_refresh10_vs_dense_graph"]
    assert t["measured"] == pytest.approx(1.0 / 1.02) and t["met"] and t["complete"]  # the eager row is not used
    graph[1]["ms"] = 1.1  # 0.91x at d_model 1024: every point counts here, 1024 too
    t = judge_targets([], None, (8, 2048), grid, None, graph)["auto_refresh10_vs_dense_graph"]
    assert t["measured"] == pytest.approx(1.0 / 1.1) and not t["met"]
    t = judge_targets([], None, (8, 2048), grid, None, graph[:4])["auto_refresh10_vs_dense_graph"]
    assert not t["complete"] and not t["met"] and THRESHOLDS["auto_refresh10_vs_dense_graph"] == 0.97


def test_gpt_targets_ffn_only_and_all_linears():
    gpt = {"config": {"d_model": 4096}, "tokens_per_step": 16384, "dense_flops_per_token": 1e9,
           "variants": {"dense": {"ms": 100.0}, "ours_mvue": {"ms": 85.0, "speedup_vs_dense": 100 / 85},
                        "ours_mvue_all_linears": {"ms": 80.0, "speedup_vs_dense": 100 / 80}},
           "paired": {"dense_ms": 102.0, "by_variant": {
               "ours_mvue": {"ms": 82.0, "speedup_vs_dense": 1.24, "speedup_min": 1.2, "speedup_max": 1.3,
                             "round_speedups": [1.2, 1.24, 1.3]},
               "ours_mvue_all_linears": {"ms": 78.0, "speedup_vs_dense": 1.31, "speedup_min": 1.3,
                                         "speedup_max": 1.32, "round_speedups": [1.3, 1.31, 1.32]}}}}
    t = judge_targets([], gpt, TARGET, [TARGET])
    assert t["gpt_step"]["measured"] == pytest.approx(100 / 82) and t["gpt_step"]["met"]  # 1.22 >= 1.20
    assert t["gpt_step"]["dense_source"] == "alone" and t["gpt_step"]["paired_ratio"] == 1.24
    assert t["gpt_step_all_linears"]["measured"] == pytest.approx(100 / 78) and not t["gpt_step_all_linears"]["met"]
    assert t["gpt_step"]["dense_tflops"] == pytest.approx(1e9 * 16384 / 0.1 / 1e12)


def test_judge_targets_counts_missing_measurements_as_not_met():
    t = judge_targets([], None, TARGET, [TARGET])
    assert all(v["status"] == "not measured" and not v["met"] for k, v in t.items()), t


def test_timing_over_whole_refresh_cycles_keeps_the_refresh():
    """A step that costs 20 ms once every 40 calls: the median of single calls hides it, the cycle mean not."""
    import time

    from benchmarks.ffn.measure import cycle_ms, median_ms
    from benchmarks.ffn.settings import Settings
    calls = []

    def step():
        calls.append(1)
        if len(calls) % 40 == 0:
            time.sleep(0.02)
    s = Settings(smoke=True, device=torch.device("cpu"), dtype=torch.float32, tokens=[8], d_models=[16],
                 target=(8, 16), reps=10, warmup=0, budget_s=1.0, graph=False, gpt=None, backends={})
    assert cycle_ms(step, s, 40) >= 0.4  # 20 ms / 40 calls, at least
    calls.clear()
    assert median_ms(step, s) < 0.4
    with pytest.raises(ValueError, match="cycle"):
        cycle_ms(step, s, 0)


def test_every_block_linear_selector():
    from benchmarks.ffn.gpt import is_block_linear, variant_selection
    for name in ("blocks.0.attn.qkv", "blocks.11.attn.proj", "blocks.3.mlp.fc", "blocks.3.mlp.proj"):
        assert is_block_linear(name, None), name
    for name in ("lm_head", "blocks.0.ln1", "blocks.0.attn", "tok_emb"):
        assert not is_block_linear(name, None), name
    assert variant_selection("ours_mvue_all_linears") == ("ours_mvue", is_block_linear)
    assert variant_selection("ours_mvue") == ("ours_mvue", None)


def test_spent_budget_skips_everything_and_says_so(tmp_path, capsys):
    assert bench_main(["ffn", "--smoke", "--budget-s", "1e-9", "--out-dir", str(tmp_path), "--name", "b"]) == 0
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["rows"] == [] and result["gpt_step"] is None and result["graph"] == [] and result["paired"] == []
    skipped = {s["what"] for s in result["skipped"]}
    assert {"baseline", "ffn 32x32", "ffn 32x16", "paired 32x32", "paired 32x16", "gpt_step", "graph 32x32",
            "graph 32x16"} == skipped
    assert not any(t["met"] for t in result["targets"].values())
    assert "not measured" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--reps", "0"], "--reps"),
    (["--d-model", "20"], "multiples of 16"),
    (["--tokens", "0"], "--tokens"),
    (["--budget-s", "0"], "--budget-s"),
    (["--warmup", "-1"], "--warmup"),
    (["--rounds", "-1"], "--rounds"),
    (["--idle-s", "-1"], "--idle-s"),
])
def test_bad_arguments_name_the_flag(argv, message, tmp_path, capsys):
    assert exit_status(bench_main, ["ffn", "--smoke", "--out-dir", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_dense_baseline_experiment_runs_every_section(tmp_path, capsys):
    """``python -m benchmarks.ffn.baseline --smoke``: every section, the per-turn order and the
    first-call figures (the CPU numbers mean nothing)."""
    from benchmarks.ffn.baseline import dense_ms_by_section, ffn_step_flops, main as baseline_main
    assert baseline_main(["--smoke", "--calls", "2", "--rounds", "3", "--round-calls", "2",
                          "--out-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "ffn_baseline_smoke.json").read_text())
    expected = {"probe_start", "alone_fresh", "sustained", "alone_resident", "alternation", "alternation_empty",
                "alternation_idle", "alternation_long", "alone_after", "probe_end"}
    assert set(result["sections"]) == expected and set(result["conditions"]["sections"]) == expected
    alt = result["sections"]["alternation"]
    assert set(alt) == {"dense", "ours_mvue", "ours_mvue_dense_products"}
    assert alt["dense"]["position"] == [0, 2, 1]  # the order rotates every round
    assert all(len(turn) == 2 for turn in alt["dense"]["turns"])
    assert all(len(turn) == 10 for turn in result["sections"]["alternation_long"]["dense"]["turns"])
    table = dense_ms_by_section(result)
    assert table["alternation (first call of a turn)"] == statistics.median(t[0] for t in alt["dense"]["turns"])
    assert result["step_flops"] == ffn_step_flops(32, 16, 64) == 12 * 32 * 16 * 64
    assert "dense FFN step" in capsys.readouterr().out


def test_the_reader_knows_every_variant_the_writer_records():
    from benchmarks.ffn.schema import KNOWN_VARIANTS
    from sparsity_lab.course.viz.speedup_view import FFN_VARIANTS
    assert set(FFN_VARIANTS) == set(KNOWN_VARIANTS) and len(FFN_VARIANTS) == len(KNOWN_VARIANTS)


def test_the_graphed_step_computes_dx_like_the_eager_step():
    """CudaGraphStep detaches its inputs: benchmarks ffn's graphed step holds x as a parameter (InputHeld), so
    its backward computes dx as the eager step does (checked here eagerly on the CPU, same module)."""
    from benchmarks.ffn.graph import InputHeld
    from benchmarks.ffn.variants import FFN
    torch.manual_seed(0)
    model = FFN(16, 64, torch.device("cpu"), torch.float64)
    x, dy = torch.randn(8, 16, dtype=torch.float64), torch.randn(8, 16, dtype=torch.float64)
    held = InputHeld(model, x)
    assert any(p is held.x for p in held.parameters())  # CudaGraphStep keeps the grads of parameters
    held(dy).backward()
    xx = x.clone().requires_grad_(True)
    model.zero_grad()
    model(xx).backward(dy)
    assert torch.allclose(held.x.grad, xx.grad)


def test_graph_section_mask_refresh_mode_is_an_option_and_recorded():
    import argparse

    from benchmarks.ffn.cli import add_arguments, settings_from_args
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert settings_from_args(parser.parse_args(["--smoke"])).masks_in_graph is True
    assert settings_from_args(parser.parse_args(["--smoke", "--no-masks-in-graph"])).masks_in_graph is False


def _decision(dense_ms, **library_ms):
    return {"product": "forward", "dense_ms": dense_ms, "library_ms": library_ms}


def test_product_ceilings_follow_amdahl_over_each_librarys_products():
    from benchmarks.ffn.targets import product_ceilings
    shapes = [{"tokens": 64, "d_model": 16, "backends": {"sparse_auto": {"decisions": [
        _decision(3.0, cusparselt=2.0, cutlass=2.5), _decision(3.0, cusparselt=2.0, cutlass=1.5),
        _decision(2.0, cusparselt=1.0)]}}}]  # CUTLASS could not run the third: no ceiling for it
    out = product_ceilings(shapes, (64, 16), dense_step_ms=10.0)
    assert set(out) == {"cusparselt"}
    c = out["cusparselt"]
    # the dense step's other work (10 - 8 = 2 ms) kept, the products at 5 ms: 10 / 7
    assert c["ceiling"] == pytest.approx(10.0 / 7.0)
    assert c["products_ms"] == pytest.approx(5.0) and c["dense_products_ms"] == pytest.approx(8.0)
    assert c["products_speedup"] == pytest.approx(1.6) and c["products"] == 3
    assert product_ceilings(shapes, (32, 16), dense_step_ms=10.0) == {}  # another shape: none
    assert product_ceilings(shapes, (64, 16), dense_step_ms=None) == {}
    assert product_ceilings(None, (64, 16), dense_step_ms=10.0) == {}


def test_the_comparison_prints_each_variants_ceiling():
    from benchmarks.ffn.report import comparison_lines
    ceiling = {"ceiling": 1.3, "products_ms": 5.0, "dense_products_ms": 8.0, "products": 3, "dense_step_ms": 10.0,
               "products_speedup": 1.6}
    result = {"smoke": False, "library_comparison": {
        "tokens": 64, "d_model": 16, "between": {},
        "variants": {"ours_mvue": {"backend": "cusparselt", "speedup": 1.25, "variant_ms": 8.0, "variant_source": "grid",
                                   "variant_tflops": 100.0, "dense_ms": 10.0, "dense_source": "grid",
                                   "dense_tflops": 80.0, "ceiling": 1.3}},
        "ceilings": {"cusparselt": ceiling}}}
    lines = comparison_lines(result)
    assert lines[1].endswith("; ceiling of its products 1.30x")
    assert lines[-1].startswith("  ceiling on cusparselt: 1.30x (its 3 products 5.00 ms, 1.60x")
