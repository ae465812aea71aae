"""The MVUE 2:4 kernel's variants side by side against the copy ceiling (one short GPU run).

``python -m benchmarks.mvue_variants --out PATH`` (CUDA GPU), in this order:

1. the ceiling: a device-to-device copy of a 128 MiB bf16 tensor, bytes read + written per second;
2. for each variant of ``benchmarks/baselines/mvue24.py`` ("level_philox4": the shipped
   ``kernels/mvue24.py``) and each group dim (0: the tokens of dZ, -1: the last
   dim), on a 128 MiB bf16 tensor (8192 x 8192 by default):

   * checks, on the benchmark tensor: at most 2 non-zeros per group (all of it); kept values are
     ``x / p`` with the reference's probabilities (``methods.mvue.mvue_probabilities``), groups with
     fewer than 2 non-zeros unchanged (a slice of 2 M / 0.5 M groups); the two timed configurations
     give identical outputs for one seed (counter-based RNG);
   * on small bf16 tensors: the mean of 200 draws is x within 6 standard errors (+ one bf16 ulp of
     rounding), the kept frequency of every non-zero is p within 6 standard deviations, and
     neighbouring all-ones groups agree on their picks half of the time (independent draws);
   * the time (``triton.testing.do_bench`` median, L2 cleared between runs) of two block/warp
     configurations; bytes counted: x read once + the output written once.

   Two diagnostic rows per dim time the v2 and level arithmetic with a constant u (no RNG): what
   the random numbers cost. They are not MVUE (their draws are deterministic) and cannot win.
3. a table (variant, dim, block, warps, ms, GB/s, fraction of the copy rate, correct, prediction)
   and the best correct configuration per variant and dim; a JSON with provenance at ``--out``.

The predictions were written before any GPU run, from offline sm_90 SASS instruction counts
(triton 3.9 here; the GPU machine runs triton 3.6, which may schedule differently).
``--smoke`` runs tiny sizes on the CPU through the Triton interpreter (a test of this script; its
numbers mean nothing).
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sparsity_lab.lab.arguments import output_file, positive_int

from benchmarks.mvue_checks import check_support_and_values, groups_of, small_checks
from benchmarks.timing import Timer, bench_device, copy_ceiling_gbps, sync

MIB = 1 << 20
DIMS = (0, -1)

# (block, num_warps) per variant and group dim. Each keeps one Philox call's quad per thread where
# the variant draws per quad (kernels/mvue24.py, "A layout constraint"); bf16 accesses per thread
# in brackets. v2's configurations are its best measured (results/kernels_h100.json); a second
# configuration only where it tests something (program size, access width). Every configuration
# is a compilation (about a second each on the GPU machine): 17 in all keep the run near 30 s.
CONFIGS = {
    ("v2", -1): [(512, 8)],  # 2 groups per thread [16 B]
    ("level", -1): [(512, 8)],
    ("v2_philox4", -1): [(512, 4)],  # 1 quad per thread [2 x 16 B]
    ("level_philox4", -1): [(512, 4), (1024, 8)],
    ("v2", 0): [(512, 4)],  # 4 columns per thread [8 B]
    ("level", 0): [(512, 4), (1024, 4)],  # 4 [8 B]; 8 [16 B], 80 registers
    ("v2_philox4", 0): [(512, 4)],  # 4 columns = 1 quad per thread [8 B]
    ("level_philox4", 0): [(512, 4), (1024, 8)],
    ("level_philox4_tile16", 0): [(128, 4), (256, 8)],  # 1 column x 16 rows per thread [2 B]
}
# level_philox4_tile16 with groups along the last dim runs the level_philox4 kernel: not timed twice
SAME_KERNEL = {("level_philox4_tile16", -1): "level_philox4"}
DIAGNOSTICS = {("v2", -1): (512, 8), ("level", -1): (512, 8), ("v2", 0): (512, 4), ("level", 0): (512, 4)}

# Written before the first GPU run. SASS instructions per group (offline, sm_90, triton 3.9, first
# config) and the predicted fraction of the copy rate. Model: t = t_mem + a * t_issue, with
# t_issue = groups * instructions / (132 SMs * 128 lanes * 1.75 GHz) and a = 0.5 (0.65 for > 70
# registers), calibrated on v2's measured 0.62 / 0.55; the ranges allow for better overlap once
# the issue time falls well below the memory time.
PREDICTIONS = {
    ("v2", -1): (200, "0.58-0.65"), ("level", -1): (144, "0.66-0.75"),
    ("v2_philox4", -1): (192, "0.60-0.67"), ("level_philox4", -1): (102, "0.74-0.88"),
    ("v2", 0): (198, "0.52-0.58"), ("level", 0): (138, "0.66-0.75"),
    ("v2_philox4", 0): (184, "0.57-0.64"), ("level_philox4", 0): (100, "0.74-0.88"),
    ("level_philox4_tile16", 0): (120, "0.65-0.80"),
    ("v2 constant u", -1): (128, "0.68-0.78"), ("level constant u", -1): (80, "0.80-0.92"),
    ("v2 constant u", 0): (136, "0.64-0.74"), ("level constant u", 0): (80, "0.80-0.92"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=output_file, required=True, help="path of the JSON to write")
    parser.add_argument("--rows", type=positive_int, default=8192, help="rows of the bf16 benchmark tensor (default 8192)")
    parser.add_argument("--cols", type=positive_int, default=8192, help="columns of the bf16 benchmark tensor (default 8192)")
    parser.add_argument("--rep-ms", type=positive_int, default=40, help="do_bench repetition time per measurement (ms)")
    parser.add_argument("--variants", default=None,
                        help="comma-separated subset of benchmarks/baselines/mvue24.VARIANTS (default: all)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes on the CPU through the Triton interpreter: checks the script, not the figures")


def _compiled_kernel_info() -> list[dict]:
    """Registers, spills and shared memory of every compiled MVUE kernel (best effort: triton's
    cache layout is internal and differs between versions; an error is recorded, not hidden)."""
    shipped = importlib.import_module("sparsity_lab.kernels.mvue24")
    baselines = importlib.import_module("benchmarks.baselines.mvue24")
    infos = []
    for module, name in ((baselines, "_mvue24_lastdim_kernel"), (shipped, "_mvue24_lastdim_quads_kernel"),
                         (baselines, "_mvue24_lastdim_quads_kernel"), (baselines, "_mvue24_strided_kernel"),
                         (shipped, "_mvue24_strided_quads_kernel"), (baselines, "_mvue24_strided_quads_kernel"),
                         (baselines, "_mvue24_strided_tile16_kernel")):
        fn = getattr(module, name)
        try:
            for cache in getattr(fn, "device_caches", {}).values():
                for kernel in cache[0].values():
                    src = getattr(kernel, "src", None)
                    consts = getattr(src, "constexprs", None) or getattr(src, "constants", None) or {}
                    infos.append({"kernel": name, "num_warps": kernel.metadata.num_warps,
                                  "n_regs": getattr(kernel, "n_regs", None), "n_spills": getattr(kernel, "n_spills", None),
                                  "shared_bytes": getattr(kernel.metadata, "shared", None),
                                  "constexprs": {str(k): str(v) for k, v in dict(consts).items()}})
        except Exception as err:  # recorded in the JSON: the timings stand without it
            infos.append({"kernel": name, "error": f"{type(err).__name__}: {err}"})
    return infos


@dataclass
class Results:
    """The rows of the run (one per variant, dim and configuration) and the failures, in run order."""

    nbytes: int  # bytes counted per call: x read once + the output written once
    copy_gbps: float
    rows: list = field(default_factory=list)
    failures: list = field(default_factory=list)

    def record(self, variant, dim, block, warps, ms, correct, checks, diagnostic=False, note="") -> None:
        gbps = self.nbytes / ms / 1e6
        label = f"{variant} constant u" if diagnostic else variant
        instr, predicted = PREDICTIONS.get((label, dim), (None, ""))
        self.rows.append({"variant": label, "dim": dim, "block": block, "num_warps": warps, "ms": ms, "gbps": gbps,
                          "fraction_of_copy": gbps / self.copy_gbps, "correct": correct, "checks": checks,
                          "diagnostic": diagnostic, "predicted_fraction": predicted,
                          "offline_sass_instructions_per_group": instr, "note": note})

    def best(self) -> dict:
        """(variant, dim) -> the fastest correct row (diagnostics and errors left out)."""
        best = {}
        for r in self.rows:
            if "error" not in r and r["correct"] and not r["diagnostic"]:
                key = (r["variant"], r["dim"])
                if key not in best or r["ms"] < best[key]["ms"]:
                    best[key] = r
        return best

    def print_table(self) -> None:
        print(f"\n{'variant':<24}{'dim':>4}{'block':>7}{'warps':>6}{'ms':>9}{'GB/s':>8}{'x copy':>8}  {'correct':<12}"
              f"{'predicted':>11}{'SASS/grp':>9}")
        for r in self.rows:
            if "error" in r:
                print(f"{r['variant']:<24}{r['dim']:>4}  ERROR {r['error']}")
                continue
            correct = "diagnostic" if r["diagnostic"] else ("yes" if r["correct"] else "NO")
            print(f"{r['variant']:<24}{r['dim']:>4}{r['block']:>7}{r['num_warps']:>6}{r['ms']:>9.4f}{r['gbps']:>8.0f}"
                  f"{r['fraction_of_copy']:>8.2f}  {correct:<12}{r['predicted_fraction']:>11}"
                  f"{r['offline_sass_instructions_per_group'] or '':>9}")
        print("\nbest correct configuration per variant and dim (fraction of the copy rate):")
        for (variant, dim), r in sorted(self.best().items(), key=lambda kv: (kv[0][1], -kv[1]["fraction_of_copy"])):
            print(f"  dim {dim:>2}  {variant:<24} {r['fraction_of_copy']:.2f}  ({r['ms']:.4f} ms, block {r['block']}, "
                  f"{r['num_warps']} warps)")
        if self.failures:
            print("FAILED: " + " | ".join(self.failures))


@dataclass
class Reference:
    """The benchmark tensor and the reference's probabilities on a slice of it, per group dim."""

    x: torch.Tensor
    slices: dict  # dim -> rows of x checked against the reference (1024 for dim 0, 256 for the last dim)
    groups: dict  # dim -> (groups of the slice (n, 4) float64, their probabilities)

    @classmethod
    def of(cls, x: torch.Tensor, smoke: bool) -> "Reference":
        from sparsity_lab.methods.mvue import mvue_probabilities

        rows = x.shape[0]
        slices = {0: min(rows, 16 if smoke else 1024), -1: min(rows, 8 if smoke else 256)}
        groups = {}
        for dim in DIMS:
            gx = groups_of(x[:slices[dim]].double(), dim)
            groups[dim] = (gx, mvue_probabilities(gx))
        return cls(x, slices, groups)

    def support_and_values(self, y: torch.Tensor, dim: int) -> tuple[bool, str]:
        gx, p = self.groups[dim]
        return check_support_and_values(gx, groups_of(y[:self.slices[dim]].double(), dim), p)


