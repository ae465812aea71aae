"""The kernel benchmark script runs end to end (tiny sizes, CPU interpreter) and writes its JSON."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.triton  # the benchmark runs the Triton kernels


def test_bench_kernels_smoke_run_checks_every_kernel_and_writes_json(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-m", "benchmarks", "kernels", "--smoke", "--out-dir", str(tmp_path),
                          "--name", "smoke"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-1].startswith("worst fraction of the copy ceiling")
    assert out.stdout.count("check ") >= 12 and "FAILED" not in out.stdout
    result = json.loads((tmp_path / "smoke.json").read_text())
    assert result["smoke"] is True and "provenance" in result
    kernels = {row["kernel"] for row in result["rows"]}
    assert {"1 prune24", "2 transposable24", "3 soft_threshold24", "4 mvue24", "5 masked_decay_", "6 gated",
            "7 fp8", "16 relu2", "21 refresh24"} <= kernels


def test_bench_kernels_only_runs_the_named_sections_and_names_its_file(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "benchmarks", "kernels", "--smoke", "--out-dir", str(tmp_path)]
    out = subprocess.run(cmd + ["--only", "16"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "check relu2 forward and backward: ok" in out.stdout
    result = json.loads((tmp_path / "kernels_h100_only_16.json").read_text())
    assert result["sections"] == ["16. squared ReLU"] and {row["kernel"] for row in result["rows"]} == {"16 relu2"}
    assert {row["variant"] for row in result["rows"]} >= {"forward + backward", "backward (read h, dy, write dh)"}
    bad = subprocess.run(cmd + ["--only", "16,99"], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "unknown: 99" in bad.stderr and "usage:" in bad.stderr  # refused before any work
