"""``benchmarks dist`` with the options of ``step-profile`` (every block linear 2:4, a refresh interval, fused
AdamW, bf16 weights with float32 masters), at world size 1 on the CPU: the plumbing, no speed asserted."""
import json
import subprocess
import sys

from benchmarks.distributed_speed import speedups


def test_the_step_profile_options_run_under_ddp_and_fsdp(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.distributed_speed", "--smoke", "--methods", "dense",
                           "sste_mvue_all", "--bf16-weights", "--fused-adamw", "--mask-refresh-interval", "2",
                           "--out-dir", str(tmp_path), "--name", "dist"],
                          capture_output=True, text=True, timeout=600)  # its own process: it sets RANK etc.
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "dist.json").read_text())
    assert result["errors"] == [] and result["settings"]["bf16_weights"] and result["settings"]["fused_adamw"]
    assert {(r["method"], r["parallel"]) for r in result["rows"]} == {
        (m, p) for m in ("dense", "sste_mvue_all") for p in ("none", "ddp", "fsdp")}
    for row in result["rows"]:
        assert row["max_loss_diff_vs_none"] < 1e-2, row  # bf16 weights under every wrapper follow the unwrapped run
    assert set(result["speedups"]) == {"none", "ddp", "fsdp"} and "over dense" in done.stdout


def test_speedups_pair_each_method_with_the_dense_of_its_mode():
    rows = [{"method": "dense", "parallel": "ddp", "median_step_s": 0.2},
            {"method": "sste_mvue", "parallel": "ddp", "median_step_s": 0.16},
            {"method": "sste_mvue", "parallel": "fsdp", "median_step_s": 0.1}]
    assert speedups(rows) == {"ddp": {"sste_mvue": 0.2 / 0.16}}
