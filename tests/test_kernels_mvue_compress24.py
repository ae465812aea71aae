"""Kernel 10 (MVUE 2:4 along the tokens, written in cuSPARSELt's layout) against the two-kernel path
``compress24(mvue24(dz, dim=0).t())``, whose parts are each tested against their references."""
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE

from sparsity_lab.references.cusparselt_layout import compressed_shape, decompress24_reference
from sparsity_lab.kernels import compress24, mvue24, quantize_fp8_with_scale
from sparsity_lab.kernels.compress24 import _pick
from sparsity_lab.kernels.mvue_compress24 import (_compressed_pair, _picked_slot, mvue24_amax, mvue_compress24,
                                                 mvue_compress24_fp8)


def _bytes(t):
    return t.contiguous().view(torch.uint8).reshape(-1)


@settings(max_examples=12, deadline=None)
@given(token_tiles=st.integers(1, 3), col_tiles=st.integers(1, 3), dtype=st.sampled_from([torch.bfloat16, torch.float16]),
       zeros=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_same_bytes_as_mvue_then_compress(token_tiles, col_tiles, dtype, zeros, seed):
    gen = torch.Generator().manual_seed(seed)
    dz = torch.randn(64 * token_tiles, 64 * col_tiles, generator=gen)
    if zeros:  # groups with fewer than two non-zeros, and exact zeros among the kept
        dz = torch.where(torch.rand(dz.shape, generator=gen) < 0.4, torch.zeros(()), dz)
    dz = dz.to(dtype).to(DEVICE)
    fused = mvue_compress24(dz, seed=seed % 1000)
    assert fused.shape == compressed_shape(dz.shape[1], dz.shape[0], dtype) and fused.dtype == dtype
    assert torch.equal(_bytes(fused), _bytes(compress24(mvue24(dz, dim=0, seed=seed % 1000).t())))


def test_it_stands_for_the_mvue_draw_and_changes_with_the_seed():
    dz = torch.randn(128, 64).to(torch.bfloat16).to(DEVICE)
    dense = decompress24_reference(mvue_compress24(dz, seed=3), 64, 128)  # (out, tokens)
    assert torch.equal(dense.t().float(), mvue24(dz, dim=0, seed=3).float())
    assert not torch.equal(_bytes(mvue_compress24(dz, seed=3)), _bytes(mvue_compress24(dz, seed=4)))


def test_bad_inputs_are_refused_with_the_reason():
    dz = torch.randn(128, 64).to(torch.bfloat16).to(DEVICE)
    with pytest.raises(ValueError, match="multiples of 64"):
        mvue_compress24(dz[:96])
    with pytest.raises(ValueError, match="contiguous"):
        mvue_compress24(torch.randn(64, 128).to(torch.bfloat16).to(DEVICE).t())
    with pytest.raises(TypeError, match="dtype"):
        mvue_compress24(dz.float())
    with pytest.raises(ValueError, match="seed"):
        mvue_compress24(dz, seed=-1)
    with pytest.raises(ValueError, match="block_groups"):
        mvue_compress24(dz, block_groups=12)


@pytest.mark.gpu
def test_same_bytes_as_the_two_kernels_at_size_on_gpu():
    dz = torch.randn(16384, 4096, device="cuda").to(torch.bfloat16)
    fused = mvue_compress24(dz, seed=7)
    assert torch.equal(_bytes(fused), _bytes(compress24(mvue24(dz, dim=0, seed=7).t())))
    assert torch.equal(_bytes(fused), _bytes(torch._cslt_compress(mvue24(dz, dim=0, seed=7).t().contiguous())))


# --- kernel 19: the FP8 form --------------------------------------------------------------------------
def _unfused_fp8(dz, seed, inv_scale):
    q, amax = quantize_fp8_with_scale(mvue24(dz, dim=0, seed=seed), inv_scale)
    return compress24(q.t()), amax


@settings(max_examples=12, deadline=None)
@given(token_tiles=st.integers(1, 3), col_tiles=st.integers(1, 3), dtype=st.sampled_from([torch.bfloat16, torch.float16]),
       zeros=st.booleans(), magnitude=st.sampled_from([1e-4, 1.0, 1e3]), scale_factor=st.sampled_from([0.1, 1.0, 8.0]),
       seed=st.integers(0, 2**31 - 1))
def test_fp8_same_bytes_and_amax_as_mvue_cast_compress(token_tiles, col_tiles, dtype, zeros, magnitude, scale_factor,
                                                        seed):
    """scale_factor 8 saturates the larger MVUE values (they are dZ / p, up to twice |dZ| and more);
    magnitude 1e-4 puts values in the cast's subnormal range (and flushes some kept values to zero)."""
    gen = torch.Generator().manual_seed(seed)
    dz = torch.randn(64 * token_tiles, 64 * col_tiles, generator=gen) * magnitude
    if zeros:
        dz = torch.where(torch.rand(dz.shape, generator=gen) < 0.4, torch.zeros(()), dz)
    dz = dz.to(dtype).to(DEVICE)
    inv_scale = (448.0 / dz.abs().amax().float().clamp_min(1e-12) * scale_factor).reshape(1)
    fused, amax = mvue_compress24_fp8(dz, seed % 1000, inv_scale)
    ref, amax_ref = _unfused_fp8(dz, seed % 1000, inv_scale)
    assert fused.shape == compressed_shape(dz.shape[1], dz.shape[0], torch.float8_e4m3fn)
    assert fused.dtype == torch.float8_e4m3fn
    assert torch.equal(_bytes(fused), _bytes(ref))
    assert torch.equal(amax, amax_ref) and torch.equal(mvue24_amax(dz, seed % 1000), amax_ref)


@pytest.mark.parametrize("fp8", [False, True])
def test_subnormal_gradients_same_bytes_as_the_unfused_path(fp8):
    """dZ of bf16 subnormals: where the arithmetic flushes subnormals (Triton's interpreter does), a kept value
    x / p can round to a signed zero, so the compressed store must take its non-zero flags from the values, not
    from MVUE's picks (a shortcut that once failed here)."""
    gen = torch.Generator().manual_seed(5)
    sign = torch.where(torch.rand(128, 64, generator=gen) < 0.5, -1.0, 1.0)
    dz = (sign * 1.653e-39).to(torch.bfloat16)
    dz[torch.rand(128, 64, generator=gen) < 0.1] = -0.0
    dz[0, 0] = -1.6563e-31
    dz = dz.to(DEVICE)
    for seed in (0, 46385):
        if fp8:
            inv_scale = torch.tensor([1e30], device=DEVICE)
            fused, amax = mvue_compress24_fp8(dz, seed, inv_scale)
            ref, amax_ref = _unfused_fp8(dz, seed, inv_scale)
            assert torch.equal(amax, amax_ref)
        else:
            fused, ref = mvue_compress24(dz, seed=seed), compress24(mvue24(dz, dim=0, seed=seed).t())
        assert torch.equal(_bytes(fused), _bytes(ref))


def test_fp8_seed_from_the_device_and_bad_inputs():
    dz = torch.randn(128, 64).to(torch.bfloat16).to(DEVICE)
    inv = torch.tensor(100.0, device=DEVICE)
    seed_t = torch.tensor(5, dtype=torch.int64, device=DEVICE)
    assert torch.equal(_bytes(mvue_compress24_fp8(dz, seed_t, inv)[0]), _bytes(mvue_compress24_fp8(dz, 5, inv)[0]))
    with pytest.raises(TypeError, match="inv_scale"):
        mvue_compress24_fp8(dz, 0, 100.0)
    with pytest.raises(ValueError, match="block_groups"):
        mvue_compress24_fp8(dz, 0, inv, block_groups=8)  # an FP8 metadata tile spans 16 groups
    with pytest.raises(ValueError, match="seed"):
        mvue24_amax(dz, -2)


@pytest.mark.gpu
def test_fp8_same_bytes_as_the_three_kernels_at_size_on_gpu():
    dz = (torch.randn(16384, 4096, device="cuda") * 1e-3).to(torch.bfloat16)
    inv_scale = (448.0 / dz.abs().amax().float() / 2).reshape(1)
    for seed in (7, torch.tensor(9, dtype=torch.int64, device="cuda")):
        fused, amax = mvue_compress24_fp8(dz, seed, inv_scale)
        ref, amax_ref = _unfused_fp8(dz, seed, inv_scale)
        assert torch.equal(_bytes(fused), _bytes(ref)) and torch.equal(amax, amax_ref)
        assert torch.equal(mvue24_amax(dz, seed), amax_ref)


def test_fp8_values_that_are_not_finite_give_nan_bytes():
    """Kernel 19's byte assembly follows ``references.fp8``'s policy: an MVUE value that is not finite
    (an overflow in dZ) is NaN (0x7F) in q(MVUE(dZ)), as the unfused cast gives, not +-fp8_max."""
    gen = torch.Generator().manual_seed(6)
    dz = torch.randn(64, 64, generator=gen)
    dz[0, 0], dz[4, 1], dz[8, 2] = float("inf"), -float("inf"), float("nan")
    dz = dz.to(torch.bfloat16).to(DEVICE)
    inv_scale = torch.tensor([10.0], device=DEVICE)
    fused, _ = mvue_compress24_fp8(dz, 7, inv_scale)
    ref, _ = _unfused_fp8(dz, 7, inv_scale)
    assert _bytes(ref).eq(0x7F).any()
    assert torch.equal(_bytes(fused), _bytes(ref))


# --- kernel 19's pick from MVUE's picks, against _pick of the rebuilt group --------------------------------
@triton.jit
def _pair_against_slots_kernel(first_ptr, second_ptr, picks_ptr, out_ptr, N: tl.constexpr, SIGN_OFF: tl.constexpr):
    offs = tl.arange(0, N)
    b_first = tl.load(first_ptr + offs)
    b_second = tl.load(second_ptr + offs)
    picks = tl.load(picks_ptr + offs)
    p0, p1, p2, p3 = (picks & 1) != 0, (picks & 2) != 0, (picks & 4) != 0, (picks & 8) != 0
    rest = tl.zeros_like(b_first)
    v0, v1, code = _compressed_pair(b_first, b_second, rest, p0, p1, p2, p3, SIGN_OFF)
    y0, y1, y2, y3 = _picked_slot(b_first, b_second, rest, p0, p1, p2, p3)
    w0, w1, code_ref = _pick(y0, y1, y2, y3, SIGN_OFF)
    tl.store(out_ptr + offs, v0)
    tl.store(out_ptr + N + offs, v1)
    tl.store(out_ptr + 2 * N + offs, code)
    tl.store(out_ptr + 3 * N + offs, w0)
    tl.store(out_ptr + 4 * N + offs, w1)
    tl.store(out_ptr + 5 * N + offs, code_ref)


@pytest.mark.parametrize("sign_off, images", [(0x7F, (0x00, 0x80, 0x01, 0x3C, 0xFE)),
                                              (0x7FFF, (0x0000, -0x8000, 0x0001, 0x3F80, -0x4080))])
def test_the_pick_from_the_picks_is_pick_of_the_rebuilt_group(sign_off, images):
    """Every pick pattern MVUE can give (at most two; the first pick among entries 0-2) with every image of the two
    kept values (+0.0, -0.0, non-zero ones; +0.0 where a value is not kept): the same v0, v1 and code as ``_pick``
    of the four slots, for E4M3 bytes and bf16 bits."""
    rows = []
    for picks in range(16):
        p = [(picks >> k) & 1 for k in range(4)]
        if sum(p) > 2:
            continue
        first_kept = p[0] or p[1] or p[2]
        second_kept = p[3] or (p[2] and (p[0] or p[1])) or (p[1] and p[0])
        for f in images if first_kept else (0,):
            for s in images if second_kept else (0,):
                rows.append((f, s, picks))
    n = triton.next_power_of_2(len(rows))
    rows += [rows[0]] * (n - len(rows))
    first, second, picks = (torch.tensor(c, dtype=torch.int32, device=DEVICE) for c in zip(*rows))
    out = torch.empty(6 * n, dtype=torch.int32, device=DEVICE)
    _pair_against_slots_kernel[(1,)](first, second, picks, out, N=n, SIGN_OFF=sign_off)
    got, ref = out.view(6, n)[:3], out.view(6, n)[3:]
    assert torch.equal(got, ref), [rows[k] for k in (got != ref).any(0).nonzero().flatten().tolist()][:8]
