"""The clocks benchmark's parsing and summary (CPU), and its refusal without a GPU."""
import pytest
import torch

from benchmarks import fp8_ffn_clocks as clocks


def test_samples_parse_and_bad_lines_are_dropped():
    lines = ["1980, 3201, 612.35, 0x0000000000000000", "1755, 3201, 699.80, 0x0000000000000004",
             "1740, 3201, [N/A], 0x4", "1700, 3201"]
    samples = clocks.parse_samples(lines)
    assert samples == [{"sm_mhz": 1980.0, "mem_mhz": 3201.0, "power_w": 612.35, "reasons": 0},
                       {"sm_mhz": 1755.0, "mem_mhz": 3201.0, "power_w": 699.8, "reasons": 4}]


def test_summary_gives_medians_and_the_share_of_each_reason():
    samples = [{"sm_mhz": f, "mem_mhz": 3201.0, "power_w": w, "reasons": r}
               for f, w, r in [(1980, 600, 0x0), (1800, 700, 0x4), (1700, 700, 0x4 | 0x20), (1750, 690, 0x4)]]
    out = clocks.summarize(samples)
    assert out["samples"] == 4 and out["sm_mhz"] == 1775 and out["power_w"] == 695
    assert out["reasons"] == {"power cap": 0.75, "software thermal slowdown": 0.25}
    assert clocks.summarize([]) == {"samples": 0}


def test_bad_options_are_refused_and_no_gpu_is_said():
    import argparse
    p = argparse.ArgumentParser()
    clocks.add_arguments(p)
    for bad in (["--variants", "fp8_sparse"], ["--seconds", "0.1"], ["--seconds", "nan"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)
    args = p.parse_args(["--variants", "fp8_dense", "--seconds", "1"])
    assert args.variants == ("fp8_dense",) and args.seconds == 1.0
    if not torch.cuda.is_available():
        assert clocks.run(args) == 2
