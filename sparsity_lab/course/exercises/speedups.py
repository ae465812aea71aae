"""Exercises of notebook 08 (speed-ups): count the FLOPs of a linear layer's three products, turn a
time into TFLOP/s, predict a whole step's speed-up from its products' share and speed-up (Amdahl's
law; the notebook then applies it to a recorded step profile), and a product's arithmetic intensity."""
from __future__ import annotations

import math
import random

from ...flops import PRODUCTS, linear_flops, tflops
from .checking import ExerciseReport, run_check


def check_linear_flops(linear_flops_fn, show: bool = True, hint: bool = False):
    """``linear_flops_fn(tokens, d_in, d_out)`` -> dict {"forward", "grad_input", "grad_weight"}: FLOPs
    of Z = X W^T, dX = dZ W and dW = dZ^T X for X (tokens, d_in), W (d_out, d_in)."""
    report = ExerciseReport("linear_flops: the FLOPs of a linear layer's three products",
                            hint="an (m, k) @ (k, n) product does m*k*n multiply-adds, and a multiply-add is "
                                 "2 FLOPs; write down the shapes of the two operands of each product.",
                            solution="speedups")

    def body(r):
        rng = random.Random()
        cases = [(1, 1, 1), (8, 16, 32), (5, 3, 7), (4096, 1024, 4096)]
        cases += [(rng.randint(1, 300), rng.randint(1, 300), rng.randint(1, 300)) for _ in range(3)]
        for tokens, d_in, d_out in cases:
            got = r.call(linear_flops_fn, tokens, d_in, d_out, what=f"linear_flops({tokens}, {d_in}, {d_out})")
            if got is None:
                return
            want = linear_flops(tokens, d_in, d_out)
            if not isinstance(got, dict):
                r.expect(False, f"linear_flops(...) should return a dict with keys {list(PRODUCTS)}, "
                                f"got {type(got).__name__}")
                return
            if set(got) != set(PRODUCTS):
                r.expect(False, f"keys {sorted(got)}, expected {sorted(PRODUCTS)}")
                return
            for name in PRODUCTS:
                if got[name] != want[name]:
                    ratio = got[name] / want[name] if want[name] else math.nan
                    why = {0.5: " (half: a multiply-add is 2 FLOPs)", 2.0: " (twice too many)"}.get(ratio, "")
                    r.expect(False, f"linear_flops({tokens}, {d_in}, {d_out})[{name!r}] = {got[name]}, "
                                    f"expected {want[name]}{why}")
                    return
    return run_check(report, body, show, hint)


def check_tflops(tflops_fn, show: bool = True, hint: bool = False):
    """``tflops_fn(flops, ms)`` -> the achieved rate in TFLOP/s (10^12 FLOP per second)."""
    report = ExerciseReport("tflops: achieved TFLOP/s from a FLOP count and a time in milliseconds",
                            hint="rate = FLOPs / seconds; 1 ms = 1e-3 s and 1 TFLOP = 1e12 FLOP.",
                            solution="speedups")

    def body(r):
        rng = random.Random()
        cases = [(2e12, 1000.0), (1.32e13, 21.4), (2 * 16384 * 4096 * 16384, 3.28), (1.0, 1e-9)]
        cases += [(rng.uniform(1e9, 1e14), rng.uniform(0.01, 100.0)) for _ in range(3)]
        for flops, ms in cases:
            got = r.call(tflops_fn, flops, ms, what=f"tflops({flops:.4g}, {ms:.4g})")
            if got is None:
                return
            want = tflops(flops, ms)
            if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-9):
                why = ""
                if isinstance(got, (int, float)) and want and math.isclose(got / want, 1e-3, rel_tol=1e-6):
                    why = " (1000x too small: ms is milliseconds)"
                r.expect(False, f"tflops({flops:.4g}, {ms:.4g}) = {got!r}, expected {want:.6g}{why}")
                return
    return run_check(report, body, show, hint)


def reference_step_speedup(f: float, s: float) -> float:
    """Amdahl's law: the step's speed-up when the share ``f`` of the dense step runs ``s`` times faster
    and the rest as before, 1 / ((1 - f) + f / s)."""
    return 1.0 / ((1.0 - f) + f / s)


