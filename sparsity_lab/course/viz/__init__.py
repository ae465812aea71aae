"""Figures and widgets the notebooks show. plotly and ipywidgets are the optional ``lab`` extra:
they are imported when a figure is made, with a clear error when missing.

One module per notebook topic; the names below are the entry points a notebook calls (each module
has more helpers):

    mask_view            01  mask_explorer, kept_magnitude_figure
    tile_solver_view     02  tile_editor, solver_bars, diversity_figure
    decay_view           03  decay_explorer, curves_figure, decay_search_figure
    finetune_view        04  finetune_figure
    flip_band_view       03, 04  flip_band_figure, late_flip_figure (flip rates over seeds)
    soft_threshold_view  05  soft_threshold_explorer, beta_figure
    mvue_view, fp8_view  06  mvue_convergence_figure, fp8_explorer
    kernel_bench_view    07  kernel_bench_figure
    speedup_view         08  ffn_speedup_figure, ffn_wins_heatmap, ours_vs_pytorch_figure
    comparison_view      09  comparison_explorer, find_comparisons
    dyad_view            10  dyad_explorer
    block_mask_view      11  prune_regrow_explorer

and ``clean_log_ticks(fig)``, which any notebook's own plotly figure can call for readable log axes.
"""
from ._axes import clean_log_ticks
from .block_mask_view import block_mask_figure, mask_changes, prune_regrow_explorer, prune_regrow_trace
from .comparison_view import comparison_explorer, find_comparisons
from .decay_view import curves_figure, decay_explorer, decay_search_figure
from .dyad_view import dyad_explorer, dyad_figure, dyad_structure
from .finetune_view import finetune_figure
from .flip_band_view import flip_band_figure, late_flip_figure
from .fp8_view import fp8_explorer
from .kernel_bench_view import kernel_bench_figure
from .mask_view import kept_magnitude_figure, mask_explorer
from .mvue_view import mvue_convergence_figure
from .soft_threshold_view import beta_figure, soft_threshold_explorer
from .speedup_view import ffn_speedup_figure, ffn_wins_heatmap, ours_vs_pytorch_figure, paired_figure
from .tile_solver_view import diversity_figure, solver_bars, tile_editor

__all__ = ["beta_figure", "block_mask_figure", "clean_log_ticks", "comparison_explorer", "curves_figure", "decay_explorer",
           "decay_search_figure", "diversity_figure", "dyad_explorer", "dyad_figure", "dyad_structure",
           "ffn_speedup_figure", "ffn_wins_heatmap", "find_comparisons", "finetune_figure", "flip_band_figure", "fp8_explorer",
           "kept_magnitude_figure", "kernel_bench_figure", "late_flip_figure", "mask_changes", "mask_explorer",
           "mvue_convergence_figure", "ours_vs_pytorch_figure", "paired_figure", "prune_regrow_explorer", "prune_regrow_trace",
           "soft_threshold_explorer", "solver_bars", "tile_editor"]
