"""S-STE (Hu, Zhu, Chen 2024) made visible: the soft threshold on one group of four, its scale beta,
and a short run that shows why beta is frozen.

One group a = (a0, a1, a2, a3), t = the 2nd smallest |a_i| (the largest pruned magnitude):
    hard 2:4 prune   m_i a_i                              (m keeps the two largest |a_i|)
    soft threshold   S(a)_i = m_i sign(a_i) max(|a_i| - t, 0)
When two magnitudes cross, the hard output of both entries jumps (one appears, one vanishes); the
soft output of both is 0 at the crossing, so S is continuous in a. The library functions are
``sparsity_lab.methods.soft_threshold`` and ``sste_beta``; this module only arranges them.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from ...layers import SparseLinear
from ...masks.nm import nm_mask
from ...methods.config import SSTE
from ...methods.soft_threshold import soft_threshold, sste_beta
from ...sparsify import sparsify
from ...training_hooks import attach_optimizer, sparse_layers
from ._axes import clean_log_ticks
from ._optional import ipywidgets, plotly_go

ENTRY_NAMES = ("a0", "a1", "a2", "a3")
INPUT_COLOR, HARD_COLOR, SOFT_COLOR = "#c7c7c7", "#d62728", "#1f77b4"
ENTRY_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")


def _group(values: Sequence[float]) -> torch.Tensor:
    """Four finite numbers -> a (1, 4) float64 tensor (one row, one group)."""
    if isinstance(values, torch.Tensor):
        values = values.reshape(-1).tolist()
    values = list(values)
    if len(values) != 4 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        raise ValueError(f"values must be four finite numbers (one group of 4), got {values!r}")
    return torch.tensor([values], dtype=torch.float64)


def group_outputs(values: Sequence[float]) -> dict:
    """Hard 2:4 prune and soft threshold of one group of four.

    Returns {"input", "hard", "soft": four floats each, "kept": four bools (the 2:4 mask, ties to
    the lowest index), "threshold": t = the largest pruned |a_i|}.
    """
    a = _group(values)
    mask = nm_mask(a, 2, 4)
    # + 0.0 turns the -0.0 of pruned negative entries into 0.0 (same value, cleaner print)
    return {"input": a[0].tolist(), "hard": (a * mask + 0.0)[0].tolist(),
            "soft": (soft_threshold(a, mask) + 0.0)[0].tolist(),
            "kept": mask[0].tolist(), "threshold": float(a.abs().masked_fill(mask, 0).amax())}


def sweep_outputs(values: Sequence[float], index: int, grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Entry ``index`` of the group set to each value of ``grid`` (the others fixed).

    Returns (hard, soft), each (len(grid), 4) float64: the outputs of all four entries.
    """
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 4:
        raise ValueError(f"index must be 0, 1, 2 or 3 (the entry to sweep), got {index!r}")
    grid = torch.as_tensor(grid, dtype=torch.float64).reshape(-1)
    groups = _group(values).repeat(grid.numel(), 1)
    groups[:, index] = grid
    mask = nm_mask(groups, 2, 4)  # one row per grid point: each row is its own group
    return groups * mask + 0.0, soft_threshold(groups, mask) + 0.0


def soft_threshold_figure(values: Sequence[float], widget: bool = False):
    """Two bar charts side by side: hard 2:4 prune (left) and soft threshold (right) of one group,
    each next to the input (grey); dotted lines at +-t."""
    go = plotly_go()
    from plotly.subplots import make_subplots

    out = group_outputs(values)
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=("hard 2:4 prune: m * a", "soft threshold: S(a)"))
    for col, key, color in ((1, "hard", HARD_COLOR), (2, "soft", SOFT_COLOR)):
        fig.add_trace(go.Bar(x=list(ENTRY_NAMES), y=out["input"], name="input a", marker_color=INPUT_COLOR,
                             showlegend=col == 1, legendgroup="input"), row=1, col=col)
        fig.add_trace(go.Bar(x=list(ENTRY_NAMES), y=out[key], name="m * a" if key == "hard" else "S(a)",
                             marker_color=color), row=1, col=col)
    fig.update_layout(barmode="group", title=_bars_title(out), height=380,
                      shapes=_threshold_lines(out["threshold"]))
    return go.FigureWidget(fig) if widget else fig


def _bars_title(out: dict) -> str:
    kept = ", ".join(n for n, k in zip(ENTRY_NAMES, out["kept"]) if k)
    return f"kept: {kept}; threshold t = {out['threshold']:.3f} (the largest pruned |a|)"


def _threshold_lines(t: float) -> list[dict]:
    """Dotted horizontal lines at +t and -t across both panels (paper x coordinates)."""
    return [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": y, "y1": y,
             "line": {"dash": "dot", "color": "#555", "width": 1}} for y in (t, -t)]


