"""DYAD layers equal the dense matrix they represent, with 2/n of the parameters."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsity_lab.structures.dyad import DyadLinear


@settings(max_examples=25, deadline=None)
@given(variant=st.sampled_from(["it", "ot", "dt"]), n=st.sampled_from([1, 2, 3, 4, 8]),
       b_in=st.integers(1, 5), b_out=st.integers(1, 5), tokens=st.integers(1, 7), seed=st.integers(0, 10**6))
def test_forward_equals_explicit_dense_matrix(variant, n, b_in, b_out, tokens, seed):
    torch.manual_seed(seed)
    layer = DyadLinear(n * b_in, n * b_out, n, variant).double()
    x = torch.randn(2, tokens, n * b_in, dtype=torch.float64)
    w = layer.dense_weight()
    torch.testing.assert_close(layer(x), x @ w.T + layer.bias)


@pytest.mark.parametrize("variant", ["dyad-it", "dyad-ot", "dyad-dt"])
def test_gradients_match_the_dense_equivalent(variant):
    torch.manual_seed(1)
    layer = DyadLinear(24, 32, 4, variant).double()
    x = torch.randn(5, 24, dtype=torch.float64, requires_grad=True)
    g = torch.randn(5, 32, dtype=torch.float64)
    layer(x).backward(g)
    # the same loss through the explicit dense matrix, differentiated w.r.t. the blocks
    x2 = x.detach().clone().requires_grad_(True)
    a = layer.blocks_a.detach().clone().requires_grad_(True)
    b = layer.blocks_b.detach().clone().requires_grad_(True)
    ref = DyadLinear(24, 32, 4, variant).double()
    with torch.no_grad():
        ref.bias.copy_(layer.bias)
    ref.blocks_a, ref.blocks_b = torch.nn.Parameter(a), torch.nn.Parameter(b)
    (x2 @ ref.dense_weight().T + ref.bias).backward(g)
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(layer.blocks_a.grad, ref.blocks_a.grad)
    torch.testing.assert_close(layer.blocks_b.grad, ref.blocks_b.grad)
    torch.testing.assert_close(layer.bias.grad, g.sum(0))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_parameter_count_is_two_over_n_of_dense(n):
    layer = DyadLinear(64, 128, n, bias=False)
    assert sum(p.numel() for p in layer.parameters()) == 2 * 64 * 128 // n


def test_variants_differ_and_permutation_is_strided():
    torch.manual_seed(0)
    layers = {v: DyadLinear(8, 8, 2, v) for v in ("it", "ot", "dt")}
    for layer in layers.values():
        layer.load_state_dict(layers["it"].state_dict())
    ws = {v: layer.dense_weight() for v, layer in layers.items()}
    assert not torch.equal(ws["it"], ws["ot"]) and not torch.equal(ws["it"], ws["dt"])
    # DYAD-IT, block 0 of the second term reads inputs 0, 2, 4, 6 (stride n = 2)
    probe = DyadLinear(8, 8, 2, "it", bias=False)
    with torch.no_grad():
        probe.blocks_a.zero_()
        probe.blocks_b.zero_()
        probe.blocks_b[0].fill_(1.0)
    assert torch.equal(probe.dense_weight()[:4].nonzero()[:, 1].unique(), torch.tensor([0, 2, 4, 6]))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="variant"):
        DyadLinear(8, 8, 2, "xt")
    with pytest.raises(ValueError, match="in_features=10 is not divisible by n_blocks=4"):
        DyadLinear(10, 8, 4)
    with pytest.raises(ValueError, match="n_blocks"):
        DyadLinear(8, 8, 0)


def test_benchmark_runs_small_on_cpu_and_writes_json(tmp_path):
    import argparse
    import json

    from benchmarks import dyad as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--widths", "64", "--blocks", "4", "--variants", "it", "--tokens", "32",
                              "--dtype", "float32", "--repeats", "2", "--allow-cpu", "--out-dir", str(tmp_path)])
    assert bench.run(args) == 0
    data = json.loads((tmp_path / "dyad_cpu.json").read_text())
    assert data["provenance"]["torch"] and len(data["rows"]) == 2
    assert all(r["dense_ms"] > 0 and r["dyad_ms"] > 0 for r in data["rows"])


def test_dyadify_swaps_only_ffn_linears_and_keeps_the_model_on_error():
    from torch import nn

    from sparsity_lab.structures.dyad import dyadify

    model = nn.Sequential()
    model.add_module("attn", nn.Linear(16, 16))
    model.add_module("mlp", nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16)))
    dyadify(model, n_blocks=4, variant="ot")
    assert isinstance(model.mlp[0], DyadLinear) and isinstance(model.mlp[2], DyadLinear)
    assert type(model.attn) is nn.Linear
    assert model(torch.randn(3, 16)).shape == (3, 16)
    bad = nn.Sequential()
    bad.add_module("mlp", nn.Sequential(nn.Linear(16, 64), nn.Linear(64, 18)))
    with pytest.raises(ValueError, match="cannot make 'mlp.1' DYAD"):
        dyadify(bad, n_blocks=4)
    assert type(bad.mlp[0]) is nn.Linear  # nothing was swapped
