"""The notebooks' subprocesses: where a two-process demo runs, and a failed command shown as itself."""
import sys

import pytest
import torch

from sparsity_lab.course.processes import run_command, torchrun, two_process_plan


def test_two_process_plan_uses_gloo_on_the_cpu_with_fewer_than_two_gpus(monkeypatch):
    for count in (0, 1):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        plan = two_process_plan()
        assert (plan.device, plan.backend) == ("cpu", "gloo") and "fewer than 2" in plan.why


def test_two_process_plan_uses_nccl_with_two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    plan = two_process_plan()
    assert (plan.device, plan.backend, plan.nproc) == ("cuda", "nccl", 2)
    with pytest.raises(ValueError, match="nproc"):
        two_process_plan(1)


def test_a_failed_command_reports_its_own_error(capsys):
    result = run_command([sys.executable, "-c", "import sys; print('partial'); sys.exit('no GPU for rank 1')"],
                         label="two processes")
    assert not result and result.returncode == 1
    shown = capsys.readouterr().out
    assert "two processes FAILED (exit status 1)" in shown and "no GPU for rank 1" in shown
    ok = run_command([sys.executable, "-c", "print('done')"], show=False)
    assert ok and ok.report() == "done"
    with pytest.raises(ValueError, match="args"):
        run_command("python -c 1")


def test_errors_only_shows_one_line_on_success_and_the_error_in_full(capsys):
    """A lesson's command that succeeds shows one line, not its log; one that fails shows its error."""
    run_command([sys.executable, "-c", "print('step 1: loss 5.5'); print('log: /somewhere/log.jsonl')"],
                label="the two-process run", show="errors")
    assert capsys.readouterr().out == "the two-process run: ok\n"
    run_command([sys.executable, "-c", "import sys; sys.exit('rank 1: no log written')"], label="the run",
                show="errors")
    assert "the run FAILED (exit status 1)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="show"):
        run_command([sys.executable, "-c", "1"], show="quiet")


def test_torchrun_command_line():
    assert torchrun(2, ["sparsity_lab", "train"])[1:] == ["-m", "torch.distributed.run", "--standalone",
                                                          "--nproc-per-node", "2", "-m", "sparsity_lab", "train"]


def test_refresh_interval_runs_count_refreshes_and_flips():
    from sparsity_lab.course.live import refresh_interval_runs
    from sparsity_lab.lab import GPTConfig, TrainConfig, load_corpus

    base = TrainConfig(model=GPTConfig(n_layer=1, n_head=1, d_model=16, context=16), batch_size=2, steps=8,
                       warmup_steps=1, eval_interval=8, eval_batches=1, progress=False)
    rows = refresh_interval_runs(base, [1, 4], corpus=load_corpus(max_bytes=50_000))
    assert [r["refreshes"] for r in rows] == [7, 1]  # forwards 0..7: every one after the first mask; step 4
    assert all(0 <= r["flips_per_refresh"] <= 1 for r in rows)
    assert rows[1]["flips_per_step"] == pytest.approx(rows[1]["flips_per_refresh"] / 8)
    with pytest.raises(ValueError, match="intervals"):
        refresh_interval_runs(base, [0])
