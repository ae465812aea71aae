"""One entry point for transposable N:M masks, several solvers behind it."""
from __future__ import annotations

from typing import Callable

import torch

from .flow import solve_flow, solve_lp
from .greedy import solve_greedy_keep, solve_greedy_prune
from .patterns import pattern_count_small, solve_patterns
from .tiles import check_transposable_input

Solver = Callable[[torch.Tensor, int, int], torch.Tensor]

SOLVERS: dict[str, Solver] = {
    "patterns": solve_patterns,  # exact, small M (2:4: the 90-pattern "convolution")
    "flow": solve_flow,  # exact, any N:M (OR-Tools min-cost flow, integer costs)
    "lp": solve_lp,  # exact, any N:M (HiGHS simplex on the integral LP)
    "greedy": solve_greedy_keep,  # Hubara et al. 2021's greedy: >= 1/2 of optimal mass, at most N per line
    "greedy_prune": solve_greedy_prune,  # our prune variant, no bound claimed, at most N per line
}
EXACT_SOLVERS = ("patterns", "flow", "lp")


def transposable_mask(weight: torch.Tensor, n: int = 2, m: int = 4, solver: str = "auto",
                      check: bool = True) -> torch.Tensor:
    """Transposable N:M mask of a 2-D weight: N kept per row and per column of every M x M tile.

    weight: (O, I) float tensor, O and I divisible by M, any device (flow/lp solve on the CPU).
    solver: "auto" (patterns when the pattern count is small, else flow), or a key of SOLVERS.
    Returns bool (O, I) on weight's device. Exact solvers maximise the kept sum of |w|, each up
    to the resolution its docstring states (relative to the largest |w| of the tile).
    check=False skips the argument checks (hot paths whose inputs were checked already); every
    solver still returns a valid mask on NaN/Inf input (they rank as the largest magnitude).
    A meta weight gives a meta mask (shape only).
    """
    if check:
        check_transposable_input(weight, n, m)
    if solver == "auto":
        solver = "patterns" if pattern_count_small(n, m) else "flow"
    if solver not in SOLVERS:
        raise ValueError(f"solver must be 'auto' or one of {sorted(SOLVERS)}, got {solver!r}")
    if solver == "patterns" and not pattern_count_small(n, m):
        raise ValueError(f"solver='patterns' enumerates every tile pattern; {n}:{m} has too many, use 'flow'")
    if weight.is_meta:
        return torch.empty(weight.shape, dtype=torch.bool, device="meta")
    return SOLVERS[solver](weight, n, m)
