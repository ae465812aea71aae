"""Exercises of notebooks 01 (N:M masks, kept magnitude) and 02 (transposable masks).

Each ``check_...(your_function)`` runs your code on fresh random weights and on hand-made edge cases
(ties, zeros, negative values, odd shapes), compares it with the library and prints what is wrong.
Worked solutions: ``sparsity_lab/course/exercises/solutions/masks.py``.
"""
from __future__ import annotations

import math

import secrets

import torch

from ...masks import nm_mask, transposable_mask, transposable_patterns
from ...masks.greedy import solve_greedy_keep, solve_greedy_prune
from ...masks.tiles import to_tiles
from .checking import CheckResult, ExerciseReport, run_check, tie_broken_otherwise, tie_problem

SOLUTION = "masks"


def _fresh_generator() -> torch.Generator:
    """Fresh random inputs for every check, without touching the notebook's global torch RNG."""
    return torch.Generator().manual_seed(secrets.randbits(31))


# --- references (written out here so that a check never depends on the learner's code) -------------
def _signed_nm_mask(w: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """The N:M mask of the largest *signed* values: the classic mistake of forgetting |w|."""
    return nm_mask(w - w.min() + 1.0, n, m)


def _unstructured_reference(w: torch.Tensor, density: float) -> torch.Tensor:
    flat = w.abs().reshape(-1)
    order = torch.sort(flat, descending=True, stable=True).indices
    keep = torch.zeros(flat.numel(), dtype=torch.bool)
    keep[order[:round(density * flat.numel())]] = True
    return keep.reshape(w.shape)


def _as_mask(r: ExerciseReport, got, shape: tuple[int, ...], label: str) -> torch.Tensor | None:
    """got as a bool tensor of ``shape``, or None after recording why it is not one."""
    if got is None:
        return None
    if not isinstance(got, torch.Tensor):
        r.expect(False, f"{label}: expected a torch.Tensor (a bool mask), got {type(got).__name__}")
        return None
    if tuple(got.shape) != tuple(shape):
        r.expect(False, f"{label}: shape {tuple(got.shape)}, expected the weight's {tuple(shape)}")
        return None
    if got.dtype != torch.bool:
        r.expect(False, f"{label}: return a bool mask (True = kept), got dtype {got.dtype}")
        return got.detach().cpu() != 0
    return got.detach().cpu()


def _first(bad: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in bad.nonzero()[0])


# --- notebook 01 ------------------------------------------------------------------------------------
def _nm_case(r: ExerciseReport, fn, w: torch.Tensor, n: int, m: int, label: str) -> None:
    got = _as_mask(r, r.call(fn, w.clone(), n, m, what=f"{label}: your nm_mask(w, {n}, {m})"), w.shape, label)
    if got is None:
        return
    want = nm_mask(w, n, m)
    if torch.equal(got, want):
        return
    counts = got.reshape(*w.shape[:-1], -1, m).sum(-1)
    if bool((counts != n).any()):
        at = _first(counts != n)
        r.expect(False, f"{label}: group {at} (groups of {m} consecutive entries along the last dimension) keeps "
                        f"{int(counts[at])} entries, expected exactly {n}")
        return
    if torch.equal(got, _signed_nm_mask(w, n, m)):
        r.expect(False, f"{label}: your mask keeps the largest values; it must keep the largest magnitudes |w| "
                        "(a weight of -1.2 matters more than one of 0.9)")
        return
    a = w.abs().double()
    at = tie_broken_otherwise((a + 1) * got, (a + 1) * want, m)  # + 1: a kept zero counts too
    if at is not None:
        r.expect(False, tie_problem(label, at))
        return
    at = _first(got != want)
    r.expect(False, f"{label}: entry {at} (|w| = {float(a[at]):.4g}) is {'kept' if got[at] else 'pruned'}; "
                    f"the {n} largest |w| of its group of {m} say it should be {'kept' if want[at] else 'pruned'}")


def check_nm_mask(nm_mask_fn, show: bool = True, hint: bool = False) -> CheckResult:
    """Exercise: ``nm_mask_fn(w, n, m)`` -> bool mask of w's shape keeping the n largest |w| of every m
    consecutive entries along the last dimension, ties to the lowest index."""
    report = ExerciseReport("nm_mask: keep the n largest |w| of every m", solution=SOLUTION,
                            hint="reshape the last dimension into (K / m, m) groups, rank |w| inside each group.")

    def body(r: ExerciseReport) -> None:
        gen = _fresh_generator()
        _nm_case(r, nm_mask_fn, torch.randn(8, 16, generator=gen), 2, 4, "random 8 x 16, 2:4")
        _nm_case(r, nm_mask_fn, torch.tensor([[0.9, -0.4, 0.3, -1.2, -3.0, 1.0, 2.0, -4.0]]), 2, 4,
                 "negative weights [[0.9, -0.4, 0.3, -1.2, -3, 1, 2, -4]]")
        _nm_case(r, nm_mask_fn, torch.randint(-2, 3, (6, 8), generator=gen).float(), 2, 4, "many ties (integers -2..2)")
        _nm_case(r, nm_mask_fn, torch.zeros(2, 8), 2, 4, "all zeros")
        _nm_case(r, nm_mask_fn, torch.randn(3, 8, generator=gen), 1, 4, "3 x 8, 1:4")
        _nm_case(r, nm_mask_fn, torch.randn(5, 16, generator=gen), 4, 8, "5 x 16, 4:8")
        _nm_case(r, nm_mask_fn, torch.randn(2, 3, 8, generator=gen), 2, 4, "3-D weight 2 x 3 x 8")
    return run_check(report, body, show, hint)


def check_kept_fraction(kept_fraction_fn, show: bool = True, hint: bool = False) -> CheckResult:
    """Exercise: ``kept_fraction_fn(w, mask)`` -> sum of |w| over kept entries / sum of |w| (a float)."""
    report = ExerciseReport("kept_fraction: the share of sum |w| a mask keeps", solution=SOLUTION,
                            hint="weigh each kept entry by |w|: (|w| * mask).sum() / |w|.sum().")

    def body(r: ExerciseReport) -> None:
        gen = _fresh_generator()
        for w, label in ((torch.randn(8, 16, generator=gen), "random 8 x 16 with a 2:4 mask"),
                         (torch.tensor([[0.9, -0.4, 0.3, -1.2]]), "[[0.9, -0.4, 0.3, -1.2]] with a 2:4 mask")):
            mask = nm_mask(w, 2, 4)
            got = r.call(kept_fraction_fn, w.clone(), mask.clone(), what=f"{label}: your kept_fraction")
            if got is None:
                continue
            try:
                value = float(got)
            except (TypeError, ValueError):
                r.expect(False, f"{label}: expected a number, got {type(got).__name__}")
                continue
            a = w.abs().double()
            want = float((a * mask).sum() / a.sum())
            if math.isclose(value, want, rel_tol=1e-6, abs_tol=1e-9):
                continue
            if math.isclose(value, float(mask.double().mean()), rel_tol=1e-6):
                r.expect(False, f"{label}: {value:.4f} is the fraction of entries kept; weigh each entry by |w|")
            elif any(math.isclose(value, signed, rel_tol=1e-4) for signed in (  # float32 as the learner's w, and
                    float((w * mask).sum() / w.sum()),                         # float64: sum w can be near 0
                    float((w.double() * mask).sum() / w.double().sum()))):
                r.expect(False, f"{label}: {value:.4f} uses the signed w; use magnitudes |w|")
            else:
                r.expect(False, f"{label}: got {value:.6g}, expected {want:.6g}")
    return run_check(report, body, show, hint)


def check_unstructured_mask(unstructured_fn, show: bool = True, hint: bool = False) -> CheckResult:
    """Exercise: ``unstructured_fn(w, density)`` -> bool mask keeping the round(density * numel) largest |w|
    anywhere in w (ties to the lowest row-major index)."""
    report = ExerciseReport("unstructured mask: the largest |w| anywhere", solution=SOLUTION,
                            hint="flatten |w|, sort it (stable, descending) and keep the first round(density * numel).")

    def body(r: ExerciseReport) -> None:
        gen = _fresh_generator()
        cases = ((torch.randn(8, 16, generator=gen), 0.5, "random 8 x 16, density 0.5"),
                 (torch.randn(6, 10, generator=gen), 0.3, "random 6 x 10, density 0.3"),
                 (torch.tensor([[1.0, -1.0, 1.0, 0.0], [2.0, 0.5, -2.0, 1.0]]), 0.5, "ties, density 0.5"))
        for w, d, label in cases:
            got = _as_mask(r, r.call(unstructured_fn, w.clone(), d, what=f"{label}: your function"), w.shape, label)
            if got is None:
                continue
            want = _unstructured_reference(w, d)
            if torch.equal(got, want):
                continue
            if int(got.sum()) != int(want.sum()):
                r.expect(False, f"{label}: keeps {int(got.sum())} entries, expected round({d} * {w.numel()}) = "
                                f"{int(want.sum())}")
            elif tie_broken_otherwise(((w.abs() + 1) * got).reshape(-1), ((w.abs() + 1) * want).reshape(-1),
                                      w.numel()) is not None:
                r.expect(False, tie_problem(label, _first(got != want)) + " (here: the lowest row-major index)")
            else:
                at = _first(got != want)
                r.expect(False, f"{label}: entry {at} (|w| = {float(w.abs()[at]):.4g}) should be "
                                f"{'kept' if want[at] else 'pruned'}: keep the largest magnitudes of the whole matrix")
    return run_check(report, body, show, hint)


def check_expected_unstructured_kept(expected_fn, show: bool = True, hint: bool = False) -> CheckResult:
    """Exercise: ``expected_fn(density)`` -> E[kept |w|] / E[|w|] of unstructured magnitude pruning of
    i.i.d. Gaussian weights: exp(-t^2 / 2) with t = sqrt(2) erfinv(1 - density)."""
    report = ExerciseReport("expected kept fraction of unstructured pruning (Gaussian weights)", solution=SOLUTION,
                            hint="P(|w| > t) = 1 - erf(t / sqrt 2) = density gives t; E[|w|; |w| > t] / E|w| = "
                                 "exp(-t^2 / 2).")

    def body(r: ExerciseReport) -> None:
        for d in (0.5, 0.25, 0.125, 0.9, 1.0):
            got = r.call(expected_fn, d, what=f"your function({d})")
            if got is None:
                continue
            t = math.sqrt(2.0) * float(torch.special.erfinv(torch.tensor(1.0 - d, dtype=torch.float64)))
            want = math.exp(-t * t / 2)
            try:
                value = float(got)
            except (TypeError, ValueError):
                r.expect(False, f"density {d}: expected a number, got {type(got).__name__}")
                continue
            if not math.isclose(value, want, rel_tol=1e-5, abs_tol=1e-9):
                wrong_t = math.sqrt(2.0) * float(torch.special.erfinv(torch.tensor(d, dtype=torch.float64)))
                why = (" (that is the answer for density 1 - d: P(|w| > t) = 1 - erf(t / sqrt 2) must equal d)"
                       if math.isclose(value, math.exp(-wrong_t ** 2 / 2), rel_tol=1e-5) else "")
                r.expect(False, f"density {d}: got {value:.6g}, expected {want:.6g}{why}")
        # the formula must agree with a measurement, not only with itself
        w = torch.randn(512, 512, generator=torch.Generator().manual_seed(0)).double()
        a = w.abs().reshape(-1)
        measured = float(torch.sort(a, descending=True).values[: a.numel() // 2].sum() / a.sum())
        got = r.call(expected_fn, 0.5, what="your function(0.5)")
        if got is not None and isinstance(got, (int, float, torch.Tensor)):
            r.expect(abs(float(got) - measured) < 0.01, f"density 0.5: {float(got):.4f} is far from the kept fraction "
                                                        f"measured on 512 x 512 Gaussian weights, {measured:.4f}")
    return run_check(report, body, show, hint)


# --- notebook 02 ------------------------------------------------------------------------------------
def check_transposable_patterns(patterns_fn, show: bool = True, hint: bool = False) -> CheckResult:
    """Exercise: ``patterns_fn(n, m)`` -> bool tensor (P, m, m) of every m x m 0/1 tile with exactly n ones
    in each row and each column (90 for 2:4), each once, any order."""
    report = ExerciseReport("transposable patterns: every tile with n ones per row and per column",
                            solution=SOLUTION,
                            hint="choose the n kept columns of each row (itertools.combinations), one row at a "
                                 "time, and keep the choices whose column sums all end at n.")

    def body(r: ExerciseReport) -> None:
        for n, m in ((2, 4), (1, 4), (1, 3), (2, 3)):
            label = f"{n}:{m}"
            got = r.call(patterns_fn, n, m, what=f"your patterns({n}, {m})")
            if got is None:
                continue
            if not isinstance(got, torch.Tensor) or got.dim() != 3 or tuple(got.shape[1:]) != (m, m):
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                r.expect(False, f"{label}: expected a tensor of shape (P, {m}, {m}), got {shape}")
                continue
            got = got.detach().cpu() != 0
            want = transposable_patterns(n, m)
            rows_ok = (got.sum(-1) == n).all(-1)
            cols_ok = (got.sum(-2) == n).all(-1)
            if not bool((rows_ok & cols_ok).all()):
                bad = int((~(rows_ok & cols_ok)).nonzero()[0])
                r.expect(False, f"{label}: pattern {bad} does not have {n} ones in every row and column: "
                                f"{got[bad].int().tolist()}")
                continue
            keys = {tuple(p.reshape(-1).tolist()) for p in got}
            if len(keys) < got.shape[0]:
                r.expect(False, f"{label}: {got.shape[0] - len(keys)} patterns appear more than once")
                continue
            missing = {tuple(p.reshape(-1).tolist()) for p in want} - keys
            if missing:
                example = torch.tensor(sorted(missing)[0]).reshape(m, m).int().tolist()
                r.expect(False, f"{label}: {len(missing)} of the {want.shape[0]} patterns are missing, e.g. {example}")
    return run_check(report, body, show, hint)


def _tile_kept(w: torch.Tensor, mask: torch.Tensor, m: int) -> torch.Tensor:
    return (to_tiles(w.abs().double(), m) * to_tiles(mask, m)).sum((-2, -1))


def check_transposable_mask_search(search_fn, show: bool = True, hint: bool = False) -> CheckResult:
    """Exercise: ``search_fn(w)`` -> the exact transposable 2:4 mask of a 2-D w (O, I), by scoring all 90
    patterns on every 4x4 tile (any optimal mask passes: ties may pick another pattern)."""
    report = ExerciseReport("exact transposable 2:4 mask by pattern search", solution=SOLUTION,
                            hint="cut |w| into 4x4 tiles (reshape(O/4, 4, I/4, 4), then permute), score = "
                                 "tiles (T, 16) @ patterns (16, 90), argmax, and put the tiles back.")

    def body(r: ExerciseReport) -> None:
        gen = _fresh_generator()
        cases = ((torch.randn(8, 8, generator=gen), "random 8 x 8"),
                 (torch.randn(8, 16, generator=gen), "random 8 x 16 (not square)"),
                 (torch.randn(12, 4, generator=gen), "random 12 x 4"),
                 (torch.randint(-2, 3, (8, 8), generator=gen).float(), "many ties (integers -2..2)"))
        for w, label in cases:
            got = _as_mask(r, r.call(search_fn, w.clone(), what=f"{label}: your search(w)"), w.shape, label)
            if got is None:
                continue
            rows, cols = to_tiles(got, 4).sum(-1), to_tiles(got, 4).sum(-2)
            if bool((rows != 2).any()) or bool((cols != 2).any()):
                t = int(((rows != 2).any(-1) | (cols != 2).any(-1)).nonzero()[0])
                r.expect(False, f"{label}: 4x4 tile {t} (row-major order of tiles) is not 2 per row and column: "
                                f"{to_tiles(got, 4)[t].int().tolist()}")
                continue
            best = _tile_kept(w, transposable_mask(w, 2, 4, solver="patterns"), 4)
            kept = _tile_kept(w, got, 4)
            short = kept < best - 1e-6 * (1 + best)
            if bool(short.any()):
                t = int(short.nonzero()[0])
                r.expect(False, f"{label}: tile {t} keeps |w| summing to {float(kept[t]):.4f}; the best pattern "
                                f"keeps {float(best[t]):.4f}. Check how you cut w into tiles and put them back.")
    return run_check(report, body, show, hint)


def check_greedy_keep(greedy_fn, show: bool = True, hint: bool = False) -> CheckResult:
    """Exercise: ``greedy_fn(w, n, m)`` -> the greedy transposable mask of Hubara et al. 2021 on every m x m
    tile: visit entries by descending |w| (ties: lowest row-major index in the tile first), keep one while
    its row and its column both hold fewer than n kept entries."""
    report = ExerciseReport("greedy transposable mask (descending |w|, keep while there is room)",
                            solution=SOLUTION,
                            hint="per tile: order = argsort(-|tile|.flatten(), stable=True); keep p when "
                                 "row_count[p // m] < n and col_count[p % m] < n.")

    def body(r: ExerciseReport) -> None:
        gen = _fresh_generator()
        cases = ((torch.randn(8, 8, generator=gen), 2, 4, "random 8 x 8, 2:4"),
                 (torch.tensor([[10., 0, 0, 0], [0, .1, 5, 5], [0, 5, .1, 5], [0, 5, 5, .1]]), 2, 4,
                  "a tile where greedy ends one short"),
                 (torch.randint(0, 3, (8, 8), generator=gen).float(), 2, 4, "many ties (integers 0..2)"),
                 (torch.randn(4, 12, generator=gen), 1, 4, "random 4 x 12, 1:4"),
                 (torch.randn(8, 16, generator=gen), 4, 8, "random 8 x 16, 4:8"))
        for w, n, m, label in cases:
            got = _as_mask(r, r.call(greedy_fn, w.clone(), n, m, what=f"{label}: your greedy"), w.shape, label)
            if got is None:
                continue
            want = solve_greedy_keep(w, n, m)
            if torch.equal(got, want):
                continue
            tiles = to_tiles(got, m)
            if bool((tiles.sum(-1) > n).any()) or bool((tiles.sum(-2) > n).any()):
                r.expect(False, f"{label}: a row or column of a tile keeps more than {n}: check both counts before keeping")
            elif torch.equal(got, solve_greedy_prune(w, n, m)):
                r.expect(False, f"{label}: this is the prune greedy (ascending |w|, prune while a line holds more "
                                f"than {n}); this exercise visits by descending |w| and keeps while there is room")
            elif torch.equal(_tile_kept(w, got, m), _tile_kept(w, want, m)):
                r.expect(False, f"{label}: right mass, different ties: visit equal |w| lowest row-major index first")
            else:
                at = _first(got != want)
                r.expect(False, f"{label}: entry {at} is {'kept' if got[at] else 'pruned'}, greedy "
                                f"{'keeps' if want[at] else 'prunes'} it (visit in descending |w| within each tile)")
    return run_check(report, body, show, hint)
