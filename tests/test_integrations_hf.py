"""Hugging Face models built from tiny configs (never downloaded): which linears sparsify converts,
GPT-2's Conv1D, the sparse checkpoint through save_pretrained / from_pretrained, dense weights
into a sparse model, and the Trainer callback."""
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

import sparsity_lab as sl
from sparsity_lab.architectures import ARCHITECTURES
from sparsity_lab.conv1d import SparseConv1D

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("sparsity_lab.integrations.hf")

VOCAB = 64
TOKENS = dict(bos_token_id=0, eos_token_id=0, pad_token_id=0)
DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, **TOKENS)
ENCODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=32, **TOKENS)

# model_type -> (config class, model class, config kwargs, expected MLP linears of layer 0)
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", DECODER, ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj",
                                                           "model.layers.0.mlp.down_proj"]),
    "mistral": ("MistralConfig", "MistralForCausalLM", DECODER, ["model.layers.0.mlp.gate_proj",
                                                                 "model.layers.0.mlp.up_proj",
                                                                 "model.layers.0.mlp.down_proj"]),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", DECODER, ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj",
                                                           "model.layers.0.mlp.down_proj"]),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(DECODER, head_dim=8),
              ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"]),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(DECODER, head_dim=8),
              ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"]),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                                   **TOKENS),
             ["transformer.h.0.mlp.c_fc", "transformer.h.0.mlp.c_proj"]),
    "bert": ("BertConfig", "BertForMaskedLM", ENCODER, ["bert.encoder.layer.0.intermediate.dense",
                                                        "bert.encoder.layer.0.output.dense"]),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", dict(ENCODER, max_position_embeddings=40, pad_token_id=1),
                ["roberta.encoder.layer.0.intermediate.dense", "roberta.encoder.layer.0.output.dense"]),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                                num_attention_heads=4, word_embed_proj_dim=32,
                                                max_position_embeddings=32, **TOKENS),
            ["model.decoder.layers.0.fc1", "model.decoder.layers.0.fc2"]),
}


def build(kind, seed=0):
    config_cls, model_cls, kwargs, _ = MODELS[kind]
    torch.manual_seed(seed)
    return getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kwargs)).eval()


def tokens(seed=1, batch=2, length=8):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x).logits


def test_every_table_entry_is_tested():
    assert set(MODELS) == set(ARCHITECTURES)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_sparsify_finds_exactly_the_mlp_linears(kind):
    model = build(kind)
    reference = logits(model, tokens())
    sl.sparsify(model, sl.Dense())  # dense products: the outputs must not change
    names = [name for name, _ in sl.sparse_layers(model)]
    layer0 = [name for name in names if ".0." in name]
    assert layer0 == MODELS[kind][3]
    assert len(names) == 2 * len(layer0)  # both blocks, nothing else (no attention, no head)
    torch.testing.assert_close(logits(model, tokens()), reference, rtol=0, atol=0)
    recipe = model.config.sparsity_lab
    assert recipe["groups"] == [{"method": "dense", "fields": recipe["groups"][0]["fields"], "layers": names}]


def test_bert_second_ffn_linear_is_not_the_attention_output():
    model = build("bert")
    sl.sparsify(model, sl.STE())
    converted = {name for name, _ in sl.sparse_layers(model)}
    assert "bert.encoder.layer.0.attention.output.dense" not in converted
    assert "bert.encoder.layer.0.output.dense" in converted


def test_select_picks_anything_and_unknown_models_use_the_name_pattern():
    model = build("llama")
    sl.sparsify(model, sl.STE(), select=lambda name, module: name.endswith("self_attn.q_proj"))
    assert [n for n, _ in sl.sparse_layers(model)] == ["model.layers.0.self_attn.q_proj",
                                                        "model.layers.1.self_attn.q_proj"]
    plain = nn.Sequential()
    plain.add_module("mlp", nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)))
    plain.add_module("head", nn.Linear(8, 8))
    sl.sparsify(plain, sl.STE())  # no config.model_type: the generic FFN name pattern
    assert [n for n, _ in sl.sparse_layers(plain)] == ["mlp.0", "mlp.2"]


