"""Paired rounds: the dense and 2:4 FFNs built side by side and timed in turns (``NOTES["paired"]``)."""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import torch
from torch import nn

from benchmarks.ffn.measure import Recorder, _cleanup, _inputs, cycle_ms
from benchmarks.ffn.schema import MAX_ROUND_REPS, MIN_ROUND_MS, PAIRED_VARIANTS, PHASES, REFRESH, _row
from benchmarks.ffn.settings import Settings
from benchmarks.ffn.variants import build_ffn, train_step


# --- paired: dense and ours side by side, timed in turns ----------------------------------------------------
def measure_paired(tokens: int, d: int, s: Settings, rec: Recorder) -> list[dict]:
    """Rows (variant, phase, ms = median over rounds, round_ms, round_speedups, speedup_vs_dense = their
    median, speedup_min / max) for PAIRED_VARIANTS at one shape (NOTES["paired"])."""
    import dataclasses

    print(f"paired rounds at {tokens} tokens x d_model {d} ({s.rounds} rounds) ...", flush=True)
    rows = {(v, p): {**_row(tokens, d, v, p), "round_ms": [], "round_speedups": []}
            for v in PAIRED_VARIANTS for p in PHASES}
    inputs, err = rec.attempt(f"paired {tokens}x{d} inputs", lambda: _inputs(tokens, d, s))
    models: dict[str, nn.Module] = {}
    steps: dict[tuple[str, str], Callable[[], None]] = {}
    try:
        for v in PAIRED_VARIANTS:
            if rec.skip_unavailable(v, [rows[(v, p)] for p in PHASES]):
                continue
            model, e = (rec.attempt(f"paired {tokens}x{d} {v} build", lambda v=v: build_ffn(v, d, s))
                        if inputs is not None else (None, err))
            if model is None:
                for p in PHASES:
                    rows[(v, p)]["error"] = e
                continue
            models[v] = model
            steps[(v, "fwd_bwd")] = train_step(model, *inputs)

            def forward(model=model) -> None:
                with torch.no_grad():
                    model(inputs[0])
            steps[(v, "fwd")] = forward
        timing: dict[tuple[str, str], Settings] = {}
        for key, fn in steps.items():  # warm-up: algorithm searches, compiles, allocations, a first refresh
            cycle = REFRESH.get(key[0], 1) if key[1] == "fwd_bwd" else 1
            ms, e = rec.attempt(f"paired {tokens}x{d} {key} warm-up",
                                lambda fn=fn, cycle=cycle: cycle_ms(fn, s, cycle))
            if e:
                rows[key]["error"] = e
            # each timing spans at least MIN_ROUND_MS: ten calls of a 0.4 ms step are host jitter
            reps = s.reps if s.smoke or not ms else max(s.reps, min(MAX_ROUND_REPS, math.ceil(MIN_ROUND_MS / ms)))
            reps = -(-reps // cycle) * cycle  # whole refresh cycles (NOTES["refresh"])
            timing[key] = dataclasses.replace(s, warmup=0, reps=reps)
            rows[key]["reps_per_round"] = reps
            if cycle > 1:
                rows[key]["timing"] = f"mean over whole cycles of {cycle} steps (NOTES['refresh'])"
        idle_s = s.idle_s if (tokens, d) == s.target else 0.0
        for row in rows.values():
            row["idle_s_before_turn"] = idle_s
        live = [k for k in steps if not rows[k].get("error")]
        for r in range(s.rounds):
            for phase in PHASES:
                order = [v for v in PAIRED_VARIANTS if (v, phase) in live]
                order = order[r % len(order):] + order[:r % len(order)] if order else order
                here = {}
                for v in order:
                    if idle_s:  # every turn starts from the same idle GPU state (NOTES["paired"])
                        torch.cuda.synchronize()
                        time.sleep(idle_s)
                    cycle = REFRESH.get(v, 1) if phase == "fwd_bwd" else 1
                    ms, e = rec.attempt(f"paired {tokens}x{d} {v} {phase} round {r}",
                                        lambda v=v, cycle=cycle: cycle_ms(steps[(v, phase)], timing[(v, phase)], cycle))
                    if ms is not None:
                        here[v] = ms
                        rows[(v, phase)]["round_ms"].append(ms)
                for v, ms in here.items():
                    if "dense" in here:
                        rows[(v, phase)]["round_speedups"].append(here["dense"] / ms)
    finally:
        models = steps = inputs = None
        _cleanup(s.device)
    for row in rows.values():
        if row["round_ms"]:
            row["ms"] = statistics.median(row["round_ms"])
        if row["round_speedups"]:
            row["speedup_vs_dense"] = statistics.median(row["round_speedups"])
            row["speedup_min"], row["speedup_max"] = min(row["round_speedups"]), max(row["round_speedups"])
    return list(rows.values())
