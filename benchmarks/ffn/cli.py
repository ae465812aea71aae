"""``python -m benchmarks ffn``: the command line and the order of the run's sections."""
from __future__ import annotations

import argparse
import sys
import time

import torch

from benchmarks.ffn.gpt import measure_gpt
from benchmarks.ffn.graph import measure_graph
from benchmarks.conditions import ConditionSampler, matmul_probe
from benchmarks.ffn.baseline import ffn_step_flops, products_probe
from benchmarks.ffn.measure import Recorder, _cleanup, _inputs, measure_shape, median_ms
from benchmarks.ffn.paired import measure_paired
from benchmarks.ffn.report import comparison_lines, format_table, target_lines
from benchmarks.ffn.schema import NOTES, RESULT_NAME, SMOKE_NAME
from benchmarks.ffn.settings import FULL, SMOKE, Settings
from benchmarks.ffn.targets import judge_targets, library_comparison
from benchmarks.ffn.variants import build_ffn, train_step, unavailable_variants
from sparsity_lab.lab.arguments import (nonnegative_float, nonnegative_int, output_folder, positive_float,
                                        positive_int)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=positive_int, nargs="+", default=None,
                        help="token counts (default 4096 16384)")
    parser.add_argument("--d-model", type=positive_int, nargs="+", default=None,
                        help="model widths, ffn = 4 d_model (default 1024 2048 4096 8192)")
    parser.add_argument("--target-tokens", type=positive_int, default=None, help="the targets' shape (default 16384)")
    parser.add_argument("--target-d-model", type=positive_int, default=None, help="the targets' shape (default 4096)")
    parser.add_argument("--reps", type=positive_int, default=10, help="timed calls per measurement (median)")
    parser.add_argument("--warmup", type=nonnegative_int, default=3,
                        help="untimed calls first (algorithm search, compiles)")
    parser.add_argument("--budget-s", type=positive_float, default=420.0,
                        help="start no new shape after this many seconds")
    parser.add_argument("--no-graph", action="store_true", help="skip the eager vs CUDA-graph section")
    parser.add_argument("--masks-in-graph", action=argparse.BooleanOptionalAction, default=True,
                        help="graph section: refresh the masks due every step inside the CUDA graph (default), or "
                             "eagerly before each replay (--no-masks-in-graph); recorded as masks_in_graph")
    parser.add_argument("--rounds", type=nonnegative_int, default=5,
                        help="rounds of the paired section at the target shape (0 skips it): dense and ours "
                             "built side by side and timed in turn, the speed-up taken per round")
    parser.add_argument("--idle-s", type=nonnegative_float, default=0.5,
                        help="seconds of idle GPU before each paired turn at the target shape and in the GPT "
                             "rounds, so that every variant starts from the same power and thermal state (0: none)")
    parser.add_argument("--no-gpt", action="store_true", help="skip the GPT training step")
    parser.add_argument("--gpt-layers", type=positive_int, default=None, help="GPT blocks (default 2)")
    parser.add_argument("--gpt-batch", type=positive_int, default=None, help="sequences per GPT step (default 16)")
    parser.add_argument("--gpt-context", type=positive_int, default=None, help="tokens per sequence (default 1024)")
    parser.add_argument("--out-dir", type=output_folder, default=None,
                        help="where to write the JSON (default results/)")
    parser.add_argument("--name", default=None,
                        help=f"JSON name without .json (default {RESULT_NAME}; {SMOKE_NAME} with --smoke)")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU, tiny shapes, backend 'torch' for cuSPARSELt: tests the script, not figures")


