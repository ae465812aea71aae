"""Speed on a GPU as pictures: the recorded benchmark tables of results/ (and of a live run of
``course.live.measure_ffn``).

Recorded tables (each JSON has a ``provenance`` block; :func:`recorded` reads one, None when absent):
    kernels_h100.json          Triton kernels: speedup over the plain PyTorch way of doing the same
                               thing (their fraction of the copy rate: kernel_bench_view)
    mvue_variants_h100.json    MVUE 2:4 kernel variants: fraction of the copy rate, correct or not
    dyad_h100.json             DYAD against nn.Linear, forward + backward, by width
    cusparselt_ffn_h100.json   one FFN (up, activation, down) dense against 2:4, schema FFN_KEYS:
        {"tokens", "d_model", "ffn": int, "variant": one of FFN_VARIANTS, "phase": "fwd" | "fwd_bwd",
         "ms": float, "speedup_vs_dense": float (dense ms / this ms, same shape and phase)}

Every speedup here is a ratio of two times measured side by side in one run; a value above 1 means
faster than the reference (dense, nn.Linear or PyTorch).
"""
from __future__ import annotations

import math
from pathlib import Path

from ...provenance import RESULTS_DIR
from ._optional import ipywidgets, plotly_go
from ._provenance import provenance_command, provenance_line

__all__ = ["FFN_KEYS", "FFN_VARIANTS", "PHASES", "check_ffn_rows", "ffn_errors", "dyad_speedup_figure", "ffn_explorer",
           "ffn_speedup_figure", "ffn_wins_heatmap", "kernel_vs_pytorch_figure",
           "mvue_variants_figure", "ours_vs_pytorch", "ours_vs_pytorch_figure", "paired_figure", "paired_speedups",
           "READER_NAMES", "provenance_command", "provenance_line", "recorded",
           "shape_label", "step_speedup", "wins_and_losses"]

FFN_KEYS = ("tokens", "d_model", "ffn", "variant", "phase", "ms", "speedup_vs_dense")
# the writer's names (benchmarks/ffn/schema.py, KNOWN_VARIANTS; viz does not import the
# benchmarks, and tests/test_ffn_bench.py checks that the two lists agree)
FFN_VARIANTS = ("dense", "ours_fixed_mask", "ours_mask_every_step", "ours_mvue", "cutlass_mvue",
                "ours_mvue_refresh40",
                "ours_mvue_dense_products", "pytorch_semi_structured", "auto", "ours_fp8", "auto_refresh10",
                "sparse_auto")
# what a reader sees in a legend: the recording's variant names are the benchmark's own
READER_NAMES = {"dense": "dense", "ours_fixed_mask": "2:4, mask fixed", "ours_mask_every_step": "2:4, mask every step",
                "ours_mvue": "2:4 + MVUE (S-STE)", "cutlass_mvue": "2:4 + MVUE (S-STE), CUTLASS products",
                "ours_mvue_refresh40": "2:4 + MVUE, mask every 40 steps",
                "ours_mvue_dense_products": "2:4 per-step work, dense products",
                "pytorch_semi_structured": "PyTorch semi-structured", "auto": "2:4 only where it pays",
                "ours_fp8": "2:4 FP8", "auto_refresh10": "2:4 only where it pays, mask every 10 steps",
                "sparse_auto": "2:4 only where it pays, cuSPARSELt or CUTLASS"}
PHASES = ("fwd", "fwd_bwd")
PHASE_TITLES = {"fwd": "forward", "fwd_bwd": "forward + backward"}
COLORS = {"ours_fixed_mask": "#1f77b4", "ours_mask_every_step": "#2ca02c", "ours_mvue": "#9467bd", "cutlass_mvue": "#aec7e8", "ours_mvue_refresh40": "#17becf",
          "ours_mvue_dense_products": "#bcbd22", "ours_fp8": "#8c564b", "pytorch_semi_structured": "#d62728",
          "auto": "#ff7f0e", "auto_refresh10": "#e377c2", "sparse_auto": "#ffbb78", "dense": "#7f7f7f"}


def recorded(name: str, directory: str | Path | None = None) -> dict | None:
    """results/<name>.json as a dict, or None when it has not been recorded (the caller says so)."""
    path = Path(directory if directory is not None else RESULTS_DIR) / f"{name}.json"
    if not path.is_file():
        return None
    import json
    return json.loads(path.read_text())


