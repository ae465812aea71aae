"""The targets of ``python -m benchmarks ffn``: thresholds, and the verdict of each from the measured rows.

Speed-up targets at the target shape and the GPT step follow the two rules of ``conditions``: the
headline uses the fastest dense time measured in the run (NOTES["headline"]), the other ratios are
kept beside it; and an FFN target whose dense baseline runs below 90 % of the start-of-run rate of its
own products is "flagged", never "met" (NOTES["baseline_check"]). Each target's ``status`` is "met",
"missed", "flagged" or "not measured"; ``met`` is True only for "met".
"""
from __future__ import annotations

import statistics

from benchmarks.conditions import baseline_check, headline, judged
from benchmarks.ffn.baseline import ffn_step_flops
from benchmarks.ffn.schema import LIBRARY_COMPARISON

THRESHOLDS = {"ffn_fwd_bwd_ours_mvue": 1.40, "ffn_fwd_bwd_refresh40": 1.45, "ffn_fwd_ours": 1.5,
              "auto_vs_dense_products": 0.97, "auto_vs_dense_products_graph": 0.97,
              "auto_vs_dense_graph_from_2048": 0.97, "auto_refresh10_vs_dense_graph": 0.97, "gpt_step": 1.20,
              "gpt_step_all_linears": 1.30}
GRAPH_FROM_D_MODEL = 2048  # auto against dense under CUDA-graph replay: judged from this width up


def _target(description: str, threshold: float, measured: float | None, check: dict | None = None,
            **extra) -> dict:
    verdict = judged(measured, threshold, check)
    out = {"description": description, "threshold": threshold, "measured": measured, **verdict, **extra}
    if check is not None:
        out["baseline_check"] = check
    return out


def _find(rows, tokens: int, d: int, variant: str, phase: str) -> dict | None:
    return next((r for r in rows or [] if (r["tokens"], r["d_model"], r["variant"], r["phase"])
                 == (tokens, d, variant, phase)), None)


def _ms(row: dict | None) -> float | None:
    return row.get("ms") if row else None


def ffn_headline(variant: str, phase: str, rows: list[dict], paired: list[dict] | None, target: tuple[int, int],
                 baseline: dict | None) -> tuple[float | None, dict, dict | None]:
    """(headline speed-up, the figures beside it, baseline check) of one variant at the target shape.

    The variant's time: its paired-round median where measured, else the grid's. The dense candidates:
    dense alone at the start of the run (``baseline["dense_alone_ms"]``, fwd_bwd), dense in the grid,
    dense in the paired rounds."""
    tokens, d = target
    grid_row, pair_row = _find(rows, tokens, d, variant, phase), _find(paired, tokens, d, variant, phase)
    pair_ok = pair_row is not None and pair_row.get("ms") is not None
    variant_ms = pair_row["ms"] if pair_ok else _ms(grid_row)
    candidates = {"grid": _ms(_find(rows, tokens, d, "dense", phase)),
                  "alternation": _ms(_find(paired, tokens, d, "dense", phase))}
    if phase == "fwd_bwd" and baseline:
        candidates["alone"] = baseline.get("dense_alone_ms")
    h = headline(candidates, variant_ms)
    extra = {"variant_ms": variant_ms, "variant_source": "paired median" if pair_ok else "grid",
             "dense_ms": h["dense_ms"], "dense_source": h["dense_source"], "against_each_dense": h["against"],
             "unpaired": grid_row.get("speedup_vs_dense") if grid_row else None}
    if pair_ok and pair_row.get("speedup_vs_dense") is not None:
        extra.update(paired_ratio=pair_row["speedup_vs_dense"], paired_min=pair_row["speedup_min"],
                     paired_max=pair_row["speedup_max"], rounds=len(pair_row["round_speedups"]))
    check = None
    if phase == "fwd_bwd" and h["dense_ms"]:
        flops = ffn_step_flops(tokens, d, 4 * d)
        extra["dense_tflops"] = flops / (h["dense_ms"] * 1e-3) / 1e12
        probe = (baseline or {}).get("products_probe") or {}
        check = baseline_check(extra["dense_tflops"], probe.get("tflops"))
    return h["speedup"], extra, check


