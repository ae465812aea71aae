"""FP8 (E4M3 / E5M2) rounding and per-tensor scaling, made visible.

A format's representable values form a grid that is uniform on a log scale within each power of
two (8 values per binade for E4M3's 3 mantissa bits, 4 for E5M2's 2), from the smallest subnormal
to the largest finite value. A per-tensor scale slides the tensor onto that grid:

    q = fp8(clamp(x / scale, -fp8_max, fp8_max)),  x_hat = q * scale
    current-amax scaling: scale = amax / fp8_max   (``sparsity_lab.references.fp8``; amax = max |x|)

This module draws the grid in the tensor's units next to the tensor's magnitudes and the error of
every element. The quantization itself is ``sparsity_lab.references.fp8``; here a scale may also be set by
hand (amax times 2^k, or a fixed 2^k) to see what a wrong scale does.
"""
from __future__ import annotations

import math

import torch

from ...references.fp8 import dequantize_fp8, fp8_format, quantize_with_inv_scale, scales_from_amax
from ...references.fp8 import amax as tensor_amax
from ._optional import ipywidgets, plotly_go
from ._axes import clean_log_ticks

SAMPLES = {
    "normal": "normal, std 1",
    "small": "gradient-like: normal, std 1e-6",
    "outlier": "normal, std 1, one entry 1e4",
    "heavy": "heavy-tailed: Student t, 2 degrees of freedom",
}
SCALINGS = ("amax", "fixed")
MANTISSA_BITS = {"e4m3": 3, "e5m2": 2}
# x * inv_scale is a float32 product: at x = amax it can land a rounding above fp8_max. Such an entry is
# not "clipped" (it rounds to fp8_max anyway); only entries beyond a few float32 ulps are counted.
CLIP_SLACK = 1 + 2.0 ** -20


def sample_tensor(kind: str = "normal", n: int = 4096, seed: int = 0) -> torch.Tensor:
    """A 1-D float32 sample of ``n`` values of one of the kinds in ``SAMPLES``."""
    if kind not in SAMPLES:
        raise ValueError(f"kind must be one of {sorted(SAMPLES)}, got {kind!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an int >= 2, got {n!r}")
    gen = torch.Generator().manual_seed(seed)
    if kind == "heavy":
        return _student_t(n, 2, gen)
    x = torch.randn(n, generator=gen)
    if kind == "small":
        return x * 1e-6
    if kind == "outlier":
        x[0] = 1e4
    return x


def _student_t(n: int, dof: int, gen: torch.Generator) -> torch.Tensor:
    """Student t draws from a seeded generator: z / sqrt(chi2 / dof), chi2 a sum of dof squared normals."""
    z = torch.randn(n, generator=gen)
    chi2 = (torch.randn(n, dof, generator=gen) ** 2).sum(1)
    return z / torch.sqrt(chi2 / dof)


def fp8_grid(fmt: str) -> torch.Tensor:
    """All positive finite values of the format, ascending (float64), read off its 256 bit patterns."""
    dtype, _ = fp8_format(fmt)
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).double()
    return values[torch.isfinite(values) & (values > 0)].unique()


def format_facts(fmt: str) -> dict:
    """{"max", "min_normal", "min_subnormal", "positive_values", "mantissa_bits", "binades"} of the format."""
    grid = fp8_grid(fmt)
    bits = MANTISSA_BITS[fmt]
    subnormals = 2 ** bits - 1  # the values below the smallest normal
    return {"max": float(grid[-1]), "min_normal": float(grid[subnormals]), "min_subnormal": float(grid[0]),
            "positive_values": grid.numel(), "mantissa_bits": bits,
            "binades": math.log2(float(grid[-1]) / float(grid[0]))}


