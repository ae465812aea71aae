"""Transposable 2:4 solvers side by side: one editable 4x4 tile, a solver race on a Gaussian matrix,
mask diversity counts and the recorded CPU benchmark.

A transposable 2:4 mask keeps exactly 2 per row and per column of every 4x4 tile (Hubara et al.
2021). The exact solvers ("patterns": best of the 90 valid tiles; "flow": min-cost flow) maximise
the kept sum of |w| under that *exactly-N* constraint. The greedy solvers ("greedy": keep in
descending |w| while row and column have room, Hubara et al.'s fast approximation;
"greedy_prune": our variant, prune in ascending |w| while row or column holds more than N) only guarantee *at most* N per line, so on some tiles
they keep fewer entries and yet more magnitude than the exact-N optimum.
"""
from __future__ import annotations

import itertools
from functools import lru_cache

import torch

from ...masks import mask_diversity, transposable_mask, transposable_patterns
from ...masks.quality import ROWWISE, gaussian_weight
from ...masks.tiles import check_transposable_input, tile_line_counts, to_tiles
from ...validation import check_float_tensor
from ._axes import clean_log_ticks
from ._optional import ipywidgets, plotly_go

N, M = 2, 4
TILE_SOLVERS = ("patterns", "flow", "greedy", "greedy_prune")
SOLVER_LABELS = {
    "patterns": "exact: best of 90 patterns",
    "flow": "exact: min-cost flow",
    "lp": "exact: linear program",
    "greedy": "greedy keep (Hubara et al.)",
    "greedy_prune": "greedy prune (variant)",
    ROWWISE: "row-wise N:M (not transposable)",
}
PRESETS = {
    # greedy keeps 10 and the six 5s (40) leaving row 0 and column 0 one short; exactly-2 must
    # give up the 10's companions and tops out at 35
    "greedy keeps more than exact (at most N)": [[10, 0, 0, 0], [0, .1, 5, 5], [0, 5, .1, 5], [0, 5, 5, .1]],
    # greedy grabs the big entries first and then finds no room: 40 against the optimum 54
    "greedy falls short": [[7, 4, 0, 1], [9, 9, 6, 6], [7, 3, 5, 0], [8, 8, 8, 8]],
    # the prune-greedy prunes in ascending order while a line is over N and strands lines short: 34 vs 61
    "greedy prune falls short": [[2, 5, 8, 1], [8, 2, 8, 9], [3, 5, 9, 6], [8, 8, 8, 8]],
    "Gaussian (seed 0)": [[round(v, 2) for v in row] for row in gaussian_weight(4, 4, seed=0).tolist()],
}


def _check_tile(tile) -> torch.Tensor:
    t = torch.as_tensor(tile, dtype=torch.float64)
    if t.shape != (M, M):
        raise ValueError(f"tile must be {M}x{M} numbers, got shape {tuple(t.shape)}")
    check_float_tensor(t, "tile")
    return t


def tile_solutions(tile, solvers=TILE_SOLVERS) -> list[dict]:
    """Each solver's 2:4 mask of one 4x4 tile and what it keeps.

    tile: 4x4 numbers (list or tensor). Returns one dict per solver: solver, mask (4x4 bool list),
    kept (sum of kept |w|), fraction (kept / sum |w|, None for an all-zero tile), row_counts,
    col_counts (ones per line), exactly_n (every line holds exactly N).
    """
    t = _check_tile(tile)
    total = float(t.abs().sum())
    out = []
    for s in solvers:
        mask = transposable_mask(t, N, M, solver=s)
        rows, cols = tile_line_counts(mask, M)
        kept = float((t.abs() * mask).sum())
        out.append({"solver": s, "mask": mask.tolist(), "kept": kept,
                     "fraction": kept / total if total > 0 else None,
                     "row_counts": rows[0].tolist(), "col_counts": cols[0].tolist(),
                     "exactly_n": bool((rows == N).all() and (cols == N).all())})
    return out


@lru_cache(maxsize=1)
def _at_most_n_patterns() -> torch.Tensor:
    bits = torch.tensor(list(itertools.product((0, 1), repeat=M * M)), dtype=torch.float64).reshape(-1, M, M)
    ok = ((bits.sum(2) <= N) & (bits.sum(1) <= N)).all(1)
    return bits[ok].reshape(-1, M * M)


