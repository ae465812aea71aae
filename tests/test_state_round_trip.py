"""Every piece of training state survives every save/load path: for each registered backend (on the CPU;
the GPU ones run their CPU fallback) x each method, through one of the paths (Hugging Face ``save_pretrained``
/ ``hf.from_pretrained``, the lab's checkpoint through ``Trainer.resume``, ``torch.distributed.checkpoint``),
chosen so that every backend also meets every path and every method every path (all pairs, CASES), a model
trained for a few steps is saved and loaded, and the loaded model must hold the same state (every
state-dict tensor: weights, masks, S-STE's beta, the counters, FP8 scales and amax histories; the host
counters and FP8 recipes behind them) and give the same logits, bit for bit. The load target is built
from another seed, so nothing can match by coincidence."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import sparsity_lab as sl
from sparsity_lab.backends import available_backends
from sparsity_lab.backends.cusparselt.backend import BackendFallbackWarning
from sparsity_lab.activation24 import Act24MLP
from sparsity_lab.methods.config import METHODS, method_from_name
from sparsity_lab.methods.fp8_scaling import FP8Recipe, FP8ScalingState

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("sparsity_lab.integrations.hf")

BACKENDS = ["torch", "triton", "cusparselt", "cusparselt_auto", "sparse_auto", "torch_fp8sim", "triton_fp8sim",
            "cusparselt_fp8", "fp8_dense", "fp8_reference"]
# backends with no CPU stand-in: asking for them where they cannot run raises (tests/test_cutlass_backend.py)
NO_CPU_STAND_IN = {"cutlass", "cutlass_fp8"}
# options that give every piece of state a value of its own within three steps: MVUE draws counted, flips,
# a refresh interval (mask_step != step), masked decay's schedule
METHOD_OPTIONS = {
    "dense": {"track_flips": True},
    "ste": {},
    "srste": {"decay": 1e-2},
    "masked_decay": {"decay": 1e-2, "mask_refresh_interval": 2},
    "masked_decay_weights": {"decay": 1e-1},
    "sste": {"mvue": True},
}
STEPS, TOTAL = 2, 8
VOCAB = 64


def method_for(name: str, backend: str):
    return method_from_name(name, backend=backend, total_steps=TOTAL, **METHOD_OPTIONS[name])


def test_every_backend_and_method_is_covered():
    assert sorted(BACKENDS) == sorted(set(available_backends()) - NO_CPU_STAND_IN)
    assert set(METHOD_OPTIONS) == set(METHODS)
    # CASES covers all pairs: each backend with each method, each backend and each method through each path
    assert {(b, m) for b, m, _ in CASES} == {(b, m) for b in BACKENDS for m in METHOD_OPTIONS}
    assert len(CASES) == len(BACKENDS) * len(METHOD_OPTIONS)  # each pair once
    assert {(b, p) for b, _, p in CASES} == {(b, p) for b in BACKENDS for p in PATHS}
    assert {(m, p) for _, m, p in CASES} == {(m, p) for m in METHOD_OPTIONS for p in PATHS}


# --- what "the same state" means ------------------------------------------------------------------------
def host_state(module: nn.Module) -> dict:
    """The state a module keeps outside its tensors: what its extra state encodes, checked at the source."""
    if isinstance(module, sl.SparseLinear):
        return {"method": module.method, "backend": module.backend.name, **module.counters()}
    if isinstance(module, FP8ScalingState):
        return {"recipe": module.recipe, "updates": module.updates, "host_exponents": module.host_exponents}
    if isinstance(module, Act24MLP):  # host copies of its buffers (no device sync per forward)
        return {"step": module._step, "dense_from": module._dense_from, "token_seed": module._token_seed,
                "token_draws": module._token_draws, "weight_grads": module.weight_grads}
    return {}


def assert_same_state(saved: nn.Module, loaded: nn.Module) -> None:
    a, b = saved.state_dict(), loaded.state_dict()
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert torch.equal(a[key], b[key]), key
    modules_a, modules_b = dict(saved.named_modules()), dict(loaded.named_modules())
    assert list(modules_a) == list(modules_b)
    for name, module in modules_a.items():
        assert type(module) is type(modules_b[name]), name
        assert host_state(module) == host_state(modules_b[name]), name


def assert_state_is_not_trivial(model: nn.Module) -> None:
    """The state compared above must hold values a fresh model would not (else the test could not fail)."""
    layers = sl.sparse_layers(model)
    assert layers and all(layer.step == STEPS for _, layer in layers)
    for _, layer in layers:
        scaling = getattr(layer.backend, "scaling", None)
        if isinstance(scaling, FP8ScalingState):
            assert scaling.updates == STEPS
            used = 4 if layer.method.mvue else 3  # x, w, dz (and MVUE(dz))
            if scaling.recipe.scaling == "delayed":
                assert (scaling.scale[:used] != 1).all() and (scaling.amax_history[-STEPS:, :used] > 0).all()


# --- the paths -------------------------------------------------------------------------------------------
def tiny_llama(seed: int):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=0,
                                      pad_token_id=0)
    return transformers.LlamaForCausalLM(config)


def tokens(seed: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, (2, 8), generator=torch.Generator().manual_seed(seed))


def sparse_llama(method, seed: int, recipe: FP8Recipe | None = None):
    model = sl.sparsify(tiny_llama(seed), method)
    if recipe is not None:
        from sparsity_lab.backends.cusparselt.fp8_train import set_fp8_recipe
        set_fp8_recipe(model, recipe)
    return model


def train_llama(model, steps: int = STEPS) -> torch.optim.Optimizer:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    handle = sl.attach_optimizer(model, opt)
    model.train()
    for step in range(steps):
        x = tokens(step)
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    handle.remove()
    return opt


def llama_logits(model) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=tokens(99)).logits


def hf_path(method, tmp_path, recipe=None):
    model = sparse_llama(method, 0, recipe)
    train_llama(model)
    model.save_pretrained(tmp_path / "hf")
    loaded = hf.from_pretrained(tmp_path / "hf", model_class=type(model), verbose=False)
    return model, loaded, llama_logits


def dcp_path(method, tmp_path, recipe=None):
    from sparsity_lab.distributed.checkpoint import load_distributed, save_distributed

    model = sparse_llama(method, 0, recipe)
    opt = train_llama(model)
    loaded = sparse_llama(method, 1, recipe)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")  # one process, on purpose (no_dist)
        save_distributed(tmp_path / "dcp", model, opt, no_dist=True)
        load_distributed(tmp_path / "dcp", loaded, torch.optim.AdamW(loaded.parameters(), lr=1e-2), no_dist=True)
    return model, loaded, llama_logits


def lab_path(method, tmp_path, recipe=None, **model_options):
    """The lab's run (its GPT, built from its config): saved by the trainer, back through Trainer.resume.
    recipe: unused (the lab runs the default FP8 recipe)."""
    from sparsity_lab.lab import GPTConfig, TrainConfig, Trainer, load_corpus

    corpus = load_corpus(max_bytes=20_000)
    options = {**METHOD_OPTIONS[method.name], "backend": method.backend}
    model = GPTConfig(n_layer=1, n_head=2, d_model=16, context=16, **model_options)
    config = TrainConfig(method=method.name, method_options=options, model=model, batch_size=2, steps=TOTAL,
                         warmup_steps=1, eval_interval=100, eval_batches=1, device="cpu", progress=False,
                         checkpoint_path=str(tmp_path / "lab.pt"))
    trainer = Trainer(config, corpus=corpus)
    trainer.run(stop_at=STEPS)
    trainer.close()
    loaded = Trainer.resume(tmp_path / "lab.pt", corpus=corpus)
    loaded.close()
    x = tokens(99) % 256

    def logits(model):
        model.eval()
        with torch.no_grad():
            return model(x)[0]
    return trainer.model, loaded.model, logits


PATHS = {"hf": hf_path, "lab": lab_path, "dcp": dcp_path}
# Each (backend, method) once, its path rotating with both indices: 10 backends x 6 methods, and each backend
# goes through each path twice, each method at least three times: all pairs in 60 cases instead of all 180 triples (a
# path saves and loads the model's whole state dict, whatever backend and method filled it).
CASES = [(backend, method, sorted(PATHS)[(i + j) % len(PATHS)])
         for i, backend in enumerate(BACKENDS) for j, method in enumerate(sorted(METHOD_OPTIONS))]


@pytest.mark.parametrize("backend,method,path", CASES)
def test_save_and_load_keep_every_piece_of_state(backend, method, path, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BackendFallbackWarning)  # the GPU backends run their CPU fallback
        saved, loaded, logits = PATHS[path](method_for(method, backend), tmp_path)
    assert_state_is_not_trivial(saved)
    assert_same_state(saved, loaded)
    torch.testing.assert_close(logits(loaded), logits(saved), rtol=0, atol=0)


# --- the FP8 recipe travels with the state -----------------------------------------------------------------
OTHER_RECIPE = FP8Recipe(history_len=16, amax_compute="most_recent", margin=1, grad_format="e5m2")


def test_hf_brings_back_the_fp8_recipe_the_state_was_saved_with(tmp_path):
    """config.json does not record a recipe set after sparsify: the checkpoint's scaling state does."""
    saved, loaded, logits = hf_path(sl.STE(backend="fp8_reference"), tmp_path, recipe=OTHER_RECIPE)
    assert all(m.recipe == OTHER_RECIPE for m in loaded.modules() if isinstance(m, FP8ScalingState))
    assert_same_state(saved, loaded)
    torch.testing.assert_close(logits(loaded), logits(saved), rtol=0, atol=0)