def sweep_figure(values: Sequence[float], index: int, lo: float = -2.0, hi: float = 2.0, points: int = 401,
                 widget: bool = False):
    """Output of each entry as entry ``index`` sweeps [lo, hi]: hard 2:4 (left) jumps where two
    magnitudes cross, the soft threshold (right) does not. A dotted vertical line marks its current value."""
    go = plotly_go()
    from plotly.subplots import make_subplots

    grid = torch.linspace(lo, hi, points, dtype=torch.float64)
    hard, soft = sweep_outputs(values, index, grid)
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=("hard 2:4 prune: m * a", "soft threshold: S(a)"))
    for col, out in ((1, hard), (2, soft)):
        for j in range(4):
            fig.add_trace(go.Scatter(x=grid.tolist(), y=out[:, j].tolist(), mode="lines", name=f"output {ENTRY_NAMES[j]}",
                                     line={"color": ENTRY_COLORS[j]}, legendgroup=ENTRY_NAMES[j], showlegend=col == 1),
                          row=1, col=col)
    fig.update_xaxes(title_text=f"value of {ENTRY_NAMES[index]}")
    fig.update_layout(title=_sweep_title(values, index), height=380, shapes=_current_value_lines(values, index))
    return go.FigureWidget(fig) if widget else fig


def _sweep_title(values: Sequence[float], index: int) -> str:
    others = ", ".join(f"{ENTRY_NAMES[j]} = {float(v):.2f}" for j, v in enumerate(values) if j != index)
    return f"sweeping {ENTRY_NAMES[index]} ({others})"


def _current_value_lines(values: Sequence[float], index: int) -> list[dict]:
    x = float(list(values)[index])
    return [{"type": "line", "xref": xref, "x0": x, "x1": x, "yref": "paper", "y0": 0, "y1": 1,
             "line": {"dash": "dot", "color": "#555", "width": 1}} for xref in ("x", "x2")]


def soft_threshold_explorer(values: Sequence[float] = (0.9, -0.4, 0.3, -1.2), sweep_index: int = 2):
    """Four sliders (the group), the hard-vs-soft bars, and the sweep of one chosen entry."""
    widgets = ipywidgets()
    start = _group(values)[0].tolist()
    sliders = [widgets.FloatSlider(value=v, min=-2.0, max=2.0, step=0.01, description=name, continuous_update=True)
               for name, v in zip(ENTRY_NAMES, start)]
    sweep_box = widgets.Dropdown(options=[(f"sweep {n}", i) for i, n in enumerate(ENTRY_NAMES)], value=sweep_index,
                                 description="curves")
    bars = soft_threshold_figure(start, widget=True)
    curves = sweep_figure(start, sweep_index, widget=True)
    info = widgets.HTML()

    def redraw(_change=None) -> None:
        vals = [s.value for s in sliders]
        out = group_outputs(vals)
        new_curves = sweep_figure(vals, sweep_box.value)
        with bars.batch_update():
            for trace, key in zip(bars.data, ("input", "hard", "input", "soft")):
                trace.y = out[key]
            bars.layout.title.text = _bars_title(out)
            bars.layout.shapes = _threshold_lines(out["threshold"])
        with curves.batch_update():
            for trace, new in zip(curves.data, new_curves.data):
                trace.y = new.y
            curves.layout.title.text = new_curves.layout.title.text
            curves.layout.shapes = new_curves.layout.shapes
            curves.layout.xaxis.title.text = curves.layout.xaxis2.title.text = f"value of {ENTRY_NAMES[sweep_box.value]}"
        soft = ", ".join(f"{v:+.3f}" for v in out["soft"])
        info.value = f"t = {out['threshold']:.3f}; S(a) = ({soft})"

    for box in (*sliders, sweep_box):
        box.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox(sliders[:2]), widgets.HBox(sliders[2:]), bars, sweep_box, curves, info])


