"""Timing one FFN variant at one shape, every measurement guarded (an error is recorded, the run goes on)."""
from __future__ import annotations

import contextlib
import gc
import statistics
import time
import traceback
from collections import Counter
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.conditions import ConditionSampler
from benchmarks.ffn.schema import (LIBRARY_COMPARISON, LIBRARY_ROLES, NOTES, OURS, PHASES, REFRESH, VARIANTS, _row,
                                  fill_speedups)
from benchmarks.ffn.settings import Settings
from benchmarks.ffn.variants import SemiStructuredFFN, build_ffn, sparse_backend, train_step


# --- recording: every measurement guarded, a time budget ---------------------------------------------
def _cleanup(device: torch.device) -> None:
    """Give the freed GPU memory back before the next model (a no-op on the CPU, where it is not needed)."""
    if device.type == "cuda":
        gc.collect()  # a reference cycle must not keep a model's GPU memory alive into the next variant
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 - an earlier asynchronous error; it was recorded where it surfaced
            pass
        torch.cuda.empty_cache()


class Recorder:
    """Errors, skipped work and the clock of one run."""

    def __init__(self, settings: Settings, sampler: ConditionSampler | None = None,
                 unavailable: dict[str, str] | None = None) -> None:
        self.s = settings
        self.start = time.monotonic()
        self.errors: list[dict] = []
        self.skipped: list[dict] = []
        self.sampler = sampler  # the GPU's clocks and power, per section (conditions.py)
        # variants whose library cannot run here -> why (variants.unavailable_variants): skipped, with the reason
        self.unavailable = dict(unavailable or {})
        for variant, reason in self.unavailable.items():
            self.skipped.append({"what": f"{variant} (every section)", "reason": reason})

    def skip_unavailable(self, variant: str, rows) -> bool:
        """True (each row marked "skipped" with the reason) when ``variant``'s library cannot run here."""
        reason = self.unavailable.get(variant)
        for row in rows if reason is not None else ():
            row["skipped"] = reason
        return reason is not None

    def section(self, name: str):
        """``with rec.section("paired 16384x4096"):`` marks the GPU-condition samples of that part."""
        return self.sampler.section(name) if self.sampler is not None else contextlib.nullcontext()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def may_start(self, what: str) -> bool:
        """False (and ``what`` listed as skipped) once the time budget is spent."""
        if self.elapsed() < self.s.budget_s:
            return True
        self.skipped.append({"what": what, "reason": f"time budget (--budget-s {self.s.budget_s:g}) spent at "
                                                     f"{self.elapsed():.0f} s"})
        return False

    def attempt(self, where: str, fn: Callable[[], Any]) -> tuple[Any, str | None]:
        """(fn(), None), or (None, the error text) with the error recorded; never raises."""
        try:
            value = fn()
            if self.s.device.type == "cuda":
                torch.cuda.synchronize()  # surface asynchronous errors here, not in the next measurement
            return value, None
        except Exception as err:  # noqa: BLE001 - record anything and go on
            text = f"{type(err).__name__}: {err}"[:2000]
            self.errors.append({"where": where, "error": text, "traceback": traceback.format_exc()[-3000:]})
            print(f"  error in {where}: {text[:300]}", flush=True)
            _cleanup(self.s.device)
            return None, text


