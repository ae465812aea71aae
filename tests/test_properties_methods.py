"""Property tests of the soft threshold (S-STE) and MVUE on adversarial magnitudes (tests/_adversarial.py).

soft_threshold: zero where pruned, |S_i| = max(|w_i| - t, 0) with t the largest pruned |w| of
the group (to the dtype's rounding), the sign of w kept, at most N non-zeros per group, finite;
beta finite. MVUE (both samplers): at most 2 non-zeros per group of 4 and exactly 2 where the
group has 2 or more non-zeros, kept values x_i / p_i, zeros elsewhere, finite output (or a
clear overflow error where x_i / p_i leaves the dtype's range). CI: a small derandomized count;
SPARSITY_LAB_FULL_PROPERTIES=1: 20x more.
"""
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from _adversarial import adversarial, examples
from sparsity_lab.masks import is_nm, nm_mask
from sparsity_lab.methods.mvue import mvue24, mvue_probabilities, sequential_probabilities
from sparsity_lab.methods.soft_threshold import soft_threshold, sste_beta

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@given(data=st.data())
@examples(60)
def test_soft_threshold_properties(data):
    n, m = data.draw(st.sampled_from([(2, 4), (1, 4), (2, 8)]), label="n:m")
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    w = data.draw(adversarial((data.draw(st.integers(1, 4)), m * data.draw(st.integers(1, 3))), dtype), label="w")
    mask = nm_mask(w, n, m)
    s = soft_threshold(w, mask, n, m)
    assert s.dtype == w.dtype and torch.isfinite(s).all()
    assert is_nm(s != 0, n, m, dim=1, exact=False)
    assert (s[~mask] == 0).all()
    a = w.double().abs().reshape(-1, m)
    t = a.masked_fill(mask.reshape(-1, m), 0).amax(-1, keepdim=True)
    expect = ((a - t).clamp_min(0) * w.double().reshape(-1, m).sign()).masked_fill(~mask.reshape(-1, m), 0)
    # |w_i| - t rounded once to the dtype: within half an ulp of |w_i| (or the smallest subnormal)
    ulp = torch.finfo(dtype).eps * a + torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
    assert ((s.double().reshape(-1, m) - expect).abs() <= ulp).all()
    assert ((s.double() * w.double()) >= 0).all(), "the sign of w is kept"
    beta = sste_beta(w, s)
    assert torch.isfinite(beta) and (beta > 0 if (s != 0).any() else beta == 1)


@pytest.mark.parametrize("method", ["exact", "sequential"])
@given(data=st.data())
@examples(60)
def test_mvue_properties(method, data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    x = data.draw(adversarial((data.draw(st.integers(1, 3)), 4 * data.draw(st.integers(1, 3))), dtype,
                              outliers=True), label="x")
    seed = data.draw(st.integers(0, 2**31), label="seed")
    groups = x.double().reshape(-1, 4)
    # a kept value x_i / p_i is at most the sum of |x| in its group: beyond the dtype's range, refuse
    may_overflow = bool((groups.abs().sum(-1) > torch.finfo(dtype).max).any())
    try:
        out = mvue24(x, generator=torch.Generator().manual_seed(seed), method=method)
    except ValueError as err:
        assert may_overflow and "overflow" in str(err), err
        return
    assert out.dtype == x.dtype and torch.isfinite(out).all()
    kept = out.double().reshape(-1, 4) != 0
    nonzero = (groups != 0).sum(-1)
    assert (kept.sum(-1) == torch.clamp(nonzero, max=2)).all(), "exactly 2 kept (all non-zeros if fewer)"
    assert (groups[kept] != 0).all(), "only non-zero entries are kept"
    p = (mvue_probabilities if method == "exact" else sequential_probabilities)(groups)
    assert ((p >= 0) & (p <= 1)).all() and torch.allclose(p.sum(-1), torch.full_like(p[:, 0], 2.0))
    expect = (groups / p).to(dtype).double()
    assert torch.equal(out.double().reshape(-1, 4)[kept], expect[kept]), "kept values are x / p"
