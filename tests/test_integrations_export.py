"""export(model): the inference model equals the trained model's eval forward, holds S(W) once, and
writes the compressed-tensors sparse-24-bitmask format, read back here by that package."""
import importlib
import warnings

import pytest
import torch
from torch import nn

import sparsity_lab as sl
from sparsity_lab.backends.cusparselt.backend import BackendFallbackWarning
from sparsity_lab.export import ExportFallbackWarning, ExportNumericsWarning, _pack_bits


class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))

    def forward(self, x):
        return self.mlp(self.embed(x))


def trained(method, steps=3):
    torch.manual_seed(0)
    model = sl.sparsify(TinyMLP(), method)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    sl.attach_optimizer(model, opt)
    for _ in range(steps):
        model(torch.randn(6, 8)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model


@pytest.mark.parametrize("method", [sl.STE(), sl.SSTE(mvue=True), sl.SRSTE(transposable=True)], ids=lambda m: m.name)
def test_export_equals_the_eval_forward(method):
    model = trained(method)
    with pytest.warns(ExportFallbackWarning, match="2 2:4 layers run dense products .* on CUDA GPUs"):
        served = sl.export(model)
    x = torch.randn(3, 5, 8)
    expected = model.eval()(x)
    with torch.no_grad():
        got = served(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert model.training is False and isinstance(model.mlp[0], sl.SparseLinear)  # the original stays
    layer = served.mlp[0]
    assert isinstance(layer, sl.Sparse24Linear) and layer.kernel == "dense" and sl.is_nm(layer.mask, 2, 4)
    assert not layer.weight[~layer.mask].any()  # S(W) is zero off the mask
    assert not any(isinstance(p, nn.Parameter) for p in layer.parameters())  # inference only
    assert [row["became"] for row in served.export_report] == ["Sparse24Linear (dense)"] * 2


def test_export_dense_phase_gives_nn_linear_and_bad_input():
    model = trained(sl.MaskedDecay(total_steps=2, dense_finetune_at=0.5), steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: no 2:4 layer left
        served = sl.export(model)
    assert type(served.mlp[0]) is nn.Linear
    x = torch.randn(4, 8)
    torch.testing.assert_close(served(x), model.eval()(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="kernel must be 'auto', 'cusparselt' or 'dense'"):
        sl.export(model, kernel="fast")
    with pytest.raises(RuntimeError, match="cuSPARSELt cannot run this layer"):
        sl.export(trained(sl.STE()), kernel="cusparselt")
    with pytest.raises(ValueError, match="no SparseLinear layers"):
        sl.export(TinyMLP())


@pytest.mark.parametrize("backend", ["fp8_reference", "torch_fp8sim", "fp8_dense"])
def test_export_of_an_fp8_model_says_the_fp8_numerics_are_dropped(backend):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BackendFallbackWarning)  # fp8_dense runs fp8_reference on the CPU
        model = trained(sl.STE(backend=backend))
    with pytest.warns(ExportNumericsWarning, match=r"2 layers trained on FP8 backend.* without FP8 rounding"):
        served = sl.export(model, kernel="dense")
    assert all("FP8 rounding" in row["numerics"] for row in served.export_report)
    x = torch.randn(3, 8)
    with torch.no_grad():
        fp8, plain = model.eval()(x), served(x)
    assert not torch.equal(fp8, plain)  # what the warning says: the FP8 rounding is gone
    # ... and what runs instead is the same S(W) without rounding
    reference = trained(sl.STE())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "backend 'torch' keeps no FP8 state": that is the point
        reference.load_state_dict(model.state_dict(), strict=False)  # the same weights and masks
    with torch.no_grad():
        torch.testing.assert_close(plain, reference.eval()(x), rtol=0, atol=0)


def test_export_of_a_model_without_fp8_warns_nothing_about_numerics():
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportNumericsWarning)
        served = sl.export(trained(sl.STE()), kernel="dense")
    assert all("numerics" not in row for row in served.export_report)


def _layer_args(out=4, inp=8):
    w = torch.randn(out, inp)
    mask = sl.nm_mask(w, 2, 4)
    return w * mask, mask, torch.randn(out)


@pytest.mark.parametrize("case,match", [
    ("values_outside_mask", "non-zero values outside mask: S\\(W\\) is not 2:4"),
    ("four_of_eight", "mask must keep exactly 2 entries in every group of 4"),
    ("all_true", "mask must keep exactly 2 entries in every group of 4"),
    ("wrong_shape", "mask must be a bool tensor of sparse_weight's shape \\(4, 8\\)"),
    ("not_bool", "mask must be a bool tensor"),
    ("in_not_multiple_of_4", "mask must keep exactly 2 entries in every group of 4 along in_features=6"),
    ("bias_shape", "bias must be None or a tensor of shape \\(4,\\)"),
    ("weight_1d", "sparse_weight must be a 2-D floating-point tensor"),
])
def test_sparse24linear_refuses_what_its_checkpoint_would_not_hold(case, match):
    w, mask, bias = _layer_args()
    if case == "values_outside_mask":
        w = w + (~mask) * 0.5  # computes with these, but the checkpoint keeps only the masked values
    elif case == "four_of_eight":
        mask = torch.tensor([[True] * 4 + [False] * 4] * 4)  # 4 + 0 per 8: not 2:4
        w = w * 0 + mask
    elif case == "all_true":
        mask = torch.ones_like(mask)
        w = torch.randn(4, 8)
    elif case == "wrong_shape":
        mask = mask[:, :4]
    elif case == "not_bool":
        mask = mask.float()
    elif case == "in_not_multiple_of_4":
        w, mask = w[:, :6], torch.ones(4, 6, dtype=torch.bool)
    elif case == "bias_shape":
        bias = torch.randn(5)
    elif case == "weight_1d":
        w = w[0]
    with pytest.raises(ValueError, match=match):
        sl.Sparse24Linear(w, mask, bias, "dense")


def test_sparse24linear_checkpoint_is_the_layer():
    """What the layer computes is what its compressed-tensors state holds."""
    from sparsity_lab.export import compressed_tensors_state

    w, mask, bias = _layer_args()
    model = nn.Sequential(sl.Sparse24Linear(w, mask, bias, "dense"))
    state = compressed_tensors_state(model)
    rebuilt = torch.zeros_like(w)
    rebuilt[mask] = state["0.compressed"].reshape(-1)
    x = torch.randn(3, 8)
    torch.testing.assert_close(model(x), torch.nn.functional.linear(x, rebuilt, bias), rtol=0, atol=0)


def test_bit_packing_is_numpys_little_endian():
    np = pytest.importorskip("numpy")
    mask = torch.rand(5, 24) > 0.5
    expected = np.packbits(mask.numpy(), axis=-1, bitorder="little")
    assert torch.equal(_pack_bits(mask), torch.from_numpy(expected))


def bitmask_reader():
    """compressed-tensors where it still reads sparse-24-bitmask (0.10 to 0.14, which need transformers < 5);
    else the test is skipped, saying which version is installed."""
    ct = pytest.importorskip("compressed_tensors")
    compressors = importlib.import_module("compressed_tensors.compressors")
    if not hasattr(compressors, "Sparse24BitMaskCompressor"):
        pytest.skip(f"compressed-tensors {ct.__version__} no longer reads sparse-24-bitmask (0.10 to 0.14 do, and "
                    "need transformers < 5); this environment has the format checked by "
                    "test_tied_embeddings_save_once_and_load_back's own decoder only")
    return ct


def test_compressed_tensors_reads_the_checkpoint_back(tmp_path):
    bitmask_reader()
    from compressed_tensors.compressors import Sparse24BitMaskCompressor
    from compressed_tensors.config import Sparse24BitMaskConfig

    model = trained(sl.SSTE())
    served = sl.export(model, kernel="dense")
    sl.save_compressed_tensors(served, tmp_path)
    compressor = Sparse24BitMaskCompressor(config=Sparse24BitMaskConfig(targets=["Linear"]))
    dense = dict(compressor.decompress(str(tmp_path)))
    for name in ("mlp.0", "mlp.2"):
        torch.testing.assert_close(dense[f"{name}.weight"], served.get_submodule(name).weight, rtol=0, atol=0)


def test_hugging_face_export_loads_through_compressed_tensors(tmp_path):
    transformers = pytest.importorskip("transformers")
    bitmask_reader()
    from compressed_tensors.compressors import ModelCompressor

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=0)
    model = sl.sparsify(transformers.LlamaForCausalLM(config), sl.STE()).eval()
    served = sl.export(model, kernel="dense")
    sl.save_compressed_tensors(served, tmp_path)
    # what serving stacks do: a dense model from the config, the compressor fills its weights
    fresh = transformers.LlamaForCausalLM(transformers.AutoConfig.from_pretrained(tmp_path))
    ModelCompressor.from_pretrained(str(tmp_path)).decompress(str(tmp_path), fresh)
    x = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(fresh.eval()(input_ids=x).logits, model(input_ids=x).logits)


def decompress_24_bitmask(path):
    """The dense state dict of a sparse-24-bitmask checkpoint, decoded here from the format's definition
    (each row's kept values in order, the mask as little-endian packed bits, the shape)."""
    from safetensors.torch import load_file

    state = load_file(path / "model.safetensors")
    dense = {}
    for key in [k for k in state if k.endswith(".bitmask")]:
        name = key[: -len(".bitmask")]
        rows, cols = state.pop(f"{name}.shape").reshape(-1).tolist()
        bits = state.pop(key)
        mask = ((bits.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1).bool().reshape(rows, -1)[:, :cols]
        weight = torch.zeros(rows, cols, dtype=state[f"{name}.compressed"].dtype)
        weight[mask] = state.pop(f"{name}.compressed").reshape(-1)
        dense[f"{name}.weight"] = weight
    return {**state, **dense}


@pytest.mark.parametrize("kind", ["bert", "llama-tied"])
def test_tied_embeddings_save_once_and_load_back(kind, tmp_path):
    """Tied input and output embeddings are one tensor under two names: the checkpoint holds it once
    (under the embedding's name) and a model built from the saved config ties it back."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, max_position_embeddings=32)
        model_cls, tied = transformers.BertForMaskedLM, {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    else:
        config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                          bos_token_id=0, eos_token_id=0)
        model_cls, tied = transformers.LlamaForCausalLM, {"lm_head.weight"}
    model = sl.sparsify(model_cls(config), sl.STE()).eval()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    served = sl.export(model, kernel="dense")
    sl.save_compressed_tensors(served, tmp_path)
    state = decompress_24_bitmask(tmp_path)
    assert not tied & set(state)
    fresh = model_cls(transformers.AutoConfig.from_pretrained(tmp_path)).eval()
    result = fresh.load_state_dict(state, strict=False)
    assert result.unexpected_keys == [] and set(result.missing_keys) <= tied
    assert fresh.get_output_embeddings().weight is fresh.get_input_embeddings().weight
    x = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(fresh(input_ids=x).logits, model(input_ids=x).logits, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "cusparselt"])
def test_export_on_cusparselt_compresses_once(backend):
    """On a GPU the exported layers hold cuSPARSELt's compressed S(W) and never compress again; the
    outputs match the trained model's eval forward (bf16, to rounding when it trained on 'torch')."""
    torch.manual_seed(0)
    model = TinyMLP()
    model.mlp = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))  # cuSPARSELt-sized
    model = sl.sparsify(model.cuda().to(torch.bfloat16), sl.STE(transposable=True, backend=backend)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportFallbackWarning)
        served = sl.export(model)
    layer = served.mlp[0]
    assert layer.kernel == "cusparselt" and not hasattr(layer, "weight") and layer._operand._weight is None
    before = layer._backend.stats["compressions"]
    x = torch.randn(4, 32, 64, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        got, expected = served.mlp(x), model.mlp(x)
        served.mlp(x)  # a second call: still no compression
    assert layer._backend.stats["compressions"] == before  # compressed at export only
    tol = dict(rtol=0, atol=0) if backend == "cusparselt" else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got, expected, **tol)


def test_gpt2_conv1d_export_runs_but_is_refused_by_the_checkpoint_format(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=16)
    model = sl.sparsify(transformers.GPT2LMHeadModel(config), sl.STE()).eval()
    served = sl.export(model, kernel="dense")
    x = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(served(input_ids=x).logits, model(input_ids=x).logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"GPT-2 Conv1D modules, whose checkpoints store W as \(in, out\)"):
        sl.save_compressed_tensors(served, tmp_path)
