"""Kernel 22 (S(W) and S(W)^T compressed in one pass into CUTLASS's SM90 layout, bf16 and E4M3) against the
unfused path it replaces: S (``soft_threshold24`` / ``w.to(dtype) * mask``, tested against its own
reference), for E4M3 ``quantize_fp8_with_scale`` of S, then the layout's reference
(``references/cutlass_layout.compress``, itself checked against the bytes of CUTLASS's compressor) of S and
of S.t(). On a Hopper GPU (``pytest -m gpu``) also against ``ops.compress`` itself and through the products."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE, allocate_dirty

from sparsity_lab.kernels import quantize_fp8_with_scale, soft_threshold24, transposable_mask24
from sparsity_lab.kernels.prepare24_cutlass import prepare24_cutlass, prepare24_cutlass_amax, prepare24_cutlass_fp8
from sparsity_lab.references import cutlass_layout as layout
from sparsity_lab.references.fp8 import quantize_with_inv_scale

BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn


def _bytes(t):
    return t.contiguous().view(torch.uint8).reshape(-1)


def _weight(rows, cols, dtype, gen, magnitude=1.0):
    w = torch.randn(rows, cols, generator=gen) * magnitude
    # triton's CPU interpreter truncates float32 -> bf16 where the GPU rounds to nearest: on the CPU weights
    # that bf16 holds exactly keep the STE path's one rounding exact
    if DEVICE.type == "cpu":
        w = w.to(torch.bfloat16).float()
    return w.to(dtype).to(DEVICE)


def _sparse(w, mask, beta, dtype):
    return soft_threshold24(w, mask, beta, out_dtype=dtype) if beta is not None else w.to(dtype) * mask


def _assert_form(form, s):
    """A kernel form (values, metadata) is, byte for byte, the reference's compression of the dense s."""
    values, meta = layout.compress(s.cpu())
    assert form[0].dtype == s.dtype and tuple(form[0].shape) == tuple(values.shape)
    assert torch.equal(_bytes(form[0]).cpu(), _bytes(values)), "values differ"
    assert torch.equal(form[1].cpu(), meta), "metadata differs"


def _beta(soft, gen):
    return torch.tensor(0.5 + torch.rand((), generator=gen).item(), device=DEVICE) if soft else None


@settings(max_examples=16, deadline=None)
@given(out_units=st.integers(1, 9), in_units=st.integers(1, 9),
       w_dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), soft=st.booleans(),
       transposed_view=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_bf16_same_bytes_as_threshold_then_reference_compress_twice(out_units, in_units, w_dtype, soft,
                                                                    transposed_view, seed):
    """Odd sizes: out and in any multiple of 16 (partial 64-row tiles, metadata padded to 64 x 128)."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = 16 * out_units, 16 * in_units
    w = _weight(rows, cols, w_dtype, gen)
    if transposed_view:  # W given as the .t() of a contiguous tensor: any strides are read in place
        w = w.t().contiguous().t()
    mask = transposable_mask24(w, pruned=False)[0]
    beta = _beta(soft, gen)
    s = _sparse(w, mask, beta, BF16)
    fwd, bwd = prepare24_cutlass(w, mask, beta)
    _assert_form(fwd, s)
    _assert_form(bwd, s.t().contiguous())
    assert fwd[1].numel() == layout.compressed_shape(rows, cols, BF16).metadata_bytes


@settings(max_examples=16, deadline=None)
@given(out_units=st.integers(1, 5), in_units=st.integers(1, 5),
       w_dtype=st.sampled_from([torch.float32, torch.bfloat16]), dtype=st.sampled_from([torch.bfloat16, torch.float16]),
       soft=st.booleans(), magnitude=st.sampled_from([1e-3, 1.0, 30.0]), scale_factor=st.sampled_from([0.25, 1.0, 4.0]),
       seed=st.integers(0, 2**31 - 1))
def test_e4m3_same_bytes_and_amax_as_threshold_cast_then_reference_compress(out_units, in_units, w_dtype, dtype, soft,
                                                                            magnitude, scale_factor, seed):
    """scale_factor 4 saturates (values clamp to 448), magnitude 1e-3 puts entries in the cast's subnormals
    (some round to zero: groups with fewer than two non-zeros); out and in any multiple of 32."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = 32 * out_units, 32 * in_units
    w = _weight(rows, cols, w_dtype, gen, magnitude)
    mask = transposable_mask24(w, pruned=False)[0]
    beta = _beta(soft, gen)
    s = _sparse(w, mask, beta, dtype)
    inv_scale = (448.0 / s.abs().amax().float().clamp_min(1e-12) * scale_factor).reshape(1)
    q, amax_ref = quantize_fp8_with_scale(s, inv_scale, "e4m3")
    fwd, bwd, amax = prepare24_cutlass_fp8(w, mask, beta, inv_scale, dtype=dtype)
    _assert_form(fwd, q)
    _assert_form(bwd, q.t().contiguous())
    assert amax.dim() == 0 and amax.dtype == torch.float32 and torch.equal(amax, amax_ref)
    assert torch.equal(prepare24_cutlass_amax(w, mask, beta, dtype=dtype), amax_ref)


