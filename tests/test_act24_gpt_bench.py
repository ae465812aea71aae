"""benchmarks act24's GPT section (benchmarks/act24_gpt.py) and the whole run around it, on the CPU (--smoke)."""
import json
import math
import statistics

import pytest
import torch

from benchmarks.act24_gpt import (DEFAULTS, DENSE, GPT_VARIANTS, PAIRED_VARIANTS, build_variant,
                                               config_for, judge, loss_against_reference, smoke_settings)
from benchmarks.act24_speed import VARIANTS, main


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One `benchmarks act24 --smoke` run: (its JSON, its printed table)."""
    import contextlib
    import io

    path = tmp_path_factory.mktemp("act24") / "smoke.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--smoke", "--out", str(path)]) == 0
    return json.loads(path.read_text()), out.getvalue()


def test_smoke_keeps_the_ffn_section_and_adds_the_gpt_section(smoke):
    result, printed = smoke
    assert [r["variant"] for r in result["rows"]] == list(VARIANTS) and not any(r["error"] for r in result["rows"])
    assert result["settings"]["tokens"] == 64 and result["settings"]["d_model"] == 16  # --smoke's own sizes
    gpt = result["gpt_step"]
    assert list(gpt["variants"]) == list(GPT_VARIANTS) and result["errors"] == []
    assert gpt["config"]["d_model"] == DEFAULTS["smoke"]["d_model"] and gpt["dense"] == DENSE
    assert "act24_w24_mvue" in gpt["notes"] and "paired" in gpt["notes"]  # the record describes itself
    assert gpt["tokens_per_step"] == DEFAULTS["smoke"]["batch"] * DEFAULTS["smoke"]["context"]
    dense_ms = gpt["variants"][DENSE]["ms"]
    for name, record in gpt["variants"].items():
        assert record["ms"] > 0 and math.isfinite(record["loss_after"]), name
        assert record["tokens_per_s"] == pytest.approx(gpt["tokens_per_step"] / record["ms"] * 1e3)
        assert record["speedup_vs_dense"] == pytest.approx(dense_ms / record["ms"])
        assert record["ffn_kind"] == ("gelu" if name == "dense_gelu" else "relu2")
        assert record["activation_sparsity"] == ("2:4" if name.startswith("act24") else "none")
    n_layer = DEFAULTS["smoke"]["n_layer"]
    for name in ("weights24_mvue", "act24_w24_mvue"):  # S-STE + MVUE, transposable, on both FFN linears
        record = gpt["variants"][name]
        assert record["sparse_layers"] == 2 * n_layer and record["backend"] == "torch"
        assert record["method"].startswith("sste 2:4, transposable") and "MVUE" in record["method"]
    as_trainer = gpt["variants"]["act24_as_trainer"]  # fc and proj SparseLinear with the Dense method
    assert as_trainer["sparse_layers"] == 2 * n_layer and as_trainer["method"].startswith("dense")
    for name in ("act24", "act24_as_trainer", "act24_w24_mvue"):  # the reference backend's products on the CPU: exactly equal
        record = gpt["variants"][name]
        assert record["act24_modules"] == n_layer and record["activation_products"] == "torch"
        assert record["loss_check"]["ffn_out_rel_err"] == 0.0
        assert record["loss_check"]["loss"] == record["loss_check"]["loss_reference"]
    assert "sparse_layers" not in gpt["variants"]["act24"]  # activations alone: plain linears
    for name in list(GPT_VARIANTS) + ["GPT step", "target GPT training step"]:
        assert name in printed
    assert "matmul probe start" in printed and "GPU conditions" in printed


def test_smoke_runs_the_token_dimension_weight_gradient_variants(smoke):
    """The tokens24 variants: in the FFN section checked against the reference (weight gradients too)
    with the dropped share reported, timed eagerly; in the GPT section built with act24_weight_grads."""
    result, printed = smoke
    rows = {r["variant"]: r for r in result["rows"]}
    for name in ("act24_tok24", "act24_w24_tok24"):
        row = rows[name]
        assert row["y_rel_err"] == row["dx_rel_err"] == row["dw1_rel_err"] == row["dw2_rel_err"] == 0.0
        assert set(row["dropped"]) == {"dW1", "dW2"} and row["dense_fraction"] == 0.05
        assert all(0.0 <= d["mass_fraction"] <= 1.0 and d["nonzeros"] > 0 for d in row["dropped"].values())
    assert "dropped" not in rows["act24"] and rows["act24"]["dw2_rel_err"] == 0.0
    gpt = result["gpt_step"]["variants"]
    assert gpt["act24_tok24"]["weight_grads"] == gpt["act24_w24_tok24"]["weight_grads"] == "tokens24"
    assert gpt["act24"]["weight_grads"] == "dense" and "MVUE" not in gpt["act24_w24_tok24"]["method"]
    assert "dropped mass dW2" in printed


def test_smoke_paired_rounds_and_headline(smoke):
    """Per round the speed-up is dense relu2 ms / the variant's ms of that round; the headline is the
    fastest dense relu2 of the run (alone or paired median) over the variant's paired median."""
    result, _ = smoke
    gpt = result["gpt_step"]
    pair = gpt["paired"]
    assert list(pair["round_ms"]) == list(PAIRED_VARIANTS) and gpt["rounds"] == 2
    assert all(len(v) == 2 for v in pair["round_ms"].values())
    for name in PAIRED_VARIANTS[1:]:
        by = pair["by_variant"][name]
        ratios = [a / b for a, b in zip(pair["round_ms"][DENSE], pair["round_ms"][name])]
        assert by["round_speedups"] == pytest.approx(ratios)
        assert by["speedup_vs_dense"] == pytest.approx(statistics.median(ratios))
        head = gpt["headline"][name]
        fastest = min(gpt["variants"][DENSE]["ms"], statistics.median(pair["round_ms"][DENSE]))
        assert head["dense_ms"] == pytest.approx(fastest) and head["variant_source"] == "paired median"
        assert head["speedup"] == pytest.approx(fastest / statistics.median(pair["round_ms"][name]))
        assert head["paired_ratio"] == by["speedup_vs_dense"]
        assert head["vs_dense_gelu"] == pytest.approx(gpt["variants"]["dense_gelu"]["ms"] / head["variant_ms"])
    # not paired: the headline takes the variant's time alone
    assert gpt["headline"]["weights24_mvue"]["variant_source"] == "alone"
    # dense relu2's rate: the relu2 GPT's product FLOPs (2 d h per FFN linear pair, as gelu) over the fastest time
    from sparsity_lab.flops import gpt_config_flops_per_token
    flops = sum(gpt_config_flops_per_token(config_for(DENSE, gpt["config"])).values())
    assert gpt["dense_flops_per_token"] == flops
    assert flops == sum(gpt_config_flops_per_token(config_for("dense_gelu", gpt["config"])).values())
    rate = gpt["headline"]["dense_rate"]
    assert rate["dense_tflops"] == pytest.approx(flops * gpt["tokens_per_step"] / (fastest * 1e-3) / 1e12)
    probe = result["baseline"]["matmul_probe_start"]["32x32x128"]
    assert rate["matmul_probe_tflops"] == probe["tflops"]
    # a smoke run judges nothing
    [target] = gpt["targets"].values()
    assert target["status"] == "not judged (smoke)" and target["met"] is None and target["threshold"] == 1.35
    assert result["conditions"]["source"].startswith("none")
    assert {"ffn", "gpt step", "gpt paired rounds"} <= set(result["conditions"]["sections"])