def test_sparsify_keeps_the_eval_mode():
    model = build("llama")  # eval()
    sl.sparsify(model, sl.STE())
    assert not any(layer.training for _, layer in sl.sparse_layers(model))


def test_conv1d_is_the_masked_linear_and_keeps_gpt2_layout():
    model = build("gpt2")
    dense_copy = build("gpt2")
    sl.sparsify(model, sl.STE())
    layer = model.transformer.h[0].mlp.c_fc
    assert isinstance(layer, SparseConv1D) and layer.weight.shape == (128, 32)
    assert sl.is_nm(layer.mask, 2, 4)
    # the sparse model computes the dense GPT-2 with W * m: put m (in Conv1D layout) into the copy
    with torch.no_grad():
        for name, sparse in sl.sparse_layers(model):
            dense_copy.get_submodule(name).weight.mul_(sparse.mask.t())
    torch.testing.assert_close(logits(model, tokens()), logits(dense_copy, tokens()))
    state = model.state_dict()
    assert state["transformer.h.0.mlp.c_fc.weight"].shape == (32, 128)  # Conv1D's (in, out)
    assert torch.equal(state["transformer.h.0.mlp.c_fc.mask"], layer.mask.t())
    bad = dict(state)
    bad["transformer.h.0.mlp.c_fc.weight"] = layer.weight.detach()  # (out, in): the wrong layout
    with pytest.raises(RuntimeError, match=r"Conv1D-layout tensor of shape \(in, out\) = \(32, 128\)"):
        model.load_state_dict(bad)


def train_steps(model, steps, seed=3):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    handle = sl.attach_optimizer(model, opt)
    model.train()
    torch.manual_seed(seed)  # GPT-2's dropout
    losses = []
    for step in range(steps):
        x = tokens(seed + step)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    handle.remove()
    return losses


def sparse_state(model):
    return {name: (layer.mask.clone(), layer.beta.clone(), layer.get_extra_state().tolist())
            for name, layer in sl.sparse_layers(model)}


@pytest.mark.parametrize("kind,method", [("llama", sl.SSTE(mvue=True)), ("gpt2", sl.MaskedDecay(total_steps=20))])
def test_save_pretrained_round_trips_the_sparse_state(kind, method, tmp_path, capsys):
    model = build(kind)
    sl.sparsify(model, method)
    train_steps(model, 3)
    model.save_pretrained(tmp_path)
    loaded = hf.from_pretrained(tmp_path, model_class=type(model))
    assert "sparse state of" in capsys.readouterr().out
    assert [n for n, _ in sl.sparse_layers(loaded)] == [n for n, _ in sl.sparse_layers(model)]
    before, after = sparse_state(model), sparse_state(loaded)
    for name in before:
        assert torch.equal(before[name][0], after[name][0]) and torch.equal(before[name][1], after[name][1])
        assert before[name][2] == after[name][2] and before[name][2][0] == 3  # counters, step 3
    model.eval(), loaded.eval()
    torch.testing.assert_close(logits(loaded, tokens()), logits(model, tokens()), rtol=0, atol=0)
    # training goes on identically (the MVUE draws follow the restored counters)
    assert train_steps(loaded, 2, seed=9) == train_steps(model, 2, seed=9)


def test_from_pretrained_of_a_dense_checkpoint_needs_a_method_and_says_what_it_did(tmp_path, capsys):
    build("llama").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="dense checkpoint .* pass method="):
        hf.from_pretrained(tmp_path)
    model = hf.from_pretrained(tmp_path, method=sl.STE())
    out = capsys.readouterr().out
    assert "dense checkpoint: masks of 6 sparse layers computed from the loaded weights" in out
    layer = model.model.layers[0].mlp.up_proj
    assert torch.equal(layer.mask, sl.nm_mask(layer.weight.detach(), 2, 4)) and layer.step == 0