def _positive(value, flag: str) -> None:
    values = value if isinstance(value, list) else [value]
    if not values or any(isinstance(v, bool) or v < 1 for v in values):
        raise ValueError(f"{flag} must be positive integers, got {value!r}")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from the command line; ValueError naming the flag for bad input."""
    base = SMOKE if args.smoke else FULL
    tokens = args.tokens if args.tokens is not None else list(base["tokens"])
    d_models = args.d_model if args.d_model is not None else list(base["d_model"])
    target = (args.target_tokens if args.target_tokens is not None else base["target"][0],
              args.target_d_model if args.target_d_model is not None else base["target"][1])
    _positive(tokens, "--tokens")
    _positive(d_models, "--d-model")
    _positive(list(target), "--target-tokens/--target-d-model")
    _positive(args.reps, "--reps")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if args.rounds < 0:
        raise ValueError(f"--rounds must be >= 0, got {args.rounds}")
    if not args.idle_s >= 0:
        raise ValueError(f"--idle-s must be >= 0, got {args.idle_s}")
    if not args.budget_s > 0:
        raise ValueError(f"--budget-s must be > 0, got {args.budget_s}")
    bad = [d for d in d_models if d % 16]
    if bad:
        raise ValueError(f"--d-model values must be multiples of 16 (cuSPARSELt's minimum), got {bad}")
    gpt = None
    if not args.no_gpt:
        gpt = dict(base["gpt"])
        for key, flag in (("n_layer", "gpt_layers"), ("batch", "gpt_batch"), ("context", "gpt_context")):
            value = getattr(args, flag)
            if value is not None:
                _positive(value, "--" + flag.replace("_", "-"))
                gpt[key] = value
    if args.smoke:
        device = torch.device("cpu")
        backends = {"cusparselt": "torch", "cusparselt_auto": "torch", "dense_products": "torch", "cutlass": "torch",
                    "sparse_auto": "torch"}
    else:
        device = torch.device("cuda")
        backends = {"cusparselt": "cusparselt", "cusparselt_auto": "cusparselt_auto", "dense_products": "triton",
                    "cutlass": "cutlass", "sparse_auto": "sparse_auto"}
    return Settings(smoke=args.smoke, device=device, dtype=torch.bfloat16, tokens=sorted(set(tokens)),
                    d_models=sorted(set(d_models)), target=target,
                    reps=min(args.reps, 2) if args.smoke else args.reps,
                    warmup=min(args.warmup, 1) if args.smoke else args.warmup,
                    budget_s=args.budget_s, graph=not args.no_graph, gpt=gpt, backends=backends,
                    rounds=min(args.rounds, 2) if args.smoke else args.rounds,
                    idle_s=0.0 if args.smoke else args.idle_s, masks_in_graph=args.masks_in_graph)


# --- the run ------------------------------------------------------------------------------------------------
def shape_order(s: Settings) -> list[tuple[int, int]]:
    """The target shape first (the figures that matter), then the rest from the cheapest."""
    rest = sorted((p for p in s.grid if p != s.target), key=lambda p: (p[0] * p[1] * p[1], p))
    return ([s.target] if s.target in s.grid else []) + rest


def graph_shapes(s: Settings) -> list[tuple[int, int]]:
    """Every grid shape, the target first: auto's target is judged under graph replay too."""
    return shape_order(s)


def measure_baseline(s: Settings, rec: Recorder) -> dict:
    """At the start of the run, before anything else has heated the GPU: the six products of the dense
    FFN step at the target shape as bare matmuls, one product alone, and the dense FFN step alone
    (``NOTES["baseline_check"]``, ``NOTES["headline"]``)."""
    tokens, d = s.target
    out: dict = {}
    probe, err = rec.attempt("baseline products probe",
                             lambda: products_probe(tokens, d, device=s.device, dtype=s.dtype))
    out["products_probe"] = probe if probe is not None else {"error": err}
    gemm, err = rec.attempt("baseline matmul probe",
                            lambda: matmul_probe(tokens, d, 4 * d, s.device, s.dtype, label="x W1^T"))
    out["matmul_probe"] = gemm if gemm is not None else {"error": err}

    def dense_alone() -> float:
        inputs = _inputs(tokens, d, s)
        model = build_ffn("dense", d, s)
        try:
            return median_ms(train_step(model, *inputs), s)
        finally:
            model = inputs = None
            _cleanup(s.device)
    ms, err = rec.attempt("baseline dense alone", dense_alone)
    out["dense_alone_ms"] = ms
    if ms:
        out["dense_alone_tflops"] = ffn_step_flops(tokens, d, 4 * d) / (ms * 1e-3) / 1e12
    if err:
        out["dense_alone_error"] = err
    return out


def benchmark(s: Settings) -> dict:
    # before the clock starts: asking for a CUTLASS backend builds its library once (nvcc on a fresh machine, then
    # cached), which is no part of any timing and must not spend the budget
    start = time.monotonic()
    unavailable = unavailable_variants(s)
    setup_s = time.monotonic() - start
    sampler = ConditionSampler(False if s.smoke else None).start()
    try:
        result = _benchmark(s, Recorder(s, sampler, unavailable))
    finally:
        sampler.stop()
    result["library_setup_s"] = setup_s
    return result


