"""The "sparse_auto" policy's measurements of CUTLASS's products, as ``CutlassBackend`` runs them (``backend.py``).

Each takes ``t`` (a function giving the milliseconds per call of a callable: the cuSPARSELt ops' eager timer
or ``cusparselt.measure.graph_time_ms``), so every library a policy compares is timed the same way, and
synthetic operands of the product's shape on the GPU.
"""
from __future__ import annotations

import torch

from ..cusparselt.algorithms import ProductKey, synthetic_operands
from ..cusparselt.layer_plan import LibraryTimes
from . import ops


def weight_side_times(sparse_weight: torch.Tensor, tokens: int, t, config: str | None = None) -> LibraryTimes:
    """CUTLASS's part of a layer's weight-side work for S(W) (out, in) (bfloat16, transposable 2:4) over
    ``tokens`` rows: S(W) and S(W)^T compressed from the dense S(W) (S(W)^T after its transposing copy), and
    the forward and input-gradient products alone (``config``: the backend's kernel variant)."""
    out_f, in_f = sparse_weight.shape
    gen = torch.Generator(device=sparse_weight.device).manual_seed(1)
    x = torch.randn(tokens, in_f, device=sparse_weight.device, generator=gen).to(sparse_weight.dtype)
    dz = torch.randn(tokens, out_f, device=sparse_weight.device, generator=gen).to(sparse_weight.dtype)
    forward_operand = t(lambda: ops.compress(sparse_weight))
    transposed_operand = t(lambda: ops.compress(sparse_weight.t().contiguous()))
    a, a_t = ops.compress(sparse_weight), ops.compress(sparse_weight.t().contiguous())
    return LibraryTimes(both_operands=forward_operand + transposed_operand, forward_operand=forward_operand,
                        transposed_operand=transposed_operand,
                        forward=t(lambda: ops.mm(a, x, "k", "col", config=config)),
                        grad_input=t(lambda: ops.mm(a_t, dz, "k", "col", config=config)), from_dense_operand=True)


def grad_weight_times(out_features: int, rows: int, in_features: int, dtype: torch.dtype, t) -> tuple[float, float]:
    """(dense_ms, sparse_ms) of dW = MVUE(dZ^T) X (out, in) over ``rows`` padded tokens: the dense product of the
    masked operand, and the compression of MVUE(dZ)^T into CUTLASS's layout plus the product. The backend writes
    that operand while it draws MVUE (kernel 23); here the project's layout kernel (22) writes it from the drawn,
    tokens-major MVUE(dZ), read transposed, as cuSPARSELt's measurement compresses its operand: the draw itself
    is common to both and not counted."""
    from sparsity_lab import kernels as k

    key = ProductKey(out_features, rows, in_features, dtype, False, False)
    a, x, _ = synthetic_operands(key, torch.device("cuda"))  # a = MVUE(dZ^T) (out, rows), x (rows, in)
    tokens_major = a.t().contiguous()  # how the MVUE draw leaves it
    operand = tokens_major.t()  # (out, rows), 2:4 along the rows: a strided view, read as it is
    kept = (operand != 0).contiguous()

    def compress():
        return k.prepare24_cutlass(operand, kept, None, forward=True, transposed=False)[0]
    compressed = ops.SparseOperand(*compress(), (out_features, rows))
    dense_ms = t(lambda: tokens_major.t() @ x)
    return dense_ms, t(compress) + t(lambda: ops.mm(compressed, x, "n", "row"))