def time_variant(M, ref: Reference, variant: str, dim: int, timer: Timer, device: torch.device, smoke: bool,
                 results: Results) -> None:
    """Check one variant along one dim (every configuration's output, the small-tensor statistics),
    then time each configuration. An exception is recorded as the row's error, not raised."""
    x = ref.x
    configs = CONFIGS[(variant, dim)]
    try:
        outputs = []
        for block, warps in configs:
            outputs.append(M.mvue24(x, dim=dim, seed=3, block=block, num_warps=warps, variant=variant))
        y = outputs[0]
        checks = {"support_and_values": ref.support_and_values(y, dim)}
        most = int((groups_of(y, dim) != 0).sum(1).max())
        checks["at_most_2_everywhere"] = (most <= 2, "ok" if most <= 2 else f"a group keeps {most}")
        if len(outputs) > 1:
            same = all(torch.equal(y, other) for other in outputs[1:])
            checks["same_output_every_config"] = (same, "ok" if same else "configurations disagree for one seed")
        del outputs
        checks.update(small_checks(M, variant, dim, *configs[0], device, smoke))
        correct = all(ok for ok, _ in checks.values())
        for block, warps in configs:
            ms = timer(lambda: M.mvue24(x, dim=dim, seed=3, block=block, num_warps=warps, variant=variant))
            results.record(variant, dim, block, warps, ms, correct, {k: v[1] for k, v in checks.items()})
        if not correct:
            results.failures.append(f"{variant} dim {dim}: "
                                    + "; ".join(f"{k}: {v[1]}" for k, v in checks.items() if not v[0]))
    except Exception as err:  # one broken variant must not hide the others' numbers: recorded
        results.failures.append(f"{variant} dim {dim}: {type(err).__name__}: {str(err).splitlines()[0][:300]}")
        results.rows.append({"variant": variant, "dim": dim, "error": results.failures[-1]})


