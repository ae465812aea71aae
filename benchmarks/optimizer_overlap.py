"""How much of the step's 2:4 weight work hides under the optimizer's pass when the two run on two CUDA streams.

The two passes over every 2:4 weight of a step are bound by different parts of the GPU:
* the optimizer (kernel 20, ``kernels/adamw_master.py``: AdamW on float32 masters, the bf16 weight written)
  moves 28 bytes a weight and does little arithmetic: it is bound by memory;
* the mask refresh with both compressed forms (kernel 21 for cuSPARSELt, kernel 24 for CUTLASS E4M3) reads
  2 bytes a weight and runs a few hundred instructions on each 4 x 4 block: it is bound by the SMs
  (``results/ncu_step_kernels_h200.json``: 85-91 % SM throughput, 27-34 % of DRAM's).
Run one after the other they cost the sum. On two streams, weight i's refresh waits only for weight i's
update (an event), so it can run while the optimizer streams weight i + 1 and later ones.

``python -m benchmarks optimizer-overlap`` times, at the lab GPT's weight shapes (``--width``, ``--layers``:
per layer the attention's qkv (3d, d) and output (d, d), the FFN's (4d, d) and (d, 4d)):
* ``optimizer``: kernel 20 over every weight, one launch per weight;
* ``work``: the 2:4 work alone (``--works``: ``refresh`` kernel 21, ``prepare`` kernel 11 with a fixed mask,
  ``refresh_cutlass_fp8`` kernel 24);
* ``serial``: the optimizer over every weight, then the work over every weight, one stream (today's order);
* ``two_streams``: weight i's update on the main stream, its work on a side stream after an event;
  ``two_streams_urgent`` the same with the side stream at CUDA's highest priority.
It prints ``hidden`` = (serial - the faster two-stream schedule) / work: the share of the work taken off the step.

Measured on an H200 (``results/optimizer_overlap_h200.json``): 2-10 % of the work hidden. A kernel that did the
update and the refresh in one pass per 64 x 64 block did no better (``results/optimizer_overlap_h200_k25.json``,
docs/measuring.md): the refresh's arithmetic does not hide under the optimizer's memory traffic either way.

``--smoke`` runs the plumbing on the CPU under the Triton interpreter (tiny shapes, no streams: the
numbers mean nothing).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from sparsity_lab.lab.arguments import output_folder, positive_int

WORKS = ("refresh", "prepare", "refresh_cutlass_fp8")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--width", type=positive_int, default=4096, help="d_model (default 4096, the lab GPT's)")
    p.add_argument("--layers", type=positive_int, default=8, help="transformer blocks (default 8)")
    p.add_argument("--works", nargs="+", choices=WORKS, default=list(WORKS), help="the 2:4 work to overlap")
    p.add_argument("--reps", type=positive_int, default=10, help="timed repetitions of each schedule (median)")
    p.add_argument("--out-dir", type=output_folder, default=None, help="folder for the JSON (default results/)")
    p.add_argument("--name", default=None, help="JSON name (default optimizer_overlap_<gpu>)")
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, width 64, one layer: the plumbing only")


def weight_shapes(width: int, layers: int) -> list[tuple[int, int]]:
    """(out, in) of every 2:4 linear of the lab GPT, in the optimizer's order."""
    d = width
    return [shape for _ in range(layers) for shape in ((3 * d, d), (d, d), (4 * d, d), (d, 4 * d))]


class Weight:
    """One 2:4 weight's optimizer state and mask: bf16 W and gradient, float32 master and moments."""

    def __init__(self, shape: tuple[int, int], device: torch.device, gen: torch.Generator) -> None:
        self.master = torch.randn(shape, device=device, generator=gen) * 0.02
        self.low = self.master.to(torch.bfloat16)
        self.grad = (torch.randn(shape, device=device, generator=gen) * 1e-3).to(torch.bfloat16)
        self.m = torch.zeros(shape, device=device)
        self.v = torch.zeros(shape, device=device)
        self.mask = torch.ones(shape, device=device, dtype=torch.bool)
        self.beta = torch.ones((), device=device)


def _work_fn(name: str, device: torch.device):
    """(weight) -> None: one weight's 2:4 work of kind ``name``."""
    from sparsity_lab import kernels as k

    inv_scale = torch.full((1,), 448.0 / 0.1, device=device)
    if name == "refresh":
        return lambda w: k.refresh24(w.low, w.mask, w.beta, out_dtype=torch.bfloat16, count=True)
    if name == "prepare":
        return lambda w: k.prepare24(w.low, w.mask, w.beta, out_dtype=torch.bfloat16)
    return lambda w: k.refresh24_cutlass_fp8(w.low, w.mask, w.beta, inv_scale, count=True)


