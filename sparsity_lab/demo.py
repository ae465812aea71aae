"""``sparsity-lab demo``: a two-minute tour on the CPU.

1. A 2:4 magnitude mask drawn over a small weight.
2. The transposable-mask solvers compared on one Gaussian matrix (kept |W| and time).
3. A flip-rate trace: a tiny MLP trained with STE, masked decay and the dense reference.
"""
from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn
from tqdm.auto import tqdm

from .masks import EXACT_SOLVERS, SOLVERS, kept_fraction, nm_mask, transposable_mask
from .methods.config import STE, Dense, MaskedDecay, SparsityMethod
from .sparsify import flip_report, sparsify
from .training_hooks import attach_optimizer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=150, help="training steps per method (default 150)")
    parser.add_argument("--size", type=int, default=512, help="matrix size for the solver comparison")
    parser.add_argument("--seed", type=int, default=0)


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


class TinyMLP(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


def flip_trace(method: SparsityMethod, steps: int, seed: int) -> tuple[list[float], float]:
    """Train TinyMLP to imitate a fixed random teacher; return per-step overall flip rates and the final loss."""
    torch.manual_seed(seed)
    teacher, student = TinyMLP(), TinyMLP()
    sparsify(student, method)
    opt = torch.optim.AdamW(student.parameters(), lr=3e-3)
    attach_optimizer(student, opt)
    gen = torch.Generator().manual_seed(seed + 1)
    rates, loss = [], math.nan
    for _ in tqdm(range(steps), desc=f"{method.name:>12}", leave=False):
        x = torch.randn(64, 64, generator=gen)
        with torch.no_grad():
            y = teacher(x)
        loss_t = (student(x) - y).pow(2).mean()
        opt.zero_grad()
        loss_t.backward()
        rates.append(flip_report(student, fresh_only=True)["overall"])  # masks of this step
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        loss = loss_t.item()
    return rates, loss


def sparkline(values: list[float]) -> str:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return ""
    top = max(finite) or 1.0
    ticks = " .:-=+*#%@"
    return "".join(ticks[min(len(ticks) - 1, int(v / top * (len(ticks) - 1)))] if not math.isnan(v) else " "
                   for v in values)


def run(args: argparse.Namespace) -> int:
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
    return 0
