"""benchmarks.step_host: an eager step's host time beside its wall time, and cProfile's ranking, on the CPU."""
import json

import pytest

from benchmarks.__main__ import main as bench_main


def test_smoke_run_records_host_and_wall_time_and_the_ranked_functions(tmp_path):
    status = bench_main(["step-host", "--smoke", "--runs", "bf16w:dense", "bf16w:all24", "--out-dir", str(tmp_path),
                         "--name", "host", "--top", "40"])
    assert status == 0
    result = json.loads((tmp_path / "host.json").read_text())
    assert result["smoke"] and "torch" in result["provenance"]
    assert [(r["mode"], r["config"]) for r in result["records"]] == [("bf16w", "dense"), ("bf16w", "all24")]
    for r in result["records"]:
        # the CPU runs synchronously: enqueueing is the step, so host and wall agree
        assert 0 < r["host_ms"] <= r["wall_ms"] * 1.01
        assert len(r["top_self"]) == 40 and len(r["top_cumulative"]) == 40
        own = [row["tottime_s"] for row in r["top_self"]]
        assert own == sorted(own, reverse=True) and all(row["calls"] > 0 for row in r["top_self"])
    # the 2:4 step's ranking reaches the layers' code
    assert any("sparsity_lab" in row["function"] for row in result["records"][1]["top_cumulative"])


def test_bad_runs_are_named_before_any_work(capsys):
    for runs, words in (("bf16w:every", "--runs"), ("fast:dense", "--modes"), ("bf16w+fp8:all24", "CUDA GPU")):
        with pytest.raises(SystemExit) as exit_:
            bench_main(["step-host", "--smoke", "--runs", runs])
        assert exit_.value.code == 2 and words in capsys.readouterr().err