def at_most_n_patterns() -> torch.Tensor:
    """(P, 16) float64: every 4x4 0/1 matrix with at most 2 ones per row and column (P = 7343),
    by brute force over the 2^16 matrices (computed once; a copy is returned)."""
    return _at_most_n_patterns().clone()


def at_most_n_gain(weight: torch.Tensor) -> dict:
    """How much the *at most 2 per line* optimum keeps beyond the exactly-2 optimum, tile by tile.

    weight: (O, I) float, O and I divisible by 4. Both optima by brute force (7343 and 90 patterns).
    Returns tiles (count), tiles_better (fraction of tiles where at-most-2 keeps strictly more),
    mass_ratio (total at-most-2 optimum / total exactly-2 optimum, >= 1).
    """
    check_transposable_input(weight, N, M)
    mags = to_tiles(weight.detach().abs().double().cpu(), M).reshape(-1, M * M)
    exact = transposable_patterns(N, M).reshape(-1, M * M).double()
    best_exact = (mags @ exact.T).max(1).values
    # chunks of tiles keep the (tiles, 7343) score matrix near 60 MB
    pats = _at_most_n_patterns()
    best_at_most = torch.cat([(chunk @ pats.T).max(1).values for chunk in mags.split(1024)])
    # "strictly more" up to float rounding of the 16-term sums
    better = best_at_most > best_exact * (1 + 1e-12) + 1e-300
    return {"tiles": mags.shape[0], "tiles_better": float(better.double().mean()),
            "mass_ratio": float(best_at_most.sum() / best_exact.sum())}


