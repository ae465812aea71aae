"""Argument checks shared by every public function.

Each check raises a ``ValueError`` or ``TypeError`` whose message names the argument and says
what was expected, so that bad input never turns into a silently wrong mask.
"""
from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_nm(n: int, m: int) -> None:
    """N:M must satisfy 1 <= N <= M (integers)."""
    for name, value in (("n", n), ("m", m)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if m < 1:
        raise ValueError(f"m must be >= 1, got m={m}")
    if not 1 <= n <= m:
        raise ValueError(f"n must satisfy 1 <= n <= m, got n={n}, m={m}")


def check_float_tensor(x: torch.Tensor, name: str, *, finite: bool = True, allow_meta: bool = False) -> None:
    """A non-empty floating-point tensor without NaN/Inf.

    A meta tensor (shape only, no values) is refused with a clear error unless ``allow_meta``:
    functions whose answer is shape-only for a meta input (a meta mask) allow it.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be a floating-point tensor (float32, float16, bfloat16 or float64), "
            f"got dtype {x.dtype}"
        )
    if x.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)}); expected at least one element")
    if x.is_meta and not allow_meta:
        check_has_values(x, name, "this computation")
    if finite and not x.is_meta and not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{name} contains {bad} NaN/Inf value(s); expected finite values")


def check_has_values(x: torch.Tensor, name: str, what: str) -> None:
    """Refuse a meta tensor (shape only) where ``what`` needs the values."""
    if isinstance(x, torch.Tensor) and x.is_meta:
        raise ValueError(f"{name} is on the meta device (shape only, no values), but {what} needs its "
                         "values; materialize it first (e.g. module.to_empty(device='cpu') and initialize)")


def check_divisible(size: int, m: int, name: str, dim: int) -> None:
    if size % m != 0:
        raise ValueError(
            f"{name} has size {size} along dim {dim}, which is not divisible by m={m}; "
            f"N:M masks need groups of m consecutive elements"
        )


def check_2d(x: torch.Tensor, name: str) -> None:
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (out x in), got {x.dim()}-D with shape {tuple(x.shape)}")


def normalize_dim(dim: int, ndim: int, name: str = "dim") -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__} ({dim!r})")
    if not -ndim <= dim < ndim:
        raise ValueError(f"{name}={dim} is out of range for a {ndim}-D tensor")
    return dim % ndim
