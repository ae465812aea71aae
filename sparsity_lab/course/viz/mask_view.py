"""What an N:M mask keeps: a weight heatmap with the mask drawn over it, and kept-magnitude figures.

The kept fraction of a mask S on a weight W is ``sum |w| S / sum |w|`` (``masks.kept_fraction``).
Masks compared (each keeps the fraction N/M of the entries):
* "rowwise": plain N:M along ``in`` (``nm_mask(W, n, m, dim=1)``), what the forward product needs;
* "auto" / "flow" / "greedy": transposable N:M (``transposable_mask``), N per row and column of
  every M x M tile; "auto" is exact (the pattern search where the pattern count is small, else flow);
* "unstructured": the N/M fraction of largest |w| anywhere in the matrix, the upper bound of all.

On i.i.d. Gaussian weights the unstructured kept fraction at density d has a closed form: with the
half-normal threshold t such that P(|w| > t) = d, the kept mass is
``int_t^inf x f(x) dx / E|w| = exp(-t^2 / 2)``, ``t = sqrt(2) erfinv(1 - d)``.
"""
from __future__ import annotations

import math

import torch

from ...masks import kept_fraction, nm_mask, transposable_mask
from ...masks.patterns import pattern_count_small
from ...masks.quality import expected_rowwise_kept_fraction, gaussian_weight
from ...validation import check_float_tensor
from ._optional import ipywidgets, plotly_go

# (label shown in the dropdown, solver key) in the order the widget lists them
SOLVER_CHOICES = (
    ("row-wise N:M (nm_mask)", "rowwise"),
    ("transposable, exact", "auto"),
    ("transposable, min-cost flow", "flow"),
    ("transposable, greedy", "greedy"),
    ("unstructured, same density", "unstructured"),
)
SOLVER_KEYS = tuple(key for _, key in SOLVER_CHOICES)
_LABELS = {key: label for label, key in SOLVER_CHOICES}
_TILE_SOLVERS = ("auto", "flow", "greedy")  # masks built from M x M tiles: outline the tiles
NM_CHOICES = ((1, 4), (2, 4), (4, 8), (2, 8))
# pruned entries are covered by a dark grey layer: light colours mean small kept weights, never pruned ones
_PRUNED_COLOR = ((0.0, "rgb(70,70,70)"), (1.0, "rgb(70,70,70)"))


def unstructured_mask(weight: torch.Tensor, density: float) -> torch.Tensor:
    """bool mask of ``weight``'s shape keeping the round(density * numel) largest |w| anywhere.

    Ties go to the lowest flat (row-major) index, so the mask is deterministic.
    """
    check_float_tensor(weight, "weight")
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0.0 < density <= 1.0:
        raise ValueError(f"density must be a number in (0, 1], got {density!r}")
    flat = weight.detach().abs().reshape(-1)
    keep = round(density * flat.numel())
    order = torch.sort(flat, descending=True, stable=True).indices
    mask = torch.zeros(flat.numel(), dtype=torch.bool, device=weight.device)
    mask[order[:keep]] = True
    return mask.reshape(weight.shape)


def expected_unstructured_kept_fraction(density: float) -> float:
    """E[kept |w|] / E[|w|] of the unstructured magnitude mask at ``density`` on Gaussian weights.

    exp(-t^2 / 2) with t = sqrt(2) erfinv(1 - density) (module docstring).
    """
    from scipy.special import erfinv

    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0.0 < density <= 1.0:
        raise ValueError(f"density must be a number in (0, 1], got {density!r}")
    t = math.sqrt(2.0) * float(erfinv(1.0 - density))
    return math.exp(-t * t / 2.0)


def compute_mask(weight: torch.Tensor, n: int, m: int, solver: str) -> torch.Tensor:
    """The bool (O, I) mask of ``weight`` chosen by ``solver`` (one of SOLVER_KEYS)."""
    if solver not in SOLVER_KEYS:
        raise ValueError(f"solver must be one of {list(SOLVER_KEYS)}, got {solver!r}")
    if solver == "rowwise":
        return nm_mask(weight, n, m, dim=1)
    if solver == "unstructured":
        return unstructured_mask(weight, n / m)
    return transposable_mask(weight, n, m, solver=solver)