def patterns_figure(n: int = N, m: int = M, per_row: int = 10):
    """Every valid transposable N:M tile pattern drawn in a grid (kept = dark), one gap between tiles."""
    go = plotly_go()
    pats = transposable_patterns(n, m)
    rows = -(-pats.shape[0] // per_row)
    z = [[None] * (per_row * (m + 1)) for _ in range(rows * (m + 1))]
    for k, pat in enumerate(pats.tolist()):
        r0, c0 = (k // per_row) * (m + 1), (k % per_row) * (m + 1)
        for i in range(m):
            for j in range(m):
                z[r0 + i][c0 + j] = int(pat[i][j])
    fig = go.Figure(go.Heatmap(z=z, zmin=0, zmax=1, colorscale=((0, "#e8e8e8"), (1, "#1f4e79")), showscale=False,
                               hoverinfo="skip"))
    fig.update_layout(title=f"all {pats.shape[0]} transposable {n}:{m} tile patterns",
                      height=int(700 * rows / per_row) + 80, xaxis={"visible": False},
                      yaxis={"visible": False, "autorange": "reversed", "scaleanchor": "x"})
    return clean_log_ticks(fig)


def _panel_title(sol: dict) -> str:
    frac = "-" if sol["fraction"] is None else f"{sol['fraction']:.3f}"
    form = "exactly 2 per line" if sol["exactly_n"] else "at most 2 per line"
    return f"{SOLVER_LABELS[sol['solver']]}<br>kept {sol['kept']:.4g} ({frac}), {form}"


def tile_figure(tile, widget: bool = False):
    """One panel per solver in TILE_SOLVERS: |w| of the tile with the values written in, pruned
    entries greyed out. Traces 2k and 2k+1 belong to panel k (|w|, pruned layer)."""
    go = plotly_go()
    from plotly.subplots import make_subplots

    t = _check_tile(tile)
    sols = tile_solutions(t)
    cols = 2  # a 2 x 2 grid: each panel stays legible in a book's text column
    rows = -(-len(sols) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[_panel_title(s) for s in sols],
                        horizontal_spacing=0.06, vertical_spacing=0.16)
    top = float(t.abs().max()) or 1.0
    text = [[f"{v:.3g}" for v in row] for row in t.tolist()]
    for k, sol in enumerate(sols, start=1):
        at = {"row": (k - 1) // cols + 1, "col": (k - 1) % cols + 1}
        fig.add_trace(go.Heatmap(z=t.abs().tolist(), zmin=0, zmax=top, colorscale="Blues", showscale=False,
                                 text=text, texttemplate="%{text}", name="|w|",
                                 hovertemplate="row %{y}, col %{x}: w = %{text}<extra></extra>"), **at)
        pruned = [[None if keep else 1 for keep in row] for row in sol["mask"]]
        fig.add_trace(go.Heatmap(z=pruned, zmin=0, zmax=1, showscale=False, opacity=0.85, hoverinfo="skip",
                                 colorscale=((0, "rgb(225,225,225)"), (1, "rgb(225,225,225)")), name="pruned"),
                      **at)
        # square cells: the panel shrinks to fit (constrain="domain") rather than its axis running past the
        # tile, and every row and column index is a tick
        fig.update_yaxes(autorange="reversed", showticklabels=at["col"] == 1, tickvals=list(range(len(text))), **at)
        fig.update_xaxes(scaleanchor=f"y{'' if k == 1 else k}", constrain="domain",
                         tickvals=list(range(len(text[0]))), **at)
    fig.update_layout(height=300 * rows + 120, margin={"t": 90}, title="one 4x4 tile, four 2:4 solvers "
                      "(white/blue = kept, grey = pruned)")
    fig.update_annotations(font_size=11)
    return go.FigureWidget(fig) if widget else fig


def _table(tile, sols: list[dict]) -> str:
    """HTML table: kept mass of each solver, against the exact-N optimum, and its line counts;
    below it the at-most-N optimum of the tile."""
    mags = _check_tile(tile).abs().reshape(-1)
    at_most = float((_at_most_n_patterns() @ mags).max())
    best = max(s["kept"] for s in sols if s["solver"] in ("patterns", "flow"))
    cells = ""
    for s in sols:
        ratio = f"{s['kept'] / best:.3f}" if best > 0 else "-"
        cells += (f"<tr><td>{SOLVER_LABELS[s['solver']]}</td><td>{s['kept']:.4g}</td><td>{ratio}</td>"
                  f"<td>{s['row_counts']}</td><td>{s['col_counts']}</td>"
                  f"<td>{'yes' if s['exactly_n'] else 'no'}</td></tr>")
    return ("<table><tr><th>solver</th><th>kept sum |w|</th><th>/ exact optimum</th><th>ones per row</th>"
            f"<th>ones per column</th><th>exactly 2 per line</th></tr>{cells}</table>"
            f"<p>Best possible with <i>at most</i> 2 per row and column (brute force over "
            f"{_at_most_n_patterns().shape[0]} masks): <b>{at_most:.4g}</b>.</p>")


def tile_editor(preset: str = "greedy keeps more than exact (at most N)"):
    """Sixteen number boxes (the tile), a preset chooser, the four solvers' masks and a table.

    Returns VBox([preset Dropdown, GridBox of 16 FloatText (row-major), FigureWidget, HTML table]).
    Editing any box re-solves the tile; choosing a preset writes all 16 boxes, then re-solves once.
    """
    widgets = ipywidgets()
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {list(PRESETS)}, got {preset!r}")
    preset_box = widgets.Dropdown(options=list(PRESETS), value=preset, description="preset",
                                  layout={"width": "420px"}, style={"description_width": "initial"})
    boxes = [widgets.FloatText(value=float(v), layout={"width": "80px"}) for row in PRESETS[preset] for v in row]
    grid = widgets.GridBox(boxes, layout={"grid_template_columns": "repeat(4, 85px)"})
    fig = tile_figure(PRESETS[preset], widget=True)
    table = widgets.HTML(_table(PRESETS[preset], tile_solutions(PRESETS[preset])))
    hold = {"on": False}  # a preset writes 16 boxes: solve once, not 16 times

    def current() -> list[list[float]]:
        return [[boxes[i * M + j].value for j in range(M)] for i in range(M)]

    def resolve(_change=None) -> None:
        if hold["on"]:
            return
        new = tile_figure(current())
        with fig.batch_update():
            for old, fresh in zip(fig.data, new.data):
                old.z, old.zmax, old.text = fresh.z, fresh.zmax, fresh.text
            for old, fresh in zip(fig.layout.annotations, new.layout.annotations):
                old.text = fresh.text
        table.value = _table(current(), tile_solutions(current()))

    def load(_change=None) -> None:
        hold["on"] = True
        try:
            for box, v in zip(boxes, (v for row in PRESETS[preset_box.value] for v in row)):
                box.value = float(v)
        finally:
            hold["on"] = False
        resolve()

    for box in boxes:
        box.observe(resolve, names="value")
    preset_box.observe(load, names="value")
    return widgets.VBox([preset_box, grid, fig, table])


def solver_bars(rows: list[dict], title: str = ""):
    """Two bar panels from ``course.live.time_solvers`` / the recorded JSON rows: kept |W| fraction, median time (log)."""
    plotly_go()  # raises the install hint when plotly is missing
    from plotly.subplots import make_subplots

    names = [SOLVER_LABELS.get(r["solver"], r["solver"]) for r in rows]
    colors = ["#2ca02c" if r["exact"] and r["transposable"] else "#ff7f0e" if r["transposable"] else "#7f7f7f"
              for r in rows]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("kept sum |w| / sum |w|", "median time (s, log scale)"))
    fig.add_bar(x=names, y=[r["kept_fraction"] for r in rows], marker_color=colors, showlegend=False,
                text=[f"{r['kept_fraction']:.4f}" for r in rows], textposition="outside", row=1, col=1)
    fig.add_bar(x=names, y=[r["median_s"] for r in rows], marker_color=colors, showlegend=False,
                text=[f"{r['median_s']:.3g}" for r in rows], textposition="outside", row=1, col=2)
    low = min(r["kept_fraction"] for r in rows)
    fig.update_yaxes(range=[max(0.0, low - 0.1), 1.0], row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=2)
    legend = "green: exact transposable, orange: approximate transposable, grey: not transposable"
    fig.update_layout(title=f"{title}<br><sup>{legend}</sup>" if title else legend, height=480)
    return clean_log_ticks(fig)


def diversity_rows(block: tuple[int, int] = (8, 8)) -> list[dict]:
    """Mask diversity of one block at 50 %: unstructured, 4:8, 2:4, transposable 4:8, transposable 2:4.

    Exact integers from masks.mask_diversity (enumeration / dynamic programming, no closed form), one
    row ``{"mask", "count", "block"}`` per structure. A structure that the block cannot hold (4:8 needs
    columns in groups of 8; transposable 4:8 needs whole 8x8 tiles, so a (4, 8) block has none) is left
    out with a warning naming it; a block that holds none of them is a ValueError.
    """
    import warnings

    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise ValueError(f"block must be (rows, cols), two positive ints, got {block!r}")
    block = tuple(block)
    kinds = (("unstructured 50 %", "unstructured", 2, 4), ("4:8", "nm", 4, 8), ("2:4", "nm", 2, 4),
             ("transposable 4:8", "transposable", 4, 8), ("transposable 2:4", "transposable", 2, 4))
    rows, left_out = [], []
    for label, kind, n, m in kinds:
        try:
            rows.append({"mask": label, "count": mask_diversity(kind, n, m, block), "block": block})
        except ValueError as err:  # the block does not hold this structure
            left_out.append(f"{label} ({err})")
    if not rows:
        raise ValueError(f"block {block} holds none of the structures: " + "; ".join(left_out))
    if left_out:
        warnings.warn(f"diversity_rows(block={block}) leaves out " + "; ".join(left_out), stacklevel=2)
    return rows


def diversity_figure(rows: list[dict]):
    """Log-scale bars of the mask diversity counts (from diversity_rows)."""
    go = plotly_go()
    rows_, cols = rows[0].get("block", (8, 8))
    fig = go.Figure(go.Bar(x=[r["mask"] for r in rows], y=[float(r["count"]) for r in rows],
                           text=[f"{float(r['count']):.3g}" for r in rows], textposition="outside"))
    fig.update_layout(title=f"valid masks of one {rows_}x{cols} block keeping half its entries", yaxis_type="log",
                      yaxis_title="mask diversity (log scale)")
    return clean_log_ticks(fig)


def recorded_case_rows(data: dict, n: int, m: int) -> list[dict]:
    """The rows of one N:M case of the recorded benchmarks masks JSON (results/mask_solvers_cpu.json)."""
    rows = [r for r in data["rows"] if r["n"] == n and r["m"] == m]
    if not rows:
        have = sorted({(r["n"], r["m"]) for r in data["rows"]})
        raise ValueError(f"no recorded rows for {n}:{m}; the file has {have}")
    return rows
