"""Kernel 24 (kernel 21's one-pass mask refresh with CUTLASS's SM90 layout: the transposable mask in place, its
flips, S(W) and S(W)^T compressed, bf16 or E4M3 with its amax) against the chain it replaces, kernel 2 ->
kernel 9 -> the mask copy -> kernel 22 (each tested against its own reference), and against the plain
PyTorch references: ``solve_patterns``, ``mask_flips_tensor``, S (``soft_threshold`` / ``w * m``, the FP8
cast) compressed by ``references/cutlass_layout.compress``. On a Hopper GPU (``pytest -m gpu``) also at the
FFN's shape and against CUTLASS's compressor ``ops.compress`` itself."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE, allocate_dirty
from test_kernels_refresh24 import _adversarial_weight, _previous, _weight

from sparsity_lab.kernels import (count_flips, prepare24_cutlass, prepare24_cutlass_fp8, quantize_fp8_with_scale,
                                  refresh24_cutlass, refresh24_cutlass_fp8, soft_threshold24, transposable_mask24)
from sparsity_lab.masks.patterns import solve_patterns
from sparsity_lab.masks.tiles import validate_transposable_mask
from sparsity_lab.methods.flip_rate import mask_flips_tensor
from sparsity_lab.methods.soft_threshold import soft_threshold
from sparsity_lab.references import cutlass_layout as layout

BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn


def _bytes(t):
    return t.contiguous().view(torch.uint8).reshape(-1)


def _same_forms(got, want):
    assert (got is None) == (want is None)
    if got is not None:
        for a, b in zip(got, want):
            assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bytes(a), _bytes(b))


def _chain(w, previous, beta, inv_scale=None, dtype=BF16, forward=True, transposed=True):
    """(new mask, flips, fwd, bwd, amax) of kernel 2 -> 9 -> copy -> 22, ``previous`` left as it was; kernel 22
    only where a form is asked (it refuses to write nothing)."""
    new = transposable_mask24(w, pruned=False)[0]
    flips = count_flips(previous, new)
    mask = previous.clone()
    mask.copy_(new)
    fwd = bwd = amax = None
    if inv_scale is None and (forward or transposed):
        fwd, bwd = prepare24_cutlass(w, mask, beta, forward=forward, transposed=transposed)
    elif forward or transposed:
        fwd, bwd, amax = prepare24_cutlass_fp8(w, mask, beta, inv_scale, dtype, forward=forward, transposed=transposed)
    return mask, flips, fwd, bwd, amax


def _assert_same_as_chain(w, previous, beta, inv_scale=None, dtype=BF16, forward=True, transposed=True, count=True):
    mask = previous.clone()
    if inv_scale is None:
        flips, fwd, bwd = refresh24_cutlass(w, mask, beta, forward=forward, transposed=transposed, count=count)
        amax = None
    else:
        flips, fwd, bwd, amax = refresh24_cutlass_fp8(w, mask, beta, inv_scale, dtype, forward=forward,
                                                      transposed=transposed, count=count)
    ref_mask, ref_flips, ref_fwd, ref_bwd, ref_amax = _chain(w, previous, beta, inv_scale, dtype, forward, transposed)
    assert torch.equal(mask, ref_mask)
    if count:
        assert flips.dtype == torch.int64 and flips.dim() == 0 and flips.device == w.device
        assert int(flips) == int(ref_flips) == int(mask_flips_tensor(previous, mask))
    else:
        assert flips is None
    _same_forms(fwd, ref_fwd)
    _same_forms(bwd, ref_bwd)
    if ref_amax is not None:
        assert amax.dim() == 0 and amax.dtype == torch.float32 and torch.equal(amax, ref_amax)
    return mask, fwd, bwd, amax


def _assert_form(form, s):
    """A kernel form (values, metadata) is, byte for byte, the layout reference's compression of the dense s."""
    values, meta = layout.compress(s.cpu())
    assert torch.equal(_bytes(form[0]).cpu(), _bytes(values)) and torch.equal(form[1].cpu(), meta)


