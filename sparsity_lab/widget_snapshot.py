"""Static snapshots of plotly FigureWidgets, for the book.

A FigureWidget sends its traces to the browser as messages, so the widget state that a saved notebook
keeps has its layout but no data (and 5 MB of widget JavaScript): a static page would draw an empty
plot. When the course is executed for the book, :func:`register` (run inside the kernel) adds a
``text/html`` bundle to every displayed widget that holds FigureWidgets: each figure as plotly HTML,
as first drawn, with a line naming the controls that are live in JupyterLab. The book shows that
bundle (``sparsity_lab.course.book_notebook``); JupyterLab keeps showing the live widget.
"""
from __future__ import annotations

import html
from typing import Iterator

# What the kernel runs first when the course is executed (papermill passes it to ipykernel).
KERNEL_LINE = "import sparsity_lab.widget_snapshot as _snapshot; _snapshot.register()"


def figure_widgets(widget) -> Iterator:
    """The plotly FigureWidgets in ``widget`` and, depth first, in its children."""
    from plotly.graph_objects import FigureWidget

    if isinstance(widget, FigureWidget):
        yield widget
        return
    for child in getattr(widget, "children", ()) or ():
        yield from figure_widgets(child)


def control_names(widget) -> list[str]:
    """Descriptions of the value controls (sliders, dropdowns, ...) in ``widget`` and its children."""
    names = [widget.description] if getattr(widget, "description", "") and hasattr(widget, "value") else []
    for child in getattr(widget, "children", ()) or ():
        names += control_names(child)
    return names


def static_html(widget) -> str | None:
    """HTML of every FigureWidget in ``widget`` (plotly.js not included: the page loads it), or None
    when it holds none (IPython then adds no text/html bundle)."""
    import plotly.graph_objects as go
    import plotly.io as pio

    figures = list(figure_widgets(widget))
    if not figures:
        return None
    parts = []
    for fig in figures:
        still = go.Figure(fig)
        still.layout.width = None  # the page's column sets the width (a widget's fixed width overflows it)
        parts.append(pio.to_html(still, include_plotlyjs=False, full_html=False, config={"responsive": True}))
    controls = control_names(widget)
    live = f" (controls: {html.escape(', '.join(controls))})" if controls else ""
    note = (f"<p><em>Interactive when the notebook runs in JupyterLab{live}; "
            "this page shows the figure as first drawn.</em></p>")
    return note + "\n".join(parts)


def register(shell=None) -> None:
    """Make IPython add :func:`static_html` as the text/html of every displayed ipywidget."""
    import ipywidgets

    shell = shell or __import__("IPython").get_ipython()
    if shell is None:
        raise RuntimeError("register() runs inside an IPython kernel")
    shell.display_formatter.formatters["text/html"].for_type(ipywidgets.Widget, static_html)
