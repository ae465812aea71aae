"""The CUTLASS benchmarks on the CPU: ``python -m benchmarks cutlass`` (its shape list, result name and ratio rule)
and the CUTLASS variant of the FP8 training benchmark's FFN section (reported beside cuSPARSELt's FP8 2:4 step, or
skipped with the reason). The timings need a Hopper GPU."""
import pytest
import torch

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


def test_the_fp8_ffn_section_reports_cutlass_beside_cusparselt_against_each_dense():
    from benchmarks.fp8_training import FFN_VARIANTS, SPARSE_BACKENDS, dense_ratios, ratio_lines
    assert "fp8_24_cutlass" in FFN_VARIANTS and SPARSE_BACKENDS["fp8_24_cutlass"] == "cutlass_fp8"
    variants = {"bf16_dense": {"ms": 20.0, "tflops": 660.0}, "fp8_dense": {"ms": 12.0, "tflops": 1100.0},
                "fp8_24": {"ms": 10.0, "tflops": 1320.0}, "fp8_24_cutlass": {"ms": 9.6, "tflops": 1375.0}}
    ratios = dense_ratios(variants)
    assert set(ratios) == {"fp8_24", "fp8_24_cutlass"}
    assert ratios["fp8_24_cutlass"]["fp8_dense"] == {"speedup": 1.25, "dense_ms": 12.0, "dense_tflops": 1100.0}
    assert ratios["fp8_24_cutlass"]["bf16_dense"]["speedup"] == pytest.approx(20.0 / 9.6)
    assert ratio_lines(variants)[1].startswith("fp8_24_cutlass: 9.600 ms (1375 TFLOP/s dense-equivalent); x1.25 vs "
                                               "fp8_dense (12.000 ms, 1100 TFLOP/s)")
    del variants["fp8_24_cutlass"]  # not built here: its line says why instead
    lines = ratio_lines(variants, {"fp8_24_cutlass": "backend 'cutlass_fp8' cannot run here: missing nvcc"})
    assert lines[0] == "fp8_24_cutlass: skipped: backend 'cutlass_fp8' cannot run here: missing nvcc"
    assert lines[1].startswith("fp8_24: 10.000 ms") and len(lines) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only reason")
def test_without_a_gpu_the_fp8_ffn_section_skips_cutlass_with_the_reason():
    from benchmarks.fp8_training import unavailable_variants
    found = unavailable_variants(("bf16_dense", "fp8_dense", "fp8_24_cutlass"))
    assert set(found) == {"fp8_24_cutlass"} and "no CUDA GPU" in found["fp8_24_cutlass"]
    assert "'cusparselt_fp8'" in found["fp8_24_cutlass"]  # and what to use instead


def test_a_failed_candidate_is_reported_by_its_compiler_error():
    from benchmarks.cutlass_sparse import compile_error_line

    stderr = ('k.cu(231): error: static assertion failed with "every variant must read the operand layout"\n'
              '  static_assert(x,\n\n1 error detected in the compilation of "k.cu".\n')
    assert compile_error_line(stderr).startswith("k.cu(231): error: static assertion failed")
    assert compile_error_line("ld: something odd\n") == "ld: something odd"
    assert compile_error_line("") == "no compiler output"
