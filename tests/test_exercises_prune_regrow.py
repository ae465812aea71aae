"""Notebook 11's exercises: solutions pass, wrong answers fail with a message naming the problem."""
import math

import pytest
import torch

from sparsity_lab.course.exercises.checking import FAILED, NOT_ATTEMPTED, PASSED
from sparsity_lab.course.exercises.prune_regrow import check_block_l1, check_prune_and_regrow, check_prune_fraction
from sparsity_lab.course.exercises.solutions import prune_regrow as solution


def _stub(*args):
    raise NotImplementedError


@pytest.mark.parametrize("check, fn", [(check_prune_fraction, solution.prune_fraction),
                                       (check_block_l1, solution.block_l1),
                                       (check_prune_and_regrow, solution.prune_and_regrow)])
def test_solutions_pass_and_stubs_are_not_attempted(check, fn):
    assert check(fn, show=False).status == PASSED
    assert check(_stub, show=False).status == NOT_ATTEMPTED


def test_prune_fraction_wrong_answers():
    full = check_prune_fraction(lambda t, T: 0.5 * (1 + math.cos(math.pi * t / T)), show=False)
    assert full.status == FAILED and "starts at 0.5" in full.message
    linear = check_prune_fraction(lambda t, T: 0.5 * (1 - t / T), show=False)
    assert linear.status == FAILED and "prune_fraction(" in linear.message


def test_block_l1_wrong_answers():
    def l2(w, b):
        return w.pow(2).reshape(w.shape[0] // b, b, w.shape[1] // b, b).sum(dim=(1, 3)).sqrt()
    assert "L2 norm" in check_block_l1(l2, show=False).message
    def signed(w, b):
        return w.reshape(w.shape[0] // b, b, w.shape[1] // b, b).sum(dim=(1, 3))
    assert "signed" in check_block_l1(signed, show=False).message
    def mixed(w, b):
        return w.abs().reshape(w.shape[0] // b, w.shape[1] // b, b, b).sum(dim=(2, 3))
    result = check_block_l1(mixed, show=False)
    assert result.status == FAILED and "entries differ" in result.message


def _variant(**change):
    """The worked solution with one step done wrong."""
    def fn(weight, block_mask, exp_avg, exp_avg_sq, fraction, block, generator):
        mask = block_mask.flatten().clone()
        live = mask.nonzero().squeeze(1)
        k = math.floor(fraction * live.numel())
        scores = solution.block_l1(weight, block).flatten()
        order = torch.argsort(scores[live], descending=change.get("largest", False))
        pruned = live[order[:k]]
        mask[pruned] = False
        dead = (~mask).nonzero().squeeze(1) if change.get("after_pruning") else (~block_mask.flatten()).nonzero().squeeze(1)
        pick = torch.arange(k) if change.get("first_dead") else torch.randperm(dead.numel(), generator=generator)[:k]
        regrown = dead[pick]
        mask[regrown] = True
        changed = torch.zeros_like(mask)
        changed[pruned] = True
        changed[regrown] = True
        zero = changed.reshape(block_mask.shape).repeat_interleave(block, 0).repeat_interleave(block, 1)
        m1 = exp_avg if change.get("keep_moments") else exp_avg.masked_fill(zero, 0.0)
        return mask.reshape(block_mask.shape), weight.masked_fill(zero, 0.0), m1, exp_avg_sq.masked_fill(zero, 0.0)
    return fn


@pytest.mark.parametrize("change, words", [({"largest": True}, "largest blocks"),
                                           ({"keep_moments": True}, "exp_avg is not zero"),
                                           ({"first_dead": True}, "regrow at random")])
def test_prune_and_regrow_wrong_answers(change, words):
    result = check_prune_and_regrow(_variant(**change), show=False)
    assert result.status == FAILED and words in result.message, result.message


def test_prune_and_regrow_in_place_is_reported():
    def in_place(weight, block_mask, exp_avg, exp_avg_sq, fraction, block, generator):
        out = solution.prune_and_regrow(weight, block_mask, exp_avg, exp_avg_sq, fraction, block, generator)
        weight.copy_(out[1])
        return (out[0], weight, out[2], out[3])
    assert "in place" in check_prune_and_regrow(in_place, show=False).message
