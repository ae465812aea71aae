r"""Exercises on FP8 scales: delayed scaling (notebook 15, section 3) and the bytes of a scale pass
(notebook 06, section 4).

Delayed scaling (the amax-history recipe):

``scales_fn(amaxes, history_len, margin, fp8_max)`` gets the amax recorded at each optimizer step
$h_1, \dots, h_T$ and returns the scale after each step: $s_{t+1} = \frac{a_t}{\text{fp8\_max}} 2^{\text{margin}}$
with $a_t = \max(h_{t-L+1}, \dots, h_t)$ (the current step included); an $a_t$ that is 0 or not finite keeps
the previous scale (1 before the first). Checked against ``sparsity_lab.methods.fp8_scaling.FP8ScalingState``.

The scale pass: ``pass_bytes_fn(m, n, bytes_in, bytes_out)`` returns the bytes a separate pass that scales an
(m, n) product output moves (every entry read once and written once), checked against
``sparsity_lab.course.viz.fp8_training_view.scale_pass_bytes``.
Worked solutions: ``sparsity_lab/course/exercises/solutions/fp8_scaling.py``.
"""
from __future__ import annotations

import math
import secrets

import torch

from ...methods.fp8_scaling import FP8Recipe, FP8ScalingState
from .checking import CheckResult, ExerciseReport, run_check

SOLUTION = "fp8_scaling"
E4M3_MAX = 448.0


def reference_delayed_scales(amaxes: list[float], history_len: int, margin: int = 0,
                             fp8_max: float = E4M3_MAX) -> list[float]:
    """The library's scales (column "x", E4M3) after each step, for the amaxes recorded one per step."""
    if fp8_max != E4M3_MAX:
        raise ValueError("the library's X column is E4M3: fp8_max must be 448")
    state = FP8ScalingState(FP8Recipe(history_len=history_len, margin=margin))
    out = []
    for a in amaxes:
        state.record("x", torch.tensor(a))
        state.advance()
        out.append(float(state.scale[0]))
    return out


def _cases() -> list[tuple[list[float], int, int, str]]:
    gen = torch.Generator().manual_seed(secrets.randbits(31))
    fresh = (torch.rand(12, generator=gen) * 10.0 ** torch.randint(-6, 3, (12,), generator=gen)).tolist()
    return [([2.0, 8.0, 4.0, 1.0, 0.5, 0.25], 3, 0, "a spike that leaves the window after 3 steps"),
            ([2.0, 8.0, 4.0, 1.0], 1, 0, "history_len 1 (the most recent amax)"),
            ([3.0, 5.0, 1.0], 2, 2, "margin 2 (scales times 4)"),
            ([4.0, 0.0, math.inf, 2.0], 1, 0, "an amax of 0 and an infinite one (keep the previous scale)"),
            (fresh, 4, 1, "12 fresh random amaxes over 9 decades")]


def check_delayed_scales(scales_fn, show: bool = True, hint: bool = False) -> CheckResult:
    report = ExerciseReport("delayed scaling: the scale after each step from the amax history", solution=SOLUTION,
                            hint="keep the last history_len amaxes (this step's included); the scale is their max "
                                 "/ fp8_max * 2**margin; a max of 0 or inf keeps the previous scale (1 at first).")

    def body(r: ExerciseReport) -> None:
        for amaxes, length, margin, label in _cases():
            got = r.call(scales_fn, list(amaxes), length, margin, E4M3_MAX, what=f"{label}: your scales")
            if got is None:
                continue
            want = torch.tensor(reference_delayed_scales(amaxes, length, margin), dtype=torch.float64)
            try:
                got_t = torch.as_tensor(got, dtype=torch.float64).reshape(-1)
            except (TypeError, ValueError, RuntimeError):
                r.expect(False, f"{label}: expected a list of {len(amaxes)} numbers, got {type(got).__name__}")
                continue
            r.expect_tensor(got_t, want, f"{label} (history_len={length}, margin={margin})", rtol=1e-6)

    return run_check(report, body, show, hint)


def _pass_cases() -> list[tuple[int, int, int, int, str]]:
    gen = torch.Generator().manual_seed(secrets.randbits(31))
    m, n = (int(v) for v in torch.randint(1, 5000, (2,), generator=gen))
    return [(16384, 16384, 2, 2, "the up product's output, bf16 in and out"),
            (4096, 16384, 2, 2, "the down product's output, bf16 in and out"),
            (4096, 16384, 4, 2, "float32 in, bf16 out"),
            (3, 5, 2, 1, "a 3 x 5 output, bf16 in, FP8 out"),
            (m, n, 2, 2, f"a fresh {m} x {n} output")]


def check_pass_bytes(pass_bytes_fn, show: bool = True, hint: bool = False) -> CheckResult:
    from ..viz.fp8_training_view import scale_pass_bytes

    report = ExerciseReport("the bytes a scale pass after the product moves", solution=SOLUTION,
                            hint="the pass touches only the output, m * n entries (k plays no part): it reads "
                                 "each once (bytes_in) and writes each once (bytes_out).")

    def body(r: ExerciseReport) -> None:
        for m, n, b_in, b_out, label in _pass_cases():
            got = r.call(pass_bytes_fn, m, n, b_in, b_out, what=f"{label}: your function")
            if got is None:
                continue
            want = scale_pass_bytes(m, n, b_in, b_out)
            if not isinstance(got, (int, float)) or isinstance(got, bool):
                r.expect(False, f"{label}: expected a number of bytes, got {type(got).__name__}")
            elif got == m * n * b_in or got == m * n * b_out:
                r.expect(False, f"{label}: {got} bytes counts one direction only; the pass reads and writes")
            else:
                r.expect(got == want, f"{label} (m={m}, n={n}, bytes_in={b_in}, bytes_out={b_out}): "
                                      f"got {got}, expected {want}")

    return run_check(report, body, show, hint)
