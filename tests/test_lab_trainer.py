"""The trainer: exact resume, checkpoints, the log's columns, schedules, masked decay and fine-tune."""
import copy
import math

import pytest
import torch
from _lab_testing import tiny_config, without_speed

from sparsity_lab.lab import CheckpointError, GPTConfig, TrainConfig, Trainer, WarmupCosine, load_corpus, read_log

TINY = GPTConfig(n_layer=2, n_head=2, d_model=16, context=16)
LAYERS = [f"blocks.{i}.mlp.{p}" for i in range(2) for p in ("fc", "proj")]


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(max_bytes=100_000)


def config(**kw):
    return tiny_config(TINY, **kw)


@pytest.mark.parametrize("method,options", [
    ("masked_decay", {"mask_refresh_interval": 3}),  # crosses the dense fine-tune switch after resuming
    ("sste", {"mvue": True, "transposable": True}),
    ("srste", {"backend": "torch_fp8sim"}),
])
def test_resume_follows_the_same_losses_bitwise(tmp_path, corpus, method, options):
    cfg = dict(method=method, method_options=options, grad_accum=2, steps=14)
    straight = Trainer(config(**cfg), corpus=corpus)
    straight.run()
    ckpt, log = tmp_path / "ck.pt", tmp_path / "log.jsonl"
    first = Trainer(config(**cfg, checkpoint_path=str(ckpt), log_path=str(log)), corpus=corpus)
    first.run(stop_at=5)
    first.close()
    # weights_only loading works on the file itself
    assert torch.load(ckpt, weights_only=True)["step"] == 5
    resumed = Trainer.resume(ckpt, corpus=corpus)
    assert resumed.step == 5
    resumed.run()
    resumed.close()
    assert without_speed(resumed.history) == without_speed(straight.history[5:])
    assert without_speed(read_log(log)) == without_speed(straight.history)
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))


def test_log_columns_and_values(tmp_path, corpus):
    log = tmp_path / "log.jsonl"
    trainer = Trainer(config(method="masked_decay", log_path=str(log)), corpus=corpus)  # switch at step 10
    trainer.run()
    trainer.close()
    rows = read_log(log)
    expected = {"step", "tokens", "loss", "val_loss", "lr", "grad_norm", "flip_rate", "beta", "density",
                "dense_phase", "tokens_per_s", *(f"flip/{n}" for n in LAYERS)}
    assert all(set(r) == expected for r in rows)
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert [r["tokens"] for r in rows] == [s * 4 * 16 for s in range(1, 13)]
    assert [r["step"] for r in rows if r["val_loss"] is not None] == [4, 8, 12]
    schedule = WarmupCosine(2, 12, 0.1)
    assert [r["lr"] for r in rows] == pytest.approx([1e-3 * schedule(s) for s in range(12)])
    # step 1 uses the initial mask (no flip rate yet); sparse steps 2..10 have one; the fine-tune none
    assert rows[0]["flip_rate"] is None
    assert all(r["flip_rate"] is not None and 0 <= r["flip_rate"] <= 1 for r in rows[1:10])
    assert all(r["flip_rate"] is None for r in rows[10:])
    assert [r["dense_phase"] for r in rows] == [False] * 10 + [True] * 2
    assert [r["density"] for r in rows] == [0.5] * 10 + [1.0] * 2
    assert all(r["beta"] == 1.0 for r in rows)
    layer_rates = [rows[5][f"flip/{n}"] for n in LAYERS]
    assert min(layer_rates) <= rows[5]["flip_rate"] <= max(layer_rates)


