"""``python -m benchmarks compile`` and ``python -m benchmarks export``: the plumbing on the CPU (``--smoke``) and the JSON they write. No speed
is asserted (smoke numbers mean nothing); the recorded H100 files are checked for the same schema."""
import json
import math
from pathlib import Path

import pytest

from benchmarks.compile_speed import VARIANTS
from benchmarks.__main__ import main as bench_main

RESULTS = Path(__file__).resolve().parent.parent / "results"


def check_compile(data):
    for part in ("ffn", "gpt_step"):
        section = data[part]
        assert set(section["variants"]) == set(VARIANTS)
        fastest = section["fastest_dense"]
        assert fastest.startswith("dense") and section["variants"][fastest]["speedup_vs_fastest_dense"] == 1.0
        assert section["fastest_dense_tflops"] > 0
        for name, rec in section["variants"].items():
            assert rec["ms"] > 0 and rec["tokens_per_s"] > 0, name
        for kind in ("dense", "sparse"):
            rec = section["variants"][f"{kind}_compiled"]
            assert math.isclose(rec["compiled_vs_eager"], section["variants"][f"{kind}_eager"]["ms"] / rec["ms"])


def check_export(data):
    dense, sparse = data["variants"]["dense"], data["variants"]["sparse_exported"]
    assert dense["prefill_tflops"] > 0 and sparse["prefill_tokens_per_s"] > 0
    assert math.isclose(sparse["prefill_speedup_vs_dense"], dense["prefill_ms"] / sparse["prefill_ms"])
    assert set(sparse["decode_ms_per_token"]) == {str(b) for b in data["config"]["decode_batches"]}


@pytest.mark.parametrize("command,check", [("compile", check_compile), ("export", check_export)])
def test_smoke_run_writes_its_json(tmp_path, command, check, capsys):
    out = tmp_path / "bench.json"
    assert bench_main([command, "--smoke", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["smoke"] is True and data["errors"] == {} and data["provenance"]["command"]
    check(data)
    assert f"wrote {out}" in capsys.readouterr().out


def test_recorded_h100_files_have_the_schema():
    compiled = json.loads((RESULTS / "compile_h100.json").read_text())
    exported = json.loads((RESULTS / "export_h100.json").read_text())
    for data in (compiled, exported):
        assert data["smoke"] is False and "H100" in data["provenance"]["gpu"] and data["errors"] == {}
    check_compile(compiled)
    check_export(exported)
    assert exported["variants"]["sparse_exported"]["export"]["kernels"] == ["Sparse24Linear (cusparselt)"]
