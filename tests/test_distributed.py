"""Data-parallel (DDP) and fully sharded (FSDP2) 2:4 training against one process, on CPU (gloo).

One ``torchrun --nproc-per-node 2`` job (tests/_distributed_worker.py) runs every check; the tests
below read its records. Tolerances: DDP and FSDP2 are bitwise equal to one process that runs the
same global batch as two accumulated micro-batches (float64, reference backend; float32 on the
Triton backend), except SR-STE, whose decay term is added on every rank and then averaged rather
than added once: 1e-12 (float64) / 1e-5 (float32) on the weights after 20 steps.
The same job runs the lab: ``train --parallel fsdp`` stopped half-way and resumed with
``--parallel ddp`` (the DCP checkpoint re-shards), and ``compare --parallel fsdp`` of two variants,
each compared here with one process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _lab_testing import cli_code

from sparsity_lab.lab.cli import main
from sparsity_lab.distributed import local_batch

# the workers import the benchmarks, which run from the clone (they are not installed)
_CLONE_ON_PATH = {"PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                os.environ.get("PYTHONPATH")]))}

WORKER = Path(__file__).with_name("_distributed_worker.py")
METHODS = ["ste", "ste_transposable", "ste_refresh3", "srste", "masked_decay_finetune", "masked_decay_weights",
           "sste", "sste_mvue",
           "sste_mvue_transposable_refresh2", "dense_tracking_flips", "triton_sste_mvue_transposable",
           "triton_srste"]
ERRORS = ["seeds_differ", "methods_differ", "fully_shard_then_sparsify", "ddp_then_sparsify", "shard_placement_fn",
          "graph_step_under_ddp", "batch_not_divisible"]


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("distributed")
    out = tmp / "records.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SPARSITY_LAB_DIST_TIMEOUT": "400", **_CLONE_ON_PATH}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(WORKER), str(out), str(tmp)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    result = json.loads(out.read_text())
    result["wall_seconds"] = time.perf_counter() - start
    return result


def _tolerance(name: str, dtype: str) -> float:
    if "srste" not in name:
        return 0.0
    return 1e-12 if dtype == "torch.float64" else 1e-5


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
@pytest.mark.parametrize("name", METHODS)
def test_parallel_training_equals_one_process(records, parallel, name):
    r = records[f"{parallel}/{name}"]
    assert r["same_keys"]
    assert r["mask_entries_differing"] == 0 and r["masks_checked"] == 4
    assert r["counters_equal"], (r["counters"], r["reference_counters"])  # steps, flips, MVUE draws
    assert r["loss_max_diff"] <= 4 * _tolerance(name, r["dtype"]) + (1e-6 if r["dtype"] == "torch.float32" else 0)
    assert r["float_max_diff"] <= _tolerance(name, r["dtype"])  # weights, biases, beta
    # FSDP2 stores each mask sharded like its weight; DDP replicates it
    assert r["mask_stored_fraction"] == (0.5 if parallel == "fsdp" else 1.0)


def test_masks_flip_during_the_runs(records):
    """The runs move the masks (the comparison of flip counts is not between zeros)."""
    for name in ("ste", "sste", "masked_decay_finetune"):
        totals = [c["flips_total"] for c in records[f"fsdp/{name}"]["counters"].values()]
        assert min(totals) > 0, (name, totals)


@pytest.mark.parametrize("name", [m for m in METHODS if "mvue" not in m])
def test_accumulated_reference_equals_one_forward(records, name):
    """The reference (two accumulated micro-batches) is one process's full-batch step up to rounding."""
    r = records[f"full_batch/{name}"]
    assert r["mask_entries_differing"] == 0 and r["counters_equal"]
    assert r["float_max_diff"] <= (1e-10 if r["dtype"] == "torch.float64" else 5e-5)


def test_mvue_streams_independent_and_reproducible(records):
    r = records["mvue/streams"]
    assert r["ranks_differ"] and r["rank1_replayed_on_rank0"]


def test_mvue_average_over_ranks_is_unbiased(records):
    """200 DDP steps on one batch: (mean - exact) / (std / sqrt(200)) per weight gradient entry."""
    r = records["mvue/unbiased"]
    assert r["exact_where_no_spread"]
    assert r["entries"] > 1000
    assert abs(r["mean_z2"] - 1.0) < 0.25, r
    assert r["max_abs_z"] < 6.0, r


@pytest.mark.parametrize("name", ERRORS)
def test_refused_orders_and_mismatches(records, name):
    r = records[f"error/{name}"]
    assert r["raised"] is not None, f"{name} was not refused"
    assert r["names_fix"], r["message"]