def quantize_report(x: torch.Tensor, fmt: str = "e4m3", scaling: str = "amax", shift: int = 0) -> dict:
    """Quantize x to FP8 with a per-tensor scale and measure the error.

    scaling "amax": scale = (amax * 2^shift) / fp8_max (shift = 0 is ``sparsity_lab.references.fp8.quantize_fp8``);
    "fixed": scale = 2^shift (shift = 0: a plain cast, no scaling).
    Returns {"scale", "inv_scale", "amax", "x_hat" (float32, like x), "clipped" (entries with |x| / scale
    above fp8_max, saturated; float32 rounding at amax itself does not count), "flushed" (non-zero entries
    that became 0), "rel_rms" ||x_hat - x|| / ||x||,
    "snr_db", "median_rel" (the median over non-zero entries of |x_hat - x| / |x|: the typical element,
    which a norm dominated by a few large entries hides), "distinct" (FP8 codes used), "n"}.
    """
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point or x.numel() == 0:
        raise ValueError("x must be a non-empty floating-point tensor")
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    if isinstance(shift, bool) or not isinstance(shift, int) or abs(shift) > 60:
        raise ValueError(f"shift must be an int in [-60, 60] (a power of two), got {shift!r}")
    _, fmax = fp8_format(fmt)
    a = tensor_amax(x)
    if scaling == "amax":
        scale, inv_scale = scales_from_amax(a * 2.0 ** shift, fmt)
    else:
        scale = torch.tensor(2.0 ** shift, dtype=torch.float32)
        inv_scale = torch.tensor(2.0 ** -shift, dtype=torch.float32)
    q = quantize_with_inv_scale(x, inv_scale, fmt)
    x_hat = dequantize_fp8(q, scale, torch.float32)
    xf = x.float()
    err = float((x_hat - xf).double().norm())
    norm = float(xf.double().norm())
    nz = xf != 0
    median_rel = float(((x_hat - xf).abs()[nz] / xf.abs()[nz]).median()) if bool(nz.any()) else 0.0
    return {"scale": float(scale), "inv_scale": float(inv_scale), "amax": float(a), "x_hat": x_hat,
            "clipped": int(((xf * inv_scale).abs() > fmax * CLIP_SLACK).sum()), "flushed": int(((xf != 0) & (x_hat == 0)).sum()),
            "rel_rms": err / norm if norm > 0 else 0.0,
            "snr_db": 20 * math.log10(norm / err) if err > 0 and norm > 0 else math.inf, "median_rel": median_rel,
            "distinct": int(q.view(torch.uint8).unique().numel()), "n": x.numel()}


def _summary(fmt: str, scaling: str, shift: int, report: dict) -> str:
    how = f"amax x 2^{shift} / fp8_max" if scaling == "amax" else f"fixed 2^{shift}"
    n = report["n"]
    return (f"{fmt.upper()}: scale = {report['scale']:.4g} ({how}); amax = {report['amax']:.4g}; "
            f"clipped {report['clipped']} of {n} ({report['clipped'] / n:.1%}), flushed to zero {report['flushed']} "
            f"({report['flushed'] / n:.1%}); relative RMS error {report['rel_rms']:.2%} (SNR {report['snr_db']:.1f} dB); "
            f"median relative error per element {report['median_rel']:.2%}; "
            f"{report['distinct']} distinct FP8 codes used")