def _beta(soft, gen):
    return torch.tensor(0.5 + torch.rand((), generator=gen).item(), device=DEVICE) if soft else None


@settings(max_examples=12, deadline=None)
@given(out_units=st.integers(1, 6), in_units=st.integers(1, 6),
       w_dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), soft=st.booleans(),
       transposed_view=st.booleans(), previous=st.sampled_from(["ones", "random", "same", "near"]),
       seed=st.integers(0, 2**31 - 1))
def test_bf16_same_mask_flips_and_bytes_as_the_chain(out_units, in_units, w_dtype, soft, transposed_view, previous,
                                                     seed):
    """Odd sizes: out and in any multiple of 16 (partial 64 x 64 blocks, the metadata padded to 64 x 128)."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = 16 * out_units, 16 * in_units
    w = _weight(rows, cols, w_dtype, gen)
    if transposed_view:  # W given as the .t() of a contiguous tensor: read in place through its strides
        w = w.t().contiguous().t()
    mask, fwd, bwd, _ = _assert_same_as_chain(w, _previous(previous, rows, cols, gen, w), _beta(soft, gen))
    validate_transposable_mask(mask, 2, 4)
    assert fwd[1].numel() == layout.compressed_shape(rows, cols, BF16).metadata_bytes


@settings(max_examples=12, deadline=None)
@given(out_units=st.integers(1, 4), in_units=st.integers(1, 4),
       w_dtype=st.sampled_from([torch.float32, torch.bfloat16]), dtype=st.sampled_from([torch.bfloat16, torch.float16]),
       soft=st.booleans(), magnitude=st.sampled_from([2.0 ** -6, 1.0, 32.0]), scale_factor=st.sampled_from([0.25, 1.0, 4.0]),
       previous=st.sampled_from(["ones", "random", "near"]), seed=st.integers(0, 2**31 - 1))
def test_e4m3_same_mask_flips_bytes_and_amax_as_the_chain(out_units, in_units, w_dtype, dtype, soft, magnitude,
                                                          scale_factor, previous, seed):
    """scale_factor 4 saturates (values clamp to 448), scale_factor 0.25 and magnitude 2^-6 put entries in the
    cast's subnormals; out and in any multiple of 32. Also the plain references: q(S) of the new mask
    compressed, and its amax (powers of two keep W exact in bf16, which the interpreter truncates to)."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = 32 * out_units, 32 * in_units
    w = (_weight(rows, cols, torch.float32, gen) * magnitude).to(w_dtype)
    beta = _beta(soft, gen)
    inv_scale = (448.0 / (w.abs().amax().float() * (beta if soft else 1.0)).clamp_min(1e-12) * scale_factor).reshape(1)
    mask, fwd, bwd, amax = _assert_same_as_chain(w, _previous(previous, rows, cols, gen, w), beta, inv_scale, dtype)
    s = soft_threshold24(w, mask, beta, out_dtype=dtype) if soft else w.to(dtype) * mask
    q, amax_ref = quantize_fp8_with_scale(s, inv_scale, "e4m3")
    _assert_form(fwd, q)
    _assert_form(bwd, q.t().contiguous())
    assert torch.equal(amax, amax_ref)


@pytest.mark.parametrize("kind,w_dtype", [("ties", torch.float32), ("ties", torch.bfloat16), ("range", torch.float32),
                                          ("range", torch.float16), ("non_finite", torch.bfloat16),
                                          ("non_finite", torch.float32)])
