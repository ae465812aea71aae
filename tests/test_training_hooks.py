"""Where masked decay lands in an optimizer step, and the step counters the hooks drive.

With SGD(lr=1, momentum=0) the applied update W_before - W_after is exactly the gradient the
optimizer used, so the placement of the decay is read off directly:
    masked decay (Hu et al. 2024):  update = clip(unscale(g)) + lambda (1 - m) W
    SR-STE (in the backward):       update = clip(unscale(g + lambda (1 - m) W))
"""
import pytest
import torch
import torch.nn.functional as F

import sparsity_lab as sl

DECAY = 0.5


def make(method, seed=0):
    torch.manual_seed(seed)
    layer = sl.SparseLinear(16, 8, method=method)
    x = torch.randn(6, 16)
    return layer, x


def loss_of(layer, x):
    return (layer(x) ** 2).sum()


def test_masked_decay_after_clipping_before_step():
    layer, x = make(sl.MaskedDecay(decay=DECAY, total_steps=100))
    opt = torch.optim.SGD(layer.parameters(), lr=1.0, momentum=0.0)
    sl.attach_optimizer(layer, opt)
    loss_of(layer, x).backward()
    w0, mask = layer.weight.detach().clone(), layer.mask.clone()
    g_raw, g_raw_bias = layer.weight.grad.clone(), layer.bias.grad.clone()
    norm = torch.nn.utils.clip_grad_norm_(layer.parameters(), max_norm=0.1)
    assert float(norm) > 1.0  # clipping is active
    g_clipped = layer.weight.grad.clone()
    opt.step()
    update = w0 - layer.weight.detach()
    decay_term = DECAY * w0 * ~mask
    torch.testing.assert_close(update, g_clipped + decay_term, rtol=1e-6, atol=1e-7)
    # not clip(grad + decay): the decay would have been shrunk along with the gradient
    summed = g_raw + decay_term
    wrong = summed * (0.1 / float(torch.sqrt(summed.pow(2).sum() + g_raw_bias.pow(2).sum())))
    assert float((update - wrong).abs().max()) > 0.5 * float(decay_term.abs().max())
    assert layer.step == 1


def test_srste_decay_is_clipped_with_the_gradient():
    """The contrast: SR-STE's term is already in .grad when clip_grad_norm_ runs."""
    layer, x = make(sl.SRSTE(decay=DECAY))
    opt = torch.optim.SGD(layer.parameters(), lr=1.0)
    sl.attach_optimizer(layer, opt)
    loss_of(layer, x).backward()
    w0 = layer.weight.detach().clone()
    torch.nn.utils.clip_grad_norm_(layer.parameters(), max_norm=0.1)
    g_clipped = layer.weight.grad.clone()
    opt.step()
    torch.testing.assert_close(w0 - layer.weight.detach(), g_clipped)  # nothing added at the step


