"""Exercises of notebook 14: the compressed 2:4 format, the kept values plus a 2-bit index per kept value.

For a 2:4 matrix W (rows, cols) the format holds ``values`` (rows, cols / 2), the two kept entries of every
group of 4 consecutive columns in column order, and ``indices`` (rows, cols / 2), the column of each kept
entry inside its group (0..3, the smaller first). A group with fewer than two non-zeros still names two
columns (a kept zero adds nothing to a product): the library takes the first non-zero of columns 0..2
(0 if none) and the last non-zero after it (3 if none), as cuSPARSELt's compressor does
(``sparsity_lab.references.cusparselt_layout.kept_pairs``). Worked solutions:
``sparsity_lab/course/exercises/solutions/compressed.py``.
"""
from __future__ import annotations

import secrets

import torch

from ...masks import nm_mask
from ...references.cusparselt_layout import kept_pairs
from .checking import CheckResult, ExerciseReport, run_check

SOLUTION = "compressed"


def compress24(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of a 2:4 matrix w (rows, cols), cols % 4 == 0: each (rows, cols // 2); indices int64."""
    rows, cols = w.shape
    i, j = kept_pairs(w)
    indices = torch.stack([i, j], -1)
    values = w.reshape(rows, cols // 4, 4).gather(-1, indices)
    return values.reshape(rows, cols // 2), indices.reshape(rows, cols // 2)


def decompress24(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The dense (rows, 2 * values.shape[1]) matrix: each value put back at its group's column ``indices``."""
    rows, half = values.shape
    dense = torch.zeros(rows, half // 2, 4, dtype=values.dtype, device=values.device)
    dense.scatter_(-1, indices.reshape(rows, half // 2, 2).long(), values.reshape(rows, half // 2, 2))
    return dense.reshape(rows, 2 * half)


def _fresh_generator() -> torch.Generator:
    return torch.Generator().manual_seed(secrets.randbits(31))


def _cases(gen: torch.Generator) -> list[tuple[torch.Tensor, str]]:
    w = torch.randn(6, 16, generator=gen)
    few = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.5, 0.0, -1.5, 0.0, 0.0]])
    return [(torch.tensor([[0.9, 0.0, 0.0, -1.2, 0.0, 0.3, 0.7, 0.0]]), "[[0.9, 0, 0, -1.2, 0, 0.3, 0.7, 0]]"),
            (w * nm_mask(w, 2, 4), "a random 6 x 16 2:4 matrix"),
            (few, "groups with fewer than two non-zeros (all zero, one at column 3, one at column 1)")]


def check_compress24(compress_fn, show: bool = True, hint: bool = False) -> CheckResult:
    """``compress_fn(w)`` -> (values, indices), each (rows, cols // 2): the kept entries of every group of 4
    in column order and their columns 0..3 inside the group. Any two columns i < j that hold every
    non-zero of the group are right; decompressing must give w back exactly."""
    report = ExerciseReport("compress24: kept values and a 2-bit index per kept value", solution=SOLUTION,
                            hint="reshape w to (rows, cols // 4, 4); the kept columns of a group are where it is "
                                 "non-zero (pad with unused columns when fewer than two); gather the values there.")

    def body(r: ExerciseReport) -> None:
        for w, label in _cases(_fresh_generator()):
            got = r.call(compress_fn, w.clone(), what=f"{label}: your compress24")
            if got is None:
                return
            if not (isinstance(got, (tuple, list)) and len(got) == 2):
                r.expect(False, f"{label}: return a pair (values, indices), got {type(got).__name__}")
                return
            values, indices = got
            half = (w.shape[0], w.shape[1] // 2)
            for name, t in (("values", values), ("indices", indices)):
                if not r.expect(isinstance(t, torch.Tensor) and tuple(t.shape) == half,
                                f"{label}: {name} must be a tensor of shape {half} (two per group of 4), got "
                                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}"):
                    return
            pairs = indices.reshape(w.shape[0], -1, 2).long()
            if not r.expect(bool(((pairs >= 0) & (pairs <= 3)).all()),
                            f"{label}: an index is outside 0..3: indices count columns inside a group of 4, "
                            "not across the row"):
                return
            unordered = pairs[..., 0] >= pairs[..., 1]
            if bool(unordered.any()):
                at = tuple(int(i) for i in unordered.nonzero()[0])
                r.expect(False, f"{label}: the two indices of a group must be two different columns, the smaller "
                                f"first (first bad group {at})")
                return
            back = decompress24(values.to(w.dtype), pairs.reshape(half))
            if not torch.equal(back, w):
                at = tuple(int(i) for i in (back != w).nonzero()[0])
                r.expect(False, f"{label}: decompressing your (values, indices) gives {float(back[at]):.4g} at "
                                f"{at}, where w holds {float(w[at]):.4g}: each value must sit at its index")
                return
    return run_check(report, body, show, hint)


def check_decompress24(decompress_fn, show: bool = True, hint: bool = False) -> CheckResult:
    """``decompress_fn(values, indices)`` -> the dense (rows, 2 * values.shape[1]) matrix, zeros elsewhere."""
    report = ExerciseReport("decompress24: back to the dense 2:4 matrix", solution=SOLUTION,
                            hint="make a zero (rows, cols // 4, 4) tensor and scatter_ the values along the last "
                                 "dimension at their indices; reshape to (rows, cols).")

    def body(r: ExerciseReport) -> None:
        for w, label in _cases(_fresh_generator()):
            values, indices = compress24(w)
            got = r.call(decompress_fn, values.clone(), indices.clone(), what=f"{label}: your decompress24")
            if got is None:
                return
            naive = torch.zeros_like(w).reshape(w.shape[0], -1, 4)
            naive[..., :2] = values.reshape(w.shape[0], -1, 2)
            if isinstance(got, torch.Tensor) and got.shape == w.shape and torch.equal(got, naive.reshape(w.shape)) \
                    and not torch.equal(got, w):
                r.expect(False, f"{label}: the values sit at columns 0 and 1 of every group: the indices say "
                                "which columns they came from")
                return
            if not r.expect_tensor(got, w, f"{label}: your dense matrix"):
                return
    return run_check(report, body, show, hint)
