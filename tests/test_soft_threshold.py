"""S-STE: the soft threshold S, its continuity, and the frozen per-tensor scale beta."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsity_lab as sl
from sparsity_lab.masks.nm import is_nm, nm_mask
from sparsity_lab.masks.transposable import transposable_mask
from sparsity_lab.methods.soft_threshold import soft_threshold, sste_beta


def soft_threshold_by_hand(w: torch.Tensor) -> torch.Tensor:
    """Plain loops: t = 2nd smallest |a| of each group of 4, S_i = sign(a_i) max(|a_i| - t, 0)."""
    out = torch.zeros_like(w)
    for r in range(w.shape[0]):
        for g in range(0, w.shape[1], 4):
            group = w[r, g:g + 4].tolist()
            t = sorted(abs(v) for v in group)[1]
            for i, v in enumerate(group):
                out[r, g + i] = (1 if v > 0 else -1 if v < 0 else 0) * max(abs(v) - t, 0.0)
    return out


def test_hand_made_groups():
    w = torch.tensor([[4.0, -1.0, 3.0, 2.0, -5.0, 0.5, 0.2, 1.0],
                      [1.0, 1.0, 1.0, 1.0, 0.0, -2.0, 0.0, 0.0]])
    expected = torch.tensor([[2.0, 0.0, 1.0, 0.0, -4.5, 0.0, 0.0, 0.5],
                             [0.0, 0.0, 0.0, 0.0, 0.0, -2.0, 0.0, 0.0]])
    assert torch.equal(soft_threshold(w), expected)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_matches_loop_reference(rows, groups, seed):
    w = torch.randn(rows, 4 * groups, generator=torch.Generator().manual_seed(seed))
    s = soft_threshold(w)
    torch.testing.assert_close(s, soft_threshold_by_hand(w), rtol=0, atol=0)
    assert is_nm(s, 2, 4, exact=False)
    # |S| <= |W|, same sign where non-zero, and zero exactly outside the magnitude mask
    assert bool((s.abs() <= w.abs()).all())
    assert bool((s[~nm_mask(w)] == 0).all())
    assert bool((torch.sign(s[s != 0]) == torch.sign(w[s != 0])).all())


def test_continuity_against_hard_threshold():
    """Two magnitudes cross (0.5 + e and 0.5 - e swap as e goes from +d to -d): the soft threshold
    moves by O(d), hard thresholding m(W) * W jumps by about 0.5."""
    d = 1e-4
    base = torch.tensor([[1.0, 0.5, 0.5, 0.1]], dtype=torch.float64)
    step = torch.tensor([[0.0, 1.0, -1.0, 0.0]], dtype=torch.float64)
    w1, w2 = base + d * step, base - d * step
    change_w = float((w1 - w2).abs().max())  # 2d
    soft_change = float((soft_threshold(w1) - soft_threshold(w2)).abs().max())
    hard_change = float((w1 * nm_mask(w1) - w2 * nm_mask(w2)).abs().max())
    assert not torch.equal(nm_mask(w1), nm_mask(w2))  # the mask really flips
    # S is 2-Lipschitz in the max norm: each entry moves by |dw_i| + |dt| <= 2 max|dw|
    assert soft_change <= 2 * change_w + 1e-15
    assert hard_change >= 0.5 - change_w
    assert hard_change / change_w > 1000  # a jump, not a slope


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(1e-6, 1e-2))
def test_soft_threshold_is_lipschitz(seed, eps):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(3, 8, generator=gen, dtype=torch.float64)
    dw = eps * (2 * torch.rand(3, 8, generator=gen, dtype=torch.float64) - 1)
    change = (soft_threshold(w + dw) - soft_threshold(w)).abs().max()
    assert float(change) <= 2 * float(dw.abs().max()) + 1e-15


def test_beta_by_hand():
    w = torch.tensor([[4.0, -1.0, 3.0, 2.0], [0.0, -2.0, 1.0, 0.5]])
    s = soft_threshold(w)
    # S = [[2, 0, 1, 0], [0, -1.5, 0.5, 0]]; <W,S> = 8 + 3 + 3 + 0.5 = 14.5; <S,S> = 4 + 1 + 2.25 + 0.25 = 7.5
    assert torch.equal(s, torch.tensor([[2.0, 0.0, 1.0, 0.0], [0.0, -1.5, 0.5, 0.0]]))
    assert float(sste_beta(w, s)) == pytest.approx(14.5 / 7.5, rel=1e-7)
    assert sste_beta(w, s).dtype == torch.float32 and sste_beta(w, s).dim() == 0
    # S = 0 (all ties) gives beta = 1 rather than 0/0
    ones = torch.ones(2, 4)
    assert float(sste_beta(ones, soft_threshold(ones))) == 1.0


def test_beta_on_gaussian_weights_is_about_1_48():
    betas = []
    for seed in range(4):
        w = torch.randn(256, 256, generator=torch.Generator().manual_seed(seed))
        betas.append(float(sste_beta(w, soft_threshold(w))))
    mean = sum(betas) / len(betas)
    assert mean == pytest.approx(1.48, abs=0.02)
    # beta is scale-free: it depends only on the shape of the distribution
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(9))
    assert float(sste_beta(7 * w, soft_threshold(7 * w))) == pytest.approx(float(sste_beta(w, soft_threshold(w))),
                                                                          rel=1e-5)


def test_beta_minimises_least_squares():
    w = torch.randn(16, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    s = soft_threshold(w)
    beta = float(sste_beta(w, s))

    def err(b):
        return float(((w - b * s) ** 2).sum())

    assert err(beta) <= err(beta * 1.01) and err(beta) <= err(beta * 0.99)


def test_beta_computed_once_at_conversion_and_frozen():
    torch.manual_seed(0)
    layer = sl.SparseLinear(16, 8, method=sl.SSTE())
    w0 = layer.weight.detach().clone()
    beta0 = layer.beta.clone()
    assert torch.equal(beta0, sste_beta(w0, soft_threshold(w0)))
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    sl.attach_optimizer(layer, opt)
    for _ in range(5):
        opt.zero_grad()
        (layer(torch.randn(6, 16)) ** 2).sum().backward()
        opt.step()
    assert layer.step == 5
    assert not torch.allclose(layer.weight, w0)  # training moved the weights ...
    w = layer.weight.detach()
    assert abs(float(sste_beta(w, soft_threshold(w))) - float(beta0)) > 1e-4  # ... a fresh beta would differ
    assert torch.equal(layer.beta, beta0)  # ... and the stored one did not move


def test_transposable_mask_soft_threshold_stays_transposable():
    w = torch.randn(8, 8, generator=torch.Generator().manual_seed(5))
    mask = transposable_mask(w)
    s = soft_threshold(w, mask)
    assert bool((s[~mask] == 0).all())
    # only zeros are added, so S is still at most 2:4 along both dims
    assert is_nm(s, 2, 4, dim=1, exact=False) and is_nm(s, 2, 4, dim=0, exact=False)
    # with a transposable mask each row group still keeps 2, so t is the largest pruned |w|
    a = w.abs().reshape(8, 2, 4)
    t = a.masked_fill(mask.reshape(8, 2, 4), 0).amax(-1, keepdim=True)
    expected = torch.where(mask, torch.sign(w) * (w.abs() - t.expand(-1, -1, 4).reshape(8, 8)).clamp_min(0), 0.0)
    assert torch.equal(s, expected)
