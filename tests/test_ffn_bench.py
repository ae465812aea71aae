"""``sparsity-lab bench-ffn``: the script's plumbing on the CPU (``--smoke``), its JSON schema, and that
the targets are judged from the measured rows. No speed is asserted here (smoke numbers mean nothing)."""
import json
import math

import pytest

import statistics

from sparsity_lab.benchmarks.ffn.schema import GPT_VARIANTS, GRAPH_VARIANTS, PAIRED_VARIANTS, PHASES, VARIANTS
from sparsity_lab.benchmarks.ffn.settings import SMOKE
from sparsity_lab.benchmarks.ffn.targets import THRESHOLDS, judge_targets
from sparsity_lab.cli import main

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
        status = main(["bench-ffn", "--smoke", "--out-dir", str(out)])
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
    assert result["backends"] == {"cusparselt": "torch", "cusparselt_auto": "torch", "dense_products": "torch"}
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
        if row["variant"].startswith("ours") or row["variant"] == "auto":
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
        if name != "dense":
            assert record["sparse_layers"] == 2 * SMOKE["gpt"]["n_layer"]


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
    # at the target shape the paired rounds decide; the grid's single figure is kept as "unpaired"
    fb, fw = targets["ffn_fwd_bwd_ours_mvue"], targets["ffn_fwd_ours"]
    assert fb["measured"] == paired[("ours_mvue", "fwd_bwd")]["speedup_vs_dense"]
    assert fb["unpaired"] == row[("ours_mvue", "fwd_bwd")]["speedup_vs_dense"] and "paired" in fb["source"]
    assert fw["measured"] == paired[("ours_mvue", "fwd")]["speedup_vs_dense"]
    # auto's two targets: per grid point the median over rounds of (dense or dense-products ms) / auto ms
    fb_rows = {(r["tokens"], r["d_model"], r["variant"]): r["round_ms"] for r in result["paired"]
               if r["phase"] == "fwd_bwd"}
    for key, numerator in (("auto_every_grid_point", "dense"), ("auto_vs_dense_products", "ours_mvue_dense_products")):
        worst = min(statistics.median(a / b for a, b in zip(fb_rows[(t, d, numerator)], fb_rows[(t, d, "auto")]))
                    for t, d in {(t, d) for t, d, _ in fb_rows})
        assert targets[key]["measured"] == pytest.approx(worst) and targets[key]["complete"]
        assert all(p["source"] == "paired" for p in targets[key]["points"])
    pair = result["gpt_step"]["paired"]
    assert pair["round_speedups"] == pytest.approx([a / b for a, b in zip(pair["round_ms"]["dense"],
                                                                           pair["round_ms"]["ours_mvue"])])
    assert targets["gpt_step"]["measured"] == pair["speedup_vs_dense"] == statistics.median(pair["round_speedups"])
    assert targets["gpt_step"]["unpaired"] == result["gpt_step"]["variants"]["ours_mvue"]["speedup_vs_dense"]
    # no CUDA graph on the CPU: that target is unmeasured, so not met
    assert targets["auto_every_grid_point_graph"]["measured"] is None
    for name, target in targets.items():
        assert target["threshold"] == THRESHOLDS[name]
        assert target["met"] == (target["measured"] is not None and target["measured"] >= target["threshold"])
    last = stdout.strip().splitlines()[-len(targets):]
    assert all(line.startswith("target ") and "SMOKE" in line for line in last)
    assert all(("-> met" in line) == t["met"] for line, t in zip(last, targets.values()))


def _rows(values: dict) -> list[dict]:
    """Rows with speed-ups {(tokens, d, variant, phase): speedup}."""
    return [{"tokens": t, "d_model": d, "ffn": 4 * d, "variant": v, "phase": p, "ms": 1.0, "speedup_vs_dense": x}
            for (t, d, v, p), x in values.items()]