def test_load_dense_checkpoint_restarts_the_sparse_state(tmp_path, capsys):
    dense = build("gpt2", seed=5)
    dense.save_pretrained(tmp_path)
    model = build("gpt2", seed=0)
    sl.sparsify(model, sl.SSTE())
    train_steps(model, 2)
    report = hf.load_dense_checkpoint(model, tmp_path)
    out = capsys.readouterr().out
    assert "dense checkpoint: masks of 4 sparse layers computed from the loaded weights" in out
    assert report.missing == [] and report.unexpected == []  # the tied lm_head is not "missing"
    fresh = build("gpt2", seed=5)
    sl.sparsify(fresh, sl.SSTE())  # what converting the dense model gives
    for (name, a), (_, b) in zip(sl.sparse_layers(model), sl.sparse_layers(fresh)):
        assert torch.equal(a.weight, b.weight) and torch.equal(a.mask, b.mask), name
        assert torch.equal(a.beta, b.beta) and a.step == 0 and a.mask_updates == 1, name
    model.eval()
    torch.testing.assert_close(logits(model, tokens()), logits(fresh, tokens()), rtol=0, atol=0)
    with pytest.raises(ValueError, match="holds sparse state"):
        hf.load_dense_checkpoint(model, model.state_dict())
    partial = {k: v for k, v in dense.state_dict().items() if "h.1.mlp.c_fc" not in k}
    with pytest.raises(ValueError, match=r"lacks the weights of sparse layers \['transformer.h.1.mlp.c_fc'\]"):
        hf.load_dense_checkpoint(model, partial)


def test_trainer_callback_attaches_the_hooks_and_logs_flip_rate(tmp_path):
    from sparsity_lab.integrations.trainer_callback import SparsityCallback

    model = build("llama")
    sl.sparsify(model, sl.MaskedDecay(decay=1e-2, total_steps=6))
    data = [{"input_ids": tokens(i, batch=1, length=16)[0], "labels": tokens(i, batch=1, length=16)[0]}
            for i in range(12)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=2, logging_steps=2, report_to=[],
        save_strategy="steps", save_steps=3, learning_rate=1e-2, use_cpu=True, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[SparsityCallback()])
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in logs] == [2, 4, 6]
    assert all(0 < entry["flip_rate"] < 1 for entry in logs[:2])
    assert [entry["sparse_dense_phase"] for entry in logs] == [0.0, 0.0, 1.0]  # dense from step 5
    layers = sl.sparse_layers(model)
    assert all(layer.step == 6 and not layer.attached_optimizer for _, layer in layers)  # hooks removed
    # the Trainer's own checkpoint (safetensors) holds the sparse state of step 3
    resumed = hf.from_pretrained(tmp_path / "checkpoint-3", model_class=type(model), verbose=False)
    assert all(layer.step == 3 for _, layer in sl.sparse_layers(resumed))


def trainer_for(model, tmp_path, max_steps=6, callbacks=None, **args):
    data = [{"input_ids": tokens(i, batch=1, length=16)[0], "labels": tokens(i, batch=1, length=16)[0]}
            for i in range(12)]
    settings = dict(output_dir=str(tmp_path), max_steps=max_steps, per_device_train_batch_size=2, logging_steps=2,
                    report_to=[], save_strategy="no", learning_rate=1e-2, use_cpu=True, disable_tqdm=True)
    return transformers.Trainer(model=model, args=transformers.TrainingArguments(**{**settings, **args}),
                                train_dataset=data, callbacks=callbacks)