def test_dense_and_sste_rows(corpus):
    dense = Trainer(config(method="dense", steps=4), corpus=corpus)
    dense.run()
    assert all(r["density"] == 1.0 and r["dense_phase"] for r in dense.history)
    # the plain dense GPT: no SparseLinear, no masks, no flip rate (nothing paid for them)
    assert not dense.layers and all(r["flip_rate"] is None for r in dense.history)
    assert not any("Sparse" in type(m).__name__ for m in dense.model.modules())
    tracked = Trainer(config(method="dense", steps=4, track_flips=True), corpus=corpus)
    tracked.run()
    assert tracked.layers and all(r["density"] == 1.0 and r["dense_phase"] for r in tracked.history)
    assert tracked.history[-1]["flip_rate"] is not None  # the would-be mask's flip rate: the reference
    # the same dense trajectory either way (the masks are only watched)
    assert [r["loss"] for r in tracked.history] == pytest.approx([r["loss"] for r in dense.history], rel=1e-5)
    sste = Trainer(config(method="sste", steps=2), corpus=corpus)
    sste.run()
    assert 1.2 < sste.history[-1]["beta"] < 1.8  # Gaussian-like initial weights: beta ~ 1.48


def test_track_flips_belongs_to_the_dense_run(corpus):
    with pytest.raises(ValueError, match="track_flips"):
        Trainer(config(method="ste", track_flips=True), corpus=corpus)
    # a dense run saved before the option existed tracked its flips: it resumes as it was
    old = config(method="dense").to_dict()
    del old["track_flips"]
    assert TrainConfig.from_dict(old).track_flips


def test_log_interval_logs_fewer_rows_with_the_same_trajectory(corpus):
    every = Trainer(config(method="sste", steps=7, eval_interval=100), corpus=corpus)
    every.run()
    sparse_rows = Trainer(config(method="sste", steps=7, eval_interval=100, log_interval=3), corpus=corpus)
    sparse_rows.run()
    assert [r["step"] for r in sparse_rows.history] == [3, 6, 7]  # every 3rd, and the last
    by_step = {r["step"]: r for r in every.history}
    for row in sparse_rows.history:
        assert row["loss"] == pytest.approx(by_step[row["step"]]["loss"], rel=1e-6)
        assert row["flip_rate"] == pytest.approx(by_step[row["step"]]["flip_rate"], rel=1e-6)
        assert row["tokens_per_s"] > 0
    with pytest.raises(ValueError, match="log_interval"):
        config(log_interval=0)


def test_select_all_linears_makes_the_attention_projections_2_4_too(corpus):
    from sparsity_lab.lab.compare import variant_config
    ffn = Trainer(config(method="sste"), corpus=corpus)
    every = Trainer(config(method="sste", select="all_linears"), corpus=corpus)
    n_layer = ffn.config.model.n_layer
    assert sorted({name.split(".", 2)[2] for name, _ in ffn.layers}) == ["mlp.fc", "mlp.proj"]
    assert sorted({name.split(".", 2)[2] for name, _ in every.layers}) == ["attn.proj", "attn.qkv", "mlp.fc", "mlp.proj"]
    assert len(every.layers) == 2 * len(ffn.layers) == 4 * n_layer  # never the LM head
    assert variant_config(config(), "sste_mvue_all_linears", {}, None, None).select == "all_linears"
    assert variant_config(config(), "sste_mvue", {}, None, None).select == "ffn"
    with pytest.raises(ValueError, match="select"):
        config(select="attention")


def test_cuda_graph_needs_a_gpu_and_one_micro_batch(corpus):
    with pytest.raises(ValueError, match="grad_accum 1"):
        config(cuda_graph=True, grad_accum=2)
    with pytest.raises(ValueError, match="masks_in_graph=True .* add --cuda-graph"):
        config(masks_in_graph=True)
    with pytest.raises(ValueError, match="masks_in_graph must be True or False"):
        config(cuda_graph=True, masks_in_graph="no")
    assert config(cuda_graph=True, masks_in_graph=True).masks_in_graph is True
    assert config(cuda_graph=True).masks_in_graph is False
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA GPU"):
            Trainer(config(cuda_graph=True, device="cpu"), corpus=corpus)


def test_same_seed_same_start_for_every_method(corpus):
    a = Trainer(config(method="dense"), corpus=corpus)
    b = Trainer(config(method="sste", method_options={"mvue": True}), corpus=corpus)
    wa, wb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa if k.endswith("weight") and "mask" not in k)
    assert torch.equal(a.sampler.sample()[0], b.sampler.sample()[0])


