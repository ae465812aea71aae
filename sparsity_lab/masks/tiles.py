"""M x M tiles of a 2-D weight, the unit of a transposable N:M mask.

W (O, I) is cut into 2-D tiles ``W.view(O//M, M, I//M, M).permute(0, 2, 1, 3)``: tile (a, b)
holds rows a*M..a*M+M-1 and columns b*M..b*M+M-1. A mask with N ones in every row and every
column of every tile is N:M along ``in`` (for W) and along ``out`` (for W^T).
"""
from __future__ import annotations

import torch

from ..validation import check_2d, check_divisible, check_float_tensor, check_has_values, check_nm


def check_transposable_input(weight: torch.Tensor, n: int, m: int) -> None:
    check_nm(n, m)
    check_float_tensor(weight, "weight", allow_meta=True)
    check_2d(weight, "weight")
    for dim in (0, 1):
        check_divisible(weight.shape[dim], m, "weight", dim)


def finite_magnitudes(x: torch.Tensor) -> torch.Tensor:
    """|x| with NaN and +-Inf replaced by the dtype's largest finite value.

    The mask functions rank magnitudes; NaN compares false with everything and would break the
    ranking (a group could keep more or fewer than N). With this, a non-finite entry ranks as
    the largest (ties to the lowest index), so every mask stays valid whatever the input.
    """
    a = x.detach().abs()
    return torch.where(torch.isfinite(a), a, torch.full_like(a, torch.finfo(a.dtype).max))


# exponent field width and bias of the IEEE float types the solvers score in
_EXPONENT = {torch.float32: (torch.int32, 23, 0xFF), torch.float64: (torch.int64, 52, 0x7FF)}


def power_of_two_scale(mags: torch.Tensor) -> torch.Tensor:
    """(T, K) non-negative finite float32/float64 -> per-row power-of-two factor (T, 1).

    Multiplying row t by the factor brings its largest entry into [1, 4): sums of a tile's scaled
    magnitudes cannot overflow (float32 scores near 3e38 did, and every pattern tied at inf),
    and tiny tiles (1e-40) are lifted out of the subnormals. A power of two is exact: the ranking
    of sums is the one of the unscaled values wherever those did not overflow or underflow.
    Built from the exponent bits (no log, no division), as the Triton kernel does.
    """
    int_dtype, mant_bits, exp_max = _EXPONENT[mags.dtype]
    top = mags.amax(dim=-1, keepdim=True)
    exponent = (top.view(int_dtype) >> mant_bits) & exp_max  # biased exponent of the row max
    # factor 2^(bias - E) (max -> [1, 2)); clamped so the factor itself is a normal number
    scale_exp = (2 * (exp_max >> 1) - exponent).clamp(1, exp_max - 1)
    return (scale_exp << mant_bits).view(mags.dtype)


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
    check_has_values(mask, "mask", "validate_transposable_mask")
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
    check_has_values(mask, "mask", "is_transposable")  # a meta mask is neither: refuse, do not say False
    try:
        validate_transposable_mask(mask, n, m, exact)
    except ValueError:
        return False
    return True
