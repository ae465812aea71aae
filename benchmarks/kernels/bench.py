"""What every kernel section of the benchmark shares: the device, the sizes, the timer and the table."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from benchmarks.timing import Timer
from benchmarks.kernels.report import Report

BF16 = torch.bfloat16
MIB = 1 << 20


@dataclass
class Bench:
    """One benchmark run. ``w`` is the main bf16 tensor (rows, cols), made once and shared by the
    prune and soft-threshold sections (as many MiB as ``--mib`` asks)."""

    device: torch.device
    timer: Timer
    report: Report
    rows: int
    cols: int
    smoke: bool
    w: torch.Tensor

    def sweep(self, make_fn, configs: list[dict]) -> tuple[float, dict, list]:
        """Time make_fn(**config)() for each config (only the first in a smoke run);
        (best ms, best config, [{"config", "ms"}])."""
        results = [(cfg, self.timer(make_fn(**cfg))) for cfg in configs[:1 if self.smoke else None]]
        best_cfg, best_ms = min(results, key=lambda t: t[1])
        return best_ms, best_cfg, [{"config": c, "ms": ms} for c, ms in results]
