"""The one verb: sparsify(model, method, select) and attach_optimizer(model, optimizer)."""
import warnings

import pytest
import torch
from torch import nn

import sparsity_lab as sl
from sparsity_lab.sparsify import is_ffn_linear


class Block(nn.Module):
    """A GPT-2-like block: attention linears (c_attn, c_proj) and an MLP (c_fc, c_proj)."""

    def __init__(self, width=16):
        super().__init__()
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(width, 3 * width)
        self.attn.c_proj = nn.Linear(width, width)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(width, 4 * width)
        self.mlp.c_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attn.c_proj(self.attn.c_attn(x)[..., : x.shape[-1]])
        return x + self.mlp.c_proj(torch.relu(self.mlp.c_fc(x)))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.lm_head = nn.Linear(16, 8)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.lm_head(x)


MLP_NAMES = ["blocks.0.mlp.c_fc", "blocks.0.mlp.c_proj", "blocks.1.mlp.c_fc", "blocks.1.mlp.c_proj"]
ALL_NAMES = sorted(MLP_NAMES + ["blocks.0.attn.c_attn", "blocks.0.attn.c_proj", "blocks.1.attn.c_attn",
                                "blocks.1.attn.c_proj", "lm_head"])


def sparse_names(model):
    return sorted(name for name, _ in sl.sparse_layers(model))


def test_default_selects_ffn_linears_by_name():
    model = sl.sparsify(TinyGPT(), sl.STE())
    assert sparse_names(model) == sorted(MLP_NAMES)
    assert type(model.blocks[0].attn.c_attn) is nn.Linear and type(model.lm_head) is nn.Linear
    assert sparse_names(sl.sparsify(TinyGPT(), sl.STE(), select="ffn")) == sorted(MLP_NAMES)


@pytest.mark.parametrize("name", ["mlp.fc1", "ffn.0", "feed_forward.w", "layer.intermediate.dense",
                                  "mlp.up_proj", "h.0.mlp.c_fc"])
def test_ffn_name_pattern_matches_common_conventions(name):
    assert is_ffn_linear(name, None)


@pytest.mark.parametrize("name", ["attn.c_attn", "lm_head", "attention.query", "mlpx.fc", "wte"])
def test_ffn_name_pattern_rejects_others(name):
    assert not is_ffn_linear(name, None)


def test_select_all_list_and_callable():
    assert sparse_names(sl.sparsify(TinyGPT(), sl.STE(), select="all")) == ALL_NAMES
    names = ["lm_head", "blocks.1.attn.c_proj"]
    assert sparse_names(sl.sparsify(TinyGPT(), sl.STE(), select=names)) == sorted(names)
    assert sparse_names(sl.sparsify(TinyGPT(), sl.STE(), select=iter(names))) == sorted(names)  # a generator
    model = sl.sparsify(TinyGPT(), sl.STE(), select=lambda name, mod: mod.out_features == 16)
    assert sparse_names(model) == sorted(["blocks.0.attn.c_proj", "blocks.0.mlp.c_proj", "blocks.1.attn.c_proj",
                                          "blocks.1.mlp.c_proj"])


def test_converted_model_runs_and_keeps_output_shape():
    model = sl.sparsify(TinyGPT(), sl.SSTE())
    model.eval()
    assert model(torch.randn(2, 3, 16)).shape == (2, 3, 8)


def test_no_match_is_a_clear_error():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    with pytest.raises(ValueError, match="no nn.Linear matched the FFN/MLP name pattern"):
        sl.sparsify(model, sl.STE())
    with pytest.raises(ValueError, match="no nn.Linear matched select=<function"):
        sl.sparsify(model, sl.STE(), select=lambda name, mod: False)
    with pytest.raises(ValueError, match=r"not nn.Linear in the model: \['1', 'nope'\]"):
        sl.sparsify(model, sl.STE(), select=["0", "1", "nope"])
    with pytest.raises(ValueError, match="select must be 'ffn', 'all'"):
        sl.sparsify(model, sl.STE(), select="mlp")
    with pytest.raises(TypeError, match="method must be a SparsityMethod"):
        sl.sparsify(model, "ste", select="all")


