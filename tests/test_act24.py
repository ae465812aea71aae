"""2:4 squared-ReLU activations: the reference, the lab's Act24MLP, the trainer and CLI options."""
import math
import warnings
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from _lab_testing import CLI_TINY, tiny_config, without_speed

import sparsity_lab as sl
import sparsity_lab.activation24
from sparsity_lab.activation24 import (Act24FallbackWarning, Act24MLP, act24_modules, activation_backend, fc_only,
                                       weight_selector)
from sparsity_lab.backends.torch_reference import TorchBackend
from sparsity_lab.lab.activation_stats import ActivationSparsityTracker, relu2_sparsity
from sparsity_lab.flops import gpt_config_flops_per_token
from sparsity_lab.lab import GPTConfig, Trainer, load_corpus
from sparsity_lab.references.act24 import (Act24Down, Act24FFN, act24, act24_grad, natural_24_stats, relu2,
                                           top2of4_mask)

RELU2 = GPTConfig(n_layer=2, n_head=2, d_model=16, context=16, ffn_kind="relu2")
ACT24 = GPTConfig(n_layer=2, n_head=2, d_model=16, context=16, ffn_kind="relu2", activation_sparsity="2:4")


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(max_bytes=100_000)


# --- the reference ---------------------------------------------------------------------------------
def test_top2of4_keeps_the_two_largest_ties_to_the_lowest_index_nan_first():
    a = torch.tensor([[1.0, 1, 1, 1, 0, 3, 2, 3, 0, 0, 0, 0, float("nan"), 5, 1, 0, -4, 1, 2, 3]])
    assert top2of4_mask(a).int().tolist() == [[1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 1, 0, 0, 1]]
    x = torch.randn(7, 12)
    m = top2of4_mask(x)
    assert (m.reshape(7, 3, 4).sum(-1) == 2).all()
    kept = x.abs().reshape(7, 3, 4)
    # every kept magnitude is >= every pruned one of its group
    mk = m.reshape(7, 3, 4)
    assert bool((kept.masked_fill(~mk, math.inf).amin(-1) >= kept.masked_fill(mk, -math.inf).amax(-1)).all())


