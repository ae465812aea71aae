"""``train`` and ``compare`` with ``--config FILE.toml``: the file sets options, flags override it, bad files are
refused naming the key before any work, and a run writes OUT/config.toml, which runs it again."""
import json
import tomllib

import pytest
from _lab_testing import cli_code, tiny_corpus_file

from sparsity_lab.lab import cli
from sparsity_lab.lab.runlog import read_log

TINY_TOML = """\
method = "sste"
mvue = true
steps = 6
layers = 1
width = 16
context = 16
batch_size = 4          # underscores or dashes
eval-batches = 1
no-progress = true
device = "cpu"
lr = 0.002
"""


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(TINY_TOML + f"data = {json.dumps(tiny_corpus_file(tmp_path))}\n")
    return path


def test_the_file_sets_options_flags_override_it_and_the_run_writes_them_all(tmp_path, config):
    out = tmp_path / "run"
    assert cli.main(["train", "--config", str(config), "--lr", "0.003", "--out", str(out)]) == 0
    used = json.loads((out / "summary.json").read_text())["config"]
    assert used["lr"] == 0.003  # the flag wins
    assert used["steps"] == 6 and used["method"] == "sste" and used["method_options"] == {"mvue": True}
    assert used["model"]["d_model"] == 16 and used["batch_size"] == 4
    written = tomllib.loads((out / "config.toml").read_text())
    assert written["lr"] == 0.003 and written["steps"] == 6 and written["mvue"] is True
    # resolved values, not only the given ones: the head count from the width, warm-up from the steps
    assert written["heads"] == 1 and written["warmup-steps"] == 1 and written["grad-clip"] == 1.0
    assert "tokens" not in written and "config" not in written and "resume" not in written


def test_the_written_config_runs_the_same_run_again(tmp_path, config):
    first, again = tmp_path / "first", tmp_path / "again"
    assert cli.main(["train", "--config", str(config), "--out", str(first)]) == 0
    assert cli.main(["train", "--config", str(first / "config.toml"), "--out", str(again)]) == 0
    losses = [[r["loss"] for r in read_log(d / "log.jsonl")] for d in (first, again)]
    assert losses[0] == losses[1] and len(losses[0]) == 6


@pytest.mark.parametrize("text, words", [
    ("stepz = 3\n", ["unknown key 'stepz'", "did you mean steps"]),
    ("steps = 0\n", ["steps: expected a positive integer, got '0'"]),
    ("lr = nan\n", ["lr: expected a finite number > 0"]),
    ("steps = 3\ntokens = 1e6\n", ["'steps' and 'tokens' exclude each other"]),
    ("steps = 3\nsteps_ = 4\n", ["unknown key"]),
    ("batch-size = 4\nbatch_size = 8\n", ["given twice"]),
    ("mvue = 1\n", ["mvue: expected true or false"]),
    ("ffn = \"conv\"\n", ["ffn: expected one of"]),
    ("[model]\nwidth = 16\n", ["[model] is a table"]),
    ("config = \"other.toml\"\n", ["cannot name another one"]),
    ("steps = \n", ["not valid TOML"]),
])
def test_a_bad_file_is_refused_naming_the_key_before_any_work(tmp_path, capsys, text, words):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    out = tmp_path / "run"
    assert cli_code(["train", "--config", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "usage:" in err and f"--config {path}" in err and all(w in err for w in words), err
    assert not out.exists()


def test_yaml_is_refused_with_what_is_read(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("steps: 3\n")
    assert cli_code(["train", "--config", str(path)]) == 2
    assert "reads TOML files" in capsys.readouterr().err


def test_a_flag_drops_the_file_key_it_excludes(tmp_path, monkeypatch):
    import sparsity_lab.lab.train as train

    seen = {}
    monkeypatch.setattr(train, "run", lambda args: seen.update(vars(args)) or 0)
    path = tmp_path / "run.toml"
    path.write_text("steps = 3\nlr = 0.01\n")
    assert cli.main(["train", "--config", str(path), "--tokens", "1000"]) == 0
    assert seen["tokens"] == 1000 and "steps" not in seen and seen["lr"] == 0.01
    assert cli.main(["train", "--conf", str(path)]) == 0  # an abbreviation of --config is read too
    assert seen["steps"] == 3


def test_compare_reads_a_config_and_writes_the_resolved_one(tmp_path):
    path = tmp_path / "compare.toml"
    out = tmp_path / "cmp"
    path.write_text(TINY_TOML.replace('method = "sste"\nmvue = true\n', "").replace("steps = 6", "steps = 4")
                    + f'variants = "dense,ste"\ndata = {json.dumps(tiny_corpus_file(tmp_path))}\n')
    assert cli.main(["compare", "--config", str(path), "--out", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    assert [r["variant"] for r in result["table"]] == ["dense", "ste"] and result["steps"] == 4
    written = tomllib.loads((out / "config.toml").read_text())
    assert written["variants"] == "dense,ste" and written["steps"] == 4 and written["out"] == str(out)
