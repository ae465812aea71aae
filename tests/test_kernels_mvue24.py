"""Kernel 4 (MVUE 2:4, Philox RNG) against methods.mvue: probabilities, support, unbiasedness.

Every check runs on each measured variant (``benchmarks/baselines/mvue24.py``, whose "level_philox4"
is the shipped kernel); the shipped function's own interface is tested at the end."""
import inspect

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE, DTYPES

from benchmarks.baselines.mvue24 import VARIANTS, mvue24
from sparsity_lab.kernels.mvue24 import mvue24 as shipped_mvue24
from sparsity_lab.methods.mvue import mvue_probabilities

# the v2 baselines are run on purpose here; test_baseline_variants_warn checks the warning
pytestmark = pytest.mark.filterwarnings("ignore:MVUE variant .* is a measurement baseline")

RTOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


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


def _min_block(variant, block):
    return max(block, 4) if "philox4" in variant else block  # one Philox call serves a quad of 4 groups


@pytest.mark.parametrize("variant", VARIANTS)
@settings(max_examples=10, deadline=None)
@given(shape=st.sampled_from([(3, 20), (20, 3), (8, 5, 4), (4, 7, 6), (12,), (36, 5)]), dim=st.integers(0, 2),
       dtype=st.sampled_from(DTYPES), block=st.sampled_from([2, 4, 16, 1024]), seed=st.integers(0, 2**31 - 1))
def test_kept_values_are_x_over_the_reference_probability(variant, shape, dim, dtype, block, seed):
    dim = dim % len(shape)
    if shape[dim] % 4:
        return  # not a valid group dimension for this shape (the error is tested below)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    x[x.abs() < 0.3] = 0  # zeros: groups with 0, 1, 2 ... non-zeros
    x = x.to(dtype).to(DEVICE)
    y = mvue24(x, dim=dim, seed=seed, block=_min_block(variant, block), variant=variant)
    assert y.dtype == dtype and y.shape == x.shape
    _check_support_and_values(x, y, dim, rtol=RTOL[dtype])


@pytest.mark.parametrize("variant", VARIANTS)
def test_same_seed_same_draw_other_seed_other_draw_any_block(variant):
    x = torch.randn(32, 40, device=DEVICE)
    for dim in (0, 1):
        a = mvue24(x, dim=dim, seed=7, block=16, variant=variant)
        # counter-based: block- and warp-independent
        assert torch.equal(a, mvue24(x, dim=dim, seed=7, block=1024, num_warps=2, variant=variant))
        assert not torch.equal(a, mvue24(x, dim=dim, seed=8, variant=variant))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dim", [0, -1])
def test_neighbouring_groups_draw_independently(dim, variant):
    """All-ones groups keep {0, 2} or {1, 3}, each with probability 1/2 (u < 1/2 or not). Groups
    that share a Philox call (or would collide on a counter) must still agree only half the time,
    at every offset 1..3 along both axes of the group grid."""
    x = torch.ones(128, 128, device=DEVICE)
    y = mvue24(x, dim=dim, seed=17, block=1024, variant=variant)
    kept = (y != 0).movedim(dim, -1).reshape(128, 32, 4)  # [other axis, group, member]
    code = (kept.int() * torch.tensor([1, 2, 4, 8], device=DEVICE)).sum(-1)  # 5 or 10
    assert bool(((code == 5) | (code == 10)).all())
    for d in (1, 2, 3):
        for same in ((code[:, d:] == code[:, :-d]), (code[d:, :] == code[:-d, :])):
            freq = float(same.double().mean())
            assert abs(freq - 0.5) <= 6 * (0.25 / same.numel()) ** 0.5, (d, freq)


_V2_CANCELS = pytest.mark.xfail(strict=True, reason="v2's arithmetic takes the capped group's rest as "
                                "float32 total - top, which cancels: [1, 1e-10, 0, 0] drops the 1e-10 (p = 1) "
                                "and [1, 1e-4, 1e-4, 1e-4] keeps 3.0005e-4 instead of 3e-4")


@pytest.mark.parametrize("variant", [pytest.param(v, marks=_V2_CANCELS) if v.startswith("v2") else v
                                     for v in VARIANTS])
def test_a_dominant_entry_does_not_cancel_the_rest(variant):
    """The capped case's rest (the sum of the three smaller |x|) must not come from total - top."""
    x = torch.tensor([[1.0, 1e-10, 0.0, 0.0], [1.0, 1e-4, 1e-4, -1e-4]], device=DEVICE).repeat(64, 1)
    y = mvue24(x, seed=9, block=16, variant=variant)
    assert torch.equal(y[0::2], x[0::2])  # two non-zeros: both kept as they are (p = 1)
    kept = y[1::2, 1:][y[1::2, 1:] != 0]
    torch.testing.assert_close(kept.abs(), torch.full_like(kept, 3e-4), rtol=1e-6, atol=0)  # x / p = rest
    assert torch.equal(y[1::2, 0], x[1::2, 0])


