"""Clean ticks on log axes: every label a number a reader can read on its own.

Plotly labels a log axis with bare intermediate digits between the decades ("3 4 5 ... 9 0.01 2 3"),
where only the decade says what the "3" means. ``clean_log_ticks`` labels an axis whose data spans
two decades or more at every power of ten (``10^-3``, ``10^-2``, ...), and a narrower one at the
1-2-5 values inside the data's range (1, 2, 5, 10, 20, ...), each written out in full ("0.003").
"""
from __future__ import annotations

import math


def _axis_name(ref: str | None, letter: str) -> str:
    """'x2' -> 'xaxis2', None / 'x' -> 'xaxis'."""
    ref = ref or letter
    return f"{letter}axis{ref[1:]}"


def _ticks(lo: float, hi: float) -> list[float]:
    """The 1-2-5 values in [lo, hi] (0 < lo <= hi), every digit 1-9 where that gives fewer than three."""
    for digits in ((1, 2, 5), tuple(range(1, 10))):
        values = [float(f"{d}e{k}") for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                  for d in digits if lo <= float(f"{d}e{k}") <= hi]
        if len(values) >= 3:
            return values
    return values


def _label(value: float) -> str:
    """0.003 -> '0.003', 2e-05 -> '2e-05', 1500.0 -> '1500'."""
    return format(value, "g")


def clean_log_ticks(fig):
    """Return ``fig`` with every log axis labelled by whole numbers: powers of ten where the data spans
    >= 2 decades, the 1-2-5 values in its range otherwise."""
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
        lo, hi = min(values), max(values)
        if math.log10(hi / lo) >= 2:
            axis.update(dtick=1, exponentformat="power", minor={"showgrid": False})
        else:
            ticks = _ticks(lo, hi)
            if len(ticks) >= 2:  # a flatter axis keeps plotly's own labels
                axis.update(tickmode="array", tickvals=ticks, ticktext=[_label(v) for v in ticks])
    return fig
