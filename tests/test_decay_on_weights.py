"""Masked decay on gradients against masked decay on weights (Hu et al. 2024's contrast), and SR-STE.

    on gradients (MaskedDecay):          g <- clip(g) + lambda (1 - m) W, then AdamW (it normalises the term)
    on weights (MaskedDecayOnWeights):   AdamW step with g, then W <- W - lr lambda (1 - m) W
    SR-STE:                              g <- g + lambda (1 - m) W in the backward, then clipping, then AdamW

The tests that would have caught a lesson calling the contrast "before vs after clipping": with AdamW
and a tiny loss gradient the on-gradients term moves the pruned weights by about lr per step whatever
lambda_W is, while the on-weights term moves them by lr * lambda_W * |w|.
"""
import json

import pytest
from _lab_testing import CLI_TINY, tiny_corpus_file
import torch

import sparsity_lab as sl
from sparsity_lab.lab.decay_placement import PLACEMENT_METHODS, pruned_weight_steps, where_decay_lands

DECAY = 0.5


def make(method, seed=0):
    torch.manual_seed(seed)
    layer = sl.SparseLinear(16, 8, method=method)
    return layer, torch.randn(6, 16)


def test_on_weights_update_with_sgd_is_the_step_then_the_decay():
    lr = 0.1
    layer, x = make(sl.MaskedDecayOnWeights(decay=DECAY, total_steps=100))
    opt = torch.optim.SGD(layer.parameters(), lr=lr)
    sl.attach_optimizer(layer, opt)
    (layer(x) ** 2).sum().backward()
    torch.nn.utils.clip_grad_norm_(layer.parameters(), max_norm=0.1)
    w0, g, mask = layer.weight.detach().clone(), layer.weight.grad.clone(), layer.mask.clone()
    opt.step()
    stepped = w0 - lr * g
    torch.testing.assert_close(layer.weight.detach(), stepped - lr * DECAY * stepped * ~mask)
    assert torch.equal(layer.weight.grad, g)  # the gradient the optimizer read carries no term
    assert layer.step == 1


def test_adam_never_sees_the_term_on_weights():
    """AdamW's moments after one step equal those of plain STE; with the term on gradients they do not."""
    def moments(method):
        layer, x = make(method)
        opt = torch.optim.AdamW(layer.parameters(), lr=1e-2)
        sl.attach_optimizer(layer, opt)
        (layer(x) ** 2).sum().backward()
        opt.step()
        return opt.state[layer.weight]["exp_avg"], opt.state[layer.weight]["exp_avg_sq"]

    ste = moments(sl.STE())
    on_weights = moments(sl.MaskedDecayOnWeights(decay=DECAY, total_steps=100))
    on_grads = moments(sl.MaskedDecay(decay=DECAY, total_steps=100))
    assert all(torch.equal(a, b) for a, b in zip(ste, on_weights))
    assert not torch.equal(ste[0], on_grads[0])


@pytest.mark.parametrize("decay", [1e-3, 1e-1])
def test_adam_normalises_the_term_on_gradients_but_not_on_weights(decay):
    lr = 1e-3
    grads = pruned_weight_steps("masked_decay", decay, lr=lr, steps=5)
    weights = pruned_weight_steps("masked_decay_weights", decay, lr=lr, steps=5)
    # on gradients: about lr per step, whatever lambda_W is (Adam divides the term by its own RMS)
    assert 0.9 < grads["step_over_lr"] < 1.01
    # on weights: lr * lambda_W * |w|, exactly what the decoupled update says
    assert weights["step_over_lr"] == pytest.approx(weights["decay_over_lr"], rel=1e-3)
    assert weights["step_over_lr"] < 0.1 * grads["step_over_lr"]


def test_step_on_gradients_does_not_scale_with_lambda_but_on_weights_does():
    small, large = (pruned_weight_steps("masked_decay", d)["step_over_lr"] for d in (1e-3, 1e-1))
    assert large / small == pytest.approx(1.0, abs=0.02)
    small, large = (pruned_weight_steps("masked_decay_weights", d)["step_over_lr"] for d in (1e-3, 1e-1))
    assert large / small == pytest.approx(100.0, rel=0.02)