def test_judge_follows_the_threshold():
    def result(speedup):
        return {"config": {"d_model": 4096}, "headline": {"act24_w24_mvue": {"speedup": speedup}}}
    assert judge(result(1.40), smoke=False)["gpt_step_act24_w24_mvue"]["status"] == "met"
    assert judge(result(1.30), smoke=False)["gpt_step_act24_w24_mvue"]["status"] == "missed"
    assert judge(result(None), smoke=False)["gpt_step_act24_w24_mvue"]["status"] == "not measured"
    assert judge(result(1.40), smoke=True)["gpt_step_act24_w24_mvue"]["met"] is None


def test_loss_check_catches_wrong_activation_products():
    """Products that skip the 2:4 pruning give other FFN outputs than the reference: the check shows it."""
    from sparsity_lab.activation24 import act24_modules
    from sparsity_lab.backends.torch_reference import TorchBackend
    from sparsity_lab.references.act24 import relu2

    class Unpruned(TorchBackend):
        name = "unpruned"

        def act24_linear(self, h, weight):
            a = relu2(h)
            return a @ weight.t(), a
    s = smoke_settings()
    built = build_variant("act24", s)
    assert built.record["loss_check"]["ffn_out_rel_err"] == 0.0
    for _, mod in act24_modules(built.model):
        mod.backend = Unpruned()
    assert loss_against_reference(built.model, s)["ffn_out_rel_err"] > 1e-2
    assert all(type(mod.backend) is Unpruned for _, mod in act24_modules(built.model))  # restored after the check


