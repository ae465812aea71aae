"""Clean ticks on log axes: powers of ten where the data spans two decades or more.

Plotly labels a log axis with intermediate digits ("2", "5") between the decades, which crowd a
narrow panel and read as clutter. ``clean_log_ticks`` labels such axes at every power of ten
(``10^-3``, ``10^-2``, ...) and leaves narrower axes to plotly's 1-2-5 labels, which are clean there.
"""
from __future__ import annotations

import math


def _axis_name(ref: str | None, letter: str) -> str:
    """'x2' -> 'xaxis2', None / 'x' -> 'xaxis'."""
    ref = ref or letter
    return f"{letter}axis{ref[1:]}"


def clean_log_ticks(fig):
    """Return ``fig`` with every log axis whose data spans >= 2 decades labelled at powers of ten."""
    spans: dict[str, list[float]] = {}
    for trace in fig.data:
        for letter in ("x", "y"):
            values = getattr(trace, letter, None)
            if values is None:
                continue
            name = _axis_name(getattr(trace, f"{letter}axis", None), letter)
            positive = [float(v) for v in values if isinstance(v, (int, float)) and v > 0 and math.isfinite(v)]
            spans.setdefault(name, []).extend(positive)
    for name, values in spans.items():
        axis = fig.layout[name] if name in fig.layout else None
        if axis is None or axis.type != "log" or not values:
            continue
        if math.log10(max(values) / min(values)) >= 2:
            axis.update(dtick=1, exponentformat="power", minor={"showgrid": False})
    return fig
