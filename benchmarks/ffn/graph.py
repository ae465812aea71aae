"""Eager against CUDA-graph replay (``CudaGraphStep``) of one FFN training step (``NOTES["graph"]``)."""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from benchmarks.ffn.measure import Recorder, _cleanup, _inputs, cycle_ms, median_ms
from benchmarks.ffn.schema import GRAPH_VARIANTS, MAX_ROUND_REPS, MIN_ROUND_MS, REFRESH, _row, fill_speedups
from benchmarks.ffn.settings import Settings
from benchmarks.ffn.variants import build_ffn, train_step


# --- eager against CUDA graph --------------------------------------------------------------------------
class InputHeld(nn.Module):
    """``model`` with the step's input x held as a parameter: ``CudaGraphStep`` detaches the tensors it
    is called with, so an x passed as an input would get no gradient and the graphed step would skip
    dx = dZ W, one of the six products the eager step computes. Held as a parameter, x's gradient is
    part of the captured backward. forward(dy) -> the loss sum(model(x) * dy) (d loss / d y = dy)."""

    def __init__(self, model: nn.Module, x: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.x = nn.Parameter(x.detach().clone())

    def forward(self, dy: torch.Tensor) -> torch.Tensor:
        return (self.model(self.x) * dy).sum()


def graph_step_ms(model: nn.Module, x: torch.Tensor, dy: torch.Tensor, s: Settings, row: dict | None = None,
                  cycle: int = 1) -> float:
    """Milliseconds per training step replayed by ``CudaGraphStep`` (see NOTES["graph"]): forward and
    the backward's dx, dW1, dW2 (``InputHeld``), as in the eager step. row: gets ``mask_refresh``, where
    the graphed step refreshed the masks ("graph", "eager", "mixed", or "none" for dense). cycle: the
    mask refresh interval; above 1 the mean over whole cycles (NOTES["refresh"]) is returned."""
    from sparsity_lab.graph_step import CudaGraphStep
    from sparsity_lab.training_hooks import advance_step, sparse_layers

    if s.device.type != "cuda":
        raise RuntimeError("CUDA graphs need a CUDA GPU (this run is on the CPU)")
    sparse = bool(sparse_layers(model))
    held = InputHeld(model, x)
    graphed = CudaGraphStep(held, lambda held, dy: held(dy), warmup_steps=max(2, s.warmup),
                            masks_in_graph=s.masks_in_graph)

    def step() -> None:
        graphed(dy)
        if sparse:
            advance_step(model)  # what attach_optimizer's post-hook does after optimizer.step()
    for _ in range(graphed.warmup_steps + 1):  # eager warm-up steps, then the capture and a first replay
        step()
    torch.cuda.synchronize()
    if held.x.grad is None:
        raise RuntimeError("the graphed step computed no dx (x.grad is None): it would time five products, not six")
    if row is not None:
        row["mask_refresh"] = graphed.mask_refresh
    try:
        return _timed(step, s, cycle)
    finally:
        graphed.release()


def _timed(fn: Callable[[], None], s: Settings, cycle: int) -> float:
    """Median ms per call (cycle 1), or the mean over whole refresh cycles after one cycle of warm-up."""
    import dataclasses

    timing = _long_enough(fn, s)
    if cycle == 1:
        return median_ms(fn, timing)
    return cycle_ms(fn, dataclasses.replace(timing, warmup=cycle + 1), cycle)


def _long_enough(fn: Callable[[], None], s: Settings) -> Settings:
    """Settings whose timing spans at least MIN_ROUND_MS (ten calls of a 0.4 ms step are host jitter)."""
    import dataclasses

    if s.smoke:
        return s
    ms = median_ms(fn, dataclasses.replace(s, warmup=0, reps=3))
    return dataclasses.replace(s, warmup=0, reps=max(s.reps, min(MAX_ROUND_REPS, math.ceil(MIN_ROUND_MS / ms))))


def measure_graph(tokens: int, d: int, s: Settings, rec: Recorder) -> list[dict]:
    """Rows (variant, mode "eager"/"graph", ms, speedup_vs_dense in the same mode) at one shape."""
    print(f"eager vs CUDA graph at {tokens} tokens x d_model {d} ...", flush=True)
    rows = []
    inputs, err = rec.attempt(f"graph {tokens}x{d} inputs", lambda: _inputs(tokens, d, s))
    for variant in GRAPH_VARIANTS:
        label = f"graph {tokens}x{d} {variant}"
        eager, graph = _row(tokens, d, variant, "fwd_bwd"), _row(tokens, d, variant, "fwd_bwd")
        eager["mode"], graph["mode"] = "eager", "graph"
        rows += [eager, graph]
        if inputs is None:
            eager["error"] = graph["error"] = err
            continue
        model, err_build = rec.attempt(f"{label} build", lambda: build_ffn(variant, d, s))
        if model is None:
            eager["error"] = graph["error"] = err_build
            continue
        try:
            eager_step = train_step(model, *inputs)
            cycle = REFRESH.get(variant, 1)
            if cycle > 1:
                eager["timing"] = graph["timing"] = f"mean over whole cycles of {cycle} steps (NOTES['refresh'])"
            eager["ms"], e = rec.attempt(f"{label} eager", lambda: _timed(eager_step, s, cycle))
            if e:
                eager["error"] = e
            graph["ms"], e = rec.attempt(f"{label} capture+replay",
                                         lambda: graph_step_ms(model, *inputs, s, graph, cycle=cycle))
            if e:
                graph["error"] = e
        finally:
            model = None
            _cleanup(s.device)
    fill_speedups(rows, mode_key="mode")
    inputs = None
    _cleanup(s.device)
    return rows