def test_masked_decay_is_applied_by_the_trainer(corpus):
    """A large lambda_W pulls the pruned weights towards zero, compared with STE from the same start."""
    def pruned_norm(method, options):
        t = Trainer(config(method=method, method_options=options, steps=10, weight_decay=0.0), corpus=corpus)
        t.run()
        return sum(float((layer.weight.detach() * ~layer.mask).norm()) for _, layer in t.layers)
    assert pruned_norm("masked_decay", {"decay": 0.5, "dense_finetune_at": None}) < 0.9 * pruned_norm("ste", {})


def test_bf16_autocast_runs_on_cpu(corpus):
    trainer = Trainer(config(method="sste", method_options={"mvue": True}, precision="bf16", steps=3), corpus=corpus)
    trainer.run()
    assert trainer.autocast_dtype == torch.bfloat16
    assert all(math.isfinite(r["loss"]) for r in trainer.history)


def test_checkpoint_errors(tmp_path, corpus):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Trainer.resume(tmp_path / "nope.pt", corpus=corpus)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all" * 10)
    with pytest.raises(CheckpointError, match="cannot be read"):
        Trainer.resume(garbage, corpus=corpus)
    good = tmp_path / "good.pt"
    trainer = Trainer(config(method="ste", steps=2, checkpoint_path=str(good)), corpus=corpus)
    trainer.run()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="cannot be read"):
        Trainer.resume(truncated, corpus=corpus)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(CheckpointError, match="not a sparsity-lab"):
        Trainer.resume(foreign, corpus=corpus)
    with pytest.raises(CheckpointError, match="data differ"):
        Trainer.resume(good, corpus=load_corpus(max_bytes=90_000))
    with pytest.raises(ValueError, match="only .* may be changed"):
        Trainer.resume(good, corpus=corpus, lr=1.0)


def test_config_errors(corpus):
    with pytest.raises(ValueError, match="unknown method 'sgd'"):
        Trainer(config(method="sgd"), corpus=corpus)
    with pytest.raises(ValueError, match="does not take option"):
        Trainer(config(method="ste", method_options={"decay": 1e-4}), corpus=corpus)
    with pytest.raises(ValueError, match="d_model=30 is not divisible by 4"):
        Trainer(config(model=GPTConfig(n_layer=1, n_head=3, d_model=30, context=16)), corpus=corpus)
    with pytest.raises(ValueError, match="batch_size"):
        config(batch_size=0)
    with pytest.raises(ValueError, match="precision"):
        config(precision="fp16")


def test_warmup_cosine_schedule():
    s = WarmupCosine(warmup=4, total=20, min_ratio=0.1)
    assert [s(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s(4) == 1.0 and s(20) == pytest.approx(0.1) and s(100) == pytest.approx(0.1)
    assert s(12) == pytest.approx(0.55)  # half way through the cosine


@pytest.mark.parametrize("saved,run", [
    (("ste", {}), ("sste", {})),  # S-STE's frozen beta (about 1.5) would become the STE run's 1.0
    (("sste", {}), ("sste", {"mvue": True})),
    (("masked_decay", {"decay": 1e-2}), ("masked_decay", {"decay": 2e-2})),
    (("ste", {"backend": "torch"}), ("ste", {"backend": "torch_fp8sim"})),
])
def test_a_checkpoint_of_another_method_or_options_is_refused(corpus, saved, run):
    trained = Trainer(config(method=saved[0], method_options=saved[1], steps=4), corpus=corpus)
    trained.run(stop_at=2)
    state = trained.state_dict()
    other = Trainer(config(method=run[0], method_options=run[1], steps=4), corpus=corpus)
    before = copy.deepcopy(other.model.state_dict())
    with pytest.raises(CheckpointError, match=f"trained with method '{saved[0]}'.*this run has method '{run[0]}'"):
        other.load_state_dict(state)
    after = other.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before) and other.step == 0  # nothing was loaded
    same = Trainer(config(method=saved[0], method_options=saved[1], steps=4), corpus=corpus)
    same.load_state_dict(state)
    assert same.step == 2