def test_act24_is_relu2_times_its_mask_and_refuses_bad_shapes():
    h = torch.randn(5, 16)
    a24, mask = act24(h)
    assert torch.equal(a24, relu2(h) * mask)
    assert ((a24 != 0).reshape(5, 4, 4).sum(-1) <= 2).all()
    with pytest.raises(ValueError, match="divisible by 4"):
        act24(torch.randn(3, 6))
    with pytest.raises(TypeError, match="floating-point"):
        act24(torch.ones(4, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="grad_a24 has shape"):
        act24_grad(h, h[:, :8])


def test_act24_down_backward_equals_autograd_through_the_detached_mask():
    torch.manual_seed(0)
    h = torch.randn(6, 5, 32, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(8, 32, dtype=torch.float64, requires_grad=True)
    b2 = torch.randn(8, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(6, 5, 8, dtype=torch.float64)
    got = torch.autograd.grad(Act24Down.apply(h, w2, b2), (h, w2, b2), dy)
    a = relu2(h)
    want = torch.autograd.grad(F.linear(a * top2of4_mask(a).detach(), w2, b2), (h, w2, b2), dy)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    # the straight-through gradient lives on the kept entries only
    assert bool(((got[0] != 0) <= top2of4_mask(a)).all())


def test_act24_ffn_dense_twin_is_the_plain_relu2_ffn():
    torch.manual_seed(0)
    ffn = Act24FFN(8, 32, sparse=False)
    x = torch.randn(3, 8)
    assert torch.equal(ffn(x), ffn.down(F.relu(ffn.up(x)) ** 2))
    ffn.sparse = True
    assert not torch.allclose(ffn(x), ffn.down(F.relu(ffn.up(x)) ** 2))
    with pytest.raises(ValueError, match="divisible by 4"):
        Act24FFN(8, 30)


def test_natural_stats_count_zeros_and_groups():
    a = torch.tensor([[0.0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0]])
    stats = natural_24_stats(a)
    assert stats["zero_fraction"] == pytest.approx(6 / 12)
    assert stats["groups_at_most_2_fraction"] == pytest.approx(2 / 3)
    h = torch.tensor([[-1.0, -2, 0, 1, 1, 1, -3, -0.5, 1, 1, 1, -1]])  # same pattern as a, from H
    assert relu2_sparsity(h).tolist() == pytest.approx([0.5, 2 / 3])


# --- Act24MLP --------------------------------------------------------------------------------------
def _copy_into(mlp, ffn):
    mlp.fc.load_state_dict(ffn.up.state_dict())
    mlp.proj.load_state_dict(ffn.down.state_dict())


@pytest.mark.parametrize("bias", [False, True])
def test_act24_mlp_equals_the_reference_ffn(bias):
    torch.manual_seed(1)
    ffn, mlp = Act24FFN(8, 32, bias=bias).double(), Act24MLP(8, 32, bias=bias).double()
    _copy_into(mlp, ffn)
    x = torch.randn(2, 7, 8, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 7, 8, dtype=torch.float64)
    want = torch.autograd.grad(ffn(x), (x, *ffn.parameters()), dy)
    got = torch.autograd.grad(mlp(x), (x, *mlp.parameters()), dy)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_combined_mlp_puts_2_4_weights_on_fc_only_and_matches_autograd():
    torch.manual_seed(2)
    model = torch.nn.Sequential()
    model.add_module("mlp", Act24MLP(16, 64).double())
    sl.sparsify(model, sl.STE(), select=fc_only)
    sl.attach_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.0))
    assert [name for name, _ in sl.sparse_layers(model)] == ["mlp.fc"]
    fc, proj = model.mlp.fc, model.mlp.proj
    x = torch.randn(5, 16, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(5, 16, dtype=torch.float64)
    got = torch.autograd.grad(model(x), (x, fc.weight, proj.weight), dy)
    w_ste = fc.weight + (fc.weight * fc.mask - fc.weight).detach()  # STE: dW reaches the dense W1 unchanged
    h = F.linear(x, w_ste)
    a = relu2(h)
    want = torch.autograd.grad(F.linear(a * top2of4_mask(a).detach(), proj.weight), (x, fc.weight, proj.weight), dy)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bias", [False, True])
def test_both_linears_2_4_and_activations_2_4_match_autograd(bias):
    """proj 2:4 too: y = A24 S(W2)^T, dA24 = dY S(W2), dW2 = dY^T A24 (STE), dW1 through S(W1)."""
    torch.manual_seed(3)
    model = torch.nn.Sequential()
    model.add_module("mlp", Act24MLP(16, 64, bias=bias).double())
    sl.sparsify(model, sl.STE(transposable=True), select=weight_selector)
    sl.attach_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.0))
    assert [name for name, _ in sl.sparse_layers(model)] == ["mlp.fc", "mlp.proj"]
    fc, proj = model.mlp.fc, model.mlp.proj
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 5, 16, dtype=torch.float64)
    params = (x, *model.parameters())
    got = torch.autograd.grad(model(x), params, dy)

    def ste(layer):
        return layer.weight + (layer.weight * layer.mask - layer.weight).detach()
    a = relu2(F.linear(x, ste(fc), fc.bias))
    y = F.linear(a * top2of4_mask(a).detach(), ste(proj), proj.bias)
    want = torch.autograd.grad(y, params, dy)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_cusparselt_products_fall_back_visibly_on_cpu():
    with pytest.warns(Act24FallbackWarning, match="need a CUDA GPU"):
        backend = activation_backend("cusparselt", 64, torch.device("cpu"))
    assert isinstance(backend, TorchBackend)
    assert isinstance(activation_backend("torch", 60, torch.device("cpu")), TorchBackend)


# --- model, flops, trainer, CLI ----------------------------------------------------------------------
def test_config_relu2_hidden_flops_and_errors():
    assert RELU2.hidden == 64
    flops_relu2 = gpt_config_flops_per_token(RELU2)["ffn"]
    flops_gelu = gpt_config_flops_per_token(GPTConfig(n_layer=2, n_head=2, d_model=16, context=16))["ffn"]
    assert flops_relu2 == flops_gelu  # two linears, not a gated three
    with pytest.raises(ValueError, match="needs ffn_kind='relu2'"):
        GPTConfig(activation_sparsity="2:4")
    with pytest.raises(ValueError, match="activation_sparsity must be one of"):
        GPTConfig(ffn_kind="relu2", activation_sparsity="50%")
    model = sl.lab.GPT(ACT24)
    assert len(act24_modules(model)) == 2


