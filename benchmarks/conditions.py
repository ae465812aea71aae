"""The conditions a speed figure was measured under, and the two rules every speed figure follows.

A speed-up is a ratio of two times measured on a GPU whose clock moves with its power draw and
temperature, so a ratio means little without its dense baseline's achieved rate and the clocks seen
while it ran. This module gives three things (imported by ``python -m benchmarks ffn``, ``python -m benchmarks lab-speed`` and
anyone who records a speed figure):

1. ``ConditionSampler``: a background thread that reads the GPU's SM and memory clocks (MHz), power
   draw (W), temperature (C) and the active clock-limit ("throttle") reasons every ``interval_s``,
   through NVML (the ``nvidia-ml-py`` package, module ``pynvml``) where it imports, else through
   ``nvidia-smi --query-gpu=...``; ``with sampler.section("dense alone"):`` marks the samples of a
   part of the run, and ``summary()`` gives min / median / max per quantity, overall and per section.
2. ``matmul_probe``: the dense bf16 matmul rate (TFLOP/s) of one product shape, measured at the
   start of a run (and again at its end, to see the drift).
3. The rules (pure functions, tested on the CPU):

   - ``headline``: the headline ratio uses the fastest dense time measured in the run (timed alone and
     timed in alternation with the 2:4 variants, whichever is faster); the other ratio is printed beside it.
   - ``baseline_check``: a dense baseline whose achieved rate is below ``BASELINE_FLOOR`` (90 %) of the
     start-of-run matmul rate of the same products is flagged, and a figure judged on it is not
     recorded as a result (``judged``: status "flagged", never "met").

The sampler takes a ``reader`` (a callable returning one sample dict) and a ``clock``: tests pass fakes.
"""
from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterable

import torch

BASELINE_FLOOR = 0.90  # a dense baseline below this fraction of the start-of-run matmul rate is flagged
QUANTITIES = ("sm_mhz", "mem_mhz", "power_w", "temp_c")
SMI_FIELDS = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"
# NVML's clock-limit reason bits (nvmlClocksEventReasons / the older nvmlClocksThrottleReasons)
THROTTLE_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}

Sample = dict  # {"t": seconds, "sm_mhz", "mem_mhz", "power_w", "temp_c": float | None, "reasons": [names]}


def throttle_names(mask: int) -> list[str]:
    """The reason names of an NVML clock-limit bit mask (unknown bits as hex), e.g. 0x4 -> ['sw_power_cap']."""
    if isinstance(mask, bool) or not isinstance(mask, int) or mask < 0:
        raise ValueError(f"mask must be an int >= 0, got {mask!r}")
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    return names + ([hex(unknown)] if unknown else [])


def _number(text: str) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def parse_smi_line(line: str) -> Sample:
    """One line of ``nvidia-smi --query-gpu=SMI_FIELDS --format=csv,noheader,nounits``."""
    parts = [p.strip() for p in line.strip().split(",")]
    if len(parts) != 5:
        raise ValueError(f"expected 5 comma-separated fields ({SMI_FIELDS}), got {line.strip()!r}")
    sm, mem, power, temp, reasons = parts
    try:
        mask = int(reasons, 16) if reasons.lower().startswith("0x") else int(reasons)
        names = throttle_names(mask)
    except ValueError:
        names = []  # "[N/A]"
    return {"sm_mhz": _number(sm), "mem_mhz": _number(mem), "power_w": _number(power), "temp_c": _number(temp),
            "reasons": names}


def nvml_reader(index: int = 0) -> Callable[[], Sample]:
    """A reader through NVML (``import pynvml``, from the nvidia-ml-py package); ImportError if absent."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    reasons = (getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
               or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons)

    def read() -> Sample:
        return {"sm_mhz": float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                "mem_mhz": float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                "temp_c": float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
                "reasons": throttle_names(int(reasons(handle)))}
    read()  # fail here, not in the sampling thread
    return read


def smi_reader(index: int = 0) -> Callable[[], Sample]:
    """A reader through ``nvidia-smi`` (one process per sample: use an interval of 0.2 s or more)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi is not on PATH")
    command = [exe, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits", "-i", str(index)]

    def read() -> Sample:
        out = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True).stdout
        return parse_smi_line(out.strip().splitlines()[0])
    read()
    return read


