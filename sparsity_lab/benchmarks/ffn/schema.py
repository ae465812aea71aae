"""The results format of ``bench-ffn``, shared by the writer (this package) and the readers
(``sparsity_lab.viz.speedup_view``, notebook 08): variant and phase names, the notes stored with every
recording, and the row every timing becomes.

A row: {"tokens", "d_model", "ffn": 4 d_model, "variant": one of VARIANTS, "phase": one of PHASES,
"ms": median milliseconds or None, "speedup_vs_dense": dense ms / ms at the same shape and phase, or None}
plus optional keys ("error", "backend", "method", "stats_per_step", "rel_err_vs_masked_dense", ...).
"""
from __future__ import annotations


VARIANTS = ("dense", "ours_fixed_mask", "ours_mask_every_step", "ours_mvue", "ours_mvue_dense_products",
            "pytorch_semi_structured", "auto")
OURS = ("ours_fixed_mask", "ours_mask_every_step", "ours_mvue", "ours_mvue_dense_products", "auto")  # SparseLinear
PAIRED_VARIANTS = ("dense", "ours_mvue", "ours_mvue_dense_products", "auto")
PHASES = ("fwd_bwd", "fwd")
GRAPH_VARIANTS = ("dense", "ours_mvue", "ours_mvue_dense_products", "auto")
# ours_mvue_dense_products: the same S-STE + MVUE training on dense products, to check ours_mvue's loss
GPT_VARIANTS = ("dense", "ours_mvue", "ours_mvue_dense_products", "ours_mask_every_step")
MIN_ROUND_MS = 100.0  # a paired timing spans at least this long ...
MAX_ROUND_REPS = 400  # ... within this many calls
NEVER = 10**9  # the fixed-mask variant's refresh interval: never due within a benchmark
RESULT_NAME = "cusparselt_ffn_h100"
SMOKE_NAME = "cusparselt_ffn_smoke"

# the targets: name -> threshold, each judged by judge_targets (its docstring says what is measured)

NOTES = {
    "timing": "median of reps CUDA-event times after warm-up calls, calls back to back; ms per call",
    "ours_step": "grads cleared, forward, backward, advance_step(model) (what attach_optimizer's post-hook runs "
                 "after optimizer.step()); no optimizer update in the FFN timings",
    "pytorch_semi_structured": "weights fixed: masked (row-wise 2:4 magnitude) and compressed once by "
                               "to_sparse_semi_structured, never again; fwd_bwd computes the input gradient only "
                               "(no weight gradient), so it does less work than dense",
    "ffn_fwd": "the FFN forward: both products and the GELU (ours: operand prepared once, reused)",
    "graph": "one fwd_bwd step (loss = sum(y * dy), so dy reaches y as in the eager step) through "
             "sparsity_lab.CudaGraphStep: eager warm-up steps, one capture, then replays; the mask is refreshed "
             "eagerly before each replay when due, the operands (soft threshold, compression), products and MVUE "
             "replay inside the graph, each MVUE seed written to the device before the replay (the draws eager "
             "mode would make)",
    "gpt_step": "AdamW (fused on CUDA) step included, bf16 autocast with fp32 master weights, random bytes",
    "paired": "at every grid shape the PAIRED variants are built first, then timed in rounds: each round times "
              "each variant (reps calls, the order rotated every round) and takes dense ms / variant ms within "
              "the round; the speed-up is the median over rounds (min and max kept). The GPU's clock moves with "
              "its power and temperature over a run (the same dense step measured 18.7 and 20.9 ms in two "
              "sections of one run; dense at 4096 x 1024 0.46 and 1.24 ms in two runs): pairing in time removes "
              "that drift from the ratio. The targets are judged on these figures where they exist",
}

def _row(tokens: int, d: int, variant: str, phase: str) -> dict:
    return {"tokens": tokens, "d_model": d, "ffn": 4 * d, "variant": variant, "phase": phase,
            "ms": None, "speedup_vs_dense": None}

def fill_speedups(rows: list[dict], mode_key: str = "phase") -> None:
    """speedup_vs_dense = dense ms / ms for the same tokens, d_model and phase (or mode)."""
    dense = {(r["tokens"], r["d_model"], r[mode_key]): r["ms"] for r in rows if r["variant"] == "dense"}
    for r in rows:
        base = dense.get((r["tokens"], r["d_model"], r[mode_key]))
        r["speedup_vs_dense"] = base / r["ms"] if base and r["ms"] else None
