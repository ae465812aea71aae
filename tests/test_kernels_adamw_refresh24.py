"""Kernel 25 (a 2:4 weight's AdamW step and its mask refresh in one pass) against the two kernels it fuses, kernel 20
(``adamw_master_``, itself tested against the plain PyTorch AdamW reference) and kernel 21 (``refresh24``, tested
against the unfused mask chain and the plain references) run on the updated weight."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE, assert_close_ulp

from sparsity_lab.kernels import adamw_master_, refresh24
from sparsity_lab.kernels.adamw_refresh24 import adamw_refresh24_

HYPER = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)


def _state(shape, seed, magnitude="plain"):
    """(low, grad, master, exp_avg, exp_avg_sq, previous mask) on DEVICE; ``magnitude`` "ties" makes many equal
    magnitudes in every group (the search's tie rule), "range" spreads them over many binades."""
    gen = torch.Generator().manual_seed(seed)
    master = torch.randn(shape, generator=gen) * 0.02
    if magnitude == "ties":
        master = torch.sign(master) * 0.01 * torch.randint(1, 3, shape, generator=gen)
    elif magnitude == "range":
        master = master * torch.pow(2.0, torch.randint(-30, 30, shape, generator=gen).float())
    grad = (torch.randn(shape, generator=gen) * 1e-3).to(torch.bfloat16)
    if magnitude == "ties":
        grad = torch.zeros(shape, dtype=torch.bfloat16)  # the tied magnitudes survive the update
    exp_avg = torch.randn(shape, generator=gen) * 1e-4
    exp_avg_sq = torch.rand(shape, generator=gen) * 1e-6
    previous = torch.rand(shape, generator=gen) < 0.5
    return [t.to(DEVICE) for t in (master.to(torch.bfloat16), grad, master, exp_avg, exp_avg_sq, previous)]


def _check_against_the_two_kernels(shape, seed, beta, step=3, count=True, forward=True, transposed=True,
                                   magnitude="plain"):
    fused = _state(shape, seed, magnitude)
    apart = [t.clone() for t in fused]
    low, grad, master, exp_avg, exp_avg_sq, mask = fused
    flips, fwd, bwd = adamw_refresh24_(low, grad, master, exp_avg, exp_avg_sq, mask, beta, step=step, count=count,
                                       forward=forward, transposed=transposed, **HYPER)
    a_low, a_grad, a_master, a_exp_avg, a_exp_avg_sq, a_mask = apart
    adamw_master_([a_low], [a_grad], [a_master], [a_exp_avg], [a_exp_avg_sq], step=step, **HYPER)
    for got, want in ((master, a_master), (exp_avg, a_exp_avg), (exp_avg_sq, a_exp_avg_sq)):
        if DEVICE.type == "cpu":  # the interpreter runs both in numpy float32, op for op
            assert torch.equal(got, want)
        else:  # the GPU may contract a * b + c differently in the two kernels
            assert_close_ulp(got.cpu(), want.cpu(), ulps=4, atol=1e-12)
    # the bf16 weight is the master rounded to nearest, and the refresh is kernel 21's on that weight
    assert torch.equal(low, master.to(torch.bfloat16))
    previous = a_mask.clone()
    ref_flips, ref_fwd, ref_bwd = refresh24(low, a_mask, beta, out_dtype=torch.bfloat16, forward=forward,
                                            transposed=transposed, count=count)
    assert torch.equal(mask, a_mask)
    assert (flips is None) == (not count)
    if count:
        assert flips.dtype == torch.int64 and flips.dim() == 0
        assert int(flips) == int(ref_flips) == int((mask != previous).sum())
    for got, want in ((fwd, ref_fwd), (bwd, ref_bwd)):
        assert (got is None) == (want is None)
        if got is not None:
            assert got.shape == want.shape and torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@settings(max_examples=5, deadline=None)
@given(shape=st.sampled_from([(64, 64), (64, 128), (128, 64)]), soft=st.booleans(), count=st.booleans(),
       forms=st.sampled_from([(True, True), (True, False), (False, True)]), seed=st.integers(0, 2**16),
       step=st.integers(1, 1000))
def test_equals_kernel_20_then_kernel_21_on_fresh_inputs(shape, soft, count, forms, seed, step):
    beta = torch.tensor(0.87, device=DEVICE) if soft else None
    _check_against_the_two_kernels(shape, seed, beta, step=step, count=count, forward=forms[0], transposed=forms[1])


@pytest.mark.parametrize("magnitude", ["ties", "range"])
def test_adversarial_magnitudes(magnitude):
    _check_against_the_two_kernels((64, 64), 5, 1.25, magnitude=magnitude)


def test_non_finite_master_stays_nan_in_the_bf16_weight():
    low, grad, master, exp_avg, exp_avg_sq, mask = _state((64, 64), 1)
    master[0, :3] = float("nan")
    adamw_refresh24_(low, grad, master, exp_avg, exp_avg_sq, mask, None, step=1, **HYPER)
    assert torch.isnan(low[0, :3].float()).all()


def test_bad_inputs_are_refused_naming_the_argument():
    low, grad, master, exp_avg, exp_avg_sq, mask = _state((64, 64), 2)
    with pytest.raises(TypeError, match="grad must be torch.bfloat16"):
        adamw_refresh24_(low, grad.float(), master, exp_avg, exp_avg_sq, mask, step=1, **HYPER)
    with pytest.raises(ValueError, match="exp_avg has shape"):
        adamw_refresh24_(low, grad, master, exp_avg[:, :32].contiguous(), exp_avg_sq, mask, step=1, **HYPER)
    with pytest.raises(ValueError, match="master must be contiguous"):
        adamw_refresh24_(low, grad, master.t(), exp_avg, exp_avg_sq, mask, step=1, **HYPER)
    odd = _state((64, 96), 3)
    with pytest.raises(ValueError, match="multiples of 64"):
        adamw_refresh24_(*odd[:5], odd[5], step=1, **HYPER)
    with pytest.raises(ValueError, match="step must be >= 1"):
        adamw_refresh24_(low, grad, master, exp_avg, exp_avg_sq, mask, step=0, **HYPER)
    with pytest.raises(ValueError, match="mask must be contiguous"):
        adamw_refresh24_(low, grad, master, exp_avg, exp_avg_sq, mask.t(), step=1, **HYPER)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4096, 16384), (16384, 4096), (12288, 4096)])
def test_equals_the_two_kernels_at_the_lab_gpt_sizes_on_gpu(shape):
    _check_against_the_two_kernels(shape, 11, torch.tensor(0.93, device=DEVICE))