@pytest.mark.parametrize("soft", [False, True])
def test_ties_signed_zeros_and_extreme_magnitudes(soft):
    """Ties in |w| inside groups (S-STE's threshold then zeroes a kept entry: groups with one or no non-zero),
    -0.0 weights (kept and pruned), and magnitudes up to 2^120 and down to bf16's subnormals in float32 W (on
    the CPU down to 2^-100 only: triton's interpreter converts float32 subnormals to wrong bf16 bits)."""
    gen = torch.Generator().manual_seed(7)
    rows, cols = 80, 144
    w = _weight(rows, cols, torch.float32, gen)
    w[0::3] = torch.tensor([1.0, -1.0, 1.0, -1.0]).repeat(cols // 4)  # four equal magnitudes per group
    w[1::5, ::2] = -0.0
    w[2::7] = 0.0  # whole rows of +0.0: empty groups
    w[3::11] *= 2.0 ** 120
    w[4::11] *= 2.0 ** (-120 if DEVICE.type == "cuda" else -100)
    w = w.to(DEVICE)
    mask = transposable_mask24(w, pruned=False)[0]
    beta = torch.tensor(1.0, device=DEVICE) if soft else None
    s = _sparse(w, mask, beta, BF16)
    _, _, counts = layout.kept_columns(s.cpu())
    assert int((counts < 2).sum()) > 0
    fwd, bwd = prepare24_cutlass(w, mask, beta)
    _assert_form(fwd, s)
    _assert_form(bwd, s.t().contiguous())


def test_values_that_are_not_finite_give_nan_bytes_as_the_unfused_cast():
    """E4M3: an infinite or NaN kept entry gives the byte 0x7F (``references.fp8``'s policy), kernel 18's."""
    gen = torch.Generator().manual_seed(5)
    w = _weight(64, 96, torch.float32, gen)
    mask = transposable_mask24(w, pruned=False)[0]
    for (r, c), bad in zip(mask.nonzero()[:3].tolist(), (float("inf"), -float("inf"), float("nan"))):
        w[r, c] = bad
    inv_scale = torch.tensor([10.0], device=DEVICE)
    q, _ = quantize_fp8_with_scale(w.to(BF16) * mask, inv_scale)
    fwd, bwd, _ = prepare24_cutlass_fp8(w, mask, None, inv_scale)
    _assert_form(fwd, q)
    _assert_form(bwd, q.t().contiguous())


def test_decoded_forms_are_the_sparse_weight_and_its_transpose():
    """Decoded with the layout's reference: S and S^T of the plain PyTorch expression, q(S) for E4M3."""
    from sparsity_lab.methods.soft_threshold import soft_threshold

    gen = torch.Generator().manual_seed(1)
    w = _weight(96, 64, torch.float32, gen)
    mask = transposable_mask24(w, pruned=False)[0]
    fwd, bwd = prepare24_cutlass(w, mask, None)
    expected = (w.to(BF16) * mask).cpu()
    expected = torch.where(expected == 0, torch.zeros_like(expected), expected)  # -0.0 comes back +0.0
    assert torch.equal(_bytes(layout.decompress(*[t.cpu() for t in fwd], 96, 64)), _bytes(expected))
    assert torch.equal(_bytes(layout.decompress(*[t.cpu() for t in bwd], 64, 96)), _bytes(expected.t().contiguous()))
    beta = torch.tensor(1.25, device=DEVICE)
    fwd, _ = prepare24_cutlass(w, mask, beta, transposed=False)
    torch.testing.assert_close(layout.decompress(*[t.cpu() for t in fwd], 96, 64).float(),
                               (beta * soft_threshold(w.float(), mask, 2, 4)).cpu(), rtol=2 ** -7, atol=0)
    inv_scale = torch.tensor([448.0 / 3.0], device=DEVICE)
    fwd, _, _ = prepare24_cutlass_fp8(w, mask, None, inv_scale, transposed=False)
    q = quantize_with_inv_scale(w.to(BF16) * mask, inv_scale.reshape(()), "e4m3").float().cpu()
    assert torch.equal(layout.decompress(*[t.cpu() for t in fwd], 96, 64).float(), q)


def test_every_output_byte_is_written(monkeypatch):
    """The outputs are allocated uncleared (here: filled with 0xA5 first), so every byte, the metadata's
    padding included, must come from the kernel."""
    gen = torch.Generator().manual_seed(2)
    w = _weight(80, 48, torch.float32, gen)  # 80 rows: 64 + 16, 48 columns: metadata padded to 128 (and 80 to 128)
    mask = transposable_mask24(w, pruned=False)[0]
    s = w.to(BF16) * mask
    allocate_dirty(monkeypatch)
    fwd, bwd = prepare24_cutlass(w, mask, None)
    monkeypatch.undo()
    _assert_form(fwd, s)
    _assert_form(bwd, s.t().contiguous())


def test_one_form_alone_and_shapes_each_form_allows():
    gen = torch.Generator().manual_seed(4)
    w = _weight(64, 128, torch.float32, gen)
    mask = transposable_mask24(w, pruned=False)[0]
    both = prepare24_cutlass(w, mask)
    only_fwd = prepare24_cutlass(w, mask, transposed=False)
    only_bwd = prepare24_cutlass(w, mask, forward=False)
    assert only_fwd[1] is None and only_bwd[0] is None
    assert all(torch.equal(_bytes(a), _bytes(b)) for a, b in zip(only_fwd[0], both[0]))
    assert all(torch.equal(_bytes(a), _bytes(b)) for a, b in zip(only_bwd[1], both[1]))
    # S(W) alone needs only in to meet the rule: out = 36 is fine for the forward form
    w36 = _weight(36, 64, torch.float32, gen)
    mask36 = torch.zeros(36, 64, dtype=torch.bool, device=DEVICE)
    mask36[:, 0::4] = mask36[:, 3::4] = True
    _assert_form(prepare24_cutlass(w36, mask36, transposed=False)[0], w36.to(BF16) * mask36)
    with pytest.raises(ValueError, match=r"S\(W\)\^T \(in, out\): k = out.*multiple of 16"):
        prepare24_cutlass(w36, mask36)


def test_bad_inputs_are_refused_with_the_reason():
    w = torch.randn(64, 128, device=DEVICE)
    mask = transposable_mask24(w, pruned=False)[0]
    inv = torch.tensor(1.0, device=DEVICE)
    with pytest.raises(TypeError, match="out_dtype must be torch.bfloat16"):
        prepare24_cutlass(w, mask, out_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"S\(W\) \(out, in\): k = in.*multiple of 16"):
        prepare24_cutlass(w[:, :120], mask[:, :120].contiguous())
    with pytest.raises(ValueError, match=r"k = in.*multiple of 32"):
        prepare24_cutlass_fp8(w[:, :112], mask[:, :112].contiguous(), None, inv)
    with pytest.raises(ValueError, match="shape"):
        prepare24_cutlass(w, mask[:32])
    with pytest.raises(TypeError, match="mask"):
        prepare24_cutlass(w, mask.float())
    with pytest.raises(ValueError, match="nothing to write"):
        prepare24_cutlass(w, mask, forward=False, transposed=False)
    with pytest.raises(ValueError, match="beta"):
        prepare24_cutlass(w, mask, torch.ones(2, device=DEVICE))
    with pytest.raises(TypeError, match="inv_scale"):
        prepare24_cutlass_fp8(w, mask, None, 1.0)
    with pytest.raises(TypeError, match="inv_scale"):
        prepare24_cutlass_fp8(w, mask, None, inv.double())
    with pytest.raises(TypeError, match="dtype"):
        prepare24_cutlass_fp8(w, mask, None, inv, dtype=torch.float32)


# --- GPU: against CUTLASS's own compressor and through its products ------------------------------------------
def _is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


hopper = pytest.mark.skipif(not _is_hopper(), reason="needs a Hopper GPU (sm_90) and the CUTLASS backend")


def _gpu_weight(rows, cols, gen):
    """Random W with -0.0 and +0.0 entries (kept and pruned) and ties of magnitude in some groups."""
    w = torch.randn(rows, cols, device="cuda", generator=gen)
    w[::7, ::3] = -0.0
    w[1::7] = 0.0
    w[2::7, :] = torch.tensor([2.0, -2.0, 2.0, -2.0], device="cuda").repeat(cols // 4)
    return w


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("rows,cols", [(4096, 16384), (208, 336), (64, 64), (1040, 1056)])
def test_gpu_bf16_bytes_equal_cutlass_compressor(soft, rows, cols):
    """Kernel 22's bytes are ``ops.compress``'s for the same S and S^T (the compressor reads the dense S)."""
    from sparsity_lab.backends.cutlass import ops

    gen = torch.Generator(device="cuda").manual_seed(rows + cols)
    w = _gpu_weight(rows, cols, gen)
    mask = transposable_mask24(w, pruned=False)[0]
    beta = torch.tensor(0.9, device="cuda") if soft else None
    s = _sparse(w, mask, beta, BF16)
    if not soft:  # -0.0 reaches the compressor (pruned negatives; the soft-thresholded S holds none on the H200)
        assert bool(torch.signbit(s[s == 0]).any())
    fwd, bwd = prepare24_cutlass(w, mask, beta)
    for (values, meta), dense in ((fwd, s), (bwd, s.t().contiguous())):
        theirs = ops.compress(dense)
        assert torch.equal(_bytes(values), _bytes(theirs.values)) and torch.equal(meta, theirs.metadata)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("rows,cols", [(4096, 16384), (224, 352), (1056, 1088)])
def test_gpu_e4m3_bytes_equal_cutlass_compressor(soft, rows, cols):
    from sparsity_lab.backends.cutlass import ops

    gen = torch.Generator(device="cuda").manual_seed(rows * 3 + cols)
    w = _gpu_weight(rows, cols, gen)
    mask = transposable_mask24(w, pruned=False)[0]
    beta = torch.tensor(0.9, device="cuda") if soft else None
    inv_scale = torch.tensor([448.0 / 3.0], device="cuda")  # saturates the largest entries
    q, amax_ref = quantize_fp8_with_scale(_sparse(w, mask, beta, BF16), inv_scale)
    fwd, bwd, amax = prepare24_cutlass_fp8(w, mask, beta, inv_scale)
    assert torch.equal(amax, amax_ref)
    for (values, meta), dense in ((fwd, q), (bwd, q.t().contiguous())):
        theirs = ops.compress(dense)
        assert torch.equal(_bytes(values), _bytes(theirs.values)) and torch.equal(meta, theirs.metadata)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [BF16, E4M3], ids=["bf16", "e4m3"])
@pytest.mark.parametrize("rows,cols", [(1024, 1024), (192, 320), (200, 448)])
def test_gpu_reference_layout_equals_cutlass_compressor_on_fresh_inputs(dtype, rows, cols):
    """The reference against the compressor beyond the recorded dump: fresh 2:4 matrices with -0.0, short and
    empty groups, odd shapes (rows not a multiple of 64, columns not of 128)."""
    from sparsity_lab.backends.cutlass import ops
    from sparsity_lab.masks import nm_mask

    gen = torch.Generator(device="cuda").manual_seed(rows * 5 + cols)
    a = torch.randn(rows, cols, device="cuda", generator=gen)
    a = a * nm_mask(a, 2, 4)  # pruned negatives are -0.0
    a[torch.rand(rows, cols, device="cuda", generator=gen) < 0.2] = -0.0
    a = a.to(dtype)
    theirs = ops.compress(a)
    values, meta = layout.compress(a.cpu())
    assert torch.equal(_bytes(theirs.values).cpu(), _bytes(values)) and torch.equal(theirs.metadata.cpu(), meta)
