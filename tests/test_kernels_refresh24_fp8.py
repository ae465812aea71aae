"""Kernel 21's E4M3 form (``refresh24_fp8``: the transposable mask in place, its flips, q(S(W)) and q(S(W))^T
compressed in cuSPARSELt's FP8 layout, amax(S(W))) against the chain it replaces, kernel 2 -> kernel 9 -> the mask
copy -> kernel 18 (each tested against its own reference), and against the plain path: S of the new mask,
``quantize_fp8_with_scale``, ``compress24`` of q and of q.t()."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE
from test_kernels_refresh24 import _adversarial_weight, _previous, _weight

from sparsity_lab.kernels import (compress24, count_flips, prepare24_amax, prepare24_fp8, quantize_fp8_with_scale,
                                  refresh24_fp8, soft_threshold24, transposable_mask24)
from sparsity_lab.masks.patterns import solve_patterns
from sparsity_lab.masks.tiles import validate_transposable_mask
from sparsity_lab.methods.flip_rate import mask_flips_tensor
from sparsity_lab.references.cusparselt_layout import compressed_shape

E4M3 = torch.float8_e4m3fn


def _bytes(t):
    return t.contiguous().view(torch.uint8).reshape(-1)


def _chain(w, previous, beta, inv_scale, dtype, forward, transposed):
    """(new mask, flips, fwd, bwd, amax) of kernel 2 -> 9 -> copy -> 18 (its amax pass where no form is asked)."""
    new = transposable_mask24(w, pruned=False)[0]
    flips = count_flips(previous, new)
    mask = previous.clone()
    mask.copy_(new)
    if forward or transposed:
        fwd, bwd, amax = prepare24_fp8(w, mask, beta, inv_scale, dtype, forward=forward, transposed=transposed)
    else:
        fwd = bwd = None
        amax = prepare24_amax(w, mask, beta, dtype)
    return mask, flips, fwd, bwd, amax


def _assert_same_as_chain(w, previous, beta, inv_scale, dtype=torch.bfloat16, forward=True, transposed=True,
                          count=True):
    mask = previous.clone()
    flips, fwd, bwd, amax = refresh24_fp8(w, mask, beta, inv_scale, dtype, forward=forward, transposed=transposed,
                                          count=count)
    ref_mask, ref_flips, ref_fwd, ref_bwd, ref_amax = _chain(w, previous, beta, inv_scale, dtype, forward, transposed)
    assert torch.equal(mask, ref_mask)
    if count:
        assert flips.dtype == torch.int64 and flips.dim() == 0 and flips.device == w.device
        assert int(flips) == int(ref_flips) == int(mask_flips_tensor(previous, mask))
    else:
        assert flips is None
    for got, want in ((fwd, ref_fwd), (bwd, ref_bwd)):
        assert (got is None) == (want is None)
        if got is not None:
            assert got.shape == want.shape and got.dtype == want.dtype == E4M3
            assert torch.equal(_bytes(got), _bytes(want))
    assert amax.dim() == 0 and amax.dtype == torch.float32 and torch.equal(amax, ref_amax)
    return mask, fwd, bwd, amax


def _beta(soft, gen):
    return torch.tensor(0.5 + torch.rand((), generator=gen).item(), device=DEVICE) if soft else None


def _inv_scale(w, beta, factor):
    """fp8_max over a bound of amax(S) (|S| <= beta |W|), times ``factor``: 4 saturates, 0.25 leaves headroom."""
    bound = w.abs().amax().float() * (beta if beta is not None else 1.0)
    return (448.0 / bound.clamp_min(1e-12) * factor).reshape(1)


@settings(max_examples=12, deadline=None)
@given(shape=st.sampled_from([(64, 64), (64, 128), (128, 64), (128, 192)]),
       w_dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16]), soft=st.booleans(),
       magnitude=st.sampled_from([2.0 ** -6, 1.0, 32.0]), scale_factor=st.sampled_from([0.25, 1.0, 4.0]),
       transposed_view=st.booleans(), previous=st.sampled_from(["ones", "random", "same", "near"]),
       forms=st.sampled_from([(True, True), (True, False), (False, True), (False, False)]), count=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_same_mask_flips_bytes_and_amax_as_the_chain(shape, w_dtype, dtype, soft, magnitude, scale_factor,
                                                     transposed_view, previous, forms, count, seed):
    """magnitude 2^-6 with scale_factor 0.25 puts entries in the cast's subnormals, scale_factor 4 clamps to 448
    (powers of two keep W exact in bf16, which the interpreter truncates to). Also the plain path: q(S) of the new
    mask compressed by kernel 8, and its amax."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = shape
    w = (_weight(rows, cols, torch.float32, gen) * magnitude).to(w_dtype)
    if transposed_view:  # W given as the .t() of a contiguous tensor: read in place through its strides
        w = w.t().contiguous().t()
    beta = _beta(soft, gen)
    inv_scale = _inv_scale(w, beta, scale_factor)
    mask, fwd, bwd, amax = _assert_same_as_chain(w, _previous(previous, rows, cols, gen, w), beta, inv_scale, dtype,
                                                 *forms, count=count)
    validate_transposable_mask(mask, 2, 4)
    s = soft_threshold24(w, mask, beta, out_dtype=dtype) if soft else w.to(dtype) * mask
    q, amax_ref = quantize_fp8_with_scale(s, inv_scale, "e4m3")
    assert torch.equal(amax, amax_ref)
    if forms[0]:
        assert fwd.shape == compressed_shape(rows, cols, E4M3) and torch.equal(_bytes(fwd), _bytes(compress24(q)))
    if forms[1]:
        assert bwd.shape == compressed_shape(cols, rows, E4M3)
        assert torch.equal(_bytes(bwd), _bytes(compress24(q.t().contiguous())))


