"""The printed table of a ``python -m benchmarks ffn`` result, and one line per target."""
from __future__ import annotations

from benchmarks.conditions import format_conditions
from benchmarks.ffn.schema import LIBRARY_COMPARISON, PHASES, VARIANTS


# --- printing -------------------------------------------------------------------------------------------------
SHORT = {"ours_fixed_mask": "fixed_mask", "ours_mask_every_step": "every_step", "ours_mvue": "mvue",
         "cutlass_mvue": "cutlass_mvue",
         "ours_mvue_refresh40": "mvue_refresh40",
         "ours_mvue_dense_products": "mvue_dense_mm", "pytorch_semi_structured": "pytorch", "auto": "auto",
         "sparse_auto": "sparse_auto"}


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if row.get("ms") is None:
        return "error" if row.get("error") else "skipped" if row.get("skipped") else "-"
    speed = f" {row['speedup_vs_dense']:.2f}x" if row.get("speedup_vs_dense") is not None else ""
    return f"{row['ms']:.2f}{speed}"


def _fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def format_table(result: dict) -> str:
    head = "SMOKE RUN (CPU, backend 'torch' for cuSPARSELt): these numbers are not figures\n" if result["smoke"] else ""
    lines = [head + f"FFN y = W2 gelu(W1 x), {result['dtype']}, {result['device']}: ms, and speed-up over dense "
             "(same tokens, d_model, phase)",
             f"{'tokens':>6} {'d_model':>7} {'phase':<8} {'dense ms':>9} " + " ".join(f"{SHORT[v]:>14}"
                                                                                    for v in VARIANTS[1:])]
    index = {(r["tokens"], r["d_model"], r["variant"], r["phase"]): r for r in result["rows"]}
    for tokens, d in sorted({(r["tokens"], r["d_model"]) for r in result["rows"]}):
        for phase in PHASES:
            dense = index.get((tokens, d, "dense", phase))
            dense_ms = _fmt(dense.get("ms") if dense else None)
            cells = " ".join(f"{_cell(index.get((tokens, d, v, phase))):>14}" for v in VARIANTS[1:])
            lines.append(f"{tokens:>6} {d:>7} {phase:<8} {dense_ms:>9} {cells}")
        for variant in (*LIBRARY_COMPARISON, "auto", "sparse_auto"):
            stats = (index.get((tokens, d, variant, "fwd_bwd")) or {}).get("stats_per_step")
            if stats:
                lines.append(f"{'':>16}per step, {variant}: " + ", ".join(f"{k} {v:g}" for k, v in stats.items()))
    if result.get("paired"):
        lines.append("paired rounds (speed-up over dense: median of rounds [min, max]):")
        for r in result["paired"]:
            if r["variant"] == "dense":
                continue
            spread = (f" [{r['speedup_min']:.2f}, {r['speedup_max']:.2f}]" if r.get("speedup_min") is not None else "")
            lines.append(f"  {r['tokens']:>6} x {r['d_model']:<5} {r['variant']:<26} {r['phase']:<8} {_cell(r)}{spread}"
                         + (f"  ({r['error'][:120]})" if r.get("error") and r.get("ms") is None else ""))
    if result["graph"]:
        lines.append("eager vs CUDA graph, one fwd_bwd step (speed-up over dense in the same mode):")
        for r in result["graph"]:
            lines.append(f"  {r['tokens']:>6} x {r['d_model']:<5} {r['variant']:<10} {r['mode']:<6} {_cell(r)}"
                         + (f"  ({r['error'][:120]})" if r.get("error") and r.get("ms") is None else ""))
    gpt = result["gpt_step"]
    if gpt:
        cfg = gpt.get("config", {})
        lines.append(f"GPT step ({cfg.get('n_layer')} layers, d_model {cfg.get('d_model')}, "
                     f"{gpt.get('tokens_per_step')} tokens, AdamW):")
        for variant, r in gpt.get("variants", {}).items():
            lines.append(f"  {variant:<22} {_fmt(r.get('ms'))} ms  {_fmt(r.get('tokens_per_s'), ',.0f')} tokens/s  "
                         f"{_fmt(r.get('speedup_vs_dense'), '.2f', 'x')}"
                         + (f"  ({r['error'][:120]})" if r.get("error") else ""))
        pair = gpt.get("paired") or {}
        for variant, p in (pair.get("by_variant") or {}).items():
            lines.append(f"  paired rounds: {variant} {p['speedup_vs_dense']:.2f}x of dense "
                         f"[{p['speedup_min']:.2f}, {p['speedup_max']:.2f}]")
    base = result.get("baseline") or {}
    if base:
        probe, end = base.get("products_probe") or {}, base.get("products_probe_end") or {}
        lines.append(f"baseline at the target shape: six products as bare matmuls {_fmt(probe.get('ms'))} ms "
                     f"({_fmt(probe.get('tflops'), '.0f')} TFLOP/s) at the start, {_fmt(end.get('ms'))} ms "
                     f"({_fmt(end.get('tflops'), '.0f')} TFLOP/s) at the end; dense FFN step alone "
                     f"{_fmt(base.get('dense_alone_ms'))} ms ({_fmt(base.get('dense_alone_tflops'), '.0f')} TFLOP/s)")
    if result.get("conditions"):
        lines.append(format_conditions(result["conditions"]))
    target = result["target_shape"]
    for variant, text in result["backend_report"].items():
        lines.append(f"backend report, {variant} at {target['tokens']} tokens x d_model {target['d_model']}:")
        lines.append(text)
    for item in result["skipped"]:
        lines.append(f"skipped {item['what']}: {item['reason']}")
    if result["errors"]:
        lines.append(f"{len(result['errors'])} error(s) recorded (JSON 'errors'); first: "
                     f"{result['errors'][0]['where']}: {result['errors'][0]['error'][:200]}")
    return "\n".join(lines)


