"""Kernel 5 (masked decay in place) against the reference backend's masked_decay_."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE, DTYPES, assert_close_ulp

from sparsity_lab.backends.torch_reference import TorchBackend
from sparsity_lab.kernels.masked_decay import masked_decay_


def _reference(grad, weight, mask, decay):
    """grad + decay * (1 - m) * w in float64, rounded to grad's dtype."""
    return (grad.double() + decay * weight.double() * (~mask)).to(grad.dtype)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 3000), g_dtype=st.sampled_from(DTYPES), w_dtype=st.sampled_from(DTYPES),
       decay=st.floats(1e-6, 1.0), block=st.sampled_from([64, 4096]), seed=st.integers(0, 2**31 - 1))
def test_decay_matches_reference_on_fresh_inputs(n, g_dtype, w_dtype, decay, block, seed):
    gen = torch.Generator().manual_seed(seed)
    grad = torch.randn(n, generator=gen).to(g_dtype).to(DEVICE)
    weight = torch.randn(n, generator=gen).to(w_dtype).to(DEVICE)
    mask = (torch.rand(n, generator=gen) < 0.5).to(DEVICE)
    expected = _reference(grad, weight, mask, decay)
    out = masked_decay_(grad, weight, mask, decay, block=block)
    assert out is grad
    # one rounding of decay * w and one of the sum: bounded by the operands, not the (cancelling) result
    assert_close_ulp(grad, expected, ulps=2, scale=expected.double().abs() + decay * weight.double().abs())
    assert torch.equal(grad[mask], expected[mask])  # kept entries untouched


def test_same_as_reference_backend_in_float32():
    grad = torch.randn(33, 28, device=DEVICE)
    weight, mask = torch.randn(33, 28, device=DEVICE), torch.rand(33, 28, device=DEVICE) < 0.5
    ref = grad.clone()
    TorchBackend().masked_decay_(ref, weight, mask, 6e-5)
    masked_decay_(grad, weight, mask, 6e-5, block=128)
    torch.testing.assert_close(grad, ref, rtol=2e-7, atol=1e-9)


def test_zero_decay_is_a_no_op_and_weight_may_be_a_view():
    grad = torch.randn(8, 12, device=DEVICE)
    before = grad.clone()
    masked_decay_(grad, torch.randn(8, 12, device=DEVICE), torch.zeros(8, 12, dtype=torch.bool, device=DEVICE), 0.0)
    assert torch.equal(grad, before)
    w = torch.randn(12, 8, device=DEVICE).t()
    mask = torch.zeros(8, 12, dtype=torch.bool, device=DEVICE)
    masked_decay_(grad, w, mask, 0.5)
    torch.testing.assert_close(grad, before + 0.5 * w)


def test_bad_arguments_are_named():
    g = torch.randn(4, 8, device=DEVICE)
    m = torch.ones(4, 8, dtype=torch.bool, device=DEVICE)
    with pytest.raises(ValueError, match="grad must be contiguous"):
        masked_decay_(torch.randn(8, 4, device=DEVICE).t(), g, m, 0.1)
    with pytest.raises(ValueError, match="weight has shape"):
        masked_decay_(g, torch.randn(4, 4, device=DEVICE), m, 0.1)
    with pytest.raises(TypeError, match="mask must have dtype"):
        masked_decay_(g, g.clone(), m.float(), 0.1)
    with pytest.raises(TypeError, match="decay"):
        masked_decay_(g, g.clone(), m, torch.tensor(0.1))


@pytest.mark.gpu
@pytest.mark.parametrize("g_dtype", DTYPES)
def test_decay_on_gpu_at_size(g_dtype):
    grad = torch.randn(4099, 1031, device="cuda").to(g_dtype)
    weight = torch.randn(4099, 1031, device="cuda")
    mask = torch.rand(4099, 1031, device="cuda") < 0.5
    expected = _reference(grad, weight, mask, 2e-4)
    masked_decay_(grad, weight, mask, 2e-4)
    assert_close_ulp(grad, expected, ulps=2, scale=expected.double().abs() + 2e-4 * weight.double().abs())