def _update(w: Weight) -> None:
    """Kernel 20 on one weight (the step count is the same every call: timing, not training)."""
    from sparsity_lab.kernels.adamw_master import adamw_master_

    adamw_master_([w.low], [w.grad], [w.master], [w.m], [w.v], step=1, lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-8,
                  weight_decay=0.1)


def schedules(weights: list[Weight], work, update, device: torch.device) -> dict:
    """name -> a function running one schedule over every weight."""
    cuda = device.type == "cuda"
    side = torch.cuda.Stream(device) if cuda else None
    # the same with the side stream at CUDA's highest priority: the block scheduler then places the work's
    # blocks first, and the optimizer's memory traffic fills what they leave
    urgent = torch.cuda.Stream(device, priority=torch.cuda.Stream.priority_range()[1]) if cuda else None

    def optimizer():
        for w in weights:
            update(w)

    def work_only():
        for w in weights:
            work(w)

    def serial():
        optimizer()
        work_only()

    def on_two_streams(side):
        if side is None:  # the CPU has no streams: the plumbing only
            return serial()
        main = torch.cuda.current_stream(device)
        side.wait_stream(main)  # the work of the previous repetition's step is ordered after it too
        for w in weights:
            update(w)
            done = torch.cuda.Event()
            done.record(main)
            with torch.cuda.stream(side):
                side.wait_event(done)
                work(w)
        main.wait_stream(side)
    return {"optimizer": optimizer, "work": work_only, "serial": serial,
            "two_streams": lambda: on_two_streams(side), "two_streams_urgent": lambda: on_two_streams(urgent)}


def time_ms(fn, device: torch.device, reps: int) -> list[float]:
    """Wall milliseconds of each of ``reps`` calls (after one warm-up), the device drained around each."""
    fn()
    out = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def measure(work_name: str, weights: list[Weight], device: torch.device, reps: int) -> dict:
    fns = schedules(weights, _work_fn(work_name, device), _update, device)
    times = {}
    for name in ("optimizer", "work", "serial", "two_streams", "two_streams_urgent", "serial"):  # serial: before and after
        runs = time_ms(fns[name], device, reps)
        times.setdefault(name, []).extend(runs)
    med = {name: statistics.median(v) for name, v in times.items()}
    best = min(("two_streams", "two_streams_urgent"), key=lambda k: med[k])
    hidden = (med["serial"] - med[best]) / med["work"] if med["work"] > 0 else None
    return {"work": work_name, "ms_median": med, "ms_all": times, "best_two_streams": best,
            "hidden_share_of_work": hidden,
            "two_streams_vs_serial": med["serial"] / med[best] if med[best] > 0 else None}


def run(args: argparse.Namespace) -> int:
    from benchmarks.timing import bench_device
    from sparsity_lab.provenance import write_result

    device = bench_device(args.smoke, "optimizer-overlap")
    if device is None:
        return 1
    width, layers = (64, 1) if args.smoke else (args.width, args.layers)
    gen = torch.Generator(device=device).manual_seed(0)
    weights = [Weight(s, device, gen) for s in weight_shapes(width, layers)]
    reps = 1 if args.smoke else args.reps
    print(f"{len(weights)} weights, {sum(w.master.numel() for w in weights) / 1e9:.2f} G elements, "
          f"{'CPU interpreter (numbers mean nothing)' if args.smoke else torch.cuda.get_device_name(device)}")
    records = []
    for name in args.works:
        rec = measure(name, weights, device, reps)
        med = rec["ms_median"]
        print(f"{name:>20}: optimizer {med['optimizer']:8.2f} ms  work {med['work']:8.2f} ms  serial "
              f"{med['serial']:8.2f} ms  two streams {med['two_streams']:8.2f} / urgent {med['two_streams_urgent']:8.2f} ms"
              f"  -> {rec['two_streams_vs_serial']:.3f}x,"
              f" {rec['hidden_share_of_work']:.0%} of the work hidden")
        records.append(rec)
    gpu = "smoke" if args.smoke else torch.cuda.get_device_name(device).split()[-1].lower()
    path = write_result(args.name or f"optimizer_overlap_{gpu}",
                        {"smoke": args.smoke, "width": width, "layers": layers, "reps": reps,
                         "shapes": weight_shapes(width, layers), "records": records,
                         "method": "wall time around each schedule, the device drained before and after; median"},
                        directory=args.out_dir)
    print(f"wrote {path}")
    return 0