def test_masked_decay_with_grad_scaler_unscaled_then_clipped():
    layer, x = make(sl.MaskedDecay(decay=DECAY, total_steps=100))
    opt = torch.optim.SGD(layer.parameters(), lr=1.0)
    sl.attach_optimizer(layer, opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(loss_of(layer, x)).backward()
    g_scaled = layer.weight.grad.clone()
    scaler.unscale_(opt)
    torch.testing.assert_close(layer.weight.grad * 1024.0, g_scaled)
    torch.nn.utils.clip_grad_norm_(layer.parameters(), max_norm=0.1)
    g_clipped = layer.weight.grad.clone()
    w0, mask = layer.weight.detach().clone(), layer.mask.clone()
    scaler.step(opt)
    scaler.update()
    torch.testing.assert_close(w0 - layer.weight.detach(), g_clipped + DECAY * w0 * ~mask, rtol=1e-6, atol=1e-7)
    assert layer.step == 1


def test_grad_scaler_inf_skips_step_decay_and_counters():
    layer, x = make(sl.MaskedDecay(decay=DECAY, total_steps=100, mask_refresh_interval=1))
    opt = torch.optim.SGD(layer.parameters(), lr=1.0)
    sl.attach_optimizer(layer, opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    w0 = layer.weight.detach().clone()
    scaler.scale(loss_of(layer, x) * float("inf")).backward()
    scaler.unscale_(opt)
    g_before = layer.weight.grad.clone()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() < 1024.0  # the scaler saw the inf
    assert torch.equal(layer.weight.detach(), w0)
    torch.testing.assert_close(layer.weight.grad, g_before, equal_nan=True, rtol=0, atol=0)  # no decay added
    assert layer.step == 0 and layer.mask_updates == 1


def test_fused_optimizer_under_grad_scaler_gets_matching_decay():
    """A fused optimizer receives still-scaled gradients (it unscales inside its kernel): the decay
    must be scaled to match, and an inf step must not advance the counters."""
    layer, x = make(sl.MaskedDecay(decay=DECAY, total_steps=100))
    opt = torch.optim.SGD(layer.parameters(), lr=1.0, fused=True)
    sl.attach_optimizer(layer, opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    scaler.scale(loss_of(layer, x)).backward()
    g = layer.weight.grad.clone() / 256.0
    w0, mask = layer.weight.detach().clone(), layer.mask.clone()
    scaler.step(opt)
    scaler.update()
    torch.testing.assert_close(w0 - layer.weight.detach(), g + DECAY * w0 * ~mask, rtol=1e-5, atol=1e-6)
    assert layer.step == 1

    opt.zero_grad()
    w1 = layer.weight.detach().clone()
    scaler.scale(loss_of(layer, x) * float("inf")).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(layer.weight.detach(), w1)
    assert layer.step == 1  # skipped: no advance


@pytest.mark.parametrize("total_steps", [12, 9])
def test_dense_finetune_switch(total_steps):
    """MaskedDecay(total_steps=T) runs dense from step round(5/6 T) (0-based): the forward uses W,
    the decay stops, masks stop, and AdamW's state carries on across the switch."""
    switch = round(5 / 6 * total_steps)
    method = sl.MaskedDecay(decay=DECAY, total_steps=total_steps)
    assert method.dense_finetune_step == switch
    layer, _ = make(method, seed=1)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-2, weight_decay=0.0)
    sl.attach_optimizer(layer, opt)
    exp_avg = None
    for step in range(total_steps):
        x = torch.randn(4, 16)
        opt.zero_grad()
        y = layer(x)
        w = layer.weight.detach().clone()
        dense_y = F.linear(x, w, layer.bias.detach())
        sparse_y = F.linear(x, w * layer.mask, layer.bias.detach())
        if step < switch:
            assert not layer.dense_now
            torch.testing.assert_close(y, sparse_y, rtol=0, atol=1e-6)
            assert float((y.detach() - dense_y).abs().max()) > 1e-3
        else:
            assert layer.dense_now
            assert torch.equal(y, dense_y)
        y.pow(2).sum().backward()
        g_raw, mask = layer.weight.grad.clone(), layer.mask.clone()
        mask_updates = layer.mask_updates
        opt.step()
        added = layer.weight.grad - g_raw  # what the pre-hook added before the update
        if step < switch:
            torch.testing.assert_close(added, DECAY * w * ~mask)
        else:
            assert torch.equal(added, torch.zeros_like(added))
            assert layer.mask_updates == mask_updates
        state = opt.state[layer.weight]
        if exp_avg is None:
            exp_avg = state["exp_avg"]
        assert state["exp_avg"] is exp_avg  # the same state tensors, never reset
    assert int(opt.state[layer.weight]["step"]) == total_steps
    assert layer.step == total_steps and layer.dense_now


@pytest.mark.parametrize("total_steps", [1, 2, 3, 6, 7, 100, 10_000])
def test_switch_step_is_five_sixths(total_steps):
    method = sl.MaskedDecay(total_steps=total_steps)
    assert method.dense_finetune_step == round(5 * total_steps / 6)
    assert sl.MaskedDecay(total_steps=total_steps, dense_finetune_at=None).dense_finetune_step is None


def test_dense_finetune_without_total_steps_is_an_error():
    with pytest.raises(ValueError, match="dense_finetune_at=.*needs total_steps"):
        sl.MaskedDecay()
    with pytest.raises(ValueError, match="needs total_steps"):
        sl.STE(dense_finetune_at=0.5)
    assert sl.MaskedDecay(dense_finetune_at=None).dense_finetune_step is None


def test_attach_twice_is_an_error_and_remove_detaches():
    layer, x = make(sl.STE())
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    handle = sl.attach_optimizer(layer, opt)
    with pytest.raises(ValueError, match="already have an optimizer attached"):
        sl.attach_optimizer(layer, opt)
    loss_of(layer, x).backward()
    opt.step()
    assert layer.step == 1
    handle.remove()
    with pytest.warns(UserWarning, match="no optimizer is attached"):
        loss_of(layer, x).backward()
    opt.step()
    assert layer.step == 1  # no longer advanced
    sl.attach_optimizer(layer, opt)  # attaching again after remove() is fine
    opt.step()
    assert layer.step == 2


def test_manual_loop_helpers():
    """Loops without a torch optimizer: apply_masked_decay then advance_step."""
    layer, x = make(sl.MaskedDecay(decay=DECAY, total_steps=100))
    model = torch.nn.Sequential(layer)
    with pytest.warns(UserWarning, match="no optimizer is attached"):  # expected: nothing attached here
        loss_of(layer, x).backward()
    g, w, mask = layer.weight.grad.clone(), layer.weight.detach().clone(), layer.mask.clone()
    sl.apply_masked_decay(model)
    torch.testing.assert_close(layer.weight.grad, g + DECAY * w * ~mask)
    sl.advance_step(model)
    assert layer.step == 1
