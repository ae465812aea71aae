"""Static snapshots of FigureWidgets for the book, and how the book copy of a notebook uses them."""
import json

import pytest

go = pytest.importorskip("plotly.graph_objects", reason="plotly is in the test extra")
widgets = pytest.importorskip("ipywidgets", reason="ipywidgets is in the test extra")
import nbformat  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

from sparsity_lab.course import PLOTLY_JSON, WIDGET_STATE, WIDGET_VIEW, book_notebook  # noqa: E402
from sparsity_lab.course.widget_snapshot import control_names, figure_widgets, readout, register, static_html  # noqa: E402


def explorer():
    fig = go.FigureWidget(go.Scatter(x=[0, 1, 2], y=[7.25, 3.5, 1.125], name="selected run"))
    slider = widgets.FloatSlider(description="decay", value=0.1)
    return widgets.VBox([slider, widgets.HBox([widgets.Dropdown(options=[1, 2], description="block"), fig])]), fig


def test_finds_nested_figures_and_controls():
    box, fig = explorer()
    assert list(figure_widgets(box)) == [fig]
    assert control_names(box) == ["decay", "block"]


def test_snapshot_is_the_figure_as_plotly_html_with_its_data():
    box, _ = explorer()
    page = static_html(box)
    assert page.count('class="plotly-graph-div"') == 1 and "Plotly.newPlot(" in page
    assert "7.25" in page and "selected run" in page, "the trace data must be in the snapshot"
    assert "controls: decay, block" in page
    assert "decay</span>: 0.10" in page and "block</span>: 1" in page, "each control's readout is shown"
    assert "plotly.min.js" not in page and "cdn.plot.ly" not in page, "the page itself loads plotly.js"


def test_snapshot_keeps_the_widget_layout_readouts_and_texts_in_order():
    fig = go.FigureWidget(go.Scatter(y=[1, 2]), layout={"width": 1200, "height": 300})
    box = widgets.VBox([widgets.HBox([widgets.SelectionSlider(options=[("1e-04", 1e-4), ("1e-03", 1e-3)],
                                                              description="decay"),
                                      widgets.IntSlider(value=7, description="seed")]),
                        fig, widgets.HTML("<b>flip rate 0.25</b>"), widgets.Label("a <label>")])
    page = static_html(box)
    order = [page.index(s) for s in ("decay</span>: 1e-04", "seed</span>: 7", "plotly-graph-div",
                                     "<b>flip rate 0.25</b>", "a &lt;label&gt;")]
    assert order == sorted(order), "the snapshot keeps the widget's order"
    assert '<div class="sl-row">' in page, "an HBox stays a row"
    assert '"width":1200' not in page.replace(" ", "") and '"responsive": true' in page, \
        "the figure fills the column instead of keeping the widget's fixed width"


@pytest.mark.parametrize("widget, shown", [
    (lambda: widgets.FloatSlider(value=0.125), "0.12"),
    (lambda: widgets.FloatLogSlider(value=3e-5, min=-6, max=0), "3e-05"),
    (lambda: widgets.IntRangeSlider(value=(2, 5)), "2 to 5"),
    (lambda: widgets.Dropdown(options=[("E4M3 (forward)", "e4m3")]), "E4M3 (forward)"),
    (lambda: widgets.Checkbox(value=True), "True"),
])
def test_readout_is_what_the_control_shows(widget, shown):
    assert readout(widget()) == shown


def test_widgets_without_figures_get_no_snapshot():
    assert static_html(widgets.VBox([widgets.IntSlider(description="k")])) is None


def test_register_adds_the_snapshot_to_what_ipython_displays():
    shell = InteractiveShell.instance()
    register(shell)
    box, _ = explorer()
    data, _meta = shell.display_formatter.format(box)
    assert WIDGET_VIEW in data and 'class="plotly-graph-div"' in data["text/html"]
    plain, _ = shell.display_formatter.format(widgets.IntSlider())
    assert "text/html" not in plain


def _model(refs=(), **state):
    state.update({f"child{i}": f"IPY_MODEL_{r}" for i, r in enumerate(refs)})
    return {"model_module": "m", "model_name": "M", "model_module_version": "1", "state": state}


def test_book_copy_shows_snapshots_and_keeps_only_the_widget_state_it_uses():
    nb = nbformat.v4.new_notebook()
    snap = nbformat.v4.new_output("display_data", data={WIDGET_VIEW: {"model_id": "aa"}, "text/html": "<div>f</div>"})
    live = nbformat.v4.new_output("display_data", data={WIDGET_VIEW: {"model_id": "bb"}, "text/plain": "w"})
    fig = nbformat.v4.new_output("display_data", data={PLOTLY_JSON: {}, "text/html": "<div>g</div>"})
    nb.cells = [nbformat.v4.new_code_cell("x", outputs=[snap, live, fig])]
    nb.metadata["widgets"] = {WIDGET_STATE: {"version_major": 2, "version_minor": 0, "state": {
        "aa": _model(["a1"], _esm="x" * 1000), "a1": _model(), "bb": _model(["b1"]), "b1": _model(["b2"]),
        "b2": _model(), "cc": _model()}}}
    shown = book_notebook(nb)
    outputs = [c for c in shown.cells if c.cell_type == "code"][0].outputs
    assert list(outputs[0]["data"]) == ["text/html"]
    assert WIDGET_VIEW in outputs[1]["data"], "a widget without a snapshot stays live"
    assert list(outputs[2]["data"]) == ["text/html"]
    assert set(shown.metadata["widgets"][WIDGET_STATE]["state"]) == {"bb", "b1", "b2"}
    assert "_esm" not in json.dumps(shown.metadata["widgets"])


def test_book_copy_drops_the_widget_state_when_no_live_widget_is_left():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x", outputs=[nbformat.v4.new_output(
        "display_data", data={WIDGET_VIEW: {"model_id": "aa"}, "text/html": "<div>f</div>"})])]
    nb.metadata["widgets"] = {WIDGET_STATE: {"version_major": 2, "version_minor": 0, "state": {"aa": _model()}}}
    assert "widgets" not in book_notebook(nb).metadata