def median_ms(fn: Callable[[], object], s: Settings) -> float:
    """Median milliseconds of ``fn()`` over ``s.reps`` calls after ``s.warmup`` calls."""
    for _ in range(s.warmup):
        fn()
    if s.device.type != "cuda":
        times = []
        for _ in range(s.reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(s.reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def cycle_ms(fn: Callable[[], object], s: Settings, cycle: int) -> float:
    """Mean milliseconds per call over whole cycles of ``cycle`` calls (at least ``s.reps`` calls), after
    ``s.warmup`` calls: one event pair around them all, so that a mask refresh due once per cycle is in
    the figure (a median of single calls would drop it). cycle=1: ``median_ms``."""
    if isinstance(cycle, bool) or not isinstance(cycle, int) or cycle < 1:
        raise ValueError(f"cycle must be an int >= 1, got {cycle!r}")
    if cycle == 1:
        return median_ms(fn, s)
    # a warm-up that spans a whole cycle: the first refresh of a model pays one-time costs (seen on the
    # H100: one paired round of ours_mvue_refresh40 at 28 ms per step, the next two at 14.0)
    for _ in range(max(s.warmup, cycle + 1) if s.warmup else 0):
        fn()
    calls = -(-s.reps // cycle) * cycle
    if s.device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) * 1e3 / calls
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


class StatsWindow:
    """The backend's counters (compressions, padded_calls, copies, products) over a window, per step."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.before = Counter(backend.stats)

    def per_step(self, steps: int) -> dict[str, float]:
        delta = Counter(self.backend.stats) - self.before
        return {key: value / steps for key, value in sorted(delta.items())}


def forward_rel_err(model: nn.Module, x: torch.Tensor) -> float:
    """||y - y_ref|| / ||y_ref||, y_ref the dense products of the same masked weights (a fast path
    that is fast because it is wrong would show here)."""
    with torch.no_grad():
        out = model(x).float()
        if isinstance(model, SemiStructuredFFN):
            ref = model.reference(x)
        else:
            w1, w2 = (lin.sparse_weight().to(x.dtype) for lin in (model.up, model.down))
            ref = F.linear(F.gelu(F.linear(x, w1)), w2)
        ref = ref.float()
        return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def measure_variant(variant: str, tokens: int, d: int, x: torch.Tensor, dy: torch.Tensor, s: Settings,
                    rec: Recorder, reports: dict) -> list[dict]:
    """The fwd_bwd and fwd rows of one variant at one shape."""
    from sparsity_lab.sparsify import backend_report, format_backend_report

    label = f"{tokens}x{d} {variant}"
    rows = {phase: _row(tokens, d, variant, phase) for phase in PHASES}
    if rec.skip_unavailable(variant, rows.values()):
        return list(rows.values())
    if variant == "pytorch_semi_structured":
        for row in rows.values():
            row["note"] = NOTES["pytorch_semi_structured"]
    model, err = rec.attempt(f"{label} build", lambda: build_ffn(variant, d, s))
    if model is None:
        for row in rows.values():
            row["error"] = err
        return list(rows.values())
    backend = sparse_backend(model) if variant in OURS else None
    if backend is not None:
        for row in rows.values():
            row["backend"], row["method"] = backend.name, model.up.method.describe()
    phases: dict[str, Callable[[], None]] = {}
    try:
        phases["fwd_bwd"] = train_step(model, x, dy)

        def forward() -> None:
            with torch.no_grad():
                model(x)
        phases["fwd"] = forward
        for phase, fn in phases.items():
            window = StatsWindow(backend) if backend is not None else None
            cycle = REFRESH.get(variant, 1) if phase == "fwd_bwd" else 1
            ms, err = rec.attempt(f"{label} {phase}", lambda fn=fn, cycle=cycle: cycle_ms(fn, s, cycle))
            rows[phase]["ms"] = ms
            if cycle > 1:
                rows[phase]["timing"] = f"mean over whole cycles of {cycle} steps (NOTES['refresh'])"
            if err:
                rows[phase]["error"] = err
            if window is not None:
                warm = max(s.warmup, cycle + 1) if s.warmup and cycle > 1 else s.warmup
                counted = warm + (-(-s.reps // cycle) * cycle)
                rows[phase]["steps_counted"] = counted
                rows[phase]["stats_per_step"] = window.per_step(counted)
        if variant != "dense":
            rel, err = rec.attempt(f"{label} forward check", lambda: forward_rel_err(model, x))
            rows["fwd"]["rel_err_vs_masked_dense"] = rel
        if backend is not None and (tokens, d) == s.target and variant in (*LIBRARY_COMPARISON, "auto", "sparse_auto"):
            text, err = rec.attempt(f"{label} backend report", lambda: format_backend_report(backend_report(model)))
            reports[variant] = text if text is not None else f"error: {err}"  # printed with the table
    finally:
        model = phases = None  # the step closures hold the model too: release both before the next variant
        _cleanup(s.device)
    return list(rows.values())


def _inputs(tokens: int, d: int, s: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=s.device).manual_seed(tokens + d)
    x = torch.randn(tokens, d, device=s.device, generator=gen).to(s.dtype).requires_grad_(True)
    dy = torch.randn(tokens, d, device=s.device, generator=gen).to(s.dtype)
    return x, dy


def _backend_marks(s: Settings, rec: Recorder) -> dict[str, tuple[int, int]]:
    """How many algorithm choices and auto decisions each backend holds now (to report the new ones)."""
    from sparsity_lab.backends import get_backend

    marks = {}
    missing = {s.backends[LIBRARY_ROLES[v]] for v in rec.unavailable}  # already reported as skipped
    for name in sorted(set(s.backends.values()) - missing):
        backend, _ = rec.attempt(f"backend {name!r}", lambda name=name: get_backend(name))
        if backend is not None:
            summary = backend.summary()
            marks[name] = (len(summary["algorithms"]), len(summary["decisions"]))
    return marks


def _backend_news(marks: dict[str, tuple[int, int]]) -> dict[str, dict]:
    from sparsity_lab.backends import get_backend

    news = {}
    for name, (n_alg, n_dec) in marks.items():
        summary = get_backend(name).summary()
        news[name] = {"algorithms": summary["algorithms"][n_alg:], "decisions": summary["decisions"][n_dec:],
                      "stats_total": summary["stats"]}
    return news


def measure_shape(tokens: int, d: int, s: Settings, rec: Recorder, reports: dict) -> tuple[list[dict], dict]:
    """Every variant at one shape: (rows, the shape's record with the backends' algorithm choices)."""
    print(f"FFN {tokens} tokens x d_model {d} (ffn {4 * d}) ...", flush=True)
    t0 = time.monotonic()
    marks = _backend_marks(s, rec)
    rows: list[dict] = []
    inputs, err = rec.attempt(f"{tokens}x{d} inputs", lambda: _inputs(tokens, d, s))
    if inputs is None:
        for variant in VARIANTS:
            for phase in PHASES:
                rows.append({**_row(tokens, d, variant, phase), "error": err})
    else:
        for variant in VARIANTS:
            rows += measure_variant(variant, tokens, d, *inputs, s, rec, reports)
    fill_speedups(rows)
    inputs = None
    _cleanup(s.device)
    news, _ = rec.attempt(f"{tokens}x{d} backend summary", lambda: _backend_news(marks))
    return rows, {"tokens": tokens, "d_model": d, "ffn": 4 * d, "wall_s": time.monotonic() - t0,
                  "backends": news or {}}
