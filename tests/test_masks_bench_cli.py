"""``python -m benchmarks masks --quick``: runs, prints the table and targets, writes the JSON."""
import json

from benchmarks.__main__ import main as bench_main

from sparsity_lab.masks import SOLVERS


def test_bench_masks_quick(tmp_path, capsys):
    rc = bench_main(["masks", "--quick", "--repeats", "1", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "target 2:4 exact on 128x128 < 1 s: patterns" in out
    assert "target 4:8 exact on 64x64 < 30 s: flow" in out
    data = json.loads((tmp_path / "mask_solvers_cpu.json").read_text())
    assert data["provenance"]["torch"] and data["quick"] is True
    assert [(c["n"], c["m"], c["size"]) for c in data["cases"]] == [(2, 4, 128), (4, 8, 64)]
    for case in data["cases"]:
        assert case["exact_kept_fraction_spread"] < 1e-6 and case["target_met"] in (True, False)
    rows = data["rows"]
    solvers_24 = [r["solver"] for r in rows if r["m"] == 4]
    solvers_48 = [r["solver"] for r in rows if r["m"] == 8]
    assert solvers_24 == list(SOLVERS) + ["rowwise"]
    assert solvers_48 == [s for s in SOLVERS if s != "patterns"] + ["rowwise"]
    for r in rows:
        assert r["runs"] == 1 and r["median_s"] > 0 and len(r["times_s"]) == 1
        assert r["solver"] in out
        if r["exact"] and r["transposable"]:
            assert abs(r["relative_to_optimum"] - 1.0) < 1e-7
        else:
            assert 0.5 < r["relative_to_optimum"]
    rowwise = {r["m"]: r["kept_fraction"] for r in rows if r["solver"] == "rowwise"}
    assert all(r["kept_fraction"] <= rowwise[r["m"]] for r in rows)


def test_bench_masks_solver_subset(tmp_path, capsys):
    rc = bench_main(["masks", "--quick", "--repeats", "1", "--solvers", "greedy", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "auto solver patterns not run" in out  # no target verdict without the exact solver
    rows = json.loads((tmp_path / "mask_solvers_cpu.json").read_text())["rows"]
    assert {r["solver"] for r in rows} == {"greedy", "rowwise"}
    # relative_to_optimum still against the exact optimum (computed untimed)
    assert all(0.9 < r["relative_to_optimum"] < 1.0 for r in rows if r["solver"] == "greedy")
