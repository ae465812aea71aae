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
from .layer_plan import LayerShape, LayerTimes


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
    dense_ms, product_ms, compress_ms = _weight_product_ms(backend, shape.product, shape.m, shape.k, shape.n, dtype, t)
    return dense_ms, compress_ms + product_ms


def _weight_product_ms(backend, product: str, m: int, k: int, rows: int, dtype: torch.dtype, t) -> tuple[float, float, float]:
    """(dense product, sparse product alone, compression of its operand) in ms for the forward or the
    input gradient, A (m, k) the 2:4 operand (S(W) or S(W)^T) times ``rows`` rows, timed by ``t``."""
    device = torch.device("cuda")
    key = ProductKey(m, k, rows, dtype, True, True)
    a, b, _ = synthetic_operands(key, device)  # a: S(W) or S(W)^T; b: X^T or dZ^T (a view)
    config = backend.algorithms.get(key, device)
    rows_major = b.t()  # X or dZ, contiguous
    if product == "forward":
        dense_ms = t(lambda: F.linear(rows_major, a))
    else:
        weight = a.t()  # S(W) (out, in) as the dense path holds it (a view here; cuBLAS reads either)
        dense_ms = t(lambda: rows_major @ weight)
    compress, _ = backend._compressor(a)
    compressed = compress(a)
    return dense_ms, t(lambda: backend._ops.mm(compressed, b, None, True, config)), t(lambda: compress(a))


def measure_layer(backend, shape: LayerShape) -> LayerTimes:
    """``LayerTimes`` of one layer's weight-side work on synthetic operands, as ``CusparseltBackend``
    runs it: the dense S(W) (``sparse_weight_as``, S-STE's soft threshold), the compressed forms (kernel
    11 from W when ``prepare_masked`` would use it, else the dense S(W) compressed), and the forward and
    input-gradient products alone, dense and sparse (searched algorithm). W is kept in the product
    dtype: the dense and the compressed operand read it alike."""
    from ...references.cusparselt_layout import fast_layout_problem
    from .ops import PRODUCT_DTYPES

    device, dtype = torch.device("cuda"), getattr(torch, shape.dtype)
    t = graph_time_ms if backend.timing == "graph" else backend._ops.time_ms
    out_f, in_f, tokens = shape.out_features, shape.in_features, shape.tokens
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    w = torch.randn(out_f, in_f, generator=gen, device=device).to(dtype)
    mask = backend.mask(w, 2, 4, True)
    beta = torch.tensor(0.9, device=device)

    def dense_operand():
        return backend.sparse_weight_as(w, mask, beta, 2, 4, dtype).contiguous()
    s_w = dense_operand()
    fused = (backend.fast_compress and backend.fused_prepare and dtype in PRODUCT_DTYPES
             and fast_layout_problem(out_f, in_f, dtype) is None)
    dense_ms = t(dense_operand)
    if fused:
        k = backend._k()
        both = t(lambda: k.prepare24(w, mask, beta, out_dtype=dtype, forward=True, transposed=True))
        fwd_only = t(lambda: k.prepare24(w, mask, beta, out_dtype=dtype, forward=True, transposed=False))
        t_only = t(lambda: k.prepare24(w, mask, beta, out_dtype=dtype, forward=False, transposed=True))
    else:  # the dense S(W), then each form compressed from it
        compress, _ = backend._compressor(s_w)
        c_fwd, c_t = t(lambda: compress(s_w)), t(lambda: compress(s_w.t()))
        fwd_only, t_only, both = dense_ms + c_fwd, dense_ms + c_t, dense_ms + c_fwd + c_t
    rows = backend._rows_for(tokens, dtype)
    products = {}
    for product, (m, k_dim) in (("forward", (out_f, in_f)), ("grad_input", (in_f, out_f))):
        dense, sparse, _ = _weight_product_ms(backend, product, m, k_dim, rows, dtype, t)
        products[f"{product}_dense"], products[f"{product}_sparse"] = dense, sparse
    return LayerTimes(dense_operand=dense_ms, sparse_operands=both, forward_operand=fwd_only,
                      transposed_operand=t_only, **products)


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
