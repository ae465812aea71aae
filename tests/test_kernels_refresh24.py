"""Kernel 21 (the mask refresh in one pass: transposable mask in place, its flips, S(W) and S(W)^T compressed)
against the unfused chain it replaces, kernel 2 -> kernel 9 -> the mask copy -> kernel 11 (each tested against
its own reference), and against the plain PyTorch references: ``solve_patterns``, ``mask_flips_tensor`` and the
dense S decoded from the compressed bytes."""
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE

from sparsity_lab.kernels import count_flips, prepare24, refresh24, refresh24_cutlass, transposable_mask24
from sparsity_lab.masks.patterns import solve_patterns
from sparsity_lab.masks.tiles import validate_transposable_mask
from sparsity_lab.methods.flip_rate import mask_flips_tensor
from sparsity_lab.methods.soft_threshold import soft_threshold
from sparsity_lab.references.cusparselt_layout import compressed_shape, decompress24_reference


def _bytes(t):
    return None if t is None else t.contiguous().view(torch.uint8).reshape(-1)


def _unfused(w, previous, beta, out_dtype, forward=True, transposed=True):
    """(new mask, flips, fwd, bwd) of kernel 2 -> 9 -> copy -> 11, ``previous`` left as it was."""
    new = transposable_mask24(w, pruned=False)[0]
    flips = count_flips(previous, new)
    mask = previous.clone()
    mask.copy_(new)
    fwd, bwd = prepare24(w, mask, beta, out_dtype=out_dtype, forward=forward, transposed=transposed)
    return mask, flips, fwd, bwd


def _assert_same_as_unfused(w, previous, beta, out_dtype, forward=True, transposed=True):
    mask = previous.clone()
    flips, fwd, bwd = refresh24(w, mask, beta, out_dtype=out_dtype, forward=forward, transposed=transposed)
    ref_mask, ref_flips, ref_fwd, ref_bwd = _unfused(w, previous, beta, out_dtype, forward, transposed)
    assert torch.equal(mask, ref_mask)
    assert flips.dtype == torch.int64 and flips.dim() == 0 and flips.device == w.device
    assert int(flips) == int(ref_flips) == int(mask_flips_tensor(previous, mask))
    for got, want in ((fwd, ref_fwd), (bwd, ref_bwd)):
        assert (got is None) == (want is None)
        if got is not None:
            assert got.shape == want.shape and got.dtype == want.dtype
            assert torch.equal(_bytes(got), _bytes(want))
    return mask, fwd, bwd


def _previous(kind, rows, cols, gen, w):
    if kind == "ones":  # a layer's mask before its first refresh
        return torch.ones(rows, cols, dtype=torch.bool, device=DEVICE)
    if kind == "random":
        return (torch.rand(rows, cols, generator=gen) < 0.5).to(DEVICE)
    new = transposable_mask24(w, pruned=False)[0]
    if kind == "same":  # a refresh that changes nothing: 0 flips
        return new
    return new ^ (torch.rand(rows, cols, generator=gen) < 0.02).to(DEVICE)  # "near": a few flips, as in training


def _weight(rows, cols, dtype, gen):
    w = torch.randn(rows, cols, generator=gen)
    if DEVICE.type == "cpu":  # the interpreter truncates fp32 -> bf16 (the GPU rounds): bf16-exact weights
        w = w.to(torch.bfloat16).float()
    return w.to(dtype).to(DEVICE)


@settings(max_examples=6, deadline=None)
@given(shape=st.sampled_from([(64, 64), (64, 128), (128, 64)]),
       w_dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       out_dtype=st.sampled_from([torch.bfloat16, torch.float16]), soft=st.booleans(),
       transposed_view=st.booleans(), previous=st.sampled_from(["ones", "random", "same", "near"]),
       seed=st.integers(0, 2**31 - 1))
