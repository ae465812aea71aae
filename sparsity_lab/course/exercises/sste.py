"""Exercises of notebook 05: S-STE's soft threshold, its scale beta, and the straight-through weight.

Worked solutions: ``sparsity_lab/course/exercises/solutions/sste.py``.
"""
from __future__ import annotations

import math

import secrets

import torch

from ...masks import nm_mask
from ...methods import soft_threshold, sste_beta
from .checking import CheckResult, ExerciseReport, run_check

SOLUTION = "sste"


def _fresh_generator() -> torch.Generator:
    """Fresh random inputs for every check, without touching the notebook's global torch RNG."""
    return torch.Generator().manual_seed(secrets.randbits(31))


def _cases(gen: torch.Generator) -> list[tuple[torch.Tensor, str]]:
    return [(torch.tensor([[0.9, -0.4, 0.3, -1.2]]), "the group [[0.9, -0.4, 0.3, -1.2]]"),
            (torch.randn(8, 16, generator=gen), "random 8 x 16"),
            (torch.randint(-2, 3, (4, 8), generator=gen).float(), "many ties (integers -2..2)"),
            (torch.tensor([[-3.0, -1.0, 2.0, 0.5, 0.0, 0.0, 0.0, 0.0]]), "negative values and an all-zero group")]


def _diagnose_soft(w: torch.Tensor, got: torch.Tensor) -> str:
    """Name the usual mistake when ``got`` is not S(w)."""
    mask = nm_mask(w, 2, 4)
    a = w.abs()
    groups = a.reshape(w.shape[0], -1, 4)
    smallest = groups.amin(-1, keepdim=True).expand_as(groups).reshape(w.shape)
    largest_pruned = a.masked_fill(mask, 0).reshape(w.shape[0], -1, 4).amax(-1, keepdim=True)
    largest_pruned = largest_pruned.expand_as(groups).reshape(w.shape)
    candidates = {
        "you returned the hard-pruned weight m * w: subtract the threshold t from the kept magnitudes":
            w * mask,
        "kept entries lost their sign: multiply by sign(w)":
            mask * (a - largest_pruned).clamp_min(0),
        "t must be the largest *pruned* magnitude of the group (for 2:4 the second smallest |w|), "
        "not the smallest": torch.where(mask, torch.sign(w) * (a - smallest).clamp_min(0), torch.zeros_like(w)),
        "pruned entries must be 0 (S is applied to the kept entries only)":
            torch.sign(w) * (a - largest_pruned).clamp_min(0),
        "a kept entry equal to t must give 0, not a negative magnitude: clamp |w| - t at 0":
            torch.where(mask, torch.sign(w) * (a - largest_pruned), torch.zeros_like(w)),
    }
    for why, wrong in candidates.items():
        if got.shape == wrong.shape and torch.allclose(got.double(), wrong.double(), atol=1e-6) \
                and not torch.allclose(wrong.double(), soft_threshold(w).double(), atol=1e-6):
            return why
    return ""


def check_soft_threshold(soft_fn, show: bool = True, hint: bool = False) -> CheckResult:
    r"""Exercise: ``soft_fn(w)`` -> $S(w)$ for a 2-D w, groups of 4 along the last dimension:
    $S(w)_i = m_i\,\mathrm{sign}(w_i)\max(|w_i| - t, 0)$, t = the largest pruned |w| of the group."""
    report = ExerciseReport("soft threshold S(w) of S-STE", solution=SOLUTION,
                            hint="m = the 2:4 mask; t = (|w| with the kept entries set to 0).amax over each group "
                                 "of 4; then where(m, sign(w) * (|w| - t).clamp_min(0), 0).")

    def body(r: ExerciseReport) -> None:
        gen = _fresh_generator()
        for w, label in _cases(gen):
            got = r.call(soft_fn, w.clone(), what=f"{label}: your soft_threshold(w)")
            if got is None:
                continue
            want = soft_threshold(w)
            if isinstance(got, torch.Tensor) and got.shape == want.shape and \
                    not torch.allclose(got.double(), want.double(), atol=1e-6):
                why = _diagnose_soft(w, got)
                if why:
                    r.expect(False, f"{label}: {why}")
                    continue
            r.expect_tensor(got, want, label, atol=1e-6)
    return run_check(report, body, show, hint)