def test_no_gpt_and_bad_flags(tmp_path, capsys):
    path = tmp_path / "a.json"
    assert main(["--smoke", "--no-gpt", "--rounds", "1", "--no-graph", "--out", str(path)]) == 0
    result = json.loads(path.read_text())
    assert "gpt_step" not in result and list(result["baseline"]["matmul_probe_start"]) == ["64x16x64"]
    for argv, flag in ((["--gpt-layers", "0"], "--gpt-layers"), (["--idle-s", "-1"], "--idle-s"),
                       (["--tokens", "100"], "--tokens"), (["--reps", "0"], "--reps")):
        with pytest.raises(SystemExit) as exit_:  # argparse's refusal (stderr) or the run's check (the message)
            main(["--smoke", *argv])
        assert flag in capsys.readouterr().err + str(exit_.value)
    with pytest.raises(ValueError, match="variant"):
        config_for("dense", DEFAULTS["smoke"])
    assert torch.device("cpu") == smoke_settings().device


@pytest.mark.parametrize("variant,method,options", [
    ("act24_as_trainer", "dense", {"transposable": True}),  # on cusparselt the trainer needs --transposable
    ("act24_w24_mvue", "sste", {"mvue": True, "transposable": True}),
])
def test_variants_are_built_as_the_trainer_builds_them(variant, method, options):
    """The FFN modules of a benchmark variant: the same classes, methods and products as the trainer's
    model for the same run (``train --ffn relu2 --activation-sparsity 2:4 --method ...``)."""
    from sparsity_lab.lab.data import load_corpus
    from sparsity_lab.lab.model import GPTConfig
    from sparsity_lab.lab.trainer import TrainConfig, Trainer

    g = DEFAULTS["smoke"]
    cfg = GPTConfig(n_layer=g["n_layer"], n_head=g["n_head"], d_model=g["d_model"], context=g["context"],
                    ffn_kind="relu2", activation_sparsity="2:4")
    trainer = Trainer(TrainConfig(method=method, method_options=options, steps=3, model=cfg, device="cpu",
                                  batch_size=2, eval_batches=1), corpus=load_corpus(max_bytes=100_000))
    built = build_variant(variant, smoke_settings())

    def ffn_modules(model):
        out = []
        for block in model.blocks:
            mlp = block.mlp
            out.append((type(mlp).__name__, mlp.backend.name,
                        *[(type(lin).__name__, getattr(getattr(lin, "method", None), "name", None),
                           getattr(getattr(lin, "method", None), "mvue", None),
                           getattr(getattr(lin, "method", None), "transposable", None)) for lin in (mlp.fc, mlp.proj)]))
        return out
    assert ffn_modules(built.model) == ffn_modules(trainer.model)


@pytest.mark.gpu
def test_gpt_section_on_cusparselt_at_a_small_size_on_gpu():
    """The whole GPT section on the GPU at a small size: every variant timed without error, the activation
    products on cuSPARSELt within bf16 error of the reference products in every block, the combined
    method's 2:4 layers on cuSPARSELt."""
    from benchmarks.act24_gpt import gpt_settings, measure_gpt_step
    from benchmarks.ffn.measure import Recorder

    s = gpt_settings(False, {"n_layer": 2, "n_head": 2, "d_model": 256, "context": 128, "batch": 4},
                     reps=2, warmup=1, rounds=1, idle_s=0.0)
    rec = Recorder(s)
    gpt = measure_gpt_step(s, rec)
    assert rec.errors == [] and "error" not in gpt["paired"]
    for name, record in gpt["variants"].items():
        assert record["ms"] > 0 and math.isfinite(record["loss_after"]), name
    for name in ("act24", "act24_as_trainer", "act24_w24_mvue", "act24_tok24", "act24_w24_tok24"):
        check = gpt["variants"][name]["loss_check"]
        assert gpt["variants"][name]["activation_products"] == "cusparselt"
        assert check["ffn_out_rel_err"] < 2e-2 and abs(check["loss"] - check["loss_reference"]) < 1e-2, (name, check)
    for name in ("weights24_mvue", "act24_w24_mvue"):
        assert gpt["variants"][name]["backend"] == "cusparselt"
    assert gpt["headline"]["act24_w24_mvue"]["speedup"] > 0
