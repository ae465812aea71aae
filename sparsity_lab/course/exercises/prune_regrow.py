"""Exercises of notebook 11 (prune and regrow, Dietrich et al. 2021): the prune-fraction schedule
p(t), the L1 score of every b x b block, and one prune-and-regrow update with zeroed moments."""
from __future__ import annotations

import math
import random

import torch

from ...structures.prune_regrow import prune_fraction
from .checking import ExerciseReport, run_check


def check_prune_fraction(prune_fraction_fn, show: bool = True, hint: bool = False):
    """``prune_fraction_fn(t, T)`` -> p(t) = 0.25 (1 + cos(pi t / T)) for update t = 0..T."""
    report = ExerciseReport("prune_fraction: the half-cosine schedule p(t)",
                            hint="p(0) = 0.5 and p(T) = 0; in between a half cosine: 0.25 * (1 + cos(pi * t / T)).",
                            solution="prune_regrow")

    def body(r):
        rng = random.Random()
        cases = [(0, 10), (10, 10), (5, 10), (1, 1), (0, 1), (3, 7), (1, 4)]
        cases += [(t, T) for T in (rng.randint(2, 200),) for t in sorted(rng.sample(range(T + 1), 2))]
        for t, T in cases:
            got = r.call(prune_fraction_fn, t, T, what=f"prune_fraction({t}, {T})")
            if got is None:
                return
            want = prune_fraction(t, T)
            if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
                why = ""
                if isinstance(got, (int, float)) and math.isclose(got, 2 * want, rel_tol=1e-9, abs_tol=1e-12):
                    why = " (twice too large: the schedule starts at 0.5, not 1)"
                r.expect(False, f"prune_fraction({t}, {T}) = {got!r}, expected {want:.6g}{why}")
                return
    return run_check(report, body, show, hint)


def reference_block_l1(weight: torch.Tensor, block: int) -> torch.Tensor:
    o, i = weight.shape[0] // block, weight.shape[1] // block
    return weight.abs().reshape(o, block, i, block).sum(dim=(1, 3))