def _benchmark(s: Settings, rec: Recorder) -> dict:
    rows: list[dict] = []
    shapes: list[dict] = []
    reports: dict[str, str] = {}
    graph: list[dict] = []
    gpt_step: dict | None = None
    order = shape_order(s)

    baseline: dict = {}
    if rec.may_start("baseline"):
        with rec.section("baseline (start)"):
            baseline = measure_baseline(s, rec)

    def run_shape(point: tuple[int, int]) -> None:
        if rec.may_start(f"ffn {point[0]}x{point[1]}"):
            with rec.section(f"grid {point[0]}x{point[1]}"):
                new_rows, record = measure_shape(*point, s, rec, reports)
            rows.extend(new_rows)
            shapes.append(record)

    paired: list[dict] = []

    def run_paired(point: tuple[int, int]) -> None:
        if s.rounds and rec.may_start(f"paired {point[0]}x{point[1]}"):
            with rec.section(f"paired {point[0]}x{point[1]}"):
                paired.extend(measure_paired(*point, s, rec))

    if order and order[0] == s.target:
        point = order.pop(0)
        run_shape(point)
        run_paired(point)
    if s.gpt is not None and rec.may_start("gpt_step"):
        with rec.section("gpt step"):
            gpt_step, err = rec.attempt("gpt step", lambda: measure_gpt(s, rec))
        if gpt_step is None:
            gpt_step = {"config": dict(s.gpt), "variants": {}, "error": err}
    for point in order:
        run_shape(point)
        run_paired(point)
    if s.graph:  # last: a failed capture cannot disturb the figures above
        for point in graph_shapes(s):
            if rec.may_start(f"graph {point[0]}x{point[1]}"):
                with rec.section(f"graph {point[0]}x{point[1]}"):
                    graph += measure_graph(*point, s, rec)
    if baseline:  # the same probe at the end: how far the GPU's state moved during the run
        with rec.section("baseline (end)"):
            end, err = rec.attempt("baseline products probe (end)",
                                   lambda: products_probe(*s.target, device=s.device, dtype=s.dtype))
        baseline["products_probe_end"] = end if end is not None else {"error": err}
    return {
        "smoke": s.smoke, "device": str(torch.cuda.get_device_name() if s.device.type == "cuda" else "cpu"),
        "dtype": str(s.dtype).replace("torch.", ""), "backends": s.backends,
        "grid": {"tokens": s.tokens, "d_model": s.d_models},
        "target_shape": {"tokens": s.target[0], "d_model": s.target[1], "ffn": 4 * s.target[1]},
        "reps": s.reps, "warmup": s.warmup, "budget_s": s.budget_s, "idle_s": s.idle_s,
        "masks_in_graph": s.masks_in_graph, "notes": NOTES,
        "baseline": baseline, "conditions": rec.sampler.summary() if rec.sampler is not None else None,
        "rows": rows, "shapes": shapes, "paired": paired, "graph": graph, "gpt_step": gpt_step,
        "backend_report": reports, "rounds": s.rounds,
        "targets": judge_targets(rows, gpt_step, s.target, s.grid, paired, graph, baseline),
        "library_comparison": library_comparison(rows, paired, s.target, baseline, shapes),
        "unavailable": rec.unavailable, "skipped": rec.skipped, "errors": rec.errors, "elapsed_s": rec.elapsed(),
    }


def run(args: argparse.Namespace) -> int:
    from sparsity_lab.provenance import write_result

    try:
        s = settings_from_args(args)
    except ValueError as err:
        print(f"benchmarks ffn: {err}", file=sys.stderr)
        return 2
    if not s.smoke and not torch.cuda.is_available():
        print("benchmarks ffn needs a CUDA GPU (torch.cuda.is_available() is False); --smoke runs the script's "
              "plumbing on the CPU", file=sys.stderr)
        return 2
    result = benchmark(s)
    name = args.name or (SMOKE_NAME if s.smoke else RESULT_NAME)
    path = write_result(name, result, directory=args.out_dir)
    print(format_table(result))
    print("\n".join(comparison_lines(result)))
    print(f"wrote {path}")
    print("\n".join(target_lines(result)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ffn.cli",
                                     description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
