"""Worked solutions to the exercises of notebook 11 (prune and regrow)."""
import math

import torch


def prune_fraction(t, T):
    return 0.25 * (1 + math.cos(math.pi * t / T))


def block_l1(weight, block):
    o, i = weight.shape[0] // block, weight.shape[1] // block
    return weight.abs().reshape(o, block, i, block).sum(dim=(1, 3))


def prune_and_regrow(weight, block_mask, exp_avg, exp_avg_sq, fraction, block, generator):
    mask = block_mask.flatten().clone()
    live = mask.nonzero().squeeze(1)
    k = math.floor(fraction * live.numel())
    scores = block_l1(weight, block).flatten()
    pruned = live[torch.argsort(scores[live])[:k]]  # the k weakest live blocks
    dead = (~mask).nonzero().squeeze(1)  # dead before this update: the just-pruned cannot come back
    regrown = dead[torch.randperm(dead.numel(), generator=generator)[:k]]
    mask[pruned] = False
    mask[regrown] = True
    changed = torch.zeros_like(mask)
    changed[pruned] = True
    changed[regrown] = True
    grid = block_mask.shape
    zero = changed.reshape(grid).repeat_interleave(block, 0).repeat_interleave(block, 1)
    # new blocks start from zero weights and zero moments, as the paper does
    return (mask.reshape(grid), weight.masked_fill(zero, 0.0), exp_avg.masked_fill(zero, 0.0),
            exp_avg_sq.masked_fill(zero, 0.0))
