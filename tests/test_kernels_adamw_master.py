"""Kernel 20 (AdamW on float32 masters from bf16 gradients, bf16 weights written back) against its reference."""
import pytest
import torch
from _kernel_testing import DEVICE, AdamwMagnitudes, assert_close_ulp

from sparsity_lab.kernels.adamw_master import adamw_master_
from sparsity_lab.references.adamw_master import adamw_master_step_

HYPER = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)


def _state(shapes, seed):
    gen = torch.Generator().manual_seed(seed)
    masters = [torch.randn(s, generator=gen) for s in shapes]
    return {"masters": masters, "lows": [m.to(torch.bfloat16) for m in masters],
            "exp_avgs": [torch.zeros(s) for s in shapes], "exp_avg_sqs": [torch.zeros(s) for s in shapes]}


def _to(state, device):
    return {k: [x.to(device) for x in v] for k, v in state.items()}


@pytest.mark.parametrize("block", [16, 1024])
def test_three_steps_of_tensors_of_several_sizes_equal_the_reference(block):
    shapes = [(7,), (33, 5), (16, 12), (3, 40)] if block == 16 else [(7,), (64, 48), (3, 1000)]
    ref, got = _state(shapes, 0), _to(_state(shapes, 0), DEVICE)
    mags = [AdamwMagnitudes() for _ in shapes]
    for step in (1, 2, 3):
        gen = torch.Generator().manual_seed(10 + step)
        grads = [torch.randn(s, generator=gen).to(torch.bfloat16) for s in shapes]
        for i in range(len(shapes)):
            before = (ref["masters"][i].clone(), ref["exp_avgs"][i].clone())
            adamw_master_step_(ref["lows"][i], grads[i], ref["masters"][i], ref["exp_avgs"][i], ref["exp_avg_sqs"][i],
                               step=step, **HYPER)
            mags[i].add(*before, grads[i], ref["masters"][i], 1 - HYPER["lr"] * HYPER["weight_decay"], HYPER["beta1"])
        adamw_master_(got["lows"], [g.to(DEVICE) for g in grads], got["masters"], got["exp_avgs"],
                      got["exp_avg_sqs"], step=step, block=block, **HYPER)
    for name in ("masters", "exp_avgs", "exp_avg_sqs"):
        for a, e, mag in zip(got[name], ref[name], mags):
            if DEVICE.type == "cpu":  # the interpreter computes in numpy float32, op for op as the reference
                assert torch.equal(a, e), name
            else:  # the GPU may contract a * b + c into one fused multiply-add (AdamwMagnitudes says what it bounds)
                atol = mag.masters_atol(HYPER["lr"]) if name == "masters" else 1e-12
                assert_close_ulp(a.cpu(), e, ulps=4, scale=getattr(mag, name, e.abs()) + e.abs(), atol=atol)
    for low, master in zip(got["lows"], got["masters"]):
        assert torch.equal(low, master.to(torch.bfloat16))  # the bf16 weight: its own master, rounded


def test_the_bf16_weight_is_the_master_rounded_to_nearest_even_ties_nan_and_inf_included():
    one = torch.tensor(1.0).view(torch.int32).item()
    ties = torch.tensor([one + 0x8000, one + 0x18000, -(2**31) + one + 0x8000], dtype=torch.int32).view(torch.float32)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 3.0e38, 1e-40, -1e-40])
    master = torch.cat([ties, special, torch.randn(50)])
    low = torch.zeros(master.shape, dtype=torch.bfloat16, device=DEVICE)
    zeros = [torch.zeros(master.shape, device=DEVICE) for _ in range(2)]
    adamw_master_([low], [torch.zeros_like(low)], [master.to(DEVICE)], zeros[:1], zeros[1:],
                  step=1, lr=0.0, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0)  # lr 0: the master unchanged
    low = low.cpu()
    expected = master.to(torch.bfloat16)
    nan = expected.isnan()
    assert torch.equal(low.isnan(), nan)
    assert torch.equal(low[~nan].view(torch.int16), expected[~nan].view(torch.int16))  # bit for bit, -0 included


