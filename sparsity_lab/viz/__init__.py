"""Figures and widgets the notebooks show. plotly and ipywidgets are the optional ``lab`` extra:
they are imported when a figure is made, with a clear error when missing."""
from .block_mask_view import block_mask_figure, mask_changes, prune_regrow_explorer, prune_regrow_trace
from .dyad_view import dyad_explorer, dyad_figure, dyad_structure

__all__ = ["block_mask_figure", "dyad_explorer", "dyad_figure", "dyad_structure", "mask_changes",
           "prune_regrow_explorer", "prune_regrow_trace"]