def test_judge_targets_follows_the_numbers():
    grid = [(8, 16), (8, 32)]
    values = {(8, 32, "ours_mvue", "fwd_bwd"): 1.40, (8, 32, "ours_mvue", "fwd"): 1.49,
              (8, 16, "auto", "fwd_bwd"): 0.98, (8, 32, "auto", "fwd_bwd"): 1.2}
    gpt = {"config": {"d_model": 32}, "variants": {"ours_mvue": {"speedup_vs_dense": 1.16}}}
    t = judge_targets(_rows(values), gpt, (8, 32), grid)
    # no ours_mvue_dense_products rows: the auto-vs-dense-products target is unmeasured, so not met
    assert [t[k]["met"] for k in THRESHOLDS] == [True, False, True, False, False, True]
    assert t["ffn_fwd_bwd_ours_mvue"]["measured"] == 1.40 and t["auto_every_grid_point"]["measured"] == 0.98

    values[(8, 32, "ours_mvue", "fwd_bwd")] = 1.34
    values[(8, 32, "ours_mvue", "fwd")] = 1.5
    values[(8, 16, "auto", "fwd_bwd")] = 0.96
    gpt["variants"]["ours_mvue"]["speedup_vs_dense"] = 1.14
    t = judge_targets(_rows(values), gpt, (8, 32), grid)
    assert [t[k]["met"] for k in THRESHOLDS] == [False, True, False, False, False, False]


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


def test_auto_under_graph_replay_is_judged_from_the_graph_rows():
    grid = [(8, 16), (8, 32)]
    graph = [{"tokens": 8, "d_model": d, "variant": v, "mode": m, "ms": ms}
             for d, v, m, ms in ((16, "dense", "graph", 1.0), (16, "auto", "graph", 1.02), (16, "auto", "eager", 9.0),
                                 (32, "dense", "graph", 2.0), (32, "auto", "graph", 1.5))]
    t = judge_targets([], None, (8, 32), grid, None, graph)["auto_every_grid_point_graph"]
    assert t["measured"] == pytest.approx(1 / 1.02) and t["met"] and t["complete"]
    t = judge_targets([], None, (8, 32), grid, None, graph[:3])["auto_every_grid_point_graph"]
    assert not t["complete"] and not t["met"]


def test_paired_rounds_decide_the_target_shape():
    grid = [(8, 32)]
    rows = _rows({(8, 32, "ours_mvue", "fwd_bwd"): 1.2, (8, 32, "ours_mvue", "fwd"): 1.4})
    paired = [{"tokens": 8, "d_model": 32, "variant": "ours_mvue", "phase": "fwd_bwd", "speedup_vs_dense": 1.36,
               "round_speedups": [1.3, 1.36, 1.4], "speedup_min": 1.3, "speedup_max": 1.4}]
    t = judge_targets(rows, None, (8, 32), grid, paired)
    assert t["ffn_fwd_bwd_ours_mvue"]["measured"] == 1.36 and t["ffn_fwd_bwd_ours_mvue"]["met"]
    assert t["ffn_fwd_bwd_ours_mvue"]["unpaired"] == 1.2
    assert t["ffn_fwd_ours"]["measured"] == 1.4 and t["ffn_fwd_ours"]["source"] == "grid"


def test_judge_targets_counts_missing_measurements_as_not_met():
    grid = [(8, 16), (8, 32)]
    values = {(8, 32, "auto", "fwd_bwd"): 1.5, (8, 16, "auto", "fwd_bwd"): None}  # one auto point failed
    t = judge_targets(_rows(values), None, (8, 32), grid)
    assert t["ffn_fwd_bwd_ours_mvue"]["measured"] is None and not t["ffn_fwd_bwd_ours_mvue"]["met"]
    auto = t["auto_every_grid_point"]
    assert auto["measured"] == 1.5 and not auto["complete"] and not auto["met"]
    assert auto["grid_points_measured"] == 1 and auto["grid_points"] == 2
    assert t["gpt_step"]["measured"] is None and not t["gpt_step"]["met"]


def test_spent_budget_skips_everything_and_says_so(tmp_path, capsys):
    assert main(["bench-ffn", "--smoke", "--budget-s", "1e-9", "--out-dir", str(tmp_path), "--name", "b"]) == 0
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["rows"] == [] and result["gpt_step"] is None and result["graph"] == [] and result["paired"] == []
    skipped = {s["what"] for s in result["skipped"]}
    assert {"ffn 32x32", "ffn 32x16", "paired 32x32", "paired 32x16", "gpt_step", "graph 32x32",
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
])
def test_bad_arguments_name_the_flag(argv, message, tmp_path, capsys):
    assert main(["bench-ffn", "--smoke", "--out-dir", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err
