"""Kernel 14 (FP8 cast writing q and q^T in one pass) against sparsity_lab.references.fp8, bit for bit."""
import pytest
import torch
from _kernel_testing import DEVICE, DTYPES

from sparsity_lab.kernels import fp8_cast, fp8_cast_transpose
from sparsity_lab.references import fp8 as reference

FMTS = ("e4m3", "e5m2")


def _bits(q):
    return q.view(torch.uint8)


def _check(x, fmt, inv, **blocks):
    q, q_t, a = fp8_cast_transpose.quantize_fp8_transposed(x, inv, fmt, **blocks)
    expected = reference.quantize_with_inv_scale(x, inv, fmt)
    assert q.dtype == q_t.dtype == expected.dtype and q.is_contiguous() and q_t.is_contiguous()
    assert q.shape == x.shape and q_t.shape == x.t().shape
    assert torch.equal(_bits(q), _bits(expected))
    assert torch.equal(_bits(q_t), _bits(expected.t().contiguous()))
    assert torch.equal(a, reference.amax(x))
    one_pass, _ = fp8_cast.quantize_fp8_with_scale(x, inv, fmt)  # the same values as the flat cast kernel
    assert torch.equal(_bits(q), _bits(one_pass))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (37, 70), (64, 64), (130, 17), (5, 200)])
def test_fresh_random_inputs_of_odd_sizes(shape, dtype, fmt):
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, (1,))))  # fresh each run
    rows, cols = shape
    # magnitudes spread over 12 decades (FP8 subnormals and underflow to zero) with random signs
    x = torch.randn(rows, cols, generator=gen) * 10.0 ** (-12 * torch.rand(rows, cols, generator=gen))
    x = x.to(dtype).to(DEVICE)
    _, inv = reference.scales_from_amax(reference.amax(x), fmt)
    _check(x, fmt, inv, block_r=32, block_c=16)


@pytest.mark.parametrize("fmt", FMTS)
def test_adversarial_magnitudes_clamp_ties_zeros_and_signs(fmt):
    dtype, fmax = reference.fp8_format(fmt)
    grid = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    grid = grid[torch.isfinite(grid) & (grid >= 0)].unique()
    mids = (grid[:-1] + grid[1:]) / 2  # every tie between neighbouring FP8 values
    special = torch.tensor([0.0, -0.0, fmax, -fmax, fmax * 3, -fmax * 1e3, 1e-30, -1e-30])
    values = torch.cat([mids, -mids, special])
    values = torch.cat([values, torch.zeros((-values.numel()) % 7)])  # 7 columns, an odd number of rows
    x = values[torch.randperm(values.numel())].reshape(-1, 7).to(DEVICE)
    inv = torch.tensor(1.0, device=DEVICE)  # the values land on the grid as they are: ties stay ties
    _check(x, fmt, inv, block_r=16, block_c=16)
    # a stale (delayed) scale far too small: everything clamps to +-fmax, zeros keep their sign
    _check(x, fmt, torch.tensor(1e6, device=DEVICE), block_r=16, block_c=32)


def test_a_strided_view_with_unit_column_stride_and_default_blocks():
    base = torch.randn(100, 96, device=DEVICE, dtype=torch.bfloat16) * 3
    x = base[:, 8:88]  # row stride 96, column stride 1: read in place
    _, inv = reference.scales_from_amax(reference.amax(x), "e4m3")
    _check(x, "e4m3", inv)


def test_bad_input_is_refused_with_the_argument_named():
    x = torch.randn(8, 8, device=DEVICE)
    inv = torch.tensor(1.0, device=DEVICE)
    with pytest.raises(ValueError, match="x must be 2-D"):
        fp8_cast_transpose.quantize_fp8_transposed(x.reshape(-1), inv)
    with pytest.raises(TypeError, match="inv_scale"):
        fp8_cast_transpose.quantize_fp8_transposed(x, 1.0)
    with pytest.raises(ValueError, match="block_r"):
        fp8_cast_transpose.quantize_fp8_transposed(x, inv, block_r=48)
    with pytest.raises(ValueError, match="fmt"):
        fp8_cast_transpose.quantize_fp8_transposed(x, inv, "e3m4")
    with pytest.raises(TypeError, match="x must have dtype"):
        fp8_cast_transpose.quantize_fp8_transposed(x.to(torch.int32), inv)
