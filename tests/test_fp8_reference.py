"""The plain PyTorch FP8 per-tensor quantization: scale convention, range, round trip."""
import pytest
import torch

from sparsity_lab.references.fp8 import FP8_FORMATS, amax, dequantize_fp8, quantize_fp8, scales_from_amax


@pytest.mark.parametrize("fmt,fmax", [("e4m3", 448.0), ("e5m2", 57344.0)])
def test_format_maxima_are_the_largest_finite_values(fmt, fmax):
    dtype, listed = FP8_FORMATS[fmt]
    assert listed == fmax == torch.finfo(dtype).max


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_amax_maps_to_the_format_maximum_and_scale_is_amax_over_max(fmt):
    x = torch.randn(64, 32) * 3.7
    q, scale = quantize_fp8(x, fmt)
    dtype, fmax = FP8_FORMATS[fmt]
    assert q.dtype == dtype and q.shape == x.shape
    assert float(q.float().abs().max()) == fmax
    assert torch.equal(scale, amax(x) / fmax)
    assert scale.dtype == torch.float32 and scale.dim() == 0


@pytest.mark.parametrize("fmt,mant_bits", [("e4m3", 3), ("e5m2", 2)])
def test_round_trip_error_is_within_half_an_fp8_ulp(fmt, mant_bits):
    # values within the normal range of the format after scaling: relative error <= 2**-(m+1)
    x = torch.randn(4096, dtype=torch.float64).float()
    x = x.sign() * x.abs().clamp(0.05, 4.0)
    q, scale = quantize_fp8(x, fmt)
    back = dequantize_fp8(q, scale)
    rel = ((back - x).abs() / x.abs()).max()
    assert rel <= 2.0 ** -(mant_bits + 1) * 1.001


def test_zero_tensor_gives_zeros_and_a_finite_scale():
    q, scale = quantize_fp8(torch.zeros(8, 8))
    assert torch.isfinite(scale) and bool((q.float() == 0).all())


def test_quantization_rounds_to_nearest_even_like_torch():
    x = torch.randn(1000) * 10
    _, inv = scales_from_amax(amax(x), "e4m3")
    q, _ = quantize_fp8(x, "e4m3")
    assert torch.equal(q.view(torch.uint8), (x * inv).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="fmt"):
        quantize_fp8(torch.randn(4), "e3m4")
    with pytest.raises(TypeError, match="x must be"):
        quantize_fp8(torch.ones(4, dtype=torch.int32))
    with pytest.raises(TypeError, match="q must be"):
        dequantize_fp8(torch.ones(4), torch.tensor(1.0))