def check_block_l1(block_l1_fn, show: bool = True, hint: bool = False):
    """``block_l1_fn(weight, block)`` -> (out/b, in/b) tensor: the L1 norm (sum of |w|) of every b x b block."""
    report = ExerciseReport("block_l1: the L1 norm of every b x b block of a weight",
                            hint="reshape (out, in) to (out/b, b, in/b, b) and sum |w| over the two b axes; a plain "
                                 "reshape to (out/b, in/b, b, b) mixes rows of different blocks.",
                            solution="prune_regrow")

    def body(r):
        rng = random.Random()
        cases = [(4, 4, 1), (8, 8, 4), (16, 8, 4), (8, 24, 8), (32, 16, 16)]
        cases += [(b * rng.randint(1, 4), b * rng.randint(1, 4), b) for b in (rng.choice([2, 4, 8]),) * 2]
        for out, inp, b in cases:
            w = torch.randn(out, inp, dtype=torch.float64)
            what = f"block_l1(w of shape ({out}, {inp}), {b})"
            got = r.call(block_l1_fn, w.clone(), b, what=what)
            if got is None:
                return
            want = reference_block_l1(w, b)
            if isinstance(got, torch.Tensor) and got.shape == want.shape:
                l2 = w.pow(2).reshape(out // b, b, inp // b, b).sum(dim=(1, 3)).sqrt()
                signed = w.reshape(out // b, b, inp // b, b).sum(dim=(1, 3))
                if torch.allclose(got.double(), l2) and not torch.allclose(l2, want):
                    r.expect(False, f"{what}: that is the L2 norm; the paper scores blocks by L1 (sum of |w|)")
                    return
                if torch.allclose(got.double(), signed) and not torch.allclose(signed, want):
                    r.expect(False, f"{what}: that sums the signed weights; take |w| first")
                    return
            if not r.expect_tensor(got, want, what, atol=1e-9, rtol=1e-9):
                return
    return run_check(report, body, show, hint)


def _expand(block_mask: torch.Tensor, b: int) -> torch.Tensor:
    return block_mask.repeat_interleave(b, 0).repeat_interleave(b, 1)


def check_prune_and_regrow(prune_and_regrow_fn, show: bool = True, hint: bool = False):
    """``prune_and_regrow_fn(weight, block_mask, exp_avg, exp_avg_sq, fraction, block, generator)`` ->
    (new_block_mask, new_weight, new_exp_avg, new_exp_avg_sq), inputs left unchanged.

    One update: k = floor(fraction * live) live blocks with the smallest L1 norm die; k dead blocks chosen
    uniformly at random (torch.randperm(..., generator=generator)) come alive; the weights and both Adam
    moments of every block that changed are zero; everything else is untouched."""
    report = ExerciseReport("prune_and_regrow: one update of a block-sparse weight",
                            hint="score live blocks by L1, prune the k smallest, regrow k of the blocks that were "
                                 "dead before this update at random, then zero weights and moments on both sets.",
                            solution="prune_regrow")

    def body(r):
        rng = random.Random()
        for out, inp, b, live, fraction in [(8, 8, 4, 2, 0.5), (16, 16, 4, 4, 0.5), (16, 32, 8, 3, 0.34),
                                            (32, 32, 4, 16, 0.25), (24, 16, 8, 2, 0.0), (12, 12, 4, 5, 0.4)]:
            seeds = rng.randrange(2 ** 31), rng.randrange(2 ** 31)
            if _check_one_update(r, prune_and_regrow_fn, out, inp, b, live, fraction, *seeds) is None and r.problems:
                return
        # regrowth is random: on the same weight, different generators must pick different dead blocks
        data_seed = rng.randrange(2 ** 31)
        picks = {_check_one_update(r, prune_and_regrow_fn, 32, 32, 4, 8, 0.5, seed, data_seed) for seed in range(12)}
        if r.problems:
            return
        r.expect(len(picks) > 1, "the regrown blocks are the same for 12 different generators: regrow at random "
                                 "(torch.randperm(number of dead blocks, generator=generator))")
    return run_check(report, body, show, hint)


def _random_block_sparse(out: int, inp: int, b: int, live: int, data_seed: int):
    """A block mask (out/b, in/b) with ``live`` live blocks, and W, exp_avg, exp_avg_sq zero off them."""
    data = torch.Generator().manual_seed(data_seed)
    grid = (out // b, inp // b)
    mask = torch.zeros(grid[0] * grid[1], dtype=torch.bool)
    mask[torch.randperm(mask.numel(), generator=data)[:live]] = True
    mask = mask.reshape(grid)
    dense = _expand(mask, b)
    w = torch.randn(out, inp, dtype=torch.float64, generator=data) * dense
    m1 = torch.randn(out, inp, dtype=torch.float64, generator=data) * dense
    m2 = torch.rand(out, inp, dtype=torch.float64, generator=data) * dense
    return w, mask, m1, m2


def _check_one_update(r, prune_and_regrow_fn, out, inp, b, live, fraction, seed, data_seed):
    """Run the learner's update on one random block-sparse weight; the regrown blocks (a frozenset)
    when it is right, else None with the problem reported on ``r``."""
    w, mask, m1, m2 = _random_block_sparse(out, inp, b, live, data_seed)
    inputs = [t.clone() for t in (w, mask, m1, m2)]
    what = f"prune_and_regrow on a ({out}, {inp}) weight, {b}x{b} blocks, {live} live, fraction {fraction}"
    got = r.call(prune_and_regrow_fn, inputs[0], inputs[1], inputs[2], inputs[3], fraction, b,
                 torch.Generator().manual_seed(seed), what=what)
    if got is None:
        return None
    if not (isinstance(got, tuple) and len(got) == 4 and all(isinstance(t, torch.Tensor) for t in got)):
        r.expect(False, f"{what}: return a tuple (block_mask, weight, exp_avg, exp_avg_sq) of tensors")
        return None
    if not all(torch.equal(a, c) for a, c in zip(inputs, (w, mask, m1, m2))):
        r.expect(False, f"{what}: the inputs were changed in place; return new tensors instead")
        return None
    new_mask = got[0]
    regrown = _check_block_choice(r, what, w, mask, new_mask, b, live, fraction)
    if regrown is None:
        return None
    changed = _expand(mask ^ new_mask, b)
    for name, before, after in zip(("weight", "exp_avg", "exp_avg_sq"), (w, m1, m2), got[1:]):
        if not _check_zeroed_on(r, what, name, before, after, changed):
            return None
    return frozenset(regrown)


def _check_block_choice(r, what, w, mask, new_mask, b, live, fraction):
    """The pruned blocks are the k = floor(fraction * live) smallest-L1 live ones and k dead blocks
    came alive: the regrown block indices (a set), or None with the problem reported."""
    if new_mask.shape != mask.shape or new_mask.dtype != torch.bool:
        r.expect(False, f"{what}: block_mask should be a bool tensor of shape {tuple(mask.shape)}, got "
                        f"{new_mask.dtype} {tuple(new_mask.shape)}")
        return None
    k = int(math.floor(fraction * live))
    if int(new_mask.sum()) != live:
        r.expect(False, f"{what}: {int(new_mask.sum())} live blocks after the update, expected {live} "
                        f"(prune and regrow the same number)")
        return None
    scores = reference_block_l1(w, b).flatten()
    live_idx = mask.flatten().nonzero().squeeze(1)
    want_pruned = set(live_idx[torch.argsort(scores[live_idx])[:k]].tolist())
    pruned = set((mask.flatten() & ~new_mask.flatten()).nonzero().squeeze(1).tolist())
    regrown = set((~mask.flatten() & new_mask.flatten()).nonzero().squeeze(1).tolist())
    if pruned != want_pruned:
        largest = set(live_idx[torch.argsort(scores[live_idx], descending=True)[:k]].tolist())
        why = " (you pruned the largest blocks)" if pruned == largest and k else ""
        r.expect(False, f"{what}: pruned blocks {sorted(pruned)}, expected the {k} smallest-L1 live blocks "
                        f"{sorted(want_pruned)}{why}")
        return None
    if len(regrown) != k:
        r.expect(False, f"{what}: {len(regrown)} blocks regrown among those that were dead before, expected {k} "
                        f"(regrow at dead positions, not at the ones just pruned)")
        return None
    return regrown


def _check_zeroed_on(r, what, name, before, after, changed) -> bool:
    """``after`` is zero on the changed blocks and equal to ``before`` elsewhere (else reported)."""
    if after.shape != before.shape:
        r.expect(False, f"{what}: {name} has shape {tuple(after.shape)}, expected {tuple(before.shape)}")
        return False
    if bool((after[changed] != 0).any()):
        r.expect(False, f"{what}: {name} is not zero on the pruned and regrown blocks")
        return False
    if not torch.equal(after[~changed], before[~changed]):
        r.expect(False, f"{what}: {name} changed outside the pruned and regrown blocks")
        return False
    return True
