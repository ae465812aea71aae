"""The FLOP counts the course uses agree with PyTorch's own FLOP counter and reject bad input."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from sparsity_lab.structures.dyad import DyadLinear
from sparsity_lab.flops import (gpt_config_flops_per_token, linear_flops, matmul_flops, product_fractions,
                                tflops)
from sparsity_lab.ffn_width import default_ffn_hidden
from sparsity_lab.lab.model import GPT, GPTConfig


def _counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_linear_products_match_the_flop_counter():
    x = torch.randn(12, 8, requires_grad=True)
    layer = torch.nn.Linear(8, 20, bias=False)
    counted = _counted(lambda: layer(x).sum().backward())
    assert counted == sum(linear_flops(12, 8, 20).values()) == 3 * matmul_flops(12, 8, 20)


def test_gpt_linear_parts_match_the_flop_counter():
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=64, context=32)
    model, tokens = GPT(cfg), torch.randint(0, 256, (3, 32))

    def step():
        out = model(tokens)
        (out[0] if isinstance(out, tuple) else out).float().sum().backward()
    parts = gpt_config_flops_per_token(cfg)
    linear = parts["attention_projections"] + parts["ffn"] + parts["lm_head"]
    assert _counted(step) == linear * 3 * 32  # the counter sees the matmuls (not the attention kernel)
    assert gpt_config_flops_per_token(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg.__dict__)["ffn"] == parts["ffn"]


def test_dyad_does_2_over_n_of_every_product():
    x = torch.randn(16, 32, requires_grad=True)
    layer = DyadLinear(32, 64, n_blocks=4, bias=False)
    counted = _counted(lambda: layer(x).sum().backward())
    dense = sum(linear_flops(16, 32, 64).values())
    assert counted == dense * product_fractions("dyad", n_blocks=4)["forward"]


def test_tflops_and_bad_input():
    assert tflops(2e12, 1000.0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="ms must be > 0"):
        tflops(1.0, 0.0)
    with pytest.raises(ValueError, match="m must be a positive int"):
        matmul_flops(0, 2, 2)
    with pytest.raises(ValueError, match="method must be one of"):
        product_fractions("2:4")
    with pytest.raises(ValueError, match="density must be in"):
        product_fractions("block", density=0.0)


@pytest.mark.parametrize("kind", ["gelu", "swiglu", "geglu"])
@pytest.mark.parametrize("d_model", [64, 100, 384])
def test_a_recorded_config_with_the_default_width_counts_the_models_width(kind, d_model):
    # a results JSON stores ffn_hidden=None; the FLOP count must use the width the GPT built
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=d_model, context=32, ffn_kind=kind)
    recorded = dict(cfg.__dict__)
    assert recorded["ffn_hidden"] is None
    width = GPT(cfg).blocks[0].mlp.proj.in_features  # what the model was built with
    assert width == cfg.hidden == default_ffn_hidden(d_model, gated=kind != "gelu")
    gated = 3 if kind != "gelu" else 2
    assert gpt_config_flops_per_token(recorded)["ffn"] == 3 * 2 * 2 * gated * d_model * width
    with pytest.raises(ValueError, match="d_model must be a positive int"):
        default_ffn_hidden(0, gated=True)