def test_adversarial_magnitudes_match_the_chain(kind, w_dtype):
    """Exact ties everywhere, -0.0 and +0.0, subnormals next to the dtype's largest values in one tile, NaN and
    +-Inf: the same bytes (bf16 and E4M3, STE and S-STE), always one of the 90 patterns."""
    gen = torch.Generator().manual_seed(24)
    w = _adversarial_weight(kind, w_dtype, gen, rows=64, cols=96)
    prev = (torch.rand(64, 96, generator=gen) < 0.5).to(DEVICE)
    # "range": q spans E4M3's whole grid, from saturation down to its subnormals and zeros
    inv_scale = torch.tensor([448.0 / float(torch.finfo(w_dtype).max) if kind == "range" else 100.0], device=DEVICE)
    for beta in (None, torch.tensor(0.75, device=DEVICE)):
        mask, _, _, _ = _assert_same_as_chain(w, prev, beta)
        _assert_same_as_chain(w, prev, beta, inv_scale)
        validate_transposable_mask(mask, 2, 4)
    if kind == "ties":  # exact scores: the reference's own mask, lowest pattern index among the maxima
        assert torch.equal(mask, solve_patterns(w, 2, 4))


def test_signed_zeros_ties_and_empty_groups_against_the_references():
    """Against the references alone (no kernel in the expected side): -0.0 weights kept and pruned, rows of
    +0.0 (empty groups: code 0), four equal magnitudes per group (ties for the search and the threshold)."""
    gen = torch.Generator().manual_seed(9)
    w = torch.randint(-4, 5, (80, 144), generator=gen).float()  # small integers: exact scores and S
    w[0::3] = torch.tensor([1.0, -1.0, 1.0, -1.0]).repeat(144 // 4)
    w[1::5, ::2] = -0.0
    w[2::7] = 0.0
    w = w.to(DEVICE)
    prev = (torch.rand(80, 144, generator=gen) < 0.5).to(DEVICE)
    beta = torch.tensor(1.25, device=DEVICE)
    for b, s_of in ((None, lambda m: w.to(BF16) * m), (beta, lambda m: (beta * soft_threshold(w, m, 2, 4)).to(BF16))):
        mask = prev.clone()
        flips, fwd, bwd = refresh24_cutlass(w, mask, b)
        assert torch.equal(mask, solve_patterns(w, 2, 4)) and int(flips) == int((prev != mask).sum())
        s = s_of(mask)
        _assert_form(fwd, s)
        _assert_form(bwd, s.t().contiguous())
        expected = torch.where(s == 0, torch.zeros_like(s), s).cpu()  # -0.0 comes back +0.0
        assert torch.equal(_bytes(layout.decompress(*[t.cpu() for t in fwd], 80, 144)), _bytes(expected))


def test_forms_left_out_count_off_and_shapes_each_form_allows():
    gen = torch.Generator().manual_seed(5)
    w = _weight(96, 64, torch.bfloat16, gen)
    prev = (torch.rand(96, 64, generator=gen) < 0.5).to(DEVICE)
    inv = torch.tensor([50.0], device=DEVICE)
    for inv_scale in (None, inv):
        _assert_same_as_chain(w, prev, None, inv_scale, forward=False)
        _assert_same_as_chain(w, prev, None, inv_scale, transposed=False)
        _assert_same_as_chain(w, prev, None, inv_scale, count=False)
        _assert_same_as_chain(w, prev, None, inv_scale, forward=False, transposed=False)
    mask = prev.clone()
    before = (mask.data_ptr(), mask._version)
    assert refresh24_cutlass(w, mask, count=False, forward=False, transposed=False) == (None, None, None)
    assert mask.data_ptr() == before[0] and mask._version > before[1]  # written in place, its version says so
    assert torch.equal(mask, transposable_mask24(w, pruned=False)[0])
    # the E4M3 amax of the new S comes back when no form is written too
    _, _, _, amax = refresh24_cutlass_fp8(w, prev.clone(), None, inv, forward=False, transposed=False)
    assert torch.equal(amax, (w.to(BF16) * mask).abs().amax().float())
    # S(W) alone needs only in to meet the rule: out = 36 (a multiple of 4) is fine for the forward form
    w36 = _weight(36, 64, torch.float32, gen)
    prev36 = (torch.rand(36, 64, generator=gen) < 0.5).to(DEVICE)
    _assert_same_as_chain(w36, prev36, None, transposed=False)
    _assert_same_as_chain(w36, prev36, None, forward=False, transposed=False)
    with pytest.raises(ValueError, match=r"S\(W\)\^T \(in, out\): k = out.*multiple of 16"):
        refresh24_cutlass(w36, prev36.clone())


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "e4m3"])
def test_every_output_byte_is_written_and_nothing_outside_the_mask(fp8, monkeypatch):
    """The outputs are allocated uncleared (here: filled with 0xA5 first), so every byte, the metadata's padding
    included, must come from the kernel; the mask is written in place inside its own bytes only."""
    gen = torch.Generator().manual_seed(2)
    rows, cols = (96, 160) if fp8 else (80, 48)  # partial blocks; metadata padded to 128 both ways
    w = _weight(rows, cols, torch.float32, gen)
    # the mask inside a larger buffer: the bytes after it must stay as they were
    buffer = (torch.rand(rows * cols + 64, generator=gen) < 0.5).to(DEVICE)
    prev, after = buffer[:rows * cols].view(rows, cols), buffer[rows * cols:].clone()
    inv_scale = torch.tensor([30.0], device=DEVICE) if fp8 else None
    ref_mask, ref_flips, ref_fwd, ref_bwd, _ = _chain(w, prev, None, inv_scale)
    allocate_dirty(monkeypatch)
    if fp8:
        flips, fwd, bwd, _ = refresh24_cutlass_fp8(w, prev, None, inv_scale)
    else:
        flips, fwd, bwd = refresh24_cutlass(w, prev)
    monkeypatch.undo()
    assert torch.equal(prev, ref_mask) and int(flips) == int(ref_flips)
    assert torch.equal(buffer[rows * cols:], after)
    _same_forms(fwd, ref_fwd)
    _same_forms(bwd, ref_bwd)


