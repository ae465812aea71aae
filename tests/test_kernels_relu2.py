"""Kernel 16 (squared ReLU forward and backward, one pass each) against ``sparsity_lab.references.relu2``.

On the GPU the kernels must equal the reference bit for bit (float32 products of 16-bit values are
exact, then rounded once, as PyTorch does); under the CPU interpreter fp32 and fp16 are bit for bit
too, and bf16 may be one ulp off (the interpreter truncates float32 -> bf16 instead of rounding).
"""
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from _adversarial import adversarial, examples, non_finite
from _kernel_testing import DEVICE, DTYPES, assert_close_ulp

from sparsity_lab.kernels.relu2 import relu2_backward, relu2_forward
from sparsity_lab.references.relu2 import relu2, relu2_grad


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _expect(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit for bit (NaN payloads aside: NaN where the reference has NaN); bf16 under the interpreter: 1 ulp."""
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), "NaN in different places"
    got, want = got.masked_fill(nan, 0), want.masked_fill(nan, 0)
    if DEVICE.type == "cuda" or got.dtype != torch.bfloat16:
        diff = _bits(got) != _bits(want)
        assert not bool(diff.any()), (f"{int(diff.sum())} elements differ; first got {got[diff][:4].tolist()}, "
                                      f"expected {want[diff][:4].tolist()}")
    else:
        inf = torch.isinf(want)
        assert torch.equal(got[inf], want[inf])
        assert_close_ulp(got.masked_fill(inf, 0), want.masked_fill(inf, 0))


def _interpretable(t: torch.Tensor) -> torch.Tensor:
    """Under the interpreter, bf16 subnormals become signed zeros: triton 3.9's interpreter converts them
    to float32 wrongly (3.03e-39 -> 3.67e-40, -9.2e-41 -> -0.0), an artifact of the interpreter, not of
    the kernel. On a GPU they are kept (and the ``gpu`` test of ``test_relu2.py`` draws them too)."""
    if DEVICE.type == "cuda" or t.dtype != torch.bfloat16:
        return t
    return torch.where(t.abs() < torch.finfo(t.dtype).smallest_normal, t * 0, t)


def _check(h: torch.Tensor, dy: torch.Tensor, block: int = 2048) -> None:
    h, dy = _interpretable(h), _interpretable(dy)
    _expect(relu2_forward(h, block=block), relu2(h))
    _expect(relu2_backward(dy, h, block=block), relu2_grad(h, dy))


@examples(20)
@given(shape=st.lists(st.integers(1, 37), min_size=1, max_size=3), dtype=st.sampled_from(DTYPES),
       block=st.sampled_from([16, 128, 2048]), scale=st.sampled_from([1e-3, 1.0, 1e3]),
       seed=st.integers(0, 2**31 - 1))
def test_kernels_match_the_reference_on_fresh_inputs(shape, dtype, block, scale, seed):
    """Odd sizes (numel rarely a multiple of the block), several blocks and magnitudes."""
    gen = torch.Generator().manual_seed(seed)
    h = (scale * torch.randn(shape, generator=gen)).to(dtype).to(DEVICE)
    dy = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    _check(h, dy, block)


@examples(15)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), rows=st.integers(1, 9), cols=st.integers(1, 23))
def test_kernels_match_the_reference_on_adversarial_magnitudes(data, dtype, rows, cols):
    """Zeros, subnormals, ties, values near the dtype's largest finite number (squares overflow), signs."""
    h = data.draw(adversarial((rows, cols), dtype)).to(DEVICE)
    dy = data.draw(adversarial((rows, cols), dtype)).to(DEVICE)
    _check(h, dy, block=64)


@examples(10)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_non_finite_values_follow_autograd(data, dtype):
    """NaN in h propagates to y and dh; +Inf squares to +Inf; -Inf gives 0; NaN in dy survives only where h > 0."""
    h = data.draw(non_finite((6, 11), dtype)).to(DEVICE)
    dy = data.draw(non_finite((6, 11), dtype)).to(DEVICE)
    _check(h, dy, block=32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_edge_values_against_autograd_of_the_two_pass_expression(dtype):
    big = torch.finfo(dtype).max
    vals = [0.0, -0.0, 1.0, -1.0, big, -big, math.sqrt(big), 2 * math.sqrt(big), 0.75 * big, big / 4,
            torch.finfo(dtype).tiny, -torch.finfo(dtype).tiny, math.nan, math.inf, -math.inf, 0.5, 3.0]
    h = torch.tensor(vals, dtype=torch.float64).to(dtype).to(DEVICE)
    dy = torch.tensor([1.0, math.nan, 0.0, math.nan, 0.0, 1.0, 2.0, 0.5, 4.0, 1.0, 1.0, 1.0, 1.0, 0.0, 7.0, -3.0,
                       big], dtype=torch.float64).to(dtype).to(DEVICE)
    h, dy = _interpretable(h), _interpretable(dy)
    hh = h.clone().requires_grad_(True)
    y = torch.nn.functional.relu(hh).square()
    y.backward(dy)
    _expect(relu2_forward(h), y.detach())
    _expect(relu2_backward(dy, h), hh.grad)
    # -0.0 and h <= 0 give an exact +0 in both directions, whatever dy holds (NaN included)
    dh = relu2_backward(dy, h)
    assert _bits(dh[:2]).eq(0).all() and _bits(relu2_forward(h)[:2]).eq(0).all()
    if dtype == torch.float16:  # 2 relu(h) overflows to inf in fp16 before the product, as autograd's does
        assert torch.isinf(dh[8]) and torch.isinf(hh.grad[8])


def test_non_contiguous_inputs_are_copied_and_give_the_same_values():
    base = torch.randn(13, 22, device=DEVICE)
    h, dy = base.t(), torch.randn(22, 13, device=DEVICE)[:, :]
    dy_strided = torch.randn(22, 26, device=DEVICE)[:, ::2]
    assert not h.is_contiguous() and not dy_strided.is_contiguous()
    _check(h, dy)
    _check(h, dy_strided)
    expanded = torch.ones(1, device=DEVICE).expand(22, 13)  # what y.sum().backward() hands in
    _expect(relu2_backward(expanded, h), relu2_grad(h, expanded))
    assert relu2_forward(h).is_contiguous() and relu2_forward(h).shape == h.shape


def test_empty_and_scalar_tensors():
    assert relu2_forward(torch.empty(0, 5, device=DEVICE)).shape == (0, 5)
    assert relu2_backward(torch.empty(3, 0, device=DEVICE), torch.empty(3, 0, device=DEVICE)).shape == (3, 0)
    h = torch.tensor(-2.5, device=DEVICE)
    assert relu2_forward(h).shape == () and float(relu2_forward(-h)) == 6.25
    assert float(relu2_backward(torch.tensor(1.0, device=DEVICE), -h)) == 5.0


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="h must have dtype"):
        relu2_forward(torch.randn(4, dtype=torch.float64, device=DEVICE))
    with pytest.raises(TypeError, match="h must be a torch.Tensor"):
        relu2_forward([1.0, 2.0])
    with pytest.raises(ValueError, match="grad_y has shape"):
        relu2_backward(torch.randn(3, device=DEVICE), torch.randn(4, device=DEVICE))
    with pytest.raises(TypeError, match="grad_y has dtype"):
        relu2_backward(torch.randn(4, device=DEVICE, dtype=torch.bfloat16), torch.randn(4, device=DEVICE))
    with pytest.raises(ValueError, match="block must be a power of two"):
        relu2_forward(torch.randn(4, device=DEVICE), block=100)
