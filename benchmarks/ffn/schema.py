"""The results format of ``python -m benchmarks ffn``, shared by the writer (this package) and the readers
(``sparsity_lab.course.viz.speedup_view``, notebook 08): variant and phase names, the notes stored with every
recording, and the row every timing becomes.

A row: {"tokens", "d_model", "ffn": 4 d_model, "variant": one of VARIANTS, "phase": one of PHASES,
"ms": median milliseconds or None, "speedup_vs_dense": dense ms / ms at the same shape and phase, or None}
plus optional keys ("error", "backend", "method", "stats_per_step", "rel_err_vs_masked_dense", ...).
"""
from __future__ import annotations


VARIANTS = ("dense", "ours_fixed_mask", "ours_mask_every_step", "ours_mvue", "cutlass_mvue", "ours_mvue_refresh40",
            "ours_mvue_dense_products", "pytorch_semi_structured", "auto", "sparse_auto")
OURS = ("ours_fixed_mask", "ours_mask_every_step", "ours_mvue", "cutlass_mvue", "ours_mvue_refresh40",
        "ours_mvue_dense_products", "auto", "auto_refresh10", "sparse_auto")  # SparseLinear
# the variants whose products run on a library that may be missing here (backend role -> CutlassUnavailable): where
# it cannot run, their rows are skipped with the reason (NOTES["cutlass_mvue"]), never dropped
LIBRARY_ROLES = {"cutlass_mvue": "cutlass"}
# the same method on each 2:4 library, compared at the target shape against the fastest dense of the run
LIBRARY_COMPARISON = ("ours_mvue", "cutlass_mvue")
# every variant name a benchmarks ffn recording may hold (the readers validate against it): ours_fp8 is
# recorded by the FP8 variant of the benchmark, auto_refresh10 by the graph section
KNOWN_VARIANTS = VARIANTS + ("ours_fp8", "auto_refresh10")
PAIRED_VARIANTS = ("dense", "ours_mvue", "cutlass_mvue", "ours_mvue_refresh40", "ours_mvue_dense_products", "auto")
PHASES = ("fwd_bwd", "fwd")
# auto_refresh10: auto with the mask refreshed every 10 steps (the small-shape criterion at refresh >= 10)
GRAPH_VARIANTS = ("dense", "ours_mvue", "ours_mvue_dense_products", "auto", "auto_refresh10")
# GPT step: "_all_linears" makes the attention projections 2:4 too (qkv, proj), not only the FFN's
GPT_VARIANTS = ("dense", "ours_mvue", "ours_mvue_all_linears", "ours_mvue_dense_products", "ours_mask_every_step")
GPT_PAIRED_VARIANTS = ("dense", "ours_mvue", "ours_mvue_all_linears")
MIN_ROUND_MS = 100.0  # a paired timing spans at least this long ...
MAX_ROUND_REPS = 400  # ... within this many calls
NEVER = 10**9  # the fixed-mask variant's refresh interval: never due within a benchmark
REFRESH = {"ours_mvue_refresh40": 40, "auto_refresh10": 10}  # variants whose mask is recomputed every k steps (Hu et al. 2024: 40)
RESULT_NAME = "cusparselt_ffn_h100"
SMOKE_NAME = "cusparselt_ffn_smoke"

# the targets: name -> threshold, each judged by judge_targets (its docstring says what is measured)

NOTES = {
    "timing": "median of reps CUDA-event times after warm-up calls, calls back to back; ms per call",
    "ours_step": "grads cleared, forward, backward, advance_step(model) (what attach_optimizer's post-hook runs "
                 "after optimizer.step()); no optimizer update in the FFN timings",
    "cutlass_mvue": "ours_mvue (S-STE + MVUE, transposable, mask every step) with its three products on CUTLASS's SM90 "
                    "sparse GEMMs (backend 'cutlass') instead of cuSPARSELt; where CUTLASS cannot run (no Hopper GPU, "
                    "no nvcc or CUTLASS headers, a failed build) its rows hold 'skipped' with the reason and the run's "
                    "'unavailable' and 'skipped' say so",
    "sparse_auto": "auto across libraries: the method of ours_mvue on backend 'sparse_auto', each product dense, on "
                   "cuSPARSELt or on CUTLASS as measured (without CUTLASS here: dense or cuSPARSELt, and its backend "
                   "report says why)",
    "library_comparison": "ours_mvue (cuSPARSELt) and cutlass_mvue (CUTLASS) at the target shape, each against the "
                          "fastest dense of the run with that dense's TFLOP/s (the rule of NOTES['headline'])",
    "pytorch_semi_structured": "weights fixed: masked (row-wise 2:4 magnitude) and compressed once by "
                               "to_sparse_semi_structured, never again; fwd_bwd computes the input gradient only "
                               "(no weight gradient), so it does less work than dense",
    "ffn_fwd": "the FFN forward: both products and the GELU (ours: operand prepared once, reused)",
    "graph": "one fwd_bwd step (loss = sum(y * dy), so dy reaches y as in the eager step; x held as a parameter "
             "of the graphed module, so dx is computed as in the eager step) through "
             "sparsity_lab.CudaGraphStep: eager warm-up steps, one capture, then replays; masks due every step "
             "refreshed inside the graph when the recording's masks_in_graph is true, else eagerly before each replay, "
             "and masks due on some steps only (a refresh interval > 1) always eagerly before the replay they are due "
             "in (each graph row's mask_refresh says where: \"graph\", \"eager\", \"mixed\" or \"none\"); "
             "the operands (soft threshold, compression), "
             "products and MVUE replay inside the graph, each MVUE seed written to the device before the replay (the draws eager "
             "mode would make)",
    "gpt_step": "AdamW (fused on CUDA) step included, bf16 autocast with fp32 master weights, random bytes",
    "paired": "at every grid shape the PAIRED variants are built first, then timed in rounds: each round times "
              "each variant (reps calls, the order rotated every round) and takes dense ms / variant ms within "
              "the round; the speed-up is the median over rounds (min and max kept). The GPU's clock moves with "
              "its power and temperature over a run (under sustained load the H100 sits at its 700 W power "
              "cap and its SM clock falls as it warms: results/ffn_baseline_NOTES.md): pairing in time removes "
              "that drift from the ratio. At the target shape every turn starts after idle_s seconds of idle "
              "GPU, so that each variant starts from the same power and thermal state",
    "refresh": "a variant with a mask refresh interval k > 1 (REFRESH) is timed as the mean over whole cycles of "
               "k steps (one CUDA-event pair around them), never a median of single steps, which would leave "
               "the refresh out (in the paired rounds and in the eager and graph rows alike). The FFN benchmark does not update the weights, so its masks do not flip: the "
               "flip rate at that interval comes from the lab's training runs (results/lab_speed_h100.json)",
    "headline": "each target at the target shape: the fastest dense time measured in the run (dense alone at "
                "the start, dense in the grid, dense in the paired rounds) over the variant's paired-round "
                "median; the ratio within the paired rounds is printed beside it (conditions.headline)",
    "baseline_check": "the dense baseline's achieved rate (12 t d f FLOPs / its ms) against the six products of "
                      "the same step timed as bare matmuls at the start of the run (baseline.products_probe): "
                      "below 90 % the target is flagged and not recorded as a result (conditions.baseline_check)",
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