def _bad_calls():
    """(call, error, what the message says) for input each wrapper refuses; every call targets a fresh all-True
    mask, which a refused call must leave alone."""
    w = torch.randn(64, 128, device=DEVICE)
    inv = torch.tensor([1.0], device=DEVICE)
    w66 = torch.randn(66, 64, device=DEVICE)
    shifted = torch.ones(64 * 128 + 2, dtype=torch.bool, device=DEVICE)[2:].view(64, 128)  # contiguous, offset 2
    bf16, fp8 = refresh24_cutlass, refresh24_cutlass_fp8
    return [
        (lambda m: bf16(w66, torch.ones(66, 64, dtype=torch.bool, device=DEVICE), forward=False, transposed=False),
         ValueError, "multiples of 4"),
        (lambda m: bf16(w[:, :120], m[:, :120].contiguous()), ValueError, r"S\(W\) \(out, in\): k = in.*multiple of 16"),
        (lambda m: fp8(w[:, :112], m[:, :112].contiguous(), None, inv), ValueError, r"k = in.*multiple of 32"),
        (lambda m: bf16(w.reshape(-1), m.reshape(-1)), ValueError, "2-D"),
        (lambda m: bf16(w.double(), m), TypeError, "w must have dtype"),
        (lambda m: bf16(w, m.float()), TypeError, "mask"),
        (lambda m: bf16(w, m[:32]), ValueError, "shape"),
        (lambda m: bf16(w, m.t().contiguous().t()), ValueError, "contiguous"),
        (lambda m: bf16(w, shifted), ValueError, "4-byte boundary"),
        (lambda m: bf16(w, m, torch.ones(2, device=DEVICE)), ValueError, "beta"),
        (lambda m: fp8(w, m, None, 1.0), TypeError, "inv_scale"),
        (lambda m: fp8(w, m, None, inv.double()), TypeError, "inv_scale"),
        (lambda m: fp8(w, m, None, inv, dtype=torch.float32), TypeError, "dtype"),
    ]


