"""Child side of tests/test_fault_injection.py: one segment of a training run, killed on cue.

``segment(out_dir, config, plan)`` resumes from ``out_dir/checkpoint.pt`` when it exists (else
starts the run), arms the kill described by ``plan`` and trains to the end. The kill is a real
SIGKILL of this process (no clean-up, no flush, no atexit), sent at one of these moments:

* ("step", k, phase): at step k; phase "forward" (inside the step, before the update),
  "update" (right after optimizer.step, before the row is logged), "logged" (after its row was
  handed to the log) or "torn_row" (half of the row's JSON line written and flushed);
* ("save", n, stage): during the n-th checkpoint save of this segment; stage "payload" (a
  prefix of the file written and flushed), "before_rename" (temporary file complete and
  fsynced) or "after_rename" (renamed, folder not yet fsynced).
(The parent also kills segments at random wall-clock moments from outside.)
Segments run in children forked from a forkserver that imported torch once (fast start).
"""
from __future__ import annotations

import io
import json
import os
import signal
from pathlib import Path


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def segment(out_dir: str, config: dict, plan: tuple | None) -> None:
    import torch

    from sparsity_lab.lab import atomic_io, checkpoint
    from sparsity_lab.lab.runlog import clean_row
    from sparsity_lab.lab.trainer import TrainConfig, Trainer

    torch.set_num_threads(1)  # bitwise-reproducible CPU kernels across processes
    out = Path(out_dir)
    ckpt = out / "checkpoint.pt"
    run_opts = {"log_path": str(out / "log.jsonl"), "checkpoint_path": str(ckpt)}
    if ckpt.exists():
        trainer = Trainer.resume(ckpt, **run_opts)
    else:  # killed before its first checkpoint: start again (what `train --overwrite` does)
        Path(run_opts["log_path"]).unlink(missing_ok=True)
        trainer = Trainer(TrainConfig.from_dict({**config, **run_opts}))

    if plan is not None and plan[0] == "step":
        _, kill_step, phase = plan
        train_step, write, opt_step = trainer.train_step, trainer.log.write, trainer.optimizer.step

        def step_hook():
            if trainer.step + 1 == kill_step and phase == "forward":
                _die()
            return train_step()

        def opt_hook(*a, **k):
            result = opt_step(*a, **k)
            if trainer.step + 1 == kill_step and phase == "update":
                _die()
            return result

        def write_hook(row):
            if row["step"] == kill_step and phase == "torn_row":
                line = json.dumps(clean_row(row), allow_nan=False) + "\n"
                if trainer.log._fh is None:
                    trainer.log._fh = trainer.log.path.open("a")
                trainer.log._fh.write(line[: len(line) // 2])  # the row's line cut in the middle
                trainer.log._fh.flush()
                _die()
            write(row)
            if row["step"] == kill_step and phase == "logged":
                trainer.log.flush()
                _die()

        trainer.train_step, trainer.log.write, trainer.optimizer.step = step_hook, write_hook, opt_hook
    elif plan is not None and plan[0] == "save":
        _, nth, stage = plan
        saves = {"n": 0}
        real_save, real_replace = checkpoint.torch.save, atomic_io.os.replace

        def save_hook(obj, fh):
            saves["n"] += 1
            if saves["n"] == nth and stage == "payload":
                buf = io.BytesIO()
                real_save(obj, buf)
                data = buf.getvalue()
                cut = int.from_bytes(os.urandom(4), "little") % len(data)
                fh.write(data[:cut])
                fh.flush()
                _die()
            real_save(obj, fh)

        def replace_hook(src, dst):
            if saves["n"] == nth and stage == "before_rename":
                _die()
            real_replace(src, dst)
            if saves["n"] == nth and stage == "after_rename":
                _die()

        checkpoint.torch.save = save_hook
        atomic_io.os.replace = replace_hook
    trainer.run()
    trainer.close()
