"""compare: the CPU smoke run of every method, and the rules that judge the claims and choose lambda_W."""
import csv
import json
import math

import pytest

from sparsity_lab.lab import GPTConfig, TrainConfig
from sparsity_lab.lab.compare import DEFAULT_VARIANTS, TABLE_COLUMNS, judge_claims, run_comparison
from sparsity_lab.lab.decay_search import choose_decay
from sparsity_lab.lab.runlog import read_log


def test_smoke_compare_every_method_on_cpu(tmp_path):
    """A tiny GPT, 40 steps per method (7 methods, 280 steps in all), same seed/data/budget."""
    base = TrainConfig(model=GPTConfig(n_layer=2, n_head=2, d_model=32, context=32), data_max_bytes=300_000,
                       batch_size=8, steps=40, warmup_steps=4, eval_interval=20, eval_batches=2,
                       device="cpu", progress=False)
    payload = run_comparison(base, list(DEFAULT_VARIANTS), tmp_path, figures=False)
    table = {r["variant"]: r for r in payload["table"]}
    assert list(table) == list(DEFAULT_VARIANTS)
    switch = payload["switch_step"]
    assert switch == 33  # round(5/6 * 40)
    for variant, row in table.items():
        assert row["status"] == "ok" and row["steps"] == 40 and row["tokens"] == 40 * 8 * 32
        assert math.isfinite(row["final_val_loss"]) and math.isfinite(row["val_before_switch"])
        assert any(r["step"] == switch - 1 and r["val_loss"] is not None for r in read_log(
            tmp_path / variant / "log.jsonl"))
        assert row["final_val_loss"] < math.log(256)  # every method learned something
        assert row["flip_early"] > 0
    assert table["dense"]["gap_vs_dense_pct"] == 0
    with open(tmp_path / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == TABLE_COLUMNS and len(rows) == len(DEFAULT_VARIANTS)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["provenance"]["command"] and saved["corpus"]["sha256"]
    assert [c["holds"] for c in saved["claims"]] == [c["holds"] for c in payload["claims"]]
    assert all(c["outcome"] in (True, False) for c in payload["claims"])  # every variant needed was run
    # 10,240 tokens per variant: far too small for a verdict, whatever the rules say
    assert all(c["holds"] is None and c["too_small"] for c in payload["claims"])
    assert all("too small to judge" in c["evidence"] and "seed 0 only" in c["evidence"] for c in payload["claims"])
    md_log = [json.loads(line) for line in (tmp_path / "masked_decay" / "log.jsonl").read_text().splitlines()]
    assert [r["dense_phase"] for r in md_log] == [r["step"] > switch for r in md_log]


def _rows(**overrides):
    """A made-up table in which every claim holds; overrides change one number."""
    rows = {
        "dense": dict(flip_trend=0.3, flip_late=0.001, val_before_switch=1.50, final_val_loss=1.40),
        "ste": dict(flip_trend=1.2, flip_late=0.010, val_before_switch=1.60, final_val_loss=1.50),
        "srste": dict(flip_trend=0.5, flip_late=0.002, val_before_switch=1.55, final_val_loss=1.45),
        "masked_decay": dict(flip_trend=0.4, flip_late=0.002, val_before_switch=1.54, final_val_loss=1.41),
        "masked_decay_noft": dict(flip_trend=0.4, flip_late=0.002, val_before_switch=1.54, final_val_loss=1.44),
        "sste": dict(flip_trend=0.6, flip_late=0.003, val_before_switch=1.53, final_val_loss=1.42),
    }
    for key, value in overrides.items():
        variant, field = key.split("__")
        rows[variant][field] = value
    return rows


def test_claim_rules_hold_and_fail():
    assert [c["holds"] for c in judge_claims(_rows())] == [True] * 5
    assert judge_claims(_rows(ste__flip_trend=0.8))[0]["holds"] is False  # STE's flips fall too
    assert judge_claims(_rows(masked_decay__val_before_switch=1.61))[1]["holds"] is False
    assert judge_claims(_rows(masked_decay__flip_late=0.02))[1]["holds"] is False
    assert judge_claims(_rows(masked_decay_noft__final_val_loss=1.40))[2]["holds"] is False
    assert judge_claims(_rows(sste__final_val_loss=1.46))[3]["holds"] is False
    # 1.02 * 1.40 = 1.428: S-STE at 1.43 misses; masked_decay (dense after fine-tune) does not count
    assert judge_claims(_rows(sste__final_val_loss=1.43))[4]["holds"] is False


def test_claims_not_tested_without_their_runs():
    rows = _rows()
    del rows["ste"], rows["masked_decay_noft"]
    verdicts = [c["holds"] for c in judge_claims(rows)]
    assert verdicts[0] is None and verdicts[1] is None
    claim3 = judge_claims(rows)[2]
    assert "no ablation" in claim3["rule"] and claim3["holds"] is True  # gap 0.04 before the switch -> 0.01 at end


def test_choose_decay_rule():
    dense = {"val_loss": 2.0, "flip_rate": 0.01}
    trials = {1e-5: {"val_loss": 2.02, "flip_rate": 0.03},   # flips 3x dense (STE-like)
              1e-4: {"val_loss": 2.025, "flip_rate": 0.008},  # closest to dense, loss fine: chosen
              1e-3: {"val_loss": 2.03, "flip_rate": 0.001},  # masks nearly frozen
              1e-2: {"val_loss": 2.20, "flip_rate": 0.01}}   # dense-like flips but the loss suffers
    choice = choose_decay(dense, trials, loss_tolerance=0.01)
    assert choice["decay"] == 1e-4 and not choice["at_grid_edge"]
    assert not choice["verdicts"][1e-2]["loss_ok"]
    assert choice["verdicts"][1e-5]["flip_vs_dense"] == pytest.approx(3.0)
    # a tighter tolerance leaves only the best-loss lambda
    assert choose_decay(dense, trials, loss_tolerance=0.001)["decay"] == 1e-5
    with pytest.raises(ValueError, match="diverged"):
        choose_decay(dense, {1e-4: {"val_loss": math.nan, "flip_rate": math.nan}}, 0.01)


def test_verdicts_need_a_run_large_enough():
    from sparsity_lab.lab.compare import MIN_JUDGE_TOKENS
    rows = {"dense": dict(flip_trend=0.4, flip_late=0.001, val_before_switch=1.5, final_val_loss=1.4),
            "ste": dict(flip_trend=1.2, flip_late=0.003, val_before_switch=1.56, final_val_loss=1.43)}
    small = judge_claims(rows, tokens_per_variant=MIN_JUDGE_TOKENS - 1, seeds=(0,))
    large = judge_claims(rows, tokens_per_variant=MIN_JUDGE_TOKENS, seeds=(0,))
    assert small[0]["outcome"] is True and small[0]["holds"] is None and small[0]["too_small"]
    assert large[0]["holds"] is True and not large[0]["too_small"]


def test_the_report_table_fits_its_width():
    """compare's console table is split into blocks no wider than the column, each repeating the variant."""
    from sparsity_lab.lab.compare import table_lines

    cols = ("variant", *(f"column_number_{i}" for i in range(8)))
    rows = [{"variant": v, **{c: 1234.5678 * i for i, c in enumerate(cols[1:])}} for v in ("dense", "masked_decay")]
    lines = table_lines(rows, cols, width=60)
    assert max(map(len, lines)) <= 60
    headers = [line for line in lines if "variant" in line]
    assert len(headers) > 1 and all(line.split()[0] == "variant" for line in headers)
    assert sum(line.split().count(c) for line in headers for c in cols[1:]) == len(cols) - 1  # each column once
    assert [line.split()[0] for line in lines if line.strip().startswith("masked")] == ["masked_decay"] * len(headers)
    assert "1235" in lines[1]  # numbers as compare prints them (4 significant digits)


# --- the FP8 recipe on CUTLASS beside cuSPARSELt -----------------------------------------------------------
def test_claim_7_cutlass_fp8_follows_cusparselt_fp8_within_the_band_either_way():
    from sparsity_lab.lab.compare import FP8_VARIANTS, VARIANTS, _apply_rules
    assert FP8_VARIANTS["sste_mvue_fp8_cutlass"] == "cutlass_fp8"
    assert VARIANTS["sste_mvue_fp8_cutlass"] == VARIANTS["sste_mvue_fp8"]  # the same method, another library

    def claim7(cutlass, cusparselt=0.88, **more):
        rows = {"sste_mvue_fp8": {"final_val_loss": cusparselt}, "sste_mvue_fp8_cutlass": {"final_val_loss": cutlass},
                **{k: {"final_val_loss": v} for k, v in more.items()}}
        return {c["claim"][:2]: c for c in _apply_rules(rows)}.get("7.")
    assert claim7(0.88 * 1.0099)["holds"] is True
    assert claim7(0.88 * 0.9901)["holds"] is True  # lower by as much: the same verdict
    assert claim7(0.88 * 1.0101)["holds"] is False and claim7(0.88 * 0.9899)["holds"] is False
    c = claim7(0.8850, sste_mvue=0.8793)
    assert "<= 0.01" in c["rule"] and "+0.57 % vs on cuSPARSELt 0.88" in c["evidence"] and "bf16 2:4 0.8793" in c["evidence"]
    assert claim7(math.nan)["holds"] is None  # diverged: not judged
    assert claim7(None) is not None and claim7(0.88, cusparselt=None)["holds"] is None  # the reference not run
    assert "7." not in {c["claim"][:2] for c in _apply_rules({"sste_mvue_fp8": {"final_val_loss": 0.88}})}
    judged = judge_claims({"sste_mvue_fp8": {"final_val_loss": 0.88}, "sste_mvue_fp8_cutlass": {"final_val_loss": 0.881}},
                          tokens_per_variant=21_004_288, seeds=(0,))
    seven = next(c for c in judged if c["claim"].startswith("7."))
    assert seven["holds"] is True and "seed 0 only: no spread measured" in seven["evidence"]


def test_the_recorded_fp8_comparison_fits_cutlass_alignment():
    """The width, FFN width and tokens of results/lab_compare_h100_fp8 (the configuration the CUTLASS FP8 run
    repeats): every product of both FFN weights meets CUTLASS's rules, the weight gradient's too."""
    import torch

    from sparsity_lab.backends.cutlass import ops
    from sparsity_lab.lab.model import GPTConfig
    from sparsity_lab.provenance import RESULTS_DIR
    config = json.loads((RESULTS_DIR / "lab_compare_h100_fp8" / "results.json").read_text())["runs"]["sste_mvue_fp8"]["config"]
    model = GPTConfig(**config["model"])
    assert (model.d_model, model.hidden, config["select"]) == (384, 1536, "ffn")
    tokens = config["batch_size"] * model.context
    rows = -(-tokens // 64) * 64  # the FP8 backends pad the tokens to a multiple of 64 on the GPU
    for out_f, in_f in ((model.hidden, model.d_model), (model.d_model, model.hidden)):
        ops.check_weight_for_products("cutlass_fp8", (out_f, in_f), 2, 4, True, torch.float8_e4m3fn, 64, "fp8_dense")
        assert ops.shape_problem(out_f, rows, in_f, torch.float8_e4m3fn, "k", "col") is None  # forward
        assert ops.shape_problem(in_f, rows, out_f, torch.float8_e4m3fn, "k", "col") is None  # input gradient
        assert ops.shape_problem(out_f, in_f, rows, torch.float8_e4m3fn, "k", "row") is None  # weight gradient
    with pytest.raises(ValueError, match="multiple of 32"):  # the rule bites: a width of 400 would not do
        ops.check_weight_for_products("cutlass_fp8", (1600, 400), 2, 4, True, torch.float8_e4m3fn, 64, "fp8_dense")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU-only refusal")
def test_a_cutlass_variant_is_refused_before_any_training_where_it_cannot_run(tmp_path):
    base = TrainConfig(model=GPTConfig(n_layer=1, n_head=1, d_model=64, context=16), steps=2, device="cpu",
                       progress=False)
    with pytest.raises(ValueError, match="variant 'sste_mvue_fp8_cutlass' cannot run here: .*no CUDA GPU"):
        run_comparison(base, ["dense", "sste_mvue_fp8_cutlass"], tmp_path, figures=False)
    assert not (tmp_path / "dense").exists()  # nothing trained