def test_trainer_combined_dense_tail_stats_and_exact_resume(tmp_path, corpus, one_thread):
    cfg = dict(method="ste", method_options={"dense_finetune_at": 0.5}, steps=8)
    straight = Trainer(tiny_config(ACT24, **cfg), corpus=corpus)
    assert [n for n, _ in straight.layers] == [f"blocks.{i}.mlp.{p}" for i in (0, 1) for p in ("fc", "proj")]
    straight.run()
    mods = [m for _, m in act24_modules(straight.model)]
    assert all(int(m.step) == 8 and int(m.dense_from) == 4 and not m.sparse_now for m in mods)
    measured = [r for r in straight.history if r["val_loss"] is not None]
    assert measured and all(0.0 <= r["act_zero"] <= 1.0 and 0.0 <= r["act_le2"] <= 1.0 for r in measured)
    assert all("act_zero/blocks.1.mlp" in r for r in measured)
    assert all("act_zero" not in r for r in straight.history if r["val_loss"] is None)
    ckpt = tmp_path / "ck.pt"
    first = Trainer(tiny_config(ACT24, **cfg, checkpoint_path=str(ckpt)), corpus=corpus)
    first.run(stop_at=3)
    first.close()
    resumed = Trainer.resume(ckpt, corpus=corpus)
    assert all(m.sparse_now and int(m.step) == 3 for _, m in act24_modules(resumed.model))
    saved, loaded = first.model.state_dict(), resumed.model.state_dict()
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    resumed.run()
    assert without_speed(resumed.history) == without_speed(straight.history[3:])


def test_activation_sparsity_changes_training_and_structures_are_refused(corpus):
    dense = Trainer(tiny_config(RELU2, method="dense", steps=3), corpus=corpus)
    act = Trainer(tiny_config(ACT24, method="dense", steps=3), corpus=corpus)
    dense.run()
    act.run()
    assert not act.layers[0][1].method.sparse_forward  # weights dense: activation sparsity alone
    assert dense.history[-1]["loss"] != act.history[-1]["loss"]  # the prune changes the products
    with pytest.raises(ValueError, match="not with the structure"):
        Trainer(tiny_config(ACT24, method="dyad", steps=3), corpus=corpus)


def test_cli_refuses_activation_sparsity_without_relu2(tmp_path, capsys):
    from sparsity_lab.lab.cli import main
    code = main(["train", *CLI_TINY, "--steps", "1", "--activation-sparsity", "2:4", "--out", str(tmp_path / "r")])
    assert code == 2
    assert "needs ffn_kind='relu2'" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("mvue", [False, True])
def test_all_products_on_cusparselt_match_the_reference_backend_on_gpu(mvue):
    """Act24MLP with 2:4 weights on both linears, products on cuSPARSELt, against the same model on the
    reference backend and products (same weights, same masks, same MVUE draws where the backends share
    them): y, dx and the weight gradients within bf16 error."""
    from sparsity_lab.backends import get_backend

    runs = []
    for backend in ("cusparselt", "triton"):
        torch.manual_seed(0)
        model = torch.nn.Sequential()
        model.add_module("mlp", Act24MLP(256, 1024))
        model = model.cuda().to(torch.bfloat16)
        sl.sparsify(model, sl.STE(transposable=True, mvue=mvue, backend=backend), select=weight_selector)
        sl.attach_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.0))
        model.mlp.backend = get_backend("cusparselt" if backend == "cusparselt" else "torch")
        gen = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
        dy = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
        y = model(x)
        y.backward(dy)
        runs.append([y.float(), x.grad.float(), model.mlp.fc.weight.grad.float(), model.mlp.proj.weight.grad.float()])
    for fast, ref in zip(*runs):
        assert float((fast - ref).norm() / ref.norm()) < 2e-2


def test_parallel_training_refuses_activation_sparsity():
    from sparsity_lab.lab.distributed_trainer import DistributedTrainer
    with pytest.raises(ValueError, match="runs on one process"):
        DistributedTrainer(tiny_config(ACT24, method="ste"), "ddp")


@pytest.mark.parametrize("weight_grads", ["dense", "tokens24"])
@pytest.mark.parametrize("sparse_weights", [False, True], ids=["dense_weights", "sparse_weights"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("shape", [(0, 16), (2, 0, 16)], ids=["no_rows", "no_tokens"])
def test_an_empty_batch_gives_an_empty_output_like_a_dense_ffn(backend, sparse_weights, weight_grads, shape):
    torch.manual_seed(0)
    model = torch.nn.Sequential(OrderedDict(mlp=Act24MLP(16, 64)))
    if sparse_weights:
        sl.sparsify(model, sl.STE(backend=backend), select=weight_selector)
    sl.activation24.configure_activation_sparsity(model, backend, weight_grads=weight_grads)
    x = torch.randn(*shape, requires_grad=True)
    dense = model.mlp.proj(relu2(model.mlp.fc(x)))
    y = model(x)
    assert y.shape == dense.shape == (*shape[:-1], 16)
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())  # no token, no gradient
    assert model.mlp._token_draws == 0  # and no permutation drawn
