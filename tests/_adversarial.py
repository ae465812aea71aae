"""Hypothesis strategies for adversarial magnitudes, shared by the tests/test_properties_*.py files.

Values mix exact zeros, subnormals of the dtype, log-uniform magnitudes over 1e-30..1e30 (the
dtype's range for float16), values near the dtype's largest finite number, and ties: a matrix
is drawn either entry by entry or from a pool of a few magnitudes (many exact ties), with
random signs, and optionally with a per-tile outlier (a huge dynamic range inside a tile).

Example counts: CI runs a small, deterministic count; SPARSITY_LAB_FULL_PROPERTIES=1 runs 20x
more with fresh random draws:
    SPARSITY_LAB_FULL_PROPERTIES=1 python -m pytest -q tests/test_properties_masks.py tests/test_properties_methods.py
"""
from __future__ import annotations

import math
import os

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FULL = os.environ.get("SPARSITY_LAB_FULL_PROPERTIES") == "1"


def examples(ci: int):
    """settings for a property: ``ci`` examples in CI (derandomized), 20x as many in the full run."""
    return settings(max_examples=ci * 20 if FULL else ci, deadline=None, derandomize=not FULL,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# (smallest positive subnormal, smallest normal, largest finite) of each dtype
def _limits(dtype: torch.dtype) -> tuple[float, float, float]:
    info = torch.finfo(dtype)
    return float(info.smallest_normal) * float(info.eps), float(info.smallest_normal), float(info.max)


def magnitude(dtype: torch.dtype) -> st.SearchStrategy[float]:
    """One non-negative value exactly representable in ``dtype`` (rounded to it)."""
    tiny, normal, big = _limits(dtype)
    lo_exp, hi_exp = max(-30, math.ceil(math.log10(normal))), min(30, math.floor(math.log10(big)) - 1)
    log_uniform = st.builds(lambda m, e: m * 10.0 ** e, st.floats(1.0, 9.999), st.integers(lo_exp, hi_exp))
    subnormal = st.floats(min_value=tiny, max_value=normal, exclude_max=True)
    near_max = st.floats(min_value=big / 8, max_value=big)
    value = st.one_of(st.just(0.0), subnormal, log_uniform, log_uniform, near_max, st.sampled_from([1.0, 0.5, 2.0]))
    return value.map(lambda v: float(torch.tensor(v, dtype=torch.float64).to(dtype).double()))


@st.composite
def adversarial(draw, shape: tuple[int, ...], dtype: torch.dtype = torch.float32, outliers: bool = True,
                tile: int = 4) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` with adversarial magnitudes (see the module docstring)."""
    n = math.prod(shape)
    if draw(st.booleans()):  # a few magnitudes only: exact ties everywhere
        pool = draw(st.lists(magnitude(dtype), min_size=1, max_size=4))
        vals = draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))
    else:
        vals = draw(st.lists(magnitude(dtype), min_size=n, max_size=n))
    signs = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    t = torch.tensor([v if s else -v for v, s in zip(vals, signs)], dtype=torch.float64).reshape(shape)
    if outliers and len(shape) == 2 and draw(st.booleans()):
        # one entry per tile-row block scaled far above its neighbours (dynamic range 1e8..1e20)
        big = _limits(dtype)[2]
        scale = 10.0 ** draw(st.integers(8, 20))
        r, c = draw(st.integers(0, shape[0] - 1)), draw(st.integers(0, shape[1] - 1))
        t[r, c] = math.copysign(min(abs(t[r, c].item()) * scale or scale, big), t[r, c].item() or 1.0)
    return t.to(dtype)


def non_finite(shape: tuple[int, ...], dtype: torch.dtype = torch.float32):
    """An adversarial tensor with NaN/+Inf/-Inf written at random places."""
    @st.composite
    def build(draw):
        t = draw(adversarial(shape, dtype))
        n = math.prod(shape)
        k = draw(st.integers(1, n))
        where = draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k))
        bad = draw(st.lists(st.sampled_from([math.nan, math.inf, -math.inf]), min_size=k, max_size=k))
        flat = t.reshape(-1)
        for i, b in zip(where, bad):
            flat[i] = b
        return t
    return build()
