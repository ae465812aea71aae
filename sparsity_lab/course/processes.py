"""The commands a notebook starts in other processes (torchrun, the lab's CLI), run so that a learner sees
what happened: the output when they succeed, their own error when they fail, never a later traceback
from a cell that reads a file the failed command did not write.

:func:`two_process_plan` picks where a two-process demo runs: on two GPUs through NCCL when the machine
has them, else on the CPU through gloo (a machine with one GPU cannot give two processes a GPU each).
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class ProcessPlan:
    """Where ``nproc`` processes run: ``device`` ("cpu" or "cuda"), their process-group ``backend``, and
    ``why`` (one sentence for the learner)."""

    nproc: int
    device: str
    backend: str
    why: str


def two_process_plan(nproc: int = 2) -> ProcessPlan:
    """GPUs with NCCL when the machine has ``nproc`` of them, else the CPU with gloo."""
    if not isinstance(nproc, int) or nproc < 2:
        raise ValueError(f"nproc must be an integer >= 2, got {nproc!r}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= nproc:
        return ProcessPlan(nproc, "cuda", "nccl", f"{gpus} GPUs here: {nproc} processes, one GPU each, through NCCL")
    have = "no GPU" if gpus == 0 else f"{gpus} GPU" + "s" * (gpus > 1)
    return ProcessPlan(nproc, "cpu", "gloo", f"{have} here, fewer than {nproc}: {nproc} CPU processes through gloo")


@dataclass
class CommandResult:
    """What one command did: ``ok`` (exit status 0), its ``returncode``, ``stdout`` and ``stderr``."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    label: str = ""
    tail_chars: int = field(default=3000, repr=False)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def __bool__(self) -> bool:
        return self.ok

    def report(self, output: bool = True) -> str:
        """On success the output (``output=False``: one line saying the command succeeded); on failure the
        exit status and the end of the command's error output."""
        if self.ok:
            return self.stdout.rstrip() if output else f"{self.label or 'the command'}: ok"
        err = (self.stderr or self.stdout).rstrip()
        return (f"{self.label or 'the command'} FAILED (exit status {self.returncode}); its error output ends:\n"
                f"{err[-self.tail_chars:]}")


def run_command(args: list[str], label: str = "", env: dict | None = None, show: bool | str = True) -> CommandResult:
    """Run ``args`` (a list, no shell), capture its output and print :meth:`CommandResult.report`: with
    ``show=True`` the output or the error, with ``"errors"`` one line on success (a lesson shows what the
    command wrote in its own cells, not its log) and the error in full on failure, with ``False`` nothing."""
    if not isinstance(args, (list, tuple)) or not args or not all(isinstance(a, str) for a in args):
        raise ValueError(f"args must be a non-empty list of strings, got {args!r}")
    if not (show is True or show is False or show == "errors"):
        raise ValueError(f"show must be True, False or 'errors', got {show!r}")
    done = subprocess.run(list(args), capture_output=True, text=True, env={**os.environ, **(env or {})})
    result = CommandResult(list(args), done.returncode, done.stdout, done.stderr, label)
    if show is not False:
        print(result.report(output=show is True))
    return result


def torchrun(nproc: int, module_args: list[str]) -> list[str]:
    """The command line of ``torchrun --standalone --nproc-per-node nproc -m ...`` with this Python."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "-m", *module_args]
