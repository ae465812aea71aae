"""Log axes of the course's figures: powers of ten where the data spans two decades or more."""
import pytest

pytest.importorskip("plotly", reason="plotly is in the lab extra")
import plotly.graph_objects as go  # noqa: E402
from plotly.subplots import make_subplots  # noqa: E402

from sparsity_lab.course.viz._axes import clean_log_ticks  # noqa: E402


def test_wide_log_axes_get_a_tick_per_decade_and_narrow_ones_keep_plotlys():
    fig = make_subplots(rows=1, cols=2)
    fig.add_trace(go.Scatter(x=[1, 2, 3], y=[1e-5, 1e-3, 1.0]), row=1, col=1)
    fig.add_trace(go.Scatter(x=[1, 2, 3], y=[0.003, 0.01, 0.02]), row=1, col=2)
    fig.update_yaxes(type="log")
    clean_log_ticks(fig)
    assert fig.layout.yaxis.dtick == 1 and fig.layout.yaxis.exponentformat == "power"
    assert fig.layout.yaxis2.dtick is None and fig.layout.xaxis.dtick is None
    # the narrow axis: full numbers at 1-2-5, not plotly's bare digits "3 4 ... 9 0.01 2"
    assert list(fig.layout.yaxis2.tickvals) == [0.005, 0.01, 0.02]
    assert list(fig.layout.yaxis2.ticktext) == ["0.005", "0.01", "0.02"]


def test_a_narrow_log_axis_gets_every_digit_when_1_2_5_gives_too_few():
    fig = go.Figure(go.Scatter(x=[1, 2], y=[0.0041, 0.0089]), layout={"yaxis_type": "log"})
    clean_log_ticks(fig)
    assert list(fig.layout.yaxis.ticktext) == ["0.005", "0.006", "0.007", "0.008"]


def test_the_notebook_figures_use_it():
    from sparsity_lab.course.viz.fp8_training_view import scaling_figure
    rows = [{"step": t, "amax_x": 1.0 + t, "range_x": 2.0 + t, "scales": [1e-6, 1e-3, 1.0, 10.0]} for t in range(4)]
    fig = scaling_figure({"delayed": rows})
    assert any(getattr(fig.layout[a], "dtick", None) == 1 for a in ("yaxis", "yaxis2"))
    from sparsity_lab.course.viz.fp8_view import fp8_figure, sample_tensor
    fig, _ = fp8_figure(sample_tensor("normal", 256), "e4m3", "amax", 0)
    assert fig.layout.yaxis2.dtick == 1 or fig.layout.yaxis2.tickvals, "the explorer's relative-error axis"
