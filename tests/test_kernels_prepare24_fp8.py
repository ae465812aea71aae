"""Kernel 18 (q(S(W)) and q(S(W))^T compressed in one pass, FP8) against the unfused path it replaces:
S (``soft_threshold24`` / ``w.to(dtype) * mask``), ``quantize_fp8_with_scale`` of S, ``compress24`` of q
and of q.t() (each tested against its own reference); and the decoded result against plain PyTorch."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE

from sparsity_lab.references.cusparselt_layout import compressed_shape, decompress24_reference
from sparsity_lab.references.fp8 import quantize_with_inv_scale
from sparsity_lab.kernels import compress24, quantize_fp8_with_scale, soft_threshold24, transposable_mask24
from sparsity_lab.kernels.prepare24_fp8 import prepare24_amax, prepare24_fp8


def _bytes(t):
    return t.contiguous().view(torch.uint8).reshape(-1)


def _weight(rows, cols, dtype, gen, magnitude):
    w = torch.randn(rows, cols, generator=gen) * magnitude
    # triton's CPU interpreter truncates float32 -> bf16 where the GPU rounds to nearest: on the CPU
    # weights that bf16 holds exactly keep the STE path's one rounding exact
    if DEVICE.type == "cpu":
        w = w.to(torch.bfloat16).float()
    return w.to(dtype).to(DEVICE)


def _unfused(w, mask, beta, dtype, inv_scale, fmt):
    s = soft_threshold24(w, mask, beta, out_dtype=dtype) if beta is not None else w.to(dtype) * mask
    q, amax = quantize_fp8_with_scale(s, inv_scale, fmt)
    return s, q, amax, compress24(q), compress24(q.t())


@settings(max_examples=16, deadline=None)
@given(row_tiles=st.integers(1, 3), col_tiles=st.integers(1, 3),
       w_dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16]), soft=st.booleans(),
       transposed_view=st.booleans(), magnitude=st.sampled_from([1e-3, 1.0, 30.0]),
       scale_factor=st.sampled_from([0.25, 1.0, 4.0]), seed=st.integers(0, 2**31 - 1))
def test_same_bytes_and_amax_as_threshold_cast_compress(row_tiles, col_tiles, w_dtype, dtype, soft, transposed_view,
                                                        magnitude, scale_factor, seed):
    """scale_factor 4 saturates (values clamp to fp8_max), 0.25 leaves headroom; magnitude 1e-3 puts
    entries in the subnormal range of the cast."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = 64 * row_tiles, 64 * col_tiles
    w = _weight(rows, cols, w_dtype, gen, magnitude)
    if transposed_view:
        w = w.t().contiguous().t()
    mask = transposable_mask24(w, pruned=False)[0]
    beta = torch.tensor(0.5 + torch.rand((), generator=gen).item(), device=DEVICE) if soft else None
    s = soft_threshold24(w, mask, beta, out_dtype=dtype) if soft else w.to(dtype) * mask
    inv_scale = (448.0 / s.abs().amax().float().clamp_min(1e-12) * scale_factor).reshape(1)
    _, q, amax_ref, fwd_ref, bwd_ref = _unfused(w, mask, beta, dtype, inv_scale, "e4m3")
    fwd, bwd, amax = prepare24_fp8(w, mask, beta, inv_scale, dtype=dtype)
    assert fwd.shape == compressed_shape(rows, cols, torch.float8_e4m3fn) and fwd.dtype == torch.float8_e4m3fn
    assert bwd.shape == compressed_shape(cols, rows, torch.float8_e4m3fn)
    assert torch.equal(_bytes(fwd), _bytes(fwd_ref))
    assert torch.equal(_bytes(bwd), _bytes(bwd_ref))
    assert amax.dim() == 0 and amax.dtype == torch.float32 and torch.equal(amax, amax_ref)
    assert torch.equal(prepare24_amax(w, mask, beta, dtype=dtype), amax_ref)


def test_decoded_forms_are_the_quantized_sparse_weight():
    """Decoded with the layout's reference: q(S) and q(S)^T of the plain PyTorch expression."""
    gen = torch.Generator().manual_seed(3)
    w = _weight(128, 64, torch.float32, gen, 1.0)
    mask = transposable_mask24(w, pruned=False)[0]
    s = w.to(torch.bfloat16) * mask
    inv_scale = torch.tensor([448.0 / 3.0], device=DEVICE)
    fwd, bwd, amax = prepare24_fp8(w, mask, None, inv_scale)
    q = quantize_with_inv_scale(s, inv_scale.reshape(()), "e4m3")
    assert torch.equal(decompress24_reference(fwd, 128, 64).float(), q.float())
    assert torch.equal(decompress24_reference(bwd, 64, 128).float(), q.float().t())
    assert float(amax) == float(s.abs().amax())


