"""Why a 2:4 product gains about 1.5x and not 2x: the roofline of one product on an H100 (notebook 08).

A product ``A @ B`` with ``A`` (m, k) the 2:4 weight and ``B`` (k, n) dense, output (m, n), bf16. Its time on
the roofline is ``max(FLOPs / peak, bytes / bandwidth)``: the GPU can do no better than its arithmetic rate
or its memory rate allows. The sparse tensor cores double the peak; the compressed weight moves 9/16 of its
dense bytes (half the values plus 2 bits of metadata per kept value); ``B`` and the output move in full.

The H100 figures are NVIDIA's datasheet values for the H100 SXM5: 132 SMs, 4096 dense bf16 FLOP per SM per
clock (the datasheet's dense peak at 1.83 GHz, twice that with 2:4 sparsity) and 3.35 TB/s of HBM3. The peak scales with the SM
clock, which the 700 W power cap lowers under sustained load (``results/ffn_baseline_NOTES.md``).
"""
from __future__ import annotations

from ._optional import plotly_go

SMS = 132
FLOP_PER_CLOCK_PER_SM = 4096       # dense bf16 tensor-core FLOP per SM per clock (H100)
DATASHEET_CLOCK_GHZ = 1.83         # the clock of the datasheet's dense bf16 peak
HBM_TB_PER_S = 3.35                # HBM3 bandwidth, TB/s
BYTES_PER_VALUE = 2                # bf16
METADATA_BITS_PER_KEPT = 2         # the index of a kept value inside its group of four


def peak_tflops(sparse: bool = False, clock_ghz: float = DATASHEET_CLOCK_GHZ) -> float:
    """Tensor-core peak in TFLOP/s (dense-equivalent FLOPs for ``sparse``) at an SM clock in GHz."""
    if clock_ghz <= 0:
        raise ValueError(f"clock_ghz must be positive, got {clock_ghz!r}")
    return SMS * FLOP_PER_CLOCK_PER_SM * clock_ghz * 1e9 * (2 if sparse else 1) / 1e12


def _check_shape(m, k, n) -> None:
    if not all(isinstance(v, int) and v > 0 for v in (m, k, n)) or k % 4:
        raise ValueError(f"m, k, n must be positive integers with k a multiple of 4, got {(m, k, n)}")


def product_bytes(m: int, k: int, n: int, sparse: bool, operand_bytes: int = BYTES_PER_VALUE) -> dict:
    """Bytes one product moves at least once: {"weight", "dense_operand", "output", "total"}.

    The 2:4 weight keeps m*k/2 values (2 bytes each) and 2 bits of metadata per kept value: 9/16 of the
    dense weight's 2*m*k bytes. ``operand_bytes``: bytes per value of the two operands (1 for FP8); the
    output stays bf16."""
    _check_shape(m, k, n)
    if operand_bytes not in (1, 2, 4):
        raise ValueError(f"operand_bytes must be 1, 2 or 4, got {operand_bytes!r}")
    weight = operand_bytes * m * k
    if sparse:
        kept = m * k // 2
        weight = operand_bytes * kept + kept * METADATA_BITS_PER_KEPT // 8
    parts = {"weight": weight, "dense_operand": operand_bytes * k * n, "output": BYTES_PER_VALUE * m * n}
    return {**parts, "total": sum(parts.values())}


def intensity(m: int, k: int, n: int, sparse: bool) -> float:
    """Arithmetic intensity in FLOP per byte: the product's 2*m*k*n (dense-equivalent) FLOPs per byte moved."""
    return 2 * m * k * n / product_bytes(m, k, n, sparse)["total"]


def roofline_ms(m: int, k: int, n: int, sparse: bool, clock_ghz: float = DATASHEET_CLOCK_GHZ) -> float:
    """The product's time on the roofline, in ms: max(FLOPs / peak, bytes / bandwidth)."""
    compute_s = 2 * m * k * n / (peak_tflops(sparse, clock_ghz) * 1e12)
    memory_s = product_bytes(m, k, n, sparse)["total"] / (HBM_TB_PER_S * 1e12)
    return 1e3 * max(compute_s, memory_s)


