"""Kernels 12 and 13 (squared ReLU + 2:4 selection + cuSPARSELt compression, and its backward)
against the plain-PyTorch reference ``sparsity_lab.references.act24``."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE, assert_close_ulp

from sparsity_lab.references.cusparselt_layout import compress24_reference, compressed_shape, decompress24_reference
from sparsity_lab.kernels.act24 import act24
from sparsity_lab.kernels.act24_backward import act24_backward
from sparsity_lab.references.act24 import act24 as act24_ref
from sparsity_lab.references.act24 import act24_grad

DTYPES = (torch.bfloat16, torch.float16)


def _bytes(t):
    return t.contiguous().view(torch.uint8).reshape(-1)


def _expect_values(got, want):
    """Equal on the GPU and for fp16; bf16 under the interpreter truncates instead of rounding (1 ulp)."""
    if DEVICE.type == "cuda" or got.dtype == torch.float16:
        assert torch.equal(got, want), int((got != want).sum())
    else:
        assert_close_ulp(got, want)


def _check_forward(h, dtype):
    rows, cols = h.shape
    compressed, dense = act24(h, out_dtype=dtype)
    want, mask = act24_ref(h, dtype)
    assert compressed.shape == compressed_shape(rows, cols, dtype) and dense.dtype == dtype
    _expect_values(dense, want)
    assert bool(((dense != 0) <= mask.to(dense.device)).all()), "a pruned entry was written"
    # the compressed bytes are exactly cuSPARSELt's compression of the dense output
    assert torch.equal(_bytes(compressed), _bytes(compress24_reference(dense)))
    assert torch.equal(decompress24_reference(compressed, rows, cols), dense)


def _fresh(rows, cols, dtype, gen, kind):
    h = torch.randn(rows, cols, generator=gen)
    if kind == "ties":  # whole groups of equal values, and pairs of equal values
        h = h.reshape(rows, -1, 4)[..., :1].expand(rows, cols // 4, 4).reshape(rows, cols).clone()
        h[:, 1::4] = h[:, 2::4]
    elif kind == "zeros":  # mostly negative (zeros after relu), some groups fully zero
        h = h - 1.5
    elif kind == "wide":  # magnitudes over many decades
        h = h * torch.exp(4 * torch.randn(rows, cols, generator=gen))
    return h.to(dtype).to(DEVICE)


@settings(max_examples=12, deadline=None)
@given(row_tiles=st.integers(1, 3), col_tiles=st.integers(1, 4), dtype=st.sampled_from(DTYPES),
       kind=st.sampled_from(["plain", "ties", "zeros", "wide"]), transposed=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_forward_equals_reference_on_fresh_inputs(row_tiles, col_tiles, dtype, kind, transposed, seed):
    gen = torch.Generator().manual_seed(seed)
    h = _fresh(64 * row_tiles, 64 * col_tiles, dtype, gen, kind)
    if transposed:  # the same matrix stored column-major: the kernel reads the strided view
        h = h.t().contiguous().t()
    _check_forward(h, dtype)


def test_forward_ties_keep_the_lowest_indices_and_float32_input():
    h = torch.zeros(64, 64)
    h[:, 0:4] = 1.0                                         # all tied: keep columns 0, 1
    h[:, 4:8] = torch.tensor([0.5, 2.0, 2.0, 2.0])          # three tied: keep 5, 6
    h[:, 8:12] = torch.tensor([-1.0, 0.0, 3.0, -2.0])       # one positive: 10 and a kept zero
    _, dense = act24(h.to(DEVICE), out_dtype=torch.float16)
    row = dense[0, :12].float().cpu()
    assert row.tolist() == [1, 1, 0, 0, 0, 4, 4, 0, 0, 0, 9, 0]
    _check_forward(h.to(DEVICE), torch.bfloat16)  # float32 H, bf16 products


def test_forward_overflow_and_nan_follow_the_reference():
    h = torch.randn(64, 64)
    h[0, :4] = torch.tensor([300.0, 1.0, 2.0, 0.5])         # 90000 overflows fp16: inf, as the reference
    h[1, :4] = torch.tensor([float("nan"), 1.0, 2.0, 0.5])   # NaN ranks as the largest
    h = h.to(DEVICE)
    compressed, dense = act24(h, out_dtype=torch.float16)
    want, mask = act24_ref(h, torch.float16)
    assert torch.equal(dense.isnan(), want.isnan())
    assert torch.equal(torch.nan_to_num(dense), torch.nan_to_num(want))
    assert mask[1, :4].tolist() == [True, False, True, False]


@settings(max_examples=10, deadline=None)
@given(row_tiles=st.integers(1, 2), col_tiles=st.integers(1, 3), dtype=st.sampled_from(DTYPES),
       kind=st.sampled_from(["plain", "ties", "zeros"]), seed=st.integers(0, 2**31 - 1))
def test_backward_equals_reference_on_fresh_inputs(row_tiles, col_tiles, dtype, kind, seed):
    gen = torch.Generator().manual_seed(seed)
    rows, cols = 64 * row_tiles, 64 * col_tiles
    h = _fresh(rows, cols, dtype, gen, kind)
    da = torch.randn(rows, cols, generator=gen).to(dtype).to(DEVICE)
    compressed, dense = act24_backward(h, da)
    want = act24_grad(h, da)
    _expect_values(dense, want)
    # dH lives on the forward's pattern: never outside the mask of A24
    _, mask = act24_ref(h, dtype)
    assert bool(((dense != 0) <= mask.to(dense.device)).all())
    assert torch.equal(_bytes(compressed), _bytes(compress24_reference(dense)))


def test_bad_inputs_are_refused_with_the_reason():
    h = torch.randn(64, 128, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="multiples of 64"):
        act24(h[:48])
    with pytest.raises(ValueError, match="multiples of 64"):
        act24(h[:, :96])
    with pytest.raises(ValueError, match="2-D"):
        act24(h[None])
    with pytest.raises(TypeError, match="out_dtype"):
        act24(h, out_dtype=torch.float32)
    with pytest.raises(TypeError, match="dtype"):
        act24(h.double())
    with pytest.raises(ValueError, match="grad_a24 has shape"):
        act24_backward(h, h[:, :64])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_bytes_equal_cslt_compress_and_products_on_gpu(dtype):
    """On the H100: our compressed A24 equals ``torch._cslt_compress`` of the reference A24 (groups with
    two non-zeros: nonnegative inputs), and its cuSPARSELt product equals the dense product."""
    gen = torch.Generator().manual_seed(7)
    h = (torch.randn(1024, 2048, generator=gen).abs() + 0.01).to(dtype).cuda()
    compressed, dense = act24(h)
    want, _ = act24_ref(h, dtype)
    assert torch.equal(dense, want)
    assert torch.equal(_bytes(compressed), _bytes(torch._cslt_compress(want)))
    w = torch.randn(512, 2048, generator=gen).to(dtype).cuda()
    out = torch._cslt_sparse_mm(compressed, w.t())
    ref = want.float() @ w.float().t()
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.gpu
def test_cusparselt_products_match_the_reference_on_gpu():
    from sparsity_lab.activation24 import Act24MLP
    from sparsity_lab.backends import get_backend

    torch.manual_seed(0)
    mlp = Act24MLP(256, 1024).cuda().to(torch.bfloat16)
    x = torch.randn(4, 100, 256, device="cuda", dtype=torch.bfloat16)  # 400 tokens: padded to 448
    dy = torch.randn(4, 100, 256, device="cuda", dtype=torch.bfloat16)
    outs = []
    for name in ("cusparselt", "torch"):
        mlp.backend = get_backend(name)
        xx = x.clone().requires_grad_(True)
        y = mlp(xx)
        y.backward(dy)
        outs.append([y.float(), xx.grad.float(), mlp.fc.weight.grad.float(), mlp.proj.weight.grad.float()])
        mlp.zero_grad(set_to_none=True)
    for fast, ref in zip(*outs):
        assert float((fast - ref).norm() / ref.norm()) < 2e-2
