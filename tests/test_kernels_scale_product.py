"""Kernel 15 (a product scaled in place by two device scales) against the float32 reference."""
import pytest
import torch
from _kernel_testing import DEVICE, DTYPES, assert_close_ulp

from sparsity_lab.kernels.scale_product import scale_product_


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 97, 4096 + 3])
def test_scaling_equals_the_float32_reference(dtype, n):
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, (1,))))  # fresh inputs each run
    # products of FP8 values span a wide range; scales from tiny (gradients) to large
    d = (torch.randn(n, generator=gen) * 10.0 ** torch.randint(-3, 4, (n,), generator=gen)).to(dtype).to(DEVICE)
    s_a = torch.tensor(float(torch.rand(1, generator=gen)) * 1e-3 + 1e-6, device=DEVICE)
    s_b = torch.tensor(float(torch.rand(1, generator=gen)) * 10 + 0.1, device=DEVICE)
    want = (d.float() * (s_a * s_b)).to(dtype)
    got = scale_product_(d.clone(), s_a, s_b, block=64)
    if dtype == torch.float32:
        assert torch.equal(got, want)
    else:
        assert_close_ulp(got, want)  # the interpreter truncates float32 -> half/bf16


def test_2d_tensor_in_place_and_returned():
    d = torch.randn(33, 64, device=DEVICE, dtype=torch.bfloat16)
    before = d.clone()
    out = scale_product_(d, torch.tensor(0.5, device=DEVICE), torch.tensor(4.0, device=DEVICE))
    assert out is d and torch.equal(d, (before.float() * 2).to(torch.bfloat16))  # exact: a power of two


def test_bad_input_is_refused_with_the_argument_named():
    one = torch.tensor(1.0, device=DEVICE)
    with pytest.raises(ValueError, match="contiguous"):
        scale_product_(torch.randn(8, 8, device=DEVICE).t(), one, one)
    with pytest.raises(TypeError, match="s_b"):
        scale_product_(torch.randn(8, device=DEVICE), one, torch.tensor([1.0, 2.0], device=DEVICE))
    with pytest.raises(TypeError, match="s_a"):
        scale_product_(torch.randn(8, device=DEVICE), one.double(), one)
    with pytest.raises(ValueError, match="block"):
        scale_product_(torch.randn(8, device=DEVICE), one, one, block=100)
