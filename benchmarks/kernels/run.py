"""``python -m benchmarks kernels``: the sizes, the copy ceiling, every kernel section in order, the JSON."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.timing import Timer, bench_device, copy_ceiling_gbps, sync
from benchmarks.kernels.bench import BF16, MIB, Bench
from benchmarks.kernels.checks import section
from benchmarks.kernels.report import Report
from sparsity_lab.lab.arguments import output_folder, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out-dir", type=output_folder, default=None,
                        help="where to write <name>.json (default results/)")
    parser.add_argument("--name", default=None,
                        help="result file name (default kernels_h100; with --only, kernels_h100_only_<numbers>)")
    parser.add_argument("--only", default=None, metavar="N[,N...]",
                        help="run only the sections with these numbers (e.g. 16, or 6,16); default: every section")
    parser.add_argument("--mib", type=positive_int, default=128,
                        help="size of each kernel's main bf16 tensor in MiB (default 128; the targets need >= 64)")
    parser.add_argument("--rep-ms", type=positive_int, default=100,
                        help="do_bench repetition time per measurement (ms)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes on the CPU through the Triton interpreter: checks the script, not the figures")


def sections() -> list[tuple[str, object]]:
    """(title, function) in the order the benchmark runs them (the order of the random draws and rows)."""
    # imported here: they import the kernels, hence triton (after TRITON_INTERPRET is set for --smoke)
    from benchmarks.kernels import activations, compressed, gradients, masks, refresh

    return [("1. row-wise 2:4", masks.prune24), ("2. transposable 2:4", masks.transposable24),
            ("3. soft threshold", masks.soft_threshold24), ("4. MVUE 2:4", gradients.mvue24),
            ("5. masked decay", gradients.masked_decay), ("7. FP8", activations.fp8),
            ("6. gated activations", activations.gated), ("8. compress24", compressed.compress24),
            ("9. count_flips", masks.count_flips), ("10. mvue_compress24", compressed.mvue_compress24),
            ("11. prepare24", compressed.prepare24), ("16. squared ReLU", activations.relu2),
            ("17. prune24_tokens", compressed.prune24_tokens), ("21. refresh24", refresh.refresh24),
            ("22. prepare24_cutlass", compressed.prepare24_cutlass),
            ("23. mvue_compress24_cutlass", compressed.mvue_compress24_cutlass),
            ("24. refresh24_cutlass", refresh.refresh24_cutlass)]


def chosen_sections(only: str | None) -> list[tuple[str, object]] | str:
    """The sections that ``--only`` names by number (all of them for None), or an error message."""
    every = sections()
    if only is None:
        return every
    numbers = {title.split(".")[0]: (title, fn) for title, fn in every}
    wanted = [part.strip() for part in only.split(",") if part.strip()]
    unknown = [w for w in wanted if w not in numbers]
    if not wanted or unknown:
        return (f"--only {only!r}: expected section numbers from {', '.join(numbers)} separated by commas"
                + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    return [numbers[w] for w in numbers if w in wanted]


def check_arguments(args: argparse.Namespace) -> None:
    """--only names known sections (ValueError), checked before any work."""
    chosen = chosen_sections(args.only)
    if isinstance(chosen, str):
        raise ValueError(chosen)


def run(args: argparse.Namespace) -> int:
    device = bench_device(args.smoke, "benchmarks kernels")
    if device is None:
        return 2
    chosen = chosen_sections(args.only)
    if isinstance(chosen, str):
        print(f"benchmarks kernels: {chosen}")
        return 2
    name = args.name or ("kernels_h100" if args.only is None else
                         "kernels_h100_only_" + "_".join(title.split(".")[0] for title, _ in chosen))
    if not args.smoke and args.mib < 64:
        print(f"warning: --mib {args.mib} is below the 64 MiB the targets are stated for")
    from sparsity_lab.provenance import write_result

    torch.manual_seed(0)
    timer = Timer(args.smoke, args.rep_ms)
    failures: list[str] = []
    # main tensor: `mib` MiB of bf16, as (rows, 4096) (smoke: a few KiB)
    cols = 64 if args.smoke else 4096
    rows = 48 if args.smoke else args.mib * MIB // (2 * cols)

    # ceiling: device-to-device copy of 2 x mib MiB (bytes read + written)
    copy_gbps = copy_ceiling_gbps(timer, 2 * rows * cols, device)
    report = Report(copy_gbps)
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu (smoke)'}; "
          f"copy ceiling {copy_gbps:.0f} GB/s ({4 * rows * cols * 2 / MIB:.0f} MiB moved per copy)")
    bench = Bench(device, timer, report, rows, cols, args.smoke, w=torch.randn(rows, cols, device=device, dtype=BF16))
    for title, kernel_section in chosen:
        with section(title, failures):
            kernel_section(bench)

    sync(device)
    payload = {"smoke": bool(args.smoke), "main_tensor_mib": (rows * cols * 2) / MIB, "summary": report.summary(),
               "sections": [title for title, _ in chosen],
               "failed_checks": failures, "rows": report.rows}
    path = write_result(name, payload, directory=Path(args.out_dir) if args.out_dir else None)
    print(f"wrote {path}")
    if args.smoke:
        print("(smoke run on the CPU interpreter: the numbers below are not measurements of the kernels)")
    if failures:
        print(f"FAILED checks (not timed): {failures}")
    report.print()
    return 1 if failures else 0
