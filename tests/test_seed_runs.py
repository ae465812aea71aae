"""Small repeated lab runs: one row per (variant, seed), FLOPs from the FLOP counts, the verdict rule."""
import pytest

from sparsity_lab.flops import gpt_config_flops_per_token
from sparsity_lab.lab.data import load_corpus
from sparsity_lab.lab.model import GPTConfig
from sparsity_lab.lab.seed_runs import ffn_training_fraction, lower_in_every_seed, run_seeds, summarize


def test_rows_per_variant_and_seed_with_their_flops():
    corpus = load_corpus(max_bytes=60_000, min_split_bytes=17)
    variants = {"dense": {"method": "dense"}, "dyad": {"method": "dyad", "method_options": {"n_blocks": 2}, "width": 8}}
    rows = run_seeds(variants, seeds=[0, 1], steps=2, layers=1, heads=2, width=16, context=16, batch_size=2,
                     eval_batches=1, corpus=corpus)
    assert [(r["variant"], r["seed"]) for r in rows] == [("dense", 0), ("dense", 1), ("dyad", 0), ("dyad", 1)]
    dense_model = GPTConfig(n_layer=1, n_head=2, d_model=16, context=16)
    assert rows[0]["tokens"] == 2 * 2 * 16
    assert rows[0]["train_flops"] == sum(gpt_config_flops_per_token(dense_model).values()) * rows[0]["tokens"]
    assert rows[2]["width"] == 8 and rows[2]["params"] < rows[0]["params"]
    summary = summarize(rows)
    assert summary["dense"]["seeds"] == [0, 1]
    assert summary["dense"]["min"] <= summary["dense"]["mean"] <= summary["dense"]["max"]


def test_training_fractions_and_the_verdict_rule():
    assert ffn_training_fraction("dense") == 1.0
    assert ffn_training_fraction("dyad", {"n_blocks": 4}) == 0.5
    assert ffn_training_fraction("prune_regrow", {"sparsity": 0.75}) == pytest.approx(0.25)
    assert ffn_training_fraction("ste") == pytest.approx(2 / 3)
    assert ffn_training_fraction("sste", {"mvue": True}) == pytest.approx(0.5)
    rows = [{"variant": v, "seed": s, "final_val_loss": loss, "train_flops": 1.0, "width": 8, "params": 1}
            for v, s, loss in (("a", 0, 1.0), ("a", 1, 1.2), ("b", 0, 1.1), ("b", 1, 1.3))]
    summary = summarize(rows)
    assert not lower_in_every_seed(summary, "a", "b")  # the ranges overlap: no verdict
    rows[1]["final_val_loss"] = 1.05
    assert lower_in_every_seed(summarize(rows), "a", "b")


def test_bad_input():
    with pytest.raises(ValueError, match="variants must name"):
        run_seeds({}, seeds=[0])
    with pytest.raises(ValueError, match="seeds must hold"):
        run_seeds({"dense": {"method": "dense"}}, seeds=[])
