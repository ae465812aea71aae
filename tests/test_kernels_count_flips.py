"""Kernel 9 (flip count of two bool masks) against sparsity_lab.methods.flip_rate."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE

from sparsity_lab.kernels.count_flips import count_flips
from sparsity_lab.methods.flip_rate import mask_flips, mask_flips_tensor


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 70), p=st.sampled_from([0.0, 0.01, 0.5, 1.0]),
       block=st.sampled_from([16, 1024, 8192]), seed=st.integers(0, 2**31 - 1))
def test_count_equals_reference_on_fresh_masks(rows, cols, p, block, seed):
    gen = torch.Generator().manual_seed(seed)
    prev = torch.rand(rows, cols, generator=gen) < 0.5
    new = prev ^ (torch.rand(rows, cols, generator=gen) < p)
    got = count_flips(prev.to(DEVICE), new.to(DEVICE), block=block)
    assert got.dtype == torch.int64 and got.dim() == 0
    assert int(got) == mask_flips(prev, new) == int((prev != new).sum())


def test_non_contiguous_masks_and_reference_on_other_dtypes():
    prev = (torch.rand(64, 48) < 0.5).t()
    new = (torch.rand(64, 48) < 0.5).t()
    assert int(count_flips(prev.to(DEVICE), new.to(DEVICE))) == int((prev != new).sum())
    assert int(mask_flips_tensor(prev.float(), new.float())) == int((prev != new).sum())


def test_bad_inputs():
    m = torch.zeros(8, 8, dtype=torch.bool, device=DEVICE)
    with pytest.raises(TypeError, match="dtype"):
        count_flips(m.float(), m)
    with pytest.raises(ValueError, match="shape"):
        count_flips(m, m[:4])
    with pytest.raises(ValueError, match="power of two"):
        count_flips(m, m, block=100)


@pytest.mark.gpu
def test_count_at_size_on_gpu():
    prev = torch.rand(16384, 4096, device="cuda") < 0.5
    new = prev ^ (torch.rand(16384, 4096, device="cuda") < 0.001)
    assert int(count_flips(prev, new)) == int((prev != new).sum())
