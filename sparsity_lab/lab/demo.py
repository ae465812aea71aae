"""``sparsity-lab demo``: a two-minute tour on the CPU.

1. A 2:4 magnitude mask drawn over a small weight.
2. The transposable-mask solvers compared on one Gaussian matrix (kept |W| and time).
3. A flip-rate trace: a tiny MLP trained with STE, masked decay and the dense reference
   (``--seeds N``: every method over N seeds, with the spread and the verdicts of
   ``sparsity_lab.lab.flip_bands``; ``--record PATH`` also writes that run to a JSON file).
"""
from __future__ import annotations

import argparse
import math
import time

import torch

from .arguments import command_errors, multiple_of_4, nonnegative_int, output_file, positive_int
from ..masks import EXACT_SOLVERS, SOLVERS, kept_fraction, nm_mask, transposable_mask
from ..methods.config import STE, Dense, MaskedDecay, SparsityMethod


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=positive_int, default=150, help="training steps per method (default 150)")
    parser.add_argument("--size", type=multiple_of_4, default=512,
                        help="matrix size for the solver comparison, a multiple of 4 (default 512)")
    parser.add_argument("--seed", type=nonnegative_int, default=0)
    parser.add_argument("--seeds", type=positive_int, default=1, help="part 3 over this many seeds (0, 1, ...) "
                        "for every method, with the spread and the verdicts (default 1: one trace)")
    parser.add_argument("--record", metavar="PATH", type=output_file, default=None,
                        help="with --seeds: write the multi-seed run (and its provenance) to this JSON file")


def check_arguments(args: argparse.Namespace) -> None:
    """Options that do not go together (ValueError naming them), before any work."""
    if args.record and args.seeds < 2:
        raise ValueError("--record needs --seeds N with N >= 2")
    if args.record and not args.record.endswith(".json"):
        raise ValueError(f"--record must name a .json file, got {args.record!r}")


def draw_mask(weight: torch.Tensor, mask: torch.Tensor) -> str:
    """Text picture: kept weights as signed values, pruned ones as dots."""
    lines = []
    for row_w, row_m in zip(weight.tolist(), mask.tolist()):
        cells = [f"{w:+.2f}" if keep else "  .  " for w, keep in zip(row_w, row_m)]
        lines.append(" ".join(cells[i] + (" |" if i % 4 == 3 and i + 1 < len(cells) else "") for i in range(len(cells))))
    return "\n".join(lines)


def compare_solvers(size: int, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(size, size, generator=gen)
    rows = [{"solver": "row-wise 2:4 (not transposable)", "kept": kept_fraction(w, nm_mask(w)), "seconds": math.nan}]
    for name in SOLVERS:
        start = time.perf_counter()
        mask = transposable_mask(w, 2, 4, solver=name)
        rows.append({"solver": name + (" (exact)" if name in EXACT_SOLVERS else ""),
                     "kept": kept_fraction(w, mask), "seconds": time.perf_counter() - start})
    return rows


def flip_trace(method: SparsityMethod, steps: int, seed: int) -> tuple[list[float], float]:
    """Train TinyMLP to imitate a fixed random teacher; return per-step overall flip rates and the final loss."""
    from .flip_bands import flip_run

    rates, losses = flip_run(method, steps, seed)
    return rates, losses[-1] if losses else math.nan


def sparkline(values: list[float]) -> str:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return ""
    top = max(finite) or 1.0
    ticks = " .:-=+*#%@"
    return "".join(ticks[min(len(ticks) - 1, int(v / top * (len(ticks) - 1)))] if not math.isnan(v) else " "
                   for v in values)


@command_errors("demo")
def run(args: argparse.Namespace) -> int:
    check_arguments(args)  # also when run() is called without the command line
    torch.manual_seed(args.seed)
    w = torch.randn(4, 8)
    print("1. A 2:4 mask keeps the 2 largest |w| of every 4 consecutive weights in a row:\n")
    print(draw_mask(w, nm_mask(w)))
    tw = torch.randn(8, 8)
    print("\n   A transposable 2:4 mask is 2:4 along rows AND columns of every 4x4 tile (exact, 90 patterns):\n")
    print(draw_mask(tw, transposable_mask(tw)))

    print(f"\n2. Transposable 2:4 solvers on a {args.size}x{args.size} Gaussian matrix:\n")
    print(f"   {'solver':<34}{'kept |W|':>10}{'time (s)':>10}")
    for row in compare_solvers(args.size, args.seed):
        secs = "" if math.isnan(row["seconds"]) else f"{row['seconds']:.3f}"
        print(f"   {row['solver']:<34}{row['kept']:>10.4f}{secs:>10}")

    if args.seeds > 1:
        return _bands(args)
    print(f"\n3. Flip rate (fraction of mask entries that changed per step), {args.steps} steps:\n")
    methods = [Dense(), STE(), MaskedDecay(decay=2e-2, total_steps=args.steps)]
    for method in methods:
        rates, loss = flip_trace(method, args.steps, args.seed)
        measured = [r for r in rates if not math.isnan(r)]  # steps that computed a mask
        early, late = measured[:10], measured[-10:]
        mean = lambda xs: sum(xs) / len(xs) if xs else math.nan  # noqa: E731
        print(f"   {method.name:<13} loss {loss:.4f}  flip rate early {mean(early):.4f} late {mean(late):.4f}")
        print(f"   {'':<13} {sparkline(rates)}")
    print("\n   (masked decay switches to dense fine-tuning at 5/6 of the steps; its trace stops there.)")
    print("   Every method over 5 seeds, with the spread and the verdicts: sparsity-lab demo --seeds 5 --steps 300")
    return 0


def _bands(args: argparse.Namespace) -> int:
    """Part 3 over several seeds: spread per method and the verdicts (``flip_bands``)."""
    from .flip_bands import judge_flip_bands, run_flip_bands, verdict_lines

    seeds = list(range(args.seeds))
    print(f"\n3. Flip rate over {len(seeds)} seeds x {args.steps} steps per method (mean over the last 20 % of "
          "the steps, per seed):\n")
    bands = run_flip_bands(seeds=seeds, steps=args.steps)
    for label, describe in bands.methods.items():
        late = bands.late(label)
        print(f"   {label:<22} {' '.join(f'{v:.4f}' for v in late)}   ({describe})")
    print("\n" + "\n".join("   " + line for line in verdict_lines(judge_flip_bands(bands)).splitlines()))
    if args.record:
        from pathlib import Path

        from .runlog import finite_json
        from ..provenance import write_result
        path = Path(args.record)
        write_result(path.stem, finite_json({"flip_bands": bands.to_dict(), "claims": judge_flip_bands(bands)}),
                     directory=path.parent)
        print(f"\n   recorded to {path}")
    return 0