def open_reader(index: int = 0) -> tuple[Callable[[], Sample] | None, str]:
    """(reader, source): NVML where it works, else nvidia-smi, else (None, why neither works)."""
    problems = []
    for source, make in (("nvml", nvml_reader), ("nvidia-smi", smi_reader)):
        try:
            return make(index), source
        except Exception as err:  # noqa: BLE001 - missing package, no driver, no binary: try the next
            problems.append(f"{source}: {type(err).__name__}: {err}"[:200])
    return None, "none (" + "; ".join(problems) + ")"


def _stats(values: Iterable[float | None]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize(samples: list[Sample]) -> dict:
    """min / median / max of each quantity, and how many samples showed each clock-limit reason."""
    reasons: dict[str, int] = {}
    for s in samples:
        for name in s.get("reasons", []):
            reasons[name] = reasons.get(name, 0) + 1
    return {"samples": len(samples), **{q: _stats(s.get(q) for s in samples) for q in QUANTITIES},
            "reasons": reasons}


class ConditionSampler:
    """Samples the GPU's clocks, power and temperature in a background thread (see the module docstring).

    reader: a callable returning one sample (``open_reader`` picks NVML or nvidia-smi when None);
    reader=False: no sampling (a CPU run), the summary says so. clock: seconds, monotonic.
    """

    def __init__(self, reader: Callable[[], Sample] | None | bool = None, interval_s: float = 0.25,
                 clock: Callable[[], float] = time.monotonic, device_index: int = 0, source: str | None = None) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        if reader is None:
            reader, source = open_reader(device_index)
        elif reader is False:
            reader, source = None, source or "none (no GPU)"
        self.reader, self.source = reader, source or "custom"
        self.interval_s, self.clock = interval_s, clock
        self.samples: list[Sample] = []
        self.sections: list[dict] = []  # {"name", "start", "end"}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def sample_once(self) -> None:
        if self.reader is None:
            return
        t = self.clock()
        try:
            sample = dict(self.reader())
        except Exception as err:  # noqa: BLE001 - a failed read is recorded, the run goes on
            if len(self.errors) < 20:
                self.errors.append(f"{type(err).__name__}: {err}"[:200])
            return
        sample["t"] = t
        with self._lock:
            self.samples.append(sample)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)

    def start(self) -> "ConditionSampler":
        if self.reader is not None and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="gpu-conditions", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=15)
            self._thread = None

    def __enter__(self) -> "ConditionSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @contextmanager
    def section(self, name: str):
        """Mark the samples taken while the block runs as belonging to ``name`` (one sample at each end)."""
        self.sample_once()
        start = self.clock()
        try:
            yield
        finally:
            self.sample_once()
            self.sections.append({"name": name, "start": start, "end": self.clock()})

    def section_samples(self, name: str) -> list[Sample]:
        spans = [(s["start"], s["end"]) for s in self.sections if s["name"] == name]
        with self._lock:
            return [x for x in self.samples if any(a <= x["t"] <= b for a, b in spans)]

    def summary(self) -> dict:
        with self._lock:
            samples = list(self.samples)
        names = list(dict.fromkeys(s["name"] for s in self.sections))
        return {"source": self.source, "interval_s": self.interval_s, "overall": summarize(samples),
                "sections": {name: summarize(self.section_samples(name)) for name in names},
                "read_errors": self.errors}


def format_conditions(summary: dict) -> str:
    """One line per section: SM clock and power min-median-max, temperature max, limit reasons seen."""
    def line(name: str, s: dict) -> str:
        def rng(q: str, unit: str) -> str:
            v = s.get(q)
            return "-" if v is None else f"{v['min']:.0f}-{v['median']:.0f}-{v['max']:.0f} {unit}"
        temp = s.get("temp_c")
        reasons = ", ".join(f"{k} x{n}" for k, n in s.get("reasons", {}).items()) or "none"
        return (f"  {name:<28} {s['samples']:>4} samples; SM {rng('sm_mhz', 'MHz')}; power {rng('power_w', 'W')}; "
                f"temp max {'-' if temp is None else format(temp['max'], '.0f')} C; limit reasons: {reasons}")
    lines = [f"GPU conditions ({summary['source']}; min-median-max):", line("whole run", summary["overall"])]
    lines += [line(name, s) for name, s in summary["sections"].items()]
    return "\n".join(lines)