def test_same_mask_flips_and_bytes_as_the_unfused_chain(shape, w_dtype, out_dtype, soft, transposed_view, previous,
                                                         seed):
    gen = torch.Generator().manual_seed(seed)
    rows, cols = shape
    w = _weight(rows, cols, w_dtype, gen)
    if transposed_view:  # W given as the .t() of a contiguous tensor: read in place through its strides
        w = w.t().contiguous().t()
    beta = torch.tensor(0.5 + torch.rand((), generator=gen).item(), device=DEVICE) if soft else None
    prev = _previous(previous, rows, cols, gen, w)
    mask, fwd, bwd = _assert_same_as_unfused(w, prev, beta, out_dtype)
    validate_transposable_mask(mask, 2, 4)
    assert fwd.shape == compressed_shape(rows, cols, out_dtype) and bwd.shape == compressed_shape(cols, rows, out_dtype)


def _adversarial_weight(kind, dtype, gen, rows=64, cols=64):
    """Magnitudes that break careless kernels: exact ties everywhere, -0.0 and +0.0, subnormals next to the
    dtype's largest values inside one tile, and (``non_finite``) NaN / +-Inf at random places."""
    info = torch.finfo(dtype)
    n = rows * cols
    if kind == "ties":  # a pool of three magnitudes: every score ties with many others
        mags = torch.tensor([0.0, 1.0, 2.0])[torch.randint(0, 3, (n,), generator=gen)]
    else:  # log-uniform over the dtype's range, with zeros, subnormals and near-max values mixed in
        lo, hi = math.log2(float(info.smallest_normal)), math.log2(float(info.max)) - 1
        mags = torch.exp2(lo + (hi - lo) * torch.rand(n, generator=gen))
        pick = torch.randint(0, 6, (n,), generator=gen)
        mags = torch.where(pick == 0, torch.zeros(n), mags)
        mags = torch.where(pick == 1, float(info.smallest_normal) * float(info.eps) * 3, mags)  # subnormal
        mags = torch.where(pick == 2, float(info.max) * (0.5 + 0.5 * torch.rand(n, generator=gen)), mags)
    signs = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    w = (mags.double() * signs.double()).to(dtype)  # a negative zero stays -0.0
    if kind == "non_finite":
        where = torch.randint(0, n, (n // 50,), generator=gen)
        w[where] = torch.tensor([math.nan, math.inf, -math.inf], dtype=dtype)[torch.randint(0, 3, (n // 50,),
                                                                                           generator=gen)]
    return w.reshape(rows, cols).to(DEVICE)


@pytest.mark.parametrize("kind,w_dtype", [("ties", torch.float32), ("ties", torch.bfloat16), ("range", torch.float32),
                                          ("range", torch.float16), ("non_finite", torch.bfloat16),
                                          ("non_finite", torch.float32)])
def test_adversarial_magnitudes_match_the_unfused_chain(kind, w_dtype):
    gen = torch.Generator().manual_seed(21)
    w = _adversarial_weight(kind, w_dtype, gen)
    prev = (torch.rand(64, 64, generator=gen) < 0.5).to(DEVICE)
    for beta in (None, torch.tensor(0.75, device=DEVICE)):
        mask, _, _ = _assert_same_as_unfused(w, prev, beta, torch.bfloat16)
        validate_transposable_mask(mask, 2, 4)  # NaN / Inf included: always one of the 90 patterns
    if kind == "ties":  # exact scores: the reference's own mask, lowest pattern index among the maxima
        assert torch.equal(mask, solve_patterns(w, 2, 4))


def test_decoded_operands_are_the_plain_pytorch_sparse_weight():
    """Against the references alone (no kernel): the 90-pattern mask, the XOR count and S decoded."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randint(-4, 5, (64, 128), generator=gen).float().to(DEVICE)  # small integers: exact scores, ties
    prev = (torch.rand(64, 128, generator=gen) < 0.5).to(DEVICE)
    beta = torch.tensor(1.25, device=DEVICE)
    mask = prev.clone()
    flips, fwd, bwd = refresh24(w, mask, beta, out_dtype=torch.float16)
    assert torch.equal(mask, solve_patterns(w, 2, 4))
    assert int(flips) == int((prev != mask).sum())
    expected = (beta * soft_threshold(w, mask, 2, 4)).half()  # exact here: small integers times 1.25
    assert torch.equal(decompress24_reference(fwd, 64, 128), expected)
    assert torch.equal(decompress24_reference(bwd, 128, 64), expected.t())
    _, fwd_ste, bwd_ste = refresh24(w, mask, None, out_dtype=torch.bfloat16)
    assert torch.equal(decompress24_reference(fwd_ste, 64, 128), w.to(torch.bfloat16) * mask)
    assert torch.equal(decompress24_reference(bwd_ste, 128, 64), (w.to(torch.bfloat16) * mask).t())


def test_in_place_update_version_and_the_parts_left_out():
    gen = torch.Generator().manual_seed(5)
    w = _weight(64, 128, torch.bfloat16, gen)
    prev = (torch.rand(64, 128, generator=gen) < 0.5).to(DEVICE)
    mask = prev.clone()
    storage, version = mask.data_ptr(), mask._version
    flips, fwd, bwd = refresh24(w, mask, count=False, forward=False, transposed=False)
    assert flips is None and fwd is None and bwd is None
    assert mask.data_ptr() == storage and mask._version > version  # written in place, and its version says so
    assert torch.equal(mask, transposable_mask24(w, pruned=False)[0])
    w32 = w.float()  # the mask alone needs no product dtype, whatever W's dtype
    mask.copy_(prev)
    assert int(refresh24(w32, mask, forward=False, transposed=False)[0]) == int((prev != mask).sum()) > 0
    assert torch.equal(mask, transposable_mask24(w32, pruned=False)[0])
    _assert_same_as_unfused(w, prev, None, torch.bfloat16, forward=False)
    _assert_same_as_unfused(w, prev, None, torch.bfloat16, transposed=False)


@pytest.mark.parametrize("refresh,shape", [(refresh24, (64, 64)), (refresh24_cutlass, (80, 48))],
                         ids=["kernel21", "kernel24_partial_blocks"])
def test_any_non_zero_byte_of_the_previous_mask_counts_as_kept(refresh, shape):
    """A bool tensor viewed from other bytes may hold any non-zero byte for True: counted as kernel 9 counts it
    (kernel 24 shares kernel 21's count; at 80 x 48 in partial blocks)."""
    gen = torch.Generator().manual_seed(8)
    w = _weight(*shape, torch.bfloat16, gen)
    raw = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    raw[torch.rand(*shape, generator=gen) < 0.5] = 0
    prev = raw.to(DEVICE).view(torch.bool)
    mask = prev.clone()
    flips, _, _ = refresh(w, mask, count=True, forward=False, transposed=False)
    new = transposable_mask24(w, pruned=False)[0]
    assert torch.equal(mask, new) and mask.view(torch.uint8).max() == 1
    assert int(flips) == int(count_flips(prev, new)) == int(((raw != 0).to(DEVICE) != new).sum())


def test_bad_inputs_are_refused_with_the_reason():
    w = torch.randn(64, 128, device=DEVICE)
    mask = torch.ones(64, 128, dtype=torch.bool, device=DEVICE)
    with pytest.raises(ValueError, match="multiples of 64"):
        refresh24(w[:, :96], mask[:, :96])
    with pytest.raises(ValueError, match="multiples of 64"):
        refresh24(torch.randn(68, 64, device=DEVICE), torch.ones(68, 64, dtype=torch.bool, device=DEVICE))
    with pytest.raises(ValueError, match="2-D"):
        refresh24(w.reshape(-1), mask.reshape(-1))
    with pytest.raises(TypeError, match="w must have dtype"):
        refresh24(w.double(), mask)
    with pytest.raises(TypeError, match="out_dtype"):
        refresh24(w, mask, out_dtype=torch.float32)
    with pytest.raises(TypeError, match="mask"):
        refresh24(w, mask.float(), out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="shape"):
        refresh24(w, mask[:32], out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="contiguous"):
        refresh24(w, torch.ones(128, 64, dtype=torch.bool, device=DEVICE).t(), out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="beta"):
        refresh24(w, mask, torch.ones(2, device=DEVICE), out_dtype=torch.bfloat16)
    shifted = torch.ones(64 * 128 + 2, dtype=torch.bool, device=DEVICE)[2:].view(64, 128)  # contiguous, offset 2
    with pytest.raises(ValueError, match="4-byte boundary"):
        refresh24(w, shifted, out_dtype=torch.bfloat16)
    assert bool(mask.all()), "a refused call writes nothing"


_COMPILE_FOR_SM90 = r"""
import triton.language as tl, importlib
from benchmarks.sass_counts import compile_sm90 as compile_for_sm90  # as the JIT builds whole tiles, no GPU

k21 = importlib.import_module("sparsity_lab.kernels.refresh24")._refresh24_kernel
k11 = importlib.import_module("sparsity_lab.kernels.prepare24")._prepare24_kernel
k2 = importlib.import_module("sparsity_lab.kernels.transposable24")._transposable24_kernel
fp8_constexprs = importlib.import_module("sparsity_lab.kernels.prepare24_cutlass").fp8_constexprs
sig21 = dict(w_ptr="*bf16", mask_ptr="*i32", beta_ptr="*fp32", flips_ptr="*i64", vals_ptr="*i16", meta_ptr="*u8",
             vals_t_ptr="*i16", meta_t_ptr="*u8", inv_scale_ptr="*fp32", partial_ptr="*fp32", stride_r="i32",
             stride_c="i32", n_rows="i32", n_cols="i32", SOFT="constexpr", COUNT="constexpr", WRITE_W="constexpr",
             WRITE_T="constexpr", OUT_DTYPE="constexpr", FP8="constexpr", FMAX="constexpr", MBITS="constexpr",
             EMIN="constexpr", SIGN_OFF="constexpr", TILE_COLS="constexpr")
for soft, operands, warps, fp8 in ((True, True, 4, False), (False, True, 8, False), (False, False, 4, False),
                                   (True, True, 4, True), (False, True, 4, True)):
    bits = "*u8" if fp8 else "*i16"
    compile_for_sm90(k21, dict(sig21, vals_ptr=bits, vals_t_ptr=bits),
                     dict(SOFT=soft, COUNT=True, WRITE_W=operands, WRITE_T=operands, OUT_DTYPE=tl.bfloat16,
                          stride_c=1, TILE_COLS=64 if fp8 else 32, **fp8_constexprs(fp8)), warps)
sig11 = dict(w_ptr="*bf16", mask_ptr="*u8", beta_ptr="*fp32", vals_ptr="*i16", meta_ptr="*u8", vals_t_ptr="*i16",
             meta_t_ptr="*u8", inv_scale_ptr="*u8", partial_ptr="*u8", stride_r="i32", stride_c="i32", n_rows="i32",
             n_cols="i32", SOFT="constexpr", WRITE_W="constexpr", WRITE_T="constexpr", OUT_DTYPE="constexpr",
             FP8="constexpr", WRITE_AMAX="constexpr", FMAX="constexpr", MBITS="constexpr", EMIN="constexpr",
             SIGN_OFF="constexpr", TILE_COLS="constexpr")
compile_for_sm90(k11, sig11, dict(SOFT=True, WRITE_W=True, WRITE_T=True, OUT_DTYPE=tl.bfloat16, stride_c=1, FP8=False,
                                  WRITE_AMAX=False, FMAX=448.0, MBITS=3, EMIN=-6, SIGN_OFF=0x7FFF, TILE_COLS=32), 4)
sig2 = dict(w_ptr="*bf16", mask_ptr="*u8", out_ptr="*bf16", out_t_ptr="*bf16", n_rows="i32", n_cols="i32",
            WRITE_PRUNED="constexpr", WRITE_T="constexpr", BA="constexpr", BB="constexpr")
compile_for_sm90(k2, sig2, dict(WRITE_PRUNED=False, WRITE_T=2, BA=4, BB=64), 4)
# kernel 24 (CUTLASS's layout) and kernel 22, whose store it shares: bf16 and E4M3, whole and partial blocks
k24 = importlib.import_module("sparsity_lab.kernels.refresh24_cutlass")._refresh24_cutlass_kernel
k22 = importlib.import_module("sparsity_lab.kernels.prepare24_cutlass")._prepare24_cutlass_kernel
for fp8, edge, soft in ((False, False, True), (False, True, False), (True, False, False), (True, True, True)):
    bits = "*u8" if fp8 else "*i16"
    sig24 = dict(w_ptr="*fp32", mask_ptr="*i32", beta_ptr="*fp32", flips_ptr="*i64", vals_ptr=bits, meta_ptr="*u8",
                 vals_t_ptr=bits, meta_t_ptr="*u8", inv_scale_ptr="*fp32", partial_ptr="*fp32", stride_r="i32",
                 stride_c="i32", n_rows="i32", n_cols="i32", SOFT="constexpr", COUNT="constexpr", WRITE_W="constexpr",
                 WRITE_T="constexpr", OUT_DTYPE="constexpr", EDGE="constexpr", FP8="constexpr", FMAX="constexpr",
                 MBITS="constexpr", EMIN="constexpr", SIGN_OFF="constexpr")
    compile_for_sm90(k24, sig24, dict(SOFT=soft, COUNT=True, WRITE_W=True, WRITE_T=True, OUT_DTYPE=tl.bfloat16,
                                      EDGE=edge, stride_c=1, **fp8_constexprs(fp8)), 4)
    sig22 = {k: v for k, v in sig24.items() if k not in ("flips_ptr", "COUNT", "EDGE")}
    sig22["WRITE_AMAX"] = "constexpr"
    compile_for_sm90(k22, sig22, dict(SOFT=soft, WRITE_W=True, WRITE_T=True, OUT_DTYPE=tl.bfloat16, WRITE_AMAX=True,
                                      stride_c=1, **fp8_constexprs(fp8)), 4)
print("compiled")
"""


def test_kernels_21_and_24_and_the_kernels_they_share_code_with_compile_for_sm90_without_a_gpu():
    """The interpreter runs what the GPU compiler refuses (a plain global read inside a kernel, for one): kernels 21
    and 24 (bf16 and E4M3, whole and partial blocks), and kernels 2, 11 and 22 whose helpers they share, compiled
    to sm_90 cubins here, with no GPU (under a minute)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton's default, set to keep its notice out of the output
    out = subprocess.run([sys.executable, "-c", _COMPILE_FOR_SM90], capture_output=True, text=True, env=env,
                         timeout=300, cwd=Path(__file__).resolve().parent.parent)  # the repo root: benchmarks/
    assert out.returncode == 0 and "compiled" in out.stdout, out.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16384, 4096), (4096, 16384)])
@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32])
def test_same_as_the_unfused_chain_at_the_ffn_sizes_on_gpu(shape, soft, w_dtype):
    """The lab GPT's FFN weights (d_model 4096), a previous mask a training step away (about 1 % flips), and
    the weights a step of AdamW later: mask, flip count and both compressed operands bit for bit."""
    torch.manual_seed(0)
    w = torch.randn(shape, device="cuda")
    prev = transposable_mask24(w, pruned=False)[0]
    w = (w + 0.02 * torch.randn(shape, device="cuda")).to(w_dtype)
    beta = torch.tensor(0.9, device="cuda") if soft else None
    mask, _, _ = _assert_same_as_unfused(w, prev, beta, torch.bfloat16)
    changed = int((mask != prev).sum())
    assert 0 < changed < mask.numel() // 10
    validate_transposable_mask(mask, 2, 4)