def time_diagnostics(M, ref: Reference, variants, timer: Timer, results: Results) -> None:
    """The same arithmetic without the RNG (u = 0.5 everywhere, not MVUE): what the random numbers cost."""
    x = ref.x
    for (variant, dim), (block, warps) in DIAGNOSTICS.items():
        if variant not in variants:
            continue
        try:
            y = M.mvue24_constant_u_for_timing(x, dim=dim, block=block, num_warps=warps, variant=variant)
            ok, detail = ref.support_and_values(y, dim)
            ms = timer(lambda: M.mvue24_constant_u_for_timing(x, dim=dim, block=block, num_warps=warps, variant=variant))
            results.record(variant, dim, block, warps, ms, False, {"support_and_values": detail}, diagnostic=True,
                           note="u = 0.5 everywhere: deterministic, NOT an MVUE; shows what the RNG costs")
        except Exception as err:
            results.rows.append({"variant": f"{variant} constant u", "dim": dim, "error": f"{type(err).__name__}: {err}"})


def check_arguments(args: argparse.Namespace) -> None:
    """Unknown variant names and sizes the groups of four do not divide: ValueError, before any work."""
    names = importlib.import_module("benchmarks.baselines.mvue24").VARIANTS
    if args.variants is not None:
        unknown = [v for v in (x.strip() for x in args.variants.split(",")) if v not in names]
        if unknown:
            raise ValueError(f"--variants: unknown {unknown}; expected names from {names}")
    if args.rows % 4 or args.cols % 4:
        raise ValueError(f"--rows and --cols must be divisible by 4, got {args.rows} x {args.cols}")


