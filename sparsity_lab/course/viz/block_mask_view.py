"""Prune-and-regrow made visible: the block mask of one layer after every update of a short run.

Codes of a mask compared with the one before it:
    0 = dead, 1 = live (kept), 2 = regrown in this update, 3 = pruned in this update
"""
from __future__ import annotations

import torch
from torch import nn

from ...structures.prune_regrow import BlockSparseLinear, PruneRegrow, block_sparsify
from ._optional import ipywidgets, plotly_go

COLORS = ((0.0, "#f4f4f4"), (0.25, "#f4f4f4"), (0.25, "#1f77b4"), (0.5, "#1f77b4"), (0.5, "#2ca02c"),
          (0.75, "#2ca02c"), (0.75, "#d62728"), (1.0, "#d62728"))
LABELS = ("dead", "live", "regrown now", "pruned now")


def prune_regrow_trace(block: int = 8, sparsity: float = 0.9, width: int = 64, steps: int = 60,
                       update_every: int = 10, seed: int = 0) -> dict:
    """Train a small MLP (width -> 2 width -> width) to imitate a random teacher with always-sparse
    FFN weights and prune-and-regrow; return the first layer's block mask after each update.

    Returns {"masks": [bool (2 width / block, width / block)] (the initial mask first),
             "losses": [float per step], "history": PruneRegrow.history, "live": live blocks}.
    """
    torch.manual_seed(seed)
    teacher = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width))
    model = nn.Sequential()
    model.add_module("mlp", nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width)))
    block_sparsify(model, sparsity, block, seed=seed)
    layer: BlockSparseLinear = model.mlp[0]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    schedule = PruneRegrow(model, opt, update_every=update_every, total_updates=max(1, steps // update_every),
                           seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    masks, losses = [layer.block_mask.clone()], []
    for _ in range(steps):
        x = torch.randn(32, width, generator=gen)
        with torch.no_grad():
            target = teacher(x)
        loss = (model(x) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        done = schedule.updates_done
        schedule.step()
        if schedule.updates_done > done:
            masks.append(layer.block_mask.clone())
        losses.append(loss.item())
    return {"masks": masks, "losses": losses, "history": schedule.history, "live": layer.live_blocks}


def mask_changes(previous: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """int8 codes 0..3 (module docstring) of ``current`` against ``previous``."""
    codes = current.to(torch.int8).clone()
    codes[current & ~previous] = 2
    codes[previous & ~current] = 3
    return codes


def block_mask_figure(masks: list[torch.Tensor], index: int, widget: bool = False):
    """Heatmap of update ``index`` (0 = the initial mask) with its changes coloured."""
    go = plotly_go()
    codes = mask_changes(masks[max(0, index - 1)], masks[index])
    heat = go.Heatmap(z=codes.tolist(), zmin=0, zmax=3, colorscale=COLORS,
                      colorbar={"tickvals": [0.375, 1.125, 1.875, 2.625], "ticktext": list(LABELS)},
                      hovertemplate="block row %{y}, col %{x}: %{z}<extra></extra>")
    # whole-number ticks: plotly labels a small heatmap's axes at half blocks (-0.5, 0, 0.5, ...)
    rows, cols = len(codes), len(codes[0])
    layout = {"title": _title(masks, index), "height": 620,
              "yaxis": {"autorange": "reversed", "title": "block row (out)", "dtick": 1 if rows <= 16 else None},
              "xaxis": {"title": "block column (in)", "dtick": 1 if cols <= 16 else None}}
    return (go.FigureWidget if widget else go.Figure)(data=[heat], layout=layout)


def _title(masks: list[torch.Tensor], index: int) -> str:
    return "initial mask" if index == 0 else f"after update {index} of {len(masks) - 1}"


def prune_regrow_explorer(block: int = 8, sparsity: float = 0.9, width: int = 64, steps: int = 60,
                          update_every: int = 10):
    """Block size and sparsity controls (re-run the short training), an update slider, the mask."""
    widgets = ipywidgets()
    block_box = widgets.Dropdown(options=[b for b in (1, 4, 8, 16) if width % b == 0], value=block,
                                 description="block")
    sparsity_box = widgets.FloatSlider(value=sparsity, min=0.5, max=0.95, step=0.05, description="sparsity")
    trace = {"run": prune_regrow_trace(block, sparsity, width, steps, update_every)}
    update_box = widgets.IntSlider(value=0, min=0, max=len(trace["run"]["masks"]) - 1, description="update")
    fig = block_mask_figure(trace["run"]["masks"], 0, widget=True)
    info = widgets.HTML()

    def show(_change=None) -> None:
        masks = trace["run"]["masks"]
        i = min(update_box.value, len(masks) - 1)
        new = block_mask_figure(masks, i)
        with fig.batch_update():
            fig.data[0].z = new.data[0].z
            fig.layout.title = new.layout.title
        moved = trace["run"]["history"][i - 1]["blocks_moved"] if i > 0 else 0
        info.value = (f"{trace['run']['live']} live blocks of {masks[0].numel()} (constant); "
                      f"this update moved {moved}; final loss {trace['run']['losses'][-1]:.4f}")

    def rerun(_change=None) -> None:
        trace["run"] = prune_regrow_trace(block_box.value, sparsity_box.value, width, steps, update_every)
        update_box.max = len(trace["run"]["masks"]) - 1
        show()

    block_box.observe(rerun, names="value")
    sparsity_box.observe(rerun, names="value")
    update_box.observe(show, names="value")
    show()
    return widgets.VBox([widgets.HBox([block_box, sparsity_box]), update_box, fig, info])
