"""FP8 training made visible: the scales of a layer over the steps, and the recorded H100 run.

``scaling_figure`` draws what a training loop recorded per step (rows of dicts: ``step``, ``amax_x``
the largest |X| of the step, ``range_x`` the largest magnitude the step's X scale can represent,
``fp8_max * s_x``, and ``scales`` the layer's four scales after the step, in
``sparsity_lab.methods.fp8_scaling.TENSORS`` order) for one or more recipes side by side.
``recorded_summary`` reads the figures of ``results/fp8_training_h100.json`` that the course quotes.
``scale_placement_summary`` reads what the scale of an FP8 product costs where it is applied: after the
product (a pass over the output) or inside it (cuSPARSELt's host alpha, CUTLASS's epilogue).
"""
from __future__ import annotations

from pathlib import Path

from ...methods.fp8_scaling import TENSORS
from ...provenance import read_result
from ._axes import clean_log_ticks
from ._optional import plotly_go
from ._provenance import provenance_line

TARGET_SHAPE = (16384, 4096, 16384)  # (tokens, in, out) of the forward-product target
TENSOR_LABELS = {"x": "X (activations)", "w": "S(W) (2:4 weight)", "dz": "dZ (output gradient)",
                 "dz_mvue": "MVUE(dZ) (weight-gradient operand)"}


def _check_runs(runs: dict) -> None:
    if not isinstance(runs, dict) or not runs:
        raise ValueError("runs must be a non-empty dict {recipe label: list of per-step rows}")
    for label, rows in runs.items():
        if not rows or not all({"step", "amax_x", "range_x", "scales"} <= set(r) for r in rows):
            raise ValueError(f"runs[{label!r}] must be a non-empty list of rows with keys step, amax_x, range_x, scales")


def scaling_figure(runs: dict, delayed: str | None = None):
    """Left: X's amax per step against the range its scale covered (above the line: clipped).
    Right: the four scales of the run ``delayed`` (default: the first) over the steps, log scale."""
    _check_runs(runs)
    go = plotly_go()
    from plotly.subplots import make_subplots

    delayed = delayed if delayed is not None else next(iter(runs))
    if delayed not in runs:
        raise ValueError(f"delayed must be one of {list(runs)}, got {delayed!r}")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("X: its amax and the range its scale covers",
                                                        f"the four scales ({delayed})"))
    first = runs[delayed]
    steps = [r["step"] for r in first]
    fig.add_trace(go.Scatter(x=steps, y=[r["amax_x"] for r in first], name="amax of X", mode="lines+markers",
                             line={"color": "black"}), row=1, col=1)
    for label, rows in runs.items():
        fig.add_trace(go.Scatter(x=[r["step"] for r in rows], y=[r["range_x"] for r in rows], mode="lines",
                                 name=f"range of the X scale, {label}", line={"dash": "dot"}), row=1, col=1)
    for i, tensor in enumerate(TENSORS):
        fig.add_trace(go.Scatter(x=steps, y=[r["scales"][i] for r in first], mode="lines",
                                 name=f"scale of {TENSOR_LABELS[tensor]}"), row=1, col=2)
    fig.update_yaxes(type="log")
    fig.update_xaxes(title_text="optimizer step")
    # the legend below the axis titles, anchored by its top so that wrapping rows grow downwards
    fig.update_layout(height=500, margin={"b": 190}, legend={"orientation": "h", "y": -0.3, "yanchor": "top"})
    return clean_log_ticks(fig)


def recorded_summary(data: dict, ffn_data: dict | None = None) -> dict:
    """The figures the course quotes from a recorded ``fp8_training_h100`` result: where it was
    recorded, the forward product at the target shape, the FFN step's ratios and the targets.
    ffn_data: a later run whose FFN section replaces data's (its FFN targets too); ``ffn_where`` says
    where that one came from."""
    for name, d in (("data", data), ("ffn_data", ffn_data)):
        if d is not None and (not isinstance(d, dict) or "provenance" not in d):
            raise ValueError(f"{name} must be a recorded result (a dict with a 'provenance' block)")
    out = {"where": provenance_line(data["provenance"]), "targets": dict(data.get("judged", {}))}
    if ffn_data is not None and ffn_data.get("ffn"):
        out["ffn_where"] = provenance_line(ffn_data["provenance"])
        out["targets"].update({k: v for k, v in ffn_data.get("judged", {}).items() if k.startswith("ffn_")})
        data = {**data, "ffn": ffn_data["ffn"]}
    products = data.get("products") or []
    target = next((r for r in products if (r["tokens"], r["in"], r["out"]) == TARGET_SHAPE), None)
    out["forward"] = None if target is None else {
        k: target[k] for k in ("tokens", "in", "out", "fp8_dense_tflops", "bf16_dense_tflops", "fp8_24_vs_fp8_dense",
                               "fp8_24_vs_bf16_dense") if k in target}  # None: the target shape was not recorded
    if products:
        out["forward_all_shapes"] = [(r["tokens"], r["in"], r["out"], r["fp8_24_vs_fp8_dense"]) for r in products]
    ffn = data.get("ffn") or {}
    if ffn:
        out["ffn"] = {k: v for k, v in ffn.items() if k.startswith("fp8_24_vs") and not k.endswith("rounds")}
        out["ffn_tflops"] = {v: r["tflops"] for v, r in ffn.get("variants", {}).items()}
    return out


