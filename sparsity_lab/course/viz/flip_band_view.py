"""Flip-rate bands over seeds (``sparsity_lab.lab.flip_bands``): the mean per step with a band of one
standard deviation either side, one colour per method, and the per-seed late flip rates that the
verdicts compare."""
from __future__ import annotations

import math

from ...lab.figures import moving_average
from ._axes import clean_log_ticks
from ._optional import plotly_go

COLORS = {"dense": "#444444", "ste": "#d62728", "srste": "#9467bd", "masked_decay": "#1f77b4",
          "masked_decay_weights": "#ff7f0e"}
EXTRA = ("#2ca02c", "#8c564b", "#e377c2", "#17becf")
LABELS = {"dense": "dense reference", "ste": "STE", "srste": "SR-STE (term in the backward)",
          "masked_decay": "masked decay on gradients", "masked_decay_weights": "masked decay on weights"}


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean over the finite values (a NaN step stays NaN)."""
    finite = [v if math.isfinite(v) else 0.0 for v in values]
    out = moving_average(finite, window)
    return [o if math.isfinite(v) else math.nan for o, v in zip(out, values)]


def flip_band_figure(bands, labels: list[str] | None = None, smooth: int | None = None, title: str = ""):
    """Mean flip rate per step over the seeds (line) and mean -/+ one standard deviation (band), log
    scale. bands: a ``FlipBands``; labels: which methods (default all); smooth: trailing-mean window
    in steps applied to mean and band alike (default 1/30 of the run)."""
    go = plotly_go()
    labels = list(bands.rates) if labels is None else list(labels)
    unknown = [k for k in labels if k not in bands.rates]
    if unknown or not labels:
        raise ValueError(f"labels must name methods of this run ({list(bands.rates)}), got {labels}")
    window = smooth or max(1, bands.steps // 30)
    fig = go.Figure()
    for i, label in enumerate(labels):
        color = COLORS.get(label, EXTRA[i % len(EXTRA)])
        b = bands.band(label)
        keep = [j for j, m in enumerate(b["mean"]) if math.isfinite(m)]
        steps = [b["step"][j] for j in keep]
        mean, lo, hi = ([_smooth(b[k], window)[j] for j in keep] for k in ("mean", "lo", "hi"))
        lo = [max(v, 1e-6) for v in lo]  # a log axis cannot show a band edge at or below 0
        name = LABELS.get(label, label)
        fig.add_trace(go.Scatter(x=steps + steps[::-1], y=hi + lo[::-1], fill="toself", mode="lines",
                                 line={"width": 0}, fillcolor=_rgba(color, 0.25), hoverinfo="skip",
                                 legendgroup=label, showlegend=False, name=f"{name} band"))
        fig.add_trace(go.Scatter(x=steps, y=mean, mode="lines", line={"color": color, "width": 2},
                                 legendgroup=label, name=name))
    fig.update_layout(template="plotly_white", autosize=True, height=420, title=title or (
        f"flip rate per step: mean over {len(bands.seeds)} seeds, band = one standard deviation"),
        xaxis_title="optimizer step", yaxis_title="flip rate (log)", yaxis_type="log",
        legend={"orientation": "h", "y": -0.2}, margin={"l": 60, "r": 20, "t": 60, "b": 40})
    return clean_log_ticks(fig)


def late_flip_figure(bands, labels: list[str] | None = None, title: str = ""):
    """One dot per seed: each method's mean flip rate over the last 20 % of the steps (what the
    verdicts compare), log scale. Non-overlapping clouds are what 'every seed' in a rule means."""
    go = plotly_go()
    labels = list(bands.rates) if labels is None else list(labels)
    unknown = [k for k in labels if k not in bands.rates]
    if unknown or not labels:
        raise ValueError(f"labels must name methods of this run ({list(bands.rates)}), got {labels}")
    fig = go.Figure()
    for i, label in enumerate(labels):
        color = COLORS.get(label, EXTRA[i % len(EXTRA)])
        late = bands.late(label)
        fig.add_trace(go.Scatter(x=[LABELS.get(label, label)] * len(late), y=late, mode="markers",
                                 marker={"color": color, "size": 9, "opacity": 0.8}, name=LABELS.get(label, label),
                                 text=[f"seed {s}" for s in bands.seeds], showlegend=False))
    fig.update_layout(template="plotly_white", autosize=True, height=380, yaxis_type="log",
                      yaxis_title="late flip rate (log)", title=title or "late flip rate, one dot per seed",
                      margin={"l": 60, "r": 20, "t": 60, "b": 40})
    return clean_log_ticks(fig)
