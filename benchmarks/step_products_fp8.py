"""The product table of the step profile's fp8 mode: dense FP8 against FP8 2:4 products, each alone.

The fp8 mode's ceiling (``step_ceiling``) needs the speed-up of the products it makes sparse, measured in
FP8: the bf16 table says nothing about them. For each block linear of the lab GPT (out, in) over T tokens:

    dense:  the three products of the dense FP8 recipe (``backends/fp8_dense.py``, ``torch._scaled_mm``):
            Z = s_x s_w q(X) q(W)^T,  dX = s_dz s_w q(dZ) q(W),  dW = s_g s_x q(dZ)^T q(X)
            (with the operand copies that recipe makes for ``_scaled_mm``'s layouts)
    sparse: the same products on CUTLASS's SM90 E4M3 2:4 GEMMs (``backends/cutlass/ops.py``), the scales
            read in the epilogue: A = q(S(W)), q(S(W))^T and q(MVUE(dZ))^T compressed (their compression is
            2:4 work, left out, as in the bf16 table)

The LM head stays bf16 in the fp8 mode, so its row is the bf16 dense product. Only the CUTLASS FP8 backend
has a product that takes its scales inside (cuSPARSELt's FP8 product takes them as a host alpha, set per
operand); for ``cusparselt_fp8`` this raises, and the step profile records why it has no fp8 ceiling.
"""
from __future__ import annotations

from typing import Callable

import torch

from benchmarks.step_ceiling import HEAD, PRODUCTS

E4M3 = torch.float8_e4m3fn


def _e4m3(t: torch.Tensor) -> torch.Tensor:
    """Values on the E4M3 grid well inside its range (speed does not depend on them)."""
    return (t.float().clamp(-4, 4) * 16).to(E4M3)


def _cutlass_fp8_products(out_f: int, in_f: int, tokens: int, device: torch.device, t) -> dict:
    from sparsity_lab.backends import fp8_dense
    from sparsity_lab.backends.cutlass import ops
    from sparsity_lab.kernels import transposable_mask24
    from sparsity_lab.masks import nm_mask

    gen = torch.Generator(device=device).manual_seed(0)
    w = torch.randn(out_f, in_f, device=device, generator=gen)
    w = w * transposable_mask24(w, pruned=False)[0]  # 2:4 along in, and W^T along out
    x = torch.randn(tokens, in_f, device=device, generator=gen)
    dz = torch.randn(tokens, out_f, device=device, generator=gen)
    g_t = dz.t() * nm_mask(dz.t(), 2, 4)  # MVUE(dZ)^T's pattern: 2:4 along the tokens
    q_w, q_w_t, q_x, q_dz = _e4m3(w), _e4m3(w.t().contiguous()), _e4m3(x), _e4m3(dz)
    q_x_t, q_g_t = q_x.t().contiguous(), _e4m3(g_t.contiguous())
    one = torch.ones((), device=device)
    a_w, a_w_t, a_g = ops.compress(q_w), ops.compress(q_w_t), ops.compress(q_g_t)
    dense = {"forward": t(lambda: fp8_dense.scaled_mm_forward(q_x, one, q_w, one)),
             "grad_input": t(lambda: fp8_dense.scaled_mm_grad_input(q_dz, one, q_w_t, one)),
             "grad_weight": t(lambda: fp8_dense.scaled_mm_grad_weight(q_dz, one, q_x, one, q_x_t))}
    sparse = {"forward": t(lambda: ops.mm(a_w, q_x, "k", "col", one, one)),
              "grad_input": t(lambda: ops.mm(a_w_t, q_dz, "k", "col", one, one)),
              "grad_weight": t(lambda: ops.mm(a_g, q_x_t, "k", "row", one, one))}
    return {p: {"dense_ms": dense[p], "sparse_ms": sparse[p], "speedup": dense[p] / sparse[p]} for p in PRODUCTS}


def measure_fp8_products(shapes: dict, tokens: int, fp8_backend: str, device: torch.device,
                         dense_bf16: Callable[[int, int], dict]) -> dict:
    """{kind: {product: {"dense_ms", "sparse_ms", "speedup"}}, "how": ...} in the step profile's table form.

    shapes: {kind: (out, in)} with ``HEAD`` among them; dense_bf16(out, in): the head's bf16 dense products
    ({product: ms}), as the bf16 table times them."""
    if fp8_backend != "cutlass_fp8":
        raise ValueError(f"the FP8 product table times CUTLASS's E4M3 products (scales in the epilogue); "
                         f"--fp8-backend {fp8_backend!r} takes its scales as a host alpha per operand")
    from benchmarks.step_profile import _timer

    t = _timer(device)
    table: dict = {}
    for kind, (out_f, in_f) in shapes.items():
        if kind == HEAD:
            dense = dense_bf16(out_f, in_f)
            table[kind] = {p: {"dense_ms": dense[p], "sparse_ms": None, "speedup": None} for p in PRODUCTS}
        else:
            table[kind] = _cutlass_fp8_products(out_f, in_f, tokens, device, t)
    table["how"] = ("FP8: dense torch._scaled_mm (the dense FP8 recipe's calls) against CUTLASS's E4M3 2:4 "
                    "product alone, scales in its epilogue (compression left out: 2:4 work); the head in bf16")
    return table
