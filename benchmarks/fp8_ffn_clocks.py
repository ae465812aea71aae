"""The GPU's clocks and power while each FFN step runs: does a step run at a lower clock than another?

``python -m benchmarks fp8-ffn-clocks`` (GPU) builds ``fp8-training``'s FFN variants (``--variants``; by default
dense FP8 and FP8 2:4 with the host alpha, at the FFN section's shape), warms each up, then runs each eagerly with
no pause for ``--seconds`` while ``nvidia-smi`` samples the SM clock, the memory clock, the power draw and the
active clock-event reasons (power cap, thermal slowdown, ...) every 50 ms. Variants alternate for ``--rounds``
rounds. It prints, per variant, the step time and the medians of the samples, and the reasons seen with the share of
samples that carried each: a step the power limit slows shows a lower SM clock and the power-cap reason.

Why: in an FFN profile the 2:4 step's GELU kernels, the same code on the same shapes as the dense step's, ran
19-21 % slower (``results/fp8_ffn_profile_h200_k19_pair.json``). A clock that drops under the sparse products would
do that. Measured on the H200 (``results/fp8_ffn_clocks_h200.json``): every FFN step runs at the power cap (about
690 W, the power-cap reason in all samples), and the FP8 2:4 step at a higher SM clock (1485 MHz) than dense FP8
(1380) and bf16 dense (1440). So the 2:4 step is not clocked down, and the slower GELU has another cause.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import sys
import time

import torch

DEFAULT_VARIANTS = ("fp8_dense", "fp8_24_host_alpha")
QUERY = ("clocks.sm", "clocks.mem", "power.draw", "clocks_event_reasons.active")
OLD_REASONS_FIELD = "clocks_throttle_reasons.active"  # the field's name before NVIDIA driver 535
# clocks_event_reasons bits (NVML's nvmlClocksEventReason*): the ones a busy GPU can show
REASONS = {0x1: "idle", 0x2: "application clocks setting", 0x4: "power cap", 0x8: "hardware slowdown",
           0x10: "sync boost", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
           0x80: "hardware power brake"}
SAMPLE_MS = 50
SKIP_SAMPLES = 4  # the first 200 ms: the sampler starting and the clock settling after the switch of variant


def parse_samples(lines: list[str]) -> list[dict]:
    """nvidia-smi's ``--format=csv,noheader,nounits`` lines of QUERY -> [{sm_mhz, mem_mhz, power_w, reasons}].
    Lines that do not parse (a field "[N/A]", a cut last line) are dropped."""
    out = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(QUERY):
            continue
        try:
            out.append({"sm_mhz": float(parts[0]), "mem_mhz": float(parts[1]), "power_w": float(parts[2]),
                        "reasons": int(parts[3], 16)})
        except ValueError:
            continue
    return out


def summarize(samples: list[dict]) -> dict:
    """Medians of the samples and, per clock-event reason seen, the share of samples that carried it."""
    if not samples:
        return {"samples": 0}
    shares = {}
    for bit, name in REASONS.items():
        n = sum(1 for s in samples if s["reasons"] & bit)
        if n:
            shares[name] = n / len(samples)
    return {"samples": len(samples), "sm_mhz": statistics.median(s["sm_mhz"] for s in samples),
            "mem_mhz": statistics.median(s["mem_mhz"] for s in samples),
            "power_w": statistics.median(s["power_w"] for s in samples), "reasons": shares}


def _gpu_id() -> list[str]:
    """nvidia-smi's ``--id`` of CUDA device 0 (its UUID), or nothing when torch does not give one."""
    uuid = getattr(torch.cuda.get_device_properties(0), "uuid", None)
    return [f"--id=GPU-{uuid}"] if uuid is not None else []


@functools.cache
def _query() -> str:
    """QUERY as this nvidia-smi names its fields (asked once)."""
    probe = subprocess.run(["nvidia-smi", f"--query-gpu={QUERY[-1]}", "--format=csv,noheader"], capture_output=True,
                           text=True)
    return ",".join(QUERY if probe.returncode == 0 else (*QUERY[:-1], OLD_REASONS_FIELD))