def test_indivisible_shape_names_the_layer_and_leaves_model_untouched():
    model = TinyGPT()
    model.blocks[1].mlp.c_proj = nn.Linear(62, 16)  # in_features 62: not divisible by 4
    before = {name: type(mod) for name, mod in model.named_modules()}
    with pytest.raises(ValueError, match=r"cannot make 'blocks.1.mlp.c_proj' \(16x62\) 2:4: in_features has size 62"):
        sl.sparsify(model, sl.STE())
    assert {name: type(mod) for name, mod in model.named_modules()} == before  # nothing converted
    # a transposable mask also needs out_features divisible by M
    model = TinyGPT()
    model.blocks[0].attn.c_attn = nn.Linear(16, 46)
    with pytest.raises(ValueError, match=r"cannot make 'blocks.0.attn.c_attn' \(46x16\) 2:4: out_features"):
        sl.sparsify(model, sl.STE(transposable=True), select=["blocks.0.attn.c_attn"])


@pytest.mark.parametrize("optimizer_first", [True, False])
def test_parameters_are_shared(optimizer_first):
    """SparseLinear.from_linear keeps the Parameter objects: an optimizer made before sparsify()
    trains the sparse layers just as well as one made after."""
    torch.manual_seed(0)
    model = TinyGPT()
    weight = model.blocks[0].mlp.c_fc.weight
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if optimizer_first else None
    sl.sparsify(model, sl.STE())
    assert model.blocks[0].mlp.c_fc.weight is weight
    if opt is None:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sl.attach_optimizer(model, opt)
    before = weight.detach().clone()
    model(torch.randn(2, 16)).pow(2).sum().backward()
    opt.step()
    assert not torch.equal(weight.detach(), before)
    assert model.blocks[0].mlp.c_fc.step == 1


def test_attach_optimizer_errors():
    with pytest.raises(ValueError, match="model has no SparseLinear layers"):
        sl.attach_optimizer(TinyGPT(), torch.optim.SGD(TinyGPT().parameters(), lr=0.1))
    model = sl.sparsify(TinyGPT(), sl.STE())
    partial = torch.optim.SGD(model.blocks[0].parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"weight\(s\) of \['blocks.1.mlp.c_fc', 'blocks.1.mlp.c_proj'\] are not"):
        sl.attach_optimizer(model, partial)


def test_warning_when_training_without_attached_optimizer():
    model = sl.sparsify(TinyGPT(), sl.STE())
    with pytest.warns(UserWarning, match="no optimizer is attached"):
        model(torch.randn(2, 16))
    # no warning in eval mode or without grad (nothing to schedule there)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            model(torch.randn(2, 16))
        model.eval()
        model(torch.randn(2, 16))


def test_sparsity_summary_rows():
    model = sl.sparsify(TinyGPT(), sl.SSTE())
    rows = sl.sparsity_summary(model)
    assert [row["layer"] for row in rows] == MLP_NAMES
    for row in rows:
        assert row["density"] == 0.5 and row["step"] == 0 and not row["dense_now"]
        assert 1.0 < row["beta"] < 2.0
        assert "sste 2:4" in row["method"]


class SharedLinear(nn.Module):
    """One nn.Linear used at two places (an encoder and a decoder sharing their FFN, say)."""

    def __init__(self):
        super().__init__()
        shared = nn.Linear(16, 16)
        self.enc = nn.ModuleDict({"mlp": shared})
        self.dec = nn.ModuleDict({"mlp": shared})

    def forward(self, x):
        return self.dec["mlp"](torch.relu(self.enc["mlp"](x)))


@pytest.mark.parametrize("select", [None, ["enc.mlp"], ["dec.mlp"], lambda name, mod: name == "dec.mlp"])
def test_a_linear_used_at_two_places_is_2_4_at_both(select):
    model = SharedLinear()
    sl.sparsify(model, sl.STE(), select=select)
    layer = model.enc["mlp"]
    assert isinstance(layer, sl.SparseLinear) and model.dec["mlp"] is layer  # one layer, both places
    assert [name for name, _ in sl.sparse_layers(model)] == ["enc.mlp"]
    x = torch.randn(3, 16)
    sparse_w = layer.weight * layer.mask
    expected = torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, sparse_w, layer.bias)),
                                          sparse_w, layer.bias)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), expected, rtol=0, atol=0)
