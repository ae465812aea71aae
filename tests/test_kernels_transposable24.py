"""Kernel 2 (exact transposable 2:4 mask, 90 patterns) against masks.patterns.solve_patterns."""
import inspect

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE, DTYPES

from sparsity_lab.kernels import transposable24
from sparsity_lab.kernels.transposable24 import transposable_mask24
from sparsity_lab.masks.patterns import solve_patterns, transposable_patterns
from sparsity_lab.masks.tiles import to_tiles, validate_transposable_mask


def test_the_written_out_patterns_are_the_reference_patterns_in_order():
    assert transposable24.pattern_scoring_source(transposable_patterns(2, 4)) in inspect.getsource(transposable24)
    assert transposable_patterns(2, 4).shape[0] == 90
    with pytest.raises(ValueError, match="90 transposable 2:4 patterns"):
        transposable24.pattern_scoring_source(transposable_patterns(1, 4))  # 24 patterns: not the 2:4 ones


def _check_outputs(w, mask, pruned, pruned_t):
    validate_transposable_mask(mask, 2, 4)
    assert torch.equal(pruned, w * mask)
    assert pruned_t.is_contiguous() and torch.equal(pruned_t, (w * mask).t())


@settings(max_examples=15, deadline=None)
@given(tile_rows=st.integers(1, 9), tile_cols=st.integers(1, 11), dtype=st.sampled_from(DTYPES),
       blocks=st.sampled_from([(2, 2), (2, 4), (4, 64)]), transpose=st.sampled_from(["permute", "trans", "separate"]),
       seed=st.integers(0, 2**31 - 1))
def test_exact_ties_follow_the_reference_order(tile_rows, tile_cols, dtype, blocks, transpose, seed):
    # small integers: every pattern score is exact in float32 and ties are everywhere, so the
    # mask must be the reference's to the bit (lowest pattern index among the maxima)
    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(-3, 4, (4 * tile_rows, 4 * tile_cols), generator=gen).to(dtype).to(DEVICE)
    mask, pruned, pruned_t = transposable_mask24(w, block_a=blocks[0], block_b=blocks[1], transpose=transpose)
    assert torch.equal(mask, solve_patterns(w, 2, 4))
    _check_outputs(w, mask, pruned, pruned_t)


def _pattern_scores(w):
    """(tiles, 90) float64 kept magnitude of every pattern."""
    pats = transposable_patterns(2, 4).to(w.device).reshape(90, 16).double()
    return to_tiles(w.double().abs(), 4).reshape(-1, 16) @ pats.T


@pytest.mark.parametrize("shape,blocks", [((8, 12), (4, 64)), ((36, 68), (2, 4)), ((64, 128), (8, 32))])
def test_random_floats_give_the_optimal_mass(shape, blocks):
    w = torch.randn(shape, device=DEVICE)
    mask, pruned, pruned_t = transposable_mask24(w, block_a=blocks[0], block_b=blocks[1])
    _check_outputs(w, mask, pruned, pruned_t)
    scores = _pattern_scores(w)
    best = scores.max(1).values
    kept = (to_tiles((w.abs() * mask).double(), 4).reshape(-1, 16)).sum(1)
    assert bool(((best - kept) <= 1e-6 * best).all())  # optimal up to float32 rounding
    # and the very same mask wherever the best pattern is not within rounding of the runner-up
    top2 = scores.topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-5 * top2[:, 0]
    same = (to_tiles(mask, 4) == to_tiles(solve_patterns(w, 2, 4), 4)).reshape(-1, 16).all(1)
    assert bool(same[clear].all())


def test_mask_only_and_non_contiguous_input():
    w = torch.randn(20, 16, device=DEVICE).t()  # (16, 20) view
    mask, pruned, pruned_t = transposable_mask24(w, pruned=False)
    assert pruned is None and pruned_t is None
    validate_transposable_mask(mask, 2, 4)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="2-D"):
        transposable_mask24(torch.randn(16, device=DEVICE))
    with pytest.raises(ValueError, match="dim 0, which is not divisible by 4"):
        transposable_mask24(torch.randn(6, 8, device=DEVICE))
    with pytest.raises(ValueError, match="dim 1, which is not divisible by 4"):
        transposable_mask24(torch.randn(8, 6, device=DEVICE))
    with pytest.raises(TypeError, match="w must have dtype"):
        transposable_mask24(torch.ones(8, 8, dtype=torch.float64, device=DEVICE))
    with pytest.raises(ValueError, match="transpose must be one of"):
        transposable_mask24(torch.randn(8, 8, device=DEVICE), transpose="copy")
    with pytest.raises(ValueError, match="block_b"):
        transposable_mask24(torch.randn(8, 8, device=DEVICE), block_b=3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_transposable_on_gpu_at_size(dtype):
    w = torch.randint(-3, 4, (1028, 2052), device="cuda").to(dtype)
    for transpose in ("permute", "trans", "separate"):
        mask, pruned, pruned_t = transposable_mask24(w, transpose=transpose)
        assert torch.equal(mask, solve_patterns(w, 2, 4))
        _check_outputs(w, mask, pruned, pruned_t)
    w = torch.randn(2048, 1028, device="cuda").to(dtype)
    mask, pruned, pruned_t = transposable_mask24(w)
    _check_outputs(w, mask, pruned, pruned_t)
    best = _pattern_scores(w).max(1).values
    kept = to_tiles((w.abs() * mask).double(), 4).reshape(-1, 16).sum(1)
    assert bool(((best - kept) <= 1e-6 * best).all())