@pytest.mark.parametrize("kind,w_dtype", [("ties", torch.float32), ("ties", torch.bfloat16), ("range", torch.float32),
                                          ("range", torch.float16), ("non_finite", torch.bfloat16),
                                          ("non_finite", torch.float32)])
def test_adversarial_magnitudes_match_the_chain(kind, w_dtype):
    """Exact ties everywhere, -0.0 and +0.0, subnormals next to the dtype's largest values in one tile, NaN and
    +-Inf (the cast saturates Inf to 448 and keeps NaN): the chain's bytes, STE and S-STE, always one of the 90
    patterns, and with exact scores the reference's own mask."""
    gen = torch.Generator().manual_seed(18)
    w = _adversarial_weight(kind, w_dtype, gen, rows=64, cols=128)
    prev = (torch.rand(64, 128, generator=gen) < 0.5).to(DEVICE)
    for beta in (None, torch.tensor(0.75, device=DEVICE)):
        for inv_scale in (torch.tensor([1.0], device=DEVICE), torch.tensor([2.0 ** -100], device=DEVICE)):
            mask, _, _, _ = _assert_same_as_chain(w, prev, beta, inv_scale)
            validate_transposable_mask(mask, 2, 4)
    if kind == "ties":
        assert torch.equal(mask, solve_patterns(w, 2, 4))


def test_in_place_update_and_version():
    gen = torch.Generator().manual_seed(6)
    w = _weight(64, 128, torch.bfloat16, gen)
    mask = (torch.rand(64, 128, generator=gen) < 0.5).to(DEVICE)
    storage, version = mask.data_ptr(), mask._version
    refresh24_fp8(w, mask, None, _inv_scale(w, None, 1.0))
    assert mask.data_ptr() == storage and mask._version > version  # written in place, and its version says so
    assert torch.equal(mask, transposable_mask24(w, pruned=False)[0])


def test_bad_inputs_are_refused_with_the_reason():
    w = torch.randn(64, 128, device=DEVICE)
    mask = torch.ones(64, 128, dtype=torch.bool, device=DEVICE)
    one = torch.ones(1, device=DEVICE)
    with pytest.raises(ValueError, match="multiples of 64"):
        refresh24_fp8(w[:, :96], mask[:, :96], None, one)
    with pytest.raises(TypeError, match="inv_scale must be a float32 tensor with one element"):
        refresh24_fp8(w, mask, None, 1.0)
    with pytest.raises(TypeError, match="inv_scale must be a float32 tensor with one element"):
        refresh24_fp8(w, mask, None, torch.ones(2, device=DEVICE))
    with pytest.raises(TypeError, match="dtype must be bfloat16 or float16"):
        refresh24_fp8(w, mask, None, one, dtype=torch.float32)
    with pytest.raises(TypeError, match="w must have dtype"):
        refresh24_fp8(w.double(), mask, None, one)
    with pytest.raises(ValueError, match="contiguous"):
        refresh24_fp8(w, torch.ones(128, 64, dtype=torch.bool, device=DEVICE).t(), None, one)
    with pytest.raises(ValueError, match="beta"):
        refresh24_fp8(w, mask, torch.ones(2, device=DEVICE), one)
    assert bool(mask.all()), "a refused call writes nothing"


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16384, 4096), (4096, 16384)])
@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32])
def test_same_as_the_chain_at_the_ffn_sizes_on_gpu(shape, soft, w_dtype):
    """The lab GPT's FFN weights (d_model 4096), a previous mask a training step away, the scale of the mask
    before (as delayed scaling gives it): mask, flips, both E4M3 forms and the amax bit for bit."""
    torch.manual_seed(1)
    w = torch.randn(shape, device="cuda")
    prev = transposable_mask24(w, pruned=False)[0]
    w = (w + 0.02 * torch.randn(shape, device="cuda")).to(w_dtype)
    beta = torch.tensor(0.9, device="cuda") if soft else None
    inv_scale = _inv_scale(w, beta, 1.0)
    mask, _, _, _ = _assert_same_as_chain(w, prev, beta, inv_scale)
    assert 0 < int((mask != prev).sum()) < mask.numel() // 10