def _fwd_bwd_by_point(rows: list[dict] | None) -> dict[tuple[int, int, str], dict]:
    return {(r["tokens"], r["d_model"], r["variant"]): r for r in rows or [] if r["phase"] == "fwd_bwd"}


def variant_ratio(pair_rows: dict, grid_rows: dict, tokens: int, d: int, numerator: str,
                  denominator: str) -> tuple[float | None, str]:
    """(numerator ms / denominator ms, its source) at one grid point, forward + backward: the median over the
    paired rounds of the two variants' ratio in each round, else the grid's single ratio."""
    num, den = pair_rows.get((tokens, d, numerator)), pair_rows.get((tokens, d, denominator))
    if num and den and num["round_ms"] and den["round_ms"]:
        return statistics.median(a / b for a, b in zip(num["round_ms"], den["round_ms"])), "paired"
    num, den = grid_rows.get((tokens, d, numerator)), grid_rows.get((tokens, d, denominator))
    if num and den and num.get("ms") and den.get("ms"):
        return num["ms"] / den["ms"], "grid"
    return None, "not measured"


# the library each variant of LIBRARY_COMPARISON runs its products on (its ceiling's products)
LIBRARY_OF = {"ours_mvue": "cusparselt", "cutlass_mvue": "cutlass"}


def product_ceilings(shapes: list[dict] | None, target: tuple[int, int], dense_step_ms: float | None) -> dict:
    """The Amdahl ceiling of the FFN step on each 2:4 library, from its six products as ``sparse_auto`` timed them
    in this run (each product alone, dense and on every library, side by side):

        ceiling = T_dense / (T_dense - sum dense products + sum 2:4 products)

    T_dense the dense step's ms (the headline's). What it assumes: the step's other work (GELU, copies) stays as
    dense's and the 2:4 work (masks, MVUE) is free, so a step at its ceiling has hidden nothing but that work.
    {} where sparse_auto did not run at the target shape (or no dense step was timed)."""
    tokens, d = target
    shape = next((sh for sh in shapes or [] if (sh.get("tokens"), sh.get("d_model")) == (tokens, d)), None)
    decisions = (((shape or {}).get("backends") or {}).get("sparse_auto") or {}).get("decisions") or []
    decisions = [x for x in decisions if x.get("dense_ms") and x.get("library_ms")]
    if not decisions or not dense_step_ms:
        return {}
    dense = sum(x["dense_ms"] for x in decisions)
    out = {}
    for lib in sorted({lib for x in decisions for lib in x["library_ms"]}):
        if not all(lib in x["library_ms"] for x in decisions):
            continue  # a library that could not run one of the products has no ceiling
        sparse = sum(x["library_ms"][lib] for x in decisions)
        out[lib] = {"ceiling": dense_step_ms / (dense_step_ms - dense + sparse), "products_ms": sparse,
                    "dense_products_ms": dense, "products": len(decisions), "dense_step_ms": dense_step_ms,
                    "products_speedup": dense / sparse}
    return out