def run(args: argparse.Namespace) -> int:
    start_time = time.perf_counter()
    device = bench_device(args.smoke, "mvue_variants")
    if device is None:
        return 2
    M = importlib.import_module("benchmarks.baselines.mvue24")  # the variants; "level_philox4" is the shipped kernel
    from sparsity_lab.provenance import provenance

    variants = M.VARIANTS if args.variants is None else tuple(v.strip() for v in args.variants.split(","))
    unknown = [v for v in variants if v not in M.VARIANTS]
    if unknown:
        raise ValueError(f"--variants: unknown {unknown}; expected names from {M.VARIANTS}")
    rows, cols = (32, 64) if args.smoke else (args.rows, args.cols)
    if rows % 4 or cols % 4:
        raise ValueError(f"--rows and --cols must be divisible by 4, got {rows} x {cols}")
    timer = Timer(args.smoke, args.rep_ms, warmup_ms=10)

    # 1. the ceiling
    copy_gbps = copy_ceiling_gbps(timer, 64 * MIB if not args.smoke else 4096, device)  # 128 MiB
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (smoke)"
    print(f"device: {device_name}; copy ceiling {copy_gbps:.0f} GB/s (128 MiB read + 128 MiB written)")

    # 2. every variant along each group dim, then the diagnostics
    torch.manual_seed(0)
    ref = Reference.of(torch.randn(rows, cols, device=device, dtype=torch.bfloat16), args.smoke)
    results = Results(nbytes=2 * 2 * ref.x.numel(), copy_gbps=copy_gbps)
    print(f"benchmark tensor {rows} x {cols} bf16 ({ref.x.numel() * 2 / MIB:.0f} MiB); "
          f"bytes counted {results.nbytes / 1e6:.0f} MB")
    for variant in variants:
        for dim in DIMS:
            if (variant, dim) in SAME_KERNEL:
                print(f"{variant} dim {dim}: the {SAME_KERNEL[(variant, dim)]} kernel (not timed twice)")
                continue
            t0 = time.perf_counter()
            time_variant(M, ref, variant, dim, timer, device, args.smoke, results)
            print(f"  {variant} dim {dim}: {time.perf_counter() - t0:.1f} s (compile, checks, timing)")
    time_diagnostics(M, ref, variants, timer, results)
    sync(device)

    # 3. the table and the JSON
    results.print_table()
    elapsed = time.perf_counter() - start_time
    print(f"elapsed {elapsed:.1f} s")
    if args.smoke:
        print("(smoke run on the CPU interpreter: the numbers above are not measurements of the kernels)")
    payload = {"provenance": provenance(), "smoke": bool(args.smoke), "device": device_name,
               "copy_gbps": copy_gbps, "shape": [rows, cols], "dtype": "bfloat16", "bytes_counted": results.nbytes,
               "rep_ms": args.rep_ms, "rows": results.rows, "failures": results.failures, "elapsed_s": elapsed,
               "best": [{"variant": v, "dim": d, **{k: r[k] for k in ("block", "num_warps", "ms", "fraction_of_copy")}}
                        for (v, d), r in results.best().items()],
               "compiled_kernels": _compiled_kernel_info() if not args.smoke else []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return 1 if results.failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mvue_variants", description=__doc__.splitlines()[0])
    add_arguments(parser)
    with warnings.catch_warnings():  # the v2 baselines are measured on purpose
        warnings.filterwarnings("ignore", message="MVUE variant .* is a measurement baseline")
        return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