def test_bad_inputs_name_the_argument():
    s = _to(_state([(8, 4)], 0), DEVICE)
    g = [torch.zeros(8, 4, dtype=torch.bfloat16, device=DEVICE)]
    kw = dict(step=1, **HYPER)
    with pytest.raises(ValueError, match="one entry per weight"):
        adamw_master_(s["lows"], g + g, s["masters"], s["exp_avgs"], s["exp_avg_sqs"], **kw)
    with pytest.raises(TypeError, match=r"grads\[0\] must be torch.bfloat16"):
        adamw_master_(s["lows"], [g[0].float()], s["masters"], s["exp_avgs"], s["exp_avg_sqs"], **kw)
    with pytest.raises(ValueError, match=r"exp_avgs\[0\] must be contiguous"):
        adamw_master_(s["lows"], g, s["masters"], [torch.zeros(4, 8, device=DEVICE).t()], s["exp_avg_sqs"], **kw)
    with pytest.raises(ValueError, match=r"grads\[0\] has shape"):
        adamw_master_(s["lows"], [g[0][:4]], s["masters"], s["exp_avgs"], s["exp_avg_sqs"], **kw)
    with pytest.raises(ValueError, match="step must be >= 1"):
        adamw_master_(s["lows"], g, s["masters"], s["exp_avgs"], s["exp_avg_sqs"], **{**kw, "step": 0})
    with pytest.raises(ValueError, match="power of two"):
        adamw_master_(s["lows"], g, s["masters"], s["exp_avgs"], s["exp_avg_sqs"], block=100, **HYPER | {"step": 1})


def _with_ties(shape, seed):
    """Masters holding bf16 rounding ties and signed zeros among random values: the decay's W must be the
    master rounded to nearest even, as the bf16 weight is."""
    gen = torch.Generator().manual_seed(seed)
    master = torch.randn(shape, generator=gen)
    one = torch.tensor(1.0).view(torch.int32).item()
    ties = torch.tensor([one + 0x8000, one + 0x18000, -(2**31) + one + 0x8000], dtype=torch.int32).view(torch.float32)
    flat = master.view(-1)
    flat[:3], flat[3], flat[4] = ties, -0.0, 0.0
    return master


