"""Dense fine-tuning made visible: loss and flip-rate curves of several runs with the switch marked.

Works on any logged rows (``Trainer.history``, or ``read_log`` of a ``sparsity-lab compare`` folder,
live or recorded). After the switch a masked-decay run computes no masks, so its flip-rate curve
stops there; its loss is that of the dense W.
"""
from __future__ import annotations

from ...lab.figures import moving_average
from ._axes import clean_log_ticks
from ._optional import plotly_go

PALETTE = {"dense": "#444444", "ste": "#d62728", "masked_decay": "#1f77b4", "masked_decay_noft": "#2ca02c",
           "srste": "#9467bd", "sste": "#ff7f0e"}
# a legend names each run for a reader; the logs are keyed by the CLI's variant names
READER_NAMES = {"dense": "dense", "ste": "STE", "masked_decay": "masked decay, dense fine-tune",
                "masked_decay_noft": "masked decay, no fine-tune", "masked_decay_weights": "masked decay on weights",
                "srste": "SR-STE", "sste": "S-STE"}


def finetune_figure(logs: dict[str, list[dict]], switch_step: int, smooth: int | None = None, title: str = ""):
    """Two panels against the optimizer step: training loss (trailing mean over ``smooth`` steps, default
    1/25 of the run) with validation points, and the overall flip rate (log scale). A dashed line at
    ``switch_step`` marks the switch: the rows logged after it trained dense W.

    logs: variant name -> logged rows (dicts with step, loss, val_loss, flip_rate); the legend shows each
    variant's READER_NAMES entry.
    """
    go = plotly_go()
    from plotly.subplots import make_subplots

    if not logs:
        raise ValueError("logs is empty: give at least one run's rows")
    if isinstance(switch_step, bool) or not isinstance(switch_step, int) or switch_step < 0:
        raise ValueError(f"switch_step must be an int >= 0, got {switch_step!r}")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("loss (line: training, trailing mean; dots: validation)",
                                                        "flip rate per step"))
    extra = ("#8c564b", "#e377c2", "#17becf", "#bcbd22")
    for i, (name, rows) in enumerate(logs.items()):
        if not rows:
            raise ValueError(f"run {name!r} has no logged rows")
        color = PALETTE.get(name, extra[i % len(extra)])
        label = READER_NAMES.get(name, name)
        steps = [r["step"] for r in rows]
        window = smooth or max(1, len(rows) // 25)
        fig.add_trace(go.Scatter(x=steps, y=moving_average([r["loss"] for r in rows], window), name=label,
                                 legendgroup=name, mode="lines", line={"color": color, "width": 1.5}), row=1, col=1)
        val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
        fig.add_trace(go.Scatter(x=[s for s, _ in val], y=[v for _, v in val], name=label, legendgroup=name,
                                 mode="markers", marker={"color": color, "size": 7}, showlegend=False), row=1, col=1)
        flips = [(r["step"], r["flip_rate"]) for r in rows if r.get("flip_rate") is not None and r["flip_rate"] > 0]
        fig.add_trace(go.Scatter(x=[s for s, _ in flips], y=[f for _, f in flips], name=label, legendgroup=name,
                                 mode="lines", line={"color": color, "width": 1}, showlegend=False), row=1, col=2)
    for col in (1, 2):
        # rows logged after switch_step trained dense W (a validation at switch_step already scores dense W)
        fig.add_vline(x=switch_step, line_dash="dash", line_color="black", row=1, col=col)
    # inside the loss panel, left of the line and under its top edge: above it sits the panel's title
    fig.add_annotation(x=switch_step, y=1.0, yref="y domain", xref="x",
                       text=f"dense fine-tune from step {switch_step} ", showarrow=False, xanchor="right",
                       yanchor="top", bgcolor="rgba(255,255,255,0.8)")
    fig.update_yaxes(title_text="cross-entropy (nats per byte)", row=1, col=1)
    fig.update_yaxes(title_text="flip rate (log)", type="log", row=1, col=2)
    fig.update_xaxes(title_text="optimizer step")
    fig.update_layout(template="plotly_white", height=430, title=title,
                      legend={"orientation": "h", "y": -0.2})
    return clean_log_ticks(fig)