# The classic wrong answers to Amdahl's law, each with what it gets wrong (the check names the one it sees).
# At f = s / (s + 1) the mean of the speed-ups equals the right answer, and at f = 1/2 the harmonic mean
# does: the check's first inputs sit far from both, so that each mistake differs from the answer there.
STEP_MISTAKES = (
    (lambda f, s: (s + 1) / 2,
     "that is the mean of the speed-ups s and 1 at equal weights: it ignores how much of the step the "
     "products take; add up the new times of the parts instead"),
    (lambda f, s: f * s + (1 - f),
     "that is the mean of the speed-ups weighted by time: speed-ups do not add up, times do"),
    (lambda f, s: 2 / (1 / s + 1),
     "that is the harmonic mean of s and 1 at equal weights: right only when the products take half the step"),
    (lambda f, s: s, "that is the products' speed-up alone: the rest of the step does not get faster"),
    (lambda f, s: (1 - f) + f / s, "that is the new step time as a share of the old one: the speed-up is its inverse"),
    (lambda f, s: 1 / ((1 - f) + f * s), "the products' new time is f / s, not f * s"),
    (lambda f, s: 1 / (1 - f) if f < 1 else math.inf, "that is the ceiling with infinitely fast products"),
)


def check_step_speedup(step_speedup_fn, show: bool = True, hint: bool = False):
    """``step_speedup_fn(f, s)``: the speed-up of a whole step whose products take the share ``f`` of the
    dense step and run ``s`` times faster, the rest of the step as before (Amdahl's law)."""
    report = ExerciseReport("step_speedup: a step's speed-up from its products' share and speed-up",
                            hint="take the dense step as 1: the products take f and then f / s, the rest "
                                 "takes 1 - f as before; the speed-up is the old time over the new one. Do "
                                 "not average the speed-ups.",
                            solution="speedups")

    def body(r):
        rng = random.Random()
        cases = [(0.9, 2.0), (0.25, 1.5), (0.66, 1.56), (0.5, 1.5), (1.0, 2.0), (0.0, 3.0), (0.6, 0.8), (0.7, 1.0)]
        cases += [(rng.uniform(0.0, 1.0), rng.uniform(0.3, 3.0)) for _ in range(3)]
        for f, s in cases:
            what = f"step_speedup({f:.4g}, {s:.4g})"
            got = r.call(step_speedup_fn, f, s, what=what)
            if got is None:
                return
            want = reference_step_speedup(f, s)
            number = isinstance(got, (int, float)) and not isinstance(got, bool)
            if number and math.isclose(got, want, rel_tol=1e-9):
                continue
            why = next((f" ({text})" for mistake, text in STEP_MISTAKES
                        if number and math.isclose(got, mistake(f, s), rel_tol=1e-9)), "")
            r.expect(False, f"{what} = {got!r}, expected {want:.6g}{why}")
            return
    return run_check(report, body, show, hint)


def check_intensity(intensity_fn, show: bool = True, hint: bool = False):
    """``intensity_fn(m, k, n, sparse)`` -> FLOP per byte of the bf16 product A (m, k) @ B (k, n): its
    2*m*k*n FLOPs over the bytes of A, B and the output, A compressed to 2:4 (values and metadata) when
    ``sparse``."""
    from ..viz.roofline_view import intensity, product_bytes

    report = ExerciseReport("intensity: FLOP per byte of a product, dense and with a 2:4 weight",
                            hint="bytes = 2 per bf16 value of A, B and the output (m*n values); a 2:4 A keeps "
                                 "m*k/2 values plus 2 bits of metadata per kept value.",
                            solution="speedups")

    def body(r):
        rng = random.Random()
        cases = [(4, 4, 4, False), (4, 4, 4, True), (16384, 4096, 16384, True), (1024, 4096, 4096, False)]
        cases += [(rng.randint(1, 64), 4 * rng.randint(1, 64), rng.randint(1, 64), rng.random() < 0.5)
                  for _ in range(4)]
        for m, k, n, sparse in cases:
            got = r.call(intensity_fn, m, k, n, sparse, what=f"intensity({m}, {k}, {n}, sparse={sparse})")
            if got is None:
                return
            want = intensity(m, k, n, sparse)
            if isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=1e-9):
                continue
            flops, b = 2 * m * k * n, product_bytes(m, k, n, sparse)
            why = ""
            if isinstance(got, (int, float)) and got > 0:
                wrong = {"the output's bytes are missing": b["total"] - b["output"],
                         "the metadata's bytes are missing (2 bits per kept value)":
                             b["total"] - (m * k // 2) * 2 // 8 if sparse else None,
                         "the 2:4 weight counts in full (it keeps half its values)":
                             product_bytes(m, k, n, False)["total"] if sparse else None,
                         "that is 4 bytes per value (bf16 has 2)": 2 * b["total"]}
                for what, total in wrong.items():
                    if total and math.isclose(got, flops / total, rel_tol=1e-9):
                        why = f" ({what})"
                        break
            r.expect(False, f"intensity({m}, {k}, {n}, sparse={sparse}) = {got!r}, expected {want:.6g}{why}")
            return
    return run_check(report, body, show, hint)