def recorded_products(calls: dict) -> list[dict]:
    """The recorded single products (``results/cusparselt_calls_h100.json``, graph-replayed times) against
    the roofline: measured and roofline ms, dense and 2:4, and the share of its peak each kernel reached."""
    rows = []
    for r in calls["rows"]:
        m, k, n = r["m"], r["k"], r["n"]
        dense_ms, sparse_ms = r["graph_ms"]["dense"], r["graph_ms"]["direct_call"]
        flops = 2 * m * k * n
        rows.append({"shape": f"{m}x{k}x{n}", "m": m, "k": k, "n": n, "gflop": flops / 1e9,
                     "dense_ms": dense_ms, "sparse_ms": sparse_ms, "speedup": dense_ms / sparse_ms,
                     "roof_speedup": roofline_ms(m, k, n, False) / roofline_ms(m, k, n, True),
                     "dense_of_peak": flops / (dense_ms * 1e9) / peak_tflops(False),
                     "sparse_of_peak": flops / (sparse_ms * 1e9) / peak_tflops(True),
                     "dense_intensity": intensity(m, k, n, False), "sparse_intensity": intensity(m, k, n, True)})
    return rows


def roofline_figure(rows: list[dict], clock_ghz: float = DATASHEET_CLOCK_GHZ):
    """Log-log roofline of the H100 (dense and 2:4 roofs) with the recorded products' achieved rates."""
    go = plotly_go()
    fig = go.Figure()
    xs = [10 ** (i / 8) for i in range(0, 33)]  # 1 to 10^4 FLOP per byte
    for sparse, name, dash in ((False, "dense roof", "solid"), (True, "2:4 roof", "dash")):
        peak = peak_tflops(sparse, clock_ghz)
        fig.add_scatter(x=xs, y=[min(peak, x * HBM_TB_PER_S) for x in xs], mode="lines", name=name,
                        line={"dash": dash, "color": "grey"})
    for key, name, symbol in (("dense", "dense, recorded", "circle"), ("sparse", "2:4, recorded", "diamond")):
        fig.add_scatter(x=[r[f"{key}_intensity"] for r in rows],
                        y=[r["gflop"] / r[f"{key}_ms"] for r in rows], mode="markers", name=name,
                        marker={"symbol": symbol, "size": 9}, text=[r["shape"] for r in rows],
                        hovertemplate="%{text}<br>%{x:.0f} FLOP/byte<br>%{y:.0f} TFLOP/s<extra></extra>")
    ticks = [1, 10, 100, 1000, 10000]
    fig.update_layout(title="H100 roofline: attainable TFLOP/s and the recorded products",
                      xaxis={"title": "arithmetic intensity (FLOP per byte)", "type": "log", "tickvals": ticks,
                             "ticktext": [f"{t:,}" for t in ticks]},
                      yaxis={"title": "TFLOP/s (2:4: dense-equivalent)", "type": "log",
                             "tickvals": [10, 30, 100, 300, 1000, 2000], "ticktext": ["10", "30", "100", "300",
                                                                                      "1,000", "2,000"]},
                      template="plotly_white", height=440, legend={"orientation": "h", "y": -0.25})
    return fig


# how a reader reads a section of a benchmarks ffn recording's GPU conditions (their names start so)
_SECTION_WORDS = {"baseline": "the dense baseline", "grid": "the shape grid", "paired": "dense and 2:4 timed in turns",
                  "graph": "CUDA-graph replays", "gpt": "the GPT step"}


def sustained_load(conditions: dict, min_samples: int = 10) -> dict:
    """The section of a recording's sampled GPU conditions (``benchmarks ffn``'s ``conditions``) under the
    heaviest sustained load: the highest median power among the sections with at least ``min_samples``
    samples (a section of two or three samples says little). Returns ``{"section", "what", "samples",
    "sm_mhz", "power_w"}`` (medians), ``what`` the section in a reader's words."""
    if not isinstance(min_samples, int) or min_samples < 1:
        raise ValueError(f"min_samples must be an integer >= 1, got {min_samples!r}")
    sections = {name: s for name, s in (conditions or {}).get("sections", {}).items()
                if s.get("samples", 0) >= min_samples}
    if not sections:
        raise ValueError(f"no section of the recorded conditions has {min_samples} samples or more")
    name, busy = max(sections.items(), key=lambda kv: kv[1]["power_w"]["median"])
    first, _, rest = name.partition(" ")
    what = _SECTION_WORDS.get(first, first) + (f" at {rest.replace('x', ' x ')}" if rest and "x" in rest else "")
    return {"section": name, "what": what, "samples": busy["samples"], "sm_mhz": busy["sm_mhz"]["median"],
            "power_w": busy["power_w"]["median"]}
