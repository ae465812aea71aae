"""Static snapshots of plotly FigureWidgets, for the book.

A FigureWidget sends its traces to the browser as messages, so the widget state that a saved notebook
keeps has its layout but no data (and 5 MB of widget JavaScript): a static page would draw an empty
plot. When the course is executed for the book, :func:`register` (run inside the kernel) adds a
``text/html`` bundle to every displayed widget that holds FigureWidgets: the widget as first drawn,
in its own layout: each figure as plotly HTML filling the column, each control as a readout line
("decay: 1e-04", the value its slider or menu shows), each HTML or label widget with its text (the
summaries the prose refers to). The book shows that bundle (``sparsity_lab.course.book_page.book_notebook``);
JupyterLab keeps showing the live widget.
"""
from __future__ import annotations

import html
from typing import Iterator

# What the kernel runs first when the course is executed (papermill passes it to ipykernel).
KERNEL_LINE = "import sparsity_lab.course.widget_snapshot as _snapshot; _snapshot.register()"


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


def readout(widget) -> str:
    """The value ``widget`` shows beside its control: the selected option's label for menus and
    selection sliders, the value in the slider's ``readout_format`` for number sliders.

    >>> readout(ipywidgets.FloatSlider(value=0.125))   # readout_format ".2f"
    '0.12'
    """
    label = getattr(widget, "label", None)
    if label is not None:
        return str(label)
    value, fmt = widget.value, getattr(widget, "readout_format", None)
    values = value if isinstance(value, tuple) else (value,)
    try:
        shown = [format(v, fmt) for v in values] if fmt else [str(v) for v in values]
    except (TypeError, ValueError):  # a d3 format that Python does not share
        shown = [str(v) for v in values]
    return " to ".join(shown)


def _snapshot(widget) -> str:
    """HTML of ``widget`` and its children, in their order: figures, readouts and texts."""
    import ipywidgets
    from plotly.graph_objects import FigureWidget

    from .book_page import responsive_plotly_html

    if isinstance(widget, FigureWidget):
        return responsive_plotly_html(widget.to_dict())
    if isinstance(widget, ipywidgets.Box):
        row = isinstance(widget, ipywidgets.HBox)
        inner = "\n".join(part for part in map(_snapshot, widget.children) if part)
        return f'<div class="{"sl-row" if row else "sl-column"}">{inner}</div>' if inner else ""
    if isinstance(widget, (ipywidgets.HTML, ipywidgets.HTMLMath)):
        return f'<div class="sl-text">{widget.value}</div>' if widget.value else ""
    if isinstance(widget, ipywidgets.Label):
        return f'<div class="sl-text">{html.escape(widget.value)}</div>' if widget.value else ""
    if isinstance(widget, ipywidgets.ValueWidget) and getattr(widget, "description", ""):
        return (f'<div class="sl-readout"><span class="sl-control">{html.escape(widget.description)}</span>: '
                f'{html.escape(readout(widget))}</div>')
    return ""


def static_html(widget) -> str | None:
    """``widget`` as first drawn, as static HTML (plotly.js not included: the page loads it), or None
    when it holds no FigureWidget (IPython then adds no text/html bundle)."""
    if not any(True for _ in figure_widgets(widget)):
        return None
    controls = control_names(widget)
    live = f" (controls: {html.escape(', '.join(controls))})" if controls else ""
    note = (f'<p class="sl-note"><em>Interactive when the notebook runs in JupyterLab{live}; '
            "this page shows it as first drawn, with the values below.</em></p>")
    return f'<div class="sl-widget-snapshot">{note}\n{_snapshot(widget)}</div>'


def register(shell=None) -> None:
    """Make IPython add :func:`static_html` as the text/html of every displayed ipywidget."""
    import ipywidgets

    shell = shell or __import__("IPython").get_ipython()
    if shell is None:
        raise RuntimeError("register() runs inside an IPython kernel")
    shell.display_formatter.formatters["text/html"].for_type(ipywidgets.Widget, static_html)
