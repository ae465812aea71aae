r"""Exercises of notebook 06: the MVUE 2:4 estimator (inclusion probabilities, sampler, variance).

The sampler is checked statistically: the mean of $K$ independent draws of an unbiased estimator
misses $x_i$ by about one standard error $|x_i|\sqrt{(1/p_i - 1)/K}$, so the bound on the error
shrinks like $1/\sqrt{K}$ while a bias does not: with enough draws any bias is caught.
Worked solutions: ``sparsity_lab/course/exercises/solutions/mvue.py``.
"""
from __future__ import annotations

import math

import secrets

import torch

from ...methods.mvue import mvue_probabilities
from .checking import CheckResult, ExerciseReport, run_check

SOLUTION = "mvue"


def _fresh_generator() -> torch.Generator:
    """Fresh random inputs for every check, without touching the notebook's global torch RNG."""
    return torch.Generator().manual_seed(secrets.randbits(31))
# |mean - x| <= Z_BOUND standard errors at every entry: for an unbiased sampler the chance that one of
# the 16 checked entries lands further out is below 16 * 6e-7 (normal tails; K is large).
Z_BOUND = 5.0


def _groups() -> list[tuple[torch.Tensor, str]]:
    return [(torch.tensor([[1.0, 1.0, 1.0, 1.0]]), "[1, 1, 1, 1] (all equal)"),
            (torch.tensor([[3.0, -1.0, 0.5, 0.25]]), "[3, -1, 0.5, 0.25] (one dominant entry)"),
            (torch.tensor([[0.0, 2.0, 0.0, -1.0]]), "[0, 2, 0, -1] (two non-zeros)"),
            (torch.tensor([[0.0, -2.0, 0.0, 0.0]]), "[0, -2, 0, 0] (one non-zero)"),
            (torch.randn(16, 4, dtype=torch.float64, generator=_fresh_generator()), "16 random groups")]


def check_mvue_probabilities(prob_fn, show: bool = True, hint: bool = False) -> CheckResult:
    r"""Exercise: ``prob_fn(groups)`` -> p of shape (G, 4): minimise $\sum_i x_i^2 (1/p_i - 1)$ subject to
    $\sum_i p_i = 2$, $0 \le p_i \le 1$; i.e. $p_i = \min(1, c|x_i|)$. Entries with $x_i = 0$ may get any
    p in [0, 1] (they add nothing)."""
    report = ExerciseReport("MVUE inclusion probabilities p", solution=SOLUTION,
                            hint="p = 2|x| / sum|x|, unless the largest |x| exceeds the sum of the other three: "
                                 "then it gets p = 1 and the others |x_i| / (sum of the other three).")

    def body(r: ExerciseReport) -> None:
        for x, label in _groups():
            x = x.double()
            got = r.call(prob_fn, x.clone(), what=f"{label}: your probabilities")
            if got is None:
                continue
            if not isinstance(got, torch.Tensor) or got.shape != x.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                r.expect(False, f"{label}: expected a tensor of shape {tuple(x.shape)}, got {shape}")
                continue
            got = got.detach().double()
            want = mvue_probabilities(x)
            nonzero = x != 0
            if bool(((got < -1e-12) | (got > 1 + 1e-9)).any()):
                at = tuple(int(i) for i in ((got < -1e-12) | (got > 1 + 1e-9)).nonzero()[0])
                r.expect(False, f"{label}: p{list(at)} = {float(got[at]):.4f} is not a probability: cap the "
                                "largest at 1 and share what is left among the other three")
                continue
            if bool((got[nonzero] - want[nonzero]).abs().max() <= 1e-9):
                continue
            sums = (got * nonzero).sum(-1)
            if bool(((sums - 2).abs() > 1e-6).any() & (nonzero.sum(-1) > 2).any()):
                at = int(((sums - 2).abs() > 1e-6).nonzero()[0])
                r.expect(False, f"{label}: the p of group {at} sum to {float(sums[at]):.4f}: exactly two entries "
                                "are kept, so sum p = 2")
                continue
            r.expect_tensor(torch.where(nonzero, got, want), want, label, atol=1e-9)
    return run_check(report, body, show, hint)


