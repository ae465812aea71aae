"""The GELU-backward + MVUE baseline (benchmarks/baselines/gelu_mvue_compress24.py) against GELU's backward in
PyTorch and kernel 10 run on the dZ it writes: the measured fusion computes what the pair computes."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE, assert_close_ulp

from benchmarks.baselines.gelu_mvue_compress24 import gelu_backward_mvue_compress24
from sparsity_lab.kernels.mvue_compress24 import mvue_compress24


def _bytes(t):
    return t.contiguous().view(torch.uint8).reshape(-1)


def _gelu_backward(dh, z):
    """PyTorch's GELU backward in float64 (the caller rounds it once to dh's dtype)."""
    z64 = z.double().requires_grad_()
    (dz,) = torch.autograd.grad(F.gelu(z64), z64, dh.double())
    return dz


def _inputs(tokens, cols, dtype, seed, magnitude=1.0, zeros=False):
    gen = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(tokens, cols, generator=gen)
    dh = torch.randn(tokens, cols, generator=gen) * magnitude
    if zeros:  # groups with fewer than two non-zeros: gelu'(z) is ~0 for z << 0, dH exactly 0 here
        dh = torch.where(torch.rand(dh.shape, generator=gen) < 0.4, torch.zeros(()), dh)
    return dh.to(dtype).to(DEVICE), z.to(dtype).to(DEVICE)


@settings(max_examples=10, deadline=None)
@given(token_tiles=st.integers(1, 3), col_tiles=st.integers(1, 2),
       dtype=st.sampled_from([torch.bfloat16, torch.float16]), zeros=st.booleans(),
       magnitude=st.sampled_from([1e-3, 1.0, 1e3]), seed=st.integers(0, 2**31 - 1))
def test_dz_is_gelus_backward_and_the_operand_is_kernel_10s_of_it(token_tiles, col_tiles, dtype, zeros, magnitude,
                                                                   seed):
    dh, z = _inputs(64 * token_tiles, 64 * col_tiles, dtype, seed, magnitude, zeros)
    dz, a = gelu_backward_mvue_compress24(dh, z, seed=seed % 1000)
    expected = _gelu_backward(dh.cpu(), z.cpu())
    # float32 erf and exp against float64: a few float32 ulps of the terms |dh| (1 + |z|), then one rounding
    terms = dh.cpu().double().abs() * (1 + z.cpu().double().abs())
    assert_close_ulp(dz.cpu(), expected.to(dtype), ulps=1.5, atol=1e-6 * terms)
    assert torch.equal(_bytes(a), _bytes(mvue_compress24(dz, seed=seed % 1000)))


def test_a_device_seed_draws_what_the_int_draws():
    dh, z = _inputs(128, 64, torch.bfloat16, 5)
    _, a_int = gelu_backward_mvue_compress24(dh, z, seed=11)
    _, a_dev = gelu_backward_mvue_compress24(dh, z, seed=torch.tensor(11, dtype=torch.int64, device=DEVICE))
    _, a_other = gelu_backward_mvue_compress24(dh, z, seed=12)
    assert torch.equal(_bytes(a_int), _bytes(a_dev))
    assert not torch.equal(_bytes(a_int), _bytes(a_other))


def test_bad_inputs_are_refused_with_the_reason():
    dh, z = _inputs(128, 64, torch.bfloat16, 0)
    with pytest.raises(ValueError, match="multiples of 64"):
        gelu_backward_mvue_compress24(dh[:96], z[:96])
    with pytest.raises(ValueError, match="z must be a tensor of dh's shape"):
        gelu_backward_mvue_compress24(dh, z[:64])
    with pytest.raises(ValueError, match="z must be a tensor of dh's shape"):
        gelu_backward_mvue_compress24(dh, z.half())
    with pytest.raises(ValueError, match="contiguous"):
        gelu_backward_mvue_compress24(dh.t().contiguous().t(), z.t().contiguous().t())
    with pytest.raises(TypeError, match="dtype"):
        gelu_backward_mvue_compress24(dh.float(), z.float())
    with pytest.raises(ValueError, match="seed"):
        gelu_backward_mvue_compress24(dh, z, seed=-1)
    with pytest.raises(ValueError, match="block_groups"):
        gelu_backward_mvue_compress24(dh, z, block_groups=12)


@pytest.mark.gpu
def test_at_the_lab_steps_size_dz_matches_pytorchs_gelu_backward_on_gpu():
    """At 8192 tokens x 16384 (the lab GPT's up projection): dZ against torch's own CUDA GELU backward, the bytes
    against kernel 10; prints how many dZ entries are not bit-equal to PyTorch's."""
    dh, z = _inputs(8192, 16384, torch.bfloat16, 3)
    dz, a = gelu_backward_mvue_compress24(dh, z, seed=7)
    ref = torch.ops.aten.gelu_backward(dh, z)
    assert_close_ulp(dz, ref, ulps=1.0, atol=1e-6 * dh.double().abs() * (1 + z.double().abs()))
    print(f"dZ entries differing from torch's gelu_backward: {int((dz != ref).sum())} of {dz.numel()}")
    assert torch.equal(_bytes(a), _bytes(mvue_compress24(dz, seed=7)))
