"""Kernel 11 (S(W) and S(W)^T compressed in one pass) against the unfused path it replaces:
``soft_threshold24`` / ``w.to(dtype) * mask`` then ``compress24`` of S and of S.t() (each of those
tested against its own reference), and the decoded result against the plain PyTorch S."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE

from sparsity_lab.references.cusparselt_layout import compressed_shape, decompress24_reference
from sparsity_lab.kernels import compress24, soft_threshold24, transposable_mask24
from sparsity_lab.kernels.prepare24 import prepare24
from sparsity_lab.methods.soft_threshold import soft_threshold


def _bytes(t):
    return t.contiguous().view(torch.uint8).reshape(-1)


def _weight(rows, cols, dtype, gen, exact_in_bf16):
    w = torch.randn(rows, cols, generator=gen)
    if exact_in_bf16:
        # triton's CPU interpreter truncates float32 -> bf16 where the GPU rounds to nearest; weights
        # that bf16 holds exactly make the STE path's one rounding exact on both
        w = w.to(torch.bfloat16).float()
    return w.to(dtype).to(DEVICE)


def _unfused(w, mask, beta, out_dtype):
    s = soft_threshold24(w, mask, beta, out_dtype=out_dtype) if beta is not None else w.to(out_dtype) * mask
    return s, compress24(s), compress24(s.t())


@settings(max_examples=16, deadline=None)
@given(row_tiles=st.integers(1, 3), col_tiles=st.integers(1, 3),
       w_dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       out_dtype=st.sampled_from([torch.bfloat16, torch.float16]), soft=st.booleans(),
       transposed_view=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_same_bytes_as_threshold_then_compress_twice(row_tiles, col_tiles, w_dtype, out_dtype, soft,
                                                      transposed_view, seed):
    gen = torch.Generator().manual_seed(seed)
    rows, cols = 64 * row_tiles, 64 * col_tiles
    w = _weight(rows, cols, w_dtype, gen, exact_in_bf16=DEVICE.type == "cpu")
    if transposed_view:  # W given as the .t() of a contiguous tensor: any strides are read in place
        w = w.t().contiguous().t()
    mask = transposable_mask24(w, pruned=False)[0]
    beta = torch.tensor(0.5 + torch.rand((), generator=gen).item(), device=DEVICE) if soft else None
    s, fwd_ref, bwd_ref = _unfused(w, mask, beta, out_dtype)
    fwd, bwd = prepare24(w, mask, beta, out_dtype=out_dtype)
    assert fwd.shape == compressed_shape(rows, cols, out_dtype) and fwd.dtype == out_dtype
    assert bwd.shape == compressed_shape(cols, rows, out_dtype) and bwd.dtype == out_dtype
    assert torch.equal(_bytes(fwd), _bytes(fwd_ref))
    assert torch.equal(_bytes(bwd), _bytes(bwd_ref))


def test_decoded_forms_are_the_sparse_weight_and_its_transpose():
    """Decoded with the layout's reference: S and S^T of the plain PyTorch soft threshold."""
    gen = torch.Generator().manual_seed(1)
    w = _weight(128, 64, torch.float32, gen, exact_in_bf16=True)
    mask = transposable_mask24(w, pruned=False)[0]
    beta = torch.tensor(1.25, device=DEVICE)
    fwd, bwd = prepare24(w, mask, beta, out_dtype=torch.float16)
    expected = (beta * soft_threshold(w.float(), mask, 2, 4)).half()
    torch.testing.assert_close(decompress24_reference(fwd, 128, 64), expected, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(decompress24_reference(bwd, 64, 128), expected.t(), rtol=1e-3, atol=1e-3)
    fwd_ste, _ = prepare24(w, mask, None, out_dtype=torch.bfloat16, transposed=False)
    assert torch.equal(decompress24_reference(fwd_ste, 128, 64), w.to(torch.bfloat16) * mask)


def test_one_form_alone():
    w = torch.randn(64, 128).to(DEVICE)
    mask = transposable_mask24(w, pruned=False)[0]
    both = prepare24(w, mask, out_dtype=torch.bfloat16)
    only_fwd = prepare24(w, mask, out_dtype=torch.bfloat16, transposed=False)
    only_bwd = prepare24(w, mask, out_dtype=torch.bfloat16, forward=False)
    assert only_fwd[1] is None and only_bwd[0] is None
    assert torch.equal(_bytes(only_fwd[0]), _bytes(both[0])) and torch.equal(_bytes(only_bwd[1]), _bytes(both[1]))


def test_bad_inputs_are_refused_with_the_reason():
    w = torch.randn(64, 128).to(DEVICE)
    mask = transposable_mask24(w, pruned=False)[0]
    with pytest.raises(ValueError, match="multiples of 64"):
        prepare24(w[:, :96], mask[:, :96], out_dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="out_dtype"):
        prepare24(w, mask, out_dtype=torch.float32)
    with pytest.raises(TypeError, match="mask"):
        prepare24(w, mask.float(), out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="shape"):
        prepare24(w, mask[:32], out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="nothing to write"):
        prepare24(w, mask, out_dtype=torch.bfloat16, forward=False, transposed=False)
    with pytest.raises(ValueError, match="beta"):
        prepare24(w, mask, torch.ones(2, device=DEVICE), out_dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16])
def test_same_bytes_at_size_and_as_cslt_compress_on_gpu(soft, w_dtype):
    """At an FFN's size, fp32 master weights included (the GPU rounds as PyTorch does)."""
    w = torch.randn(4096, 16384, device="cuda")
    # torch.randn gives a few exact zeros in 67 M draws; a kept zero leaves its group one non-zero, whose
    # empty slot cuSPARSELt and compress24 encode differently (both decode to the same matrix)
    w = torch.where(w == 0, torch.ones_like(w), w).to(w_dtype)
    mask = transposable_mask24(w, pruned=False)[0]
    beta = torch.tensor(0.9, device="cuda") if soft else None
    s, fwd_ref, bwd_ref = _unfused(w, mask, beta, torch.bfloat16)
    fwd, bwd = prepare24(w, mask, beta, out_dtype=torch.bfloat16)
    assert torch.equal(_bytes(fwd), _bytes(fwd_ref)) and torch.equal(_bytes(bwd), _bytes(bwd_ref))
    if not soft:  # random weights: every group keeps two non-zeros, so cuSPARSELt's own bytes agree
        assert torch.equal(_bytes(bwd), _bytes(torch._cslt_compress(s.t().contiguous())))