# --- does FP8 training keep the loss? ------------------------------------------------------------------
FP8_ACCURACY_VARIANTS = {"dense": "dense, bfloat16", "dense_fp8": "dense, FP8 (torch._scaled_mm)",
                         "sste_mvue": "S-STE + MVUE 2:4, bfloat16", "sste_mvue_fp8": "S-STE + MVUE 2:4, FP8 (cuSPARSELt)",
                         "sste_mvue_fp8sim": "S-STE + MVUE 2:4, FP8 simulated"}


def fp8_accuracy_summary(comparisons: list) -> dict:
    """Final validation losses of recorded FP8 comparisons (``sparsity-lab compare`` folders, one per seed,
    each a :class:`~sparsity_lab.course.viz.comparison_view.RecordedComparison`).

    Returns {"runs": [{"seed", "where", "final": {variant: loss}, "claim": claim 6 or None}], "spread":
    {variant: (min, max) over the seeds}, "labels": FP8_ACCURACY_VARIANTS}. A variant missing from a run is
    left out of that run's ``final``."""
    if not comparisons:
        raise ValueError("comparisons is empty: no recorded FP8 comparison was found")
    runs = []
    for comp in comparisons:
        table = {row["variant"]: row for row in comp.payload["table"]}
        final = {v: table[v]["final_val_loss"] for v in FP8_ACCURACY_VARIANTS
                 if v in table and table[v].get("final_val_loss") is not None}
        claim = next((c for c in comp.payload["claims"] if c["claim"].startswith("6.")), None)
        seed = next(iter(comp.payload.get("runs", {}).values()), {}).get("config", {}).get("seed")
        runs.append({"seed": seed, "where": provenance_line(comp.payload["provenance"]), "final": final,
                     "claim": claim, "folder": comp.name})
    spread = {}
    for v in FP8_ACCURACY_VARIANTS:
        vals = [r["final"][v] for r in runs if v in r["final"]]
        if vals:
            spread[v] = (min(vals), max(vals))
    return {"runs": runs, "spread": spread, "labels": FP8_ACCURACY_VARIANTS}


# --- where the scale of an FP8 product lives: a pass after it, or inside it ------------------------------
HOST_ALPHA_RUN = "fp8_training_host_alpha_h100"  # the FFN step, FP8 2:4 with the scale pass and with host alpha
CUTLASS_RUN = "cutlass_h200"                     # one product at a time: CUTLASS, cuSPARSELt, torch._scaled_mm
RECORDING = {  # the command that records each file on a GPU (docs/measuring.md has the full ones)
    HOST_ALPHA_RUN: "python -m benchmarks fp8-training --sections ffn,products "
                    "--ffn-variants bf16_dense,fp8_dense,fp8_24,fp8_24_host_alpha",
    CUTLASS_RUN: "python -m benchmarks cutlass"}
# the FFN's forward products at 16384 tokens x d_model 4096, hidden 16384, as cutlass_h200.json names them:
# D (m, n) = A (m, k) B (k, n), m out features, n tokens, k in features
FORWARD_PRODUCTS = {"up, X W1^T": (16384, 16384, 4096), "down, H W2^T": (4096, 16384, 16384)}


