"""The profiling scripts' arithmetic: kernel time per step, largest first, and the printed lines."""
from types import SimpleNamespace

import pytest

from benchmarks.kernel_profile import Kernel, kernel_lines, summarize


def test_summarize_divides_by_the_steps_and_sorts_largest_first():
    events = [SimpleNamespace(self_device_time_total=500.0, count=10, key="small"),
              SimpleNamespace(self_device_time_total=13_515.0, count=20, key="sparse_gemm"),
              SimpleNamespace(self_device_time_total=0.0, count=5, key="cudaLaunch")]
    total, kernels = summarize(events, steps=5)
    assert total == pytest.approx((500 + 13_515) / 5 / 1e3)
    assert kernels[0] == Kernel(pytest.approx(2.703), 4, "sparse_gemm") and kernels[-1].name == "cudaLaunch"
    assert kernel_lines(kernels, top=2, width=6) == ["     2.703 ms  x4   sparse", "     0.100 ms  x2   small"]
    with pytest.raises(ValueError, match="steps"):
        summarize(events, steps=0)
