"""The trainer under faults that are not kills: NaN/Inf, bad data files, failing writes.

Policy (see sparsity_lab/lab/trainer.py): a NaN/Inf loss or gradient stops the run with
TrainingDiverged before the step is applied. Output and data I/O errors name their path, and a
failed write leaves the previous checkpoint valid and no temporary file behind.
"""
import errno

import pytest
import torch

from _lab_testing import tiny_config
from sparsity_lab.lab.cli import main
from sparsity_lab.lab import Trainer
from sparsity_lab.lab.atomic_io import OutputError
from sparsity_lab.lab.checkpoint import CheckpointError, load_checkpoint, state_digest
from sparsity_lab.lab.model import GPTConfig
from sparsity_lab.lab.trainer import TrainingDiverged

MODEL = GPTConfig(n_layer=1, n_head=2, d_model=16, context=16)


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(200)))
    return path


def _trainer(tmp_path, text, **kw):
    base = dict(method="masked_decay", method_options={"decay": 1e-2, "mvue": True}, data=str(text), steps=8,
                log_path=str(tmp_path / "run" / "log.jsonl"), checkpoint_path=str(tmp_path / "run" / "ckpt.pt"),
                checkpoint_interval=1)
    return Trainer(tiny_config(MODEL, **{**base, **kw}))


def _learning_state(trainer) -> str:
    params = {n: p.detach() for n, p in trainer.model.named_parameters()}
    return state_digest({"params": params, "optimizer": trainer.optimizer.state_dict(),
                         "scheduler": trainer.scheduler.state_dict(),
                         "counters": [layer.counters()["step"] for _, layer in trainer.layers]})


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("where", ["gradient", "loss"])
def test_non_finite_step_is_not_applied_and_stops_clearly(tmp_path, text, bad, where):
    trainer = _trainer(tmp_path, text)
    trainer.run(stop_at=2)
    before = _learning_state(trainer)
    saved = load_checkpoint(tmp_path / "run" / "ckpt.pt")
    if where == "gradient":
        trainer.layers[0][1].weight.register_hook(lambda g: g * bad)
    else:
        forward = trainer.model.forward
        trainer.model.forward = lambda x, y: (lambda out: (out[0], out[1] * bad))(forward(x, y))
    with pytest.raises(TrainingDiverged, match=("gradient norm" if where == "gradient" else "training loss")
                       + r".* at step 3; that step was not applied"):
        trainer.run()
    assert trainer.step == 2
    assert _learning_state(trainer) == before, "weights, optimizer, schedule or counters changed"
    for _, layer in trainer.layers:
        w = layer.weight.detach()
        assert torch.isfinite(w).all() and torch.isfinite(layer.beta).all()
        assert torch.equal(layer.mask, layer.backend.mask(w, 2, 4, False))  # from the finite weights
        assert all(p.grad is None for p in trainer.model.parameters())
    assert state_digest(load_checkpoint(tmp_path / "run" / "ckpt.pt")) == state_digest(saved)


def test_changed_or_truncated_data_file_on_resume_names_the_file(tmp_path, text):
    trainer = _trainer(tmp_path, text)
    trainer.run(stop_at=2)
    trainer.close()
    raw = text.read_bytes()
    text.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CheckpointError, match=rf"{text.name}.*changed, truncated or corrupted"):
        Trainer.resume(tmp_path / "run" / "ckpt.pt")
    # NUL bytes: the data is refused as not text before the checkpoint compares it, naming the file too
    text.write_bytes(raw[:100] + b"\x00" * 64 + raw[164:])
    with pytest.raises(ValueError, match=rf"{text.name}.*NUL bytes"):
        Trainer.resume(tmp_path / "run" / "ckpt.pt")


def test_unreadable_data_file_names_the_file(tmp_path, text, monkeypatch, capsys):
    from pathlib import Path
    real = Path.read_bytes

    def failing(self):
        if self.name == text.name:
            raise OSError(errno.EIO, "Input/output error")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", failing)
    with pytest.raises(OSError, match=rf"cannot read the data file .*{text.name}.*Input/output error"):
        _trainer(tmp_path, text)
    assert main(["train", "--data", str(text), "--steps", "2", "--out", str(tmp_path / "cli"), "--layers", "1",
                 "--width", "16", "--heads", "1", "--context", "8", "--no-progress", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert text.name in err and "Traceback" not in err


def test_output_folder_that_is_a_file(tmp_path, text):
    (tmp_path / "blocker").write_text("x")
    with pytest.raises(OutputError, match="blocker"):
        _trainer(tmp_path, text, log_path=str(tmp_path / "blocker" / "log.jsonl"))


@pytest.mark.parametrize("what", ["log", "checkpoint"])
def test_disk_full_mid_run_names_the_path_and_keeps_the_last_checkpoint(tmp_path, text, monkeypatch, what):
    trainer = _trainer(tmp_path, text)
    trainer.run(stop_at=3)
    good = state_digest(load_checkpoint(tmp_path / "run" / "ckpt.pt"))
    full = OSError(errno.ENOSPC, "No space left on device")
    if what == "log":
        real = trainer.log._fh

        class FullFile:  # the log's file on a full disk: writes fail, the rest works
            def write(self, _):
                raise full

            def __getattr__(self, name):
                return getattr(real, name)
        trainer.log._fh = FullFile()
        match = r"run log .*log\.jsonl.*No space left"
    else:
        import sparsity_lab.lab.checkpoint as checkpoint

        def save(obj, fh):  # part of the checkpoint goes out, then the disk is full
            fh.write(b"\0" * 4096)
            raise full
        monkeypatch.setattr(checkpoint.torch, "save", save)
        match = r"checkpoint .*ckpt\.pt.*No space left.*unchanged"
    with pytest.raises(OutputError, match=match):
        trainer.run()
    monkeypatch.undo()
    assert state_digest(load_checkpoint(tmp_path / "run" / "ckpt.pt")) == good
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["ckpt.pt", "log.jsonl"]


def test_disk_full_via_the_cli_is_one_clear_line(tmp_path, text, monkeypatch, capsys):
    import sparsity_lab.lab.atomic_io as atomic_io

    def fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(atomic_io.os, "fsync", fsync)
    out = tmp_path / "cli"
    assert main(["train", "--data", str(text), "--steps", "2", "--out", str(out), "--layers", "1", "--width", "16",
                 "--heads", "1", "--context", "8", "--batch-size", "2", "--eval-batches", "1", "--no-progress",
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "No space left" in err and str(out) in err and "Traceback" not in err
    assert not (out / "checkpoint.pt").exists() and not list(out.glob(".*tmp*"))
