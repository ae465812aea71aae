"""Imports of the optional plotting stack, with an error that says how to install it."""
from __future__ import annotations


def plotly_go():
    try:
        import plotly.graph_objects as go
    except ImportError as err:
        raise ImportError("figures need plotly: pip install 'sparsity-lab[lab]'") from err
    return go


def ipywidgets():
    try:
        import ipywidgets as widgets
    except ImportError as err:
        raise ImportError("widgets need ipywidgets and anywidget: pip install 'sparsity-lab[lab]'") from err
    return widgets
