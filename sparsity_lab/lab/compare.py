"""``sparsity-lab compare``: every method, same seed, same data, same token budget.

Each variant trains the same GPT (same initial weights, same batches, same validation windows,
same schedule) and logs to ``OUT/<variant>/log.jsonl``. The comparison writes ``OUT/results.csv``,
``OUT/results.json`` (with provenance), prints the table and a check of the seed papers' claims,
and, when plotly is installed, ``OUT/loss_curves.html`` and ``OUT/flip_rates.html``.

Across processes (docs/distributed.md), every variant trains with the global batch split over the ranks:
    torchrun --nproc-per-node 2 -m sparsity_lab compare --variants dense,ste,sste --parallel fsdp
rank 0 alone prints and writes the logs, tables and figures (the 2:4 variants and dense only).

Metrics (T = planned steps; windows are fractions of T, chosen to end before the dense fine-tune
switch at 5/6 T):
    final_val_loss      validation loss after the last step
    val_before_switch   validation loss after switch - 1 steps, where switch is the masked-decay dense
                        fine-tune step: the last evaluation at which every variant still runs 2:4
                        (at the switch step itself a fine-tuning run already evaluates its dense W)
    flip_early          mean overall flip rate over steps in (0.10 T, 0.20 T]
    flip_late           mean overall flip rate over steps in (0.70 T, 0.80 T]
    flip_trend          flip_late / flip_early (< 1: the masks settle; >= 1: they do not)
"""
from __future__ import annotations

import csv
import math
import os
import textwrap
import time
from dataclasses import replace
from pathlib import Path

from ..methods.config import MaskedDecay
from ..provenance import write_result
from ..backends.fp8_sim import fp8_sim_backend_for
from .arguments import existing_folder, nonnegative_float, output_folder, positive_float
from .config_file import add_config_argument
from .options import (add_common_arguments, check_data_options, cli_errors, common_method_options,
                      config_from_args, given, resolve_tokenizer, token_count)
from .reporting import (TensorBoardReporter, add_report_argument, attach_reporters, check_report_to, reporters_for,
                        targets)
from .runlog import finite_json
from .structures import STRUCTURES
from .trainer import TrainConfig, Trainer, TrainingDiverged, config_corpus

# variant -> (method name, method options). Decays are filled in from the command's options.
VARIANTS: dict[str, tuple[str, dict]] = {
    "dense": ("dense", {}),
    "ste": ("ste", {}),
    "srste": ("srste", {}),
    "masked_decay": ("masked_decay", {}),  # + dense fine-tune for the last 1/6
    "masked_decay_noft": ("masked_decay", {"dense_finetune_at": None}),  # ablation for claim 3
    # the same term on the weights, decoupled from AdamW (the contrast of Hu et al. 2024); same fine-tune
    "masked_decay_weights": ("masked_decay_weights", {}),
    "sste": ("sste", {}),
    "sste_mvue": ("sste", {"mvue": True}),
    "sste_mvue_fp8sim": ("sste", {"mvue": True}),  # FP8 numerics simulated (FP8_SIM_VARIANTS)
    "sste_mvue_all_linears": ("sste", {"mvue": True}),  # attention projections 2:4 too (ALL_LINEAR_VARIANTS)
    # real FP8 training (FP8_VARIANTS): E4M3 products with per-tensor delayed scaling
    "dense_fp8": ("dense", {}),  # dense FP8 products (torch._scaled_mm): the FP8 user's baseline
    "sste_mvue_fp8": ("sste", {"mvue": True, "transposable": True}),  # FP8 2:4 (cuSPARSELt; dX needs S(W)^T 2:4)
    "sste_mvue_fp8_cutlass": ("sste", {"mvue": True, "transposable": True}),  # the same on CUTLASS (Hopper only)
    # the seed systems that are not 2:4 (structures.py): same model, data and token budget
    "dyad": ("dyad", {}),  # DYAD-IT, 4 blocks: 1/2 of the FFN FLOPs
    "prune_regrow": ("prune_regrow", {}),  # 90 % sparse 16x16 blocks, pruned and regrown
}
# variants whose products run on the FP8 simulation around the chosen backend (torch -> torch_fp8sim)
FP8_SIM_VARIANTS = ("sste_mvue_fp8sim",)
# variants that run on an FP8 training backend whatever --backend says (backends/cusparselt/fp8_train.py;
# without a CUDA GPU both compute the same recipe in float32 arithmetic, with a BackendFallbackWarning)
FP8_VARIANTS = {"dense_fp8": "fp8_dense", "sste_mvue_fp8": "cusparselt_fp8", "sste_mvue_fp8_cutlass": "cutlass_fp8"}
# variants whose every block linear is 2:4 (attention qkv and proj too), not only the FFN's: the loss cost
# of the faster step (benchmarks ffn's GPT section times it)
ALL_LINEAR_VARIANTS = ("sste_mvue_all_linears",)
DEFAULT_VARIANTS = ("dense", "ste", "srste", "masked_decay", "sste", "sste_mvue", "sste_mvue_fp8sim")
EARLY, LATE = (0.10, 0.20), (0.70, 0.80)
GAP_TOLERANCE = 0.02  # claim 5: within 2 % of dense
FP8_TOLERANCE = 0.01  # claim 6: FP8 2:4 within 1 % of bf16 2:4
# claim 7: the FP8 2:4 recipe on CUTLASS within 1 % of the same on cuSPARSELt, either way. Same seed, masks, MVUE
# draws and scales; only the products' rounding and accumulation order differ, a perturbation that a run amplifies
# into a seed-like difference at most: a band no wider than one seed's change of a run's final loss
LIBRARY_TOLERANCE = 0.01
# A claim about pre-training dynamics is judged only on runs at least this long (tokens per variant);
# the recorded H100 comparisons of 11.6M-21M tokens pass, CPU runs of a notebook do not.
MIN_JUDGE_TOKENS = 10_000_000


