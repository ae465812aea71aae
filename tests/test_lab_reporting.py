"""``--report-to tensorboard|wandb``: the logged rows (loss, lr, flip rate, dense phase, ...) reach TensorBoard's
event files and a W&B run (offline); a reporter whose package is missing is refused before any work."""
import importlib.machinery
import importlib.util
import sys
import types

import pytest
from _lab_testing import CLI_TINY, cli_code, tiny_corpus_file

from sparsity_lab.lab import cli
from sparsity_lab.lab.runlog import read_log

# masked decay over 6 steps: 2:4 for 4 steps, then dense (its fine-tune switch at 5/6): dense_phase 0 then 1
RUN = [*CLI_TINY, "--method", "masked_decay", "--steps", "6", "--eval-interval", "3"]


def _scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_train_reports_the_log_rows_to_tensorboard(tmp_path):
    pytest.importorskip("tensorboard", reason="--report-to tensorboard needs the tensorboard extra")
    out = tmp_path / "run"
    assert cli.main(["train", *RUN, "--data", tiny_corpus_file(tmp_path), "--out", str(out),
                     "--report-to", "tensorboard"]) == 0
    rows = read_log(out / "log.jsonl")
    got = _scalars(out / "tensorboard")
    assert {"loss", "val_loss", "lr", "grad_norm", "flip_rate", "dense_phase", "density"} <= set(got)
    for key in ("loss", "lr", "flip_rate"):
        expected = [(r["step"], r[key]) for r in rows if r[key] is not None]
        assert [s for s, _ in got[key]] == [s for s, _ in expected]
        assert [v for _, v in got[key]] == pytest.approx([v for _, v in expected], rel=1e-6)
    assert [s for s, _ in got["val_loss"]] == [3, 6]  # only where the log has a value
    assert [v for _, v in got["dense_phase"]] == [float(r["dense_phase"]) for r in rows]
    assert {v for _, v in got["dense_phase"]} == {0.0, 1.0}


def test_compare_reports_each_variant_to_its_own_tensorboard_run(tmp_path):
    pytest.importorskip("tensorboard", reason="--report-to tensorboard needs the tensorboard extra")
    out = tmp_path / "cmp"
    assert cli.main(["compare", *CLI_TINY, "--data", tiny_corpus_file(tmp_path), "--steps", "3",
                     "--variants", "dense,ste", "--out", str(out), "--report-to", "tensorboard"]) == 0
    for variant in ("dense", "ste"):
        got = _scalars(out / "tensorboard" / variant)
        assert [s for s, _ in got["loss"]] == [1, 2, 3] and "flip_rate" in got


class FakeWandb(types.ModuleType):
    """What ``WandbReporter`` calls of wandb: init(...) -> run with log(data, step) and finish()."""

    def __init__(self):
        super().__init__("wandb")
        self.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
        self.inits, self.logged, self.finished = [], [], 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        fake = self

        class Run:
            def log(self, data, step):
                fake.logged.append((step, dict(data)))

            def finish(self):
                fake.finished += 1
        return Run()


def test_train_reports_to_wandb_offline(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = tmp_path / "run"
    assert cli.main(["train", *RUN, "--data", tiny_corpus_file(tmp_path), "--out", str(out),
                     "--report-to", "wandb"]) == 0
    (init,) = fake.inits
    assert init["mode"] == "offline" and init["dir"] == str(out) and init["name"] == "run"
    assert init["config"]["method"] == "masked_decay" and fake.finished == 1
    rows = read_log(out / "log.jsonl")
    assert [s for s, _ in fake.logged] == [r["step"] for r in rows]
    for (_, data), row in zip(fake.logged, rows):
        assert data["loss"] == row["loss"] and data["lr"] == row["lr"]
        assert data["dense_phase"] == float(row["dense_phase"])
        assert ("val_loss" in data) == (row["val_loss"] is not None)


def test_real_wandb_writes_an_offline_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the optional wandb extra")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    assert cli.main(["train", *RUN, "--data", tiny_corpus_file(tmp_path), "--out", str(out),
                     "--report-to", "wandb"]) == 0
    (record,) = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    data = record.read_bytes()
    assert all(key in data for key in (b"flip_rate", b"dense_phase", b"loss", b"lr"))


@pytest.mark.parametrize("target", ["tensorboard", "wandb"])
@pytest.mark.parametrize("command", ["train", "compare"])
def test_a_missing_package_is_refused_before_any_work(tmp_path, monkeypatch, capsys, target, command):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == target else real(name, *a))
    out = tmp_path / "run"
    assert cli_code([command, *CLI_TINY, "--steps", "2", "--out", str(out), "--report-to", target]) == 2
    err = capsys.readouterr().err
    assert f"--report-to {target} needs the {target} package" in err and f"sparsity-lab[{target}]" in err
    assert not out.exists()


def test_none_goes_alone(capsys):
    assert cli_code(["train", "--report-to", "none", "tensorboard"]) == 2
    assert "--report-to none goes alone" in capsys.readouterr().err