def test_one_form_alone():
    gen = torch.Generator().manual_seed(4)
    w = _weight(64, 128, torch.float32, gen, 1.0)
    mask = transposable_mask24(w, pruned=False)[0]
    inv_scale = torch.tensor(10.0, device=DEVICE)
    _, q, _, fwd_ref, _ = _unfused(w, mask, None, torch.bfloat16, inv_scale, "e4m3")
    only_fwd = prepare24_fp8(w, mask, None, inv_scale, transposed=False)
    assert only_fwd[1] is None and only_fwd[0].dtype == torch.float8_e4m3fn
    assert torch.equal(_bytes(only_fwd[0]), _bytes(fwd_ref))
    only_bwd = prepare24_fp8(w, mask, None, inv_scale, forward=False)
    assert only_bwd[0] is None and torch.equal(_bytes(only_bwd[1]), _bytes(compress24(quantize_fp8_with_scale(
        w.to(torch.bfloat16) * mask, inv_scale)[0].t())))


def test_bad_inputs_are_refused_with_the_reason():
    w = torch.randn(64, 64, device=DEVICE)
    mask = transposable_mask24(w, pruned=False)[0]
    inv = torch.tensor(1.0, device=DEVICE)
    with pytest.raises(TypeError, match="inv_scale"):
        prepare24_fp8(w, mask, None, 1.0)
    with pytest.raises(TypeError, match="inv_scale"):
        prepare24_fp8(w, mask, None, inv.double())
    with pytest.raises(TypeError, match="dtype"):
        prepare24_fp8(w, mask, None, inv, dtype=torch.float32)
    with pytest.raises(ValueError, match="multiples of 64"):
        prepare24_fp8(torch.randn(64, 96, device=DEVICE), torch.ones(64, 96, dtype=torch.bool, device=DEVICE),
                      None, inv)
    with pytest.raises(ValueError, match="nothing to write"):
        prepare24_fp8(w, mask, None, inv, forward=False, transposed=False)
    with pytest.raises(ValueError, match="mask"):
        prepare24_fp8(w, mask[:, :32], None, inv)


@pytest.mark.gpu
@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16])
def test_same_bytes_at_size_on_gpu(soft, w_dtype):
    """At an FFN's size, fp32 master weights included (the GPU rounds as PyTorch does), with a scale
    that saturates the largest entries."""
    w = torch.randn(4096, 16384, device="cuda").to(w_dtype)
    mask = transposable_mask24(w, pruned=False)[0]
    beta = torch.tensor(0.9, device="cuda") if soft else None
    inv_scale = torch.tensor([448.0 / 3.0], device="cuda")
    _, q, amax_ref, fwd_ref, bwd_ref = _unfused(w, mask, beta, torch.bfloat16, inv_scale, "e4m3")
    fwd, bwd, amax = prepare24_fp8(w, mask, beta, inv_scale)
    assert torch.equal(_bytes(fwd), _bytes(fwd_ref)) and torch.equal(_bytes(bwd), _bytes(bwd_ref))
    assert torch.equal(amax, amax_ref)
    assert torch.equal(prepare24_amax(w, mask, beta), amax_ref)


def test_values_that_are_not_finite_give_nan_bytes_as_the_unfused_cast():
    """Kernel 18's byte assembly follows ``references.fp8``'s policy: NaN (0x7F), not +-fp8_max."""
    gen = torch.Generator().manual_seed(5)
    w = _weight(64, 64, torch.float32, gen, 1.0)
    mask = transposable_mask24(w, pruned=False)[0]
    kept = mask.nonzero()
    for (r, c), bad in zip(kept[:3].tolist(), (float("inf"), -float("inf"), float("nan"))):
        w[r, c] = bad
    inv_scale = torch.tensor([10.0], device=DEVICE)
    _, q, _, fwd_ref, bwd_ref = _unfused(w, mask, None, torch.bfloat16, inv_scale, "e4m3")
    assert q.view(torch.uint8)[~torch.isfinite(w)].eq(0x7F).all()
    fwd, bwd, _ = prepare24_fp8(w, mask, None, inv_scale)
    assert torch.equal(_bytes(fwd), _bytes(fwd_ref)) and torch.equal(_bytes(bwd), _bytes(bwd_ref))