def variant_config(base: TrainConfig, variant: str, common: dict, decay: float | None,
                   srste_decay: float | None, dense_flips: bool = True) -> TrainConfig:
    """The TrainConfig of one variant. dense_flips: the dense run computes its would-be 2:4 masks (the
    reference flip-rate curve claim 1 needs; ``--no-dense-flips`` turns it off for a plain dense run)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
    method, opts = VARIANTS[variant]
    # the 2:4 options (transposable, refresh interval, backend) mean nothing to the structures
    opts = dict(opts) if method in STRUCTURES else {**common, **opts}
    if method in ("masked_decay", "masked_decay_weights") and decay is not None:
        opts["decay"] = decay
    if method == "srste" and srste_decay is not None:
        opts["decay"] = srste_decay
    if variant in FP8_SIM_VARIANTS:
        opts["backend"] = fp8_sim_backend_for(opts.get("backend", "torch"))
    if variant in FP8_VARIANTS:
        opts["backend"] = FP8_VARIANTS[variant]
    select = "all_linears" if variant in ALL_LINEAR_VARIANTS else base.select
    return replace(base, method=method, method_options=opts, track_flips=dense_flips and method == "dense",
                   select=select)


def _window_mean(history: list[dict], key: str, lo: float, hi: float, steps: int) -> float:
    vals = [r[key] for r in history if lo * steps < r["step"] <= hi * steps and r.get(key) is not None]
    return sum(vals) / len(vals) if vals else math.nan


def run_metrics(history: list[dict], steps: int, switch_step: int) -> dict:
    """The table's numbers for one run, from its logged rows."""
    vals = {r["step"]: r["val_loss"] for r in history if r["val_loss"] is not None}
    flips = [(r["step"], r["flip_rate"]) for r in history if r["flip_rate"] is not None]
    early = _window_mean(history, "flip_rate", *EARLY, steps)
    late = _window_mean(history, "flip_rate", *LATE, steps)
    tail = [r["loss"] for r in history[-max(1, len(history) // 20):]]
    speeds = sorted(r["tokens_per_s"] for r in history)
    peak = max(flips, key=lambda sf: sf[1]) if flips else (None, math.nan)
    return {
        "steps": history[-1]["step"] if history else 0,
        "tokens": history[-1]["tokens"] if history else 0,
        "final_val_loss": vals[max(vals)] if vals else math.nan,
        "val_before_switch": vals.get(switch_step - 1, math.nan),
        "final_train_loss": sum(tail) / len(tail) if tail else math.nan,
        "flip_early": early, "flip_late": late,
        "flip_trend": late / early if early > 0 else math.nan,
        "flip_peak": peak[1], "flip_peak_step": peak[0],
        "median_tokens_per_s": speeds[len(speeds) // 2] if speeds else math.nan,
    }


def ffn_flops_fraction(method, steps: int) -> float:
    """The FFN's forward multiply-adds relative to dense, averaged over the run (theoretical: what the
    structure skips, not a measured speed). 2:4 counts N/M while sparse and 1 after a dense switch."""
    if hasattr(method, "ffn_flops_fraction"):
        return float(method.ffn_flops_fraction)
    if not method.sparse_forward:
        return 1.0
    sparse = method.n / method.m
    switch = method.dense_finetune_step
    if switch is None or switch >= steps:
        return sparse
    return (switch * sparse + (steps - switch)) / steps


def judge_claims(rows: dict[str, dict], tokens_per_variant: int | None = None,
                 seeds: tuple[int, ...] | None = None) -> list[dict]:
    """The claims of the seed papers (and claims 6 and 7 for a comparison with the real FP8 path), each with a
    stated rule, a verdict and its numbers.

    outcome is what the rule gives (True/False, or None when a variant it needs was not run or
    diverged). holds is the verdict: the outcome, or None when the run is too small to judge
    (``tokens_per_variant`` below MIN_JUDGE_TOKENS; then too_small is True). seeds: the seeds
    behind the numbers (a comparison trains one seed: no spread is measured).
    """
    claims = _apply_rules(rows)
    too_small = tokens_per_variant is not None and tokens_per_variant < MIN_JUDGE_TOKENS
    seed_note = ("" if seeds is None else
                 f"; seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
                 + (" only: no spread measured" if len(seeds) == 1 else ""))
    for c in claims:
        c["outcome"], c["too_small"], c["seeds"] = c["holds"], too_small, list(seeds or [])
        if too_small:
            c["holds"] = None
            c["evidence"] = (f"too small to judge: {tokens_per_variant:,} tokens per variant (a verdict needs "
                             f">= {MIN_JUDGE_TOKENS:,}); " + c["evidence"])
        c["evidence"] += seed_note
    return claims


def _apply_rules(rows: dict[str, dict]) -> list[dict]:
    """The rules alone (holds True/False/None), whatever the size of the run."""
    def get(v, k):
        r = rows.get(v)
        return r[k] if r is not None and r.get(k) is not None and not _isnan(r[k]) else None

    out = []
    de, se = get("dense", "flip_trend"), get("ste", "flip_trend")
    dl, sl = get("dense", "flip_late"), get("ste", "flip_late")
    holds = None if None in (de, se) else (de < 1 and se >= 1)
    out.append({"claim": "1. STE's flip rate stays high or grows while a healthy (dense) run's falls",
                "rule": "dense flip_trend < 1 and STE flip_trend >= 1 (trend = late/early mean flip rate)",
                "holds": holds,
                "evidence": f"flip_trend dense {_f(de)}, STE {_f(se)}; late flip rate dense {_f(dl)}, STE {_f(sl)}"})

    ml, ms = get("masked_decay", "flip_late"), get("masked_decay", "val_before_switch")
    ss = get("ste", "val_before_switch")
    mf, sf = get("masked_decay", "final_val_loss"), get("ste", "final_val_loss")
    holds = None if None in (ml, sl, ms, ss) else (ml < sl and ms < ss)
    out.append({"claim": "2. masked decay lowers the flip rate and the loss against STE",
                "rule": "masked_decay flip_late < STE flip_late and val loss one step before the fine-tune "
                        "switch (both still 2:4) < STE's at the same step",
                "holds": holds,
                "evidence": f"flip_late masked_decay {_f(ml)} vs STE {_f(sl)}; val before switch {_f(ms)} vs {_f(ss)}; "
                            f"final val {_f(mf)} vs {_f(sf)}"})

    dfin, dsw = get("dense", "final_val_loss"), get("dense", "val_before_switch")
    nf = get("masked_decay_noft", "final_val_loss")
    if nf is not None and mf is not None:
        holds = mf < nf
        rule = "masked_decay (with dense fine-tune) final val < masked_decay_noft final val (same run otherwise)"
    elif None not in (mf, ms, dfin, dsw):
        holds = (ms - dsw) > 0 and (mf - dfin) < (ms - dsw)
        rule = ("no ablation run: the gap to dense just before the switch must shrink by the end "
                "(the cosine tail also shrinks gaps, so this is weaker evidence)")
    else:
        holds, rule = None, "needs masked_decay and dense (or masked_decay_noft)"
    gap_sw = None if None in (ms, dsw) else ms - dsw
    gap_end = None if None in (mf, dfin) else mf - dfin
    out.append({"claim": "3. dense fine-tuning recovers part of the gap", "rule": rule, "holds": holds,
                "evidence": f"gap to dense before switch {_f(gap_sw)}, at end {_f(gap_end)}; final val with "
                            f"fine-tune {_f(mf)}, without {_f(nf)}"})

    tf, rf = get("sste", "final_val_loss"), get("srste", "final_val_loss")
    out.append({"claim": "4. S-STE reaches a loss at least as low as SR-STE without a decay factor",
                "rule": "sste final val <= srste final val", "holds": None if None in (tf, rf) else tf <= rf,
                "evidence": f"final val S-STE {_f(tf)}, SR-STE {_f(rf)}"})

    not_24 = {"masked_decay", *(v for v in rows if VARIANTS[v][0] == "dense" or VARIANTS[v][0] in STRUCTURES)}
    sparse_final = {v: get(v, "final_val_loss") for v in rows
                    if v not in not_24 and get(v, "final_val_loss") is not None}
    best = min(sparse_final, key=sparse_final.get) if sparse_final else None
    holds = None if best is None or dfin is None else sparse_final[best] <= (1 + GAP_TOLERANCE) * dfin
    md_note = "" if mf is None or dfin is None else (
        f"; masked_decay (final model dense after fine-tune) {_f(mf)} = {_pct(mf, dfin)} vs dense")
    out.append({"claim": "5. the best 2:4 method's final val loss is within 2 % of dense",
                "rule": "min final val over variants whose final model is 2:4 <= 1.02 x dense final val",
                "holds": holds,
                "evidence": (f"best 2:4: {best} {_f(sparse_final.get(best))} = {_pct(sparse_final.get(best), dfin)} "
                             f"vs dense {_f(dfin)}" if best else "no 2:4 variant finished") + md_note})
    if "sste_mvue_fp8" in rows:  # only asked of a comparison that trains the real FP8 path
        f8, b16 = get("sste_mvue_fp8", "final_val_loss"), get("sste_mvue", "final_val_loss")
        sim, d8 = get("sste_mvue_fp8sim", "final_val_loss"), get("dense_fp8", "final_val_loss")
        out.append({"claim": "6. FP8 2:4 training reaches the loss of bfloat16 2:4 (within 1 %)",
                    "rule": "sste_mvue_fp8 final val <= 1.01 x sste_mvue final val",
                    "holds": None if None in (f8, b16) else f8 <= (1 + FP8_TOLERANCE) * b16,
                    "evidence": f"final val FP8 2:4 {_f(f8)} = {_pct(f8, b16)} vs bf16 2:4 {_f(b16)}; "
                                f"FP8 simulation {_f(sim)} ({_pct(sim, f8)} vs the real FP8 path); "
                                f"dense FP8 {_f(d8)}, dense bf16 {_f(dfin)}"})
    if "sste_mvue_fp8_cutlass" in rows:  # only asked of a comparison that trains the FP8 recipe on CUTLASS
        c8, f8 = get("sste_mvue_fp8_cutlass", "final_val_loss"), get("sste_mvue_fp8", "final_val_loss")
        b16 = get("sste_mvue", "final_val_loss")
        out.append({"claim": "7. FP8 2:4 training on CUTLASS follows FP8 2:4 on cuSPARSELt (within 1 %)",
                    "rule": "|sste_mvue_fp8_cutlass final val / sste_mvue_fp8 final val - 1| <= 0.01 (the same recipe, "
                            "seed, masks and MVUE draws: only the products' rounding and accumulation order differ; "
                            "one seed, so the band is fixed, not a measured spread)",
                    "holds": None if None in (c8, f8) else abs(c8 / f8 - 1) <= LIBRARY_TOLERANCE,
                    "evidence": f"final val FP8 2:4 on CUTLASS {_f(c8)} = {_pct(c8, f8)} vs on cuSPARSELt {_f(f8)}"
                                + ("" if b16 is None else f"; bf16 2:4 {_f(b16)} ({_pct(f8, b16)} for cuSPARSELt's FP8)")})
    return out


def _isnan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _f(x) -> str:
    return "n/a" if x is None or _isnan(x) else f"{x:.4g}"


def _pct(x, ref) -> str:
    return "n/a" if x is None or ref is None else f"{100 * (x / ref - 1):+.2f} %"


def size_to_time(base: TrainConfig, variants: list[str], budget_s: float, corpus, decay=None, srste_decay=None,
                 common: dict | None = None, max_tokens: float | None = None,
                 probe_steps: int = 20, dense_flips: bool = True) -> tuple[int, dict]:
    """Steps per variant so that all variants together take about budget_s seconds.

    Each variant is probed for probe_steps steps (median seconds per step over the second half,
    so start-up and compilation stay out), one validation pass is timed, and the set-up time is
    measured; then steps = (budget - set-ups) / (sum of seconds per step + evaluations per step).
    """
    probes = {}
    for variant in variants:
        cfg = replace(variant_config(base, variant, common or {}, decay, srste_decay, dense_flips), steps=10 * probe_steps,
                      eval_interval=10**9, log_path=None, checkpoint_path=None, progress=False)
        start = time.perf_counter()
        trainer = Trainer(cfg, corpus=corpus)
        setup = time.perf_counter() - start
        trainer.run(stop_at=probe_steps)
        per_step = sorted(cfg.tokens_per_step / r["tokens_per_s"] for r in trainer.history[probe_steps // 2:])
        start = time.perf_counter()
        trainer.evaluate()
        probes[variant] = {"setup_s": setup, "s_per_step": per_step[len(per_step) // 2],
                           "eval_s": time.perf_counter() - start}
        trainer.close()
    per_step = sum(p["s_per_step"] + p["eval_s"] / base.eval_interval for p in probes.values())
    steps = int((budget_s - sum(p["setup_s"] for p in probes.values())) / per_step)
    if steps < 10:
        raise ValueError(f"a time budget of {budget_s:.0f} s allows only {steps} steps per variant "
                         f"({per_step:.3f} s per step over all variants); give more time or fewer variants")
    if max_tokens is not None:
        steps = max(1, min(steps, int(max_tokens // base.tokens_per_step)))
    return steps, {"budget_s": budget_s, "probe_steps": probe_steps, "probes": probes, "steps": steps,
                   "tokens_per_variant": steps * base.tokens_per_step, "max_tokens": max_tokens}


def require_libraries(variants: list[str]) -> None:
    """Refuse, before any training, a variant whose backend raises where it cannot run (the CUTLASS backends:
    no Hopper GPU, no nvcc or headers); asking builds the CUTLASS library once, so the first step does not wait."""
    from ..backends import get_backend
    from ..backends.cutlass.backend import FALLBACKS
    from ..backends.cutlass.build import CutlassUnavailable

    for variant in variants:
        if FP8_VARIANTS.get(variant) in FALLBACKS:  # "cutlass_fp8"
            try:
                get_backend(FP8_VARIANTS[variant])
            except CutlassUnavailable as err:
                raise ValueError(f"variant {variant!r} cannot run here: {err}") from err


def refuse_unparallel(variants: list[str], parallel: str, time_budget: float | None) -> None:
    """Under --parallel only the 2:4 variants and dense run (the distributed trainer wraps 2:4 layers);
    refuse the rest, and --time-budget (its probes time one process), before any training."""
    if parallel == "none":
        return
    one_process = [v for v in variants if VARIANTS[v][0] in STRUCTURES]
    if one_process:
        raise ValueError(f"--parallel {parallel} runs the 2:4 variants and dense; {', '.join(one_process)} "
                         f"(not 2:4) run on one process: drop {'it' if len(one_process) == 1 else 'them'} from "
                         "--variants, or compare them without --parallel")
    if time_budget is not None:
        raise ValueError(f"--time-budget probes the variants on one process; with --parallel {parallel} give "
                         "--steps or --tokens instead")


def run_comparison(base: TrainConfig, variants: list[str], out_dir: str | Path, decay: float | None = None,
                   srste_decay: float | None = None, common: dict | None = None, command: str | None = None,
                   figures: bool = True, time_budget: float | None = None, max_tokens: float | None = None,
                   auto_warmup: bool = False, parallel: str = "none", dense_flips: bool = True,
                   report_to=()) -> dict:
    """Train every variant and write the tables (and figures). Returns the results payload.

    time_budget: size the steps per variant to fit about this many seconds in all (see
    size_to_time; base.steps is then replaced); auto_warmup then sets warm-up to 5 % of them.
    parallel: "ddp" or "fsdp" to train each variant on the processes torchrun started (the global
    batch split over the ranks, as ``train --parallel``); rank 0 alone prints and writes.
    report_to: "tensorboard" and/or "wandb" (``reporting.py``): each variant's rows also go there
    (OUT/tensorboard/<variant>; one W&B run per variant, grouped by the output folder's name).
    """
    out_dir = Path(out_dir)
    common = common or {}
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ValueError(f"variants must be a non-empty list from {sorted(VARIANTS)}, got {variants}")
    if parallel not in ("none", "ddp", "fsdp"):
        raise ValueError(f"parallel must be 'none', 'ddp' or 'fsdp', got {parallel!r}")
    if time_budget is not None and not (isinstance(time_budget, (int, float)) and math.isfinite(time_budget)
                                        and time_budget > 0):
        raise ValueError(f"time_budget must be a finite number of seconds > 0, got {time_budget!r}")
    if max_tokens is not None and (time_budget is None or not max_tokens >= 1):
        raise ValueError(f"max_tokens caps the steps that time_budget sizes: it needs time_budget and a value "
                         f">= 1, got max_tokens={max_tokens!r}, time_budget={time_budget!r}")
    refuse_unparallel(variants, parallel, time_budget)
    for variant in variants:  # option errors (e.g. a backend FP8 simulation cannot wrap) before any training
        variant_config(base, variant, common, decay, srste_decay, dense_flips)
    require_libraries(variants)
    lead = True
    if parallel != "none":
        from .distributed_trainer import DistributedTrainer, init_from_torchrun

        lead = init_from_torchrun(base.device)[0] == 0
    corpus = config_corpus(base)
    sizing = None
    if time_budget is not None:
        steps, sizing = size_to_time(base, variants, time_budget, corpus, decay, srste_decay, common, max_tokens,
                                     dense_flips=dense_flips)
        warmup = max(1, round(0.05 * steps)) if auto_warmup else base.warmup_steps
        base = replace(base, steps=steps, warmup_steps=warmup)
        print(f"[compare] sized to {steps} steps ({sizing['tokens_per_variant']:,} tokens) per variant for about "
              f"{time_budget:.0f} s; probes (s/step): " + ", ".join(
                  f"{v} {p['s_per_step']:.4f}" for v, p in sizing["probes"].items()), flush=True)
    switch = MaskedDecay(total_steps=base.steps).dense_finetune_step
    base = replace(base, eval_at=tuple(sorted({*base.eval_at, max(1, switch - 1)})), checkpoint_path=None)
    rows, meta = {}, {}
    for variant in variants:
        cfg = variant_config(base, variant, common, decay, srste_decay, dense_flips)
        log = out_dir / variant / "log.jsonl"
        if lead and log.exists():
            log.unlink()  # a comparison always starts its runs afresh
        cfg = replace(cfg, log_path=str(log))
        start = time.perf_counter()
        # under --parallel the other ranks log nothing (DistributedTrainer drops their log path)
        trainer = Trainer(cfg, corpus=corpus) if parallel == "none" else DistributedTrainer(cfg, parallel, corpus)
        if lead:
            attach_reporters(trainer, _variant_reporters(report_to, out_dir, variant, cfg))
        status = "ok"
        try:
            trainer.run()
        except TrainingDiverged as err:
            status = f"diverged: {err}"
        trainer.close()
        metrics = run_metrics(trainer.history, cfg.steps, switch)
        flops = ffn_flops_fraction(trainer.method, cfg.steps)
        ffn = cfg.model
        # forward FFN multiply-adds x 2 (FLOPs) x 3 (forward + two backward products), per token
        dense_ffn = 2 * 3 * ffn.n_layer * ffn.d_model * ffn.hidden * (3 if ffn.ffn_kind in ("swiglu", "geglu") else 2)
        rows[variant] = {"variant": variant, "method": trainer.method.describe(), "status": status,
                         **metrics, "ffn_flops_fraction": flops,
                         "ffn_train_pflops": flops * dense_ffn * metrics["tokens"] / 1e15,
                         "wall_s": time.perf_counter() - start}
        meta[variant] = {"config": cfg.to_dict(), "log": str(log.relative_to(out_dir))}
        if lead:
            print(f"[compare] {variant}: final val {_f(rows[variant]['final_val_loss'])}, "
                  f"flip late {_f(rows[variant]['flip_late'])}, {rows[variant]['wall_s']:.1f} s ({status})", flush=True)
    dense_final = rows.get("dense", {}).get("final_val_loss")
    for r in rows.values():
        r["gap_vs_dense_pct"] = (100 * (r["final_val_loss"] / dense_final - 1)
                                 if dense_final and not _isnan(dense_final) else math.nan)
    claims = judge_claims(rows, tokens_per_variant=base.steps * base.tokens_per_step, seeds=(base.seed,))
    payload = {"corpus": corpus.describe(), "steps": base.steps, "tokens_per_step": base.tokens_per_step,
               "warmup_steps": base.warmup_steps, "decay": decay, "srste_decay": srste_decay,
               "common_options": common, "sizing": sizing, "switch_step": switch,
               "windows": {"early": EARLY, "late": LATE},
               "table": list(rows.values()), "claims": claims, "runs": meta,
               "parallel": None if parallel == "none" else {"mode": parallel, "world_size": _world_size()}}
    if not lead:  # rank 0 writes and prints; the others return the same numbers
        return payload
    write_table(out_dir / "results.csv", list(rows.values()))
    payload["figures"], payload["figures_note"] = [], None
    if figures:
        try:
            from .figures import write_figures
            payload["figures"] = [str(p.name) for p in write_figures(out_dir, variants)]
        except ImportError as err:
            payload["figures_note"] = f"figures skipped: {err}"
    write_result("results", finite_json(payload), command=command, directory=out_dir)
    print_report(payload)
    return payload


def _variant_reporters(report_to, out_dir: Path, variant: str, cfg: TrainConfig) -> list:
    """One variant's reporters: TensorBoard in OUT/tensorboard/<variant>, a W&B run named after it."""
    reporters = []
    for target in targets(report_to):
        if target == "tensorboard":
            reporters.append(TensorBoardReporter(out_dir / "tensorboard" / variant))
        else:
            reporters += reporters_for([target], out_dir, variant, cfg.to_dict(), group=out_dir.name)
    return reporters


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size()


TABLE_COLUMNS = ("variant", "method", "status", "steps", "tokens", "final_val_loss", "gap_vs_dense_pct",
                 "val_before_switch", "final_train_loss", "flip_early", "flip_late", "flip_trend", "flip_peak",
                 "flip_peak_step", "ffn_flops_fraction", "ffn_train_pflops", "median_tokens_per_s", "wall_s")


def write_table(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=TABLE_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if _isnan(r.get(k)) or r.get(k) is None else r.get(k)) for k in TABLE_COLUMNS})


REPORT_WIDTH = 100  # a terminal's or the course book's column: the table and claims are wrapped to it


def table_lines(rows: list[dict], cols: tuple[str, ...], width: int = REPORT_WIDTH) -> list[str]:
    """``rows`` as a right-aligned text table no wider than ``width``: each column as wide as its header or
    its widest value; columns that do not fit go to a further block, which repeats the first column."""
    cells = [[r[c] if isinstance(r[c], str) else _f(r[c]) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    blocks, block, used = [], [], widths[0]
    for i in range(1, len(cols)):
        if block and used + 2 + widths[i] > width:
            blocks.append(block)
            block, used = [], widths[0]
        block.append(i)
        used += 2 + widths[i]
    blocks.append(block)
    lines = []
    for n, block in enumerate(blocks):
        shown = [0, *block]
        lines += [""] * (n > 0) + ["  ".join(f"{cols[i]:>{widths[i]}}" for i in shown)]
        lines += ["  ".join(f"{row[i]:>{widths[i]}}" for i in shown) for row in cells]
    return lines


def print_report(payload: dict, width: int = REPORT_WIDTH) -> None:
    """The results table and the claims' verdicts, wrapped to ``width`` characters."""
    cols = ("variant", "final_val_loss", "gap_vs_dense_pct", "val_before_switch", "flip_early", "flip_late",
            "flip_trend", "ffn_flops_fraction", "median_tokens_per_s")
    print("\n" + "\n".join(table_lines(payload["table"], cols, width)))
    print("\nClaims of the seed papers at this scale (rules are ours, stated with each):")
    for c in payload["claims"]:
        verdict = "TOO SMALL TO JUDGE" if c.get("too_small") else {True: "HOLDS", False: "FAILS", None: "NOT TESTED"}[c["holds"]]
        print(textwrap.fill(f"[{verdict}] {c['claim']}", width, initial_indent="  ", subsequent_indent="      ",
                            break_on_hyphens=False))
        for text in (f"rule: {c['rule']}", c["evidence"]):
            print(textwrap.fill(text, width, initial_indent="      ", subsequent_indent="        ",
                                break_on_hyphens=False))
    if payload.get("figures_note"):
        print(f"\n{payload['figures_note']}")
    elif payload.get("figures"):
        print(f"\nfigures: {', '.join(payload['figures'])}")


# --- command line ---------------------------------------------------------------------------------
def add_arguments(parser) -> None:
    add_config_argument(parser)
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma-separated, from {sorted(VARIANTS)} (default {','.join(DEFAULT_VARIANTS)})")
    parser.add_argument("--decay", type=nonnegative_float, default=None, help="masked decay's lambda_W, on gradients "
                        "(masked_decay, masked_decay_noft) and on weights (masked_decay_weights) (default 6e-5)")
    parser.add_argument("--srste-decay", type=nonnegative_float, default=None, help="SR-STE's lambda_W (default 2e-4)")
    parser.add_argument("--out", type=output_folder, default="runs/compare",
                        help="output folder (default runs/compare)")
    parser.add_argument("--time-budget", type=positive_float, default=None, metavar="SECONDS",
                        help="size the steps per variant (replacing --steps) so that all variants take about "
                             "this long, from a short probe of each")
    parser.add_argument("--max-tokens", type=token_count, default=None, help="with --time-budget: at most this many "
                        "tokens per variant")
    add_report_argument(parser)
    parser.add_argument("--no-dense-flips", action="store_true",
                        help="the dense run as the plain GPT, without its would-be 2:4 masks (faster; claim 1, "
                             "which compares flip-rate curves with dense, then has no dense curve)")
    parser.add_argument("--figures-from", metavar="DIR", type=existing_folder, default=None,
                        help="only (re)draw the figures of an earlier comparison in DIR (needs plotly)")
    add_common_arguments(parser)
    g = parser.add_argument_group("across processes (under torchrun)")
    g.add_argument("--parallel", choices=("none", "ddp", "fsdp"), default="none",
                   help="train each variant with ddp (DistributedDataParallel) or fsdp (FSDP2), as "
                   "`train --parallel`; --batch-size stays the global batch, split over the processes. "
                   "2:4 variants and dense only")


def check_arguments(args) -> None:
    """Options that do not go together (ValueError naming them), before any probe or training."""
    if args.figures_from:
        return
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise ValueError(f"--variants must be a comma-separated list from {sorted(VARIANTS)}, got {args.variants!r}")
    if args.max_tokens is not None and args.time_budget is None:
        raise ValueError("--max-tokens caps the steps that --time-budget sizes: give --time-budget too, "
                         "or --tokens for a fixed budget")
    if args.time_budget is not None and given(args, "steps", "tokens"):
        raise ValueError("--time-budget sizes the steps itself; drop --steps/--tokens")
    refuse_unparallel(variants, getattr(args, "parallel", "none"), args.time_budget)
    check_report_to(args.report_to)
    check_data_options(args, args.out)


@cli_errors("compare")
def run(args) -> int:
    check_arguments(args)  # also when run() is called without the command line
    if args.figures_from:
        from .figures import write_figures
        try:
            paths = write_figures(Path(args.figures_from))
        except ImportError as err:
            raise ValueError(str(err)) from err
        print("\n".join(str(p) for p in paths))
        return 0
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if os.environ.get("RANK", "0") == "0":
        resolve_tokenizer(args, args.out)
    base = config_from_args(args)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 alone writes
        from .train import write_run_config
        write_run_config(args, Path(args.out), base, "compare",
                         skip=("steps", "tokens", "warmup_steps") if args.time_budget is not None else ())
    parallel = getattr(args, "parallel", "none")
    started_here = parallel != "none" and not _process_group_running()  # else the caller owns the group
    run_comparison(base, variants, args.out, decay=args.decay, srste_decay=args.srste_decay,
                   common=common_method_options(args), time_budget=args.time_budget, max_tokens=args.max_tokens,
                   auto_warmup=not given(args, "warmup_steps"), parallel=parallel,
                   dense_flips=not args.no_dense_flips, report_to=args.report_to)
    if started_here:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


def _process_group_running() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()