def target_lines(result: dict) -> list[str]:
    """One line per target: the headline figure, its dense baseline (ms, TFLOP/s, which measurement),
    the other ratios beside it, and the verdict (met / MISSED / FLAGGED / not measured)."""
    tag = " [SMOKE: not a figure]" if result["smoke"] else ""
    verdicts = {"met": "met", "missed": "MISSED", "flagged": "FLAGGED (dense baseline below 90 % of the "
                "start-of-run matmul rate: not recorded)", "not measured": "MISSED (not measured)"}
    lines = []
    for t in result["targets"].values():
        value = _fmt(t["measured"], ".2f", "x") if t["measured"] is not None else "not measured"
        if "grid_points" in t:
            value += f" (worst of {t['grid_points_measured']}/{t['grid_points']} grid points)"
        if t.get("dense_ms") is not None:
            value += (f" (dense {t['dense_ms']:.2f} ms, {t['dense_source']}, "
                      f"{_fmt(t.get('dense_tflops'), '.0f')} TFLOP/s")
            check = t.get("baseline_check") or {}
            if check.get("fraction") is not None:
                value += f", {check['fraction']:.0%} of the products probe"
            value += ")"
        if t.get("paired_ratio") is not None:
            value += (f"; paired rounds {t['paired_ratio']:.2f}x [{t['paired_min']:.2f}, {t['paired_max']:.2f}]; "
                      f"unpaired {_fmt(t.get('unpaired'), '.2f', 'x')}")
        lines.append(f"target {t['description']}: >= {t['threshold']:g}x, measured {value} -> "
                     f"{verdicts[t['status']]}{tag}")
    return lines


def comparison_lines(result: dict) -> list[str]:
    """The same method on each 2:4 library at the target shape (``result["library_comparison"]``): one line per
    variant with its speed-up over the fastest dense of the run and that dense's ms, source and TFLOP/s, or the
    reason it was skipped; then the libraries against each other."""
    comparison = result.get("library_comparison") or {}
    if not comparison:
        return []
    tag = " [SMOKE: not a figure]" if result["smoke"] else ""
    lines = [f"S-STE + MVUE on each 2:4 library, forward+backward at {comparison['tokens']} tokens x d_model "
             f"{comparison['d_model']}, against the fastest dense of the run{tag}:"]
    for variant, c in comparison["variants"].items():
        who = f"  {variant} ({c.get('backend') or 'not built'}): "
        if c.get("skipped"):
            lines.append(who + f"skipped: {c['skipped'][:300]}")
        elif c.get("speedup") is None:
            lines.append(who + "not measured")
        else:
            paired = (f"; paired rounds {c['paired_ratio']:.2f}x [{c['paired_min']:.2f}, {c['paired_max']:.2f}]"
                      if c.get("paired_ratio") is not None else "")
            ceiling = (f"; ceiling of its products {c['ceiling']:.2f}x" if c.get("ceiling") is not None else "")
            lines.append(who + f"{c['variant_ms']:.2f} ms ({c['variant_source']}, {_fmt(c['variant_tflops'], '.0f')} "
                         f"TFLOP/s dense-equivalent), {c['speedup']:.2f}x dense ({c['dense_ms']:.2f} ms, "
                         f"{c['dense_source']}, {_fmt(c.get('dense_tflops'), '.0f')} TFLOP/s){paired}{ceiling}")
    for name, b in comparison["between"].items():
        lines.append(f"  {name}: {_fmt(b['speedup'], '.2f', 'x')} ({b['source']})")
    for lib, c in (comparison.get("ceilings") or {}).items():
        lines.append(f"  ceiling on {lib}: {c['ceiling']:.2f}x (its {c['products']} products {c['products_ms']:.2f} ms, "
                     f"{c['products_speedup']:.2f}x the dense products' {c['dense_products_ms']:.2f} ms, each timed "
                     f"alone by sparse_auto; the rest of the dense step {c['dense_step_ms'] - c['dense_products_ms']:.2f}"
                     f" ms kept, the 2:4 work free)")
    return lines