def scale_pass_bytes(m: int, n: int, bytes_in: int = 2, bytes_out: int = 2) -> int:
    """Bytes a separate scale pass over an (m, n) product output moves: each entry read once (``bytes_in``)
    and written once (``bytes_out``); bf16 in and out is 4 bytes per entry."""
    for name, v in (("m", m), ("n", n), ("bytes_in", bytes_in), ("bytes_out", bytes_out)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return m * n * (bytes_in + bytes_out)


def _recorded(name: str, directory: str | Path | None) -> dict:
    try:
        return read_result(name, None if directory is None else Path(directory))
    except FileNotFoundError:
        where = Path(directory) if directory is not None else "results"
        raise FileNotFoundError(f"{where}/{name}.json is not here: it is recorded on a GPU by "
                                f"`{RECORDING[name]}` (docs/measuring.md)") from None


def _field(data: dict, name: str, *keys):
    value = data
    for i, key in enumerate(keys):
        if not isinstance(value, dict) or key not in value:
            raise ValueError(f"{name}.json has no field {'.'.join(map(str, keys[:i + 1]))}: "
                             "not the result this summary reads")
        value = value[key]
    return value


def scale_placement_summary(directory: str | Path | None = None) -> dict:
    """What the scale pass costs against a scale inside the product, from two recorded results.

    ``ffn`` (``fp8_training_host_alpha_h100``, the FFN forward + backward at 16384 tokens x d_model 4096):
    ``gpu``, ``where``, the dense FP8 step's ``dense_ms`` and ``dense_tflops``, and the FP8 2:4 step's
    speed-up over it with the scale pass after each product (``scale_pass``) and with cuSPARSELt's host
    alpha (``host_alpha``), their times ``scale_pass_ms`` and ``host_alpha_ms``.
    ``products`` (``cutlass_h200``, one product at a time): ``gpu``, ``where`` and ``rows``, one per
    forward product of FORWARD_PRODUCTS: ``name``, ``m``, ``n``, ``k``, dense ``torch._scaled_mm``'s
    ``dense_tflops`` and speed-ups over it: cuSPARSELt with the pass (``cusparselt_pass``) and with the host
    alpha (``cusparselt_host_alpha``), CUTLASS with the scales read in its epilogue, best config with
    fast accumulation (``cutlass_fast``) and with promoted accumulators as ``_scaled_mm`` (``cutlass_promoted``);
    ``pass_ms`` and ``host_alpha_ms`` are cuSPARSELt's two times.
    directory: where the JSON files are (default: the recorded results shipped with the library). A missing
    file raises FileNotFoundError naming the command that records it; a missing field, ValueError."""
    ha = _recorded(HOST_ALPHA_RUN, directory)
    ratios = _field(ha, HOST_ALPHA_RUN, "ffn", "dense_ratios")
    variants = _field(ha, HOST_ALPHA_RUN, "ffn", "variants")
    ffn = {"gpu": _field(ha, HOST_ALPHA_RUN, "provenance", "gpu"), "where": provenance_line(ha["provenance"]),
           "dense_ms": _field(ratios, HOST_ALPHA_RUN, "fp8_24", "fp8_dense", "dense_ms"),
           "dense_tflops": _field(ratios, HOST_ALPHA_RUN, "fp8_24", "fp8_dense", "dense_tflops"),
           "scale_pass": _field(ratios, HOST_ALPHA_RUN, "fp8_24", "fp8_dense", "speedup"),
           "host_alpha": _field(ratios, HOST_ALPHA_RUN, "fp8_24_host_alpha", "fp8_dense", "speedup"),
           "scale_pass_ms": _field(variants, HOST_ALPHA_RUN, "fp8_24", "ms"),
           "host_alpha_ms": _field(variants, HOST_ALPHA_RUN, "fp8_24_host_alpha", "ms")}

    cu = _recorded(CUTLASS_RUN, directory)
    shapes = {(r.get("m"), r.get("n"), r.get("k")): r for r in _field(cu, CUTLASS_RUN, "shapes")}
    rows = []
    for name, (m, n, k) in FORWARD_PRODUCTS.items():
        if (m, n, k) not in shapes:
            raise ValueError(f"{CUTLASS_RUN}.json has no product of shape m, n, k = {m}, {n}, {k}")
        fp8 = _field(shapes[(m, n, k)], CUTLASS_RUN, "fp8")
        cutlass = {v: r["vs_dense_same_kind"] for v, r in fp8.items() if v.startswith("cutlass_fp8[")}
        fast = [r for v, r in cutlass.items() if v.endswith("fast]")]
        promoted = [r for v, r in cutlass.items() if not v.endswith("fast]")]
        if not fast or not promoted:
            raise ValueError(f"{CUTLASS_RUN}.json: the product {m}, {n}, {k} lacks a CUTLASS FP8 config "
                             "with fast accumulation or one with promoted accumulators")
        rows.append({"name": name, "m": m, "n": n, "k": k,
                     "dense_tflops": _field(fp8, CUTLASS_RUN, "scaled_mm_fp8", "tflops"),
                     "cusparselt_pass": _field(fp8, CUTLASS_RUN, "cusparselt_fp8", "vs_dense_same_kind"),
                     "cusparselt_host_alpha": _field(fp8, CUTLASS_RUN, "cusparselt_fp8_host_alpha",
                                                     "vs_dense_same_kind"),
                     "cutlass_fast": max(fast), "cutlass_promoted": max(promoted),
                     "pass_ms": _field(fp8, CUTLASS_RUN, "cusparselt_fp8", "ms"),
                     "host_alpha_ms": _field(fp8, CUTLASS_RUN, "cusparselt_fp8_host_alpha", "ms")})
    products = {"gpu": _field(cu, CUTLASS_RUN, "provenance", "gpu"), "where": provenance_line(cu["provenance"]),
                "rows": rows}
    return {"ffn": ffn, "products": products}