# --- beta -------------------------------------------------------------------------------------------------
def beta_figure(weight: torch.Tensor, max_points: int = 2000, seed: int = 0):
    """Kept |w| (x) against |S(w)| and beta |S(w)| (y) for a 2-D weight, with the line y = x.

    S shrinks every kept weight by its group's t; beta = <W, S> / <S, S> scales S(W) back up so that
    beta S(W) is the least-squares fit to W along S(W). At most ``max_points`` kept entries, chosen
    at random (seeded), are drawn.
    """
    go = plotly_go()
    mask = nm_mask(weight, 2, 4)
    soft = soft_threshold(weight, mask)
    beta = float(sste_beta(weight, soft))
    kept_w, kept_s = weight[mask].abs().double(), soft[mask].abs().double()
    if kept_w.numel() > max_points:
        pick = torch.randperm(kept_w.numel(), generator=torch.Generator().manual_seed(seed))[:max_points]
        kept_w, kept_s = kept_w[pick], kept_s[pick]
    top = float(kept_w.max())
    fig = go.Figure([
        go.Scatter(x=kept_w.tolist(), y=kept_s.tolist(), mode="markers", name="|S(w)|",
                   marker={"size": 3, "color": INPUT_COLOR}),
        go.Scatter(x=kept_w.tolist(), y=(beta * kept_s).tolist(), mode="markers", name=f"beta |S(w)|, beta = {beta:.3f}",
                   marker={"size": 3, "color": SOFT_COLOR}),
        go.Scatter(x=[0, top], y=[0, top], mode="lines", name="y = |w|", line={"dash": "dot", "color": "#555"}),
    ])
    fig.update_layout(title="kept weights: the soft threshold shrinks them, beta scales them back",
                      xaxis_title="|w| (kept entries)", yaxis_title="magnitude used by the layer", height=420)
    return clean_log_ticks(fig)


def beta_trace(recompute: bool, steps: int = 200, width: int = 64, lr: float = 1e-2, batch: int = 64,
               seed: int = 0) -> dict:
    """Train one S-STE layer (width -> width, no bias) to imitate a dense random linear teacher
    (mean squared error, AdamW, weight decay 0); beta frozen (the library's S-STE) or recomputed
    from the current weight after every optimizer step (what S-STE does not do).

    Returns {"beta", "loss", "flip_rate", "shrink": one float per step}, where shrink = ||S(W)|| / ||m W||
    (how much of the kept weights survives the threshold) and flip_rate is NaN at step 0.
    Deterministic for a given seed (CPU).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if isinstance(width, bool) or not isinstance(width, int) or width < 4 or width % 4:
        raise ValueError(f"width must be a positive multiple of 4, got {width!r}")
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.randn(width, width, generator=gen, dtype=torch.float32) / math.sqrt(width)
    with torch.random.fork_rng(devices=[]):  # seed the student's initialisation, leave the global RNG as it was
        torch.manual_seed(seed)
        model = nn.Sequential()
        model.add_module("fc", nn.Linear(width, width, bias=False))
        sparsify(model, SSTE(), select="all")
    layer: SparseLinear = sparse_layers(model)[0][1]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    attach_optimizer(model, opt)
    trace = {"beta": [], "loss": [], "flip_rate": [], "shrink": []}
    for _ in range(steps):
        x = torch.randn(batch, width, generator=gen)
        loss = (model(x) - x @ teacher.T).pow(2).mean()
        trace["flip_rate"].append(layer.last_flip_rate)  # the mask refresh of this step's forward
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            w = layer.weight
            if recompute:  # refresh the mask now (the next forward then keeps it) and refit beta to it
                layer.refresh_mask()
                layer.beta.copy_(sste_beta(w, soft_threshold(w, layer.mask)))
            mask = nm_mask(w, 2, 4)
            kept = float((w * mask).norm())
            trace["shrink"].append(float(soft_threshold(w, mask).norm()) / kept if kept > 0 else math.nan)
        trace["beta"].append(float(layer.beta))
        trace["loss"].append(loss.item())
    return trace


def beta_trace_figure(frozen: dict, recomputed: dict):
    """beta, loss, flip rate and ||m W|| / ||S(W)|| against the step, for the two runs of :func:`beta_trace`."""
    go = plotly_go()
    from plotly.subplots import make_subplots

    panels = (("beta", "beta"), ("loss", "training loss"), ("flip_rate", "flip rate"),
              ("shrink", "||m W|| / ||S(W)||  (1 / shrink)"))
    fig = make_subplots(rows=2, cols=2, subplot_titles=[title for _, title in panels], vertical_spacing=0.14)
    runs = ((frozen, "beta frozen (S-STE)", SOFT_COLOR), (recomputed, "beta recomputed every step", HARD_COLOR))
    for run, name, color in runs:
        steps = list(range(len(run["beta"])))
        for i, (key, _) in enumerate(panels):
            ys = [None if math.isnan(v) or (key == "shrink" and v == 0) else (1.0 / v if key == "shrink" else v)
                  for v in run[key]]
            fig.add_trace(go.Scatter(x=steps, y=ys, mode="lines", name=name, line={"color": color},
                                     legendgroup=name, showlegend=i == 0), row=i // 2 + 1, col=i % 2 + 1)
    for row, col in ((1, 1), (1, 2), (2, 2)):
        fig.update_yaxes(type="log", row=row, col=col)
    fig.update_xaxes(title_text="optimizer step", row=2)
    fig.update_layout(height=620, title="one S-STE layer imitating a dense linear teacher")
    return clean_log_ticks(fig)
