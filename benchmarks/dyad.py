"""``python -m benchmarks dyad``: DYAD layers against nn.Linear, forward + backward, side by side.

For each width d, two shapes (square d -> d and the FFN up-projection d -> 4d), n in {4, 8} and each
variant, time
one forward+backward of DYAD and of the dense nn.Linear of the same shape on the same input in
the same run, and print the ratio dense_time / dyad_time (> 1: DYAD is faster). DYAD does 2/n of
the dense FLOPs; the paper reports a faster layer as width grows. Writes results/dyad_<device>.json.
"""
from __future__ import annotations

import argparse

import torch

from sparsity_lab.course.live import measure_dyad
from sparsity_lab.provenance import write_result
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


def run(args: argparse.Namespace) -> int:
    if torch.cuda.is_available():
        device = torch.device("cuda")
    elif args.allow_cpu:
        device = torch.device("cpu")
        print("No GPU: timing on the CPU (--allow-cpu). These are not GPU figures.")
    else:
        raise SystemExit("benchmarks dyad needs a CUDA GPU (or --allow-cpu for a small CPU run)")
    dtype = getattr(torch, args.dtype)
    rows = measure_dyad(args.widths, args.blocks, args.variants, args.tokens, dtype, args.repeats, device)
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
