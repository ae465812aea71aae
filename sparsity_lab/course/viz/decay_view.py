"""The decay factor made visible: flip-rate and loss curves of a cached grid of runs, and a slider.

``decay_explorer(grid)`` shows one run of a ``sparsity_lab.lab.decay_grid.DecayGrid`` at a time next
to the dense reference (and STE when lambda_W = 0 is in the grid); moving the slider swaps the
selected run's curves in a FigureWidget (nothing is retrained) and rewrites the summary line.
``decay_search_figure(result)`` draws a recorded ``sparsity-lab decay-search`` result.
"""
from __future__ import annotations

import math

from ...lab.decay_grid import DecayGrid, RunCurve, method_name
from ._axes import clean_log_ticks
from ._optional import ipywidgets, plotly_go

FLIP_TITLE, LOSS_TITLE = "flip rate per step", "training loss per step"
COLORS = {"dense": "#444444", "ste": "#d62728", "selected": "#1f77b4"}


def _ys(values) -> list[float | None]:
    """NaN -> None, so that the JSON sent to the browser has nulls (gaps in the line)."""
    return [None if not math.isfinite(v) else v for v in values]


def _subplots(widget: bool):
    go = plotly_go()
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=(FLIP_TITLE, LOSS_TITLE))
    fig.update_yaxes(title_text="flip rate (log)", type="log", row=1, col=1)
    fig.update_yaxes(title_text="cross-entropy (nats per byte)", row=1, col=2)
    fig.update_xaxes(title_text="optimizer step")
    fig.update_layout(template="plotly_white", height=420, legend={"orientation": "h", "y": -0.2})
    return go.FigureWidget(fig) if widget else fig


def _add_curve(fig, curve: RunCurve, color: str, dash: str | None = None, name: str | None = None) -> None:
    go = plotly_go()
    line = {"color": color, "width": 1.5, **({"dash": dash} if dash else {})}
    name = name or curve.label
    fig.add_trace(go.Scatter(x=list(curve.steps), y=_ys(curve.flip_rate), name=name, legendgroup=name,
                             mode="lines", line=line), row=1, col=1)
    fig.add_trace(go.Scatter(x=list(curve.steps), y=_ys(curve.loss), name=name, legendgroup=name,
                             mode="lines", line=line, showlegend=False), row=1, col=2)


