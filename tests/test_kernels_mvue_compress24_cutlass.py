"""Kernel 23 (MVUE 2:4 of dZ along the tokens, written in CUTLASS's SM90 layout; bf16, and E4M3 with its amax)
against the unfused path it replaces: ``mvue24(dz_padded, dim=0)`` (kernel 4, tested against its reference),
for E4M3 ``quantize_fp8_with_scale`` of it, then the layout's reference (``references/cutlass_layout.compress``,
itself checked against the bytes of CUTLASS's compressor) of its transpose. On a Hopper GPU (``pytest -m gpu``)
also against ``ops.compress`` itself."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from _adversarial import adversarial, examples
from _kernel_testing import DEVICE, allocate_dirty

from sparsity_lab.kernels import mvue24, quantize_fp8_with_scale
from sparsity_lab.kernels.mvue_compress24_cutlass import (mvue_compress24_cutlass, mvue_compress24_cutlass_amax,
                                                          mvue_compress24_cutlass_fp8)
from sparsity_lab.references import cutlass_layout as layout

BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn


def _bytes(t):
    return t.contiguous().view(torch.uint8).reshape(-1)


def _drawn(dz, seed, tokens):
    """The unfused draw: mvue24 of dz with zero rows up to ``tokens`` (the weight gradient's padding)."""
    return mvue24(F.pad(dz, (0, 0, 0, tokens - dz.shape[0])), dim=0, seed=seed)


def _assert_form(form, a):
    """A kernel form (values, metadata) is, byte for byte, the reference's compression of the dense a (m, k)."""
    values, meta = layout.compress(a.cpu())
    assert form[0].dtype == a.dtype and tuple(form[0].shape) == tuple(values.shape)
    assert torch.equal(_bytes(form[0]).cpu(), _bytes(values)), "values differ"
    assert torch.equal(form[1].cpu(), meta), "metadata differs"


def _dz(tokens, out_f, gen, dtype=BF16, zeros=False, magnitude=1.0):
    dz = torch.randn(tokens, out_f, generator=gen) * magnitude
    if zeros:  # groups with fewer than two non-zeros, and exact zeros (+0.0 and -0.0) among the kept
        dz = torch.where(torch.rand(dz.shape, generator=gen) < 0.4, torch.zeros(()), dz)
        dz[::3, ::5] = -0.0
    return dz.to(dtype).to(DEVICE)


@examples(8)
@given(tokens=st.integers(1, 140), out_f=st.integers(2, 100), extra=st.sampled_from([0, 0, 16, 144]),
       zeros=st.booleans(), block_groups=st.sampled_from([None, 16, 32]), seed=st.integers(0, 2**31 - 1))
def test_bf16_same_bytes_as_mvue_then_reference_compress(tokens, out_f, extra, zeros, block_groups, seed):
    """Odd sizes: any token count (padded to a multiple of 16, or further by ``tokens``), any out (partial
    64-row tiles), the metadata padded to 64 rows x 128 tokens."""
    gen = torch.Generator().manual_seed(seed)
    dz = _dz(tokens, out_f, gen, zeros=zeros)
    k = -(-tokens // 16) * 16 + extra
    form = mvue_compress24_cutlass(dz, seed=seed, tokens=k if extra else None, block_groups=block_groups)
    _assert_form(form, _drawn(dz, seed, k).t())
    assert form[1].numel() == layout.compressed_shape(out_f, k, BF16).metadata_bytes


@examples(6)
@given(tokens=st.integers(1, 130), out_f=st.integers(2, 80), dtype=st.sampled_from([torch.bfloat16, torch.float16]),
       zeros=st.booleans(), magnitude=st.sampled_from([1e-4, 1.0, 1e3]), scale_factor=st.sampled_from([0.1, 1.0, 8.0]),
       seed=st.integers(0, 2**31 - 1))
def test_e4m3_same_bytes_and_amax_as_mvue_cast_then_reference_compress(tokens, out_f, dtype, zeros, magnitude,
                                                                       scale_factor, seed):
    """scale_factor 8 saturates the larger MVUE values (dZ / p, up to twice |dZ| and more); magnitude 1e-4 puts
    values in the cast's subnormals (some kept values flush to zero: groups with fewer than two non-zeros)."""
    gen = torch.Generator().manual_seed(seed)
    dz = _dz(tokens, out_f, gen, dtype, zeros, magnitude)
    inv_scale = (448.0 / dz.abs().amax().float().clamp_min(1e-12) * scale_factor).reshape(1)
    k = -(-tokens // 32) * 32
    q, amax_ref = quantize_fp8_with_scale(_drawn(dz, seed, k), inv_scale)
    values, meta, amax = mvue_compress24_cutlass_fp8(dz, seed, inv_scale)
    _assert_form((values, meta), q.t())
    assert amax.dim() == 0 and amax.dtype == torch.float32 and torch.equal(amax, amax_ref)
    assert torch.equal(mvue_compress24_cutlass_amax(dz, seed), amax_ref)


@examples(5)
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_adversarial_magnitudes_ties_and_signed_zeros(data, seed):
    """Exact ties, subnormals, values near bf16's largest (MVUE's x / p may overflow to inf, as mvue24's does),
    zeros of both signs; the same bytes as the unfused path, bf16 and E4M3."""
    dz = data.draw(adversarial((48, 24), BF16)).to(BF16)
    dz[data.draw(st.integers(0, 47))] = -0.0
    dz = dz.to(DEVICE)
    _assert_form(mvue_compress24_cutlass(dz, seed=seed), _drawn(dz, seed, 48).t())
    inv_scale = torch.tensor([data.draw(st.sampled_from([1e-30, 1.0, 1e30]))], dtype=torch.float32, device=DEVICE)
    q, amax_ref = quantize_fp8_with_scale(_drawn(dz, seed, 64), inv_scale)
    values, meta, amax = mvue_compress24_cutlass_fp8(dz, seed, inv_scale)
    _assert_form((values, meta), q.t())
    assert torch.equal(amax, amax_ref)


def test_subnormal_gradients_same_bytes_as_the_unfused_path():
    """dZ of bf16 subnormals, bf16 and E4M3: where subnormals flush (Triton's interpreter), a picked value can round
    to a signed zero; the store takes its flags from the values (hypothesis once found this case)."""
    gen = torch.Generator().manual_seed(5)
    sign = torch.where(torch.rand(48, 24, generator=gen) < 0.5, -1.0, 1.0)
    dz = (sign * 1.653e-39).to(BF16)
    dz[torch.rand(48, 24, generator=gen) < 0.1] = -0.0
    dz[0, 0] = -1.6563e-31
    dz = dz.to(DEVICE)
    for seed in (0, 46385):
        _assert_form(mvue_compress24_cutlass(dz, seed=seed), _drawn(dz, seed, 48).t())
        inv_scale = torch.tensor([1e30], dtype=torch.float32, device=DEVICE)
        q, amax_ref = quantize_fp8_with_scale(_drawn(dz, seed, 64), inv_scale)
        values, meta, amax = mvue_compress24_cutlass_fp8(dz, seed, inv_scale)
        _assert_form((values, meta), q.t())
        assert torch.equal(amax, amax_ref)


def test_ties_signed_zeros_and_empty_groups():
    """Four equal magnitudes per group (every entry p = 1/2), groups of -0.0 only, of one non-zero (kept as it is)
    and of +0.0 only (code 0, both slots +0.0)."""
    gen = torch.Generator().manual_seed(3)
    dz = torch.randn(96, 72, generator=gen)
    dz[0:8] = torch.tensor([1.0, -1.0]).repeat(36)  # ties along the tokens: groups of 4 equal magnitudes
    dz[8:12] = -0.0
    dz[12:16] = 0.0
    dz[16:20, ::2] = 0.0
    dz[17, ::2] = -3.0  # one non-zero
    dz[20:24] *= 2.0 ** 100
    dz[24:28] *= 2.0 ** -120
    dz = dz.to(BF16).to(DEVICE)
    drawn = _drawn(dz, 11, 96)
    _, _, counts = layout.kept_columns(drawn.t().cpu())
    assert int((counts == 0).sum()) > 0 and int((counts == 1).sum()) > 0
    _assert_form(mvue_compress24_cutlass(dz, seed=11), drawn.t())
    # MVUE never writes a -0.0 (an unpicked entry is +0.0), the E4M3 cast does: small negatives flush to 0x80
    inv_scale = torch.tensor([2.0 ** -8], device=DEVICE)
    q, _ = quantize_fp8_with_scale(drawn, inv_scale)
    assert bool((q.view(torch.uint8) == 0x80).any())
    values, meta, _ = mvue_compress24_cutlass_fp8(dz, 11, inv_scale)
    _assert_form((values, meta), q.t())


def test_it_stands_for_the_mvue_draw_seed_tensor_and_seeds():
    """Decoded, the operand is MVUE(dZ)^T (with -0.0 as +0.0); a seed tensor draws as its int; seeds differ."""
    gen = torch.Generator().manual_seed(1)
    dz = _dz(100, 70, gen)
    form = mvue_compress24_cutlass(dz, seed=5)
    dense = layout.decompress(*[t.cpu() for t in form], 70, 112)  # (out, tokens padded to 112)
    expected = _drawn(dz, 5, 112).t().cpu()
    expected = torch.where(expected == 0, torch.zeros_like(expected), expected)
    assert torch.equal(_bytes(dense), _bytes(expected.contiguous()))
    by_tensor = mvue_compress24_cutlass(dz, seed=torch.tensor(5, device=DEVICE))
    assert all(torch.equal(_bytes(a), _bytes(b)) for a, b in zip(form, by_tensor))
    assert not torch.equal(_bytes(mvue_compress24_cutlass(dz, seed=6)[0]), _bytes(form[0]))


def test_every_output_byte_is_written(monkeypatch):
    """The outputs are allocated uncleared (here: filled with 0xA5 first), so every byte, the metadata's
    padding included, must come from the kernel."""
    gen = torch.Generator().manual_seed(2)
    dz = _dz(40, 80, gen)  # out 80: rows padded to 128; 48 tokens: columns padded to 128
    inv_scale = torch.tensor([30.0], device=DEVICE)
    allocate_dirty(monkeypatch)
    form = mvue_compress24_cutlass(dz, seed=9, tokens=48)
    values, meta, _ = mvue_compress24_cutlass_fp8(dz, 9, inv_scale)
    monkeypatch.undo()
    _assert_form(form, _drawn(dz, 9, 48).t())
    _assert_form((values, meta), quantize_fp8_with_scale(_drawn(dz, 9, 64), inv_scale)[0].t())


def test_bad_inputs_are_refused_with_the_reason():
    dz = torch.randn(64, 64).to(BF16).to(DEVICE)
    inv = torch.tensor([1.0], device=DEVICE)
    with pytest.raises(TypeError, match="dz must have dtype in"):
        mvue_compress24_cutlass(dz.half())
    with pytest.raises(TypeError, match="dz must have dtype in"):
        mvue_compress24_cutlass_fp8(dz.float(), 0, inv)
    with pytest.raises(ValueError, match="2-D"):
        mvue_compress24_cutlass(dz.reshape(4, 16, 64))
    with pytest.raises(ValueError, match="out must be at least 2"):
        mvue_compress24_cutlass(dz[:, :1].contiguous())
    with pytest.raises(ValueError, match="contiguous"):
        mvue_compress24_cutlass(dz.t())
    with pytest.raises(ValueError, match="tokens must be an int >= dz's 64 rows and a multiple of 16"):
        mvue_compress24_cutlass(dz, tokens=72)
    with pytest.raises(ValueError, match="tokens must be an int >= dz's 64 rows"):
        mvue_compress24_cutlass(dz, tokens=48)
    with pytest.raises(ValueError, match="multiple of 32"):
        mvue_compress24_cutlass_fp8(dz, 0, inv, tokens=80)
    with pytest.raises(ValueError, match="seed"):
        mvue_compress24_cutlass(dz, seed=-1)
    with pytest.raises(ValueError, match="block_groups must be one of"):
        mvue_compress24_cutlass(dz, block_groups=8)
    with pytest.raises(TypeError, match="inv_scale"):
        mvue_compress24_cutlass_fp8(dz, 0, 1.0)
    with pytest.raises(TypeError, match="inv_scale"):
        mvue_compress24_cutlass_fp8(dz, 0, inv.double())


# --- GPU: against CUTLASS's own compressor ---------------------------------------------------------------
def _is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


hopper = pytest.mark.skipif(not _is_hopper(), reason="needs a Hopper GPU (sm_90) and the CUTLASS backend")


def _gpu_dz(tokens, out_f, gen):
    """Random dZ with -0.0 and +0.0 entries, zero groups and ties of magnitude along the tokens."""
    dz = torch.randn(tokens, out_f, device="cuda", generator=gen)
    dz[::7, ::3] = -0.0
    dz[4:8] = 0.0
    dz[8:16] = torch.tensor([2.0, -2.0], device="cuda").repeat(out_f)[:out_f]
    return dz.to(BF16)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("tokens,out_f", [(16384, 4096), (4096, 16384), (1000, 200), (64, 64), (1040, 1056)])
def test_gpu_bytes_equal_cutlass_compressor(tokens, out_f):
    """Kernel 23's bytes are ``ops.compress``'s for the transposed copy of mvue24's draw (bf16 and E4M3)."""
    from sparsity_lab.backends.cutlass import ops

    gen = torch.Generator(device="cuda").manual_seed(tokens + out_f)
    dz = _gpu_dz(tokens, out_f, gen)
    k16, k32 = -(-tokens // 16) * 16, -(-tokens // 32) * 32
    values, meta = mvue_compress24_cutlass(dz, seed=7)
    theirs = ops.compress(_drawn(dz, 7, k16).t().contiguous())
    assert torch.equal(_bytes(values), _bytes(theirs.values)) and torch.equal(meta, theirs.metadata)
    inv_scale = torch.tensor([448.0 / 3.0], device="cuda")  # saturates the largest values
    q, amax_ref = quantize_fp8_with_scale(_drawn(dz, 7, k32), inv_scale)
    values, meta, amax = mvue_compress24_cutlass_fp8(dz, 7, inv_scale)
    theirs = ops.compress(q.t().contiguous())
    assert torch.equal(_bytes(values), _bytes(theirs.values)) and torch.equal(meta, theirs.metadata)
    assert torch.equal(amax, amax_ref) and torch.equal(mvue_compress24_cutlass_amax(dz, 7), amax_ref)
