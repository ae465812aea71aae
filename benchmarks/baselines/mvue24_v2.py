"""BASELINE, not shipped: the group arithmetic of the MVUE variants "v2" and "v2_philox4" (``mvue24.py`` here).

Kept only as the baseline of the measurement that chose the shipped variant (``level_philox4``,
``kernels/mvue24.py``; results/mvue_variants_h100.json). Known wrong: it computes "the other three"
as ``total - top`` in float32, which cancels (a group [1, 1e-10, 0, 0] never keeps its 1e-10,
although p = 1), and on the H100 it kept 3 entries in some group of a 128 MiB tensor. Selecting a
v2 variant warns.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _mvue_group(x0, x1, x2, x3, u):
    """MVUE of groups given as four float32 tensors and one uniform u per group.

    No division per element: p_i = c |x_i| with one c per group (2 / sum|x|, or 1 / (sum|x| - max|x|)
    after capping the largest at 1), so a kept uncapped entry is x_i / p_i = sign(x_i) / c.
    """
    a0 = tl.abs(x0)
    a1 = tl.abs(x1)
    a2 = tl.abs(x2)
    a3 = tl.abs(x3)
    total = a0 + a1 + a2 + a3
    top = tl.maximum(tl.maximum(a0, a1), tl.maximum(a2, a3))
    nonzero = (a0 > 0).to(tl.int32) + (a1 > 0).to(tl.int32) + (a2 > 0).to(tl.int32) + (a3 > 0).to(tl.int32)
    uncapped = 2.0 * top <= total
    # the capped entry (second case): the first index holding the maximum
    cap0 = (a0 == top) & (~uncapped)
    cap1 = (a1 == top) & (a0 != top) & (~uncapped)
    cap2 = (a2 == top) & (a0 != top) & (a1 != top) & (~uncapped)
    cap3 = (a3 == top) & (a0 != top) & (a1 != top) & (a2 != top) & (~uncapped)
    inv_c = tl.where(uncapped, 0.5 * total, total - top)  # the value every kept uncapped entry gets
    c = 1.0 / tl.where(inv_c > 0, inv_c, 1.0)
    p0 = tl.where(cap0, 1.0, a0 * c)
    p1 = tl.where(cap1, 1.0, a1 * c)
    p2 = tl.where(cap2, 1.0, a2 * c)
    p3 = tl.where(cap3, 1.0, a3 * c)
    # systematic sampling: entry i is picked when u or u + 1 lies in [c_{i-1}, c_i); the last
    # interval is closed at +inf so float rounding of the sum (~2) never drops a pick
    c0 = p0
    c1 = c0 + p1
    c2 = c1 + p2
    v = u + 1.0
    pick0 = ((u < c0) | (v < c0)) & (a0 > 0)
    pick1 = (((u >= c0) & (u < c1)) | ((v >= c0) & (v < c1))) & (a1 > 0)
    pick2 = (((u >= c1) & (u < c2)) | ((v >= c1) & (v < c2))) & (a2 > 0)
    pick3 = ((u >= c2) | (v >= c2)) & (a3 > 0)
    few = nonzero < 2  # fewer than 2 non-zeros: kept as they are (every non-zero has p = 1)
    y0 = tl.where(few | cap0, x0, tl.where(pick0, tl.where(x0 < 0, -inv_c, inv_c), 0.0))
    y1 = tl.where(few | cap1, x1, tl.where(pick1, tl.where(x1 < 0, -inv_c, inv_c), 0.0))
    y2 = tl.where(few | cap2, x2, tl.where(pick2, tl.where(x2 < 0, -inv_c, inv_c), 0.0))
    y3 = tl.where(few | cap3, x3, tl.where(pick3, tl.where(x3 < 0, -inv_c, inv_c), 0.0))
    return y0, y1, y2, y3
