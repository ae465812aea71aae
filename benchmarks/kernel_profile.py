"""The GPU kernels of a step, per step, under ``torch.profiler``: what the profiling scripts print.

``kernel_profile(step)`` calls ``step`` a few times inside the profiler and returns the kernels' time per
step and the kernels largest first; ``kernel_lines`` formats them. Used by ``act24_profile`` and
``ffn/profile_small`` (their recorded outputs are in results/).
"""
from __future__ import annotations

from typing import Callable, Iterable, NamedTuple

import torch


class Kernel(NamedTuple):
    ms: float  # GPU time per step
    calls: int  # launches per step
    name: str


def summarize(averages: Iterable, steps: int) -> tuple[float, list[Kernel]]:
    """(total kernel ms per step, kernels largest first) from ``prof.key_averages()`` over ``steps`` steps
    (events with ``self_device_time_total`` in microseconds, ``count`` and ``key``)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    kernels = [Kernel(e.self_device_time_total / steps / 1e3, e.count // steps, e.key) for e in averages]
    kernels.sort(key=lambda k: -k.ms)
    return sum(k.ms for k in kernels), kernels


def kernel_profile(step: Callable[[], None], steps: int = 5) -> tuple[float, list[Kernel]]:
    """Profile ``steps`` calls of ``step`` (already warmed up) on the GPU; see ``summarize``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return summarize(prof.key_averages(), steps)


def kernel_lines(kernels: list[Kernel], top: int, width: int) -> list[str]:
    """The ``top`` largest kernels, one line each: ms per step, launches per step, name cut to ``width``."""
    return [f"   {k.ms:7.3f} ms  x{k.calls:<3} {k.name[:width]}" for k in kernels[:top]]