def step_speedup(product_fraction: float, product_speedup: float) -> float:
    """The whole step's speedup when only its products get faster (Amdahl's law):
    1 / ((1 - f) + f / s), f = the products' share of the dense step's time, s = their speedup."""
    if not (isinstance(product_fraction, (int, float)) and 0 <= product_fraction <= 1):
        raise ValueError(f"product_fraction must be a number in [0, 1], got {product_fraction!r}")
    if not _positive_number(product_speedup):
        raise ValueError(f"product_speedup must be a finite number > 0, got {product_speedup!r}")
    return 1.0 / ((1.0 - product_fraction) + product_fraction / product_speedup)


# --- the cuSPARSELt FFN table -------------------------------------------------------------------
def _rows_of(data) -> list[dict]:
    if isinstance(data, dict):
        if "rows" not in data:
            raise ValueError(f"data has no 'rows' (keys: {sorted(data)}); pass the recorded JSON or its rows")
        return data["rows"]
    return data


def _positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def ffn_errors(data) -> list[dict]:
    """The rows that record a measurement that raised (``error``), e.g. PyTorch's path in backward."""
    return [r for r in _rows_of(data) if isinstance(r, dict) and r.get("error")]


def check_ffn_rows(data) -> list[dict]:
    """The measured rows of an FFN table (the JSON or its ``rows``), checked against the schema.

    Rows that record an error (``ms`` None and an ``error`` text) are left out of what is returned
    (``ffn_errors`` lists them); every other row must be complete."""
    rows = _rows_of(data)
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"rows must be a non-empty list of dicts, got {type(rows).__name__} of length "
                         f"{len(rows) if hasattr(rows, '__len__') else '?'}")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ValueError(f"rows[{i}] must be a dict, got {type(r).__name__}")
        missing = [k for k in FFN_KEYS if k not in r]
        if missing:
            raise ValueError(f"rows[{i}] lacks {missing}; every row needs {list(FFN_KEYS)}")
        for k in ("tokens", "d_model", "ffn"):
            if isinstance(r[k], bool) or not isinstance(r[k], int) or r[k] < 1:
                raise ValueError(f"rows[{i}][{k!r}] must be a positive int, got {r[k]!r}")
        if r["variant"] not in FFN_VARIANTS:
            raise ValueError(f"rows[{i}]['variant'] is {r['variant']!r}; expected one of {list(FFN_VARIANTS)}")
        if r["phase"] not in PHASES:
            raise ValueError(f"rows[{i}]['phase'] is {r['phase']!r}; expected one of {list(PHASES)}")
        if r.get("error"):
            continue
        for k in ("ms", "speedup_vs_dense"):
            if not _positive_number(r[k]):
                raise ValueError(f"rows[{i}][{k!r}] must be a finite number > 0, got {r[k]!r}")
    measured = [r for r in rows if not r.get("error")]
    if not measured:
        raise ValueError("every row records an error: nothing was measured")
    return rows if len(measured) == len(rows) else measured


def shape_label(row: dict) -> str:
    """tokens x d_model x ffn, e.g. '16384x4096x16384'."""
    return f"{row['tokens']}x{row['d_model']}x{row['ffn']}"


def _shapes(rows: list[dict]) -> list[str]:
    """The shape labels, smallest FFN work (tokens * d_model * ffn) first."""
    sizes = {shape_label(r): (r["tokens"] * r["d_model"] * r["ffn"], r["tokens"], r["d_model"]) for r in rows}
    return sorted(sizes, key=sizes.get)


def _phases(rows: list[dict]) -> list[str]:
    return [p for p in PHASES if any(r["phase"] == p for r in rows)]


def _sparse_variants(rows: list[dict]) -> list[str]:
    return [v for v in FFN_VARIANTS if v != "dense" and any(r["variant"] == v for r in rows)]


def _speedups(rows: list[dict], phase: str) -> dict[tuple[str, str], float]:
    """{(variant, shape label): speedup} for one phase."""
    return {(r["variant"], shape_label(r)): r["speedup_vs_dense"] for r in rows if r["phase"] == phase}


def ffn_speedup_figure(data, title: str = "One FFN, dense time / 2:4 time"):
    """Speedup over dense against the shape, one line per variant, one panel per phase; 1 = as fast as dense."""
    go = plotly_go()
    from plotly.subplots import make_subplots

    rows = check_ffn_rows(data)
    shapes, phases = _shapes(rows), _phases(rows)
    fig = make_subplots(rows=1, cols=len(phases), shared_yaxes=True,
                        subplot_titles=[PHASE_TITLES[p] for p in phases])
    for col, phase in enumerate(phases, start=1):
        speed = _speedups(rows, phase)
        for variant in _sparse_variants(rows):
            xs = [s for s in shapes if (variant, s) in speed]
            if xs:
                fig.add_trace(go.Scatter(x=xs, y=[speed[(variant, s)] for s in xs], mode="lines+markers",
                                         name=READER_NAMES.get(variant, variant), legendgroup=variant,
                                         showlegend=col == 1,
                                         line={"color": COLORS[variant]}), row=1, col=col)
        fig.add_hline(y=1.0, line_dash="dot", line_color="black", row=1, col=col)
    fig.update_xaxes(title_text="tokens x d_model x ffn", type="category", categoryorder="array",
                     categoryarray=shapes)
    fig.update_yaxes(title_text="speedup over dense", row=1, col=1)
    fig.update_layout(title=title, template="plotly_white", height=420)
    return fig


