"""Structured dynamic sparsity: exact sparsity, zeroed regrowth, the schedule, exact resume."""
import math

import pytest
import torch
from torch import nn

from sparsity_lab.structures.prune_regrow import BlockSparseLinear, PruneRegrow, block_sparsify, prune_fraction


def _model(block=4, sparsity=0.75, seed=0, width=32):
    torch.manual_seed(seed)
    m = nn.Sequential()
    m.add_module("mlp", nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width)))
    return block_sparsify(m, sparsity, block, seed=seed)


def _train(model, opt, pr, steps, seed=0):
    gen = torch.Generator().manual_seed(seed)
    width = model.mlp[0].in_features
    losses = []
    for _ in range(steps):
        loss = model(torch.randn(8, width, generator=gen)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_schedule_matches_formula():
    assert prune_fraction(0, 10) == 0.5
    assert prune_fraction(10, 10) == pytest.approx(0.0, abs=1e-12)
    for t in range(11):
        assert prune_fraction(t, 10) == pytest.approx(0.25 * (1 + math.cos(math.pi * t / 10)))


@pytest.mark.parametrize("block", [1, 4, 8, 16])
def test_sparsity_exact_after_every_update_and_dead_weights_zero(block):
    model = _model(block=block, sparsity=0.9, width=128)  # >= 10 live blocks per layer even at 16x16
    layers = [m for m in model.modules() if isinstance(m, BlockSparseLinear)]
    live0 = [layer.live_blocks for layer in layers]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    pr = PruneRegrow(model, opt, update_every=3, total_updates=5).attach()
    for _ in range(5):
        _train(model, opt, pr, 3)
        assert [layer.live_blocks for layer in layers] == live0
        for layer in layers:
            assert bool((layer.weight[~layer.weight_mask()] == 0).all())
    assert len(pr.history) == 5 and pr.history[0]["blocks_moved"] > 0


def test_regrown_blocks_and_their_adam_moments_are_zero():
    model = _model(block=4, sparsity=0.5)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    pr = PruneRegrow(model, opt, update_every=1, total_updates=1)
    _train(model, opt, pr, 2)
    layer = model.mlp[0]
    before = layer.block_mask.clone()
    pr.update()
    grown = layer.block_mask & ~before
    assert int(grown.sum()) > 0
    wm = grown.repeat_interleave(4, 0).repeat_interleave(4, 1)
    assert bool((layer.weight[wm] == 0).all())
    state = opt.state[layer.weight]
    assert bool((state["exp_avg"][wm] == 0).all()) and bool((state["exp_avg_sq"][wm] == 0).all())
    # the smallest-L1 live blocks were the ones pruned
    pruned = before & ~layer.block_mask
    assert int(pruned.sum()) == int(grown.sum())


def test_resume_is_exact():
    def run(split):
        model = _model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        pr = PruneRegrow(model, opt, update_every=2, total_updates=6, seed=3).attach()
        losses = _train(model, opt, pr, split, seed=5)
        ckpt = {"model": model.state_dict(), "opt": opt.state_dict(), "pr": pr.state_dict()}
        model2 = _model(seed=99)  # different init: everything must come from the checkpoint
        opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
        pr2 = PruneRegrow(model2, opt2, update_every=2, total_updates=6, seed=0).attach()
        model2.load_state_dict(ckpt["model"])
        opt2.load_state_dict(ckpt["opt"])
        pr2.load_state_dict(ckpt["pr"])
        gen_state = torch.Generator().manual_seed(5)
        for _ in range(split):  # advance the data stream to where it stopped
            torch.randn(8, 32, generator=gen_state)
        rest = []
        for _ in range(12 - split):
            loss = model2(torch.randn(8, 32, generator=gen_state)).pow(2).mean()
            loss.backward()
            opt2.step()
            opt2.zero_grad()
            rest.append(loss.item())
        return losses + rest

    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    PruneRegrow(model, opt, update_every=2, total_updates=6, seed=3).attach()
    straight = _train(model, opt, None, 12, seed=5)
    assert run(5) == straight


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="block must be one of"):
        BlockSparseLinear(32, 32, block=3)
    with pytest.raises(ValueError, match="in_features=20 is not divisible by block=16"):
        BlockSparseLinear(20, 32, block=16)
    with pytest.raises(ValueError, match="sparsity"):
        BlockSparseLinear(32, 32, sparsity=1.0, block=4)
    with pytest.raises(ValueError, match="no BlockSparseLinear"):
        PruneRegrow(nn.Linear(4, 4), torch.optim.SGD(nn.Linear(4, 4).parameters(), lr=1))
