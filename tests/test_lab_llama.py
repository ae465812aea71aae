"""``--model llama``: the lab trains transformers' LlamaForCausalLM (built from the lab's sizes) with the same
data, trainer, checkpoints and comparison; 2:4 on the MLP linears the Hugging Face table names."""
import json
import sys

import pytest
import torch
from _lab_testing import CLI_TINY, cli_code, tiny_config, tiny_corpus_file, without_speed

transformers = pytest.importorskip("transformers", reason="--model llama needs the 'hf' extra")

from sparsity_lab.lab.cli import main  # noqa: E402
from sparsity_lab.lab import GPTConfig, Trainer, load_corpus, read_log  # noqa: E402
from sparsity_lab.lab.llama import LlamaLM, llama_config  # noqa: E402
from sparsity_lab.layers import SparseLinear  # noqa: E402

TINY = GPTConfig(arch="llama", ffn_kind="swiglu", n_layer=2, n_head=2, d_model=16, context=16)
MLP = [f"hf.model.layers.{i}.mlp.{p}" for i in range(2) for p in ("gate_proj", "up_proj", "down_proj")]


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(max_bytes=100_000)


def test_llama_config_carries_the_lab_sizes():
    cfg = GPTConfig(arch="llama", ffn_kind="geglu", n_layer=3, n_head=4, d_model=32, context=24, ffn_hidden=48,
                    tie_embeddings=False)
    hf = llama_config(cfg)
    assert (hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads) == (32, 3, 4, 4)
    assert (hf.intermediate_size, hf.max_position_embeddings, hf.vocab_size) == (48, 24, 256)
    assert hf.hidden_act == "gelu" and hf.tie_word_embeddings is False and hf.model_type == "llama"
    assert llama_config(TINY).intermediate_size == TINY.hidden == 48  # 8d/3 rounded up to 16, as the GPT's swiglu


def test_loss_is_next_token_cross_entropy_as_transformers_computes_it():
    torch.manual_seed(0)
    model = LlamaLM(TINY).eval()
    ids = torch.randint(0, 256, (3, 17))
    x, y = ids[:, :-1], ids[:, 1:]  # the lab's sampler gives targets already shifted by one
    _, ours = model(x, y)
    theirs = model.hf(input_ids=x, labels=x).loss  # transformers shifts the labels itself
    # theirs scores positions 0..T-2 against x[1:], ours 0..T-1 against y: the same on the shared positions
    logits, _ = model(x)
    shared = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 256), y[:, :-1].reshape(-1))
    torch.testing.assert_close(theirs, shared)
    assert ours.shape == () and torch.isfinite(ours)
    with pytest.raises(ValueError, match="exceeds the model's context 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_trainer_makes_exactly_the_mlp_linears_2_4(corpus):
    trainer = Trainer(tiny_config(TINY, method="sste", steps=3, eval_interval=3), corpus=corpus)
    assert [name for name, _ in trainer.layers] == MLP
    dense = [n for n, m in trainer.model.named_modules() if type(m) is torch.nn.Linear]
    assert dense and all(".self_attn." in n or n == "hf.lm_head" for n in dense)
    assert trainer.model.num_params() == trainer.model.hf.num_parameters()
    summary = trainer.run()
    assert summary["step"] == 3 and summary["final_val_loss"] < 6.0
    rows = trainer.history
    assert rows[-1]["density"] == 0.5 and rows[-1]["flip_rate"] is not None
    assert all(isinstance(m, SparseLinear) for n, m in trainer.model.named_modules() if n in MLP)


def test_resume_follows_the_same_losses_bitwise(tmp_path, corpus):
    cfg = dict(method="sste", method_options={"mvue": True, "transposable": True}, steps=6)
    straight = Trainer(tiny_config(TINY, **cfg), corpus=corpus)
    straight.run()
    ckpt = tmp_path / "ck.pt"
    first = Trainer(tiny_config(TINY, **cfg, checkpoint_path=str(ckpt)), corpus=corpus)
    first.run(stop_at=3)
    resumed = Trainer.resume(ckpt, corpus=corpus)
    assert resumed.config.model.arch == "llama" and resumed.step == 3
    resumed.run()
    assert without_speed(resumed.history) == without_speed(straight.history[3:])
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))


def test_cli_train_resume_and_compare(tmp_path, capsys):
    text = tiny_corpus_file(tmp_path)
    out = tmp_path / "run"
    args = ["train", "--model", "llama", "--method", "ste", "--data", text, "--steps", "4", "--out", str(out), *CLI_TINY]
    assert main([*args, "--stop-at", "2"]) == 0
    assert main(["train", "--resume", str(out / "checkpoint.pt"), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 4 and summary["config"]["model"]["arch"] == "llama"
    assert summary["config"]["model"]["ffn_kind"] == "swiglu"  # Llama's MLP unless --ffn says otherwise
    assert cli_code(["train", "--resume", str(out / "checkpoint.pt"), "--model", "gpt"]) == 2
    assert "drop --model" in capsys.readouterr().err  # the checkpoint says which model it trained

    comp = tmp_path / "compare"
    assert main(["compare", "--model", "llama", "--variants", "dense,ste", "--data", text, "--steps", "4",
                 "--out", str(comp), *CLI_TINY]) == 0
    table = {r["variant"]: r for r in json.loads((comp / "results.json").read_text())["table"]}
    assert set(table) == {"dense", "ste"} and all(r["status"] == "ok" for r in table.values())
    assert "flip/hf.model.layers.0.mlp.down_proj" in read_log(comp / "ste" / "log.jsonl")[-1]


@pytest.mark.parametrize("argv,message", [
    (["--ffn", "gelu"], "arch='llama' has a gated MLP (gate_proj, up_proj, down_proj): ffn_kind must be"),
    (["--width", "30", "--heads", "3"], "d_model=30 is not divisible by 4"),
])
def test_cli_errors_are_one_clear_line(tmp_path, capsys, argv, message):
    text = tiny_corpus_file(tmp_path)
    code = main(["train", "--model", "llama", *CLI_TINY, "--data", text, "--steps", "2", "--out",
                 str(tmp_path / "r"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_without_transformers_the_error_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    code = main(["train", "--model", "llama", *CLI_TINY, "--data", tiny_corpus_file(tmp_path), "--steps", "2",
                 "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("sparsity-lab train: error: --model llama:")
    assert 'pip install -e ".[hf]"' in err and "Traceback" not in err
    with pytest.raises(ImportError, match=r"\[hf\]"):
        LlamaLM(TINY)


def test_config_errors():
    with pytest.raises(ValueError, match="arch must be one of"):
        GPTConfig(arch="bert")
    with pytest.raises(ValueError, match="no dropout layers"):
        GPTConfig(arch="llama", ffn_kind="swiglu", dropout=0.1)


@pytest.mark.parametrize("structure,layer_type", [("dyad", "DyadLinear"), ("prune_regrow", "BlockSparseLinear")])
def test_the_structures_replace_the_mlp_linears(corpus, structure, layer_type):
    cfg = GPTConfig(arch="llama", ffn_kind="swiglu", n_layer=1, n_head=2, d_model=32, context=16)
    trainer = Trainer(tiny_config(cfg, method=structure, steps=2, eval_interval=2), corpus=corpus)
    replaced = [n for n, m in trainer.model.named_modules() if type(m).__name__ == layer_type]
    assert replaced == [f"hf.model.layers.0.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")]
    assert trainer.run()["step"] == 2
