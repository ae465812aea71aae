"""Worked solutions: the Triton puzzles of notebook 07.

Importing this module imports triton: on a CPU set ``TRITON_INTERPRET=1`` first. The kernels favour
clarity: four strided loads per group, where the library's kernels (``kernels/prune24.py``) load one
contiguous run and split it in registers for wider memory accesses.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n                                # the last program may run past the end
    x = tl.load(x_ptr + offs, mask=inside)
    tl.store(out_ptr + offs, alpha * x, mask=inside)


@triton.jit
def _beats(a_j, a_i, j_before_i: tl.constexpr):
    """1 when member j ranks above member i: larger |w|, or equal |w| and a lower index."""
    if j_before_i:
        return (a_j >= a_i).to(tl.int32)
    return (a_j > a_i).to(tl.int32)


@triton.jit
def _keep_top2(a0, a1, a2, a3):
    r"""Keep flags of the two largest of four: $\mathrm{rank}_i = \#\{j : a_j > a_i\} + \#\{j < i : a_j = a_i\}$,
    kept when $\mathrm{rank}_i < 2$ (ties to the lower index, like ``nm_mask``)."""
    r0 = _beats(a1, a0, False) + _beats(a2, a0, False) + _beats(a3, a0, False)
    r1 = _beats(a0, a1, True) + _beats(a2, a1, False) + _beats(a3, a1, False)
    r2 = _beats(a0, a2, True) + _beats(a1, a2, True) + _beats(a3, a2, False)
    r3 = _beats(a0, a3, True) + _beats(a1, a3, True) + _beats(a2, a3, True)
    return r0 < 2, r1 < 2, r2 < 2, r3 < 2


@triton.jit
def prune24_kernel(w_ptr, out_ptr, n_groups, BLOCK: tl.constexpr):
    groups = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = groups < n_groups
    base = w_ptr + 4 * groups
    w0 = tl.load(base + 0, mask=inside, other=0.0)
    w1 = tl.load(base + 1, mask=inside, other=0.0)
    w2 = tl.load(base + 2, mask=inside, other=0.0)
    w3 = tl.load(base + 3, mask=inside, other=0.0)
    k0, k1, k2, k3 = _keep_top2(tl.abs(w0), tl.abs(w1), tl.abs(w2), tl.abs(w3))
    out = out_ptr + 4 * groups
    tl.store(out + 0, tl.where(k0, w0, 0.0), mask=inside)
    tl.store(out + 1, tl.where(k1, w1, 0.0), mask=inside)
    tl.store(out + 2, tl.where(k2, w2, 0.0), mask=inside)
    tl.store(out + 3, tl.where(k3, w3, 0.0), mask=inside)


@triton.jit
def _soft(w, keep, t, beta):
    r"""$\beta\, m_i\, \mathrm{sign}(w_i) \max(|w_i| - t, 0)$."""
    shrunk = tl.maximum(tl.abs(w) - t, 0.0)
    return tl.where(keep, beta * tl.where(w < 0, -shrunk, shrunk), 0.0)


@triton.jit
def soft_threshold24_kernel(w_ptr, out_ptr, beta, n_groups, BLOCK: tl.constexpr):
    groups = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = groups < n_groups
    base = w_ptr + 4 * groups
    w0 = tl.load(base + 0, mask=inside, other=0.0)
    w1 = tl.load(base + 1, mask=inside, other=0.0)
    w2 = tl.load(base + 2, mask=inside, other=0.0)
    w3 = tl.load(base + 3, mask=inside, other=0.0)
    a0, a1, a2, a3 = tl.abs(w0), tl.abs(w1), tl.abs(w2), tl.abs(w3)
    k0, k1, k2, k3 = _keep_top2(a0, a1, a2, a3)
    # t = the largest pruned magnitude of the group (no sort: a max over the two pruned members)
    t = tl.maximum(tl.maximum(tl.where(k0, 0.0, a0), tl.where(k1, 0.0, a1)),
                   tl.maximum(tl.where(k2, 0.0, a2), tl.where(k3, 0.0, a3)))
    out = out_ptr + 4 * groups
    tl.store(out + 0, _soft(w0, k0, t, beta), mask=inside)
    tl.store(out + 1, _soft(w1, k1, t, beta), mask=inside)
    tl.store(out + 2, _soft(w2, k2, t, beta), mask=inside)
    tl.store(out + 3, _soft(w3, k3, t, beta), mask=inside)


@triton.jit
def mvue24_kernel(x_ptr, p_ptr, u_ptr, out_ptr, n_groups, BLOCK: tl.constexpr):
    groups = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = groups < n_groups
    u = tl.load(u_ptr + groups, mask=inside, other=0.0)
    lo = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(4):                     # member j owns [lo, hi) of [0, 2)
        x = tl.load(x_ptr + 4 * groups + j, mask=inside, other=0.0)
        p = tl.load(p_ptr + 4 * groups + j, mask=inside, other=1.0)
        if j < 3:
            hi = lo + p
        else:
            hi = tl.full([BLOCK], 2.0, tl.float32)  # the last interval ends at 2: u + 1 always lands
        picked = ((lo <= u) & (u < hi)) | ((lo <= u + 1) & (u + 1 < hi))
        tl.store(out_ptr + 4 * groups + j, tl.where(picked, x / p, 0.0), mask=inside)
        lo = hi


@triton.jit
def count_flips_kernel(prev_ptr, new_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    prev = tl.load(prev_ptr + offs, mask=inside, other=0)
    new = tl.load(new_ptr + offs, mask=inside, other=0)
    tl.store(partial_ptr + tl.program_id(0), tl.sum((prev != new).to(tl.int32), axis=0))


@triton.jit
def compress24_kernel(w_ptr, val_ptr, idx_ptr, n_groups, BLOCK: tl.constexpr):
    groups = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = groups < n_groups
    w0 = tl.load(w_ptr + 4 * groups + 0, mask=inside, other=0.0)
    w1 = tl.load(w_ptr + 4 * groups + 1, mask=inside, other=0.0)
    w2 = tl.load(w_ptr + 4 * groups + 2, mask=inside, other=0.0)
    w3 = tl.load(w_ptr + 4 * groups + 3, mask=inside, other=0.0)
    n0, n1, n2, n3 = w0 != 0, w1 != 0, w2 != 0, w3 != 0
    # i: the first non-zero of columns 0..2 (0 if none); j: the last non-zero after i (3 if none)
    i = tl.where(n0, 0, tl.where(n1, 1, tl.where(n2, 2, 0)))
    j = tl.where(n3 & (i < 3), 3, tl.where(n2 & (i < 2), 2, tl.where(n1 & (i < 1), 1, 3)))
    v0 = tl.where(i == 0, w0, tl.where(i == 1, w1, w2))
    v1 = tl.where(j == 3, w3, tl.where(j == 2, w2, w1))
    tl.store(val_ptr + 2 * groups, v0, mask=inside)
    tl.store(val_ptr + 2 * groups + 1, v1, mask=inside)
    tl.store(idx_ptr + 2 * groups, i, mask=inside)
    tl.store(idx_ptr + 2 * groups + 1, j, mask=inside)


@triton.jit
def decompress24_kernel(val_ptr, idx_ptr, out_ptr, n_groups, BLOCK: tl.constexpr):
    groups = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = groups < n_groups
    v0 = tl.load(val_ptr + 2 * groups, mask=inside, other=0.0)
    v1 = tl.load(val_ptr + 2 * groups + 1, mask=inside, other=0.0)
    i = tl.load(idx_ptr + 2 * groups, mask=inside, other=0)
    j = tl.load(idx_ptr + 2 * groups + 1, mask=inside, other=0)
    for c in tl.static_range(4):
        value = tl.where(i == c, v0, tl.where(j == c, v1, 0.0))
        tl.store(out_ptr + 4 * groups + c, value, mask=inside)


@triton.jit
def sparse_dot_kernel(val_ptr, idx_ptr, x_ptr, out_ptr, n_groups, BLOCK_G: tl.constexpr):
    row = tl.program_id(0)
    groups = tl.arange(0, BLOCK_G)
    inside = groups < n_groups
    base = row * 2 * n_groups + 2 * groups
    v0 = tl.load(val_ptr + base, mask=inside, other=0.0)
    v1 = tl.load(val_ptr + base + 1, mask=inside, other=0.0)
    i = tl.load(idx_ptr + base, mask=inside, other=0)
    j = tl.load(idx_ptr + base + 1, mask=inside, other=0)
    # the metadata picks the two entries of x each kept value multiplies: half the multiply-adds
    x_i = tl.load(x_ptr + 4 * groups + i, mask=inside, other=0.0)
    x_j = tl.load(x_ptr + 4 * groups + j, mask=inside, other=0.0)
    tl.store(out_ptr + row, tl.sum(v0 * x_i + v1 * x_j, axis=0))
