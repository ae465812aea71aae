"""Resume: a fresh model loaded from a state_dict continues bitwise identically.

All sparse state (mask, beta as buffers; step, mask_step, flip counts, MVUE seed and draw counter
as extra state) must travel in ``state_dict()``, including through torch.save / torch.load with
weights_only=True.
"""
import copy
import io
import math
from collections import OrderedDict

import pytest
import torch
from torch import nn

import sparsity_lab as sl

METHODS = {
    "sste_mvue_interval2": sl.SSTE(mvue=True, mask_refresh_interval=2),
    "masked_decay_crosses_switch": sl.MaskedDecay(decay=1e-2, total_steps=8, mask_refresh_interval=3),
    "masked_decay_weights_crosses_switch": sl.MaskedDecayOnWeights(decay=1e-1, total_steps=8),
    "ste_transposable": sl.STE(transposable=True),
    "srste": sl.SRSTE(decay=1e-2),
    "dense_tracking": sl.Dense(),
}
COUNTERS = ("step", "mask_step", "mask_updates", "last_flips", "flips_total", "mvue_seed", "mvue_calls")


class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(OrderedDict(c_fc=nn.Linear(16, 32), act=nn.GELU(), c_proj=nn.Linear(32, 16)))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(x + self.mlp(x))


def build(method, seed):
    torch.manual_seed(seed)
    model = sl.sparsify(TinyMLP(), method)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-2)
    sl.attach_optimizer(model, opt)
    return model, opt


def batches(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 5, 16, generator=gen) for _ in range(n)]


def run_steps(model, opt, xs):
    """Per step: (output, every parameter gradient, every mask) as recorded tensors."""
    trace = []
    for x in xs:
        opt.zero_grad()
        y = model(x)
        y.pow(2).mean().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        masks = [layer.mask.clone() for _, layer in sl.sparse_layers(model)]
        opt.step()
        trace.append((y.detach().clone(), grads, masks))
    return trace


def assert_same_sparse_state(a, b):
    for (name, la), (_, lb) in zip(sl.sparse_layers(a), sl.sparse_layers(b)):
        assert torch.equal(la.mask, lb.mask), name
        assert torch.equal(la.beta, lb.beta), name
        for counter in COUNTERS:
            assert getattr(la, counter) == getattr(lb, counter), (name, counter)


def assert_same_trace(ta, tb):
    for step, ((ya, ga, ma), (yb, gb, mb)) in enumerate(zip(ta, tb)):
        assert torch.equal(ya, yb), step
        assert all(torch.equal(u, v) for u, v in zip(ga, gb)), step
        assert all(torch.equal(u, v) for u, v in zip(ma, mb)), step


def through_file(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("name", list(METHODS))
@pytest.mark.parametrize("via_file", [False, True], ids=["in_memory", "torch_save"])
def test_resume_is_bitwise_identical(name, via_file):
    method = METHODS[name]
    a, opt_a = build(method, seed=0)
    run_steps(a, opt_a, batches(5, seed=1))
    layer_a = sl.sparse_layers(a)[0][1]
    assert layer_a.step == 5
    assert layer_a.mask_updates >= 2  # flips have been counted
    if method.mvue:
        assert layer_a.mvue_calls == 5

    checkpoint = {"model": a.state_dict(), "optimizer": opt_a.state_dict()}
    # deepcopy: Optimizer.load_state_dict keeps the very state tensors it is given (same dtype and
    # device), so without a copy both optimizers would update one shared exp_avg
    checkpoint = through_file(checkpoint) if via_file else copy.deepcopy(checkpoint)
    b, opt_b = build(method, seed=123)  # different weights, masks, beta and MVUE seed
    assert not torch.equal(sl.sparse_layers(b)[0][1].weight, layer_a.weight)
    assert sl.sparse_layers(b)[0][1].mvue_seed != layer_a.mvue_seed
    b.load_state_dict(checkpoint["model"])
    opt_b.load_state_dict(checkpoint["optimizer"])

    assert_same_sparse_state(a, b)
    report_a, report_b = sl.flip_report(a), sl.flip_report(b)
    assert report_a.keys() == report_b.keys()
    for key in report_a:  # NaN (fewer than two masks) must stay NaN
        assert report_a[key] == report_b[key] or (math.isnan(report_a[key]) and math.isnan(report_b[key]))

    more = batches(4, seed=2)
    assert_same_trace(run_steps(a, opt_a, more), run_steps(b, opt_b, more))
    assert_same_sparse_state(a, b)
    if isinstance(method, sl.MaskedDecay):
        assert all(layer.dense_now for _, layer in sl.sparse_layers(b))  # crossed the switch at step 7


def test_state_dict_keys_hold_the_sparse_state():
    model, _ = build(sl.SSTE(), seed=0)
    keys = set(model.state_dict())
    for prefix in ("mlp.c_fc", "mlp.c_proj"):
        assert {f"{prefix}.weight", f"{prefix}.bias", f"{prefix}.mask", f"{prefix}.beta",
                f"{prefix}._extra_state"} <= keys
    extra = model.state_dict()["mlp.c_fc._extra_state"]
    assert set(extra) == set(COUNTERS) and all(isinstance(v, int) for v in extra.values())


def test_beta_is_restored_not_recomputed():
    """beta belongs to the checkpoint: a loaded model must not keep the beta of its own init."""
    a, _ = build(sl.SSTE(), seed=0)
    b, _ = build(sl.SSTE(), seed=1)
    beta_a = sl.sparse_layers(a)[0][1].beta.clone()
    assert not torch.equal(beta_a, sl.sparse_layers(b)[0][1].beta)
    b.load_state_dict(a.state_dict())
    assert torch.equal(sl.sparse_layers(b)[0][1].beta, beta_a)