@pytest.mark.parametrize("path", ["hf", "dcp"])
def test_host_alpha_scales_survive_a_round_trip(path, tmp_path):
    """FP8Recipe(scale_in_product="host_alpha"): the host exponents of the scales in use (extra state) and
    next_scale (a buffer) come back, and the loaded model's next step is the saved one's."""
    recipe = FP8Recipe(scale_in_product="host_alpha")
    saved, loaded, logits = PATHS[path](sl.STE(backend="fp8_reference"), tmp_path, recipe=recipe)
    states = [m for m in loaded.modules() if isinstance(m, FP8ScalingState)]
    assert states and all(m.recipe == recipe and m.host_exponents is not None for m in states)  # STEPS = 2: in use
    assert_same_state(saved, loaded)
    torch.testing.assert_close(logits(loaded), logits(saved), rtol=0, atol=0)
    train_llama(saved, 1)
    train_llama(loaded, 1)
    assert_same_state(saved, loaded)


def test_fp8_state_into_a_layer_of_another_recipe_is_refused():
    """Same history length, another amax rule, margin and gradient format: the scales and history mean
    something else there, so the load is refused (naming the fix), not mixed silently."""
    model = sparse_llama(sl.STE(backend="fp8_reference"), 0, recipe=OTHER_RECIPE)
    train_llama(model)
    other = sparse_llama(sl.STE(backend="fp8_reference"), 1)
    refused = r"belong to FP8Recipe\(.*most_recent.*this layer runs FP8Recipe\(.*set_fp8_recipe"
    with pytest.raises(RuntimeError, match=refused):
        other.load_state_dict(model.state_dict())