# --- the dense matmul rate probe ------------------------------------------------------------------------
def cuda_median_ms(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    """Median CUDA-event milliseconds of ``fn()`` (calls back to back) after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in events)


def matmul_probe(m: int, k: int, n: int, device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16,
                 time_ms: Callable[[Callable[[], object]], float] | None = None, label: str = "") -> dict:
    """The dense matmul rate of an (m, k) @ (k, n) product: {"shape", "ms", "tflops", "label"}.

    Random inputs (never zeros: they run faster than real data). time_ms(fn) -> ms; default CUDA events
    (median of 20 after 3 warm-ups) on a GPU, the host clock elsewhere (a CPU number means nothing)."""
    from sparsity_lab.flops import matmul_flops, tflops

    flops = matmul_flops(m, k, n)  # also checks the sizes
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(m + k + n)
    a = torch.randn(m, k, device=device, generator=gen).to(dtype)
    b = torch.randn(k, n, device=device, generator=gen).to(dtype)
    if time_ms is None:
        time_ms = cuda_median_ms if device.type == "cuda" else _host_ms
    ms = float(time_ms(lambda: a @ b))
    return {"label": label, "shape": [m, k, n], "dtype": str(dtype).replace("torch.", ""), "ms": ms,
            "tflops": tflops(flops, ms)}


def _host_ms(fn: Callable[[], object], reps: int = 3) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


# --- the rules --------------------------------------------------------------------------------------------------
def fastest_dense(candidates: dict[str, float | None]) -> tuple[str | None, float | None]:
    """(name, ms) of the fastest dense time among the measured ones ({"alone": ms, "alternation": ms, ...})."""
    measured = {k: v for k, v in candidates.items() if v is not None and v > 0}
    if not measured:
        return None, None
    name = min(measured, key=lambda k: (measured[k], k))
    return name, measured[name]


def headline(dense_candidates: dict[str, float | None], variant_ms: float | None) -> dict:
    """The headline speed-up (fastest dense ms / variant ms) and, beside it, the ratio against every
    other dense measurement: {"speedup", "dense_ms", "dense_source", "against": {name: ratio}}."""
    name, dense_ms = fastest_dense(dense_candidates)
    ok = variant_ms is not None and variant_ms > 0
    against = {k: (v / variant_ms if ok and v else None) for k, v in dense_candidates.items()}
    return {"speedup": dense_ms / variant_ms if ok and dense_ms else None, "dense_ms": dense_ms,
            "dense_source": name, "against": against}


def baseline_check(dense_tflops: float | None, probe_tflops: float | None, floor: float = BASELINE_FLOOR) -> dict:
    """{"fraction": dense / probe rate, "flagged": fraction < floor, "rule"}. Unmeasured: not flagged,
    fraction None (the figure then has no baseline check, which ``judged`` reports)."""
    if not 0 < floor <= 1:
        raise ValueError(f"floor must be in (0, 1], got {floor!r}")
    rule = f"dense baseline rate >= {floor:.0%} of the start-of-run matmul rate of the same products"
    if not dense_tflops or not probe_tflops:
        return {"fraction": None, "flagged": False, "checked": False, "rule": rule}
    fraction = dense_tflops / probe_tflops
    return {"fraction": fraction, "flagged": fraction < floor, "checked": True, "rule": rule}


def judged(measured: float | None, threshold: float, check: dict | None) -> dict:
    """A target's verdict: "met" / "missed" / "not measured", or "flagged" (the dense baseline failed
    ``baseline_check``: the figure is shown but not recorded as a result, so never "met")."""
    if measured is None:
        status = "not measured"
    elif check is not None and check.get("flagged"):
        status = "flagged"
    else:
        status = "met" if measured >= threshold else "missed"
    return {"status": status, "met": status == "met", "recorded": status in ("met", "missed")}
