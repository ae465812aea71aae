"""Squared-ReLU activations and their 2:4 selection: a histogram and a widget over a real layer.

``activation_histogram`` draws the distribution of relu(H)^2 (log-count axis: the bar at zero dwarfs
the rest). ``act24_widget`` shows a window of one layer's activation A (tokens x hidden units) as a
heatmap, with the entries the 2:4 selection drops marked; a layer menu and two sliders move the
window, and a summary reads the layer's figures: zeros, groups with at most 2 non-zeros, and the
fraction of A's mass (sum of its values) that 2:4 keeps.
"""
from __future__ import annotations

import torch

from ...references.act24 import natural_24_stats, top2of4_mask
from ._optional import ipywidgets, plotly_go


def kept_mass(a: torch.Tensor) -> float:
    """sum(A24) / sum(A): how much of a non-negative activation 2:4 keeps (1.0 for an all-zero A)."""
    total = float(a.double().sum())
    return 1.0 if total == 0 else float((a * top2of4_mask(a)).double().sum()) / total


def layer_summary(a: torch.Tensor) -> dict[str, float]:
    """zero_fraction, at_most_2_fraction (``natural_24_stats``) and kept_mass of an activation A."""
    stats = natural_24_stats(a)
    return {"zero_fraction": stats["zero_fraction"], "at_most_2_fraction": stats["groups_at_most_2_fraction"],
            "kept_mass": kept_mass(a)}


def activation_histogram(activations: dict[str, torch.Tensor], bins: int = 60, widget: bool = False):
    """Histogram of the values of relu(H)^2 per layer (overlaid), log-count axis."""
    go = plotly_go()
    fig = (go.FigureWidget if widget else go.Figure)()
    for name, a in activations.items():
        values = a.detach().float().reshape(-1).cpu()
        fig.add_trace(go.Histogram(x=values.numpy(), nbinsx=bins, name=name, opacity=0.6))
    fig.update_layout(barmode="overlay", height=320, margin=dict(l=50, r=20, t=40, b=40),
                      title="relu(H)^2 values (count on a log axis: the bar at 0 holds the zeros)",
                      xaxis_title="activation value", yaxis_title="count",
                      yaxis={"type": "log", "dtick": 1})  # a tick per power of ten, no 2 and 5 between
    return fig


def _window(a: torch.Tensor, token0: int, unit0: int, tokens: int, units: int) -> tuple[torch.Tensor, torch.Tensor]:
    win = a[token0:token0 + tokens, unit0:unit0 + units].float()
    return win, win * top2of4_mask(win)  # the 2:4 selection of the window's values


def _heatmap_traces(win: torch.Tensor, a24: torch.Tensor):
    go = plotly_go()
    dropped = (win != 0) & (a24 == 0)
    rows, cols = torch.nonzero(dropped, as_tuple=True)
    return [go.Heatmap(z=win.cpu().numpy(), colorscale="Viridis", colorbar=dict(title="A")),
            go.Scatter(x=cols.cpu().numpy(), y=rows.cpu().numpy(), mode="markers", name="dropped by 2:4",
                       marker=dict(symbol="x", color="red", size=7))]


def act24_widget(activations: dict[str, torch.Tensor], tokens: int = 24, units: int = 48):
    """Layer menu, token and hidden-unit sliders over (tokens, hidden) activations A = relu(H)^2."""
    if not activations:
        raise ValueError("activations is empty: pass {layer name: A (tokens, hidden)}")
    for name, a in activations.items():
        if a.dim() != 2 or a.shape[1] % 4:
            raise ValueError(f"{name}: expected A (tokens, hidden) with hidden % 4 == 0, got {tuple(a.shape)}")
    widgets, go = ipywidgets(), plotly_go()
    names = list(activations)
    first = activations[names[0]]
    tokens, units = min(tokens, first.shape[0]), min(units - units % 4, first.shape[1])
    layer_box = widgets.Dropdown(options=names, value=names[0], description="layer")
    token_box = widgets.IntSlider(value=0, min=0, max=max(0, first.shape[0] - tokens), step=1, description="token")
    unit_box = widgets.IntSlider(value=0, min=0, max=max(0, first.shape[1] - units), step=4, description="unit")
    fig = go.FigureWidget(_heatmap_traces(*_window(first, 0, 0, tokens, units)))
    fig.update_layout(height=360, margin=dict(l=50, r=20, t=40, b=40), xaxis_title="hidden unit (groups of 4)",
                      yaxis_title="token", title="A = relu(H)^2; red x: non-zero entries that 2:4 drops")
    summary = widgets.HTML()

    def describe(name: str) -> str:
        s = layer_summary(activations[name])
        return (f"<b>{name}</b>: {s['zero_fraction']:.1%} of the entries are 0; {s['at_most_2_fraction']:.1%} of the "
                f"groups of 4 have at most 2 non-zeros (2:4 drops nothing there); 2:4 keeps "
                f"{s['kept_mass']:.1%} of the activation's mass")

    def redraw(_change=None) -> None:
        a = activations[layer_box.value]
        token_box.max, unit_box.max = max(0, a.shape[0] - tokens), max(0, a.shape[1] - units)
        new = _heatmap_traces(*_window(a, token_box.value, unit_box.value, tokens, units))
        with fig.batch_update():
            fig.data[0].z = new[0].z
            fig.data[1].x, fig.data[1].y = new[1].x, new[1].y
        summary.value = describe(layer_box.value)

    for box in (layer_box, token_box, unit_box):
        box.observe(redraw, names="value")
    summary.value = describe(layer_box.value)
    return widgets.VBox([widgets.HBox([layer_box, token_box, unit_box]), fig, summary])