def test_flip_rate_reaches_tensorboard(tmp_path, monkeypatch):
    """Reporters (report_to) run before callbacks passed to the Trainer: add_to puts the callback before
    them, and TensorBoard's event file holds flip_rate and sparse_dense_phase at every logging step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from sparsity_lab.integrations.trainer_callback import SparsityCallback

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    model = build("llama")
    sl.sparsify(model, sl.MaskedDecay(decay=1e-2, total_steps=6))
    trainer = trainer_for(model, tmp_path, report_to=["tensorboard"])
    SparsityCallback().add_to(trainer)
    trainer.train()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    logged = {entry["step"]: entry for entry in trainer.state.log_history if "loss" in entry}
    for tag in ("flip_rate", "sparse_dense_phase"):
        scalars = {e.step: e.value for e in events.Scalars(f"train/{tag}")}
        assert sorted(scalars) == [2, 4, 6]
        assert all(scalars[step] == pytest.approx(logged[step][tag]) for step in scalars)


def test_callback_behind_the_reporters_refuses_to_start(tmp_path):
    from sparsity_lab.integrations.trainer_callback import SparsityCallback

    model = build("llama")
    sl.sparsify(model, sl.STE())
    trainer = trainer_for(model, tmp_path, callbacks=[SparsityCallback()], report_to=["tensorboard"])
    with pytest.raises(ValueError, match=r"would reach none of them.*SparsityCallback\(\)\.add_to\(trainer\)"):
        trainer.train()


def test_masked_decay_takes_the_trainers_step_count(tmp_path):
    """A 6-step run of MaskedDecay(total_steps=10_000) would never reach its dense phase: the callback
    gives the layers the Trainer's max_steps, says so, and records it in the recipe."""
    from sparsity_lab.integrations.trainer_callback import SparsityCallback

    model = build("llama")
    sl.sparsify(model, sl.MaskedDecay(decay=1e-2, total_steps=10_000))
    trainer = trainer_for(model, tmp_path)
    SparsityCallback().add_to(trainer)
    with pytest.warns(UserWarning, match=r"total_steps=10000, but the Trainer runs max_steps=6: .*dense fine-tune "
                                         r"from step 5"):
        trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["sparse_dense_phase"] for entry in logs] == [0.0, 0.0, 1.0]
    assert {layer.method.total_steps for _, layer in sl.sparse_layers(model)} == {6}
    assert [g["fields"]["total_steps"] for g in model.config.sparsity_lab["groups"]] == [6]


def test_from_pretrained_takes_a_hub_id(tmp_path, monkeypatch):
    """A repository id is fetched by huggingface_hub (a stand-in here: no network), config and
    safetensors only, with the download options passed on; a name that is neither says so."""
    import huggingface_hub

    model = build("llama")
    sl.sparsify(model, sl.SSTE())
    model.save_pretrained(tmp_path / "snapshot")
    asked = []

    def snapshot_download(repo_id, **options):
        asked.append((repo_id, options))
        if repo_id != "org/tiny-sparse-llama":
            raise huggingface_hub.errors.RepositoryNotFoundError(f"no repository {repo_id}")
        return str(tmp_path / "snapshot")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    loaded = hf.from_pretrained("org/tiny-sparse-llama", revision="main", verbose=False)
    assert asked[0][0] == "org/tiny-sparse-llama" and asked[0][1]["revision"] == "main"
    assert "*.safetensors" in asked[0][1]["allow_patterns"] and "config.json" in asked[0][1]["allow_patterns"]
    assert type(loaded) is type(model) and len(sl.sparse_layers(loaded)) == 6
    torch.testing.assert_close(logits(loaded.eval(), tokens()), logits(model.eval(), tokens()), rtol=0, atol=0)
    with pytest.raises(OSError, match="'org/absent' is neither a local checkpoint directory nor a Hub repository"):
        hf.from_pretrained("org/absent")


def test_from_pretrained_builds_the_checkpoints_architecture_quietly(tmp_path, capfd):
    """BERT masked-LM comes back as BertForMaskedLM (config.architectures), not the causal-LM default;
    verbose=False prints nothing, transformers' load report and progress bars included."""
    model = build("bert")
    sl.sparsify(model, sl.STE())
    model.save_pretrained(tmp_path)
    capfd.readouterr()
    loaded = hf.from_pretrained(tmp_path, verbose=False)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert type(loaded) is transformers.BertForMaskedLM
    torch.testing.assert_close(logits(loaded.eval(), tokens()), logits(model.eval(), tokens()), rtol=0, atol=0)


