"""Where the GPU time of one FP8 FFN training step goes: each variant's kernels under torch.profiler, by kind.

The ``ffn_profile`` section of ``python -m benchmarks fp8-training`` (GPU). The FFN and the variants are the
``ffn`` section's (``build_ffn``: ``y = W2 gelu(W1 x)``, forward and backward, mask every step, MVUE); each
variant runs eagerly (and, with ``--ffn-modes`` naming "graphed", graph-replayed), forward, backward and its
end-of-step update, for ``steps`` profiled steps after warm-up. The kernels' own GPU times are summed per step
and put in the kinds of ``KINDS`` by name, so a reader can see which passes the sparse products leave around them (the question a fused epilogue answers:
how much of the step is the activation and the FP8 casts between the two products).

A short burst of steps (3 after 4 of warm-up), whose times move with the GPU's state: on the H200 the same dense FP8 step profiled at 11.4 ms of kernels in one call
(``results/fp8_ffn_profile_h200.json``) and 13.0 ms in another (``results/fp8_training_ffn_h200_row_major_dw.json``).
Compare the kinds within one profile; the ``ffn`` section's paired rounds give the speed-ups.
"""
from __future__ import annotations

import re

import torch

from benchmarks.step_categories import classify

# (kind, pattern over the lower-cased kernel name); the first match wins, then step_categories' category
KINDS = (
    ("scale pass", re.compile(r"_scale_kernel|mul_kernel.*(scalar|cudafunctoronself)")),
    ("FP8 casts and amax", re.compile(r"_quantize_kernel|_cast_transpose_kernel|_amax_kernel|_dequantize_kernel"
                                      r"|float8|e4m3|e5m2|amax|abs_kernel|max_kernel|reduce_kernel")),
    ("activation (GELU forward and backward)", re.compile(r"gelu")),
)
ORDER = ("sparse products", "dense products", "2:4 work", "FP8 casts and amax", "activation (GELU forward and backward)",
         "scale pass", "other elementwise and copies", "other")
_CATEGORY_KIND = {"sparse_gemm": "sparse products", "dense_gemm": "dense products", "two4_work": "2:4 work",
                  "norm_cast_elementwise": "other elementwise and copies"}


def kind_of(name: str) -> str:
    """The kind (one of ORDER) of a profiled CUDA kernel named ``name``."""
    category = classify(name)  # raises TypeError for a non-str
    if category in ("sparse_gemm", "dense_gemm", "two4_work"):  # a product's or a 2:4 kernel's name may say "e4m3"
        return _CATEGORY_KIND[category]
    n = name.lower()
    for kind, pattern in KINDS:
        if pattern.search(n):
            return kind
    return _CATEGORY_KIND.get(category, "other")


def summarize(rows: list[tuple[str, float, float]], top: int = 25) -> dict:
    """rows: (kernel name, ms per step, calls per step) -> {"kinds_ms", "kernels_ms" (sum), "top"}."""
    kinds = dict.fromkeys(ORDER, 0.0)
    for name, ms, _ in rows:
        kinds[kind_of(name)] += ms
    ranked = sorted(rows, key=lambda r: -r[1])[:top]
    return {"kinds_ms": kinds, "kernels_ms": sum(kinds.values()),
            "top": [{"kernel": n[:160], "kind": kind_of(n), "ms": ms, "calls": calls} for n, ms, calls in ranked]}


def ffn_profile(tokens: int, d: int, variants: tuple[str, ...], steps: int = 3, warmup: int = 4,
                modes: tuple[str, ...] = ("eager",)) -> dict:
    """{variant: summarize(...) plus "wall_ms" (no profiler)} at ``tokens`` x ``d`` (ffn 4 d), eager; with "graphed"
    in ``modes`` also ``out["graphed"][variant]``: the same for the step ``graphed_step`` replays (CUPTI records
    the kernels a graph launches), to see where a replay spends what the eager step does not."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.fp8_training import build_ffn, eager_step, graphed_step, time_steps, unavailable_variants
    from benchmarks.step_profile import kernel_rows
    skipped = unavailable_variants(variants)
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(tokens, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    dy = torch.randn(tokens, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    out = {"tokens": tokens, "d_model": d, "ffn": 4 * d, "steps": steps, "skipped": skipped, "variants": {}}
    for mode in modes:
        rows = out["variants"] if mode == "eager" else out.setdefault(mode, {})
        for v in (v for v in variants if v not in skipped):
            graphed = None
            if mode == "eager":
                step = eager_step(build_ffn(v, d), x, dy)
                for _ in range(warmup):
                    step()
            else:
                step, graphed = graphed_step(build_ffn(v, d), x, dy)  # warmed up and captured
            torch.cuda.synchronize()
            wall = time_steps(step, steps)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(steps):
                    step()
                torch.cuda.synchronize()
            rows[v] = {"wall_ms": wall, **summarize(kernel_rows(prof, steps, cuda=True))}
            if graphed is not None:
                graphed.release()
            del step, graphed
            torch.cuda.empty_cache()
    out["ceilings_vs_fp8_dense"] = ceilings(out)
    return out


def ceilings(profiled: dict, dense: str = "fp8_dense") -> dict:
    """{2:4 variant (one with sparse products): its Amdahl ceiling over ``dense``} from the profile's own kernel times (T: all kernels, P: the
    products, sparse and dense): T_dense / (T_dense - P_dense + P_variant). What the step would take if only its
    products differed from dense's; a step below its ceiling spends more than dense around its products."""
    base = profiled["variants"].get(dense)
    if base is None:
        return {}
    products = ("sparse products", "dense products")
    p_dense = sum(base["kinds_ms"][k] for k in products)
    return {v: base["kernels_ms"] / (base["kernels_ms"] - p_dense + sum(r["kinds_ms"][k] for k in products))
            for v, r in profiled["variants"].items() if v != dense and r["kinds_ms"]["sparse products"] > 0}


def _kinds_table(rows: dict, wall_label: str) -> list[str]:
    names = list(rows)
    lines = [f"{'ms per step':<42}" + "".join(f"{n:>18}" for n in names)]
    for kind in ORDER + ("kernels_ms", "wall_ms"):
        label = {"kernels_ms": "all kernels", "wall_ms": wall_label}.get(kind, kind)
        vals = [rows[n]["kinds_ms"][kind] if kind in ORDER else rows[n][kind] for n in names]
        lines.append(f"{label:<42}" + "".join(f"{v:>18.3f}" for v in vals))
    return lines


def table(profiled: dict) -> str:
    """The kinds of every profiled variant side by side, ms per step (eager; then replayed, where profiled)."""
    lines = _kinds_table(profiled["variants"], "eager wall (no profiler)") if profiled["variants"] else []
    if profiled.get("graphed"):
        lines += ["graph-replayed:"] + _kinds_table(profiled["graphed"], "replayed wall (no profiler)")
    base = profiled["variants"].get("fp8_dense")
    for v, c in ceilings(profiled).items():  # eager
        r = profiled["variants"][v]
        lines.append(f"{v}: kernels {base['kernels_ms'] / r['kernels_ms']:.2f}x fp8_dense's, ceiling of its products "
                     f"{c:.2f}x")
    for v, reason in (profiled.get("skipped") or {}).items():
        lines.append(f"{v}: skipped: {reason}")
    return "\n".join(lines)
