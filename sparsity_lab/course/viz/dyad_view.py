"""DYAD's structure as a picture: which weights of the dense (out, in) matrix each term fills.

    0 = zero, 1 = block-diagonal term A, 2 = permuted term B, 3 = both (the terms overlap there)
"""
from __future__ import annotations

import torch

from ...structures.dyad import DyadLinear
from ._optional import ipywidgets, plotly_go

LABELS = ("zero", "A: block-diagonal", "B: permuted", "A and B")
COLORS = ((0.0, "#f4f4f4"), (0.25, "#f4f4f4"), (0.25, "#1f77b4"), (0.5, "#1f77b4"), (0.5, "#ff7f0e"),
          (0.75, "#ff7f0e"), (0.75, "#2ca02c"), (1.0, "#2ca02c"))


def _term_pattern(layer: DyadLinear, use_a: bool) -> torch.Tensor:
    """(out, in) bool: where one term's blocks land, read off the layer applied to the identity."""
    with torch.no_grad():
        layer.blocks_a.fill_(1.0 if use_a else 0.0)
        layer.blocks_b.fill_(0.0 if use_a else 1.0)
        w_t = layer(torch.eye(layer.in_features))  # row i = column i of W (bias is off)
    return w_t.T != 0


def dyad_structure(width: int = 32, n_blocks: int = 4, variant: str = "it", out_features: int | None = None) -> torch.Tensor:
    """(out, in) int8 codes 0..3 (see module docstring) of a DYAD layer of the given shape."""
    layer = DyadLinear(width, out_features or width, n_blocks, variant, bias=False)
    a, b = _term_pattern(layer, True), _term_pattern(layer, False)
    return a.to(torch.int8) + 2 * b.to(torch.int8)


def _summary(codes: torch.Tensor, n_blocks: int) -> str:
    filled = int((codes > 0).sum())
    return (f"{filled} of {codes.numel()} weights can be non-zero ({filled / codes.numel():.1%}); "
            f"parameters: 2/n = {2 / n_blocks:.3g} of dense; overlapping entries (A and B): {int((codes == 3).sum())}")


def dyad_figure(codes: torch.Tensor, title: str = "", widget: bool = False):
    """A heatmap of the codes (FigureWidget when widget=True, for live updates)."""
    go = plotly_go()
    heat = go.Heatmap(z=codes.tolist(), zmin=0, zmax=3, colorscale=COLORS, showscale=True,
                      colorbar={"tickvals": [0.375, 1.125, 1.875, 2.625], "ticktext": list(LABELS)},
                      hovertemplate="out %{y}, in %{x}: %{z}<extra></extra>")
    layout = {"title": title, "yaxis": {"autorange": "reversed", "title": "out"}, "xaxis": {"title": "in"},
              "height": 520}
    return (go.FigureWidget if widget else go.Figure)(data=[heat], layout=layout)


def dyad_explorer(width: int = 32, n_blocks: int = 4, variant: str = "it"):
    """Dropdowns for n and the variant, the structure heatmap and a one-line summary, kept in sync."""
    widgets = ipywidgets()
    n_box = widgets.Dropdown(options=[n for n in (1, 2, 4, 8, 16) if width % n == 0], value=n_blocks,
                             description="n blocks")
    v_box = widgets.Dropdown(options=[("DYAD-IT", "it"), ("DYAD-OT", "ot"), ("DYAD-DT", "dt")], value=variant,
                             description="variant")
    codes = dyad_structure(width, n_blocks, variant)
    fig = dyad_figure(codes, f"DYAD-{variant.upper()}, n = {n_blocks}", widget=True)
    summary = widgets.HTML(_summary(codes, n_blocks))

    def redraw(_change=None) -> None:
        new = dyad_structure(width, n_box.value, v_box.value)
        with fig.batch_update():
            fig.data[0].z = new.tolist()
            fig.layout.title = f"DYAD-{v_box.value.upper()}, n = {n_box.value}"
        summary.value = _summary(new, n_box.value)

    n_box.observe(redraw, names="value")
    v_box.observe(redraw, names="value")
    return widgets.VBox([widgets.HBox([n_box, v_box]), fig, summary])