def check_mvue_sampler(sampler_fn, draws: int = 4000, show: bool = True, hint: bool = False) -> CheckResult:
    r"""Exercise: ``sampler_fn(x, generator)`` -> one MVUE 2:4 draw of x (R, 4k) along the last dimension:
    at most 2 non-zeros per group, entry i kept with the minimum-variance probability $p_i$ and then
    worth $x_i / p_i$, so that $E[\mathrm{MVUE}(x)] = x$. Random numbers from ``generator`` only.

    Checked on ``draws`` independent draws (x repeated ``draws`` times in one call): the kept values,
    how often each entry is kept, and the mean, within ``Z_BOUND`` standard errors (a bound that shrinks
    like 1/sqrt(draws), so a bias cannot hide behind it)."""
    report = ExerciseReport("MVUE 2:4 sampler (unbiased, checked statistically)", solution=SOLUTION,
                            hint="with p from the previous exercise: one uniform u per group; entry i owns "
                                 "[P_{i-1}, P_i) of [0, 2) (P = cumsum p); keep the entries that own u and u + 1; "
                                 "divide each kept entry by its p.")

    def body(r: ExerciseReport) -> None:
        seed = secrets.randbits(31)
        x = torch.tensor([[3.0, -1.0, 0.5, 0.25, 1.0, 1.0, 1.0, 1.0],
                          [0.0, 2.0, 0.0, 0.0, -0.5, 0.4, -0.3, 0.2]], dtype=torch.float64)
        many = x.repeat(draws, 1)
        got = r.call(sampler_fn, many.clone(), torch.Generator().manual_seed(seed),
                     what=f"your sampler(x repeated {draws} times, generator)")
        if got is None:
            return
        if not isinstance(got, torch.Tensor) or got.shape != many.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            r.expect(False, f"expected a tensor of the input's shape {tuple(many.shape)}, got {shape}")
            return
        got = got.detach().double()
        again = r.call(sampler_fn, many.clone(), torch.Generator().manual_seed(seed), what="your sampler, same seed")
        if isinstance(again, torch.Tensor) and not torch.allclose(again.detach().double(), got, rtol=0, atol=0,
                                                                  equal_nan=True):
            r.expect(False, "the same generator seed gave a different draw: draw every random number from the "
                            "`generator` argument (torch.rand(..., generator=generator))")
        d = got.reshape(draws, 2, 2, 4)                           # (draw, row, group, member)
        xs = x.reshape(1, 2, 2, 4).expand_as(d)
        p = mvue_probabilities(x.reshape(2, 2, 4)).unsqueeze(0).expand_as(d)
        kept = d != 0
        if bool((kept.sum(-1) > 2).any()):
            r.expect(False, f"some groups keep {int(kept.sum(-1).max())} entries: at most 2 of every 4")
            return
        on = kept & (xs != 0)
        ratio = d[on] / (xs[on] / p[on])
        if bool(((ratio - 1).abs() > 1e-6).any()):
            if bool(((d[on] / xs[on] - 1).abs() <= 1e-6).all()):
                r.expect(False, "kept entries keep their value x_i: divide them by p_i, or the mean is too small")
            else:
                r.expect(False, "a kept entry is not x_i / p_i with the minimum-variance p_i (a sampler with other "
                                "probabilities, e.g. the sequential one, is unbiased too, but not this exercise's)")
            return
        if bool((kept & (xs == 0)).any() & (d[kept & (xs == 0)] != 0).any()):
            r.expect(False, "an entry that is 0 in x came out non-zero")
            return
        # how often each entry is kept: a binomial count with mean K p_i
        freq = kept.double().mean(0)
        pf = p[0]
        se_freq = torch.sqrt(pf * (1 - pf) / draws)
        z_freq = ((freq - pf).abs() / se_freq.clamp_min(1e-300)).masked_fill(se_freq == 0, 0.0)
        exact_bad = (se_freq == 0) & ((freq - pf).abs() > 0)
        nonzero = x.reshape(2, 2, 4) != 0          # a zero entry is 0 whether it is "kept" or not
        z_freq, exact_bad = z_freq * nonzero, exact_bad & nonzero
        worst = torch.maximum(z_freq, exact_bad.double() * 1e9)
        if bool((worst > Z_BOUND).any()):
            at = tuple(int(i) for i in (worst > Z_BOUND).nonzero()[0])
            r.expect(False, f"entry (row {at[0]}, group {at[1]}, member {at[2]}) was kept in {float(freq[at]):.3f} "
                            f"of {draws} draws; the minimum-variance p is {float(pf[at]):.3f} "
                            f"(+- {Z_BOUND:g} standard errors = {Z_BOUND * float(se_freq[at]):.3f})")
            return
        # unbiased: the mean of K draws is within Z_BOUND standard errors of x
        xv = x.reshape(2, 2, 4)
        se = xv.abs() * torch.sqrt((1 / pf.clamp_min(1e-300) - 1).clamp_min(0) / draws)
        err = (d.mean(0) - xv).abs()
        z = torch.where(se > 0, err / se.clamp_min(1e-300), torch.where(err > 1e-9, math.inf, 0.0))
        if bool((z > Z_BOUND).any()):
            at = tuple(int(i) for i in (z > Z_BOUND).nonzero()[0])
            r.expect(False, f"the mean of {draws} draws misses x at (row {at[0]}, group {at[1]}, member {at[2]}) by "
                            f"{float(z[at]):.1f} standard errors (bound {Z_BOUND:g}): the sampler is biased")
    return run_check(report, body, show, hint)


def check_mvue_variance(variance_fn, show: bool = True, hint: bool = False) -> CheckResult:
    r"""Exercise: ``variance_fn(groups)`` -> (G,) expected squared error of one MVUE draw per group,
    $E\lVert \mathrm{MVUE}(x) - x \rVert^2 = \sum_i x_i^2 (1/p_i - 1)$ (0 for entries with $x_i = 0$)."""
    report = ExerciseReport("variance of one MVUE draw", solution=SOLUTION,
                            hint="one entry is x_i / p_i with probability p_i and 0 otherwise: its variance is "
                                 "x_i^2 / p_i - x_i^2; sum over the group; skip x_i = 0.")

    def body(r: ExerciseReport) -> None:
        for x, label in _groups():
            x = x.double()
            got = r.call(variance_fn, x.clone(), what=f"{label}: your variance")
            if got is None:
                continue
            p = mvue_probabilities(x)
            want = torch.where(x != 0, x * x * (1 / p.clamp_min(1e-300) - 1), torch.zeros_like(x)).sum(-1)
            if isinstance(got, torch.Tensor) and got.shape == want.shape and bool(torch.isnan(got).any()):
                r.expect(False, f"{label}: nan: entries with x_i = 0 (and p_i = 0) contribute 0, skip them")
                continue
            r.expect_tensor(got, want, label, atol=1e-9, rtol=1e-9)
    return run_check(report, body, show, hint)
