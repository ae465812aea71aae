"""Kernel 26 (kernel 20's AdamW step writing kernel 11's compressed operands too) against the two kernels apart and
the plain-PyTorch AdamW reference."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _kernel_testing import DEVICE, AdamwMagnitudes, assert_close_ulp

from sparsity_lab.kernels import prepare24, transposable_mask24
from sparsity_lab.kernels.adamw_prepare24 import adamw_master_prepare24_
from sparsity_lab.references.adamw_master import adamw_master_step_

HYPER = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)


def _bytes(t):
    return t.contiguous().view(torch.uint8).reshape(-1)


def _weight_state(rows, cols, gen, adversarial):
    master = torch.randn(rows, cols, generator=gen)
    if adversarial:  # bf16 rounding ties, signed zeros, a huge and a tiny magnitude, equal magnitudes in a group
        one = torch.tensor(1.0).view(torch.int32).item()
        flat = master.view(-1)
        flat[:3] = torch.tensor([one + 0x8000, one + 0x18000, -(2**31) + one + 0x8000], dtype=torch.int32).view(
            torch.float32)
        flat[3], flat[4], flat[5], flat[6] = -0.0, 0.0, 3.0e38, 1e-40
        flat[8:12] = torch.tensor([0.5, -0.5, 0.5, -0.5])
    return {"master": master, "low": master.to(torch.bfloat16), "exp_avg": torch.zeros(rows, cols),
            "exp_avg_sq": torch.zeros(rows, cols)}


def _on(state, device):
    return {k: v.to(device) for k, v in state.items()}


@settings(max_examples=10, deadline=None)
@given(row_tiles=st.integers(1, 3), col_tiles=st.integers(1, 3), soft=st.booleans(), with_decay=st.booleans(),
       adversarial=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_two_steps_equal_the_adamw_reference_and_kernel_11_of_the_new_weight(row_tiles, col_tiles, soft, with_decay,
                                                                            adversarial, seed):
    gen = torch.Generator().manual_seed(seed)
    rows, cols = 64 * row_tiles, 64 * col_tiles
    ref = _weight_state(rows, cols, gen, adversarial)
    got = _on(ref, DEVICE)
    ref = {k: v.clone() for k, v in ref.items()}
    mask = transposable_mask24(got["low"], pruned=False)[0]
    beta = torch.tensor(0.5 + torch.rand((), generator=gen).item(), device=DEVICE) if soft else None
    decay = 2e-2 if with_decay else None
    mags = AdamwMagnitudes()
    for step in (1, 2):
        grad = (torch.randn(rows, cols, generator=gen) * 1e-2).to(torch.bfloat16)
        before = (ref["master"].clone(), ref["exp_avg"].clone())
        g_mag = grad.float().abs() + (decay * (~mask.cpu()) * ref["low"].float().abs() if with_decay else 0)
        # the computed sums g + decay W (pruned entries; the kept ones take g as it is, exactly)
        g_eff = torch.where(~mask.cpu(), grad.float() + (decay or 0.0) * ref["low"].float(), torch.inf)
        adamw_master_step_(ref["low"], grad, ref["master"], ref["exp_avg"], ref["exp_avg_sq"], step=step, **HYPER,
                           **({"mask": mask.cpu(), "decay": decay} if with_decay else {}))
        mags.add(*before, g_mag, ref["master"], 1 - HYPER["lr"] * HYPER["weight_decay"], HYPER["beta1"],
                 effective_grad=g_eff if with_decay else None, eps=HYPER["eps"])
        fwd, bwd = adamw_master_prepare24_(got["low"], grad.to(DEVICE), got["master"], got["exp_avg"],
                                           got["exp_avg_sq"], mask, beta, step=step, decay=decay, **HYPER)
        fwd_ref, bwd_ref = prepare24(got["low"], mask, beta)  # kernel 11 reading the bf16 weight just written
        assert torch.equal(_bytes(fwd), _bytes(fwd_ref)) and torch.equal(_bytes(bwd), _bytes(bwd_ref)), step
    for name in ("master", "exp_avg", "exp_avg_sq"):
        if DEVICE.type == "cpu":  # the interpreter computes in numpy float32, op for op as the reference
            assert torch.equal(got[name].cpu(), ref[name]), name
        else:  # the GPU may contract a * b + c into one fused multiply-add (AdamwMagnitudes says what it bounds)
            scale = {"master": mags.masters, "exp_avg": mags.exp_avgs}.get(name, 0.0) + ref[name].abs()
            atol = mags.masters_atol(HYPER["lr"]) if name == "master" else 1e-12
            assert_close_ulp(got[name].cpu(), ref[name], ulps=4, scale=scale, atol=atol)
    if not isinstance(mags.near_zero, bool):  # the allowance stays the exception: a wrong step would be everywhere
        assert int(mags.near_zero.sum()) <= max(8, rows * cols // 100)
    assert torch.equal(got["low"].cpu().view(torch.int16), got["master"].cpu().to(torch.bfloat16).view(torch.int16))


def test_the_operands_decode_to_the_soft_threshold_of_the_new_weight():
    """The compressed S(W) decodes to beta * soft_threshold(W_new, mask), W_new the bf16 weight after the step."""
    from sparsity_lab.methods.soft_threshold import soft_threshold
    from sparsity_lab.references.cusparselt_layout import decompress24_reference

    gen = torch.Generator().manual_seed(5)
    state = _on(_weight_state(64, 128, gen, adversarial=False), DEVICE)
    mask = transposable_mask24(state["low"], pruned=False)[0]
    grad = torch.randn(64, 128, generator=gen).to(torch.bfloat16).to(DEVICE)
    fwd, bwd = adamw_master_prepare24_(state["low"], grad, state["master"], state["exp_avg"], state["exp_avg_sq"],
                                       mask, 1.25, step=1, **HYPER)
    w = state["low"].cpu().float()
    expected = (1.25 * soft_threshold(w, mask.cpu())).to(torch.bfloat16)
    if DEVICE.type == "cpu":  # the interpreter truncates float32 -> bf16 where PyTorch rounds: compare in float32
        torch.testing.assert_close(decompress24_reference(fwd.cpu(), 64, 128).float(), expected.float(), rtol=2**-7,
                                   atol=0)
    else:
        assert torch.equal(decompress24_reference(fwd.cpu(), 64, 128), expected)
    torch.testing.assert_close(decompress24_reference(bwd.cpu(), 128, 64).float(), expected.t().float(), rtol=2**-7,
                               atol=0)


def test_bad_inputs_name_the_argument():
    gen = torch.Generator().manual_seed(0)
    s = _on(_weight_state(64, 64, gen, adversarial=False), DEVICE)
    g = torch.zeros(64, 64, dtype=torch.bfloat16, device=DEVICE)
    mask = torch.ones(64, 64, dtype=torch.bool, device=DEVICE)

    def call(**over):
        args = {"low": s["low"], "grad": g, "master": s["master"], "exp_avg": s["exp_avg"],
                "exp_avg_sq": s["exp_avg_sq"], "mask": mask, "beta": None} | over
        adamw_master_prepare24_(**args, step=1, **HYPER)

    with pytest.raises(TypeError, match="grad must be torch.bfloat16"):
        call(grad=g.float())
    with pytest.raises(TypeError, match="mask must be torch.bool"):
        call(mask=mask.to(torch.uint8))
    with pytest.raises(ValueError, match="exp_avg must be contiguous"):
        call(exp_avg=torch.zeros(64, 64, device=DEVICE).t())
    with pytest.raises(ValueError, match="grad has shape"):
        call(grad=g[:32])
    odd = _on(_weight_state(64, 96, gen, adversarial=False), DEVICE)
    with pytest.raises(ValueError, match="multiples of 64"):
        adamw_master_prepare24_(odd["low"], odd["low"], odd["master"], odd["exp_avg"], odd["exp_avg_sq"],
                                torch.ones(64, 96, dtype=torch.bool, device=DEVICE), None, step=1, **HYPER)
    with pytest.raises(ValueError, match="beta must be a floating-point scalar"):
        call(beta=torch.ones(2, device=DEVICE))
    with pytest.raises(TypeError, match="decay must be a number"):
        adamw_master_prepare24_(s["low"], g, s["master"], s["exp_avg"], s["exp_avg_sq"], mask, None, step=1,
                                decay="0.1", **HYPER)
    with pytest.raises(ValueError, match="step must be >= 1"):
        adamw_master_prepare24_(s["low"], g, s["master"], s["exp_avg"], s["exp_avg_sq"], mask, None, step=0, **HYPER)