def library_comparison(rows: list[dict], paired: list[dict] | None, target: tuple[int, int],
                       baseline: dict | None, shapes: list[dict] | None = None) -> dict:
    """The same method on each 2:4 library (``LIBRARY_COMPARISON``) at the target shape, forward + backward.

    Per variant: its speed-up over the fastest dense of the run and that dense's ms, source and TFLOP/s
    (``ffn_headline``, the targets' rule), its own ms and dense-equivalent TFLOP/s, the paired-round ratio
    beside it, or "skipped" with the reason where its library cannot run. ``between``: each later variant's
    speed-up over the first (ms of the first / ms of it), paired per round where both were timed in the rounds.
    ``ceilings``: ``product_ceilings`` of each library (``shapes``: the run's, with sparse_auto's decisions); each
    variant's entry has its library's ``ceiling`` beside its speed-up."""
    tokens, d = target
    flops = ffn_step_flops(tokens, d, 4 * d)
    variants = {}
    for variant in LIBRARY_COMPARISON:
        value, extra, check = ffn_headline(variant, "fwd_bwd", rows, paired, target, baseline)
        row = _find(rows, tokens, d, variant, "fwd_bwd") or {}
        entry = {"speedup": value, "backend": row.get("backend"), **extra, "baseline_check": check,
                 "variant_tflops": flops / (extra["variant_ms"] * 1e-3) / 1e12 if extra["variant_ms"] else None}
        if row.get("skipped"):
            entry["skipped"] = row["skipped"]
        variants[variant] = entry
    first, pair_rows, grid_rows = LIBRARY_COMPARISON[0], _fwd_bwd_by_point(paired), _fwd_bwd_by_point(rows)
    between = {}
    for variant in LIBRARY_COMPARISON[1:]:
        value, source = variant_ratio(pair_rows, grid_rows, tokens, d, first, variant)
        between[f"{variant}_vs_{first}"] = {"speedup": value, "source": source}
    dense_ms = next((v["dense_ms"] for v in variants.values() if v.get("dense_ms")), None)
    ceilings = product_ceilings(shapes, target, dense_ms)
    for variant, entry in variants.items():
        entry["ceiling"] = (ceilings.get(LIBRARY_OF.get(variant)) or {}).get("ceiling")
    return {"tokens": tokens, "d_model": d, "phase": "fwd_bwd", "variants": variants, "between": between,
            "ceilings": ceilings}


def judge_targets(rows: list[dict], gpt_step: dict | None, target: tuple[int, int],
                  grid: list[tuple[int, int]], paired: list[dict] | None = None,
                  graph: list[dict] | None = None, baseline: dict | None = None) -> dict[str, dict]:
    """The targets (``THRESHOLDS``) from the measured rows (see the module docstring)."""
    tokens, d = target
    targets = {}
    for key, variant, phase, what in (
            ("ffn_fwd_bwd_ours_mvue", "ours_mvue", "fwd_bwd",
             "S-STE + MVUE (all three products sparse), mask every step"),
            ("ffn_fwd_bwd_refresh40", "ours_mvue_refresh40", "fwd_bwd", "S-STE + MVUE, mask refresh interval 40"),
            ("ffn_fwd_ours", "ours_mvue", "fwd", "forward alone, operand prepared once")):
        value, extra, check = ffn_headline(variant, phase, rows, paired, target, baseline)
        targets[key] = _target(f"FFN {'forward+backward' if phase == 'fwd_bwd' else 'forward'}, {what}, "
                               f"{tokens} tokens x d_model {d}, against the fastest dense in the run",
                               THRESHOLDS[key], value, check, **extra)

    # auto: per grid point from the paired rounds where they exist, else from the grid's single figure
    pair_rows, grid_rows = _fwd_bwd_by_point(paired), _fwd_bwd_by_point(rows)

    def every_point(key: str, points: list[dict], wanted: set, description: str) -> dict:
        measured = [p for p in points if p["ratio"] is not None]
        complete = {(p["tokens"], p["d_model"]) for p in measured} >= wanted
        worst = min((p["ratio"] for p in measured), default=None)
        t = _target(description, THRESHOLDS[key], worst, points=points, grid_points=len(wanted),
                    grid_points_measured=len(measured), complete=complete)
        if t["status"] == "met" and not complete:  # "everywhere" needs every point measured
            t.update(status="missed", met=False)
        return t

    auto_points = sorted({(t, dd) for t, dd, v in list(grid_rows) + list(pair_rows) if v == "auto"})
    points = []
    for t, dd in auto_points:
        value, source = variant_ratio(pair_rows, grid_rows, t, dd, "ours_mvue_dense_products", "auto")
        points.append({"tokens": t, "d_model": dd, "ratio": value, "source": source})
    # the policy's own promise: never slower than the dense products of the same masked operands
    targets["auto_vs_dense_products"] = every_point(
        "auto_vs_dense_products", points, set(grid),
        "auto against the same method with every product dense (ours_mvue_dense_products), eager "
        "forward+backward, every grid point")

    g_ms = {(r["tokens"], r["d_model"], r["variant"]): r.get("ms") for r in graph or [] if r.get("mode") == "graph"}

    def graph_points(numerator: str, min_d: int = 0, variant: str = "auto") -> list[dict]:
        return [{"tokens": t, "d_model": dd, "ratio": g_ms[(t, dd, numerator)] / a}
                for (t, dd, v), a in g_ms.items()
                if v == variant and dd >= min_d and a and g_ms.get((t, dd, numerator))]
    targets["auto_vs_dense_products_graph"] = every_point(
        "auto_vs_dense_products_graph", graph_points("ours_mvue_dense_products"), set(grid),
        "auto against the same method with every product dense, both replayed by CudaGraphStep, every grid point")
    targets["auto_vs_dense_graph_from_2048"] = every_point(
        "auto_vs_dense_graph_from_2048", graph_points("dense", GRAPH_FROM_D_MODEL),
        {p for p in grid if p[1] >= GRAPH_FROM_D_MODEL},
        f"auto against dense, both replayed by CudaGraphStep, every grid point from d_model {GRAPH_FROM_D_MODEL} up")
    targets["auto_refresh10_vs_dense_graph"] = every_point(
        "auto_refresh10_vs_dense_graph", graph_points("dense", variant="auto_refresh10"), set(grid),
        "auto with the mask refreshed every 10 steps against dense, both replayed by CudaGraphStep, every grid point "
        "(mean over whole refresh cycles)")

    d_gpt = gpt_step["config"]["d_model"] if gpt_step else None
    for key, variant, what in (("gpt_step", "ours_mvue", "FFN linears 2:4"),
                               ("gpt_step_all_linears", "ours_mvue_all_linears",
                                "every block linear 2:4 (attention projections too)")):
        value, extra = gpt_headline(gpt_step, variant)
        targets[key] = _target(f"GPT training step tokens/s, S-STE + MVUE, {what}, d_model {d_gpt}, against the "
                               "fastest dense in the run", THRESHOLDS[key], value, None, **extra)
    return targets


