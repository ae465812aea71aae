r"""Exercise of notebook 06, section 6: delayed FP8 scaling (the amax-history recipe).

``scales_fn(amaxes, history_len, margin, fp8_max)`` gets the amax recorded at each optimizer step
$h_1, \dots, h_T$ and returns the scale after each step: $s_{t+1} = \frac{a_t}{\text{fp8\_max}} 2^{\text{margin}}$
with $a_t = \max(h_{t-L+1}, \dots, h_t)$ (the current step included); an $a_t$ that is 0 or not finite keeps
the previous scale (1 before the first). Checked against ``sparsity_lab.methods.fp8_scaling.FP8ScalingState``.
Worked solution: ``sparsity_lab/course/exercises/solutions/fp8_scaling.py``.
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