def paired_speedups(data, phase: str = "fwd_bwd") -> list[dict]:
    """The paired rounds of a benchmarks ffn recording (dense and ours timed in turns, the speed-up taken per
    round): per shape and 2:4 variant, ``{"shape", "variant", "median", "low", "high", "rounds"}``.
    Empty for recordings made before the paired section existed."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    out = []
    for r in (data or {}).get("paired", []):
        if r.get("phase") != phase or r.get("variant") == "dense" or r.get("speedup_vs_dense") is None:
            continue
        if r.get("variant") not in FFN_VARIANTS:
            raise ValueError(f"paired row variant {r.get('variant')!r} is not one of {list(FFN_VARIANTS)}")
        out.append({"shape": shape_label(r), "variant": r["variant"], "median": r["speedup_vs_dense"],
                    "low": r["speedup_min"], "high": r["speedup_max"], "rounds": len(r["round_speedups"])})
    return out


def paired_figure(data, phase: str = "fwd_bwd", variants=None, leave_out=()):
    """Median speed-up over dense per shape, with the lowest and highest round as the error bar.

    variants: the 2:4 variants drawn (default: every one recorded); leave_out: shape labels (``shape_label``)
    not drawn, e.g. the shape whose speed-up a lesson quotes from another run (one fact, one number)."""
    go = plotly_go()
    table = paired_speedups(data, phase)
    if not table:
        raise ValueError("this recording has no paired rounds (benchmarks ffn --rounds N records them)")
    if variants is not None:
        unknown = sorted(set(variants) - {t["variant"] for t in table})
        if unknown:
            raise ValueError(f"variants {unknown} have no paired rounds in this recording")
        table = [t for t in table if t["variant"] in variants]
    table = [t for t in table if t["shape"] not in set(leave_out)]
    if not table:
        raise ValueError(f"leave_out={list(leave_out)} leaves no shape to draw")
    shapes = [s for s in _shapes([dict(zip(("tokens", "d_model", "ffn"), map(int, t["shape"].split("x"))))
                                  for t in table])]
    fig = go.Figure()
    for variant in dict.fromkeys(t["variant"] for t in table):
        part = [t for t in table if t["variant"] == variant]
        fig.add_trace(go.Bar(x=[t["shape"] for t in part], y=[t["median"] for t in part],
                             name=READER_NAMES.get(variant, variant),
                             marker_color=COLORS[variant],
                             error_y={"type": "data", "symmetric": False,
                                      "array": [t["high"] - t["median"] for t in part],
                                      "arrayminus": [t["median"] - t["low"] for t in part]}))
    fig.add_hline(y=1.0, line_dash="dot", line_color="black")
    fig.update_layout(title=f"Paired rounds, {PHASE_TITLES[phase]}: median speed-up over dense (bars: lowest "
                            "and highest round)", template="plotly_white", barmode="group", height=420,
                      xaxis={"title": "tokens x d_model x ffn", "type": "category", "categoryorder": "array",
                             "categoryarray": shapes}, yaxis={"title": "speedup over dense"})
    return fig


def ffn_wins_heatmap(data, phase: str = "fwd_bwd", widget: bool = False):
    """Variant x shape, coloured by speedup around 1: blue where 2:4 wins, red where it loses."""
    go = plotly_go()
    rows = check_ffn_rows(data)
    if phase not in _phases(rows):
        raise ValueError(f"phase must be one of the recorded phases {_phases(rows)}, got {phase!r}")
    z, shapes, variants = _heat(rows, phase)
    heat = go.Heatmap(z=z, x=shapes, y=variants, zmid=1.0, colorscale="RdBu", colorbar={"title": "speedup"},
                      text=[[("" if v is None else f"{v:.2f}x") for v in row] for row in z],
                      texttemplate="%{text}", hovertemplate="%{y} at %{x}: %{z:.3f}x<extra></extra>")
    layout = {"title": f"Where 2:4 wins (blue) and loses (red): {PHASE_TITLES[phase]}", "template": "plotly_white",
              "xaxis": {"title": "tokens x d_model x ffn", "type": "category"},
              "yaxis": {"autorange": "reversed"}, "height": 200 + 60 * len(variants), "margin": {"l": 190}}
    return (go.FigureWidget if widget else go.Figure)(data=[heat], layout=layout)


def _heat(rows: list[dict], phase: str) -> tuple[list[list[float | None]], list[str], list[str]]:
    speed = _speedups(rows, phase)
    shapes = [s for s in _shapes(rows) if any(k[1] == s for k in speed)]
    variants = [v for v in _sparse_variants(rows) if any(k[0] == v for k in speed)]
    return [[speed.get((v, s)) for s in shapes] for v in variants], shapes, variants


def wins_and_losses(data) -> list[dict]:
    """Per (variant, phase): shapes measured, shapes where it beats dense, best and worst speedup (with shape)."""
    rows = check_ffn_rows(data)
    out = []
    for phase in _phases(rows):
        speed = _speedups(rows, phase)
        for variant in _sparse_variants(rows):
            mine = {s: v for (var, s), v in speed.items() if var == variant}
            if not mine:
                continue
            best, worst = max(mine, key=mine.get), min(mine, key=mine.get)
            out.append({"variant": variant, "phase": phase, "shapes": len(mine),
                        "wins": sum(v > 1 for v in mine.values()), "best": mine[best], "best_shape": best,
                        "worst": mine[worst], "worst_shape": worst})
    return out


def _wins_html(summary: list[dict], phase: str) -> str:
    lines = [f"<b>{s['variant']}</b>: faster than dense at {s['wins']} of {s['shapes']} shapes; best "
             f"{s['best']:.2f}x ({s['best_shape']}), worst {s['worst']:.2f}x ({s['worst_shape']})"
             for s in summary if s["phase"] == phase]
    return "<br>".join(lines)


def ours_vs_pytorch(data) -> list[dict]:
    """Per (shape, phase) that has PyTorch's semi-structured path and at least one of ours: our fastest
    variant against PyTorch's, as pytorch ms / ours ms (> 1: ours is faster)."""
    rows = check_ffn_rows(data)
    out = []
    for phase in _phases(rows):
        for shape in _shapes(rows):
            here = [r for r in rows if r["phase"] == phase and shape_label(r) == shape]
            torch_rows = [r for r in here if r["variant"] == "pytorch_semi_structured"]
            ours = [r for r in here if r["variant"].startswith("ours_")]
            if torch_rows and ours:
                best = min(ours, key=lambda r: r["ms"])
                out.append({"shape": shape, "phase": phase, "best_ours": best["variant"], "ours_ms": best["ms"],
                            "pytorch_ms": torch_rows[0]["ms"], "ours_over_pytorch": torch_rows[0]["ms"] / best["ms"]})
    return out


