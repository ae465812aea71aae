"""Timing shared by the kernel benchmarks: median milliseconds through triton's do_bench on a GPU."""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch


class Timer:
    """``timer(fn)`` -> median milliseconds of fn().

    smoke=True (CPU, Triton interpreter) times one call after a warm-up call: it checks that the
    script runs, the number means nothing.
    """

    def __init__(self, smoke: bool, rep_ms: int, warmup_ms: int | None = None) -> None:
        self.smoke, self.rep_ms = smoke, rep_ms
        self.warmup_ms = warmup_ms if warmup_ms is not None else max(25, rep_ms // 4)

    def __call__(self, fn) -> float:
        if self.smoke:
            fn()
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def copy_ceiling_gbps(timer: Timer, numel: int, device: torch.device) -> float:
    """The ceiling of a memory-bound kernel: GB/s of a device-to-device copy of ``numel`` bf16
    elements, bytes read + bytes written."""
    src = torch.randn(numel, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = timer(lambda: dst.copy_(src))
    return 2 * src.numel() * 2 / copy_ms / 1e6


def bench_device(smoke: bool, command: str) -> torch.device | None:
    """Where a benchmark runs: the CPU through the Triton interpreter for ``--smoke`` (set here, before
    triton is imported), else the CUDA GPU; None, after saying so, when there is none."""
    if smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        print(f"{command} needs a CUDA GPU (use --smoke to check the script on a CPU)")
        return None
    return torch.device("cuda")


def result_path(out: str | None, smoke: bool, name: str) -> Path:
    """The JSON a benchmark writes: ``--out``, else ``<name>_smoke.json`` here for a smoke run, else
    ``results/<name>_h100.json``."""
    return Path(out) if out else (Path(f"{name}_smoke.json") if smoke else Path(f"results/{name}_h100.json"))
