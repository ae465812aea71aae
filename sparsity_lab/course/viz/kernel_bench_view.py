"""The kernel benchmark (``python -m benchmarks kernels``) as a picture: each kernel's fraction of the
copy ceiling.

A memory-bound kernel can move its bytes no faster than a device-to-device copy; the benchmark
counts each kernel's bytes (inputs read once, outputs written once), divides by its measured time,
and divides that by the copy bandwidth measured in the same run. 1.0 means "as fast as a copy".
This module reads a result dict (``sparsity_lab.provenance.read_result("kernels_h100")`` or a live
run's JSON) and plots it; it computes nothing that the benchmark did not record.
"""
from __future__ import annotations

import re

from ._provenance import provenance_command, provenance_line
from ._optional import plotly_go

TARGET_COLOR, OTHER_COLOR = "#1f77b4", "#9e9e9e"


def _check_result(data: dict) -> None:
    if not isinstance(data, dict) or "rows" not in data or "provenance" not in data:
        raise ValueError("data must be a benchmarks kernels result: a dict with 'provenance' and 'rows' "
                         "(read it with sparsity_lab.provenance.read_result)")


def kernel_label(kernel: str, variant: str) -> str:
    """What a reader sees for one measurement: the kernel's function name and the variant, without the
    benchmark's own kernel number ("1 prune24", "values + mask" -> "prune24: values + mask")."""
    return f"{re.sub(r'^[0-9]+ ', '', kernel)}: {variant}"


def copy_fraction_rows(data: dict) -> list[dict]:
    """One row per measurement that has a fraction of the copy ceiling, in the benchmark's order.

    A ratio row that repeats a timing already listed (same kernel, bytes and time: the benchmark
    reports one measurement against several baselines) is shown once. Each row: {"label", "kernel",
    "variant", "fraction", "ms", "gbps", "bytes", "counts_for_target", "config"}.
    """
    _check_result(data)
    rows, seen = [], set()
    for r in data["rows"]:
        if "fraction_of_copy" not in r:
            continue
        key = (r["kernel"], r.get("bytes"), r["ms"])
        if key in seen:
            continue
        seen.add(key)
        rows.append({"label": kernel_label(r["kernel"], r["variant"]), "kernel": r["kernel"], "variant": r["variant"],
                     "fraction": float(r["fraction_of_copy"]), "ms": float(r["ms"]), "gbps": float(r["gbps"]),
                     "bytes": int(r["bytes"]), "counts_for_target": bool(r.get("counts_for_target", False)),
                     "config": r.get("config", {})})
    return rows


def speedup_rows(data: dict) -> list[dict]:
    """Rows timed against a baseline in the same run: {"label", "ms", "baseline", "baseline_ms", "speedup"}
    (speedup None, with the note, when the baseline could not run)."""
    _check_result(data)
    return [{"label": kernel_label(r["kernel"], r["variant"]), "ms": r["ms"], "baseline": r["baseline"],
             "baseline_ms": r["baseline_ms"], "speedup": r["speedup"], "note": r.get("note", "")}
            for r in data["rows"] if r.get("baseline")]


def kernel_bench_provenance(data: dict) -> str:
    """Where the kernel figures come from: ``provenance_line`` (GPU, date, commit, versions) plus the copy
    ceiling, the tensor size and the command; smoke runs and failed checks are flagged."""
    _check_result(data)
    p, s = data["provenance"], data.get("summary", {})
    line = (f"{provenance_line(p)}; copy ceiling {s.get('copy_gbps', float('nan')):.0f} GB/s; main tensor "
            f"{data.get('main_tensor_mib', float('nan')):g} MiB; command: {provenance_command(p)}")
    if data.get("smoke"):
        line += " [SMOKE RUN on the CPU interpreter: these numbers are not measurements of the kernels]"
    if data.get("failed_checks"):
        line += f" [checks FAILED, those kernels were not timed: {data['failed_checks']}]"
    return line


def kernel_bench_figure(data: dict, title: str | None = None):
    """Horizontal bars: fraction of the copy ceiling per kernel and variant; blue bars are the one-pass
    memory-bound kernels the benchmark's target is stated for, grey the others; dashed lines at the
    target and at 1.0 (the copy). Hover shows time, GB/s, bytes and the block configuration."""
    go = plotly_go()
    rows = copy_fraction_rows(data)
    if not rows:
        raise ValueError("the result has no rows with a fraction of the copy ceiling")
    p, s = data["provenance"], data.get("summary", {})
    labels = [r["label"] for r in rows]
    hover = [f"{r['ms']:.4f} ms, {r['gbps']:.0f} GB/s, {r['bytes'] / 2**20:.0f} MiB counted, config {r['config']}"
             for r in rows]
    fig = go.Figure(go.Bar(
        y=labels, x=[r["fraction"] for r in rows], orientation="h", text=[f"{r['fraction']:.2f}" for r in rows],
        textposition="outside", customdata=hover, hovertemplate="%{y}<br>%{x:.2f} of copy<br>%{customdata}<extra></extra>",
        marker_color=[TARGET_COLOR if r["counts_for_target"] else OTHER_COLOR for r in rows]))
    shapes = [{"type": "line", "x0": 1.0, "x1": 1.0, "yref": "paper", "y0": 0, "y1": 1,
               "line": {"dash": "dot", "color": "#333"}}]
    if s.get("target_fraction") is not None:
        shapes.append({"type": "line", "x0": s["target_fraction"], "x1": s["target_fraction"], "yref": "paper",
                       "y0": 0, "y1": 1, "line": {"dash": "dash", "color": "#d62728"}})
    default = (f"fraction of the copy ceiling ({s.get('copy_gbps', float('nan')):.0f} GB/s) on "
               f"{p.get('gpu') or 'CPU'}<br><sup>red dashes: {s.get('target_fraction', float('nan')):.2f}, "
               "the bar for the blue kernels</sup>")
    fig.update_layout(title=title or default, xaxis={"title": "counted bytes / time / copy bandwidth", "range": [0, 1.15]},
                      yaxis={"autorange": "reversed"}, shapes=shapes, height=140 + 26 * len(rows),
                      margin={"l": 360})
    return fig
