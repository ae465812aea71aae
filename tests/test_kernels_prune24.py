"""Kernel 1 (row-wise 2:4 prune + uint8 group mask) against sparsity_lab.masks.nm_mask."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE, DTYPES

from sparsity_lab.kernels.prune24 import pack_mask24, prune24, unpack_mask24
from sparsity_lab.masks.nm import nm_mask


def _weights(shape, dtype, ties, gen, device):
    if ties:  # small integers: many exact ties, so the lowest-index rule is exercised
        return torch.randint(-2, 3, shape, generator=gen).to(dtype).to()
    return torch.randn(shape, generator=gen).to(dtype).to()


def _check(w, block):
    out, bits = prune24(w, block=block)
    ref = nm_mask(w, 2, 4)
    assert bits.dtype == torch.uint8 and bits.shape == (*w.shape[:-1], w.shape[-1] // 4)
    assert torch.equal(unpack_mask24(bits), ref)
    assert torch.equal(out, w * ref)
    assert torch.equal(pack_mask24(ref), bits)
    assert bool(((bits >> 4) == 0).all())


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 9), groups=st.integers(1, 21), dtype=st.sampled_from(DTYPES), ties=st.booleans(),
       block=st.sampled_from([4, 16, 1024]), seed=st.integers(0, 2**31 - 1))
def test_prune_equals_reference_mask_on_fresh_inputs(rows, groups, dtype, ties, block, seed):
    w = _weights((rows, 4 * groups), dtype, ties, torch.Generator().manual_seed(seed), DEVICE)
    _check(w, block)


def test_leading_dims_and_non_contiguous_input():
    w = torch.randn(3, 5, 12, device=DEVICE)
    _check(w, 8)
    wt = torch.randn(24, 6, device=DEVICE).t()  # (6, 24), not contiguous
    out, bits = prune24(wt, block=4)
    assert torch.equal(unpack_mask24(bits), nm_mask(wt, 2, 4)) and torch.equal(out, wt * nm_mask(wt, 2, 4))


def test_mask_only_writes_no_values():
    w = torch.randn(7, 36, device=DEVICE)
    out, bits = prune24(w, values=False)
    assert out is None and torch.equal(unpack_mask24(bits), nm_mask(w, 2, 4))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="w must have a last dimension divisible by 4"):
        prune24(torch.randn(4, 6, device=DEVICE))
    with pytest.raises(TypeError, match="w must have dtype"):
        prune24(torch.ones(4, 8, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="block"):
        prune24(torch.randn(4, 8, device=DEVICE), block=3)
    with pytest.raises(ValueError, match="empty"):
        prune24(torch.randn(0, 8, device=DEVICE))
    with pytest.raises(TypeError, match="bits must be uint8"):
        unpack_mask24(torch.ones(3, dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_prune_on_gpu_at_size(dtype):
    w = torch.randn(1031, 4100, device="cuda").to(dtype)
    _check(w, 1024)
    _check(torch.randint(-2, 3, (515, 2052), device="cuda").to(dtype), 256)
