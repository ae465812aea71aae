"""What one ``python -m benchmarks ffn`` run measures: the grid, the target shape, repetitions, sections, backends."""
from __future__ import annotations

from dataclasses import dataclass

import torch


FULL = dict(tokens=[4096, 16384], d_model=[1024, 2048, 4096, 8192], target=(16384, 4096),
            gpt=dict(n_layer=2, n_head=32, d_model=4096, context=1024, batch=16))
SMOKE = dict(tokens=[32], d_model=[16, 32], target=(32, 32),
             gpt=dict(n_layer=1, n_head=2, d_model=32, context=16, batch=2))


# --- settings ----------------------------------------------------------------------------------------
@dataclass
class Settings:
    smoke: bool
    device: torch.device
    dtype: torch.dtype
    tokens: list[int]
    d_models: list[int]
    target: tuple[int, int]
    reps: int
    warmup: int
    budget_s: float
    graph: bool
    gpt: dict | None  # None: no GPT step
    # the backend each role runs on: "cusparselt", "cusparselt_auto", "dense_products", "cutlass", "sparse_auto"
    backends: dict[str, str]
    rounds: int = 5  # rounds of the paired section (0: no paired section)
    idle_s: float = 0.0  # idle GPU before each paired turn at the target shape and in the GPT rounds
    masks_in_graph: bool = True  # graph section: masks due every step refreshed inside the CUDA graph

    @property
    def grid(self) -> list[tuple[int, int]]:
        return [(t, d) for t in self.tokens for d in self.d_models]