def test_bad_inputs_are_refused_with_the_reason():
    for call, error, message in _bad_calls():
        mask = torch.ones(64, 128, dtype=torch.bool, device=DEVICE)
        with pytest.raises(error, match=message):
            call(mask)
        assert bool(mask.all()), f"a refused call ({message}) wrote into the mask"


# --- GPU: the FFN's shape, odd shapes, and CUTLASS's own compressor ------------------------------------------
def _is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


hopper = pytest.mark.skipif(not _is_hopper(), reason="needs a Hopper GPU (sm_90) and the CUTLASS backend")


def _step_apart(rows, cols, w_dtype, gen):
    """W a step of training after the previous mask (about 1 % of the mask flips), with -0.0, +0.0 rows and
    ties of magnitude in some groups."""
    w = torch.randn(rows, cols, device="cuda", generator=gen)
    prev = transposable_mask24(w, pruned=False)[0]
    w = w + 0.02 * torch.randn(rows, cols, device="cuda", generator=gen)
    w[::7, ::3] = -0.0
    w[1::7] = 0.0
    w[2::7, :] = torch.tensor([2.0, -2.0, 2.0, -2.0], device="cuda").repeat(cols // 4)
    return w.to(w_dtype), prev


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "e4m3"])
@pytest.mark.parametrize("soft", [False, True], ids=["ste", "sste"])
@pytest.mark.parametrize("shape,w_dtype", [((16384, 4096), torch.float32), ((4096, 16384), torch.bfloat16),
                                           ((1056, 544), torch.float32), ((224, 352), torch.bfloat16)])
def test_gpu_same_as_the_chain(shape, w_dtype, soft, fp8):
    """The lab GPT's FFN weights (d_model 4096) and odd shapes: mask, flip count, both forms (and E4M3's amax)
    bit for bit against kernels 2, 9, the copy and 22 on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(sum(shape) + soft)
    w, prev = _step_apart(*shape, w_dtype, gen)
    beta = torch.tensor(0.9, device="cuda") if soft else None
    inv_scale = torch.tensor([448.0 / 3.0], device="cuda") if fp8 else None  # saturates the largest entries
    mask, _, _, _ = _assert_same_as_chain(w, prev, beta, inv_scale)
    assert int((mask != prev).sum()) > 0
    validate_transposable_mask(mask, 2, 4)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("rows,cols,soft,fp8", [(r, c, soft, fp8) for r, c in ((4096, 16384), (224, 352), (1056, 1088))
                                                for soft in (False, True) for fp8 in (False, True)])
def test_gpu_bytes_equal_cutlass_compressor(rows, cols, soft, fp8):
    """Kernel 24's forms are ``ops.compress``'s for the same S (q(S) for E4M3) of the new mask and its transpose."""
    from sparsity_lab.backends.cutlass import ops

    gen = torch.Generator(device="cuda").manual_seed(rows * 3 + cols)
    w, prev = _step_apart(rows, cols, torch.float32, gen)
    beta = torch.tensor(0.9, device="cuda") if soft else None
    mask = prev.clone()
    s_of = (lambda m: soft_threshold24(w, m, beta, out_dtype=BF16)) if soft else (lambda m: w.to(BF16) * m)
    if fp8:
        inv_scale = torch.tensor([448.0 / 3.0], device="cuda")
        _, fwd, bwd, amax = refresh24_cutlass_fp8(w, mask, beta, inv_scale)
        s, amax_ref = quantize_fp8_with_scale(s_of(mask), inv_scale)
        assert torch.equal(amax, amax_ref)
    else:
        _, fwd, bwd = refresh24_cutlass(w, mask, beta)
        s = s_of(mask)
    for (values, meta), dense in ((fwd, s), (bwd, s.t().contiguous())):
        theirs = ops.compress(dense)
        assert torch.equal(_bytes(values), _bytes(theirs.values)) and torch.equal(meta, theirs.metadata)