def gpt_headline(gpt_step: dict | None, variant: str, dense: str = "dense") -> tuple[float | None, dict]:
    """(headline speed-up, figures beside it) of a GPT variant: its paired median over the fastest
    ``dense`` variant (timed alone, or in the paired rounds). No baseline check: the step's attention,
    norms and AdamW have no matmul rate to compare with; the dense step's TFLOP/s is shown instead."""
    if not gpt_step:
        return None, {}
    alone = gpt_step.get("variants", {})
    pair = (gpt_step.get("paired") or {}).get("by_variant", {}).get(variant)
    variant_ms = pair["ms"] if pair else (alone.get(variant) or {}).get("ms")
    candidates = {"alone": (alone.get(dense) or {}).get("ms"),
                  "alternation": (gpt_step.get("paired") or {}).get("dense_ms")}
    h = headline(candidates, variant_ms)
    extra = {"variant_ms": variant_ms, "variant_source": "paired median" if pair else "alone",
             "dense_ms": h["dense_ms"], "dense_source": h["dense_source"], "against_each_dense": h["against"],
             "unpaired": (alone.get(variant) or {}).get("speedup_vs_dense"),
             "dense_tflops": (alone.get(dense) or {}).get("tflops")}
    if pair:
        extra.update(paired_ratio=pair["speedup_vs_dense"], paired_min=pair["speedup_min"],
                     paired_max=pair["speedup_max"], rounds=len(pair["round_speedups"]))
    if h["dense_ms"] and gpt_step.get("dense_flops_per_token"):
        extra["dense_tflops"] = (gpt_step["dense_flops_per_token"] * gpt_step["tokens_per_step"]
                                 / (h["dense_ms"] * 1e-3) / 1e12)
    return h["speedup"], extra
