"""Kernel 6 (fused SwiGLU / GEGLU, forward and backward, both layouts) against sparsity_lab.references.gated."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE, DTYPES, assert_close_ulp

from sparsity_lab.references import gated as reference
from sparsity_lab.kernels.gated import gated_backward, gated_forward

KINDS = ("swiglu", "geglu")


def _check(h, dout, kind, split_dim, block=2048):
    out = gated_forward(h, kind, split_dim, block=block)
    dh = gated_backward(dout, h, kind, split_dim, block=block)
    exp_out = reference.gated_forward(h, kind, split_dim)
    exp_dh = reference.gated_backward(dout, h, kind, split_dim)
    # float32 gelu via erf cancels (1 + erf(g) for g << 0; cdf + g pdf near gelu's minimum), and
    # CPU and GPU libm differ: allow float32 error of the terms, ~1e-6 (|g| + 1), plus rounding to
    # the output dtype (float32: a few ulp of libm differences)
    ulps = 16 if h.dtype == torch.float32 else 1.5
    g, v = reference.split_gate_value(h.double(), split_dim)
    assert_close_ulp(out, exp_out, ulps=ulps, atol=1e-6 * v.abs() * (g.abs() + 1))
    terms = dout.double().abs() * (v.abs() + 1) * (g.abs() + 1)
    assert_close_ulp(dh, exp_dh, ulps=ulps, atol=1e-6 * torch.cat([terms, terms], dim=split_dim))


@settings(max_examples=20, deadline=None)
@given(kind=st.sampled_from(KINDS), tokens=st.integers(1, 40), ffn=st.integers(1, 45), transposed=st.booleans(),
       dtype=st.sampled_from(DTYPES), block=st.sampled_from([32, 2048]), seed=st.integers(0, 2**31 - 1))
def test_fused_matches_reference_on_fresh_inputs(kind, tokens, ffn, transposed, dtype, block, seed):
    gen = torch.Generator().manual_seed(seed)
    h = (2 * torch.randn(tokens, 2 * ffn, generator=gen)).to(dtype).to(DEVICE)
    dout = torch.randn(tokens, ffn, generator=gen).to(dtype).to(DEVICE)
    if transposed:  # the transposed product's output h^T (2F, T) and dout^T (F, T)
        _check(h.t().contiguous(), dout.t().contiguous(), kind, 0, block)
    else:
        _check(h, dout, kind, -1, block)


@pytest.mark.parametrize("kind", KINDS)
def test_leading_dims_and_layouts_agree(kind):
    h = torch.randn(3, 5, 24, device=DEVICE)
    out = gated_forward(h, kind)
    assert out.shape == (3, 5, 12)
    ht = h.reshape(15, 24).t().contiguous()
    torch.testing.assert_close(gated_forward(ht, kind, split_dim=0), out.reshape(15, 12).t())


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="kind"):
        gated_forward(torch.randn(2, 4, device=DEVICE), "relu")
    with pytest.raises(ValueError, match="even"):
        gated_forward(torch.randn(2, 5, device=DEVICE))
    with pytest.raises(ValueError, match="grad_out has shape"):
        gated_backward(torch.randn(2, 3, device=DEVICE), torch.randn(2, 4, device=DEVICE))
    with pytest.raises(TypeError, match="h must have dtype"):
        gated_forward(torch.randn(2, 4, dtype=torch.float64, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_on_gpu_at_size(kind, dtype):
    h = torch.randn(1037, 2 * 2051, device="cuda").to(dtype)
    dout = torch.randn(1037, 2051, device="cuda").to(dtype)
    _check(h, dout, kind, -1)
    _check(h.t().contiguous(), dout.t().contiguous(), kind, 0)
