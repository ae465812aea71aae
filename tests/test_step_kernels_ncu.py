"""benchmarks.step_kernels_ncu: reading Nsight Compute's text report (CPU; the report is ncu's own layout)."""
import pytest

from benchmarks.step_kernels_ncu import parse_report

REPORT = """==PROF== Profiling "_prepare24_kernel": 0%....50%....100% - 17 passes
  _prepare24_kernel (256, 64, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    SM Frequency                    Ghz         1.49
    Elapsed Cycles                cycle      309,107
    DRAM Throughput                   %        33.89
    Duration                         us       206.34
    Compute (SM) Throughput           %        91.59
    Section: Launch Statistics
    Registers Per Thread             register/thread              79
    Dynamic Shared Memory Per Block       Kbyte/block            8.19
    Theoretical Occupancy                     %        37.50
    Achieved Occupancy                        %        36.17
  _refresh24_kernel (256, 64, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    DRAM Throughput                   %        27.78
    Compute (SM) Throughput           %        85.51
"""


def test_each_kernels_figures_are_read():
    k = parse_report(REPORT)
    assert set(k) == {"_prepare24_kernel", "_refresh24_kernel"}
    p = k["_prepare24_kernel"]
    assert p["grid"] == [256, 64, 1] and p["block"] == [128, 1, 1]
    assert p["dram_throughput_pct"] == 33.89 and p["sm_throughput_pct"] == 91.59 and p["duration_us"] == 206.34
    assert p["registers_per_thread"] == 79 and p["dynamic_shared_kib_per_block"] == 8.19
    assert p["theoretical_occupancy_pct"] == 37.5 and p["achieved_occupancy_pct"] == 36.17 and p["sm_ghz"] == 1.49
    assert "elapsed_cycles" not in p and k["_refresh24_kernel"]["sm_throughput_pct"] == 85.51


def test_a_file_that_is_not_a_report_is_refused():
    with pytest.raises(ValueError, match="no kernel section"):
        parse_report("hello\nworld\n")