def check_sste_beta(beta_fn, show: bool = True, hint: bool = False) -> CheckResult:
    r"""Exercise: ``beta_fn(w, s)`` -> $\beta = \langle W, S\rangle / \langle S, S\rangle$ (a number), and 1.0
    when S = 0."""
    report = ExerciseReport("beta = <W, S> / <S, S>", solution=SOLUTION,
                            hint="the least-squares scale: minimise ||W - b S||^2 over b; the sums run over "
                                 "every entry of the tensor.")

    def body(r: ExerciseReport) -> None:
        gen = _fresh_generator()
        w = torch.randn(16, 32, generator=gen)
        cases = [(w, soft_threshold(w), "random 16 x 32"),
                 (3 * w, soft_threshold(3 * w), "the same weight times 3 (beta must not change)"),
                 (torch.zeros(2, 8), torch.zeros(2, 8), "S(W) = 0 (an all-zero weight): return 1.0")]
        for w_, s, label in cases:
            got = r.call(beta_fn, w_.clone(), s.clone(), what=f"{label}: your beta")
            if got is None:
                continue
            try:
                value = float(got)
            except (TypeError, ValueError):
                r.expect(False, f"{label}: expected a number (or a 0-d tensor), got {type(got).__name__}")
                continue
            want = float(sste_beta(w_, s))
            if math.isclose(value, want, rel_tol=1e-5):
                continue
            wd, sd = w_.double(), s.double()
            if (sd * sd).sum() > 0 and math.isclose(value, float((sd * sd).sum() / (wd * sd).sum()), rel_tol=1e-5):
                r.expect(False, f"{label}: {value:.4f} is <S, S> / <W, S>, the inverse of beta")
            elif (sd * sd).sum() > 0 and math.isclose(value, float(wd.norm() / sd.norm()), rel_tol=1e-5):
                r.expect(False, f"{label}: {value:.4f} is ||W|| / ||S||; least squares gives <W, S> / <S, S>")
            elif math.isnan(value):
                r.expect(False, f"{label}: got nan: when <S, S> = 0 return 1.0 (nothing to rescale)")
            else:
                r.expect(False, f"{label}: got {value:.6g}, expected {want:.6g}")
    return run_check(report, body, show, hint)


def check_sste_weight(weight_fn, show: bool = True, hint: bool = False) -> CheckResult:
    r"""Exercise: ``weight_fn(w, beta)`` -> the weight the S-STE forward pass uses, $\beta S(w)$, whose
    gradient reaches the dense w unchanged (straight-through: $\partial L/\partial w = \partial L/\partial(\beta S(w))$)."""
    report = ExerciseReport("S-STE weight: beta * S(w) forward, identity backward", solution=SOLUTION,
                            hint="w + (beta * S(w) - w).detach() has the value beta * S(w) and the gradient of w.")

    def body(r: ExerciseReport) -> None:
        gen = _fresh_generator()
        w0 = torch.randn(8, 16, generator=gen)
        beta = sste_beta(w0, soft_threshold(w0))
        w = w0.clone().requires_grad_(True)
        out = r.call(weight_fn, w, beta, what="your weight_fn(w, beta)")
        if out is None:
            return
        if not r.expect_tensor(out, beta * soft_threshold(w0), "forward value beta * S(w)", atol=1e-5, rtol=1e-5):
            return
        if not out.requires_grad:
            r.expect(False, "the result does not require grad: the gradient cannot reach w "
                            "(did you compute it under torch.no_grad() or detach everything?)")
            return
        upstream = torch.randn(8, 16, generator=gen)
        try:
            (out * upstream).sum().backward()
        except RuntimeError as exc:
            r.expect(False, f"backward failed: {exc}")
            return
        if w.grad is None:
            r.expect(False, "w.grad is None after backward: the result must depend on w in the graph")
            return
        mask = nm_mask(w0, 2, 4)
        if torch.allclose(w.grad, upstream * mask):
            r.expect(False, "the gradient is zero at pruned entries: S-STE passes it to every weight (identity), "
                            "so pruned weights can grow back into the mask")
        elif torch.allclose(w.grad, beta * upstream):
            r.expect(False, "the gradient is scaled by beta: the straight-through estimator passes it unchanged")
        else:
            r.expect_tensor(w.grad, upstream, "gradient reaching w (straight-through: it must equal the upstream "
                                              "gradient, not the derivative of beta * S(w))", atol=1e-6)
    return run_check(report, body, show, hint)
