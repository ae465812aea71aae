"""``python -m benchmarks masks``: the transposable-mask solvers timed and compared on the CPU.

Each case is one Gaussian float32 matrix (fixed seed). Every solver that applies to its N:M runs on
the same matrix, side by side in one run; the plain row-wise N:M mask (``nm_mask``) is timed too,
as the reference cost of a mask that is not transposable. Times are wall clock, median of up to
``--repeats`` runs after a warm-up (a solver stops repeating once its runs took ``--budget-s``).
Targets (on a 2-core CPU): exact transposable 2:4 on 4096 x 4096 under 1 s and exact
4:8 on 1024 x 1024 under 30 s, each by the solver that ``solver="auto"`` picks.
Quality per solver (masks.quality): kept |W| fraction, kept mass relative to the exact optimum,
rows/columns left with fewer than N. Writes results/mask_solvers_cpu.json.
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from sparsity_lab.masks import SOLVERS, nm_mask, transposable_mask
from sparsity_lab.masks.patterns import pattern_count_small
from sparsity_lab.masks.quality import ROWWISE, applicable_solvers, exact_agreement, gaussian_weight, quality_rows
from sparsity_lab.course.live import time_call
from sparsity_lab.provenance import write_result
from sparsity_lab.lab.arguments import nonnegative_int, output_folder, positive_float, positive_int


@dataclass(frozen=True)
class Case:
    n: int
    m: int
    size: int  # the matrix is size x size
    target_s: float  # time target for the exact solver that "auto" picks

    @property
    def auto_solver(self) -> str:
        return "patterns" if pattern_count_small(self.n, self.m) else "flow"


CASES = (Case(2, 4, 4096, 1.0), Case(4, 8, 1024, 30.0))
QUICK_CASES = (Case(2, 4, 128, 1.0), Case(4, 8, 64, 30.0))  # a smoke run for tests; targets still shown
# exact solvers must agree on kept mass up to flow's integer-cost quantisation (1e-8 of a tile max)
AGREEMENT_TOL = 1e-6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out-dir", type=output_folder, default=None,
                        help="where to write mask_solvers_cpu.json (default results/)")
    parser.add_argument("--quick", action="store_true", help="small matrices (a smoke test, not the figures)")
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="timed runs per solver, median reported (default 3)")
    parser.add_argument("--budget-s", type=positive_float, default=60.0,
                        help="stop repeating a solver once its runs took this long (default 60 s; >= 1 run)")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the Gaussian weights (default 0)")
    parser.add_argument("--solvers", nargs="+", default=list(SOLVERS), choices=list(SOLVERS),
                        help="solvers to time (default: all)")


def _warm_up(cases, solvers) -> None:
    """Import OR-Tools/SciPy, enumerate tile patterns, touch every code path once (untimed)."""
    for case in cases:
        w = gaussian_weight(2 * case.m, 2 * case.m, seed=123)
        nm_mask(w, case.n, case.m)
        for s in solvers:
            if s in applicable_solvers(case.n, case.m):
                transposable_mask(w, case.n, case.m, solver=s)


def run_case(case: Case, solvers: list[str], repeats: int, budget_s: float, seed: int, progress) -> dict:
    """Time every applicable solver on one Gaussian matrix; returns {"case": ..., "rows": [...]}."""
    w = gaussian_weight(case.size, case.size, seed)
    n, m = case.n, case.m
    todo = [s for s in solvers if s in applicable_solvers(n, m)]
    timings, masks = {}, {}
    progress.set_postfix_str(f"{n}:{m} {case.size}^2 {ROWWISE}")
    timings[ROWWISE], _ = time_call(lambda: nm_mask(w, n, m, dim=1), repeats, budget_s)
    for s in todo:
        progress.set_postfix_str(f"{n}:{m} {case.size}^2 {s}")
        timings[s], masks[s] = time_call(lambda s=s: transposable_mask(w, n, m, solver=s), repeats, budget_s)
        progress.update(1)
    # the optimum to compare against: the auto solver's mask (computed untimed if not asked for)
    optimum = masks.get(case.auto_solver)
    rows = quality_rows(w, masks, n, m, optimum=optimum)
    rowwise_median = statistics.median(timings[ROWWISE])
    for row in rows:
        t = timings[row["solver"]]
        row.update({"size": case.size, "runs": len(t), "median_s": statistics.median(t), "min_s": min(t),
                    "times_s": t, "time_vs_rowwise": statistics.median(t) / rowwise_median})
    auto_median = statistics.median(timings[case.auto_solver]) if case.auto_solver in timings else None
    summary = {**asdict(case), "auto_solver": case.auto_solver, "auto_median_s": auto_median,
               "target_met": None if auto_median is None else auto_median < case.target_s,
               "exact_kept_fraction_spread": exact_agreement(rows)}
    return {"case": summary, "rows": rows}


def _fmt(x, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:>{width}{spec}}"


def print_table(results: list[dict]) -> None:
    head = (f"{'N:M':>4} {'size':>5} {'solver':>12} {'exact':>5} {'runs':>4} {'median s':>9} {'x rowwise':>9} "
            f"{'kept':>7} {'vs opt':>7} {'short rows':>10} {'tiles>opt':>9}")
    print("\n" + head + "\n" + "-" * len(head))
    for res in results:
        for r in res["rows"]:
            print(f"{r['n']}:{r['m']:<2} {r['size']:>5} {r['solver']:>12} {'yes' if r['exact'] else 'no':>5} "
                  f"{r['runs']:>4} {r['median_s']:>9.3f} {r['time_vs_rowwise']:>9.1f} {r['kept_fraction']:>7.4f} "
                  f"{r['relative_to_optimum']:>7.4f} {_fmt(r['short_row_fraction'], '.4f', 10)} "
                  f"{_fmt(r['tiles_above_optimum'], '.4f', 9)}")
    print("kept = sum |w| kept / sum |w|; vs opt = kept mass / exact transposable optimum; rowwise is plain "
          "N:M (not transposable);\nshort rows = tile rows with fewer than N kept; tiles>opt = tiles where an "
          "at-most-N solver keeps more than the exact optimum.\n")
    for res in results:
        c = res["case"]
        if c["auto_median_s"] is None:
            print(f"target {c['n']}:{c['m']} {c['size']}^2: auto solver {c['auto_solver']} not run")
            continue
        verdict = "met" if c["target_met"] else "NOT met"
        print(f"target {c['n']}:{c['m']} exact on {c['size']}x{c['size']} < {c['target_s']:g} s: "
              f"{c['auto_solver']} {c['auto_median_s']:.3f} s -> {verdict}")


def run(args: argparse.Namespace) -> int:
    cases = QUICK_CASES if args.quick else CASES
    print(f"benchmarks masks on the CPU: {torch.get_num_threads()} torch threads, seed {args.seed}, "
          f"median of up to {args.repeats} runs" + (" (--quick: smoke sizes, not the figures)" if args.quick else ""))
    _warm_up(cases, args.solvers)
    total = sum(len([s for s in args.solvers if s in applicable_solvers(c.n, c.m)]) for c in cases)
    results = []
    with tqdm(total=total, desc="benchmarks masks", leave=False) as progress:
        for case in cases:
            results.append(run_case(case, args.solvers, args.repeats, args.budget_s, args.seed, progress))
    print_table(results)
    bad = [r["case"] for r in results if r["case"]["exact_kept_fraction_spread"] > AGREEMENT_TOL]
    for c in bad:
        print(f"ERROR: exact solvers disagree on {c['n']}:{c['m']} (kept fraction spread "
              f"{c['exact_kept_fraction_spread']:.3g} > {AGREEMENT_TOL})")
    payload = {"device": "cpu", "torch_threads": torch.get_num_threads(), "quick": args.quick,
               "repeats": args.repeats, "budget_s": args.budget_s, "seed": args.seed,
               "cases": [r["case"] for r in results], "rows": [row for r in results for row in r["rows"]]}
    path = write_result("mask_solvers_cpu", payload, directory=args.out_dir)
    print(f"wrote {path}")
    return 1 if bad else 0
