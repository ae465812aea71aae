"""``python -m benchmarks cutlass`` on the CPU: its shape list, result name and ratio rule (the timings need a
Hopper GPU)."""
import pytest

from benchmarks import cutlass_sparse as bench
from benchmarks.__main__ import main as bench_main


def test_shapes_parse_and_bad_ones_are_refused(capsys):
    assert bench.parse_shapes("16384,16384,4096;8,8,8") == [(16384, 16384, 4096), (8, 8, 8)]
    for bad in ("1,2", "1,2,0", "a,b,c"):
        with pytest.raises(ValueError):
            bench.parse_shapes(bad)
    with pytest.raises(SystemExit) as exit_:
        bench_main(["cutlass", "--shapes", "1,2"])
    assert exit_.value.code == 2


def test_the_result_is_named_after_the_gpu():
    assert bench.gpu_tag("NVIDIA H200") == "h200"
    assert bench.gpu_tag("NVIDIA H100 80GB HBM3") == "h100"
    assert bench.gpu_tag("Some GPU") == "some_gpu"


def test_each_variant_is_compared_with_the_dense_of_its_kind():
    row = {"bf16": {"cublas_bf16": {"ms": 2.0}, "cutlass_bf16[a]": {"ms": 1.0}, "cutlass_bf16[b]": {"ms": 4.0},
                    "broken": {"error": "x"}},
           "fp8": {"scaled_mm_fp8": {"ms": 1.0}, "cutlass_fp8[a]": {"ms": 0.5}}}
    bench._ratios(row)
    assert row["bf16"]["cutlass_bf16[a]"]["vs_dense_same_kind"] == 2.0
    assert row["fp8"]["cutlass_fp8[a]"]["vs_dense_same_kind"] == 2.0
    assert row["fp8"]["cutlass_fp8[a]"]["vs_cublas_bf16"] == 4.0
    assert row["best_cutlass_bf16"]["variant"] == "cutlass_bf16[a]"
    assert "vs_dense_same_kind" not in row["bf16"]["broken"]
    assert bench.tflops(1000, 1000, 1000, 1.0) == pytest.approx(2.0)
