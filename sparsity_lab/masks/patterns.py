"""Exact transposable N:M masks by scoring every valid tile pattern.

For 2:4 there are exactly 90 4x4 0/1 matrices with two ones per row and per column. The best
mask of a tile is the pattern with the largest kept magnitude, ``argmax_p <|tile|, p>``: one
matrix product ``|tiles| (T, 16) @ patterns (16, 90)`` and an argmax. This is the "mask by
convolution" of Hu et al. 2024 (a stride-4 convolution with 90 filters) and it is exact.
The same search works for any N:M whose pattern count is small (1:4 -> 24, 2:5 -> 2040).
"""
from __future__ import annotations

import itertools
from functools import lru_cache

import torch

from ..validation import check_nm
from .diversity import count_fixed_line_sums
from .tiles import finite_magnitudes, from_tiles, power_of_two_scale, to_tiles

# Above this many patterns the search is slower than min-cost flow (4:8 has 1.2e11).
MAX_PATTERNS = 5000
# Tiles scored per chunk: keeps the (chunk, P) score matrix in cache.
_CHUNK_TILES = 1 << 15


def _enumerate(n: int, m: int) -> list[tuple[int, ...]]:
    """All M x M 0/1 matrices (flattened) with n ones in every row and column."""
    row_choices = list(itertools.combinations(range(m), n))
    found: list[tuple[int, ...]] = []

    def extend(rows: list[tuple[int, ...]], col_left: list[int]) -> None:
        r = len(rows)
        if r == m:
            flat = [0] * (m * m)
            for i, cols in enumerate(rows):
                for j in cols:
                    flat[i * m + j] = 1
            found.append(tuple(flat))
            return
        rows_left = m - r
        for cols in row_choices:
            if all(col_left[j] > 0 for j in cols):
                nxt = col_left.copy()
                for j in cols:
                    nxt[j] -= 1
                # every column must still be fillable by the rows that remain
                if max(nxt) <= rows_left - 1:
                    extend(rows + [cols], nxt)

    extend([], [n] * m)
    return found


@lru_cache(maxsize=None)
def _patterns_cached(n: int, m: int) -> tuple[tuple[int, ...], ...]:
    return tuple(_enumerate(n, m))


def transposable_patterns(n: int = 2, m: int = 4) -> torch.Tensor:
    """(P, M, M) bool: every valid transposable N:M tile pattern, in a fixed order."""
    check_nm(n, m)
    # count first (cheap DP): enumerating e.g. 4:8's 1.2e11 patterns would never return
    count = count_fixed_line_sums(m, n)
    if count > MAX_PATTERNS:
        raise ValueError(f"{n}:{m} has {count} patterns (more than {MAX_PATTERNS}); use solver='flow'")
    return torch.tensor(_patterns_cached(n, m), dtype=torch.bool).reshape(-1, m, m)


def pattern_count_small(n: int, m: int) -> bool:
    """Whether the pattern search is practical (decided without enumerating huge sets)."""
    return m <= 5 or (m == 6 and n in (1, 5))


def solve_patterns(weight: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Exact transposable mask of a 2-D weight by scoring all tile patterns.

    weight: (O, I), O and I divisible by M. Returns bool (O, I).
    Cost: O*I/M^2 tiles x P patterns x M^2 multiply-adds (2:4: 90 x 16 per tile).

    Scores are sums of float32 magnitudes (float64 for float64 weights), each tile multiplied by
    a power of two that brings its max into [1, 4) (no overflow near the float32 max, no
    subnormals). Guarantee: the kept mass is the optimum up to the rounding of one score,
    about N*M * 2^-24 of the tile's max |w| (2^-53 for float64); entries below that are ties.
    NaN/Inf rank as the largest magnitude (the mask is valid whatever the input).
    """
    pats = transposable_patterns(n, m).to(weight.device)
    score_dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
    pats_f = pats.reshape(pats.shape[0], -1).to(score_dtype).T.contiguous()  # (M*M, P)
    tiles = to_tiles(finite_magnitudes(weight.to(score_dtype)), m).reshape(-1, m * m)
    tiles = tiles * power_of_two_scale(tiles)
    best = torch.empty(tiles.shape[0], dtype=torch.long, device=weight.device)
    for start in range(0, tiles.shape[0], _CHUNK_TILES):
        chunk = tiles[start:start + _CHUNK_TILES]
        # argmax returns the first maximum: ties go to the lowest pattern index.
        best[start:start + _CHUNK_TILES] = (chunk @ pats_f).argmax(dim=1)
    return from_tiles(pats[best], tuple(weight.shape))
