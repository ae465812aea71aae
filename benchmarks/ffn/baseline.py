"""The dense baseline of ``python -m benchmarks ffn``: its start-of-run probe, and an experiment on why dense FFN steps
time slower in alternation with the 2:4 variants than alone.

``products_probe``: the six products of one dense FFN training step (forward x W1^T, h W2^T; backward
dy W2, dy^T h, dh W1, dh^T x) as bare bf16 matmuls, no GELU, no autograd: the matmul rate the dense
step's products reach on this GPU now. The dense step's achieved rate is 12 t d f / its time
(``ffn_step_flops``); ``conditions.baseline_check`` compares the two.

``python -m benchmarks.ffn.baseline [--tokens 16384 --d-model 4096]`` (a GPU) times the dense
FFN step at one shape under several conditions, each call between its own CUDA events, while
``ConditionSampler`` records clocks, power and temperature per section:

  alone_fresh        only the dense FFN on the GPU
  sustained          dense alone, back to back for --sustained-s seconds (power and heat build up)
  alone_resident     dense alone, with the 2:4 variants built, warmed up and resident in memory
  alternation        benchmarks ffn's paired rounds: per round each variant --round-calls calls, order rotated
  alternation_empty  the same, synchronize + torch.cuda.empty_cache() between variants
  alternation_idle   the same, --idle-s seconds of idle GPU between variants
  alternation_long   the same, 5x the calls per turn (is only the first call after a switch slow?)
  probe at the start and at the end of the run

Writes results/ffn_baseline_h100.json (``--name``); the notes are results/ffn_baseline_NOTES.md.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable

import torch

from benchmarks.conditions import ConditionSampler, cuda_median_ms, format_conditions, matmul_probe

ALTERNATION_VARIANTS = ("dense", "ours_mvue", "ours_mvue_dense_products")


def ffn_step_flops(tokens: int, d: int, ffn: int) -> int:
    """FLOPs of one FFN training step's products: 2 forward + 4 backward products of 2 t d f each."""
    return 12 * tokens * d * ffn


def products_probe(tokens: int, d: int, ffn: int | None = None, device: torch.device | str = "cuda",
                   dtype: torch.dtype = torch.bfloat16,
                   time_ms: Callable[[Callable[[], object]], float] | None = None) -> dict:
    """{"ms", "tflops", "shape"} of the six bare matmuls of one dense FFN step (random operands)."""
    from sparsity_lab.flops import tflops

    ffn = ffn or 4 * d
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(tokens + d + 7)

    def rand(*shape):
        return torch.randn(*shape, device=device, generator=gen).to(dtype)
    x, w1, w2, dy = rand(tokens, d), rand(ffn, d), rand(d, ffn), rand(tokens, d)
    h = rand(tokens, ffn)

    def step() -> None:
        x @ w1.t()          # forward, up
        h @ w2.t()          # forward, down
        dh = dy @ w2        # input gradient of down
        dy.t() @ h          # weight gradient of down
        dh @ w1             # input gradient of up
        dh.t() @ x          # weight gradient of up
    if time_ms is None:
        time_ms = cuda_median_ms if device.type == "cuda" else (lambda fn: (_host(fn)))
    ms = float(time_ms(step))
    return {"shape": [tokens, d, ffn], "ms": ms, "tflops": tflops(ffn_step_flops(tokens, d, ffn), ms)}