@pytest.mark.parametrize("decay", [2e-4, 0.5])
def test_masked_decay_in_the_pass_equals_the_reference_and_leaves_other_weights_alone(decay):
    shapes = [(33, 8), (16, 12), (5,)]
    gen = torch.Generator().manual_seed(3)
    masters = [_with_ties(s, i) for i, s in enumerate(shapes)]
    masks = [torch.rand(s, generator=gen) < 0.5 for s in shapes]
    ref = {"masters": [m.clone() for m in masters], "lows": [m.to(torch.bfloat16) for m in masters],
           "exp_avgs": [torch.zeros(s) for s in shapes], "exp_avg_sqs": [torch.zeros(s) for s in shapes]}
    got = _to(ref, DEVICE)
    ref = {k: [x.clone() for x in v] for k, v in ref.items()}
    mags = [AdamwMagnitudes() for _ in shapes]
    for step in (1, 2):
        grads = [(torch.randn(s, generator=gen) * 1e-3).to(torch.bfloat16) for s in shapes]
        for i in range(len(shapes)):
            before = (ref["masters"][i].clone(), ref["exp_avgs"][i].clone())
            # the decayed gradient's magnitude: |g| + decay |W| where pruned
            g_mag = grads[i].float().abs() + (decay * (~masks[i]) * ref["lows"][i].float().abs() if i < 2 else 0)
            # the computed sums g + decay W (pruned entries; the kept ones take g as it is, exactly)
            g_eff = torch.where(~masks[i], grads[i].float() + decay * ref["lows"][i].float(), torch.inf)
            adamw_master_step_(ref["lows"][i], grads[i], ref["masters"][i], ref["exp_avgs"][i], ref["exp_avg_sqs"][i],
                               step=step, **HYPER, **({"mask": masks[i], "decay": decay} if i < 2 else {}))
            mags[i].add(*before, g_mag, ref["masters"][i], 1 - HYPER["lr"] * HYPER["weight_decay"], HYPER["beta1"],
                        effective_grad=g_eff if i < 2 else None, eps=HYPER["eps"])
        adamw_master_(got["lows"], [g.to(DEVICE) for g in grads], got["masters"], got["exp_avgs"], got["exp_avg_sqs"],
                      step=step, block=16, masked_decays={0: (masks[0].to(DEVICE), decay), 1: (masks[1].to(DEVICE), decay)},
                      **HYPER)
    for name in ("masters", "exp_avgs", "exp_avg_sqs"):
        for a, e, mag in zip(got[name], ref[name], mags):
            if DEVICE.type == "cpu":
                assert torch.equal(a, e), name
            else:
                atol = mag.masters_atol(HYPER["lr"]) if name == "masters" else 1e-12
                assert_close_ulp(a.cpu(), e, ulps=4, scale=getattr(mag, name, e.abs()) + e.abs(), atol=atol)
    # the decay reached the pruned entries' first moments only: (1 - beta1) * decay * W after one step is there
    plain = _to({"masters": [masters[0].clone()], "lows": [masters[0].to(torch.bfloat16)],
                 "exp_avgs": [torch.zeros(shapes[0])], "exp_avg_sqs": [torch.zeros(shapes[0])]}, DEVICE)
    adamw_master_(plain["lows"], [torch.zeros(shapes[0], dtype=torch.bfloat16, device=DEVICE)], plain["masters"],
                  plain["exp_avgs"], plain["exp_avg_sqs"], step=1, masked_decays={0: (masks[0].to(DEVICE), decay)},
                  **HYPER)
    m1 = plain["exp_avgs"][0].cpu()
    assert torch.equal(m1[masks[0]], torch.zeros_like(m1[masks[0]]))
    w = masters[0].to(torch.bfloat16).float()[~masks[0]]
    torch.testing.assert_close(m1[~masks[0]], 0.1 * decay * w, rtol=1e-6, atol=0)


def test_bad_masked_decays_name_the_argument():
    s = _to(_state([(8, 4)], 0), DEVICE)
    g = [torch.zeros(8, 4, dtype=torch.bfloat16, device=DEVICE)]
    kw = dict(step=1, **HYPER)
    mask = torch.ones(8, 4, dtype=torch.bool, device=DEVICE)
    with pytest.raises(ValueError, match="key 1 is not the index"):
        adamw_master_(s["lows"], g, s["masters"], s["exp_avgs"], s["exp_avg_sqs"], masked_decays={1: (mask, 0.1)}, **kw)
    with pytest.raises(TypeError, match=r"masked_decays\[0\]'s mask must be a torch.bool"):
        adamw_master_(s["lows"], g, s["masters"], s["exp_avgs"], s["exp_avg_sqs"], masked_decays={0: (mask.float(), 0.1)},
                      **kw)
    with pytest.raises(ValueError, match=r"masked_decays\[0\]'s mask must be contiguous"):
        adamw_master_(s["lows"], g, s["masters"], s["exp_avgs"], s["exp_avg_sqs"], masked_decays={0: (mask[:4], 0.1)},
                      **kw)
    with pytest.raises(TypeError, match="a \\(mask, decay\\) pair"):
        adamw_master_(s["lows"], g, s["masters"], s["exp_avgs"], s["exp_avg_sqs"], masked_decays={0: mask}, **kw)
    with pytest.raises(TypeError, match="decay must be a number"):
        adamw_master_(s["lows"], g, s["masters"], s["exp_avgs"], s["exp_avg_sqs"], masked_decays={0: (mask, "x")}, **kw)
