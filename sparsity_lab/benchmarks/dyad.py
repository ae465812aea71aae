"""``sparsity-lab bench-dyad``: DYAD layers against nn.Linear, forward + backward, side by side.

For each width d, two shapes (square d -> d and the FFN up-projection d -> 4d), n in {4, 8} and each
variant, time
one forward+backward of DYAD and of the dense nn.Linear of the same shape on the same input in
the same run, and print the ratio dense_time / dyad_time (> 1: DYAD is faster). DYAD does 2/n of
the dense FLOPs; the paper reports a faster layer as width grows. Writes results/dyad_<device>.json.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from tqdm.auto import tqdm

from ..structures.dyad import DyadLinear
from ..provenance import write_result
from sparsity_lab.lab.arguments import output_folder, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--widths", type=positive_int, nargs="+", default=[768, 1024, 2048, 4096, 8192])
    parser.add_argument("--blocks", type=positive_int, nargs="+", default=[4, 8])
    parser.add_argument("--variants", nargs="+", choices=["it", "ot", "dt"], default=["it", "ot", "dt"])
    parser.add_argument("--tokens", type=positive_int, default=8192)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--repeats", type=positive_int, default=20)
    parser.add_argument("--out-dir", type=output_folder, default=None,
                        help="where to write the JSON (default results/)")
    parser.add_argument("--allow-cpu", action="store_true", help="run on the CPU (small sizes; not a speed figure)")


def _time_fwd_bwd(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor, repeats: int) -> float:
    """Median seconds of one forward + backward (input and weight gradients)."""
    def once():
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(x).backward(grad)

    for _ in range(3):
        once()
    times = []
    cuda = x.is_cuda
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            once()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            once()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(args: argparse.Namespace) -> int:
    if torch.cuda.is_available():
        device = torch.device("cuda")
    elif args.allow_cpu:
        device = torch.device("cpu")
        print("No GPU: timing on the CPU (--allow-cpu). These are not GPU figures.")
    else:
        raise SystemExit("bench-dyad needs a CUDA GPU (or --allow-cpu for a small CPU run)")
    dtype = getattr(torch, args.dtype)
    rows = []
    grid = [(w, n, v, shape) for w in args.widths for n in args.blocks for v in args.variants
            for shape in ("square", "ffn_up")]
    for width, n, variant, shape in tqdm(grid, desc="dyad vs linear"):
        d_in, d_out = width, (width if shape == "square" else 4 * width)
        torch.manual_seed(0)
        x = torch.randn(args.tokens, d_in, device=device, dtype=dtype, requires_grad=True)
        grad = torch.randn(args.tokens, d_out, device=device, dtype=dtype)
        dense = nn.Linear(d_in, d_out, device=device, dtype=dtype)
        dyad = DyadLinear(d_in, d_out, n, variant, device=device, dtype=dtype)
        # same function check before timing: DYAD equals its dense matrix on this device
        if width <= 1024 and variant == "it" and shape == "square":
            with torch.no_grad():
                small = DyadLinear(64, 64, n, variant, device=device, dtype=torch.float32)
                xs = torch.randn(16, 64, device=device)
                err = (small(xs) - (xs @ small.dense_weight().T + small.bias)).abs().max().item()
            if err > 1e-4:
                raise RuntimeError(f"DYAD output differs from its dense matrix on {device}: {err}")
        t_dense = _time_fwd_bwd(dense, x, grad, args.repeats)
        t_dyad = _time_fwd_bwd(dyad, x, grad, args.repeats)
        flops_dense = 3 * 2 * args.tokens * d_in * d_out
        rows.append({"width": width, "shape": shape, "in": d_in, "out": d_out, "n_blocks": n,
                     "variant": f"dyad-{variant}", "tokens": args.tokens, "dense_ms": t_dense * 1e3,
                     "dyad_ms": t_dyad * 1e3, "speedup": t_dense / t_dyad,
                     "dense_tflops": flops_dense / t_dense / 1e12,
                     "dyad_flops_fraction": 2 / n})
    print(f"\n{'shape':>8} {'in':>6} {'out':>6} {'n':>3} {'variant':>8} {'dense ms':>9} {'dyad ms':>9} {'dense/dyad':>11}")
    for r in rows:
        print(f"{r['shape']:>8} {r['in']:>6} {r['out']:>6} {r['n_blocks']:>3} {r['variant']:>8} "
              f"{r['dense_ms']:>9.3f} {r['dyad_ms']:>9.3f} {r['speedup']:>10.2f}x")
    faster = sum(r["speedup"] > 1 for r in rows)
    print(f"DYAD faster than nn.Linear at {faster}/{len(rows)} points; "
          f"best {max(r['speedup'] for r in rows):.2f}x, worst {min(r['speedup'] for r in rows):.2f}x")
    name = "dyad_" + ("gpu" if device.type == "cuda" else "cpu")
    path = write_result(name, {"dtype": args.dtype, "rows": rows}, directory=args.out_dir)
    print(f"wrote {path}")
    return 0
