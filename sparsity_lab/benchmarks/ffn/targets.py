"""The targets of ``bench-ffn``: thresholds, and the verdict of each from the measured rows."""
from __future__ import annotations

import statistics


THRESHOLDS = {"ffn_fwd_bwd_ours_mvue": 1.35, "ffn_fwd_ours": 1.5, "auto_every_grid_point": 0.97,
              "auto_vs_dense_products": 0.97, "auto_every_grid_point_graph": 0.97, "gpt_step": 1.15}

# --- targets ------------------------------------------------------------------------------------------------
def _target(description: str, threshold: float, measured: float | None, **extra) -> dict:
    return {"description": description, "threshold": threshold, "measured": measured,
            "met": measured is not None and measured >= threshold, **extra}


def judge_targets(rows: list[dict], gpt_step: dict | None, target: tuple[int, int],
                  grid: list[tuple[int, int]], paired: list[dict] | None = None,
                  graph: list[dict] | None = None) -> dict[str, dict]:
    """The targets (``THRESHOLDS``) from the measured rows: measured value and met (False when not measured).

    At the target shape the paired rounds decide where they measured the variant (NOTES["paired"]);
    the grid's single measurement is kept beside it as ``unpaired``."""
    tokens, d = target

    def speedup(variant: str, phase: str) -> tuple[float | None, dict]:
        grid_value = next((r.get("speedup_vs_dense") for r in rows if (r["tokens"], r["d_model"], r["variant"],
                                                                         r["phase"]) == (tokens, d, variant, phase)), None)
        pair = next((r for r in paired or [] if (r["tokens"], r["d_model"], r["variant"], r["phase"])
                     == (tokens, d, variant, phase) and r.get("speedup_vs_dense") is not None), None)
        if pair is None:
            return grid_value, {"unpaired": grid_value, "source": "grid"}
        return pair["speedup_vs_dense"], {"unpaired": grid_value, "source": f"paired median of "
                                          f"{len(pair['round_speedups'])} rounds", "paired_min": pair["speedup_min"],
                                          "paired_max": pair["speedup_max"]}

    fb, fb_extra = speedup("ours_mvue", "fwd_bwd")
    fw, fw_extra = speedup("ours_mvue", "fwd")
    targets = {
        "ffn_fwd_bwd_ours_mvue": _target(
            f"FFN forward+backward, ours_mvue (mask every step, MVUE dW), {tokens} tokens x d_model {d}",
            THRESHOLDS["ffn_fwd_bwd_ours_mvue"], fb, **fb_extra),
        "ffn_fwd_ours": _target(f"FFN forward alone, ours (operand prepared once), {tokens} tokens x d_model {d}",
                                THRESHOLDS["ffn_fwd_ours"], fw, **fw_extra),
    }
    # auto: per grid point from the paired rounds where they exist, else from the grid's single figure
    pair_rows = {(r["tokens"], r["d_model"], r["variant"]): r for r in paired or [] if r["phase"] == "fwd_bwd"}
    grid_rows = {(r["tokens"], r["d_model"], r["variant"]): r for r in rows if r["phase"] == "fwd_bwd"}

    def ratio(t: int, dd: int, numerator: str) -> tuple[float | None, str]:
        """median over rounds of numerator ms / auto ms (paired), else the grid's single ratio."""
        num, den = pair_rows.get((t, dd, numerator)), pair_rows.get((t, dd, "auto"))
        if num and den and num["round_ms"] and den["round_ms"]:
            return statistics.median(a / b for a, b in zip(num["round_ms"], den["round_ms"])), "paired"
        num, den = grid_rows.get((t, dd, numerator)), grid_rows.get((t, dd, "auto"))
        if numerator == "dense" and den and den.get("speedup_vs_dense") is not None:
            return den["speedup_vs_dense"], "grid"
        if num and den and num.get("ms") and den.get("ms"):
            return num["ms"] / den["ms"], "grid"
        return None, "not measured"

    def auto_target(key: str, numerator: str, description: str) -> dict:
        points = []
        for t, dd in sorted({(t, dd) for t, dd, v in list(grid_rows) + list(pair_rows) if v == "auto"}):
            value, source = ratio(t, dd, numerator)
            points.append({"tokens": t, "d_model": dd, "ratio": value, "source": source})
        measured = [p for p in points if p["ratio"] is not None]
        complete = {(p["tokens"], p["d_model"]) for p in measured} >= set(grid)
        worst = min(p["ratio"] for p in measured) if measured else None
        target = _target(description, THRESHOLDS[key], worst, points=points, grid_points=len(grid),
                         grid_points_measured=len(measured), complete=complete)
        target["met"] = target["met"] and complete  # "everywhere" needs every point measured
        return target

    targets["auto_every_grid_point"] = auto_target(
        "auto_every_grid_point", "dense",
        "auto (ours_mvue on cusparselt_auto) forward+backward at every grid point, against dense")
    # the policy's own promise: never slower than the dense products of the same masked operands
    targets["auto_vs_dense_products"] = auto_target(
        "auto_vs_dense_products", "ours_mvue_dense_products",
        "auto against the same method with every product dense (ours_mvue_dense_products), "
        "forward+backward, every grid point")
    # under CUDA-graph replay (CudaGraphStep), dense replayed against auto replayed, per grid point
    g_ms = {(r["tokens"], r["d_model"], r["variant"]): r.get("ms") for r in graph or [] if r.get("mode") == "graph"}
    g_points = [{"tokens": t, "d_model": dd, "ratio": g_ms[(t, dd, "dense")] / a}
                for (t, dd, v), a in g_ms.items() if v == "auto" and a and g_ms.get((t, dd, "dense"))]
    g_complete = {(p["tokens"], p["d_model"]) for p in g_points} >= set(grid)
    g_target = _target("auto forward+backward under CUDA-graph replay (CudaGraphStep), every grid point, against "
                       "dense replayed the same way", THRESHOLDS["auto_every_grid_point_graph"],
                       min((p["ratio"] for p in g_points), default=None), points=g_points, grid_points=len(grid),
                       grid_points_measured=len(g_points), complete=g_complete)
    g_target["met"] = g_target["met"] and g_complete
    targets["auto_every_grid_point_graph"] = g_target
    gpt_value, gpt_extra = None, {}
    if gpt_step:
        gpt_value = gpt_step.get("variants", {}).get("ours_mvue", {}).get("speedup_vs_dense")
        pair = gpt_step.get("paired") or {}
        if pair.get("speedup_vs_dense") is not None:
            gpt_extra = {"unpaired": gpt_value, "source": f"paired median of {len(pair['round_speedups'])} rounds",
                         "paired_min": pair["speedup_min"], "paired_max": pair["speedup_max"]}
            gpt_value = pair["speedup_vs_dense"]
    d_gpt = gpt_step["config"]["d_model"] if gpt_step else None
    targets["gpt_step"] = _target(f"GPT training step tokens/s, ours_mvue FFNs, d_model {d_gpt}",
                                  THRESHOLDS["gpt_step"], gpt_value, **gpt_extra)
    return targets