@pytest.mark.parametrize("kind", ["ddp_resume", "fsdp_resume", "2_to_1", "1_to_2"])
@pytest.mark.parametrize("name", ["masked_decay_finetune", "sste_mvue_transposable_refresh2"])
def test_distributed_checkpoint_resume_is_exact(records, kind, name):
    r = records[f"dcp/{kind}/{name}"]
    assert r["same_keys"] and r["counters_equal"]
    assert r["mask_entries_differing"] == 0
    assert r["float_max_diff"] == 0.0 and r["loss_max_diff"] == 0.0
    if kind == "2_to_1":
        assert r["warned_rng"]  # per-rank RNG states cannot follow a change of world size


def test_fsdp_keeps_nothing_full_size_between_steps(records):
    r = records["fsdp_state_after_step"]
    assert r["sharded_layers"] and r["no_cached_operand"] and r["no_full_mask"]
    for (local_rows, cols), (rows, full_cols) in zip(r["local_mask_rows"], r["full_mask_shapes"]):
        assert cols == full_cols and local_rows == rows // 2  # each of the 2 ranks stores half the rows


@pytest.mark.parametrize("name", ["srste", "sste_mvue_transposable_refresh2", "masked_decay_finetune"])
def test_fsdp_with_operands_rebuilt_in_the_backward_equals_one_process(records, name):
    r = records[f"fsdp_recompute/{name}"]
    assert r["mask_entries_differing"] == 0 and r["counters_equal"] and r["same_keys"]
    assert r["float_max_diff"] <= _tolerance(name, r["dtype"]) and r["mask_stored_fraction"] == 0.5


def test_recompute_holds_no_operand_between_forward_and_backward(records):
    held = records["fsdp_between_forward_and_backward"]
    assert len(held["keep"]) == len(held["recompute"]) == 4  # the 4 sparse layers' backward plans
    assert all(operand and mask and not rebuild for operand, mask, rebuild in held["keep"])
    assert all(not operand and not mask and rebuild for operand, mask, rebuild in held["recompute"])


def test_bench_dist_smoke_on_two_ranks(records):
    bench = records["bench"]
    assert bench["code"] == 0
    result = bench["result"]
    assert result["world_size"] == 2 and result["smoke"] and result["env"] == {
        "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    assert {(r["method"], r["parallel"]) for r in result["rows"]} == {
        (m, p) for m in ("dense", "sste_mvue") for p in ("ddp", "fsdp")}  # "none" only at world size 1
    for row in result["rows"]:
        assert row["tokens_per_s_total"] > 0 and len(row["losses_rank0"]) == 3
    assert "git_commit" in result["provenance"] and "torch" in result["provenance"]


def test_distributed_job_fits_the_ci_budget(records):
    assert records["wall_seconds"] < 200, (records["wall_seconds"], records["seconds"])


def test_local_batch_splits_rows_and_refuses_uneven_worlds():
    batch = torch.arange(12).reshape(6, 2)
    parts = [local_batch(batch, r, 3) for r in range(3)]
    assert torch.equal(torch.cat(parts), batch)
    with pytest.raises(ValueError, match="multiple of 4"):
        local_batch(batch, 0, 4)
    with pytest.raises(ValueError, match="rank"):
        local_batch(batch, 3, 3)


