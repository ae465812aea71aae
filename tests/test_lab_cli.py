"""The lab's commands: train (and resume), decay-search, compare's figures; clear errors for bad input."""
import json

import pytest
from _lab_testing import CLI_TINY, cli_code, tiny_corpus_file

from sparsity_lab.lab.cli import main
from sparsity_lab.lab.runlog import read_log

TINY = CLI_TINY


@pytest.fixture
def text(tmp_path):
    return tiny_corpus_file(tmp_path)


def test_train_stop_and_resume_via_cli(tmp_path, text, capsys):
    out = tmp_path / "run"
    args = ["train", "--method", "sste", "--mvue", "--data", text, "--steps", "6", "--eval-interval", "3",
            "--out", str(out), *TINY]
    assert main([*args, "--stop-at", "4"]) == 0
    assert [r["step"] for r in read_log(out / "log.jsonl")] == [1, 2, 3, 4]
    assert main(["train", "--resume", str(out / "checkpoint.pt"), "--no-progress"]) == 0
    assert "resumed" in capsys.readouterr().out
    rows = read_log(out / "log.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 7))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 6 and summary["config"]["method_options"] == {"mvue": True}
    assert summary["final_val_loss"] == rows[-1]["val_loss"]
    # an existing run is not silently overwritten
    assert main(args) == 2
    assert "already holds a run" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--method", "sgd"], "unknown method 'sgd'"),
    (["--width", "30", "--heads", "3"], "d_model=30 is not divisible by 4"),
    (["--ffn-hidden", "42", "--transposable"], "FFN hidden width=42 is not divisible by 4"),
    (["--method", "ste", "--decay", "1e-4"], "does not take option"),
    (["--data", "/no/such/path"], "argument --data: expected an existing file or folder, got '/no/such/path'"),
    (["--fp8-sim", "--backend", "fp8_dense"],
     "--fp8-sim with --backend: backend must be one that FP8 simulation wraps"),
    (["--backend", "foo"], "argument --backend: expected one of"),
])
def test_train_errors_are_one_clear_line(tmp_path, text, capsys, argv, message):
    data = [] if "--data" in argv else ["--data", text]
    code = cli_code(["train", *TINY, *data, "--steps", "2", "--out", str(tmp_path / "r"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert err.splitlines()[-1].startswith("sparsity-lab train: error:")


def test_resume_errors(tmp_path, capsys):
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"\x00garbage" * 50)
    assert main(["train", "--resume", str(bad)]) == 2
    assert "cannot be read: it is corrupt" in capsys.readouterr().err
    assert cli_code(["train", "--resume", str(bad), "--lr", "0.1"]) == 2
    assert "drop --lr" in capsys.readouterr().err


def test_decay_search_prints_evidence_and_says_it_is_our_procedure(tmp_path, text, capsys):
    with pytest.raises(SystemExit):
        main(["decay-search", "--help"])
    assert "not available" in capsys.readouterr().out
    code = main(["decay-search", *TINY, "--data", text, "--steps", "12", "--trial-steps", "4",
                 "--grid", "1e-4,1e-2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "chosen lambda_W" in out and "dense reference" in out
    result = json.loads((tmp_path / "decay_search.json").read_text())
    assert [t["decay"] for t in result["trials"]] == [1e-4, 1e-2]
    assert result["chosen"]["decay"] in (1e-4, 1e-2) and "provenance" in result
    assert cli_code(["decay-search", *TINY, "--data", text, "--grid", "1e-4,x"]) == 2
    assert "--grid" in capsys.readouterr().err


def test_compare_without_plotly_writes_tables_and_says_figures_were_skipped(tmp_path, text, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "plotly", None)  # import plotly -> ImportError
    code = main(["compare", *TINY, "--data", text, "--steps", "4", "--variants", "dense,ste",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "figures skipped: plotly is not installed" in out
    assert (tmp_path / "results.csv").exists()
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["figures"] == [] and "plotly is not installed" in result["figures_note"]
    assert main(["compare", "--figures-from", str(tmp_path)]) == 2
    assert "plotly is not installed" in capsys.readouterr().err
    assert cli_code(["compare", *TINY, "--data", text, "--variants", "dense,foo", "--out", str(tmp_path)]) == 2
    assert "foo" in capsys.readouterr().err


def test_compare_figures_with_plotly(tmp_path, text):
    pytest.importorskip("plotly", reason="plotly is the optional 'lab' extra")
    assert main(["compare", *TINY, "--data", text, "--steps", "4", "--variants", "dense,ste",
                 "--out", str(tmp_path)]) == 0
    for name in ("loss_curves.html", "flip_rates.html"):
        html = (tmp_path / name).read_text()
        assert "plotly" in html and "ste" in html


def test_compare_time_budget_sizing(tmp_path, text, capsys):
    per_step = 4 * 16
    code = main(["compare", *TINY, "--data", text, "--variants", "dense,sste", "--time-budget", "120",
                 "--max-tokens", str(6 * per_step), "--out", str(tmp_path)])
    assert code == 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["steps"] == 6 and result["sizing"]["tokens_per_variant"] == 6 * per_step
    assert set(result["sizing"]["probes"]) == {"dense", "sste"}
    assert all(row["steps"] == 6 for row in result["table"])
    assert main(["compare", *TINY, "--data", text, "--variants", "dense", "--time-budget", "0.01",
                 "--out", str(tmp_path)]) == 2
    assert "allows only" in capsys.readouterr().err
    assert cli_code(["compare", *TINY, "--data", text, "--time-budget", "5", "--steps", "3"]) == 2
    assert "drop --steps" in capsys.readouterr().err
