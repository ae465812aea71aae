"""Exercises of notebook 13 (2:4 activation sparsity): prune a squared-ReLU activation to 2:4, measure
how sparse it already is, write its straight-through gradient, and bound the FFN's speed-up."""
from __future__ import annotations

import math
import random

import torch

from ...references.act24 import act24, act24_grad, natural_24_stats
from .checking import ExerciseReport, run_check, tie_broken_otherwise, tie_problem


def _inputs(rows: int, hidden: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Fresh H for the checks: random, tied groups, all-negative groups, wide magnitudes."""
    h = torch.randn(rows, hidden, generator=gen, dtype=torch.float64)
    ties = h.clone()
    ties[:, 1::4] = ties[:, 0::4]  # two equal values in every group
    ties[0, :4] = 0.5              # a group of four equal values
    negative = h - 2.0             # most groups all zero after the ReLU
    wide = h * torch.exp(3 * torch.randn(rows, hidden, generator=gen, dtype=torch.float64))
    return {"random": h, "ties": ties, "mostly negative": negative, "wide magnitudes": wide}


def check_act24(act24_fn, show: bool = True, hint: bool = False):
    """``act24_fn(h)`` -> relu(h)^2 with only the 2 largest of every 4 consecutive entries along the
    last dimension kept (ties to the lowest index), the others set to 0; h (..., hidden), hidden % 4 == 0."""
    report = ExerciseReport("act24: squared ReLU pruned to 2:4 along the hidden dimension",
                            hint="apply relu and square first; reshape the last dimension into groups of 4, rank "
                                 "each group with a stable descending sort (ties: lowest index first) and keep "
                                 "ranks 0 and 1.",
                            solution="act24")

    def body(r):
        gen = torch.Generator().manual_seed(random.randrange(2**31))
        for rows, hidden in ((3, 8), (5, 12), (1, 4), (7, 64)):
            for name, h in _inputs(rows, hidden, gen).items():
                got = r.call(act24_fn, h.clone(), what=f"act24(h {rows}x{hidden}, {name})")
                if got is None:
                    return
                want, mask = act24(h)
                if isinstance(got, torch.Tensor) and got.shape == want.shape:
                    nz = (got != 0).reshape(rows, -1, 4).sum(-1)
                    if bool((nz > 2).any()):
                        r.expect(False, f"{name} h {rows}x{hidden}: a group of 4 keeps {int(nz.max())} non-zeros; "
                                        "2:4 keeps at most 2")
                        return
                    if name == "random" and bool((got < 0).any()):
                        r.expect(False, "negative values in the output: apply relu and square before pruning")
                        return
                    by_abs_h = h.clamp(min=0) ** 2 * _mask_of(h.abs())
                    if not torch.equal(by_abs_h, want) and torch.allclose(got.double(), by_abs_h, atol=1e-12):
                        r.expect(False, "the kept entries were chosen by |h| before the ReLU: a large negative h "
                                        "becomes 0, so choose on relu(h)^2")
                        return
                    at = tie_broken_otherwise(got, want, 4)
                    if at is not None:
                        r.expect(False, tie_problem(f"act24(h {rows}x{hidden}, {name})", at))
                        return
                if not r.expect_tensor(got, want, f"act24(h {rows}x{hidden}, {name})", atol=1e-12, rtol=1e-12):
                    return
    return run_check(report, body, show, hint)


def _mask_of(a: torch.Tensor) -> torch.Tensor:
    from ...references.act24 import top2of4_mask
    return top2of4_mask(a)


def check_natural_sparsity(stats_fn, show: bool = True, hint: bool = False):
    """``stats_fn(a)`` -> (zero_fraction, at_most_2_fraction) of an activation a (..., hidden): the
    fraction of exact zeros, and of groups of 4 along the last dimension with at most 2 non-zeros."""
    report = ExerciseReport("natural_sparsity: zeros, and groups of 4 with at most 2 non-zeros",
                            hint="count non-zeros per group with (a != 0).reshape(-1, 4).sum(-1); a group "
                                 "loses nothing to 2:4 when that count is <= 2.",
                            solution="act24")

    def body(r):
        gen = torch.Generator().manual_seed(random.randrange(2**31))
        for rows, hidden in ((4, 8), (6, 16), (3, 40)):
            for name, h in _inputs(rows, hidden, gen).items():
                a = h.clamp(min=0) ** 2
                got = r.call(stats_fn, a.clone(), what=f"natural_sparsity(a {rows}x{hidden}, {name})")
                if got is None:
                    return
                want = natural_24_stats(a)
                want = (want["zero_fraction"], want["groups_at_most_2_fraction"])
                try:
                    values = tuple(float(v) for v in got)
                except (TypeError, ValueError):
                    r.expect(False, f"return a pair of numbers (zero_fraction, at_most_2_fraction), got {got!r}")
                    return
                if len(values) != 2:
                    r.expect(False, f"return two numbers, got {len(values)}")
                    return
                if not math.isclose(values[0], want[0], abs_tol=1e-9):
                    r.expect(False, f"{name}: zero_fraction {values[0]:.4f}, expected {want[0]:.4f}")
                    return
                if not math.isclose(values[1], want[1], abs_tol=1e-9):
                    low = " (groups with exactly 2 non-zeros lose nothing either: <= 2, not < 2)" \
                        if values[1] < want[1] else ""
                    r.expect(False, f"{name}: at_most_2_fraction {values[1]:.4f}, expected {want[1]:.4f}{low}")
                    return
    return run_check(report, body, show, hint)


def check_grad_h(grad_h_fn, show: bool = True, hint: bool = False):
    """``grad_h_fn(h, grad_a24)`` -> dL/dH for A24 = act24(H), straight-through on the kept entries:
    dH = dA24 * M * 2 relu(H), M the 2:4 mask of relu(H)^2 (the pruned entries get no gradient)."""
    report = ExerciseReport("grad_h: the straight-through gradient of a 2:4 squared ReLU",
                            hint="d relu(h)^2 / dh = 2 relu(h); multiply by the incoming gradient and by the "
                                 "forward's 2:4 mask (recompute it from h).",
                            solution="act24")

    def body(r):
        gen = torch.Generator().manual_seed(random.randrange(2**31))
        for rows, hidden in ((3, 8), (5, 12), (2, 32)):
            for name, h in _inputs(rows, hidden, gen).items():
                da = torch.randn(rows, hidden, generator=gen, dtype=torch.float64)
                got = r.call(grad_h_fn, h.clone(), da.clone(), what=f"grad_h(h {rows}x{hidden}, {name})")
                if got is None:
                    return
                want = act24_grad(h, da)
                if isinstance(got, torch.Tensor) and got.shape == want.shape:
                    no_mask = da * 2 * h.clamp(min=0)
                    if torch.allclose(got.double(), no_mask) and not torch.allclose(no_mask, want):
                        r.expect(False, f"{name}: pruned entries received a gradient: multiply by the 2:4 mask "
                                        "(the pruned activations did not reach the output)")
                        return
                    if torch.allclose(got.double(), want / 2) and bool(want.any()):
                        r.expect(False, f"{name}: half the expected gradient: d relu(h)^2/dh = 2 relu(h)")
                        return
                if not r.expect_tensor(got, want, f"grad_h(h {rows}x{hidden}, {name})", atol=1e-12, rtol=1e-12):
                    return
    return run_check(report, body, show, hint)


def reference_ffn_speedup(sparse_products: int, product_speedup: float, total_products: int = 6) -> float:
    """Amdahl over equal-sized products: total / (total - k + k / s)."""
    return total_products / (total_products - sparse_products + sparse_products / product_speedup)


def check_ffn_speedup(speedup_fn, show: bool = True, hint: bool = False):
    """``speedup_fn(sparse_products, product_speedup, total_products=6)`` -> the FFN step's ideal speed-up
    when ``sparse_products`` of its ``total_products`` equal-sized products run ``product_speedup`` times
    faster and the rest (and everything else) stays as it is."""
    report = ExerciseReport("ffn_speedup: the ceiling Amdahl's law puts on 2:4 activations",
                            hint="every product takes the same dense time t; the new step takes "
                                 "(total - k) t + k t / s.",
                            solution="act24")

    def body(r):
        rng = random.Random()
        cases = [(2, 2.0, 6), (3, 2.0, 6), (6, 2.0, 6), (0, 1.7, 6), (2, 1.6, 6)]
        cases += [(rng.randint(0, 6), rng.uniform(1.0, 2.0), 6) for _ in range(3)]
        for k, s, total in cases:
            got = r.call(speedup_fn, k, s, total, what=f"ffn_speedup({k}, {s:.3g}, {total})")
            if got is None:
                return
            want = reference_ffn_speedup(k, s, total)
            if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-9):
                why = ""
                if isinstance(got, (int, float)) and math.isclose(got, 1 + k / total * (s - 1), rel_tol=1e-9) and k:
                    why = " (that averages the speed-ups; Amdahl adds the times)"
                r.expect(False, f"ffn_speedup({k}, {s:.3g}, {total}) = {got!r}, expected {want:.6g}{why}")
                return
    return run_check(report, body, show, hint)