class Sampler:
    """``nvidia-smi -lms`` in the background; ``stop()`` returns the samples taken."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(["nvidia-smi", *_gpu_id(), f"--query-gpu={_query()}",
                                      "--format=csv,noheader,nounits", f"-lms={SAMPLE_MS}"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stop(self) -> list[dict]:
        self.proc.terminate()
        out, err = self.proc.communicate(timeout=10)
        samples = parse_samples(out.splitlines())
        if not samples:
            raise RuntimeError(f"nvidia-smi gave no samples: {err.strip()[:300] or out.strip()[:300]}")
        return samples[SKIP_SAMPLES:] or samples


def run_for(step, seconds: float) -> tuple[float, list[dict]]:
    """Run ``step`` back to back for about ``seconds`` under a sampler: (ms per step, samples)."""
    sampler = Sampler()
    try:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        steps, t_end = 0, time.perf_counter() + seconds
        start.record()
        while time.perf_counter() < t_end:
            for _ in range(10):
                step()
            steps += 10
            torch.cuda.synchronize()  # keeps the host at most 10 steps ahead, so the loop ends on time
        end.record()
        end.synchronize()
    finally:
        samples = sampler.stop()
    return start.elapsed_time(end) / steps, samples


def measure(variants: tuple[str, ...], seconds: float, rounds: int) -> dict:
    from benchmarks.fp8_training import FFN_SHAPE, build_ffn, eager_step
    tokens, d = FFN_SHAPE
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(tokens, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    dy = torch.randn(tokens, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    steps = {}
    for v in variants:
        steps[v] = eager_step(build_ffn(v, d), x, dy)
        for _ in range(5):  # algorithm searches and first scales done
            steps[v]()
    torch.cuda.synchronize()
    rows = {v: [] for v in variants}
    for r in range(rounds):
        for v in variants:
            ms, samples = run_for(steps[v], seconds)
            row = {"ms": ms, **summarize(samples)}  # samples is never empty: Sampler.stop raises then
            rows[v].append(row)
            print(f"round {r + 1}/{rounds} {v}: {ms:.3f} ms a step; SM {row['sm_mhz']:.0f} MHz, "
                  f"power {row['power_w']:.0f} W, reasons {row['reasons']}", flush=True)
    out = {"tokens": tokens, "d_model": d, "seconds": seconds, "rounds": rounds, "sample_ms": SAMPLE_MS,
           "variants": {}}
    for v, rs in rows.items():
        reasons = sorted({name for row in rs for name in row["reasons"]})
        out["variants"][v] = {
            "ms": statistics.median(row["ms"] for row in rs),
            "sm_mhz": statistics.median(row["sm_mhz"] for row in rs),
            "power_w": statistics.median(row["power_w"] for row in rs),
            "reasons": {name: statistics.median(row["reasons"].get(name, 0.0) for row in rs) for name in reasons},
            "rounds": rs}
    return out


def _variants(text: str) -> tuple[str, ...]:
    from benchmarks.fp8_training import FFN_VARIANTS
    names = tuple(v for v in text.split(",") if v)
    bad = [v for v in names if v not in FFN_VARIANTS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"each must be one of {', '.join(FFN_VARIANTS)}, got {text!r}")
    return names


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.5 <= value <= 600:
        raise argparse.ArgumentTypeError(f"expected a number of seconds from 0.5 to 600, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sparsity_lab.lab.arguments import output_folder, positive_int
    p.add_argument("--variants", type=_variants, default=DEFAULT_VARIANTS,
                   help=f"comma-separated fp8-training FFN variants (default {','.join(DEFAULT_VARIANTS)})")
    p.add_argument("--seconds", type=_seconds, default=4.0, help="seconds each variant runs per round (default 4)")
    p.add_argument("--rounds", type=positive_int, default=3, help="rounds, the variants alternating (default 3)")
    p.add_argument("--out-dir", type=output_folder, default=None, help="folder for the JSON (default results/)")
    p.add_argument("--name", default="fp8_ffn_clocks_h100", help="JSON name")


def run(args) -> int:
    from sparsity_lab.provenance import write_result
    if not torch.cuda.is_available():
        print("fp8-ffn-clocks samples a CUDA GPU's clocks while FFN steps run; this machine has none", file=sys.stderr)
        return 2
    result = measure(args.variants, args.seconds, args.rounds)
    for v, row in result["variants"].items():
        reasons = ", ".join(f"{k} {share:.0%}" for k, share in row["reasons"].items()) or "none"
        print(f"{v}: {row['ms']:.3f} ms a step, SM clock {row['sm_mhz']:.0f} MHz, power {row['power_w']:.0f} W; "
              f"clock-event reasons (share of samples): {reasons}", flush=True)
    path = write_result(args.name, result, directory=args.out_dir)
    print("wrote", path)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks fp8-ffn-clocks", description=__doc__.split("\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
