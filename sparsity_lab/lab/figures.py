"""Plotly figures of a comparison: loss curves and flip-rate curves, one line per variant.

plotly is optional (the ``lab`` extra). Without it ``write_figures`` raises ImportError with what to
do; ``compare`` then reports the figures as skipped and still writes its tables.
Each HTML file carries plotly.js inline (about 4.6 MB): it opens offline and can be moved or mailed alone.
"""
from __future__ import annotations

from pathlib import Path

from .runlog import read_log

PLOTLY_MISSING = ("plotly is not installed (pip install 'sparsity-lab[lab]'); the tables and logs were written "
                  "and `sparsity-lab compare --figures-from DIR` draws the figures where plotly is installed")


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` values (the first points average what exists)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _variants(out_dir: Path) -> list[str]:
    # log.jsonl.gz: the wheel ships the recorded logs compressed (lab.runlog.read_log reads both)
    found = sorted({p.parent.name for pattern in ("*/log.jsonl", "*/log.jsonl.gz") for p in out_dir.glob(pattern)})
    if not found:
        raise FileNotFoundError(f"no <variant>/log.jsonl under {str(out_dir)!r}: is it a compare output folder?")
    return found


def _plotly():
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError as err:
        raise ImportError(PLOTLY_MISSING) from err
    return go, make_subplots


def read_logs(out_dir: str | Path, variants: list[str] | None = None) -> dict[str, list[dict]]:
    """{variant: rows of OUT/<variant>/log.jsonl} (every variant found when variants is None)."""
    out_dir = Path(out_dir)
    return {v: read_log(out_dir / v / "log.jsonl") for v in (variants or _variants(out_dir))}


def _color(i: int, n: int) -> str:
    return f"hsl({int(360 * i / max(1, n))}, 70%, 45%)"


def loss_figure(logs: dict[str, list[dict]]):
    """Training loss (moving average over 1/50 of the run) and validation loss against tokens."""
    go, make_subplots = _plotly()
    loss = make_subplots(rows=1, cols=2, subplot_titles=("training loss (moving average)", "validation loss"))
    for i, (variant, rows) in enumerate(logs.items()):
        color = _color(i, len(logs))
        tokens = [r["tokens"] for r in rows]
        smooth = moving_average([r["loss"] for r in rows], max(1, len(rows) // 50))
        loss.add_trace(go.Scatter(x=tokens, y=smooth, name=variant, legendgroup=variant,
                                  line={"color": color}), row=1, col=1)
        val = [(r["tokens"], r["val_loss"]) for r in rows if r["val_loss"] is not None]
        loss.add_trace(go.Scatter(x=[t for t, _ in val], y=[v for _, v in val], name=variant, legendgroup=variant,
                                  mode="lines+markers", showlegend=False, line={"color": color}), row=1, col=2)
    loss.update_xaxes(title_text="tokens")
    loss.update_yaxes(title_text="cross-entropy (nats per byte)")
    loss.update_layout(title="Loss curves: same seed, data and token budget", template="plotly_white")
    return loss


def flip_rate_figure(logs: dict[str, list[dict]]):
    """The overall flip rate per step (log scale); variants without masks have no line."""
    go, _ = _plotly()
    flips = go.Figure()
    for i, (variant, rows) in enumerate(logs.items()):
        fr = [(r["step"], r["flip_rate"]) for r in rows if r["flip_rate"] is not None and r["flip_rate"] > 0]
        if fr:
            flips.add_trace(go.Scatter(x=[s for s, _ in fr], y=[f for _, f in fr], name=variant,
                                       mode="lines", line={"color": _color(i, len(logs)), "width": 1}))
    flips.update_layout(title="Overall flip rate per step (fraction of mask entries that changed)",
                        xaxis_title="optimizer step", yaxis_title="flip rate",
                        yaxis={"type": "log", "dtick": 1},  # a tick per power of ten, no 2..9 between
                        template="plotly_white")
    return flips


def write_figures(out_dir: str | Path, variants: list[str] | None = None) -> list[Path]:
    """Write OUT/loss_curves.html and OUT/flip_rates.html from OUT/<variant>/log.jsonl."""
    _plotly()  # the clear ImportError before any log is read
    out_dir = Path(out_dir)
    logs = read_logs(out_dir, variants)
    paths = [out_dir / "loss_curves.html", out_dir / "flip_rates.html"]
    loss_figure(logs).write_html(paths[0], include_plotlyjs=True)
    flip_rate_figure(logs).write_html(paths[1], include_plotlyjs=True)
    return paths