def curves_figure(curves: list[RunCurve], title: str = ""):
    """Static figure: flip rate (left, log scale) and training loss (right) against the step, one colour
    per run (e.g. dense reference, STE, SR-STE)."""
    fig = _subplots(widget=False)
    palette = ("#444444", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e")
    for i, curve in enumerate(curves):
        _add_curve(fig, curve, palette[i % len(palette)])
    fig.update_layout(title=title)
    return clean_log_ticks(fig)


def _fmt_decay(decay: float) -> str:
    return "0 (STE)" if decay == 0 else f"{decay:.0e}"


def summary_text(grid: DecayGrid, decay: float) -> str:
    """One line: the selected run's final val loss and late flip rate, against the dense reference."""
    run = grid.runs[decay]
    text = (f"{method_name(grid.method)}, lambda_W = {_fmt_decay(decay)}: final val loss {run.final_val_loss:.4f}, "
            f"late flip rate {run.late_flip_rate:.2e} (mean of the last 10 % of steps)")
    if grid.dense is not None:
        d = grid.dense
        gap = f"{100 * (run.final_val_loss / d.final_val_loss - 1):+.2f} %" if d.final_val_loss > 0 else "n/a"
        ratio = f"{run.late_flip_rate / d.late_flip_rate:.2f}x" if d.late_flip_rate > 0 else "n/a"
        text += (f"; dense reference: val loss {d.final_val_loss:.4f} ({gap}), "
                 f"late flip rate {d.late_flip_rate:.2e} ({ratio})")
    if run.status != "ok":
        text += f" [{run.status}]"
    return text


def decay_explorer(grid: DecayGrid, decay: float | None = None):
    """A decay slider over the grid's cached runs, the FigureWidget and the summary line, kept in sync.

    Returns ``VBox([slider, figure, summary])``. Traces: dense reference and STE (fixed, when present),
    then the selected run (flip rate in the left panel, loss in the right); the slider swaps the
    selected run's x/y and the title.
    """
    widgets = ipywidgets()
    if not isinstance(grid, DecayGrid):
        raise TypeError(f"grid must be a DecayGrid (from run_decay_grid), got {type(grid).__name__}")
    decay = grid.decays[len(grid.decays) // 2] if decay is None else float(decay)
    if decay not in grid.runs:
        raise ValueError(f"decay {decay!r} is not in the grid {list(grid.decays)}")
    fig = _subplots(widget=True)
    if grid.dense is not None:
        _add_curve(fig, grid.dense, COLORS["dense"])
    if 0.0 in grid.runs:
        _add_curve(fig, grid.runs[0.0], COLORS["ste"], dash="dot")
    first = len(fig.data)  # the selected run's flip trace; its loss trace follows
    _add_curve(fig, grid.runs[decay], COLORS["selected"], name="selected run")
    slider = widgets.SelectionSlider(options=[(_fmt_decay(d), d) for d in grid.decays], value=decay,
                                     description=f"{method_name(grid.method)} decay", continuous_update=True,
                                     style={"description_width": "initial"},
                                     layout={"width": "520px"})
    summary = widgets.HTML(summary_text(grid, decay))

    def show(change=None) -> None:
        run = grid.runs[slider.value]
        with fig.batch_update():
            for trace, values in ((fig.data[first], run.flip_rate), (fig.data[first + 1], run.loss)):
                trace.x, trace.y = list(run.steps), _ys(values)
            fig.layout.title = f"{method_name(grid.method)}, lambda_W = {_fmt_decay(slider.value)} (blue) against the references"
        clean_log_ticks(fig)  # the selected run moves the flip-rate axis's range (read after the batch)
        summary.value = summary_text(grid, slider.value)

    show()
    slider.observe(show, names="value")
    return widgets.VBox([slider, fig, summary])


def decay_search_figure(result: dict):
    """A recorded decay search (``sparsity-lab decay-search --out``): for each lambda_W of the grid,
    the warm-up trial's validation-loss gap to dense (%) and its flip rate relative to dense; the
    chosen lambda_W is marked. STE (lambda_W = 0) is drawn as a horizontal reference line."""
    go = plotly_go()
    from plotly.subplots import make_subplots

    trials = sorted(result["trials"], key=lambda t: t["decay"])
    if not trials:
        raise ValueError("the decay-search result holds no trials")
    lam = [t["decay"] for t in trials]
    chosen = result["chosen"]["decay"]
    dense, ste = result["dense"], result["ste"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("val loss gap to dense (%)", "flip rate / dense"))
    gap = [100 * t["gap_vs_dense"] for t in trials]
    ratio = [t["flip_vs_dense"] for t in trials]
    marker = {"color": ["#d62728" if x == chosen else "#1f77b4" for x in lam], "size": 9}
    fig.add_trace(go.Scatter(x=lam, y=gap, mode="lines+markers", marker=marker, name="masked decay trials"),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=lam, y=ratio, mode="lines+markers", marker=marker, showlegend=False), row=1, col=2)
    fig.add_hline(y=100 * (ste["val_loss"] / dense["val_loss"] - 1), line_dash="dot", row=1, col=1,
                  annotation_text="STE")
    fig.add_hline(y=ste["flip_rate"] / dense["flip_rate"], line_dash="dot", row=1, col=2, annotation_text="STE")
    fig.update_xaxes(type="log", title_text="lambda_W")
    fig.update_layout(template="plotly_white", height=400,
                      title=f"decay search: {result['trial_steps']} warm-up steps per trial; "
                            f"chosen lambda_W = {chosen:.0e} (red)")
    return clean_log_ticks(fig)
