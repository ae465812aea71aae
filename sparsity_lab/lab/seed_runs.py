"""Small repeated lab runs for the course: several variants of the lab GPT, each trained with several
seeds on the same data and token budget, with the training FLOPs of every run.

A verdict drawn from one seed confuses the method with the seed; these runs give each variant a spread.
``run_seeds`` trains them; ``summarize`` gives mean, min and max per variant; ``lower_in_every_seed``
is the rule the notebooks use for a verdict (every seed of one variant below every seed of the other).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace

from ..flops import gpt_config_flops_per_token, product_fractions
from .data import load_corpus
from .model import GPTConfig
from .trainer import TrainConfig, Trainer


def ffn_training_fraction(method: str, options: dict | None = None) -> float:
    """The share of the dense FFN's training multiply-adds (three products) a lab method needs:
    1 for dense, 2/n for DYAD, the density for prune-and-regrow, (1/2 + 1/2 + 1)/3 for a 2:4 weight
    and 1/2 with the MVUE weight gradient (theoretical counts: zeros skipped)."""
    options = options or {}
    if method == "dense":
        parts = product_fractions("dense")
    elif method == "dyad":
        parts = product_fractions("dyad", n_blocks=options.get("n_blocks", 4))
    elif method == "prune_regrow":
        parts = product_fractions("block", density=1.0 - options.get("sparsity", 0.9))
    else:  # a 2:4 method
        parts = product_fractions("24_mvue" if options.get("mvue") else "24")
    return sum(parts.values()) / len(parts)


def run_seeds(variants: dict[str, dict], seeds=(0, 1, 2), *, steps: int = 300, layers: int = 2, heads: int = 4,
              width: int = 64, context: int = 64, batch_size: int = 16, eval_batches: int = 8, lr: float = 1e-3,
              corpus=None, data_max_bytes: int = 2_000_000) -> list[dict]:
    """Train every variant with every seed on the CPU; one row per run.

    variants: name -> {"method": ..., "method_options": {...}, "width": optional width of this variant}.
    A row: variant, seed, width, steps, tokens, final_val_loss, train_flops (whole model, three products
    per weight, see :mod:`sparsity_lab.flops`), params, wall_s.
    """
    if not variants:
        raise ValueError("variants must name at least one variant")
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    corpus = corpus if corpus is not None else load_corpus(None, data_max_bytes, min_split_bytes=context + 1)
    rows = []
    for name, spec in variants.items():
        method, options = spec["method"], dict(spec.get("method_options", {}))
        model = GPTConfig(n_layer=layers, n_head=heads, d_model=spec.get("width", width), context=context)
        base = TrainConfig(method=method, method_options=options, model=model, batch_size=batch_size, steps=steps,
                           lr=lr, warmup_steps=max(1, steps // 20), eval_interval=steps, eval_batches=eval_batches,
                           device="cpu", progress=False)
        per_token = sum(gpt_config_flops_per_token(model, ffn_training_fraction(method, options)).values())
        for seed in seeds:
            start = time.perf_counter()
            trainer = Trainer(replace(base, seed=seed), corpus=corpus)
            summary = trainer.run()
            trainer.close()
            tokens = summary["tokens"]
            rows.append({"variant": name, "seed": seed, "width": model.d_model, "steps": steps, "tokens": tokens,
                         "final_val_loss": summary["final_val_loss"], "train_flops": per_token * tokens,
                         "params": summary["params"], "wall_s": time.perf_counter() - start})
    return rows


def summarize(rows: list[dict]) -> dict[str, dict]:
    """Per variant: seeds, mean / min / max of the final validation loss, the training FLOPs."""
    out: dict[str, dict] = {}
    for name in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == name]
        losses = [r["final_val_loss"] for r in mine]
        out[name] = {"seeds": [r["seed"] for r in mine], "losses": losses, "mean": statistics.fmean(losses),
                     "min": min(losses), "max": max(losses), "train_flops": mine[0]["train_flops"],
                     "width": mine[0]["width"], "params": mine[0]["params"]}
    return out


def lower_in_every_seed(summary: dict[str, dict], a: str, b: str) -> bool:
    """The verdict rule: variant a's worst seed is below variant b's best seed."""
    return summary[a]["max"] < summary[b]["min"]