# --- the lab under torchrun ------------------------------------------------------------------------
def rows(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_train_on_two_processes_resumed_on_another_sharding_equals_one_process(records, tmp_path):
    lab = records["lab"]
    rank0, rank1 = lab["ranks"]
    assert rank0["codes"] == rank1["codes"] == [0, 0]
    assert rank0["printed"].count("on 2 processes (fsdp)") == 1 and rank1["printed"] == ""  # rank 0 prints
    out = Path(lab["out"])
    assert (out / "checkpoint.dcp" / ".metadata").is_file()
    assert main(["train", *lab["argv"], "--out", str(tmp_path / "one")]) == 0
    two, one = rows(out / "log.jsonl"), rows(tmp_path / "one" / "log.jsonl")
    assert [r["step"] for r in two] == [1, 2, 3, 4, 5, 6]  # written once, truncated and continued on resume
    for a, b in zip(two, one):
        # fp32 on the CPU; one process runs the global batch in one forward, two ranks in halves
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
        assert (a["val_loss"] is None) == (b["val_loss"] is None)
        if a["val_loss"] is not None:
            assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)
        assert a["flip_rate"] == b["flip_rate"] and a["density"] == b["density"]
        assert a["dense_phase"] == b["dense_phase"]
    assert two[-1]["dense_phase"] and not two[3]["dense_phase"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["parallel"] == "ddp" and summary["step"] == 6


def test_compare_on_two_processes_equals_one_process(records, tmp_path):
    lab = records["compare"]
    rank0, rank1 = lab["ranks"]
    assert rank0["code"] == rank1["code"] == 0
    assert rank1["printed"] == "" and rank1["written"] == []  # rank 0 alone prints and writes
    assert rank0["printed"].count("[compare] dense:") == 1 and "Claims of the seed papers" in rank0["printed"]
    two_dir, one_dir = Path(lab["out"]), tmp_path / "one"
    assert sorted(Path(w).name for w in rank0["written"]) == ["results.csv", "results.json"]
    assert main(["compare", *lab["argv"], "--out", str(one_dir)]) == 0
    assert sorted(p.relative_to(two_dir) for p in two_dir.rglob("*")) == \
        sorted(p.relative_to(one_dir) for p in one_dir.rglob("*"))
    two, one = (json.loads((d / "results.json").read_text()) for d in (two_dir, one_dir))
    assert two["parallel"] == {"mode": "fsdp", "world_size": 2} and one["parallel"] is None
    assert [r["variant"] for r in two["table"]] == [r["variant"] for r in one["table"]] == ["dense", "srste"]
    timed = {"wall_s", "median_tokens_per_s"}
    for a, b in zip(two["table"], one["table"]):
        assert set(a) == set(b)
        for key in set(a) - timed:
            if isinstance(a[key], float):  # fp32 on the CPU; two ranks run the global batch in halves
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (a["variant"], key)
            else:
                assert a[key] == b[key], (a["variant"], key)
    assert [(c["outcome"], c["holds"]) for c in two["claims"]] == [(c["outcome"], c["holds"]) for c in one["claims"]]
    for variant in ("dense", "srste"):
        logged_two, logged_one = rows(two_dir / variant / "log.jsonl"), rows(one_dir / variant / "log.jsonl")
        assert [r["step"] for r in logged_two] == [1, 2, 3, 4, 5, 6]  # one writer: no row twice
        for a, b in zip(logged_two, logged_one):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
            assert a["flip_rate"] == b["flip_rate"] and a["density"] == b["density"]


def test_compare_refuses_variants_not_run_across_processes(tmp_path, capsys):
    """Refused before any training or process group: nothing is written, no torchrun needed."""
    out = tmp_path / "refused"
    assert cli_code(["compare", "--variants", "ste,dyad,prune_regrow", "--steps", "2", "--parallel", "ddp",
                     "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "dyad, prune_regrow" in err and "--parallel ddp" in err and "without --parallel" in err
    assert cli_code(["compare", "--variants", "ste", "--time-budget", "60", "--parallel", "fsdp",
                     "--out", str(out)]) == 2
    assert "--time-budget" in capsys.readouterr().err
    assert not out.exists()


def test_parallel_needs_torchrun(tmp_path, capsys):
    assert main(["train", "--method", "ste", "--steps", "2", "--parallel", "ddp", "--out", str(tmp_path / "x")]) == 2
    assert "torchrun --nproc-per-node" in capsys.readouterr().err


# --- on the GPU machine (pytest -m gpu) ----------------------------------------------------------------
@pytest.mark.gpu
def test_bench_dist_world_size_one_matches_the_unwrapped_run_on_cusparselt(tmp_path):
    """World size 1 on NCCL: DDP and FSDP2 around the lab GPT (dense and S-STE + MVUE on cuSPARSELt)
    follow the unwrapped run (same seed, data and draws; bf16 autocast) and the JSON is complete."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.distributed_speed", "--width", "256",
                           "--layers", "2", "--heads", "4", "--context", "128", "--batch-per-gpu", "4", "--steps", "4",
                           "--warmup", "2", "--out-dir", str(tmp_path), "--name", "dist"],
                          capture_output=True, text=True, timeout=600,  # its own process: it sets RANK etc.
                          env={**os.environ, **_CLONE_ON_PATH})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    result = json.loads((tmp_path / "dist.json").read_text())
    assert result["world_size"] == 1 and result["nccl"] and result["gpu"]
    assert {(r["method"], r["parallel"]) for r in result["rows"]} == {
        (m, p) for m in ("dense", "sste_mvue") for p in ("none", "ddp", "fsdp")}
    for row in result["rows"]:
        assert row["max_loss_diff_vs_none"] < 1e-2, row  # bf16 products; the wrappers reorder nothing at N = 1
        assert row["peak_memory_gib_per_rank"][0] > 0
