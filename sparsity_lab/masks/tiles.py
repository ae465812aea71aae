"""M x M tiles of a 2-D weight, the unit of a transposable N:M mask.

W (O, I) is cut into 2-D tiles ``W.view(O//M, M, I//M, M).permute(0, 2, 1, 3)``: tile (a, b)
holds rows a*M..a*M+M-1 and columns b*M..b*M+M-1. A mask with N ones in every row and every
column of every tile is N:M along ``in`` (for W) and along ``out`` (for W^T).
"""
from __future__ import annotations

import torch

from ..validation import check_2d, check_divisible, check_float_tensor, check_nm


def check_transposable_input(weight: torch.Tensor, n: int, m: int) -> None:
    check_nm(n, m)
    check_float_tensor(weight, "weight")
    check_2d(weight, "weight")
    for dim in (0, 1):
        check_divisible(weight.shape[dim], m, "weight", dim)


def to_tiles(x: torch.Tensor, m: int) -> torch.Tensor:
    """(O, I) -> (O//M * I//M, M, M), tiles in row-major tile order (a copy)."""
    o, i = x.shape
    return x.reshape(o // m, m, i // m, m).permute(0, 2, 1, 3).reshape(-1, m, m)


def from_tiles(tiles: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Inverse of :func:`to_tiles`."""
    o, i = shape
    m = tiles.shape[-1]
    return tiles.reshape(o // m, i // m, m, m).permute(0, 2, 1, 3).reshape(o, i)


def tile_line_counts(mask: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ones per row and per column of every tile: two (T, M) int tensors."""
    t = to_tiles((mask != 0).to(torch.int32), m)
    return t.sum(-1), t.sum(-2)


def validate_transposable_mask(mask: torch.Tensor, n: int, m: int, exact: bool = True) -> None:
    """Raise ValueError unless every row and column of every M x M tile holds N ones.

    exact=False accepts *at most* N (what the hardware needs; the paper's prune-greedy can leave
    fewer than N kept).
    """
    check_nm(n, m)
    check_2d(mask, "mask")
    for dim in (0, 1):
        check_divisible(mask.shape[dim], m, "mask", dim)
    rows, cols = tile_line_counts(mask, m)
    for what, counts in (("row", rows), ("column", cols)):
        bad = (counts != n) if exact else (counts > n)
        if bool(bad.any()):
            tile = int(bad.any(-1).nonzero()[0])
            need = f"exactly {n}" if exact else f"at most {n}"
            raise ValueError(
                f"mask is not transposable {n}:{m}: {int(bad.any(-1).sum())} tile(s) have a {what} "
                f"without {need} ones (first: tile {tile}, {what} counts {counts[tile].tolist()})"
            )


def is_transposable(mask: torch.Tensor, n: int, m: int, exact: bool = True) -> bool:
    try:
        validate_transposable_mask(mask, n, m, exact)
    except ValueError:
        return False
    return True