def test_importing_the_package_does_not_import_transformers():
    code = "import sys, sparsity_lab, sparsity_lab.integrations; print('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_two_models_from_one_config_keep_their_own_recipes(tmp_path):
    """sparsify writes its recipe into a copy of the config: the caller's object and a second model built
    from it stay as they were, and that second model saves and loads with its own recipe."""
    config_cls, model_cls, kwargs, _ = MODELS["llama"]
    config = getattr(transformers, config_cls)(**kwargs)
    first, second = (getattr(transformers, model_cls)(config) for _ in range(2))
    sl.sparsify(first, sl.STE())
    assert getattr(config, "sparsity_lab", None) is None and getattr(second.config, "sparsity_lab", None) is None
    assert first.config is not config and first.model.config is first.config  # the model holds one config
    sl.sparsify(second, sl.SSTE())
    assert [g["method"] for g in first.config.sparsity_lab["groups"]] == ["ste"]
    assert [g["method"] for g in second.config.sparsity_lab["groups"]] == ["sste"]
    second.save_pretrained(tmp_path)
    loaded = hf.from_pretrained(tmp_path, model_class=type(second), verbose=False)
    assert {layer.method.name for _, layer in sl.sparse_layers(loaded)} == {"sste"}


PLAIN_LOADERS = {"llama": "AutoModelForCausalLM", "gpt2": "AutoModelForCausalLM", "bert": "AutoModelForMaskedLM"}


@pytest.mark.parametrize("kind,method", [("llama", sl.SSTE(mvue=True)), ("gpt2", sl.STE()),
                                         ("bert", sl.SRSTE(decay=1e-2))], ids=lambda p: getattr(p, "name", p))
def test_plain_transformers_loads_the_2_4_model_from_a_training_checkpoint(kind, method, tmp_path):
    """save_pretrained writes each 2:4 layer's weight as its forward uses it, S(W): plain transformers
    gives the 2:4 model's logits (not those of the dense latent W, which training continues from)."""
    model = build(kind)
    sl.sparsify(model, method)
    train_steps(model, 3)
    model.eval()
    model.save_pretrained(tmp_path)
    plain = getattr(transformers, PLAIN_LOADERS[kind]).from_pretrained(tmp_path).eval()
    assert not sl.sparse_layers(plain)
    x = tokens()
    torch.testing.assert_close(logits(plain, x), logits(model, x), rtol=0, atol=0)
    # the latent W is in the checkpoint too, and is not S(W): the test above could fail
    saved = hf.read_safetensors(tmp_path)
    name, layer = sl.sparse_layers(model)[0]
    assert not torch.equal(saved[f"{name}.weight"], saved[f"{name}.latent_weight"])
    torch.testing.assert_close(hf.from_pretrained(tmp_path, verbose=False).get_submodule(name).weight,
                               layer.weight, rtol=0, atol=0)


@pytest.mark.parametrize("method", [sl.STE(), sl.SRSTE(decay=1e-2), sl.SSTE(), sl.Dense(),
                                    sl.MaskedDecay(decay=1e-2, total_steps=4, dense_finetune_at=0.5),
                                    sl.MaskedDecayOnWeights(decay=1e-1, total_steps=20)], ids=lambda m: m.name)
def test_checkpoint_weight_is_the_exported_weight(method, tmp_path):
    """Every method, a dense phase (masked decay's fine-tune, Dense) included: the checkpoint's weight of
    each 2:4 layer is the weight export serves."""
    model = build("llama")
    sl.sparsify(model, method)
    train_steps(model, 3)
    model.save_pretrained(tmp_path)
    saved = hf.read_safetensors(tmp_path)
    served = sl.export(model, kernel="dense")
    for name, layer in sl.sparse_layers(model):
        torch.testing.assert_close(saved[f"{name}.weight"], served.get_submodule(name).weight, rtol=0, atol=0)
        torch.testing.assert_close(saved[f"{name}.latent_weight"], layer.weight.detach(), rtol=0, atol=0)


