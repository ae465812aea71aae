"""Weight gradients of 2:4 activations made 2:4 along permuted tokens: the reference
(``references.act24_tokens``) and Act24MLP's ``weight_grads="tokens24"`` option."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsity_lab as sl
from sparsity_lab import activation24
from sparsity_lab.activation24 import Act24MLP, configure_activation_sparsity, fc_only, permutation_seed, weight_selector
from sparsity_lab.backends.torch_reference import TorchBackend
from _lab_testing import without_speed
from sparsity_lab.references.act24 import act24, act24_grad
from sparsity_lab.references.act24_tokens import (dense_feature_count, dense_features, tokens24_dropped,
                                                  tokens24_kept, tokens24_weight_grad, top2of4_tokens_mask)


# --- an independent, slow statement of the rule ------------------------------------------------
def brute_kept(a: torch.Tensor, perm: torch.Tensor, dense_count: int) -> torch.Tensor:
    """Column by column, group by group: D = most non-zeros (lowest index on ties) kept whole; else the
    2 largest |a| of each group of 4 permuted tokens (lowest permuted position on ties, NaN first)."""
    tokens, hidden = a.shape
    counts = [int((a[:, j] != 0).sum()) for j in range(hidden)]
    dense = sorted(range(hidden), key=lambda j: (-counts[j], j))[:dense_count]
    kept = torch.zeros_like(a)
    for j in range(hidden):
        if j in dense:
            kept[:, j] = a[:, j]
            continue
        for start in range(0, tokens, 4):
            rows = perm[start:start + 4].tolist()
            def rank_key(pos):
                v = a[rows[pos], j].abs().item()
                return (0 if v != v else 1, -v if v == v else 0, pos)
            for pos in sorted(range(len(rows)), key=rank_key)[:2]:
                kept[rows[pos], j] = a[rows[pos], j]
    return kept


def _fresh(tokens, hidden, kind, gen, dtype=torch.float64):
    a = torch.randn(tokens, hidden, generator=gen, dtype=torch.float64)
    if kind == "ties":  # few distinct magnitudes, both signs
        a = torch.randint(-2, 3, (tokens, hidden), generator=gen).double()
    elif kind == "zeros":  # squared-ReLU-like: mostly exact zeros, some features dense
        a = torch.relu(a - 1.0) ** 2
        a[:, : max(1, hidden // 8)] = torch.rand(tokens, max(1, hidden // 8), generator=gen, dtype=torch.float64) + 0.1
    elif kind == "wide":  # magnitudes over many decades
        a = a * torch.exp(20 * torch.randn(tokens, hidden, generator=gen, dtype=torch.float64))
    return a.to(dtype)


# --- the reference -------------------------------------------------------------------------------
def test_dense_feature_count_rounds_up_and_to_the_tile():
    assert dense_feature_count(1024, 0.05) == 52           # ceil(51.2)
    assert dense_feature_count(100, 0.07) == 7             # 0.07 * 100 = 7.000000000000001 in floats
    assert dense_feature_count(1024, 0.05, multiple=64) == 64  # |S| = 960, a multiple of 64
    assert dense_feature_count(1024, 0.0, multiple=64) == 0
    assert dense_feature_count(96, 0.05, multiple=64) == 32 and dense_feature_count(40, 0.05, multiple=64) == 40
    assert dense_feature_count(16, 1.0) == 16
    for bad in (-0.1, 1.5, float("nan"), "0.1", True):
        with pytest.raises(ValueError, match="dense_fraction"):
            dense_feature_count(16, bad)
    with pytest.raises(ValueError, match="hidden"):
        dense_feature_count(0, 0.1)
    with pytest.raises(ValueError, match="multiple"):
        dense_feature_count(16, 0.1, multiple=0)


def test_dense_features_are_the_most_active_columns_ties_to_the_lowest_index():
    a = torch.tensor([[1.0, 0, 2, 0, 5], [1, 0, 0, 3, 5], [0, 0, 1, 3, 0]])  # counts 2, 0, 2, 2, 2
    dense, sparse = dense_features(a, 2)
    assert dense.tolist() == [0, 2] and sparse.tolist() == [1, 3, 4]
    assert dense_features(a, 0)[0].tolist() == [] and dense_features(a, 5)[1].tolist() == []
    with pytest.raises(ValueError, match="dense_count"):
        dense_features(a, 6)


def test_top2_along_tokens_keeps_two_per_group_ties_low_and_pads_the_last_group():
    b = torch.tensor([[1.0, 3], [1, -3], [1, 0], [1, 4], [0, 2], [-5, 0]])  # 6 tokens: groups of 4 and 2
    assert top2of4_tokens_mask(b).int().tolist() == [[1, 1], [1, 0], [0, 0], [0, 1], [1, 1], [1, 1]]


def test_exact_when_already_2_4_along_the_permuted_tokens_outside_the_dense_features():
    gen = torch.Generator().manual_seed(0)
    tokens, hidden, k = 23, 12, 5
    a = torch.randint(-3, 4, (tokens, hidden), generator=gen).double()
    a[a == 0] = 1
    perm = torch.randperm(tokens, generator=gen)
    dense_cols = [2, 7, 9]
    for j in range(hidden):  # outside D: at most 2 non-zeros in every group of 4 permuted tokens
        if j not in dense_cols:
            for start in range(0, tokens, 4):
                group = perm[start:start + 4]
                drop = group[torch.randperm(len(group), generator=gen)[2:]]
                a[drop, j] = 0
    g = torch.randint(-3, 4, (tokens, k), generator=gen).double()
    assert dense_features(a, 3)[0].tolist() == dense_cols
    got = tokens24_weight_grad(a, g, perm, 3)
    assert torch.equal(got, a.t() @ g)  # integers: no rounding anywhere
    assert tokens24_dropped(a, perm, 3) == {"mass_fraction": 0.0, "count_fraction": 0.0, "dropped": 0,
                                            "nonzeros": int((a != 0).sum())}


def test_all_features_dense_is_the_exact_product_and_none_dense_drops():
    gen = torch.Generator().manual_seed(1)
    a, g = torch.randn(37, 20, generator=gen), torch.randn(37, 6, generator=gen)
    perm = torch.randperm(37, generator=gen)
    torch.testing.assert_close(tokens24_weight_grad(a, g, perm, dense_feature_count(20, 1.0)), a.t() @ g)
    dropped = tokens24_dropped(a, perm, 0)
    assert dropped["count_fraction"] > 0.4 and 0 < dropped["mass_fraction"] < 1  # dense random data: ~half dropped


def test_dropped_fraction_by_hand():
    a = torch.tensor([[4.0], [1.0], [0.0], [3.0], [2.0]])  # one column, identity permutation, no dense feature
    d = tokens24_dropped(a, torch.arange(5), 0)
    assert d["dropped"] == 1 and d["nonzeros"] == 4 and d["count_fraction"] == 0.25
    assert d["mass_fraction"] == pytest.approx(1.0 / 30.0)
    assert tokens24_dropped(torch.zeros(3, 2), torch.arange(3), 0)["mass_fraction"] == 0.0


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 23), hidden=st.integers(1, 14), k=st.integers(1, 4),
       frac=st.sampled_from([0.0, 0.05, 0.3, 1.0]), kind=st.sampled_from(["plain", "ties", "zeros", "wide"]),
       seed=st.integers(0, 2**31 - 1))
def test_reference_matches_the_rule_stated_column_by_column(tokens, hidden, k, frac, kind, seed):
    gen = torch.Generator().manual_seed(seed)
    a = _fresh(tokens, hidden, kind, gen)
    g = _fresh(tokens, k, "plain", gen)
    perm = torch.randperm(tokens, generator=gen)
    count = dense_feature_count(hidden, frac)
    kept = tokens24_kept(a, perm, count)
    assert torch.equal(kept, brute_kept(a, perm, count))
    got = tokens24_weight_grad(a, g, perm, count)
    scale = kept.abs().t() @ g.abs()  # the bound of a sum's rounding error is relative to sum |terms|
    assert bool(((got - kept.t() @ g).abs() <= 1e-12 * scale).all())
    d = tokens24_dropped(a, perm, count)
    assert 0.0 <= d["mass_fraction"] <= 1.0 and 0.0 <= d["count_fraction"] <= 1.0


def test_bad_arguments_name_the_argument():
    a, g = torch.randn(8, 4), torch.randn(8, 3)
    perm = torch.arange(8)
    with pytest.raises(ValueError, match="perm must be a permutation"):
        tokens24_weight_grad(a, g, torch.zeros(8, dtype=torch.int64), 1)
    with pytest.raises(ValueError, match="perm must be a permutation"):
        tokens24_weight_grad(a, g, torch.arange(7), 1)
    with pytest.raises(TypeError, match="perm must be a 1-D int32/int64"):
        tokens24_weight_grad(a, g, perm.float(), 1)
    with pytest.raises(ValueError, match="g must have a's token count"):
        tokens24_weight_grad(a, g[:5], perm, 1)
    with pytest.raises(ValueError, match="g must have a's token count"):
        tokens24_weight_grad(a, g.double(), perm, 1)
    with pytest.raises(TypeError, match="a must be a floating-point"):
        tokens24_weight_grad(a.long(), g, perm, 1)
    with pytest.raises(ValueError, match="a must be a non-empty 2-D"):
        tokens24_weight_grad(a[None], g, perm, 1)
    with pytest.raises(ValueError, match="dense_count"):
        tokens24_weight_grad(a, g, perm, 5)


# --- Act24MLP with weight_grads="tokens24" ---------------------------------------------------------
def _perm(seed, draw, tokens):
    return torch.randperm(tokens, generator=torch.Generator().manual_seed(permutation_seed(seed, draw)))


@pytest.mark.parametrize("bias", [False, True])
def test_mlp_gradients_equal_the_reference(bias):
    torch.manual_seed(0)
    mlp = Act24MLP(8, 32, bias=bias, weight_grads="tokens24", dense_fraction=0.1, token_seed=5).double()
    x = torch.randn(3, 7, 8, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(3, 7, 8, dtype=torch.float64)
    y = mlp(x)
    y.backward(dy)
    x2, dy2 = x.detach().reshape(-1, 8), dy.reshape(-1, 8)
    w1, w2 = mlp.fc.weight.detach(), mlp.proj.weight.detach()
    h = x2 @ w1.t() + (mlp.fc.bias.detach() if bias else 0)
    a24, _ = act24(h)
    dh = act24_grad(h, dy2 @ w2)
    count = dense_feature_count(32, 0.1)
    torch.testing.assert_close(y.detach().reshape(-1, 8), a24 @ w2.t() + (mlp.proj.bias.detach() if bias else 0))
    torch.testing.assert_close(x.grad.reshape(-1, 8), dh @ w1)  # dx is exact
    torch.testing.assert_close(mlp.proj.weight.grad, tokens24_weight_grad(a24, dy2, _perm(5, 0, 21), count).t())
    torch.testing.assert_close(mlp.fc.weight.grad, tokens24_weight_grad(dh, x2, _perm(5, 1, 21), count))
    assert not torch.allclose(mlp.proj.weight.grad, dy2.t() @ a24)  # it is an approximation here
    if bias:
        torch.testing.assert_close(mlp.fc.bias.grad, dh.sum(0))
        torch.testing.assert_close(mlp.proj.bias.grad, dy2.sum(0))
    assert int(mlp.token_draws) == 2


@pytest.mark.parametrize("select", ["both", "fc"])
def test_combined_with_2_4_weights_uses_the_masked_weights_and_token_gradients(select):
    torch.manual_seed(1)
    model = torch.nn.Sequential()
    model.add_module("mlp", Act24MLP(16, 64, weight_grads="tokens24", dense_fraction=0.05, token_seed=3))
    model = model.double()
    sl.sparsify(model, sl.STE(transposable=True), select=weight_selector if select == "both" else ["mlp.fc"])
    sl.attach_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.0))
    x = torch.randn(30, 16, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(30, 16, dtype=torch.float64)
    y = model(x)
    y.backward(dy)
    mlp = model.mlp
    s1 = mlp.fc.weight.detach() * mlp.fc.mask
    s2 = mlp.proj.weight.detach() * mlp.proj.mask if select == "both" else mlp.proj.weight.detach()
    h = x.detach() @ s1.t()
    a24, _ = act24(h)
    dh = act24_grad(h, dy @ s2)
    count = dense_feature_count(64, 0.05)
    torch.testing.assert_close(y.detach(), a24 @ s2.t())
    torch.testing.assert_close(x.grad, dh @ s1)
    torch.testing.assert_close(mlp.proj.weight.grad, tokens24_weight_grad(a24, dy, _perm(3, 0, 30), count).t())
    torch.testing.assert_close(mlp.fc.weight.grad, tokens24_weight_grad(dh, x.detach(), _perm(3, 1, 30), count))


def test_default_weight_grads_stay_dense_and_exact():
    torch.manual_seed(2)
    mlp = Act24MLP(8, 16).double()
    x, dy = torch.randn(9, 8, dtype=torch.float64), torch.randn(9, 8, dtype=torch.float64)
    mlp(x).backward(dy)
    a24, _ = act24(x @ mlp.fc.weight.detach().t())
    torch.testing.assert_close(mlp.proj.weight.grad, dy.t() @ a24)
    assert mlp.weight_grads == "dense" and int(mlp.token_draws) == 0


def test_permutations_resume_exactly_from_a_checkpoint_and_old_checkpoints_load():
    torch.manual_seed(3)
    mlp = Act24MLP(8, 16, weight_grads="tokens24", token_seed=11)
    x, dy = torch.randn(13, 8), torch.randn(13, 8)
    mlp(x).backward(dy)
    state = {k: v.clone() for k, v in mlp.state_dict().items()}
    first = mlp.next_token_permutation(13, torch.device("cpu"))
    resumed = Act24MLP(8, 16, weight_grads="tokens24")
    resumed.load_state_dict(state)
    assert int(resumed.token_seed) == 11 and int(resumed.token_draws) == 2
    assert torch.equal(resumed.next_token_permutation(13, torch.device("cpu")), first)
    old = {k: v for k, v in state.items() if not k.startswith("token_")}  # written before the option existed
    again = Act24MLP(8, 16)
    again.load_state_dict(old)
    assert int(again.token_draws) == 0


def test_configure_gives_each_block_its_own_stream_and_dropped_shares_are_recorded():
    model = torch.nn.Sequential(Act24MLP(8, 32), Act24MLP(8, 32))
    configure_activation_sparsity(model, weight_grads="tokens24", dense_fraction=0.25, token_seed=7)
    seeds = [int(m.token_seed) for m in model]
    assert seeds[0] != seeds[1] and all(m.weight_grads == "tokens24" and m.dense_fraction == 0.25 for m in model)
    model[0].record_dropped = True
    x = torch.randn(10, 8)
    model(x).sum().backward()
    assert set(model[0].last_dropped) == {"dW1", "dW2"} and not model[1].last_dropped
    assert 0.0 <= model[0].last_dropped["dW2"]["mass_fraction"] <= 1.0


def test_bad_options_are_refused_and_capture_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="weight_grads must be one of"):
        Act24MLP(8, 16, weight_grads="mvue")
    with pytest.raises(ValueError, match="dense_fraction"):
        Act24MLP(8, 16, weight_grads="tokens24", dense_fraction=1.5)
    with pytest.raises(ValueError, match="token_seed"):
        Act24MLP(8, 16, token_seed=-1)
    mlp = Act24MLP(8, 16, weight_grads="tokens24")
    monkeypatch.setattr(activation24, "_capturing", lambda device: True)
    with pytest.raises(RuntimeError, match="CUDA-graph"):
        mlp(torch.randn(4, 8))
    with torch.no_grad():  # no backward, no permutation: allowed
        mlp(torch.randn(4, 8))


def test_reference_products_can_round_the_sparse_features_as_cusparselt_does():
    """TorchBackend(token_feature_multiple=64) picks |D| as the cuSPARSELt products do (|S| in whole tiles)."""
    torch.manual_seed(4)
    mlp = Act24MLP(8, 128, weight_grads="tokens24", dense_fraction=0.05, token_seed=2)
    mlp.backend = TorchBackend(token_feature_multiple=64)
    x, dy = torch.randn(6, 8), torch.randn(6, 8)
    mlp(x).backward(dy)
    a24, _ = act24(x @ mlp.fc.weight.detach().t())
    assert dense_feature_count(128, 0.05, 64) == 64
    torch.testing.assert_close(mlp.proj.weight.grad, tokens24_weight_grad(a24, dy, _perm(2, 0, 6), 64).t())


# --- the lab: GPTConfig, the trainer and `sparsity-lab train` ----------------------------------------
def test_lab_config_trains_with_token_gradients_and_resumes_exactly(tmp_path, one_thread):
    from _lab_testing import tiny_config

    from sparsity_lab.lab import GPTConfig, Trainer, load_corpus
    from sparsity_lab.lab.model import ACT24_WEIGHT_GRADS

    assert ACT24_WEIGHT_GRADS == activation24.WEIGHT_GRADS
    with pytest.raises(ValueError, match="act24_weight_grads must be one of"):
        GPTConfig(ffn_kind="relu2", activation_sparsity="2:4", act24_weight_grads="mvue")
    with pytest.raises(ValueError, match="needs activation_sparsity='2:4'"):
        GPTConfig(ffn_kind="relu2", act24_weight_grads="tokens24")
    with pytest.raises(ValueError, match="act24_dense_fraction"):
        GPTConfig(ffn_kind="relu2", activation_sparsity="2:4", act24_dense_fraction=2.0)
    corpus = load_corpus(max_bytes=50_000)
    cfg = GPTConfig(n_layer=2, n_head=2, d_model=16, context=16, ffn_kind="relu2", activation_sparsity="2:4",
                    act24_weight_grads="tokens24", act24_dense_fraction=0.1)

    def trainer(steps, **kw):
        return Trainer(tiny_config(cfg, method="dense", steps=steps, **kw), corpus=corpus)
    full = trainer(4)
    mods = [m for _, m in activation24.act24_modules(full.model)]
    assert all(m.weight_grads == "tokens24" and m.dense_fraction == 0.1 for m in mods)
    assert len({int(m.token_seed) for m in mods}) == 2 and "weight gradients tokens24" in full.describe()
    full.run()
    assert all(int(m.token_draws) == 2 * 4 for m in mods)  # dW2 and dW1 per step (one micro-step each)
    dense = Trainer(tiny_config(GPTConfig(**{**cfg.__dict__, "act24_weight_grads": "dense"}), method="dense",
                                steps=4), corpus=corpus)
    dense.run()
    assert without_speed(dense.history) != without_speed(full.history)  # the option changes the trajectory
    ckpt = tmp_path / "ck.pt"
    first = trainer(4, checkpoint_path=str(ckpt))
    first.run(stop_at=2)
    first.close()
    resumed = Trainer.resume(ckpt, corpus=corpus)
    assert all(int(m.token_draws) == 4 for _, m in activation24.act24_modules(resumed.model))
    resumed.run()
    assert without_speed(resumed.history) == without_speed(full.history[2:])


def test_cli_train_takes_the_token_gradient_options(tmp_path, capsys):
    from _lab_testing import CLI_TINY

    from sparsity_lab.lab.cli import main
    code = main(["train", *CLI_TINY, "--steps", "1", "--ffn", "relu2", "--activation-sparsity", "2:4",
                 "--act24-weight-grads", "tokens24", "--act24-dense-fraction", "0.2", "--out", str(tmp_path / "r")])
    assert code == 0, capsys.readouterr().err
    assert "weight gradients tokens24 (0.2 of features dense)" in capsys.readouterr().out
    code = main(["train", *CLI_TINY, "--steps", "1", "--ffn", "relu2", "--act24-weight-grads", "tokens24",
                 "--out", str(tmp_path / "r2")])
    assert code == 2 and "needs activation_sparsity='2:4'" in capsys.readouterr().err


@pytest.mark.parametrize("select", [weight_selector, fc_only])
def test_the_up_projection_stays_a_module_call_so_its_hooks_run(select):
    """With 2:4 weights on fc, the tokens24 path still calls fc as a module (the trainer's activation-sparsity
    tracker is a forward hook on mlp.fc), with fc's own forward: nothing replaces it, not even for the call."""
    model = torch.nn.Sequential()
    model.add_module("mlp", Act24MLP(8, 16, weight_grads="tokens24"))
    sl.sparsify(model, sl.STE(transposable=True), select=select)
    sl.attach_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.0))
    seen = []
    model.mlp.fc.register_forward_pre_hook(lambda mod, args: seen.append("forward" in vars(mod)))
    model.mlp.fc.register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    model(torch.randn(5, 8)).sum().backward()
    assert seen == [False, torch.Size([5, 16])] and "forward" not in vars(model.mlp.fc)
    assert model.mlp.fc.weight.grad is not None and model.mlp.proj.weight.grad is not None


def test_mvue_weight_gradients_and_tokens24_are_refused_together():
    model = torch.nn.Sequential()
    model.add_module("mlp", Act24MLP(8, 16, weight_grads="tokens24"))
    sl.sparsify(model, sl.STE(transposable=True, mvue=True), select=weight_selector)
    sl.attach_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.0))
    with pytest.raises(ValueError, match="asks for MVUE weight gradients"):
        model(torch.randn(4, 8))
    with pytest.raises(ValueError, match="asks for MVUE weight gradients"):
        configure_activation_sparsity(model)
    configure_activation_sparsity(model, weight_grads="dense")  # MVUE with exact weight gradients: fine
    model(torch.randn(4, 8)).sum().backward()
