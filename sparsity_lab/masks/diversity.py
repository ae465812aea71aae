"""Mask diversity: the number of valid masks of one block, counted exactly.

Counts are computed by enumeration or dynamic programming, never by a closed-form product (the
product formula quoted for transposable masks overcounts: it gives 144 for a 4x4 2:4 tile
instead of the true 90). Python integers keep the counts exact.

Kinds, for an R x C block that keeps a fraction N/M:
* "unstructured": any N/M fraction of the R*C entries: C(R*C, R*C*N/M).
* "nm": N of every M consecutive entries along each row: C(M, N) ** (R * C / M).
* "transposable": N per row and per column of every M x M tile:
  (number of M x M 0/1 matrices with all line sums N) ** (R*C / M^2).
"""
from __future__ import annotations

from functools import lru_cache
from math import comb

from ..validation import check_nm


@lru_cache(maxsize=None)
def count_fixed_line_sums(m: int, n: int) -> int:
    """Number of M x M 0/1 matrices with N ones in every row and every column.

    Dynamic programming over rows: the state is the multiset of how many ones each column still
    needs (sorted, since columns are interchangeable); each row puts ones in N columns.
    """
    check_nm(n, m)

    @lru_cache(maxsize=None)
    def fill(rows_left: int, need: tuple[int, ...]) -> int:
        if rows_left == 0:
            return int(all(x == 0 for x in need))
        # group columns by their remaining need: choose how many of each group get a one
        groups: dict[int, int] = {}
        for x in need:
            groups[x] = groups.get(x, 0) + 1
        keys = sorted(groups)
        total = 0

        def choose(k: int, ones_left: int, ways: int, new_need: list[int]) -> None:
            nonlocal total
            if k == len(keys):
                if ones_left == 0:
                    total += ways * fill(rows_left - 1, tuple(sorted(new_need)))
                return
            value, size = keys[k], groups[keys[k]]
            top = min(size, ones_left) if value > 0 else 0
            for take in range(top + 1):
                choose(k + 1, ones_left - take, ways * comb(size, take),
                       new_need + [value - 1] * take + [value] * (size - take))

        choose(0, n, 1, [])
        return total

    return fill(m, tuple([n] * m))


def mask_diversity(kind: str, n: int = 2, m: int = 4, block: tuple[int, int] = (8, 8)) -> int:
    """Exact number of valid masks for one block of shape ``block`` (rows, cols).

    kind: "unstructured", "nm" or "transposable". The block's columns (and, for transposable,
    rows) must be divisible by M.
    """
    check_nm(n, m)
    if kind not in ("unstructured", "nm", "transposable"):
        raise ValueError(f"kind must be 'unstructured', 'nm' or 'transposable', got {kind!r}")
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise ValueError(f"block must be (rows, cols), two positive ints, got {block!r}")
    rows, cols = block
    if kind == "unstructured":
        total = rows * cols
        if (total * n) % m:
            raise ValueError(f"block {block} cannot keep exactly {n}/{m} of its entries")
        return comb(total, total * n // m)
    if cols % m:
        raise ValueError(f"block columns ({cols}) must be divisible by m={m}")
    if kind == "nm":
        return comb(m, n) ** (rows * cols // m)
    # transposable
    if rows % m:
        raise ValueError(f"block rows ({rows}) must be divisible by m={m} for transposable masks")
    return count_fixed_line_sums(m, n) ** ((rows // m) * (cols // m))