def test_fp8_state_saved_before_recipes_were_recorded_still_loads():
    model = sparse_llama(sl.STE(backend="fp8_reference"), 0)
    train_llama(model)
    state = model.state_dict()
    for key in [k for k in state if k.endswith("scaling._extra_state")]:
        state[key] = state[key][:1]  # the update count alone, as older checkpoints hold it
    other = sparse_llama(sl.STE(backend="fp8_reference"), 1)
    other.load_state_dict(state)
    assert_same_state(model, other)


@pytest.mark.parametrize("change,match", [("drop", r"lack 1 of their state tensors, e.g. \['[^']*scaling.scale'\]"),
                                          ("add", r"holds 1 state tensors of sparse layers that the rebuilt layers "
                                                  r"do not have, e.g. \['[^']*up_proj.backend.extra'\]")])
def test_hf_refuses_a_checkpoint_whose_sparse_state_it_cannot_restore(tmp_path, change, match):
    from safetensors.torch import load_file, save_file

    model = sparse_llama(sl.STE(backend="fp8_reference"), 0)
    train_llama(model)
    model.save_pretrained(tmp_path)
    file = tmp_path / "model.safetensors"
    tensors = load_file(file)
    if change == "drop":
        del tensors["model.layers.0.mlp.down_proj.backend.scaling.scale"]
    else:
        tensors["model.layers.0.mlp.up_proj.backend.extra"] = torch.ones(2)
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=match):
        hf.from_pretrained(tmp_path, model_class=type(model), verbose=False)


def test_dense_weights_into_an_fp8_model_restart_its_scaling_state_too(capsys):
    model = sparse_llama(sl.STE(backend="fp8_reference"), 0)
    train_llama(model)
    dense = tiny_llama(5).state_dict()
    report = hf.load_dense_checkpoint(model, dense)
    assert report.missing == []  # the FP8 state is restarted, not "missing"
    fresh = sparse_llama(sl.STE(backend="fp8_reference"), 5)  # what converting the dense model gives
    a, b = fresh.state_dict(), model.state_dict()
    for key in a:
        if not key.endswith("_proj._extra_state"):  # the layers keep their MVUE seeds
            assert torch.equal(a[key], b[key]), key
    assert all(m.updates == 0 for m in model.modules() if isinstance(m, FP8ScalingState))
    with pytest.raises(ValueError, match="holds sparse state"):
        hf.load_dense_checkpoint(model, {k: v for k, v in fresh.state_dict().items() if "backend" in k or
                                         not k.endswith(("mask", "beta", "_extra_state"))})


def test_lab_checkpoint_keeps_the_2_4_activation_state(tmp_path):
    """The lab GPT's 2:4 activations (Act24MLP: step, dense switch, token-permutation seed and draws)."""
    saved, loaded, logits = lab_path(sl.STE(), tmp_path, ffn_kind="relu2", activation_sparsity="2:4",
                                     act24_weight_grads="tokens24")
    mlp = saved.blocks[0].mlp
    assert isinstance(mlp, Act24MLP) and mlp._step == STEPS and mlp._token_draws > 0
    assert_same_state(saved, loaded)
    torch.testing.assert_close(logits(loaded), logits(saved), rtol=0, atol=0)
