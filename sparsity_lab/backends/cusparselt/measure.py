"""The "cusparselt_auto" policy's measurements: one product, dense against sparse, on the GPU.

``measure_product(backend, shape)`` times a product of ``shape`` the way ``CusparseltBackend`` runs
it (the searched algorithm, the operand's compression), back to back (``backend.timing == "eager"``:
the host's launch cost counts) or replayed from a CUDA graph (``"graph"``: ``graph_time_ms``, the
kernels' time alone).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .algorithms import ProductKey, synthetic_operands
from .auto import ProductShape


def measure_product(backend, shape: ProductShape) -> tuple[float, float]:
    """(dense_ms, sparse_ms) for one product on synthetic operands of ``shape``, as the products
    of ``CusparseltBackend`` run it: sparse counts the searched algorithm's product plus the compression of its
    operand (once: one micro-step per optimizer step) and, for the weight gradient, the
    transpose copy of MVUE(dZ); the MVUE itself is common to both and not counted."""
    device, dtype = torch.device("cuda"), getattr(torch, shape.dtype)
    t = graph_time_ms if backend.timing == "graph" else backend._ops.time_ms
    if shape.product == "grad_weight":
        key = ProductKey(shape.m, shape.k, shape.n, dtype, False, backend.grad_weight_transpose_result)
        a, x, _ = synthetic_operands(key, device)  # a = MVUE(dZ^T) (out, tokens), x (tokens, in)
        a_tokens_major = a.t().contiguous()  # how the MVUE kernel leaves it
        config = backend.algorithms.get(key, device)
        dense_ms = t(lambda: a_tokens_major.t() @ x)
        compress, _ = backend._compressor(a_tokens_major.t())
        compressed = compress(a_tokens_major.t())
        sparse_ms = (t(lambda: compress(a_tokens_major.t()))
                     + t(lambda: backend._ops.mm(compressed, x, None, key.transpose_result, config)))
        return dense_ms, sparse_ms
    key = ProductKey(shape.m, shape.k, shape.n, dtype, True, True)
    a, b, _ = synthetic_operands(key, device)  # a: S(W) or S(W)^T; b: X^T or dZ^T (a view)
    config = backend.algorithms.get(key, device)
    rows_major = b.t()  # X or dZ, contiguous
    if shape.product == "forward":
        dense_ms = t(lambda: F.linear(rows_major, a))
    else:
        weight = a.t()  # S(W) (out, in) as the dense path holds it (a view here; cuBLAS reads either)
        dense_ms = t(lambda: rows_major @ weight)
    compress, _ = backend._compressor(a)
    compressed = compress(a)
    sparse_ms = t(lambda: compress(a)) + t(lambda: backend._ops.mm(compressed, b, None, True, config))
    return dense_ms, sparse_ms


def graph_time_ms(fn, reps: int = 5, warmup: int = 1) -> float:
    """Milliseconds per call of ``fn`` captured ``reps`` times in one CUDA graph and replayed (the
    kernels' time alone, as a graphed training step runs them); median of 3 replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # PyTorch's rule: warm up on a side stream before capturing
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    del graph
    return sorted(times)[1]
