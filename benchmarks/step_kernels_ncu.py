"""Nsight Compute's view of the step's 2:4 kernels: are they bound by memory or by instructions?

``python -m benchmarks.step_kernels_ncu run`` launches kernels 10 (``mvue_compress24``), 21 (``refresh24``),
11 (``prepare24``) and 23 (``mvue_compress24_cutlass``) twice each at the lab GPT step's FFN shapes (dZ of
8192 tokens x 16384, the bf16 weight 16384 x 4096, S-STE's scale) for a profiler to catch. Under Nsight
Compute, on the GPU machine::

    ncu --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \\
        -k regex:"_mvue_compress24|_refresh24|_prepare24_kernel" --launch-skip 4 --launch-count 4 \\
        python -m benchmarks.step_kernels_ncu run > ncu.log
    python -m benchmarks.step_kernels_ncu parse ncu.log --provenance-of results/step_kernels_sweep_h200.json \
        --name ncu_step_kernels_h200

``parse`` reads ncu's text report and writes, per kernel, the figures that answer the question: DRAM and
SM ("compute") throughput as % of peak, duration (under ncu's locked clocks: longer than a timed run),
registers per thread, theoretical and achieved occupancy and dynamic shared memory per block. The report
names no versions, so its provenance is that of a result written by the same GPU call (``--provenance-of``),
its command replaced by the profiled one.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

METRICS = {"DRAM Throughput": "dram_throughput_pct", "Compute (SM) Throughput": "sm_throughput_pct",
           "Duration": "duration_us", "Registers Per Thread": "registers_per_thread",
           "Theoretical Occupancy": "theoretical_occupancy_pct", "Achieved Occupancy": "achieved_occupancy_pct",
           "Dynamic Shared Memory Per Block": "dynamic_shared_kib_per_block", "SM Frequency": "sm_ghz"}
PROFILED_COMMAND = ("ncu --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats "
                    "-k regex:\"_mvue_compress24|_refresh24|_prepare24_kernel\" --launch-skip 4 --launch-count 4 "
                    "python -m benchmarks.step_kernels_ncu run")
_KERNEL = re.compile(r"^\s{2}(\w+) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\)")
_ROW = re.compile(r"^\s+(.+?)\s{2,}(\S+(?:/\S+)?)?\s+([\d.,]+)\s*$")


def parse_report(text: str) -> dict:
    """{kernel name: {metric: value, "grid": [x, y, z], "block": [x, y, z]}} from ncu's text report (the
    last profiled launch of each kernel wins)."""
    out: dict = {}
    current = None
    for line in text.splitlines():
        m = _KERNEL.match(line)
        if m:
            current = out.setdefault(m.group(1), {})
            current["grid"] = [int(v) for v in m.group(2, 3, 4)]
            current["block"] = [int(v) for v in m.group(5, 6, 7)]
            continue
        row = _ROW.match(line)
        if current is not None and row and row.group(1).strip() in METRICS:
            current[METRICS[row.group(1).strip()]] = float(row.group(3).replace(",", ""))
    if not out:
        raise ValueError("no kernel section found: is this the text output of `ncu --section SpeedOfLight ...`?")
    return out


def run() -> None:
    import torch
    from sparsity_lab import kernels as k

    if not torch.cuda.is_available():
        raise SystemExit("step_kernels_ncu run launches the kernels on a CUDA GPU; none is available here")
    g = torch.Generator(device="cuda").manual_seed(0)
    dz = torch.randn(8192, 16384, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(16384, 4096, device="cuda", generator=g).to(torch.bfloat16)
    beta = torch.tensor(0.9, device="cuda")
    mask = k.transposable_mask24(w, pruned=False)[0]
    for _ in range(2):  # the first round compiles; ncu skips it (--launch-skip 4)
        k.mvue_compress24(dz, 1)
        k.refresh24(w, mask, beta)
        k.prepare24(w, mask, beta)
        k.mvue_compress24_cutlass(dz, 1)
    torch.cuda.synchronize()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("run", help="launch the kernels (under ncu)")
    parse = sub.add_parser("parse", help="ncu's text report -> results JSON")
    parse.add_argument("report")
    parse.add_argument("--name", default="ncu_step_kernels")
    parse.add_argument("--out-dir", default="results")
    parse.add_argument("--provenance-of", required=True,
                       help="a results JSON written on the same GPU machine in the same call as the profiled run")
    args = p.parse_args(argv)
    if args.what == "run":
        run()
        return 0
    import json
    kernels = parse_report(Path(args.report).read_text())
    for name, m in kernels.items():
        print(f"{name:<34} DRAM {m.get('dram_throughput_pct')} %  SM {m.get('sm_throughput_pct')} %  "
              f"{m.get('registers_per_thread')} registers  occupancy {m.get('achieved_occupancy_pct')} %")
    provenance = dict(json.loads(Path(args.provenance_of).read_text())["provenance"])
    provenance["command"] = PROFILED_COMMAND
    provenance["provenance_of"] = Path(args.provenance_of).name
    result = {"provenance": provenance, "kernels": kernels,
              "how": "ncu's text report, parsed by python -m benchmarks.step_kernels_ncu parse"}
    path = Path(args.out_dir) / f"{args.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