def exact_solver_name(n: int, m: int) -> str:
    """Which exact solver ``solver="auto"`` runs for N:M."""
    return "patterns" if pattern_count_small(n, m) else "flow"


def kept_magnitude_rows(weight: torch.Tensor, patterns=NM_CHOICES) -> list[dict]:
    """Kept fraction of |W| for each N:M in ``patterns``: unstructured, row-wise and transposable
    (exact) masks of ``weight`` at density N/M, with the Gaussian expectations next to them.

    weight: (O, I) float, O and I divisible by every M. Keys: n, m, density, unstructured, rowwise,
    transposable, exact_solver, expected_unstructured, expected_rowwise.
    """
    rows = []
    for n, m in patterns:
        rows.append({
            "n": n, "m": m, "density": n / m,
            "unstructured": kept_fraction(weight, unstructured_mask(weight, n / m)),
            "rowwise": kept_fraction(weight, nm_mask(weight, n, m, dim=1)),
            "transposable": kept_fraction(weight, transposable_mask(weight, n, m)),
            "exact_solver": exact_solver_name(n, m),
            "expected_unstructured": expected_unstructured_kept_fraction(n / m),
            "expected_rowwise": expected_rowwise_kept_fraction(n, m),
        })
    return rows


def kept_magnitude_figure(rows: list[dict]):
    """Grouped bars: kept fraction of |W| per N:M for the three kinds of mask (from kept_magnitude_rows)."""
    go = plotly_go()
    names = [f"{r['n']}:{r['m']}" for r in rows]
    fig = go.Figure()
    for key, label in (("unstructured", "unstructured (same density)"), ("rowwise", "row-wise N:M"),
                       ("transposable", "transposable N:M (exact)")):
        fig.add_bar(x=names, y=[r[key] for r in rows], name=label,
                    text=[f"{r[key]:.3f}" for r in rows], textposition="outside")
    fig.update_layout(title="fraction of |W| kept (Gaussian weights)", xaxis_title="N:M",
                      yaxis={"title": "kept sum |w| / sum |w|", "range": [0, 1.05]}, barmode="group")
    return fig


def _grid_lines(shape: tuple[int, int], m: int, tiles: bool) -> list[dict]:
    """Lines between groups of M columns (and between M-row bands for tile masks)."""
    rows, cols = shape
    line = {"color": "black", "width": 2}
    shapes = [{"type": "line", "x0": c - 0.5, "x1": c - 0.5, "y0": -0.5, "y1": rows - 0.5, "line": line}
              for c in range(m, cols, m)]
    if tiles:
        shapes += [{"type": "line", "y0": r - 0.5, "y1": r - 0.5, "x0": -0.5, "x1": cols - 0.5, "line": line}
                   for r in range(m, rows, m)]
    return shapes


def pruned_layer(mask: torch.Tensor) -> list[list]:
    """Heatmap z of the grey layer: 1 where the mask prunes, None (transparent) where it keeps."""
    return [[None if keep else 1 for keep in row] for row in mask.tolist()]


def mask_heatmap(weight: torch.Tensor, mask: torch.Tensor, m: int, tiles: bool = False, title: str = "",
                 widget: bool = False):
    """Heatmap of W (diverging colours) with the pruned entries covered in grey and the M-groups outlined.

    Trace 0: W; trace 1: the pruned layer (see pruned_layer). tiles=True also outlines M-row bands
    (the M x M tiles of a transposable mask).
    """
    go = plotly_go()
    w = weight.detach().float().cpu()
    bound = float(w.abs().max()) or 1.0
    heat = go.Heatmap(z=w.tolist(), zmid=0.0, zmin=-bound, zmax=bound, colorscale="RdBu", name="W",
                      colorbar={"title": "w"}, hovertemplate="out %{y}, in %{x}: w = %{z:.3f}<extra></extra>")
    pruned = go.Heatmap(z=pruned_layer(mask.cpu()), zmin=0, zmax=1, colorscale=_PRUNED_COLOR, showscale=False,
                        opacity=0.85, name="pruned", hoverinfo="skip")
    # square cells; "domain" shrinks the drawing to the matrix instead of padding the x axis past it
    layout = {"title": title, "yaxis": {"autorange": "reversed", "title": "out (row)", "scaleanchor": "x",
                                        "constrain": "domain"},
              "xaxis": {"title": "in (column)", "constrain": "domain"}, "height": 560,
              "shapes": _grid_lines(tuple(w.shape), m, tiles), "plot_bgcolor": "white"}
    return (go.FigureWidget if widget else go.Figure)(data=[heat, pruned], layout=layout)


