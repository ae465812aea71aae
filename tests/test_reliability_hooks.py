"""attach_optimizer's hooks run once per optimizer step, whatever the optimizer's class hierarchy.

PyTorch runs step pre/post hooks once per class level whose ``step`` calls ``super().step()``;
before the fix masked decay was added twice and the counters advanced twice per step there.
"""
import pytest
import torch
from torch import nn

import sparsity_lab as sl


class SubAdamW(torch.optim.AdamW):
    def step(self, closure=None):
        return super().step(closure)


class SubSubAdamW(SubAdamW):
    def step(self, closure=None):
        return super().step(closure)


def _model():
    torch.manual_seed(0)
    model = nn.Sequential()
    model.mlp = nn.Linear(16, 8)
    # a large decay (a doubled one shows in the weights) and a dense fine-tune switch at step 3
    return sl.sparsify(model, sl.MaskedDecay(decay=0.05, total_steps=6, dense_finetune_at=0.5))


def _train(opt_cls, steps=5, scaler=False, **opt_kwargs):
    model = _model()
    opt = opt_cls(model.parameters(), lr=1e-2, **opt_kwargs)
    sl.attach_optimizer(model, opt)
    gs = torch.amp.GradScaler("cpu", init_scale=1024.0) if scaler else None
    gen = torch.Generator().manual_seed(1)
    trace = []
    for _ in range(steps):
        loss = model(torch.randn(4, 16, generator=gen)).square().sum()
        if gs is None:
            loss.backward()
            opt.step()
        else:
            gs.scale(loss).backward()
            gs.step(opt)
            gs.update()
        opt.zero_grad()
        trace.append((model.mlp.step, model.mlp.dense_now))
    return model.mlp.weight.detach().clone(), trace


@pytest.fixture(autouse=True)
def _hook_base_step():
    # the doubled hooks need AdamW.step itself wrapped, which PyTorch does on the first AdamW built
    torch.optim.AdamW([nn.Parameter(torch.zeros(1))])
    SubAdamW([nn.Parameter(torch.zeros(1))])


@pytest.mark.parametrize("opt_cls", [SubAdamW, SubSubAdamW], ids=["subclass", "subclass-of-subclass"])
@pytest.mark.parametrize("mode", ["plain", "fused", "gradscaler", "fused+gradscaler"])
def test_hooks_run_once_per_step(opt_cls, mode):
    kwargs = {"fused": True} if "fused" in mode else {}
    scaler = "gradscaler" in mode
    ref_w, ref_trace = _train(torch.optim.AdamW, scaler=scaler, **kwargs)
    w, trace = _train(opt_cls, scaler=scaler, **kwargs)
    assert [s for s, _ in trace] == [1, 2, 3, 4, 5], "the step counter must advance once per optimizer step"
    assert [d for _, d in trace] == [False, False, True, True, True], "dense fine-tune switch at step 3"
    assert trace == ref_trace
    assert torch.equal(w, ref_w), "masked decay must be added once per step, as with the plain optimizer"


def test_nested_hook_calls_decay_once_and_count_once():
    model = _model()
    opt = SubAdamW(model.parameters(), lr=1e-2)
    handle = sl.attach_optimizer(model, opt)
    model(torch.randn(4, 16)).sum().backward()
    grad = model.mlp.weight.grad
    handle._before_step(opt)
    once = grad.clone()
    handle._before_step(opt)  # a nested level: the same gradient, untouched
    assert torch.equal(grad, once)
    handle._after_step(opt)
    handle._after_step(opt)  # the outer level's post-hook
    assert model.mlp.step == 1