def _host(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def per_call_ms(fn: Callable[[], None], calls: int) -> list[float]:
    """Milliseconds of each of ``calls`` back-to-back calls, each between its own CUDA events (the host
    clock without a GPU: a smoke run's numbers mean nothing)."""
    if not torch.cuda.is_available():
        times = []
        for _ in range(calls):
            times.append(_host(fn))
        return times
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    _sync()
    return [a.elapsed_time(b) for a, b in events]


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _empty_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _summary(times: list[float]) -> dict:
    return {"calls": len(times), "median": statistics.median(times), "min": min(times), "max": max(times),
            "first": times[0]}


def alternation(steps: dict[str, Callable[[], None]], rounds: int, calls: int, between=None) -> dict:
    """Per variant: the per-call times of every turn, and where dense stood in the round's order."""
    names = list(steps)
    out = {v: {"turns": [], "position": []} for v in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for pos, v in enumerate(order):
            if between is not None:
                between()
            out[v]["turns"].append(per_call_ms(steps[v], calls))
            out[v]["position"].append(pos)
    for v, rec in out.items():
        flat = [t for turn in rec["turns"] for t in turn]
        rec["median"] = statistics.median(flat)
        rec["median_first_call"] = statistics.median(turn[0] for turn in rec["turns"])
        later = [t for turn in rec["turns"] for t in turn[1:]]
        rec["median_later_calls"] = statistics.median(later) if later else None
    return out


def experiment(tokens: int, d: int, args) -> dict:
    from benchmarks.ffn.measure import _inputs
    from benchmarks.ffn.settings import Settings
    from benchmarks.ffn.variants import build_ffn, train_step

    smoke = args.smoke
    backends = ({"cusparselt": "torch", "cusparselt_auto": "torch", "dense_products": "torch"} if smoke else
                {"cusparselt": "cusparselt", "cusparselt_auto": "cusparselt_auto", "dense_products": "triton"})
    device = torch.device("cpu" if smoke else "cuda")
    s = Settings(smoke=smoke, device=device, dtype=torch.bfloat16, tokens=[tokens], d_models=[d],
                 target=(tokens, d), reps=args.calls, warmup=3, budget_s=1e9, graph=False, gpt=None,
                 backends=backends)
    flops = ffn_step_flops(tokens, d, 4 * d)
    sampler = ConditionSampler(False if smoke else None, interval_s=0.1).start()
    result: dict = {"shape": {"tokens": tokens, "d_model": d, "ffn": 4 * d}, "step_flops": flops, "sections": {}}

    def section(name: str, fn):
        t0 = time.monotonic()
        with sampler.section(name):
            value = fn()
        print(f"  {name}: {time.monotonic() - t0:.1f} s", flush=True)
        result["sections"][name] = value
        return value

    try:
        section("probe_start", lambda: {"gemm": matmul_probe(tokens, d, 4 * d, device, label="x W1^T"),
                                        "products": products_probe(tokens, d, device=device)})
        x, dy = _inputs(tokens, d, s)
        dense = build_ffn("dense", d, s)
        dense_step = train_step(dense, x, dy)
        for _ in range(3):
            dense_step()
        _sync()
        section("alone_fresh", lambda: [_summary(per_call_ms(dense_step, args.calls)) for _ in range(5)])

        def sustained():
            times, t0 = [], time.monotonic()
            while time.monotonic() - t0 < args.sustained_s:
                times += per_call_ms(dense_step, 25)
            return {"calls": len(times), "median_by_second": [statistics.median(times[i:i + 50])
                                                              for i in range(0, len(times), 50)],
                    **_summary(times)}
        section("sustained", sustained)
        steps = {"dense": dense_step}
        models = {"dense": dense}
        for v in ALTERNATION_VARIANTS[1:]:
            models[v] = build_ffn(v, d, s)
            steps[v] = train_step(models[v], x, dy)
            for _ in range(3):
                steps[v]()
        _sync()
        if not smoke:
            result["memory_allocated_gib"] = torch.cuda.memory_allocated() / 2**30
            result["memory_reserved_gib"] = torch.cuda.memory_reserved() / 2**30
        section("alone_resident", lambda: [_summary(per_call_ms(dense_step, args.calls)) for _ in range(5)])

        def empty():
            _sync()
            _empty_cache()

        def idle():
            _sync()
            time.sleep(args.idle_s)
        section("alternation", lambda: alternation(steps, args.rounds, args.round_calls))
        section("alternation_empty", lambda: alternation(steps, args.rounds, args.round_calls, empty))
        section("alternation_idle", lambda: alternation(steps, args.rounds, args.round_calls, idle))
        section("alternation_long", lambda: alternation(steps, args.rounds, 5 * args.round_calls))
        section("alone_after", lambda: [_summary(per_call_ms(dense_step, args.calls)) for _ in range(5)])
        models = steps = dense = dense_step = None
        _sync()
        _empty_cache()
        section("probe_end", lambda: {"gemm": matmul_probe(tokens, d, 4 * d, device, label="x W1^T"),
                                      "products": products_probe(tokens, d, device=device)})
    finally:
        sampler.stop()
    result["conditions"] = sampler.summary()
    return result


def dense_ms_by_section(result: dict) -> dict[str, float]:
    """The median dense step ms of each section (the table the notes quote)."""
    out = {}
    for name, value in result["sections"].items():
        if isinstance(value, list):
            out[name] = statistics.median(b["median"] for b in value)
        elif name == "sustained":
            out[name] = value["median"]
        elif name.startswith("alternation"):
            out[name] = value["dense"]["median"]
            out[name + " (first call of a turn)"] = value["dense"]["median_first_call"]
            if value["dense"].get("median_later_calls") is not None:
                out[name + " (later calls)"] = value["dense"]["median_later_calls"]
    return out


def main(argv: list[str] | None = None) -> int:
    from sparsity_lab.provenance import write_result

    p = argparse.ArgumentParser(prog="python -m benchmarks.ffn.baseline",
                                description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--d-model", type=int, default=4096)
    p.add_argument("--calls", type=int, default=20, help="calls per timed block (alone)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--round-calls", type=int, default=6, help="calls per variant per turn (benchmarks ffn: ~100 ms)")
    p.add_argument("--sustained-s", type=float, default=10.0)
    p.add_argument("--idle-s", type=float, default=0.5)
    p.add_argument("--out-dir", default=None)
    p.add_argument("--name", default=None, help="JSON name (default ffn_baseline_h100; ffn_baseline_smoke)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shape, backend 'torch': the plumbing only")
    args = p.parse_args(argv)
    if args.smoke:
        args.tokens, args.d_model, args.sustained_s, args.idle_s = 32, 16, 0.05, 0.0
        args.name = args.name or "ffn_baseline_smoke"
    args.name = args.name or "ffn_baseline_h100"
    if not args.smoke and not torch.cuda.is_available():
        print("this experiment needs a CUDA GPU", file=sys.stderr)
        return 2
    result = experiment(args.tokens, args.d_model, args)
    path = write_result(args.name, result, directory=args.out_dir)
    flops = result["step_flops"]
    print(format_conditions(result["conditions"]))
    for key in ("probe_start", "probe_end"):
        pr = result["sections"][key]
        print(f"{key}: GEMM {pr['gemm']['tflops']:.0f} TFLOP/s; six products {pr['products']['ms']:.2f} ms "
              f"({pr['products']['tflops']:.0f} TFLOP/s)")
    for name, ms in dense_ms_by_section(result).items():
        print(f"dense FFN step, {name:<44} {ms:7.2f} ms  {flops / ms / 1e9:6.0f} TFLOP/s")
    for name in ("alternation", "alternation_empty", "alternation_idle", "alternation_long"):
        alt = result["sections"][name]
        print(f"{name}: " + ", ".join(f"{v} {r['median']:.2f} ms" for v, r in alt.items()))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
