"""Where a 2:4 layer's state lives on each rank under DDP and FSDP2 (one figure for notebook 12).

For a weight W (out x in) and its mask, rank r of N stores under DDP every row, under FSDP2 the rows
``torch.chunk(range(out), N)[r]`` (FSDP2 shards dim 0; the mask is sharded like its weight).
"""
from __future__ import annotations

import torch

from ._optional import plotly_go


def stored_rows(rows: int, world: int) -> list[tuple[int, int]]:
    """(start, stop) of the rows each rank stores under FSDP2's dim-0 sharding (torch.chunk)."""
    sizes = [len(c) for c in torch.chunk(torch.arange(rows), world)]
    sizes += [0] * (world - len(sizes))
    starts = [sum(sizes[:k]) for k in range(world)]
    return [(s, s + n) for s, n in zip(starts, sizes)]


def sharding_figure(mask: torch.Tensor, world: int = 2):
    """Side by side, for each rank: the mask entries it stores under DDP and under FSDP2 (grey: not stored).

    mask: (out, in) bool. Kept weights are dark, pruned light; rows a rank does not store are blank.
    """
    from plotly.subplots import make_subplots

    go = plotly_go()
    if mask.dim() != 2 or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a 2-D bool tensor, got {mask.dtype} with shape {tuple(mask.shape)}")
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be an int >= 1, got {world!r}")
    rows = mask.shape[0]
    titles = [f"DDP, rank {r}" for r in range(world)] + [f"FSDP2, rank {r}" for r in range(world)]
    fig = make_subplots(rows=2, cols=world, subplot_titles=titles, vertical_spacing=0.12, horizontal_spacing=0.04)
    values = mask.float()
    for r, (start, stop) in enumerate(stored_rows(rows, world)):
        for row, keep in ((1, (0, rows)), (2, (start, stop))):
            z = torch.full_like(values, float("nan"))
            z[keep[0]:keep[1]] = values[keep[0]:keep[1]]
            fig.add_trace(go.Heatmap(z=z.tolist(), zmin=0, zmax=1, showscale=False, xgap=1, ygap=1,
                                     colorscale=((0, "rgb(222,235,247)"), (1, "rgb(8,81,156)")),
                                     hovertemplate="row %{y}, col %{x}: %{z}<extra></extra>"), row=row, col=r + 1)
    fig.update_yaxes(autorange="reversed", showticklabels=False)
    fig.update_xaxes(showticklabels=False)
    # the key on a line of its own: on one line the title is wider than the column and is cut off
    fig.update_layout(title=f"Mask entries stored per rank ({rows} x {mask.shape[1]} layer, {world} ranks)"
                            "<br><sup>dark = kept weight, light = pruned, blank = not stored</sup>",
                      height=520, margin=dict(t=80, l=20, r=20, b=20))
    return fig


def distributed_table(payload: dict) -> str:
    """The recorded (or live) distributed benchmark as a text table: one row per method and parallel mode."""
    lines = [f"{'method':<10} {'parallel':<8} {'step ms':>9} {'tok/s/GPU':>11} {'tok/s total':>12} {'peak GiB':>9}"]
    for r in payload["rows"]:
        peak = max((p for p in r["peak_memory_gib_per_rank"] if p is not None), default=None)
        lines.append(f"{r['method']:<10} {r['parallel']:<8} {1e3 * r['median_step_s']:>9.1f} "
                     f"{r['tokens_per_s_per_gpu']:>11.0f} {r['tokens_per_s_total']:>12.0f} "
                     f"{'-' if peak is None else f'{peak:.2f}':>9}")
    return "\n".join(lines)


RECORDED_PATTERN = "distributed_speed_*gpu.json"


def recorded_scaling(directory=None) -> list[dict]:
    """Every recorded ``results/distributed_speed_<N>gpu.json`` (``python -m benchmarks dist`` under torchrun
    on N GPUs), smoke runs left out, sorted by world size; an empty list when none is recorded."""
    import json
    from pathlib import Path

    from ...provenance import RESULTS_DIR

    runs = []
    for path in sorted(Path(directory or RESULTS_DIR).glob(RECORDED_PATTERN)):
        data = json.loads(path.read_text())
        if not data.get("smoke"):
            runs.append({**data, "file": path.name})
    return sorted(runs, key=lambda d: d["world_size"])


def _width(run: dict):
    return (run.get("settings") or {}).get("width")


def _gpu(run: dict) -> str:
    """The GPU's model as a short tag: "NVIDIA H100 80GB HBM3" -> "H100"; "?" when not recorded."""
    import re

    found = re.search(r"\b([A-Z]{1,2}\d{2,4})\b", run.get("gpu") or "")
    return found.group(1) if found else "?"


def scaling_rows(runs: list[dict]) -> list[dict]:
    """One row per (GPU model, model width, method, parallel mode, world size): tokens/s per GPU and in
    total, the step time, and ``vs_dense`` (2:4 tokens/s over dense tokens/s of the same GPU, width, mode
    and world size; None for dense) and ``vs_one_gpu`` (tokens/s per GPU over the same GPU, width, method
    and mode at the smallest world size recorded for them). Runs of different GPUs or widths are never
    compared."""
    rows = []
    for run in runs:
        for r in run["rows"]:
            rows.append({"gpu": _gpu(run), "width": _width(run), "world": run["world_size"], "method": r["method"],
                         "parallel": r["parallel"], "step_ms": 1e3 * r["median_step_s"],
                         "per_gpu": r["tokens_per_s_per_gpu"], "total": r["tokens_per_s_total"]})
    by_key = {(r["gpu"], r["width"], r["world"], r["method"], r["parallel"]): r for r in rows}
    smallest = {}
    for r in rows:
        group = (r["gpu"], r["width"])
        smallest[group] = min(smallest.get(group, r["world"]), r["world"])
    for r in rows:
        dense = by_key.get((r["gpu"], r["width"], r["world"], "dense", r["parallel"]))
        r["vs_dense"] = None if r["method"] == "dense" or dense is None else r["total"] / dense["total"]
        base = by_key.get((r["gpu"], r["width"], smallest[(r["gpu"], r["width"])], r["method"], r["parallel"]))
        r["vs_one_gpu"] = None if base is None else r["per_gpu"] / base["per_gpu"]
    return rows


def scaling_table(runs: list[dict]) -> str:
    """The rows of :func:`scaling_rows` as text that fits the book's column (at most 80 characters), by GPU
    model and width; the last column is against the smallest world size recorded for them."""
    rows = scaling_rows(runs)
    if not rows:
        return "no recorded multi-GPU run"
    lines = [f"{'GPU':<4} {'width':>5} {'GPUs':>4} {'method':<10} {'parallel':<8} {'step ms':>7} "
             f"{'tok/s per GPU':>13} {'2:4/dense':>9} {'scaling':>7}"]
    for r in sorted(rows, key=lambda r: (r["gpu"], r["width"] or 0, r["world"], r["parallel"], r["method"])):
        vs_dense = "" if r["vs_dense"] is None else f"{r['vs_dense']:.2f}x"
        vs_one = "" if r["vs_one_gpu"] is None else f"{r['vs_one_gpu']:.2f}"
        width = "?" if r["width"] is None else r["width"]
        lines.append(f"{r['gpu']:<4} {width:>5} {r['world']:>4} {r['method']:<10} {r['parallel']:<8} "
                     f"{r['step_ms']:>7.1f} {r['per_gpu']:>13,.0f} {vs_dense:>9} {vs_one:>7}")
    return "\n".join(lines)
