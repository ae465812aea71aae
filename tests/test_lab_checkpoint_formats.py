"""One run, continued across the two checkpoint formats: a ``train --parallel`` run (DCP directory) resumed on
one process, and a one-process run (``.pt``) resumed under torchrun with FSDP2; both follow the uninterrupted
one-process run (two processes on the CPU with gloo)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _lab_testing import tiny_corpus_file

from sparsity_lab.lab.cli import main

SIZES = ["--layers", "2", "--width", "32", "--heads", "2", "--context", "16", "--batch-size", "4", "--steps", "6",
         "--eval-interval", "3", "--eval-batches", "2", "--no-progress", "--device", "cpu"]
METHOD = ["--method", "masked_decay"]  # decay before the step and the dense fine-tune switch at step 5


def torchrun(*argv: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "sparsity_lab", *argv], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def losses(folder: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, (folder / "log.jsonl").read_text().splitlines())]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple[list, str]:
    """The uninterrupted one-process run, and its data file."""
    tmp = tmp_path_factory.mktemp("formats")
    data = tiny_corpus_file(tmp)
    assert main(["train", *METHOD, *SIZES, "--data", data, "--out", str(tmp / "straight")]) == 0
    return losses(tmp / "straight"), data


def _close(got, expected) -> None:
    assert [s for s, _ in got] == [s for s, _ in expected]
    # fp32 on the CPU; two ranks run the global batch in halves
    assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-5, abs=1e-6)


def test_a_torchrun_checkpoint_continues_on_one_process(tmp_path, straight):
    expected, data = straight
    out = tmp_path / "run"
    torchrun("train", *METHOD, *SIZES, "--data", data, "--parallel", "ddp", "--stop-at", "3", "--out", str(out))
    assert (out / "checkpoint.dcp" / ".metadata").is_file() and not (out / "checkpoint.pt").exists()
    with pytest.warns(UserWarning, match="saved by 2 process"):
        assert main(["train", "--resume", str(out / "checkpoint.dcp"), "--no-progress"]) == 0
    _close(losses(out), expected)
    assert (out / "checkpoint.pt").is_file()  # one process writes its own format from here on


def test_a_one_process_checkpoint_continues_under_torchrun(tmp_path, straight):
    expected, data = straight
    out = tmp_path / "run"
    assert main(["train", *METHOD, *SIZES, "--data", data, "--stop-at", "3", "--out", str(out)]) == 0
    torchrun("train", "--parallel", "fsdp", "--resume", str(out / "checkpoint.pt"), "--no-progress")
    _close(losses(out), expected)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["parallel"] == "fsdp" and summary["step"] == 6


def test_a_folder_that_is_not_a_checkpoint_is_one_clear_error(tmp_path, capsys):
    (tmp_path / "empty.dcp").mkdir()
    assert main(["train", "--resume", str(tmp_path / "empty.dcp")]) == 2
    err = capsys.readouterr().err
    assert "cannot be read" in err and "not a torch.distributed.checkpoint directory" in err