@pytest.mark.parametrize("method", PLACEMENT_METHODS)
def test_where_the_term_lands(method):
    r = where_decay_lands(method, decay=0.05, max_norm=0.01, seed=1)
    assert r["clipped"] and 0 < r["clip_factor"] < 1
    expected = {"srste": (True, False, False, True), "masked_decay": (False, True, False, True),
                "masked_decay_weights": (False, False, True, False), "ste": (False, False, False, False)}[method]
    got = (r["added_in_backward"], r["added_after_clip"], r["added_on_weights"], r["adam_sees_term"])
    assert got == expected
    if method == "srste":  # the term went through clipping: it reaches AdamW scaled by the clip factor
        assert torch.allclose(r["at_step"], r["clip_factor"] * r["after_backward"])


def test_lr_comes_from_the_weights_param_group_and_follows_the_scheduler():
    layer, x = make(sl.MaskedDecayOnWeights(decay=DECAY, total_steps=100))
    opt = torch.optim.SGD([{"params": [layer.weight], "lr": 0.2}, {"params": [layer.bias], "lr": 5.0}], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)
    sl.attach_optimizer(layer, opt)
    for lr in (0.2, 0.1):
        opt.zero_grad()
        layer(x).sum().backward()
        w0, g, mask = layer.weight.detach().clone(), layer.weight.grad.clone(), layer.mask.clone()
        opt.step()
        sched.step()
        stepped = w0 - lr * g
        torch.testing.assert_close(layer.weight.detach(), stepped - lr * DECAY * stepped * ~mask)


