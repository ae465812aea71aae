"""The lab GPT: shapes, parameter counts per FFN kind, causality, gating, what sparsify picks."""
import math

import pytest
import torch
import torch.nn.functional as F

from sparsity_lab import STE, sparse_layers, sparsify
from sparsity_lab.lab.model import GPT, MLP, GPTConfig


def expected_params(cfg: GPTConfig) -> int:
    """Count by hand: embeddings, per block (2 norms, qkv, proj, fc, proj), final norm; head tied."""
    d, h, k = cfg.d_model, cfg.hidden, (1 if cfg.ffn_kind == "gelu" else 2)
    block = 2 * d + 3 * d * d + d * d + k * h * d + h * d
    if cfg.bias:
        block += 2 * d + 3 * d + d + k * h + d
    n = cfg.vocab_size * d + cfg.context * d + cfg.n_layer * block + d + (d if cfg.bias else 0)
    if not cfg.tie_embeddings:
        n += cfg.vocab_size * d
    return n


@pytest.mark.parametrize("kind", ["gelu", "swiglu", "geglu"])
@pytest.mark.parametrize("bias", [False, True])
def test_shapes_and_parameter_count(kind, bias):
    cfg = GPTConfig(n_layer=2, n_head=2, d_model=32, context=24, ffn_kind=kind, bias=bias)
    model = GPT(cfg)
    idx, targets = torch.randint(0, 256, (2, 3, 24))
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 24, 256)
    assert loss.shape == ()
    assert model.num_params() == expected_params(cfg)
    assert model.num_params(non_embedding=True) == expected_params(cfg) - cfg.context * cfg.d_model
    # small initial weights: predictions start near uniform over 256 bytes
    assert abs(loss.item() - math.log(256)) < 0.15


def test_hidden_width_defaults():
    assert GPTConfig(d_model=384, ffn_kind="gelu").hidden == 1536
    assert GPTConfig(d_model=384, ffn_kind="swiglu").hidden == 1024  # 8 * 384 / 3
    assert GPTConfig(d_model=32, n_head=2, ffn_kind="geglu").hidden == 96  # 85.3 rounded up to 16
    assert GPTConfig(d_model=32, n_head=2, ffn_hidden=40).hidden == 40
    untied = GPTConfig(n_layer=1, n_head=1, d_model=8, context=4, tie_embeddings=False)
    assert GPT(untied).num_params() == expected_params(untied)


@pytest.mark.parametrize("kind,act", [("swiglu", F.silu), ("geglu", F.gelu)])
def test_gated_ffn_is_act_of_gate_times_up(kind, act):
    cfg = GPTConfig(d_model=16, n_head=2, ffn_kind=kind, ffn_hidden=20)
    mlp = MLP(cfg)
    x = torch.randn(5, 16)
    gate_w, up_w = mlp.fc.weight[:20], mlp.fc.weight[20:]
    want = (act(x @ gate_w.T) * (x @ up_w.T)) @ mlp.proj.weight.T
    torch.testing.assert_close(mlp(x), want)


def test_causal_future_tokens_do_not_change_the_past():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=16, context=12)).eval()
    idx = torch.randint(0, 256, (2, 12))
    changed = idx.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 256
    a, _ = model(idx)
    b, _ = model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


@pytest.mark.parametrize("kind", ["gelu", "swiglu"])
def test_sparsify_picks_exactly_the_ffn_linears(kind):
    model = sparsify(GPT(GPTConfig(n_layer=3, n_head=2, d_model=32, context=8, ffn_kind=kind)), STE())
    names = [name for name, _ in sparse_layers(model)]
    assert names == [f"blocks.{i}.mlp.{p}" for i in range(3) for p in ("fc", "proj")]
    assert type(model.blocks[0].attn.qkv) is torch.nn.Linear  # attention stays dense


def test_config_errors_are_clear():
    with pytest.raises(ValueError, match="divisible by n_head"):
        GPTConfig(d_model=30, n_head=4)
    with pytest.raises(ValueError, match="ffn_kind"):
        GPTConfig(ffn_kind="relu")
    with pytest.raises(ValueError, match="n_layer"):
        GPTConfig(n_layer=0)
    with pytest.raises(ValueError, match="d_model=30 is not divisible by 4"):
        GPTConfig(d_model=30, n_head=3).check_nm()
    with pytest.raises(ValueError, match="FFN hidden width=42"):
        GPTConfig(d_model=32, n_head=2, ffn_hidden=42).check_nm(transposable=True)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        GPT(GPTConfig(n_layer=1, n_head=1, d_model=8, context=4))(torch.zeros(1, 5, dtype=torch.long))
