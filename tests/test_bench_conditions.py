"""The benchmark conditions and rules (benchmarks/conditions.py) with fake readers and timers."""
import time

import pytest
import torch

from benchmarks.conditions import (BASELINE_FLOOR, ConditionSampler, baseline_check, fastest_dense,
                                                format_conditions, headline, judged, matmul_probe, parse_smi_line,
                                                summarize, throttle_names)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def fake_reader(values):
    """A reader returning the next of ``values`` (sm MHz, power W, reasons mask) per call."""
    it = iter(values)

    def read():
        sm, power, mask = next(it)
        return {"sm_mhz": sm, "mem_mhz": 2619.0, "power_w": power, "temp_c": 50.0, "reasons": throttle_names(mask)}
    return read


def test_throttle_names_decodes_the_nvml_bits():
    assert throttle_names(0) == []
    assert throttle_names(0x4) == ["sw_power_cap"]
    assert throttle_names(0x1 | 0x20) == ["gpu_idle", "sw_thermal_slowdown"]
    assert throttle_names(0x4 | 0x10000) == ["sw_power_cap", "0x10000"]
    with pytest.raises(ValueError, match="mask"):
        throttle_names(-1)


def test_parse_smi_line():
    s = parse_smi_line("1980, 2619, 612.35, 61, 0x0000000000000004\n")
    assert s == {"sm_mhz": 1980.0, "mem_mhz": 2619.0, "power_w": 612.35, "temp_c": 61.0, "reasons": ["sw_power_cap"]}
    s = parse_smi_line("1755, 2619, [N/A], 40, [N/A]")
    assert s["power_w"] is None and s["reasons"] == [] and s["sm_mhz"] == 1755.0
    with pytest.raises(ValueError, match="5 comma-separated"):
        parse_smi_line("1980, 2619")


def test_sections_collect_their_own_samples():
    clock = FakeClock()
    sampler = ConditionSampler(fake_reader([(1980, 300, 0), (1980, 320, 0), (1700, 690, 0x4), (1650, 700, 0x4),
                                            (1980, 310, 0)]), clock=clock, source="fake")
    clock.t = 1.0
    with sampler.section("dense alone"):  # samples at t=1 and t=2
        clock.t = 2.0
    clock.t = 3.0
    with sampler.section("alternation"):  # samples at t=3 and t=4
        clock.t = 4.0
    clock.t = 5.0
    sampler.sample_once()  # outside any section
    summary = sampler.summary()
    assert summary["source"] == "fake" and summary["overall"]["samples"] == 5
    alone, alt = summary["sections"]["dense alone"], summary["sections"]["alternation"]
    assert alone["samples"] == 2 and alone["sm_mhz"] == {"min": 1980, "median": 1980, "max": 1980}
    assert alt["samples"] == 2 and alt["sm_mhz"]["min"] == 1650 and alt["power_w"]["max"] == 700
    assert alt["reasons"] == {"sw_power_cap": 2} and alone["reasons"] == {}
    text = format_conditions(summary)
    assert "alternation" in text and "sw_power_cap x2" in text and "1650-1675-1700 MHz" in text


def test_a_failing_reader_is_recorded_not_raised():
    def broken():
        raise OSError("driver gone")
    sampler = ConditionSampler(broken, clock=FakeClock(), source="fake")
    sampler.sample_once()
    assert sampler.summary()["overall"]["samples"] == 0 and "driver gone" in sampler.errors[0]


def test_no_reader_means_no_samples_and_says_so():
    sampler = ConditionSampler(False)
    with sampler, sampler.section("x"):
        pass
    summary = sampler.summary()
    assert summary["overall"]["samples"] == 0 and summary["source"].startswith("none")
    assert summary["overall"]["sm_mhz"] is None


def test_the_thread_samples_until_stopped():
    reads = []

    def read():
        reads.append(1)
        return {"sm_mhz": 1.0, "mem_mhz": 1.0, "power_w": 1.0, "temp_c": 1.0, "reasons": []}
    with ConditionSampler(read, interval_s=0.005, source="fake"):
        deadline = time.monotonic() + 5
        while len(reads) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    n = len(reads)
    time.sleep(0.05)
    assert n >= 3 and len(reads) == n  # stopped: no more reads


def test_summarize_medians():
    s = summarize([{"sm_mhz": v, "power_w": None, "reasons": []} for v in (1, 5, 3)])
    assert s["sm_mhz"] == {"min": 1, "median": 3, "max": 5} and s["power_w"] is None


def test_headline_uses_the_fastest_dense_and_shows_the_other():
    h = headline({"alone": 19.2, "alternation": 21.0}, 14.0)
    assert h["dense_source"] == "alone" and h["dense_ms"] == 19.2
    assert h["speedup"] == pytest.approx(19.2 / 14.0)
    assert h["against"] == pytest.approx({"alone": 19.2 / 14.0, "alternation": 21.0 / 14.0})
    # whichever is faster: here dense in alternation
    assert headline({"alone": 20.0, "alternation": 19.0}, 10.0)["dense_source"] == "alternation"
    # an unmeasured dense time is skipped; nothing measured gives no ratio
    h = headline({"alone": None, "alternation": 19.0}, 10.0)
    assert h["speedup"] == pytest.approx(1.9) and h["against"]["alone"] is None
    assert headline({"alone": None}, 10.0)["speedup"] is None
    assert headline({"alone": 19.0}, None)["speedup"] is None
    assert fastest_dense({}) == (None, None)


def test_baseline_check_flags_below_the_floor():
    assert BASELINE_FLOOR == 0.90
    ok = baseline_check(680.0, 720.0)
    assert ok["checked"] and not ok["flagged"] and ok["fraction"] == pytest.approx(680 / 720)
    slow = baseline_check(625.0, 720.0)  # 0.868
    assert slow["flagged"]
    assert not baseline_check(648.0, 720.0)["flagged"]  # exactly 90 %: not flagged
    none = baseline_check(None, 720.0)
    assert not none["checked"] and not none["flagged"] and none["fraction"] is None
    with pytest.raises(ValueError, match="floor"):
        baseline_check(1.0, 1.0, floor=0)


def test_a_flagged_baseline_is_never_met():
    assert judged(1.5, 1.4, {"flagged": False}) == {"status": "met", "met": True, "recorded": True}
    assert judged(1.3, 1.4, {"flagged": False})["status"] == "missed"
    flagged = judged(1.5, 1.4, {"flagged": True})
    assert flagged == {"status": "flagged", "met": False, "recorded": False}
    assert judged(None, 1.4, None)["status"] == "not measured"


def test_matmul_probe_with_a_fake_timer():
    probe = matmul_probe(64, 32, 16, device="cpu", dtype=torch.float32, time_ms=lambda fn: (fn(), 0.5)[1], label="x")
    assert probe["shape"] == [64, 32, 16] and probe["ms"] == 0.5 and probe["label"] == "x"
    assert probe["tflops"] == pytest.approx(2 * 64 * 32 * 16 / 0.5e-3 / 1e12)
    with pytest.raises(ValueError, match="m"):
        matmul_probe(0, 1, 1, device="cpu")
