"""Fault injection: SIGKILL the trainer at random points, resume, compare with an uninterrupted run.

Each kill is a real SIGKILL of a training process: inside a step, after the update, after the
row was logged, with half a log row written, while a checkpoint is written (a prefix of it on
disk, complete but not renamed, renamed but the folder not synced) or at a random wall-clock
moment. After every kill the checkpoint on disk must load (integrity digest verified); the run
is resumed from it, killed again, ... until it finishes. Then weights, masks, beta, counters,
optimizer, scheduler, sampler and RNG states must be bitwise those of an uninterrupted run, and
the log must hold every step exactly once with the same values.

CI runs 10 kills (about 15 s). The full count, 30 kills for each of two methods, runs with
    SPARSITY_LAB_FULL_FAULTS=1 python -m pytest -q tests/test_fault_injection.py
SPARSITY_LAB_FAULT_KILLS=N sets the count per method; SPARSITY_LAB_FAULT_SEED=S replays a failure (the seed
is in the failure message).
"""
import multiprocessing as mp
import os
import random
import sys

import pytest
import torch

import _fault_driver
from _lab_testing import without_speed
from sparsity_lab.lab import TrainConfig
from sparsity_lab.lab.checkpoint import load_checkpoint, state_digest
from sparsity_lab.lab.model import GPTConfig
from sparsity_lab.lab.runlog import read_log
from sparsity_lab.lab.trainer import RUN_ONLY_FIELDS

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL and forkserver are POSIX")

FULL = os.environ.get("SPARSITY_LAB_FULL_FAULTS") == "1"
KILLS = int(os.environ.get("SPARSITY_LAB_FAULT_KILLS", 30 if FULL else 10))  # per method
STEPS = 24
METHODS = [("masked_decay", {"decay": 2e-3, "mvue": True, "mask_refresh_interval": 2}),
           ("sste", {"transposable": True, "mvue": True})]
PHASES = ("forward", "update", "logged", "torn_row")
STAGES = ("payload", "before_rename", "after_rename")


@pytest.fixture(scope="module")
def ctx():
    context = mp.get_context("forkserver")
    # the server imports torch once (torch._dynamo too: the first optimizer built imports it, ~4 s);
    # every segment is forked from it (fast start, and no OpenMP state inherited)
    context.set_forkserver_preload(["torch", "torch._dynamo", "sparsity_lab.lab.trainer", "_fault_driver"])
    return context


def _config(data: str, method: str, options: dict) -> dict:
    return TrainConfig(method=method, method_options=options, data=data, steps=STEPS, batch_size=4,
                       warmup_steps=2, eval_interval=4, eval_batches=1, checkpoint_interval=3, device="cpu",
                       progress=False, model=GPTConfig(n_layer=1, n_head=2, d_model=16, context=16)).to_dict()


def _segment(ctx, out, config, plan, delay=None) -> int:
    proc = ctx.Process(target=_fault_driver.segment, args=(str(out), config, plan))
    proc.start()
    proc.join(delay)
    if proc.is_alive():
        proc.kill()  # SIGKILL at a wall-clock moment
    proc.join()
    return proc.exitcode


def _plan(rng: random.Random, at_step: int):
    kind = rng.choice(["step"] * 5 + ["save"] * 3 + ["time"] * 2)
    if kind == "step":
        return ("step", min(STEPS, at_step + rng.randint(1, 5)), rng.choice(PHASES)), None
    if kind == "save":
        return ("save", rng.randint(1, 2), rng.choice(STAGES)), None
    return None, rng.uniform(0.05, 1.5)


def _comparable(state: dict) -> dict:
    config = {k: v for k, v in state["config"].items() if k not in RUN_ONLY_FIELDS}
    return {**{k: v for k, v in state.items() if k not in ("config", "sha256")}, "config": config}


def _differences(a: dict, b: dict) -> list[str]:
    out = []
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            out.append(f"{key} missing")
        elif isinstance(a[key], dict) and key in ("model", "optimizer"):
            out += [f"{key}.{k}" for k in a[key] if state_digest({0: a[key][k]}) != state_digest({0: b[key].get(k)})]
        elif state_digest({0: a[key]}) != state_digest({0: b[key]}):
            out.append(key)
    return out


@pytest.mark.parametrize("method,options", METHODS[: 2 if FULL else 1], ids=[m for m, _ in METHODS[: 2 if FULL else 1]])
def test_sigkill_anywhere_then_resume_equals_uninterrupted(ctx, tmp_path, method, options):
    seed = int(os.environ.get("SPARSITY_LAB_FAULT_SEED", random.SystemRandom().randrange(2**31)))
    rng = random.Random(seed)
    replay = f"(replay: SPARSITY_LAB_FAULT_SEED={seed})"
    data = tmp_path / "corpus.txt"
    data.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n" for i in range(300)))
    config = _config(str(data), method, options)
    assert _segment(ctx, tmp_path / "reference", config, None) == 0
    reference = _comparable(load_checkpoint(tmp_path / "reference" / "checkpoint.pt"))
    reference_log = without_speed(read_log(tmp_path / "reference" / "log.jsonl"))
    assert [r["step"] for r in reference_log] == list(range(1, STEPS + 1))

    kills, chain, history = 0, 0, []
    while kills < KILLS or chain == 0:
        out = tmp_path / f"chain{chain}"
        for _ in range(4 * STEPS):  # segments of this chain, until one finishes
            ckpt = out / "checkpoint.pt"
            at = load_checkpoint(ckpt)["step"] if ckpt.exists() else 0  # every kill leaves a loadable one
            plan, delay = _plan(rng, at) if kills < KILLS else (None, None)
            code = _segment(ctx, out, config, plan, delay)
            history.append((at, plan or f"time {delay:.2f}s" if delay else plan, code))
            assert code in (0, -9), f"segment {plan or delay} failed with exit code {code} {replay}"
            kills += code == -9
            if code == 0:
                break
        else:
            pytest.fail(f"chain {chain} never finished {replay}: {history}")
        got = _comparable(load_checkpoint(out / "checkpoint.pt"))
        diff = _differences(got, reference)
        assert not diff, f"after kills {history}: differs from the uninterrupted run in {diff} {replay}"
        log = without_speed(read_log(out / "log.jsonl"))
        assert [r["step"] for r in log] == list(range(1, STEPS + 1)), f"log steps {replay}: {history}"
        assert log == reference_log, f"log rows differ {replay}: {history}"
        assert not list(out.glob(".*tmp*")), "a stale temporary file was left next to the checkpoint"
        chain += 1
    assert kills >= KILLS