def ours_vs_pytorch_figure(data, title: str = "Our fastest 2:4 FFN against PyTorch's semi-structured path"):
    go = plotly_go()
    table = ours_vs_pytorch(data)
    if not table:
        raise ValueError("no shape has both a 'pytorch_semi_structured' row and an 'ours_*' row of the same phase")
    fig = go.Figure()
    for phase in PHASES:
        part = [t for t in table if t["phase"] == phase]
        if part:
            fig.add_trace(go.Bar(x=[t["shape"] for t in part], y=[t["ours_over_pytorch"] for t in part],
                                 name=PHASE_TITLES[phase], text=[t["best_ours"] for t in part],
                                 hovertemplate="%{x}: %{y:.2f}x (%{text})<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="as fast as PyTorch")
    fig.update_layout(title=title, barmode="group", template="plotly_white", xaxis_title="tokens x d_model x ffn",
                      yaxis_title="PyTorch time / our time", xaxis_type="category")
    return fig


def ffn_explorer(data):
    """A phase dropdown over the wins-and-losses heatmap, with a one-line summary per variant."""
    widgets = ipywidgets()
    rows = check_ffn_rows(data)
    phases = _phases(rows)
    phase_box = widgets.Dropdown(options=[(PHASE_TITLES[p], p) for p in phases], value=phases[-1],
                                 description="phase")
    fig = ffn_wins_heatmap(rows, phases[-1], widget=True)
    summary_table = wins_and_losses(rows)
    summary = widgets.HTML(_wins_html(summary_table, phases[-1]))

    def redraw(_change=None) -> None:
        z, shapes, variants = _heat(rows, phase_box.value)
        with fig.batch_update():
            fig.data[0].z, fig.data[0].x, fig.data[0].y = z, shapes, variants
            fig.data[0].text = [[("" if v is None else f"{v:.2f}x") for v in row] for row in z]
            fig.layout.title = f"Where 2:4 wins (blue) and loses (red): {PHASE_TITLES[phase_box.value]}"
        summary.value = _wins_html(summary_table, phase_box.value)

    phase_box.observe(redraw, names="value")
    return widgets.VBox([phase_box, fig, summary])


# --- the other recorded tables --------------------------------------------------------------------
def kernel_vs_pytorch_figure(data: dict):
    """Speedup of each Triton kernel over the PyTorch baseline timed next to it (log scale), from the
    benchmarks kernels rows that have one (``kernel_bench_view.speedup_rows``; the copy-ceiling picture of
    the same result is ``kernel_bench_view.kernel_bench_figure``)."""
    from .kernel_bench_view import speedup_rows

    go = plotly_go()
    rows = [r for r in speedup_rows(data) if r["speedup"] is not None]
    if not rows:
        raise ValueError("no row of data['rows'] has a 'speedup' over a baseline")
    labels = [f"{r['label']} (vs {r['baseline']})" for r in rows]
    fig = go.Figure(go.Bar(y=labels, x=[r["speedup"] for r in rows], orientation="h",
                           text=[f"{r['speedup']:.1f}x" for r in rows], textposition="outside",
                           customdata=[[r["ms"], r["baseline_ms"]] for r in rows],
                           hovertemplate="%{y}: %{x:.2f}x (ours %{customdata[0]:.3f} ms, baseline "
                                         "%{customdata[1]:.3f} ms)<extra></extra>"))
    fig.add_vline(x=1.0, line_dash="dot")
    fig.update_layout(title="Triton kernels against PyTorch: baseline time / kernel time", template="plotly_white",
                      xaxis_type="log", xaxis_title="speedup (log scale)", yaxis={"autorange": "reversed"},
                      height=160 + 28 * len(rows), margin={"l": 420})
    return fig


def mvue_variants_figure(data: dict):
    """MVUE 2:4 kernel variants: fraction of the copy rate; green passed every statistical check,
    red failed one, grey is a diagnostic (not an MVUE: shows what the random numbers cost)."""
    go = plotly_go()
    groups = {"correct": [], "failed a check": [], "diagnostic (not an MVUE)": []}
    for r in data["rows"]:
        if r.get("diagnostic"):
            groups["diagnostic (not an MVUE)"].append(r)
        else:
            groups["correct" if r.get("correct") else "failed a check"].append(r)
    fig = go.Figure()
    for (name, part), color in zip(groups.items(), ("#2ca02c", "#d62728", "#aaaaaa")):
        if part:
            fig.add_trace(go.Bar(y=[f"{r['variant']}, dim {r['dim']} (block {r['block']}, {r['num_warps']} warps)"
                                    for r in part], x=[r["fraction_of_copy"] for r in part], orientation="h",
                                 name=name, marker_color=color))
    shape = "x".join(map(str, data.get("shape", [])))
    fig.update_layout(title=f"MVUE 2:4 kernel variants, {data.get('dtype', '')} {shape}: fraction of the copy rate",
                      template="plotly_white", xaxis_title="fraction of the device-to-device copy rate",
                      xaxis_range=[0, 1.05], yaxis={"autorange": "reversed"},
                      height=160 + 24 * len(data["rows"]), margin={"l": 330})
    return fig


def dyad_speedup_figure(data: dict, shape: str = "square"):
    """DYAD against nn.Linear, forward + backward, by width: one line per variant and block count."""
    go = plotly_go()
    rows = [r for r in data["rows"] if r["shape"] == shape]
    if not rows:
        raise ValueError(f"shape must be one of {sorted({r['shape'] for r in data['rows']})}, got {shape!r}")
    fig = go.Figure()
    for variant in sorted({r["variant"] for r in rows}):
        for n in sorted({r["n_blocks"] for r in rows}):
            pts = sorted((r for r in rows if r["variant"] == variant and r["n_blocks"] == n), key=lambda r: r["width"])
            if pts:
                fig.add_trace(go.Scatter(x=[r["width"] for r in pts], y=[r["speedup"] for r in pts],
                                         mode="lines+markers", name=f"{variant.upper()}, n = {n}"))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="as fast as nn.Linear")
    fig.update_layout(title=f"nn.Linear time / DYAD time, forward + backward ({shape}, "
                            f"{rows[0].get('tokens', '?')} tokens)", template="plotly_white",
                      xaxis_title="width d", xaxis_type="log", yaxis_title="speedup")
    return fig
