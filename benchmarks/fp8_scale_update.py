"""Host time of the FP8 layers' end-of-step scale updates: kernel 25's one launch against the PyTorch operations.

``python -m benchmarks fp8-scale-update`` (GPU) builds ``--layers`` FP8 scaling states on the GPU (the lab GPT
has 32 FP8 layers), records an amax per tensor as a step does, and times ``advance()`` of every layer with each
path, in alternating rounds: the host's time to enqueue the updates (what a host-bound eager step pays) and the
GPU's time to finish them. Each recipe: "pass" and "host_alpha" (the latter also copies its next scales to the
host, the same on both paths). Before timing, both paths' states are checked equal to the bit.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

RECIPES = ("pass", "host_alpha")


def _states(recipe: str, layers: int, history_len: int):
    from sparsity_lab.methods.fp8_scaling import FP8Recipe, FP8ScalingState
    return [FP8ScalingState(FP8Recipe(scale_in_product=recipe, history_len=history_len), device="cuda")
            for _ in range(layers)]


def _step(states, amax: torch.Tensor) -> None:
    from sparsity_lab.methods.fp8_scaling import TENSORS
    for s in states:
        for t in TENSORS:
            s.record(t, amax)
        s.advance()


def time_paths(recipe: str, layers: int = 32, history_len: int = 16, steps: int = 50, rounds: int = 5) -> dict:
    """{"kernel"/"operations": {"host_us", "wall_us", "host_us_rounds"}} per layer update, and "equal"."""
    import sparsity_lab.methods.fp8_scaling as fp8_scaling
    original = fp8_scaling._one_launch
    amax = torch.tensor(3.0, device="cuda")
    paths = {"kernel": lambda h: h.is_cuda, "operations": lambda h: False}
    states = {name: _states(recipe, layers, history_len) for name in paths}
    times = {name: {"host": [], "wall": []} for name in paths}
    try:
        for name, rule in paths.items():  # warm-up (compiles kernel 25) and the equality check
            fp8_scaling._one_launch = rule
            for _ in range(3):
                _step(states[name], amax)
        torch.cuda.synchronize()
        equal = all(torch.equal(a, b) for sa, sb in zip(states["kernel"], states["operations"])
                    for a, b in zip(sa.buffers(), sb.buffers()))
        for _ in range(rounds):
            for name, rule in paths.items():
                fp8_scaling._one_launch = rule
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(steps):
                    _step(states[name], amax)
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                per = 1e6 / (steps * layers)
                times[name]["host"].append((t1 - t0) * per)
                times[name]["wall"].append((t2 - t0) * per)
    finally:
        fp8_scaling._one_launch = original
    out = {name: {"host_us": statistics.median(t["host"]), "wall_us": statistics.median(t["wall"]),
                  "host_us_rounds": t["host"]} for name, t in times.items()}
    out["equal"] = equal
    out["host_ms_per_step_saved"] = (out["operations"]["host_us"] - out["kernel"]["host_us"]) * layers / 1e3
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sparsity_lab.lab.arguments import output_folder, positive_int
    p.add_argument("--layers", type=positive_int, default=32, help="FP8 layers updated per step (the lab GPT's: 32)")
    p.add_argument("--steps", type=positive_int, default=50, help="updates of every layer per round (default 50)")
    p.add_argument("--out-dir", type=output_folder, default=None, help="folder for the JSON (default results/)")
    p.add_argument("--name", default="fp8_scale_update_h100", help="JSON name")


def run(args) -> int:
    from sparsity_lab.provenance import write_result
    if not torch.cuda.is_available():
        print("fp8-scale-update times kernel launches on a CUDA GPU; this machine has none", file=sys.stderr)
        return 2
    result = {"layers": args.layers, "steps": args.steps, "recipes": {}}
    for recipe in RECIPES:
        r = result["recipes"][recipe] = time_paths(recipe, args.layers, steps=args.steps)
        print(f"{recipe}: host {r['operations']['host_us']:.1f} us an update with the operations, "
              f"{r['kernel']['host_us']:.1f} us with kernel 25 ({r['host_ms_per_step_saved']:.2f} ms a step of "
              f"{args.layers} layers); GPU done after {r['operations']['wall_us']:.1f} / "
              f"{r['kernel']['wall_us']:.1f} us; states equal: {r['equal']}", flush=True)
    path = write_result(args.name, result, directory=args.out_dir)
    print("wrote", path)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks fp8-scale-update", description=__doc__.split("\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
