"""How long the host takes to enqueue an eager lab step, beside the step's wall time, and where that host time goes.

An eager step is host-bound when Python and the launches take as long as the GPU's kernels: the GPU then idles
between kernels (``step-profile``'s "idle" row). ``python -m benchmarks step-host --runs bf16w+fp8:all24 ...``
builds each run as ``step-profile`` does (the same model, modes and configurations), takes a few warm-up steps,
then times ``--steps`` steps twice over: the host clock when the last step has been enqueued (host ms per step)
and after the GPU finished (wall ms per step). ``--profile-steps`` more steps run under cProfile: the functions
with the most time of their own and the most cumulative time go to the JSON (``results/step_host_<gpu>.json``)
with provenance. cProfile slows Python down, so its shares rank the host's work; its totals are not the step's.

Host time includes waiting: once CUDA's launch queue is full, a launch blocks until the GPU frees a slot, so a
GPU-bound step also shows host time close to wall time. ``step-profile``'s idle time (wall minus kernels) tells
the two apart: a host-bound step leaves the GPU idle, a GPU-bound one does not.

``--smoke`` runs the plumbing on the CPU (a tiny GPT, backend torch; no fp8 runs there).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

import torch

from benchmarks import step_profile as sp
from sparsity_lab.lab.arguments import backend_name, output_folder, positive_int


def _top(stats: pstats.Stats, key: str, n: int) -> list[dict]:
    """The n functions with the most ``key`` ("tottime" or "cumtime"), per step."""
    rows = []
    for (file, line, name), (_, ncalls, tottime, cumtime, _) in stats.stats.items():
        rows.append({"function": f"{file}:{line}({name})", "calls": ncalls, "tottime_s": tottime, "cumtime_s": cumtime})
    rows.sort(key=lambda r: r[f"{key}_s"], reverse=True)
    return rows[:n]


def host_and_wall(step, first: int, count: int, device: torch.device) -> tuple[float, float]:
    """(host ms per step when the last of ``count`` steps is enqueued, wall ms per step when the GPU is done)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(count):
        step(first + i)
    host = (time.perf_counter() - t0) / count * 1e3
    if device.type == "cuda":
        torch.cuda.synchronize()
    return host, (time.perf_counter() - t0) / count * 1e3


def measure_run(mode: str, config: str, args, batches: list, device: torch.device) -> dict:
    built = sp.build(sp.configs(10)[config], sp.parse_mode(mode), args, batches, device)
    try:
        for i in range(args.warmup):
            built.step(i)
        host, wall = host_and_wall(built.step, args.warmup, args.steps, device)
        first = args.warmup + args.steps
        profiler = cProfile.Profile()
        profiler.enable()
        for i in range(args.profile_steps):
            built.step(first + i)
        if device.type == "cuda":
            torch.cuda.synchronize()
        profiler.disable()
        stats = pstats.Stats(profiler)
        return {"mode": mode, "config": config, "host_ms": host, "wall_ms": wall, "host_over_wall": host / wall,
                "profiled_steps": args.profile_steps, "profiled_s": stats.total_tt,
                "top_self": _top(stats, "tottime", args.top), "top_cumulative": _top(stats, "cumtime", args.top)}
    finally:
        if built.graph_step is not None:
            built.graph_step.release()
        del built
        if device.type == "cuda":
            torch.cuda.empty_cache()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", nargs="+", default=["bf16w:all24", "bf16w+fp8:all24", "bf16w+fp8:dense"],
                   help="MODE:CONFIG pairs, step-profile's names (default: bf16 and FP8 2:4, dense FP8)")
    p.add_argument("--backend", type=backend_name, default=None, help="bf16 2:4 backend (default cusparselt)")
    p.add_argument("--fp8-backend", choices=sp.FP8_BACKENDS, default="cutlass_fp8", help="the fp8 mode's 2:4 backend")
    p.add_argument("--warmup", type=positive_int, default=5, help="steps before timing (default 5)")
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps (default 10)")
    p.add_argument("--profile-steps", type=positive_int, default=6, help="steps under cProfile (default 6)")
    p.add_argument("--top", type=positive_int, default=40, help="functions kept per ranking (default 40)")
    p.add_argument("--out-dir", type=output_folder, default=None, help="folder for the JSON (default results/)")
    p.add_argument("--name", default=None, help="JSON name (default step_host_<gpu>; step_host_smoke)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny GPT, backend torch: the plumbing only")


def _parse_runs(runs: list[str]) -> list[tuple[str, str]]:
    out = []
    for text in runs:
        mode, _, config = text.partition(":")
        if config not in sp.configs(10):
            raise ValueError(f"--runs: {text!r} is not MODE:CONFIG with CONFIG one of {list(sp.configs(10))}")
        sp.parse_mode(mode)  # names the bad mode
        out.append((mode, config))
    return out


def check_arguments(args: argparse.Namespace) -> None:
    """Unknown runs, or fp8 runs under --smoke: ValueError before any work (``python -m benchmarks`` exits 2)."""
    runs = _parse_runs(args.runs)
    if args.smoke and any("fp8" in mode for mode, _ in runs):
        raise ValueError("--runs: the fp8 mode needs a CUDA GPU; --smoke runs bf16 modes only")


def run(args: argparse.Namespace) -> int:
    from sparsity_lab.lab.data import BatchSampler, load_corpus
    from sparsity_lab.provenance import write_result

    try:
        check_arguments(args)
        runs = _parse_runs(args.runs)
    except ValueError as err:
        print(f"benchmarks step-host: {err}", file=sys.stderr)
        return 2
    if not args.smoke and not torch.cuda.is_available():
        print("benchmarks step-host needs a CUDA GPU; --smoke runs the plumbing on the CPU", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    args.model = dict(sp.SMOKE_MODEL if args.smoke else sp.MODEL)
    args.backend = args.backend or ("torch" if args.smoke else "cusparselt")
    if args.smoke:
        args.warmup, args.steps, args.profile_steps = 1, min(args.steps, 2), 1
    m = args.model
    corpus = load_corpus(None, 300_000 if args.smoke else 4_000_000, min_split_bytes=m["context"] + 1)
    sampler = BatchSampler(corpus.train, m["batch"], m["context"], seed=0)
    batches = [sampler.sample(device) for _ in range(args.warmup + args.steps + args.profile_steps)]
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else None
    records = []
    for mode, config in runs:
        r = measure_run(mode, config, args, batches, device)
        records.append(r)
        print(f"{mode} {config}: host {r['host_ms']:.1f} ms a step to enqueue, wall {r['wall_ms']:.1f} ms "
              f"(host / wall {r['host_over_wall']:.2f})", flush=True)
        for row in r["top_self"][:8]:
            print(f"    {row['tottime_s'] / args.profile_steps * 1e3:6.2f} ms a step (profiled)  "
                  f"{row['calls'] / args.profile_steps:>7.1f} calls a step  {row['function'][-90:]}")
    name = args.name or ("step_host_smoke" if args.smoke else f"step_host_{sp.gpu_tag(gpu)}")
    path = write_result(name, {"smoke": args.smoke, "gpu": gpu, "model": m, "backend": args.backend,
                               "fp8_backend": args.fp8_backend, "warmup": args.warmup, "steps": args.steps,
                               "records": records}, directory=args.out_dir)
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks step-host", description=__doc__.split("\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