def test_trainer_resumes_a_checkpoint_exactly(tmp_path):
    """The Trainer's resume_from_checkpoint loads its checkpoint with load_state_dict: the layers take the
    latent W (not the S(W) stored for plain loaders), and the resumed run ends where the uninterrupted one does."""
    from sparsity_lab.integrations.trainer_callback import SparsityCallback

    def run(out, **options):
        model = build("llama")
        sl.sparsify(model, sl.SSTE(mvue=True))
        trainer = trainer_for(model, out, max_steps=4, save_strategy="steps", save_steps=2, **options)
        SparsityCallback().add_to(trainer)
        return model, trainer

    straight, trainer = run(tmp_path / "straight")
    trainer.train()
    resumed, trainer = run(tmp_path / "resumed")
    trainer.train(resume_from_checkpoint=str(tmp_path / "straight" / "checkpoint-2"))
    a, b = straight.state_dict(), resumed.state_dict()
    assert list(a) == list(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_a_sharded_checkpoint_keeps_each_latent_beside_its_weight(tmp_path):
    """Shards of a few KB put nearly every tensor in a file of its own: each layer's latent W is moved into
    the shard of its S(W), so the Trainer's shard-by-shard resume gives every layer W whatever the order of
    the shards; plain transformers and from_pretrained read the index."""
    from safetensors.torch import load_file

    model = build("llama")
    sl.sparsify(model, sl.SSTE())
    train_steps(model, 2)
    model.eval()
    model.save_pretrained(tmp_path, max_shard_size="4KB")
    where = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(where.values())) > 10
    for name, _ in sl.sparse_layers(model):
        assert where[f"{name}.latent_weight"] == where[f"{name}.weight"], name
    assert {path.name for path in tmp_path.glob("*.safetensors")} == set(where.values())
    for reverse in (False, True):  # the Trainer's resume: load_state_dict(strict=False) shard by shard
        target = build("llama", seed=1)
        sl.sparsify(target, sl.SSTE())
        for shard in sorted(set(where.values()), reverse=reverse):
            target.load_state_dict(load_file(tmp_path / shard), strict=False)
        for (name, a), (_, b) in zip(sl.sparse_layers(model), sl.sparse_layers(target)):
            assert torch.equal(a.weight, b.weight), (name, reverse)
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(logits(plain, tokens()), logits(model, tokens()), rtol=0, atol=0)
    loaded = hf.from_pretrained(tmp_path, verbose=False)
    torch.testing.assert_close(logits(loaded.eval(), tokens()), logits(model, tokens()), rtol=0, atol=0)


def test_save_pretrained_with_push_to_hub_says_to_push_the_model(tmp_path):
    model = build("llama")
    sl.sparsify(model, sl.STE())
    with pytest.raises(ValueError, match=r"model.push_to_hub\(repo_id\)"):
        model.save_pretrained(tmp_path, push_to_hub=True)


def test_checkpoints_of_the_first_format_still_load(tmp_path):
    """Format 1 (config.sparsity_lab) stored the latent W as the weight, with no latent_weight: loaded as
    before. Format 2 without its latent weights is refused (it would train on S(W))."""
    from safetensors.torch import save_file

    model = build("llama")
    sl.sparsify(model, sl.SSTE())
    train_steps(model, 2)
    model.save_pretrained(tmp_path)
    saved = hf.read_safetensors(tmp_path)
    latents = {key: saved.pop(key) for key in [k for k in saved if k.endswith(".latent_weight")]}
    save_file(saved, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lack 6 of their state tensors, e.g. \['[^']*latent_weight'"):
        hf.from_pretrained(tmp_path, verbose=False)
    for key, value in latents.items():
        saved[key.replace(".latent_weight", ".weight")] = value
    save_file(saved, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    config["sparsity_lab"]["format"] = 1
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = hf.from_pretrained(tmp_path, verbose=False)
    for (name, a), (_, b) in zip(sl.sparse_layers(model), sl.sparse_layers(loaded)):
        assert torch.equal(a.weight, b.weight) and torch.equal(a.beta, b.beta), name
    assert loaded.config.sparsity_lab["format"] == 2  # saved again, it writes the current format