def fp8_figure(x: torch.Tensor, fmt: str = "e4m3", scaling: str = "amax", shift: int = 0,
               max_points: int = 2000, widget: bool = False):
    """Top: histogram of log2 |x| with the format's grid (times the scale) as ticks and its limits as
    lines. Bottom: each element's relative error |x_hat - x| / |x| (log scale; exact ones are not drawn,
    flushed ones sit at 1). At most ``max_points`` elements in the bottom panel (the first ones).
    Returns (figure, :func:`quantize_report` of the same call)."""
    go = plotly_go()
    from plotly.subplots import make_subplots

    report = quantize_report(x, fmt, scaling, shift)
    facts = format_facts(fmt)
    xf = x.float().reshape(-1)
    nonzero = xf != 0
    logs = xf[nonzero].abs().double().log2()
    grid = (fp8_grid(fmt) * report["scale"]).log2()
    sample = xf[:max_points]
    hat = report["x_hat"].reshape(-1)[:max_points]
    keep = (sample != 0)
    rel = ((hat - sample).abs() / sample.abs())[keep].double()
    sx = sample[keep].abs().double().log2()
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.5, 0.5],
                        subplot_titles=("magnitudes of x and the FP8 grid (in x's units)", "relative error per element"))
    fig.add_trace(go.Histogram(x=logs.tolist(), nbinsx=80, name="log2 |x|", marker_color="#9ecae1"), row=1, col=1)
    fig.add_trace(go.Scatter(x=grid.tolist(), y=[0] * grid.numel(), mode="markers", name=f"{fmt.upper()} values x scale",
                             marker={"symbol": "line-ns-open", "size": 10, "color": "#d62728"}), row=1, col=1)
    fig.add_trace(go.Scatter(x=sx.tolist(), y=[v if v > 0 else None for v in rel.tolist()], mode="markers",
                             name="|x_hat - x| / |x|", marker={"size": 3, "color": "#1f77b4"}), row=2, col=1)
    fig.update_yaxes(type="log", row=2, col=1, title_text="relative error")
    fig.update_yaxes(title_text="count", row=1, col=1)
    fig.update_xaxes(title_text="log2 |x|", row=2, col=1)
    fig.update_layout(title=f"{fmt.upper()}, scale {report['scale']:.3g}: clipped {report['clipped']}, "
                            f"flushed {report['flushed']}, median relative error {report['median_rel']:.2%}",
                      shapes=_limit_lines(facts, report["scale"]), height=620, bargap=0.02)
    clean_log_ticks(fig)
    return (go.FigureWidget(fig) if widget else fig), report


def _limit_lines(facts: dict, scale: float) -> list[dict]:
    """Vertical lines (both panels) at the smallest subnormal, smallest normal and largest value, in x's units."""
    lines = []
    for key, color in (("min_subnormal", "#999"), ("min_normal", "#555"), ("max", "#d62728")):
        pos = math.log2(facts[key] * scale)
        lines.append({"type": "line", "xref": "x", "x0": pos, "x1": pos, "yref": "paper", "y0": 0, "y1": 1,
                      "line": {"dash": "dash", "color": color, "width": 1}})
    return lines


def fp8_explorer(kind: str = "normal", fmt: str = "e4m3", scaling: str = "amax", shift: int = 0, n: int = 4096):
    """Pick the format, the sample, the scaling and a power-of-two shift of the scale; see the grid
    against the tensor, the error of every element and a summary line."""
    widgets = ipywidgets()
    fmt_box = widgets.Dropdown(options=[("E4M3 (forward)", "e4m3"), ("E5M2 (gradients)", "e5m2")], value=fmt,
                               description="format")
    kind_box = widgets.Dropdown(options=[(label, key) for key, label in SAMPLES.items()], value=kind,
                                description="tensor", layout={"width": "420px"})
    scaling_box = widgets.Dropdown(options=[("current amax", "amax"), ("fixed 2^k", "fixed")], value=scaling,
                                   description="scale")
    shift_box = widgets.IntSlider(value=shift, min=-24, max=24, step=1, description="k (x 2^k)")
    samples: dict[str, torch.Tensor] = {}

    def sample(key: str) -> torch.Tensor:
        if key not in samples:
            samples[key] = sample_tensor(key, n)
        return samples[key]

    fig, report = fp8_figure(sample(kind), fmt, scaling, shift, widget=True)
    info = widgets.HTML(_summary(fmt, scaling, shift, report))

    def redraw(_change=None) -> None:
        new, rep = fp8_figure(sample(kind_box.value), fmt_box.value, scaling_box.value, shift_box.value)
        with fig.batch_update():
            for trace, fresh in zip(fig.data, new.data):
                trace.x, trace.y, trace.name = fresh.x, fresh.y, fresh.name
            fig.layout.title.text = new.layout.title.text
            fig.layout.shapes = new.layout.shapes
        info.value = _summary(fmt_box.value, scaling_box.value, shift_box.value, rep)

    for box in (fmt_box, kind_box, scaling_box, shift_box):
        box.observe(redraw, names="value")
    return widgets.VBox([widgets.HBox([fmt_box, scaling_box, shift_box]), kind_box, fig, info])
