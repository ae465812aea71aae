"""The headline figures the course, the README and docs/ quote: each read from one recorded file.

One fact, one number. A speed-up of the 2:4 FFN at 16384 tokens x d_model 4096, say, was recorded by
several runs; the course quotes one of them, always the same one, with its baseline and the machine it
was measured on. This module is where that choice is made (``SOURCES`` below names the file of every
fact), and ``tests/test_headlines.py`` checks that every figure the README, docs/*.md and the notebooks'
text quote for such a fact is the one printed here.

    >>> from sparsity_lab.course import headlines
    >>> print(headlines.get("ffn_speedup").text)          # doctest: +SKIP
    1.31x
    >>> headlines.show("ffn_speedup", "gpt_step_speedup")  # one line each, with baseline and source

Each :class:`Headline` has ``text`` (the number as quoted, e.g. ``"1.31x"``), ``baseline`` (what it is
measured against), ``where`` (GPU or CPU and date) and ``source`` (the file under results/).
Speed-ups are dense time / 2:4 time against the fastest dense time of the run (docs/measuring.md,
"Benchmark conditions"), written with two decimals.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from functools import lru_cache

from ..provenance import read_result
from ..shipped import RESULTS_DIR

# the canonical file of each group of facts (names under results/, without .json)
FFN_RUN = "ffn_speed_h100_2026-11-24"        # benchmarks ffn under the benchmark conditions, first full run
KERNELS_RUN = "kernels_h100"                  # benchmarks kernels: every Triton kernel against the copy rate
CALLS_RUN = "cusparselt_calls_h100"           # benchmarks cslt-calls: one product, PyTorch's call vs direct
MASKS_RUN = "mask_solvers_cpu"                # benchmarks masks: the exact transposable solvers on a CPU
FP8_SPEED_RUN = "fp8_training_ffn_h200_row_major_dw"  # benchmarks fp8-training: the FP8 2:4 FFN step against the
#   dense FP8 recipe with its transposed operands from cast-transposes (the H100 runs timed a dense FP8 step
#   that copied them: a slower baseline)
FP8_LOSS_RUN = "lab_compare_h100_fp8"         # sparsity-lab compare: FP8 against bf16 training, seed 0
HOST_ALPHA_RUN = "fp8_training_host_alpha_h100"  # benchmarks fp8-training: the scale pass against host alpha
STEP_PROFILE_RUN = "step_profile_h100"        # benchmarks step-profile: where a whole step's time goes
STEP_PROFILE_CONFIG = "all24"                 # its 2:4 step quoted: every block linear 2:4, mask every step

SOURCES = {FFN_RUN: f"results/{FFN_RUN}.json", KERNELS_RUN: f"results/{KERNELS_RUN}.json",
           CALLS_RUN: f"results/{CALLS_RUN}.json", MASKS_RUN: f"results/{MASKS_RUN}.json",
           FP8_SPEED_RUN: f"results/{FP8_SPEED_RUN}.json", FP8_LOSS_RUN: f"results/{FP8_LOSS_RUN}/results.json",
           STEP_PROFILE_RUN: f"results/{STEP_PROFILE_RUN}.json", HOST_ALPHA_RUN: f"results/{HOST_ALPHA_RUN}.json"}


@dataclass(frozen=True)
class Headline:
    """One quoted figure. ``cue`` is a regular expression (case-insensitive) that a sentence quoting
    this fact matches; ``unit`` is how the figure is written (``"x"``, ``"fraction"``, ``"s"``, ``"ms"``,
    ``"%"``), which tells the agreement test which numbers of such a sentence to compare. ``value`` is
    the figure unrounded where it is one number (a calculation starts from it; ``text`` is what is quoted)."""

    key: str
    concept: str
    text: str
    baseline: str
    where: str
    source: str
    cue: str
    unit: str
    value: float | None = None

    def __str__(self) -> str:
        return f"{self.concept}: {self.text} {self.baseline} ({self.where}; {self.source})"


def _ratio(value: float) -> str:
    return f"{value:.2f}x"


def _span(values, fmt: str) -> str:
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def _where(prov: dict) -> str:
    machine = prov.get("gpu") or f"a {prov.get('cpu_count', '?')}-core CPU"
    return f"{machine}, {prov['date'][:10]}"


def ffn_headline_shape() -> str:
    """The FFN shape of the FFN headlines, tokens x d_model x ffn ("16384x4096x16384"): a table or figure of
    another run leaves it out, so that one fact has one number."""
    shape = read_result(FFN_RUN)["target_shape"]
    return f"{shape['tokens']}x{shape['d_model']}x{shape['ffn']}"


def _ffn_facts() -> list[Headline]:
    run = read_result(FFN_RUN)
    where, src, t = _where(run["provenance"]), SOURCES[FFN_RUN], run["targets"]
    ffn, fwd, gpt, gpt_all = (t["ffn_fwd_bwd_ours_mvue"], t["ffn_fwd_ours"], t["gpt_step"], t["gpt_step_all_linears"])
    ffn_cue = r"^(?!.*\bFP8\b).*(FFN\b.*16384.*4096|16384 (tokens )?x (d_model )?4096)"  # bf16, not FP8
    c = run["gpt_step"]["config"]
    gpt_model = f"{c['n_layer']} layers, {c['batch']} x {c['context']} tokens"  # not the profiled step's model
    return [
        Headline("ffn_speedup", "2:4 FFN block, forward + backward, 16384 tokens x d_model 4096 "
                 "(S-STE + MVUE, mask every step)", _ratio(ffn["measured"]),
                 f"against the fastest dense bf16 step of the run ({ffn['dense_ms']:.2f} ms, "
                 f"{ffn['dense_tflops']:.0f} TFLOP/s)", where, src, ffn_cue, "x"),
        Headline("ffn_forward_speedup", "2:4 FFN forward alone, 16384 tokens x d_model 4096",
                 _ratio(fwd["measured"]), f"against the fastest dense forward of the run ({fwd['dense_ms']:.2f} ms)",
                 where, src, r"FFN forward alone|forward alone", "x"),
        Headline("gpt_step_speedup", f"GPT training step at d_model 4096 ({gpt_model}), FFN linears 2:4",
                 _ratio(gpt["measured"]),
                 f"against the fastest dense step of the run ({gpt['dense_ms']:.1f} ms, "
                 f"{gpt['dense_tflops']:.0f} TFLOP/s)", where, src, r"GPT (training )?step", "x"),
        Headline("gpt_step_all_linears_speedup", f"GPT training step at d_model 4096 ({gpt_model}), every block "
                 "linear 2:4",
                 _ratio(gpt_all["measured"]), "against the same dense step", where, src,
                 r"GPT (training )?step.*every (block )?linear", "x"),
    ]


def _kernel_facts() -> list[Headline]:
    run = read_result(KERNELS_RUN)
    where, src = _where(run["provenance"]), SOURCES[KERNELS_RUN]
    copy = run["summary"]["copy_gbps"]
    one_pass = [r["fraction_of_copy"] for r in run["rows"] if r.get("counts_for_target")]
    mvue = [r["fraction_of_copy"] for r in run["rows"] if r["kernel"].endswith("mvue24") and "fraction_of_copy" in r]
    trans = next(r for r in run["rows"] if r.get("baseline") == "plain PyTorch 90-pattern")
    gated = [r["speedup"] for r in run["rows"] if r["kernel"].endswith("gated") and r.get("speedup")]
    copy_text = f"of the measured copy bandwidth ({copy:.0f} GB/s)"
    return [
        Headline("kernel_copy_fraction", "one-pass memory-bound Triton kernels (prune, soft threshold, MVUE, "
                 "masked decay, FP8 cast)", _span(one_pass, ".2f"), copy_text, where, src,
                 r"copy (bandwidth|rate)", "fraction"),
        Headline("mvue_copy_fraction", "MVUE 2:4 kernel", _span(mvue, ".2f"), copy_text, where, src,
                 r"MVUE 2:4 (kernel )?at|MVUE kernel", "fraction"),
        Headline("transposable_kernel_speedup", "exact transposable 2:4 mask + W + W^T, Triton kernel",
                 f"{trans['speedup']:.0f}x", "against the plain PyTorch 90-pattern search", where, src,
                 r"90-pattern search", "x"),
        Headline("gated_kernel_speedup", "fused SwiGLU/GEGLU kernels, forward and backward",
                 _span(gated, ".1f") + "x", "against the unfused PyTorch sequence", where, src,
                 r"SwiGLU/GEGLU.*faster|fused SwiGLU", "x"),
    ]


def _calls_facts() -> list[Headline]:
    run = read_result(CALLS_RUN)
    small = [r for r in run["rows"] if r["d_model"] <= 1024]
    torch_ms = [r["host_overhead_ms"]["torch_call"] for r in small]
    direct_ms = max(r["host_overhead_ms"]["direct_call"] for r in small)
    where, src, cue = _where(run["provenance"]), SOURCES[CALLS_RUN], r"host time.*per product"
    return [Headline("cslt_host_overhead", "host time PyTorch's cuSPARSELt call adds per product at d_model 1024",
                     _span(torch_ms, ".1f") + " ms", "over the dense product", where, src, cue, "ms"),
            Headline("cslt_direct_overhead", "host time the direct cuSPARSELt binding adds per product there",
                     f"{direct_ms:.2f} ms", "at most, over the dense product", where, src, cue, "ms")]


def _mask_facts() -> list[Headline]:
    run = read_result(MASKS_RUN)
    where, src = _where(run["provenance"]), SOURCES[MASKS_RUN]
    cases = {(c["n"], c["m"]): c for c in run["cases"]}
    c24, c48 = cases[(2, 4)], cases[(4, 8)]
    return [
        Headline("mask_solver_24", f"exact transposable 2:4 mask of a {c24['size']}x{c24['size']} weight "
                 f"({c24['auto_solver']} solver)", f"{c24['auto_median_s']:.2f} s", "median wall time", where, src,
                 r"transposable 2:4 (mask )?(on|of) (a )?4096", "s"),
        Headline("mask_solver_48", f"exact transposable 4:8 mask of a {c48['size']}x{c48['size']} weight "
                 f"({c48['auto_solver']} solver)", f"{c48['auto_median_s']:.2f} s", "median wall time", where, src,
                 r"4:8 (mask )?(on|of) (a )?1024", "s"),
    ]


def _fp8_facts() -> list[Headline]:
    speed = read_result(FP8_SPEED_RUN)
    ffn = speed["ffn"]
    fp8_dense = ffn["variants"]["fp8_dense"]["tflops"]
    where = _where(speed["provenance"])
    loss = read_result("results", directory=RESULTS_DIR / FP8_LOSS_RUN)
    final = {row["variant"]: row["final_val_loss"] for row in loss["table"]}
    gap = 100 * (final["sste_mvue_fp8"] / final["sste_mvue"] - 1)
    alpha = read_result(HOST_ALPHA_RUN)
    return [
        Headline("fp8_ffn_speedup", "FP8 2:4 FFN block, forward + backward, 16384 tokens x d_model 4096",
                 _ratio(ffn["fp8_24_vs_fp8_dense"]), f"against dense FP8 ({fp8_dense:.0f} TFLOP/s)", where,
                 SOURCES[FP8_SPEED_RUN], r"FP8 2:4.*(faster|against dense FP8|vs dense FP8|over dense FP8)", "x"),
        Headline("fp8_ffn_vs_bf16", "the same FP8 2:4 FFN block", _ratio(ffn["fp8_24_vs_bf16_dense"]),
                 "against dense bf16", where, SOURCES[FP8_SPEED_RUN], r"FP8 2:4.*dense bf16", "x"),
        Headline("fp8_host_alpha_gain", "the same FP8 2:4 FFN block with cuSPARSELt's host alpha in place of a "
                 "scale pass after each product", _ratio(alpha["ffn"]["fp8_24_host_alpha_vs_fp8_24"]),
                 f"against the step with the scale pass, paired in {alpha['ffn']['rounds']} rounds",
                 _where(alpha["provenance"]), SOURCES[HOST_ALPHA_RUN], r"host alpha.*(faster|against|over)", "x",
                 alpha["ffn"]["fp8_24_host_alpha_vs_fp8_24"]),
        Headline("fp8_loss_gap", "final validation loss of FP8 2:4 training (S-STE + MVUE, 21M tokens)",
                 f"{gap:+.2f} %", "against the same run in bf16 2:4 (seed 0)", _where(loss["provenance"]),
                 SOURCES[FP8_LOSS_RUN], r"FP8 2:4.*(loss|bf16 2:4)", "%"),
    ]


def step_profile_parts(run: dict | None = None) -> dict:
    """The quoted 2:4 step of the step profile (results/step_profile_h100.json), in the parts Amdahl's law
    needs, all in ms per step of the same run: ``dense_ms`` (the dense step), ``products_ms`` (its time in
    the products of the linears the 2:4 step makes sparse), ``product_speedup`` (those products timed alone,
    dense sum / 2:4 sum), ``sparse_ms`` (the 2:4 step), ``two4_ms`` (its 2:4 work: masks, soft threshold,
    compression, MVUE), ``mode`` and ``config`` (which run of the file)."""
    run = run if run is not None else read_result(STEP_PROFILE_RUN)
    mode = run["summary"]["fastest_dense"]  # the fastest dense step of the file, as every speed-up here
    records = {(r["mode"], r["config"]): r for r in run["records"]}
    dense, sparse = records[(mode, "dense")], records[(mode, STEP_PROFILE_CONFIG)]
    summary = run["summary"]["runs"][f"{mode} {STEP_PROFILE_CONFIG}"]
    return {"dense_ms": dense["ms"], "products_ms": summary["ceiling"]["gemm_ms_made_sparse"],
            "product_speedup": summary["attribution"]["product_speedup"], "sparse_ms": sparse["ms"],
            "two4_ms": sparse["breakdown_ms"]["two4_work"], "mode": mode, "config": STEP_PROFILE_CONFIG}


def _step_profile_facts() -> list[Headline]:
    run = read_result(STEP_PROFILE_RUN)
    where, src, parts, m = _where(run["provenance"]), SOURCES[STEP_PROFILE_RUN], step_profile_parts(run), run["model"]
    share = parts["products_ms"] / parts["dense_ms"]
    step = parts["dense_ms"] / parts["sparse_ms"]
    cue = r"profiled (whole )?step|step profile"
    return [
        Headline("profiled_products_share", f"the products that 2:4 makes sparse, in the profiled dense step of the "
                 f"lab GPT (width {m['d_model']}, {m['n_layer']} layers, {m['batch']} x {m['context']} tokens)",
                 f"{share:.2f}", f"of the dense step ({parts['products_ms']:.1f} of {parts['dense_ms']:.1f} ms)",
                 where, src, cue, "fraction", share),
        Headline("profiled_products_speedup", "those products with every block linear 2:4, each timed alone at "
                 "the step's shapes", _ratio(parts["product_speedup"]), "against the same products dense",
                 where, src, cue, "x", parts["product_speedup"]),
        Headline("profiled_step_speedup", "the profiled step with every block linear 2:4 (S-STE + MVUE, mask "
                 "every step)", _ratio(step), f"against the dense step of the same run ({parts['dense_ms']:.1f} ms)",
                 where, src, cue, "x", step),
        Headline("profiled_two4_share", "the 2:4 work in that step (masks, soft threshold, compression, MVUE)",
                 f"{100 * parts['two4_ms'] / parts['sparse_ms']:.1f} %", f"of the step ({parts['two4_ms']:.1f} ms)",
                 where, src, cue, "%", parts["two4_ms"] / parts["sparse_ms"]),
    ]


@lru_cache(maxsize=1)
def _all() -> dict[str, Headline]:
    facts = _ffn_facts() + _kernel_facts() + _calls_facts() + _mask_facts() + _fp8_facts() + _step_profile_facts()
    return {h.key: h for h in facts}


def all_headlines() -> dict[str, Headline]:
    """Every headline figure, by key (read from results/ once per process)."""
    return dict(_all())


def get(key: str) -> Headline:
    """The headline figure ``key`` (one of :func:`all_headlines`'s keys)."""
    facts = _all()
    if key not in facts:
        raise KeyError(f"key must be one of {sorted(facts)}, got {key!r}")
    return facts[key]


def show(*keys: str, width: int = 96) -> None:
    """Print the headline figures ``keys`` (default: all), one wrapped paragraph each."""
    for key in keys or tuple(_all()):
        print(textwrap.fill(str(get(key)), width, subsequent_indent="    "))


if __name__ == "__main__":
    show()
