"""The Amdahl ceiling of a 2:4 training step, from figures measured in the same run.

A 2:4 configuration makes some linears sparse. Its ceiling is the dense step with only the products of
those linears changed: their dense GEMM time divided by the speed-up that cuSPARSELt's products of the
same shapes reached in this run, the rest of the step (every other GEMM, attention, norms, casts, the
optimizer) unchanged and no 2:4 work (masks, soft threshold, compression, MVUE) at all::

    G        = dense step's dense-GEMM ms x share      (share: the products made sparse, of all the step's GEMMs)
    ceiling  = dense_ms - G + G / s                     (s: their measured product speed-up, dense / sparse)
    ceiling speed-up = dense_ms / ceiling;   closeness = measured speed-up / ceiling speed-up

The dense-GEMM ms comes from the dense step's profile (kernels classified by ``step_categories``); the
profile cannot tell which linear a cuBLAS kernel belongs to, so ``share`` apportions it by the dense
products' own times measured alone: sum over the sparse linears' products / sum over every linear
product of the step (the LM head included). ``s`` is the same sums' dense / sparse ratio, the sparse
product alone (its operand's compression is 2:4 work, which the ceiling leaves out).

Everything here is plain arithmetic on dicts, tested on the CPU with synthetic numbers.
"""
from __future__ import annotations

import math

PRODUCTS = ("forward", "grad_input", "grad_weight")
BLOCK_LINEARS = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
SELECTIONS = {"ffn": ("mlp.fc", "mlp.proj"), "all_linears": BLOCK_LINEARS}
HEAD = "lm_head"


def linear_shapes(d_model: int, hidden: int, vocab_size: int, gated: bool = False) -> dict[str, tuple[int, int]]:
    """(out, in) of each linear of a lab GPT block, and of the LM head."""
    return {"attn.qkv": (3 * d_model, d_model), "attn.proj": (d_model, d_model),
            "mlp.fc": ((2 if gated else 1) * hidden, d_model), "mlp.proj": (d_model, hidden),
            HEAD: (vocab_size, d_model)}


def _sum(table: dict, kinds, key: str, n_layer: int) -> float:
    total = 0.0
    for kind in kinds:
        for product in PRODUCTS:
            value = table[kind][product][key]
            if value is None or not math.isfinite(value) or value <= 0:
                raise ValueError(f"product table: {kind} {product} {key} is {value!r}, expected a positive ms")
            total += value * (1 if kind == HEAD else n_layer)
    return total


def attribution(table: dict, selection: str, n_layer: int) -> dict:
    """The share of the step's dense GEMMs that ``selection`` makes sparse, and those products' speed-up.

    table: {kind: {product: {"dense_ms", "sparse_ms"}}} for every kind of ``BLOCK_LINEARS`` and ``HEAD``
    (the head's sparse_ms is not read); n_layer: the blocks (each block's products count n_layer times)."""
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {sorted(SELECTIONS)}, got {selection!r}")
    if isinstance(n_layer, bool) or not isinstance(n_layer, int) or n_layer < 1:
        raise ValueError(f"n_layer must be a positive int, got {n_layer!r}")
    kinds = SELECTIONS[selection]
    dense_sel = _sum(table, kinds, "dense_ms", n_layer)
    sparse_sel = _sum(table, kinds, "sparse_ms", n_layer)
    dense_all = _sum(table, (*BLOCK_LINEARS, HEAD), "dense_ms", n_layer)
    return {"selection": selection, "share": dense_sel / dense_all, "product_speedup": dense_sel / sparse_sel,
            "dense_ms_selected": dense_sel, "sparse_ms_selected": sparse_sel, "dense_ms_all_linears": dense_all}


def amdahl(dense_step_ms: float, dense_gemm_ms: float, share: float, product_speedup: float) -> dict:
    """The ceiling step (module docstring): {"gemm_ms_made_sparse", "ceiling_ms", "ceiling_speedup"}."""
    for name, value in (("dense_step_ms", dense_step_ms), ("dense_gemm_ms", dense_gemm_ms),
                        ("product_speedup", product_speedup)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1], got {share!r}")
    if dense_gemm_ms > dense_step_ms:
        raise ValueError(f"dense_gemm_ms {dense_gemm_ms:g} exceeds the step's {dense_step_ms:g} ms")
    made_sparse = dense_gemm_ms * share
    ceiling_ms = dense_step_ms - made_sparse + made_sparse / product_speedup
    return {"gemm_ms_made_sparse": made_sparse, "ceiling_ms": ceiling_ms, "ceiling_speedup": dense_step_ms / ceiling_ms}


def closeness(measured_speedup: float | None, ceiling_speedup: float | None) -> float | None:
    """measured / ceiling (1.0: the step reaches what its products allow), None when either is missing."""
    if not measured_speedup or not ceiling_speedup:
        return None
    return measured_speedup / ceiling_speedup