def _summary(weight: torch.Tensor, mask: torch.Tensor, n: int, m: int, solver: str) -> str:
    used = f" (auto ran '{exact_solver_name(n, m)}')" if solver == "auto" else ""
    rowwise = kept_fraction(weight, nm_mask(weight, n, m, dim=1))
    unstructured = kept_fraction(weight, unstructured_mask(weight, n / m))
    return (f"<b>{_LABELS[solver]}{used}</b>: keeps {int(mask.sum())} of {mask.numel()} weights and "
            f"<b>{kept_fraction(weight, mask):.3f}</b> of sum |w|. "
            f"On this matrix: row-wise {n}:{m} keeps {rowwise:.3f}, unstructured at density {n}/{m} keeps "
            f"{unstructured:.3f}.")


def mask_explorer(size: int = 16, n: int = 2, m: int = 4, solver: str = "rowwise", seed: int = 0):
    """Dropdowns for N:M and the solver, a seed for new Gaussian weights, the heatmap and a summary.

    size: the (size, size) weight shown; divisible by every M offered (8).
    Returns VBox([HBox([nm dropdown, solver dropdown, seed]), FigureWidget, HTML summary]).
    """
    widgets = ipywidgets()
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0 or size % 8:
        raise ValueError(f"size must be a positive multiple of 8 (the largest M offered), got {size!r}")
    if (n, m) not in NM_CHOICES:
        raise ValueError(f"(n, m) must be one of {list(NM_CHOICES)}, got {(n, m)!r}")
    if solver not in SOLVER_KEYS:
        raise ValueError(f"solver must be one of {list(SOLVER_KEYS)}, got {solver!r}")
    nm_box = widgets.Dropdown(options=[(f"{a}:{b}", (a, b)) for a, b in NM_CHOICES], value=(n, m), description="N:M")
    solver_box = widgets.Dropdown(options=list(SOLVER_CHOICES), value=solver, description="mask")
    seed_box = widgets.IntSlider(value=seed, min=0, max=20, description="seed")
    state = {"weight": gaussian_weight(size, size, seed)}

    def figure(widget: bool = False):
        (a, b), s = nm_box.value, solver_box.value
        mask = compute_mask(state["weight"], a, b, s)
        fig = mask_heatmap(state["weight"], mask, b, tiles=s in _TILE_SOLVERS, title=f"{a}:{b}, {_LABELS[s]}",
                           widget=widget)
        return fig, _summary(state["weight"], mask, a, b, s)

    fig, text = figure(widget=True)
    summary = widgets.HTML(text)

    def redraw(_change=None) -> None:
        new, text = figure()
        with fig.batch_update():
            for old, fresh in zip(fig.data, new.data):
                old.z, old.zmin, old.zmax = fresh.z, fresh.zmin, fresh.zmax
            fig.layout.shapes = new.layout.shapes
            fig.layout.title = new.layout.title
        summary.value = text

    def reseed(_change=None) -> None:
        state["weight"] = gaussian_weight(size, size, seed_box.value)
        redraw()

    nm_box.observe(redraw, names="value")
    solver_box.observe(redraw, names="value")
    seed_box.observe(reseed, names="value")
    return widgets.VBox([widgets.HBox([nm_box, solver_box, seed_box]), fig, summary])
