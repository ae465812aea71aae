"""One cuSPARSELt product, two ways to call it: PyTorch's ``_cslt_sparse_mm`` (a plan built per
call) against the direct binding (``backends/cusparselt/direct.py``, the plan cached), and dense.

``python -m benchmarks cslt-calls`` on a CUDA GPU. For the forward products of the FFN grid of
``python -m benchmarks ffn`` (``FULL`` in ``benchmarks/ffn/settings.py``)
(up: A = S(W1) (4d, d); down: A = S(W2) (d, 4d); B = X^T, the tokens' transposed view; result
transposed, as the backend calls it), with the algorithm the backend's search chooses:

* ``equal``: the two calls return the same bytes (same descriptors, same algorithm);
* eager ms per call, back to back (CUDA events; host time shows wherever it exceeds the kernel's):
  dense ``F.linear``, PyTorch's call, the direct call;
* graph ms per call: the same calls captured in a CUDA graph and replayed (kernel time only);
* ratios side by side: dense / torch-call, dense / direct-call (eager), dense / sparse (graph).

JSON with provenance: ``results/cusparselt_calls_h100.json``. Without a GPU: exit status 2 and the
reason (there is nothing to measure).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from sparsity_lab.lab.arguments import output_folder, positive_int

TOKENS = (4096, 16384)
D_MODEL = (1024, 2048, 4096, 8192)
RESULT_NAME = "cusparselt_calls_h100"
MIN_TIMING_MS = 50.0  # every timing spans at least this long ...
MAX_CALLS = 2000  # ... within this many calls


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=positive_int, nargs="+", default=list(TOKENS))
    parser.add_argument("--d-model", type=positive_int, nargs="+", default=list(D_MODEL))
    parser.add_argument("--out-dir", type=output_folder, default=None,
                        help="directory for the JSON (default: results/)")


def _events_ms(fn: Callable[[], object], calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def eager_ms(fn: Callable[[], object]) -> float:
    """ms per call over enough back-to-back calls to span MIN_TIMING_MS (median of 3 timings)."""
    for _ in range(3):
        fn()
    calls = max(5, min(MAX_CALLS, int(MIN_TIMING_MS / max(_events_ms(fn, 5), 1e-3))))
    return sorted(_events_ms(fn, calls) for _ in range(3))[1]


def graph_ms(fn: Callable[[], object], per_graph: int = 10) -> float:
    """ms per call of ``fn`` captured ``per_graph`` times in one CUDA graph, replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn()
    return eager_ms(graph.replay) / per_graph


def measure_product(m: int, k: int, n: int, torch_ops, direct_ops, algorithms) -> dict:
    """One forward product A (m, k) 2:4 @ X^T (k, n), result (n, m), both call paths and dense."""
    from sparsity_lab.backends.cusparselt.algorithms import ProductKey, synthetic_operands

    device = torch.device("cuda")
    key = ProductKey(m, k, n, torch.bfloat16, True, True)
    a, b, _ = synthetic_operands(key, device)
    compressed = torch_ops.compress(a)
    config = algorithms.get(key, device)
    x = b.t()  # (n, k) contiguous: the tokens
    via_torch = torch_ops.mm(compressed, b, None, True, config)
    via_direct = direct_ops.mm(compressed, b, None, True, config)
    calls = {
        "dense": lambda: F.linear(x, a),
        "torch_call": lambda: torch_ops.mm(compressed, b, None, True, config),
        "direct_call": lambda: direct_ops.mm(compressed, b, None, True, config),
    }
    row = {"m": m, "k": k, "n": n, "algorithm": config.describe(),
           "equal": bool(torch.equal(via_torch, via_direct)),
           "max_abs_diff": float((via_torch.float() - via_direct.float()).abs().max())}
    row["eager_ms"] = {name: eager_ms(fn) for name, fn in calls.items()}
    row["graph_ms"] = {name: graph_ms(calls[name]) for name in ("dense", "direct_call")}
    e, g = row["eager_ms"], row["graph_ms"]
    row["speedup_vs_dense"] = {"torch_call_eager": e["dense"] / e["torch_call"],
                               "direct_call_eager": e["dense"] / e["direct_call"],
                               "direct_call_graph": g["dense"] / g["direct_call"]}
    row["host_overhead_ms"] = {"torch_call": e["torch_call"] - g["direct_call"],
                               "direct_call": e["direct_call"] - g["direct_call"]}
    return row


def benchmark(tokens: list[int], d_models: list[int]) -> dict:
    from sparsity_lab.backends.cusparselt.algorithms import AlgorithmCache
    from sparsity_lab.backends.cusparselt.direct import DirectCusparseltOps
    from sparsity_lab.backends.cusparselt.ops import TorchCusparseltOps

    torch_ops, direct_ops = TorchCusparseltOps(), DirectCusparseltOps()
    algorithms = AlgorithmCache(torch_ops)  # the backend's search, checked through PyTorch's call
    rows, start = [], time.monotonic()
    for n in tokens:
        for d in d_models:
            for name, (m, k) in (("up", (4 * d, d)), ("down", (d, 4 * d))):
                row = measure_product(m, k, n, torch_ops, direct_ops, algorithms)
                row.update(layer=name, tokens=n, d_model=d)
                rows.append(row)
                s = row["speedup_vs_dense"]
                print(f"tokens {n:6d} d {d:5d} {name:4s} A({m}x{k}) {row['algorithm']:28s} "
                      f"equal {row['equal']!s:5s}  dense/torch-call {s['torch_call_eager']:.2f}x  "
                      f"dense/direct-call {s['direct_call_eager']:.2f}x  graph {s['direct_call_graph']:.2f}x  "
                      f"host ms torch {row['host_overhead_ms']['torch_call']:.3f} "
                      f"direct {row['host_overhead_ms']['direct_call']:.3f}", flush=True)
    return {"rows": rows, "cusparselt_version": direct_ops.version, "library": direct_ops.lib.path,
            "direct_stats": dict(direct_ops.stats), "elapsed_s": time.monotonic() - start,
            "notes": {"eager_ms": "median of 3 timings, each >= 50 ms of back-to-back calls (CUDA events)",
                      "graph_ms": "10 calls captured in one CUDA graph, replayed: the kernel time alone",
                      "host_overhead_ms": "eager ms - graph ms of the direct call (what the host adds per call)",
                      "operands": "synthetic, random 2:4 A, bf16; the algorithm the backend's search picks"}}


def run(args: argparse.Namespace) -> int:
    from sparsity_lab.backends.cusparselt.ops import unavailable_reason
    from sparsity_lab.provenance import write_result

    reason = unavailable_reason()
    if reason is not None:
        print(f"benchmarks cslt-calls needs a GPU that runs cuSPARSELt: {reason}", file=sys.stderr)
        return 2
    result = benchmark(args.tokens, args.d_model)
    path = write_result(RESULT_NAME, result, directory=Path(args.out_dir) if args.out_dir else None)
    print(f"wrote {path}")
    return 0