def test_level_arithmetic_makes_the_same_draws_as_v2():
    """"level" takes v2's uniforms (tl.rand per group) and computes the same picks by other
    arithmetic: the kept sets agree except where u lands within float rounding of an interval end."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(16, 256, generator=gen)
    x[x.abs() < 0.3] = 0
    x[0, :4] = torch.tensor([3.0, 0.1, 0.1, 0.1])  # capped
    x = x.to(DEVICE)
    for dim in (0, 1):
        a, b = mvue24(x, dim=dim, seed=3, variant="v2"), mvue24(x, dim=dim, seed=3, variant="level")
        same = (a != 0) == (b != 0)
        assert float(same.double().mean()) >= 0.999
        both = (a != 0) & (b != 0)
        torch.testing.assert_close(b[both], a[both], rtol=1e-6, atol=0)


# A draw may misplace an entry with a probability of a few float32 ulps: the kernels' interval ends are float32 sums,
# so a capped entry (p = 1) owns an interval up to an ulp shorter than the level L that separates the two pointers,
# and both can miss it. Measured on the H200: 4 capped entries of 2 inputs kept 39999 times in 40000 draws (the
# miss is an ulp-wide chance a draw). One such draw moves an entry's mean by |x| / (p draws): the checks allow MISPLACED of them.
MISPLACED = 3


def _unbiasedness(x, dim, draws, seed, variant="v2", block=4096, note=""):
    """Mean of `draws` independent draws in one launch: the copies sit along a new last/first axis.
    (A large block: few programs for the CPU interpreter; block-independence is tested above.)"""
    if dim == 0:  # groups along the rows: copies side by side in the columns
        rep = x.repeat(1, draws)
        ys = mvue24(rep, dim=0, seed=seed, block=block, variant=variant)
        ys = ys.reshape(x.shape[0], draws, x.shape[1]).transpose(0, 1)
    else:  # groups along the last dim: copies stacked in new rows
        rep = x.unsqueeze(0).expand(draws, *x.shape).contiguous()
        ys = mvue24(rep, dim=-1, seed=seed, block=block, variant=variant)
    ys = ys.double()
    p = mvue_probabilities(_groups(x.double(), dim)).reshape(x.movedim(dim, -1).shape).movedim(-1, dim)
    var = x.double() ** 2 * (1 / p.clamp_min(1e-300) - 1)  # variance of one draw, per entry
    err = (ys.mean(0) - x.double()).abs()
    # 6 standard errors of the mean of `draws` draws, + float32 rounding of x / p, + MISPLACED misplaced draws
    misplaced = MISPLACED * x.double().abs() / (p.clamp_min(1e-300) * draws)
    assert bool((err <= 6 * (var / draws).sqrt() + 1e-5 * x.double().abs() + misplaced).all()), (
        note, float((err / (var / draws).sqrt().clamp_min(1e-12)).max()))
    freq = (ys != 0).double().mean(0)
    nz = x != 0
    assert bool(((freq - p).abs()[nz] <= 6 * (p * (1 - p) / draws).sqrt()[nz] + MISPLACED / draws).all()), note


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dim", [0, -1])
def test_unbiased_on_the_triton_path(dim, variant):
    gen = torch.Generator().manual_seed(123)
    x = torch.randn(8, 12, generator=gen)
    x[0, :4] = torch.tensor([3.0, 0.1, 0.1, 0.1])  # one entry capped at p = 1
    x[1, :4] = torch.tensor([0.0, 0.0, 2.0, 0.0])  # a single non-zero
    x[2, :4] = torch.tensor([0.0, 1.5, 0.0, -0.5])  # two non-zeros: both kept (p = 1)
    x = x.to(DEVICE) if dim == -1 else x.t().contiguous().to(DEVICE)
    _unbiasedness(x, dim, draws=3000, seed=11, variant=variant)


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
    with pytest.raises(ValueError, match="variant must be one of"):
        mvue24(x, dim=0, variant="fast")
    with pytest.raises(ValueError, match="block must be >= 4 for variant 'level_philox4'"):
        mvue24(x, dim=0, block=2, variant="level_philox4")
    with pytest.raises(ValueError, match="block must be a power of two"):
        mvue24(x, dim=0, block=24)


# the v2 defect shown by test_a_dominant_entry_does_not_cancel_the_rest also hits random bf16 inputs at
# this size now and then (measured on the H100: one group kept 3 of 4); v2 is only a warned baseline
_V2_RANDOM = pytest.mark.xfail(strict=False, reason="v2 float32 cancellation can keep 3 of 4 in a rare group")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [pytest.param(v, marks=_V2_RANDOM) if v.startswith("v2") else v
                                     for v in VARIANTS])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mvue_on_gpu_at_size(dtype, variant):
    x = torch.randn(4100, 1030, device="cuda").to(dtype)
    _check_support_and_values(x, mvue24(x, dim=0, seed=5, variant=variant), 0, rtol=RTOL[dtype])
    x = torch.randn(1030, 4100, device="cuda").to(dtype)
    _check_support_and_values(x, mvue24(x, dim=1, seed=5, variant=variant), 1, rtol=RTOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dim", [0, -1])
def test_mvue_unbiased_on_gpu_with_many_draws(dim, variant):
    gen = torch.Generator(device="cuda")
    x_seed = gen.seed()  # fresh inputs each run, the seed kept for the message
    x = torch.randn(16, 64, device="cuda", generator=gen)
    x = x if dim == -1 else x.t().contiguous()
    _unbiasedness(x, dim, draws=40000, seed=3, variant=variant, block=512, note=f"x from generator seed {x_seed}")


@pytest.mark.filterwarnings("default")
def test_baseline_variants_warn_and_the_default_does_not():
    import warnings

    from benchmarks.baselines import mvue24 as baselines

    x = torch.randn(8, 16, device=DEVICE)
    for variant in baselines.BASELINE_VARIANTS:
        with pytest.warns(UserWarning, match="measurement baseline"):
            baselines.mvue24(x, variant=variant)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        baselines.mvue24(x)
        shipped_mvue24(x)
    assert baselines.SHIPPED_VARIANT == "level_philox4"


def test_the_shipped_kernel_is_one_kernel_with_no_variants():
    """The package ships the chosen kernel only: no variant argument, no baseline module."""
    import importlib.util

    assert "variant" not in inspect.signature(shipped_mvue24).parameters
    for name in ("mvue24_v2", "mvue24_variants"):
        assert importlib.util.find_spec(f"sparsity_lab.kernels.{name}") is None


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("block,warps", [(None, None), (16, None), (1024, 2)])
def test_the_shipped_kernel_draws_what_the_measured_level_philox4_draws(dim, block, warps):
    """The baselines' "level_philox4" runs the shipped kernel; the shipped function's defaults come from
    its LAUNCH table and give the same draws as any other block (counter-based)."""
    x = torch.randn(32, 64).to(torch.bfloat16).to(DEVICE)
    got = shipped_mvue24(x, dim=dim, seed=5, block=block, num_warps=warps)
    assert torch.equal(got, mvue24(x, dim=dim, seed=5, variant="level_philox4"))


def test_the_shipped_kernel_names_a_bad_block():
    x = torch.randn(8, 16, device=DEVICE)
    for block in (2, 24):
        with pytest.raises(ValueError, match="block must be a power of two >= 4"):
            shipped_mvue24(x, block=block)


@pytest.mark.parametrize("dim,variant", [(0, "level_philox4"), (-1, "level_philox4"), (0, "level"), (-1, "level"),
                                         (0, "level_philox4_tile16")])  # tile16 groups along dim 0 only
def test_a_seed_read_from_device_memory_draws_what_the_int_draws(dim, variant):
    """The CUDA-graph path: the seed as a 0-d int64 tensor (read by the kernel) gives the same result."""
    x = torch.randn(64, 96).to(torch.bfloat16).to(DEVICE)
    seed = 987654
    as_int = mvue24(x, dim=dim, seed=seed, variant=variant)
    as_tensor = mvue24(x, dim=dim, seed=torch.tensor(seed, device=DEVICE), variant=variant)
    assert torch.equal(as_int, as_tensor)
    assert not torch.equal(as_int, mvue24(x, dim=dim, seed=torch.tensor(seed + 1, device=DEVICE), variant=variant))


def test_a_seed_tensor_must_be_a_0d_int64_on_the_device():
    x = torch.randn(8, 16).to(DEVICE)
    with pytest.raises(ValueError, match="0-d int64"):
        mvue24(x, seed=torch.tensor([1], device=DEVICE))
    with pytest.raises(ValueError, match="0-d int64"):
        mvue24(x, seed=torch.tensor(1, dtype=torch.int32, device=DEVICE))
