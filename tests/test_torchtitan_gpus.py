"""``python -m benchmarks torchtitan-gpus``: its options, the jobs it would start, the result file it writes from
the jobs' records, the launcher's stand-ins for torch releases older than torchtitan 0.3.0, and (slow) the whole
path on the CPU: corpus, tokenizer, torchtitan's trainer under torchrun in 2 gloo processes (FSDP2), the JSON."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import torchtitan_gpus as tg
from benchmarks.__main__ import main as bench_main

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--dim", "64", "--layers", "2", "--heads", "4", "--seq-len", "64", "--batch", "2", "--vocab", "300"]


@pytest.mark.parametrize("argv, message", [
    (["--device", "cpu"], "--device cpu needs --nproc"),
    (["--dim", "100", "--heads", "16"], "--dim (100) must be --heads (16) times an even head size"),
    (["--dim", "90", "--heads", "6"], "--dim (90) must be --heads (6) times an even head size"),
    (["--vocab", "257"], "--vocab must be at least 258"),
    (["--methods", "dense", "dense"], "--methods lists a method twice"),
    (["--name", "a/b"], "--name must be letters"),
    (["--profile-steps", "5"], "SPARSITY_LAB_PROFILE_STEPS: expected FIRST:COUNT"),
    (["--profile-steps", "0:2"], "expected FIRST:COUNT, two positive integers"),
    (["--steps", "10", "--profile-steps", "9:3"], "--profile-steps 9:3 runs past --steps 10"),
])
def test_options_that_do_not_go_together_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_main(["torchtitan-gpus", *argv, "--dry-run"])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_the_dry_run_prints_one_torchrun_job_per_method(tmp_path, capsys):
    assert bench_main(["torchtitan-gpus", "--device", "cpu", "--nproc", "2", "--work-dir", str(tmp_path), "--no-mvue",
                       "--dry-run", *TINY]) == 0
    dense, sste = capsys.readouterr().out.strip().splitlines()
    for line in (dense, sste):
        assert "NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1" in line
        assert "SPARSITY_LAB_TITAN_DEVICE=cpu" in line and "--nproc-per-node 2 -m benchmarks.torchtitan_train" in line
        assert "--config llama3_sized" in line and "SPARSITY_LAB_TITAN_MODEL=dim=64,layers=2,heads=4,vocab=320" in line
        assert f"--dataloader.dataset_path {tmp_path.resolve()}/corpus.jsonl" in line
    assert "--sparsity24.method dense" in dense and "--sparsity24.backend" not in dense
    assert "--sparsity24.method sste --sparsity24.backend torch --sparsity24.transposable" in sste
    assert "--sparsity24.mvue" not in sste  # --no-mvue
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


def _record(tps: float, step_s: float, losses: list[float]) -> dict:
    return {"median_tokens_per_s_per_device_after_2": tps, "median_step_s_after_2": step_s,
            "tokens_per_step_per_device": 1000, "max_reserved_gib": 1.5, "losses": losses,
            "two_four_every_step": True}


def test_the_result_file_holds_provenance_each_job_and_the_ratio_to_dense(tmp_path):
    args = SimpleNamespace(device="cpu", methods=["dense", "sste", "ste"], mvue=True, transposable=True, steps=4,
                           dim=64, layers=2, heads=4, seq_len=64, batch=2, backend=None, name=None,
                           out_dir=str(tmp_path))
    runs = {"dense": {"command": "c1", "returncode": 0, "record": _record(200.0, 5.0, [7.0, 6.0])},
            "sste": {"command": "c2", "returncode": 0, "record": _record(250.0, 4.0, [7.5, None, 6.5])},
            "ste": {"command": "c3", "returncode": None, "error": "timed out", "log_tail": "..."}}
    path, summary = tg.write_report(args, 2, 320, {"documents": 3}, runs)
    assert path == tmp_path / "torchtitan_llama_cpux2.json"
    saved = json.loads(path.read_text())
    assert {"date", "git_commit", "command", "torch", "triton", "gpu"} <= set(saved["provenance"])
    assert saved["world_size"] == 2 and saved["settings"]["backend"] == "torch" and saved["runs"] == runs
    assert saved["env"] == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    assert saved["summary"] == summary and summary["ste"] == {"failed": True}
    assert summary["sste"]["tokens_per_s_vs_dense"] == pytest.approx(1.25)
    assert summary["sste"]["tokens_per_s_per_gpu_from_step_time"] == pytest.approx(250.0)
    assert (summary["sste"]["first_loss"], summary["sste"]["last_loss"]) == (7.5, 6.5)
    assert "tokens_per_s_vs_dense" not in summary["dense"]


@pytest.mark.parametrize("gpu, name", [("NVIDIA H100 80GB HBM3", "torchtitan_llama_h100x4"),
                                       ("NVIDIA H200", "torchtitan_llama_h200x4"),
                                       ("Some Accelerator", "torchtitan_llama_some_acceleratorx4")])
def test_the_default_name_says_the_gpu_and_the_count(gpu, name):
    args = SimpleNamespace(name=None, device="cuda")
    assert tg.result_name(args, 4, gpu) == name
    assert tg.result_name(SimpleNamespace(name="mine", device="cuda"), 4, gpu) == "mine"


def test_the_launcher_supplies_what_older_torch_lacks(monkeypatch):
    import torch.distributed as dist
    import torch.distributed.fsdp as fsdp
    from torch.distributed import distributed_c10d

    from benchmarks import torchtitan_train

    monkeypatch.delattr(fsdp, "DataParallelMeshDims", raising=False)
    monkeypatch.setattr(dist, "set_timeout", None, raising=False)
    monkeypatch.delattr(dist, "set_timeout")
    assert torchtitan_train.install_compat() == ["torch.distributed.fsdp.DataParallelMeshDims",
                                                 "torch.distributed.set_timeout"]
    assert dist.set_timeout is distributed_c10d._set_pg_timeout
    with pytest.raises(RuntimeError, match="full_dtensor, which the 2:4 configs refuse"):
        fsdp.DataParallelMeshDims(shard=("fsdp",))
    assert torchtitan_train.install_compat() == []  # present now: nothing replaced


def test_the_sized_config_reads_its_sizes():
    pytest.importorskip("torchtitan.protocols.model", reason="the recorder needs torchtitan 0.3")
    from benchmarks import torchtitan_record as rec

    assert rec.parse_sizes("") == rec.DEFAULT_SIZES
    assert rec.parse_sizes("dim=64, heads=4") == {**rec.DEFAULT_SIZES, "dim": 64, "heads": 4}
    for bad in ("dim=0", "depth=3", "dim=x", "dim=60,heads=4"):
        with pytest.raises(ValueError, match="SPARSITY_LAB_TITAN_MODEL"):
            rec.parse_sizes(bad)
    model = rec.sized_model(dim=64, layers=2, heads=4, vocab=320)
    assert model.dim == 64 and model.vocab_size == 320 and len(model.layers) == 2
    assert model.layers[0].feed_forward.w1.out_features == 256  # 8/3 * 64 rounded up to 256


@pytest.mark.slow
def test_the_whole_path_on_the_cpu(tmp_path):
    """Corpus and tokenizer made, torchtitan's trainer run by torchrun in 2 gloo processes with 2:4 FFN layers
    (FSDP2), its record turned into the result file: every step's loss and a mask that stayed 2:4."""
    pytest.importorskip("torchtitan.protocols.model", reason="the trainer is torchtitan 0.3's")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "benchmarks", "torchtitan-gpus", "--device", "cpu", "--nproc", "2", "--methods", "sste",
           "--steps", "3", "--max-corpus-mb", "1", "--work-dir", str(tmp_path / "work"), "--out-dir", str(out),
           "--profile-steps", "2:2", *TINY]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "torchtitan_llama_cpux2.json").read_text())
    record = result["runs"]["sste"]["record"]
    assert record["world_size"] == 2 and record["sparsity24"]["method"] == "sste" and record["sparsity24"]["mvue"]
    assert len(record["losses"]) == 3 and all(loss > 0 for loss in record["losses"])
    assert record["two_four_every_step"] and record["check_before_training"]["masks_exactly_2_of_4"]
    assert record["sparse_layers"] == [f"layers.{i}.feed_forward.{w}" for i in range(2) for w in ("w1", "w2", "w3")]
    assert result["data"]["tokenizer_vocab"] <= result["settings"]["model_vocab"] == 320
    assert result["summary"]["sste"]["tokens_per_s_per_gpu"] > 0
    profile = record["profile"]  # steps 2-3 under the profiler: the CPU's operators by kind of work
    assert profile["steps"] == [2, 3] and profile["longest_kernels"]
    parts = result["summary"]["sste"]["ms_per_step_by_category"]
    assert parts["dense_gemm"] > 0 and set(parts) >= {"two4_work", "communication", "optimizer"}
