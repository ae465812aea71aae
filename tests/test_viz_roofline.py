"""The roofline of notebook 08: the H100's peaks, the compressed weight's bytes, the recorded products."""
import pytest

pytest.importorskip("plotly")

from sparsity_lab.course.exercises.solutions import speedups as solution  # noqa: E402
from sparsity_lab.course.exercises.checking import FAILED, NOT_ATTEMPTED, PASSED  # noqa: E402
from sparsity_lab.course.exercises.speedups import check_intensity  # noqa: E402
from sparsity_lab.course.viz.roofline_view import (intensity, peak_tflops, product_bytes, recorded_products,  # noqa: E402
                                                   roofline_figure, roofline_ms)
from sparsity_lab.provenance import read_result  # noqa: E402


def test_h100_datasheet_peaks():
    assert peak_tflops() == pytest.approx(989.4, abs=0.1)
    assert peak_tflops(sparse=True) == pytest.approx(1978.9, abs=0.1)
    assert peak_tflops(clock_ghz=1.83 / 2) == pytest.approx(989.43 / 2, abs=0.01)
    with pytest.raises(ValueError, match="clock_ghz"):
        peak_tflops(clock_ghz=0)


def test_compressed_weight_is_nine_sixteenths_and_the_rest_is_not_halved():
    dense, sparse = product_bytes(64, 128, 32, False), product_bytes(64, 128, 32, True)
    assert sparse["weight"] * 16 == dense["weight"] * 9
    assert (sparse["dense_operand"], sparse["output"]) == (dense["dense_operand"], dense["output"])
    with pytest.raises(ValueError, match="multiple of 4"):
        product_bytes(4, 6, 4, True)


def test_fp8_operands_move_one_byte_per_value_and_the_output_stays_bf16():
    fp8 = product_bytes(64, 128, 32, True, operand_bytes=1)
    assert fp8["weight"] == 64 * 128 // 2 + 64 * 128 // 8  # half the values, 2 bits of metadata per kept one
    assert (fp8["dense_operand"], fp8["output"]) == (128 * 32, 2 * 64 * 32)
    with pytest.raises(ValueError, match="operand_bytes"):
        product_bytes(64, 128, 32, True, operand_bytes=3)


def test_large_products_are_compute_bound_so_the_roof_is_2x():
    m, k, n = 16384, 4096, 16384
    assert intensity(m, k, n, False) > peak_tflops() / 3.35  # right of the ridge point
    assert roofline_ms(m, k, n, False) / roofline_ms(m, k, n, True) == pytest.approx(2.0)
    # a product with a single token is memory-bound: the roof's gain is the bytes saved, far below 2x
    assert roofline_ms(4096, 4096, 1, False) / roofline_ms(4096, 4096, 1, True) < 1.8


def test_recorded_products_fall_short_of_their_roof():
    rows = recorded_products(read_result("cusparselt_calls_h100"))
    assert all(r["roof_speedup"] == pytest.approx(2.0) for r in rows)
    best = max(rows, key=lambda r: r["speedup"])
    assert 1.3 < best["speedup"] < 2.0 and best["sparse_of_peak"] < best["dense_of_peak"]
    fig = roofline_figure(rows)
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis.tickvals) == [1, 10, 100, 1000, 10000]


def test_intensity_exercise():
    assert check_intensity(solution.intensity, show=False).status == PASSED

    def stub(*args):
        raise NotImplementedError

    assert check_intensity(stub, show=False).status == NOT_ATTEMPTED

    def no_metadata(m, k, n, sparse):
        weight = m * k if sparse else 2 * m * k
        return 2 * m * k * n / (weight + 2 * k * n + 2 * m * n)

    def no_output(m, k, n, sparse):
        weight = (m * k // 2) * 2 + (m * k // 2) // 4 if sparse else 2 * m * k
        return 2 * m * k * n / (weight + 2 * k * n)

    for fn, why in ((no_metadata, "metadata"), (no_output, "output")):
        result = check_intensity(fn, show=False)
        assert result.status == FAILED and why in result.message


def test_sustained_load_is_the_busiest_section_with_enough_samples():
    from sparsity_lab.course.viz.roofline_view import sustained_load

    def section(samples, mhz, watts):
        return {"samples": samples, "sm_mhz": {"median": mhz}, "power_w": {"median": watts}}

    conditions = {"sections": {"baseline (end)": section(3, 1365, 690), "gpt step": section(75, 1620, 578),
                               "paired 16384x2048": section(17, 1530, 684)}}
    busy = sustained_load(conditions)  # not the 3-sample section, though its clock is the lowest
    assert busy == {"section": "paired 16384x2048", "what": "dense and 2:4 timed in turns at 16384 x 2048",
                    "samples": 17, "sm_mhz": 1530, "power_w": 684}
    assert sustained_load(conditions, min_samples=20)["what"] == "the GPT step"
    with pytest.raises(ValueError, match="100 samples"):
        sustained_load(conditions, min_samples=100)
    recorded = sustained_load(read_result("ffn_speed_h100_2026-11-24")["conditions"])
    assert recorded["samples"] >= 10 and recorded["power_w"] > 600  # the recorded run sat near its 700 W cap
