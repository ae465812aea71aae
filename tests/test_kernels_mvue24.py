"""Kernel 4 (MVUE 2:4, Philox RNG) against methods.mvue: probabilities, support, unbiasedness."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE, DTYPES

from sparsity_lab.kernels.mvue24 import mvue24
from sparsity_lab.methods.mvue import mvue_probabilities


def _groups(x, dim):
    moved = x.movedim(dim, -1)
    return moved.reshape(-1, 4)


def _check_support_and_values(x, y, dim, rtol):
    """At most 2 kept per group, each kept value x_i / p_i with the reference's p, <2 non-zeros unchanged."""
    gx, gy = _groups(x.double(), dim), _groups(y.double(), dim)
    p = mvue_probabilities(gx)
    assert bool(((gy != 0).sum(1) <= 2).all())
    kept = gy != 0
    torch.testing.assert_close(gy[kept], (gx / p.clamp_min(1e-300))[kept], rtol=rtol, atol=0)
    few = (gx != 0).sum(1) < 2
    assert torch.equal(gy[few], gx[few])


@settings(max_examples=20, deadline=None)
@given(shape=st.sampled_from([(3, 20), (20, 3), (8, 5, 4), (4, 7, 6), (12,)]), dim=st.integers(0, 2),
       dtype=st.sampled_from(DTYPES), block=st.sampled_from([2, 16, 1024]), seed=st.integers(0, 2**31 - 1))
def test_kept_values_are_x_over_the_reference_probability(shape, dim, dtype, block, seed):
    dim = dim % len(shape)
    if shape[dim] % 4:
        return  # not a valid group dimension for this shape (the error is tested below)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    x[x.abs() < 0.3] = 0  # zeros: groups with 0, 1, 2 ... non-zeros
    x = x.to(dtype).to(DEVICE)
    y = mvue24(x, dim=dim, seed=seed, block=block)
    assert y.dtype == dtype and y.shape == x.shape
    _check_support_and_values(x, y, dim, rtol={torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype])


def test_same_seed_same_draw_other_seed_other_draw_any_block():
    x = torch.randn(64, 48, device=DEVICE)
    for dim in (0, 1):
        a = mvue24(x, dim=dim, seed=7, block=16)
        assert torch.equal(a, mvue24(x, dim=dim, seed=7, block=1024))  # counter-based: block-independent
        assert not torch.equal(a, mvue24(x, dim=dim, seed=8))


def _unbiasedness(x, dim, draws, seed):
    """Mean of `draws` independent draws in one launch: the copies sit along a new last/first axis."""
    if dim == 0:  # groups along the rows: copies side by side in the columns
        rep = x.repeat(1, draws)
        ys = mvue24(rep, dim=0, seed=seed).reshape(x.shape[0], draws, x.shape[1]).transpose(0, 1)
    else:  # groups along the last dim: copies stacked in new rows
        rep = x.unsqueeze(0).expand(draws, *x.shape).contiguous()
        ys = mvue24(rep, dim=-1, seed=seed)
    ys = ys.double()
    p = mvue_probabilities(_groups(x.double(), dim)).reshape(x.movedim(dim, -1).shape).movedim(-1, dim)
    var = x.double() ** 2 * (1 / p.clamp_min(1e-300) - 1)  # variance of one draw, per entry
    err = (ys.mean(0) - x.double()).abs()
    # 6 standard errors of the mean of `draws` draws (+ float32 rounding of x / p)
    assert bool((err <= 6 * (var / draws).sqrt() + 1e-5 * x.double().abs()).all()), float((err / (var / draws).sqrt().clamp_min(1e-12)).max())
    freq = (ys != 0).double().mean(0)
    nz = x != 0
    assert bool(((freq - p).abs()[nz] <= 6 * (p * (1 - p) / draws).sqrt()[nz] + 1e-9).all())


@pytest.mark.parametrize("dim", [0, -1])
def test_unbiased_on_the_triton_path(dim):
    gen = torch.Generator().manual_seed(123)
    x = torch.randn(8, 12, generator=gen)
    x[0, :4] = torch.tensor([3.0, 0.1, 0.1, 0.1])  # one entry capped at p = 1
    x[1, :4] = torch.tensor([0.0, 0.0, 2.0, 0.0])  # a single non-zero
    x = x.to(DEVICE) if dim == -1 else x.t().contiguous().to(DEVICE)
    _unbiasedness(x, dim, draws=3000, seed=11)


def test_bad_arguments_are_named():
    x = torch.randn(8, 6, device=DEVICE)
    with pytest.raises(ValueError, match="not divisible by 4"):
        mvue24(x, dim=1)
    with pytest.raises(ValueError, match="dim=2 is out of range"):
        mvue24(x, dim=2)
    with pytest.raises(ValueError, match="seed"):
        mvue24(x, dim=0, seed=-1)
    with pytest.raises(ValueError, match="seed"):
        mvue24(x, dim=0, seed=1.5)
    with pytest.raises(TypeError, match="x must have dtype"):
        mvue24(torch.ones(8, 4, dtype=torch.int64, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_mvue_on_gpu_at_size(dtype):
    x = torch.randn(4100, 1030, device="cuda").to(dtype)
    for dim in (0,):
        _check_support_and_values(x, mvue24(x, dim=dim, seed=5), dim,
                                  rtol={torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype])
    x = torch.randn(1030, 4100, device="cuda").to(dtype)
    _check_support_and_values(x, mvue24(x, dim=1, seed=5), 1,
                              rtol={torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [0, -1])
def test_mvue_unbiased_on_gpu_with_many_draws(dim):
    x = torch.randn(16, 64, device="cuda")
    x = x if dim == -1 else x.t().contiguous()
    _unbiasedness(x, dim, draws=40000, seed=3)
