"""Kernel 3 (S-STE soft threshold fused with beta) against methods.soft_threshold."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE, DTYPES, assert_close_ulp

from sparsity_lab.kernels.soft_threshold24 import soft_threshold24
from sparsity_lab.masks.nm import nm_mask
from sparsity_lab.masks.transposable import transposable_mask
from sparsity_lab.methods.soft_threshold import soft_threshold, sste_beta


def _reference(w, mask, beta):
    """beta * S(W) computed in float32 from the same input, rounded once to w's dtype."""
    w32 = w.float()
    m = nm_mask(w32, 2, 4) if mask is None else mask
    return (float(beta) * soft_threshold(w32, m)).to(w.dtype)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 8), groups=st.integers(1, 19), dtype=st.sampled_from(DTYPES),
       block=st.sampled_from([4, 16, 1024]), beta=st.floats(0.25, 4.0), seed=st.integers(0, 2**31 - 1))
def test_soft_threshold_with_beta_matches_reference(rows, groups, dtype, block, beta, seed):
    w = torch.randn(rows, 4 * groups, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)
    b = torch.tensor(beta, device=DEVICE)
    out = soft_threshold24(w, beta=b, block=block)
    expected = _reference(w, None, beta)
    if dtype == torch.float32:  # same float32 operations in the same order: identical
        assert torch.equal(out, (b * soft_threshold(w, nm_mask(w, 2, 4))))
    assert_close_ulp(out, expected)


def test_given_mask_sets_the_threshold_transposable_too():
    w = torch.randn(16, 24, device=DEVICE)
    for mask in (nm_mask(w, 2, 4), transposable_mask(w, 2, 4)):
        out = soft_threshold24(w, mask=mask, beta=1.5, block=8)
        assert torch.equal(out, torch.tensor(1.5, device=DEVICE) * soft_threshold(w, mask))


def test_without_beta_it_is_s_of_w_and_continuous_at_a_crossing():
    w = torch.randn(6, 20, device=DEVICE)
    assert torch.equal(soft_threshold24(w), soft_threshold(w))
    # two magnitudes crossing inside a group: S moves by the size of the step, not by a jump
    a = torch.tensor([[0.5, 0.3, 0.3001, 0.1]], device=DEVICE)
    b = torch.tensor([[0.5, 0.3001, 0.3, 0.1]], device=DEVICE)
    assert float((soft_threshold24(a) - soft_threshold24(b)).abs().max()) < 1e-3


def test_beta_as_stored_by_sste():
    w = torch.randn(32, 64, device=DEVICE)
    beta = sste_beta(w, soft_threshold(w))
    assert torch.equal(soft_threshold24(w, beta=beta), beta * soft_threshold(w))


def test_bad_arguments_are_named():
    w = torch.randn(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="mask has shape"):
        soft_threshold24(w, mask=torch.ones(4, 4, dtype=torch.bool, device=DEVICE))
    with pytest.raises(TypeError, match="mask must have dtype"):
        soft_threshold24(w, mask=torch.ones(4, 8, device=DEVICE))
    with pytest.raises(ValueError, match="beta must be a scalar"):
        soft_threshold24(w, beta=torch.ones(2, device=DEVICE))
    with pytest.raises(ValueError, match="divisible by 4"):
        soft_threshold24(torch.randn(4, 10, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_soft_threshold_on_gpu_at_size(dtype):
    w = torch.randn(2053, 4100, device="cuda").to(dtype)
    beta = torch.tensor(1.48, device="cuda")
    assert_close_ulp(soft_threshold24(w, beta=beta), _reference(w, None, 1.48))
    mask = transposable_mask(w[:2052].float(), 2, 4)
    assert_close_ulp(soft_threshold24(w[:2052], mask=mask, beta=beta), _reference(w[:2052], mask, 1.48))


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_out_dtype_writes_the_product_dtype_with_one_rounding(out_dtype):
    """fp32 master weight in, bf16/fp16 out: the float32 result rounded once (no fp32 intermediate)."""
    w = torch.randn(24, 64, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    mask = transposable_mask(w.cpu(), 2, 4).to(DEVICE)
    out = soft_threshold24(w, mask, torch.tensor(1.3, device=DEVICE), out_dtype=out_dtype)
    assert out.dtype == out_dtype and out.shape == w.shape
    assert_close_ulp(out, (1.3 * soft_threshold(w.cpu(), mask.cpu())).to(out_dtype).to(DEVICE))
    with pytest.raises(TypeError, match="out_dtype"):
        soft_threshold24(w, mask, 1.0, out_dtype=torch.int8)
