"""Kernel 7 (FP8 per-tensor amax, scale, cast, and back) against sparsity_lab.references.fp8, bit for bit."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE, DTYPES, assert_close_ulp

from sparsity_lab.references import fp8 as reference
from sparsity_lab.kernels import fp8_cast

FMTS = ("e4m3", "e5m2")


def _bits(q):
    return q.view(torch.uint8)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 5000), fmt=st.sampled_from(FMTS), dtype=st.sampled_from(DTYPES),
       decades=st.integers(0, 12), block=st.sampled_from([64, 4096]), seed=st.integers(0, 2**31 - 1))
def test_quantize_is_bitwise_the_reference(n, fmt, dtype, decades, block, seed):
    gen = torch.Generator().manual_seed(seed)
    # magnitudes spread over `decades` powers of ten: subnormal FP8 values and underflow included
    x = torch.randn(n, generator=gen) * 10.0 ** (-decades * torch.rand(n, generator=gen))
    x = x.to(dtype).to(DEVICE)
    q, scale = fp8_cast.quantize_fp8(x, fmt, block=block)
    q_ref, scale_ref = reference.quantize_fp8(x, fmt)
    assert q.dtype == q_ref.dtype and torch.equal(scale, scale_ref)
    assert torch.equal(_bits(q), _bits(q_ref))
    _check_dequantize(q, scale, dtype, block)


def _check_dequantize(q, scale, dtype, block=4096):
    back = fp8_cast.dequantize_fp8(q, scale, dtype, block=block)
    expected = reference.dequantize_fp8(q, scale, dtype)
    if dtype == torch.bfloat16 and q.device.type == "cpu":
        assert_close_ulp(back, expected)  # the interpreter truncates float32 -> bf16
    else:
        assert torch.equal(back, expected)


@pytest.mark.parametrize("fmt", FMTS)
def test_ties_round_to_even(fmt):
    # every midpoint between neighbouring FP8 values (x * inv_scale lands exactly on it)
    dtype, fmax = reference.fp8_format(fmt)
    grid = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    grid = grid[torch.isfinite(grid) & (grid >= 0)].unique()
    mids = (grid[:-1] + grid[1:]) / 2
    x = torch.cat([mids, -mids, torch.tensor([fmax])]).to(DEVICE)  # amax = fmax: inv_scale = 1
    q, _ = fp8_cast.quantize_fp8(x, fmt)
    assert torch.equal(_bits(q), _bits(reference.quantize_fp8(x, fmt)[0]))


def test_amax_and_one_pass_quantization_with_a_given_scale():
    x = torch.randn(3000, device=DEVICE) * 5
    assert torch.equal(fp8_cast.amax(x, block=256), reference.amax(x))
    _, inv = reference.scales_from_amax(torch.tensor(7.0, device=DEVICE), "e5m2")
    q, a = fp8_cast.quantize_fp8_with_scale(x, inv, "e5m2", block=256)
    assert torch.equal(_bits(q), _bits(reference.quantize_with_inv_scale(x, inv, "e5m2")))
    assert torch.equal(a, reference.amax(x))


def test_zero_tensor():
    q, scale = fp8_cast.quantize_fp8(torch.zeros(100, device=DEVICE))
    assert torch.isfinite(scale) and bool((q.float() == 0).all())


def test_bad_arguments_are_named():
    x = torch.randn(10, device=DEVICE)
    with pytest.raises(ValueError, match="fmt"):
        fp8_cast.quantize_fp8(x, "e2m5")
    with pytest.raises(TypeError, match="inv_scale"):
        fp8_cast.quantize_fp8_with_scale(x, 2.0)
    with pytest.raises(TypeError, match="q must have dtype"):
        fp8_cast.dequantize_fp8(x, torch.tensor(1.0, device=DEVICE))
    with pytest.raises(TypeError, match="dtype must be"):
        fp8_cast.dequantize_fp8(fp8_cast.quantize_fp8(x)[0], torch.tensor(1.0, device=DEVICE), torch.float64)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_on_gpu_at_size(fmt, dtype):
    x = (torch.randn(4099, 1031, device="cuda") * 10.0 ** (-6 * torch.rand(4099, 1031, device="cuda"))).to(dtype)
    q, scale = fp8_cast.quantize_fp8(x, fmt)
    q_ref, scale_ref = reference.quantize_fp8(x, fmt)
    assert torch.equal(scale, scale_ref) and torch.equal(_bits(q), _bits(q_ref))
    _check_dequantize(q, scale, dtype)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("inv", [3.0, 0.0, float("nan")], ids=["delayed_scale", "infinite_amax", "nan_amax"])
def test_values_that_are_not_finite_quantize_to_nan_as_in_the_reference(fmt, inv):
    """The policy of ``references.fp8``: +-inf and NaN give NaN (byte 0x7F) whatever the scale, never a
    saturated +-fp8_max; kernel 7 (one pass with a given scale) and kernel 14 (cast-transpose) agree."""
    from sparsity_lab.kernels import fp8_cast_transpose

    x = torch.randn(8, 64)
    x[0, 3], x[1, 5], x[2, 7], x[3, 0] = float("inf"), -float("inf"), float("nan"), 1e38  # 1e38: finite, saturates
    x = x.to(DEVICE)
    inv_scale = torch.tensor(inv, device=DEVICE)
    q_ref = reference.quantize_with_inv_scale(x, inv_scale, fmt)
    assert _bits(q_ref)[~torch.isfinite(x)].eq(0x7F).all()  # NaN, not +-fp8_max
    if inv == 3.0:
        assert torch.isfinite(q_ref.float()[torch.isfinite(x)]).all()  # 1e38 saturates
    q, _ = fp8_cast.quantize_fp8_with_scale(x, inv_scale, fmt)
    q2, q2_t, _ = fp8_cast_transpose.quantize_fp8_transposed(x, inv_scale, fmt)
    assert torch.equal(_bits(q), _bits(q_ref))
    assert torch.equal(_bits(q2), _bits(q_ref)) and torch.equal(_bits(q2_t), _bits(q_ref).t())
    x_inf = torch.where(torch.isnan(x), 0.0, x)  # current scaling with an infinite amax (a NaN amax: the
    q3, _ = fp8_cast.quantize_fp8(x_inf, fmt)     # reference propagates it, the amax kernel may not)
    assert torch.equal(_bits(q3), _bits(reference.quantize_fp8(x_inf, fmt)[0]))


@pytest.mark.parametrize("fmt", FMTS)
def test_every_rounding_boundary_converts_as_the_reference(fmt):
    """Compiled kernels convert with the GPU's instruction, the interpreter rounds in float32: both must give
    the reference's byte at every FP8 value, on both sides of every midpoint (one float32 ulp away), in the
    band above the largest finite value, at float32 subnormals and at -0.0; kernels 7 and 14 agree."""
    from sparsity_lab.kernels import fp8_cast_transpose

    dtype, fmax = reference.fp8_format(fmt)
    grid = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    grid = grid[torch.isfinite(grid) & (grid >= 0)].unique()
    mids = (grid[:-1] + grid[1:]) / 2
    above = torch.linspace(fmax, 2.5 * fmax, 61)
    tiny = torch.tensor([1e-45, 1e-40, 1.1754942e-38, 0.0, grid[1].item() / 2, grid[1].item() / 2 * 1.0000001])
    x = torch.cat([grid, mids, mids.nextafter(torch.zeros_like(mids)), mids.nextafter(mids * 2), above, tiny])
    x = torch.cat([x, -x])
    x = torch.cat([x, torch.zeros(64 - x.numel() % 64)]).reshape(-1, 64).to(DEVICE)
    one = torch.tensor(1.0, device=DEVICE)
    q_ref = _bits(reference.quantize_with_inv_scale(x, one, fmt))
    assert q_ref[x.signbit() & (x.abs() < grid[1] / 2)].eq(0x80).all()  # -0.0 and negative underflow keep the sign
    q, _ = fp8_cast.quantize_fp8_with_scale(x, one, fmt)
    q2, q2_t, _ = fp8_cast_transpose.quantize_fp8_transposed(x, one, fmt)
    assert torch.equal(_bits(q), q_ref)
    assert torch.equal(_bits(q2), q_ref) and torch.equal(_bits(q2_t), q_ref.t())


def test_a_gpu_without_fp8_conversion_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    fp8_cast._fp8_conversion_problem.cache_clear()
    try:
        with pytest.raises(RuntimeError, match=r"compute capability 8.9 or later.*A100 is 8.0"):
            fp8_cast.check_fp8_device(torch.device("cuda", 0))
    finally:
        fp8_cast._fp8_conversion_problem.cache_clear()  # the real GPU's answer, asked again
    fp8_cast.check_fp8_device(torch.device("cpu"))  # the interpreter rounds in software: nothing to check