def test_grad_scaler_skipped_step_applies_no_decay():
    layer, x = make(sl.MaskedDecayOnWeights(decay=DECAY, total_steps=100))
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    sl.attach_optimizer(layer, opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    w0 = layer.weight.detach().clone()
    scaler.scale((layer(x) ** 2).sum() * float("inf")).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(layer.weight.detach(), w0) and layer.step == 0


def test_fused_optimizer_skipped_step_applies_no_decay():
    layer, x = make(sl.MaskedDecayOnWeights(decay=DECAY, total_steps=100))
    opt = torch.optim.SGD(layer.parameters(), lr=0.1, fused=True)
    sl.attach_optimizer(layer, opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    w0 = layer.weight.detach().clone()
    scaler.scale((layer(x) ** 2).sum() * float("inf")).backward()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(layer.weight.detach(), w0) and layer.step == 0
    opt.zero_grad()  # a good step afterwards decays as usual
    scaler.scale((layer(x) ** 2).sum()).backward()
    g = layer.weight.grad.clone() / scaler.get_scale()
    mask = layer.mask.clone()
    scaler.step(opt)
    stepped = w0 - 0.1 * g
    torch.testing.assert_close(layer.weight.detach(), stepped - 0.1 * DECAY * stepped * ~mask, rtol=1e-5, atol=1e-6)
    assert layer.step == 1


def test_no_decay_in_the_dense_finetune_phase():
    layer, x = make(sl.MaskedDecayOnWeights(decay=DECAY, total_steps=6))  # dense from step 5
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    sl.attach_optimizer(layer, opt)
    for step in range(6):
        opt.zero_grad()
        layer(x).sum().backward()
        w0, g = layer.weight.detach().clone(), layer.weight.grad.clone()
        dense = layer.dense_now
        opt.step()
        if dense:
            torch.testing.assert_close(layer.weight.detach(), w0 - 0.1 * g)
    assert dense and step == 5


def test_manual_loop_helper():
    layer, x = make(sl.MaskedDecayOnWeights(decay=DECAY, total_steps=100))
    w0, mask = layer.weight.detach().clone(), layer.mask.clone()
    sl.apply_decay_on_weights(layer, 0.1)
    torch.testing.assert_close(layer.weight.detach(), w0 - 0.1 * DECAY * w0 * ~mask)
    sl.apply_masked_decay(layer)  # the on-gradients hook does nothing for this method
    assert layer.weight.grad is None


def test_names_and_config():
    m = sl.method_from_name("masked_decay_weights", total_steps=12)
    assert isinstance(m, sl.MaskedDecayOnWeights) and m.dense_finetune_step == 10
    assert sl.method_from_name("MaskedDecayOnWeights", total_steps=12) == m
    assert m.decay_after_step == 6e-5 and m.decay_before_step == 0.0 and m.decay_in_backward == 0.0
    assert "on weights" in m.describe() and "on gradients" in sl.MaskedDecay(total_steps=6).describe()
    with pytest.raises(ValueError, match="decay must be"):
        sl.MaskedDecayOnWeights(decay=-1.0, total_steps=6)
    with pytest.raises(ValueError, match="needs total_steps"):
        sl.MaskedDecayOnWeights()


# --- everywhere the methods are: the lab's train, compare, decay grid and decay search ---------------
LAB_TINY = CLI_TINY


@pytest.fixture
def text(tmp_path):
    return tiny_corpus_file(tmp_path)


def test_lab_train_and_compare_take_the_method(tmp_path, text, capsys):
    from sparsity_lab.lab.cli import main
    from sparsity_lab.lab.runlog import read_log
    out = tmp_path / "run"
    assert main(["train", "--method", "masked_decay_weights", "--decay", "0.1", *LAB_TINY, "--data", text,
                 "--steps", "6", "--out", str(out)]) == 0
    rows = read_log(out / "log.jsonl")
    assert [r["dense_phase"] for r in rows] == [False] * 5 + [True]  # the fine-tune switch at 5/6
    assert main(["compare", "--variants", "ste,masked_decay_weights", "--decay", "0.1", *LAB_TINY, "--data", text,
                 "--steps", "6", "--out", str(tmp_path / "cmp")]) == 0
    result = json.loads((tmp_path / "cmp" / "results.json").read_text())
    described = {r["variant"]: r["method"] for r in result["table"]}
    assert "decay 0.1 on weights" in described["masked_decay_weights"]


def test_decay_grid_and_search_take_the_method(tmp_path, text):
    from sparsity_lab.lab import GPTConfig, TrainConfig, load_corpus
    from sparsity_lab.lab.decay_grid import run_decay_grid
    from sparsity_lab.lab.decay_search import search_decay
    base = TrainConfig(model=GPTConfig(n_layer=1, n_head=2, d_model=16, context=16), batch_size=4, steps=6,
                       warmup_steps=2, eval_interval=3, eval_batches=1, device="cpu", progress=False, data=text)
    corpus = load_corpus(text, min_split_bytes=17)
    # lr * lambda = 0.1: pruned weights shrink by 10 % a step, and fewer of them climb back into the mask
    grid = run_decay_grid(base, [0.0, 100.0], method="masked_decay_weights", corpus=corpus, dense_reference=False)
    assert [c.status for c in grid.curves()] == ["ok", "ok"]
    assert sum(grid.runs[100.0].flip_rate[1:]) < sum(grid.runs[0.0].flip_rate[1:])
    result = search_decay(base, grid=[1e-2, 1.0], trial_steps=3, method="masked_decay_weights")
    assert result["method"] == "masked_decay_weights" and result["chosen"]["decay"] in (1e-2, 1.0)
    with pytest.raises(ValueError, match="method must be one of"):
        search_decay(base, grid=[1e-2], trial_steps=3, method="srste")


def test_optimizer_subclass_calling_super_step_decays_the_weights_once():
    """A subclass whose step() calls super().step() runs the hooks at both levels: the decay on weights
    must still be applied once per optimizer step."""
    class LoggingSGD(torch.optim.SGD):
        def step(self, closure=None):
            return super().step(closure)

    lr = 0.1
    layer, x = make(sl.MaskedDecayOnWeights(decay=DECAY, total_steps=100))
    opt = LoggingSGD(layer.parameters(), lr=lr)
    sl.attach_optimizer(layer, opt)
    layer(x).sum().backward()
    w0, g, mask = layer.weight.detach().clone(), layer.weight.grad.clone(), layer.mask.clone()
    opt.step()
    stepped = w0 - lr * g
    torch.testing.assert_close(layer.weight.detach(), stepped - lr * DECAY * stepped * ~mask)
    assert layer.step == 1
