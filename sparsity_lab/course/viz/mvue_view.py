"""MVUE 2:4 by simulation: many draws of the estimator of one fixed vector.

For x split into groups of 4 and K independent draws d_1 .. d_K of MVUE(x):
* unbiased: the mean of the draws converges to x; its expected squared error is
  E||mean_K - x||^2 = V / K with V = E||d - x||^2 = sum_i x_i^2 (1 / p_i - 1)
  (p_i the inclusion probabilities: each d_i = x_i I_i / p_i with P(I_i = 1) = p_i);
* top-2 magnitude pruning is deterministic: its error ||top2(x) - x|| never averages away (bias).
Per draw, MVUE's error V is larger than top-2's: unbiasedness is paid for with variance.
The estimators are ``sparsity_lab.methods.mvue`` (exact and sequential); this module draws and plots.
"""
from __future__ import annotations

import math

import torch

from ...methods.mvue import mvue24, mvue_probabilities, sequential_probabilities, top2_24
from ._axes import clean_log_ticks
from ._optional import plotly_go

METHODS = ("exact", "sequential")
COLORS = {"exact": "#1f77b4", "sequential": "#2ca02c", "top2": "#d62728"}


def _check_vector(x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.numel() == 0 or x.numel() % 4:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a 1-D tensor whose length is a multiple of 4 (groups of 4), got {shape}")
    if not x.dtype.is_floating_point or not bool(torch.isfinite(x).all()):
        raise ValueError("x must hold finite floating-point values")
    return x.double()


def mvue_draws(x: torch.Tensor, draws: int, method: str = "exact", seed: int = 0) -> torch.Tensor:
    """``draws`` independent MVUE 2:4 draws of the 1-D x (groups of 4 consecutive entries): (draws, len(x)) float64.

    One call on x repeated ``draws`` times: every row holds different groups, so its draw is independent.
    """
    x = _check_vector(x)
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws must be a positive int, got {draws!r}")
    gen = torch.Generator().manual_seed(seed)
    return mvue24(x.expand(draws, -1).contiguous(), dim=-1, generator=gen, method=method)


def squared_error_theory(x: torch.Tensor, method: str = "exact") -> float:
    """E||MVUE(x) - x||^2 = sum_i x_i^2 (1 / p_i - 1) (0 for entries with p_i = 1 or x_i = 0)."""
    x = _check_vector(x)
    probs = {"exact": mvue_probabilities, "sequential": sequential_probabilities}
    if method not in probs:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    p = probs[method](x.reshape(-1, 4)).reshape(-1)
    live = (x != 0) & (p > 0)
    return float((x[live] ** 2 * (1 / p[live] - 1)).sum())


def mvue_simulation(x: torch.Tensor, draws: int = 2000, seed: int = 0) -> dict:
    """Draw both MVUE methods ``draws`` times and measure bias and variance against top-2.

    Returns a dict with
        "k":              draw counts at which the running mean is scored (log-spaced, ends at draws)
        "mean_error":     {method: [||mean of first k draws - x|| / ||x|| for k in "k"]}
        "mean_error_theory": {method: [sqrt(V / k) / ||x||]} (the expected RMS error of that mean)
        "top2_error":     ||top2(x) - x|| / ||x|| (the same at every k: a bias)
        "squared_error":  {method: mean over draws of ||d - x||^2, "top2": ||top2(x) - x||^2}
        "squared_error_theory": {method: V}
        "keep_frequency": {method: (len(x),) fraction of draws that kept each entry}
        "p":              {method: (len(x),) inclusion probabilities}
        "max_kept":       {method: the most entries any group kept in any draw}
    """
    xd = _check_vector(x)
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws must be a positive int, got {draws!r}")
    norm = float(xd.norm())
    if norm == 0:
        raise ValueError("x must not be all zeros (the errors are relative to ||x||)")
    ks = sorted({min(draws, max(1, round(10 ** e))) for e in torch.linspace(0, math.log10(draws), 30).tolist()})
    top2 = top2_24(xd)
    out = {"k": ks, "mean_error": {}, "mean_error_theory": {}, "top2_error": float((top2 - xd).norm()) / norm,
           "squared_error": {"top2": float(((top2 - xd) ** 2).sum())}, "squared_error_theory": {},
           "keep_frequency": {}, "p": {}, "max_kept": {}}
    probs = {"exact": mvue_probabilities, "sequential": sequential_probabilities}
    for i, method in enumerate(METHODS):
        d = mvue_draws(xd, draws, method, seed + i)
        running = d.cumsum(0) / torch.arange(1, draws + 1, dtype=torch.float64).unsqueeze(1)
        v = squared_error_theory(xd, method)
        out["mean_error"][method] = [float((running[k - 1] - xd).norm()) / norm for k in ks]
        out["mean_error_theory"][method] = [math.sqrt(v / k) / norm for k in ks]
        out["squared_error"][method] = float(((d - xd) ** 2).sum(1).mean())
        out["squared_error_theory"][method] = v
        out["keep_frequency"][method] = (d != 0).double().mean(0)
        out["p"][method] = probs[method](xd.reshape(-1, 4)).reshape(-1)
        out["max_kept"][method] = int((d.reshape(draws, -1, 4) != 0).sum(-1).max())
    return out


def mvue_convergence_figure(sim: dict):
    """Log-log: relative error of the mean of k draws (MVUE, both methods; dotted: sqrt(V / k)) against
    top-2's constant error."""
    go = plotly_go()
    fig = go.Figure()
    for method in METHODS:
        fig.add_scatter(x=sim["k"], y=sim["mean_error"][method], mode="lines+markers",
                        name=f"MVUE {method}: mean of k draws",
                        line={"color": COLORS[method]})
        fig.add_scatter(x=sim["k"], y=sim["mean_error_theory"][method], mode="lines", name=f"sqrt(V / k), {method}",
                        line={"color": COLORS[method], "dash": "dot"})
    fig.add_scatter(x=sim["k"], y=[sim["top2_error"]] * len(sim["k"]), mode="lines", name="top-2 (the same every draw)",
                    line={"color": COLORS["top2"], "dash": "dash"})
    fig.update_layout(title="||mean of k draws - x|| / ||x||: MVUE converges to x, top-2 stays biased",
                      xaxis={"type": "log", "title": "draws k"}, yaxis={"type": "log", "title": "relative error"},
                      height=440)
    return clean_log_ticks(fig)


def mvue_variance_figure(sim: dict):
    """Per-draw squared error ||d - x||^2: simulated bars with theory markers, against top-2's bias^2."""
    go = plotly_go()
    names = ["MVUE exact", "MVUE sequential", "top-2 (bias only)"]
    keys = ["exact", "sequential", "top2"]
    fig = go.Figure(go.Bar(x=names, y=[sim["squared_error"][k] for k in keys], name="simulated (mean over draws)",
                           marker_color=[COLORS[k] for k in keys]))
    fig.add_scatter(x=names[:2], y=[sim["squared_error_theory"][k] for k in keys[:2]], mode="markers",
                    name="theory: sum x^2 (1/p - 1)", marker={"symbol": "x", "size": 12, "color": "black"})
    fig.update_layout(title="error of one draw: MVUE pays for unbiasedness with variance", yaxis_title="||d - x||^2",
                      height=400)
    return clean_log_ticks(fig)


def inclusion_figure(sim: dict, groups: int = 4):
    """Inclusion probability p_i against the fraction of draws that kept entry i (first ``groups`` groups)."""
    go = plotly_go()
    n = min(4 * groups, len(sim["p"]["exact"]))
    labels = [f"g{i // 4} x{i % 4}" for i in range(n)]
    fig = go.Figure()
    for method in METHODS:
        fig.add_bar(x=labels, y=sim["keep_frequency"][method][:n].tolist(), name=f"kept fraction, {method}",
                    marker_color=COLORS[method], offsetgroup=method)
        # offsetgroup + scattermode "group": each p marker sits on its own method's bar
        fig.add_scatter(x=labels, y=sim["p"][method][:n].tolist(), mode="markers", name=f"p, {method}", offsetgroup=method,
                        marker={"symbol": "line-ew-open", "size": 14, "color": "black", "line": {"width": 2}})
    fig.update_layout(barmode="group", scattermode="group", title="each entry is kept with its inclusion probability p_i",
                      yaxis={"title": "probability", "range": [0, 1.05]}, height=400)
    return clean_log_ticks(fig)
