"""The FP8 FFN profile's kinds: kernel names as torch.profiler reports them, put where a reader expects."""
import pytest

from benchmarks.fp8_ffn_profile import ORDER, kind_of, summarize, table

NAMES = {
    "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, "
    "cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm90TmaGmmaWarpSpecializedSparse<4, 2, 1>, "
    "cutlass::float_e4m3_t>>>": "sparse products",
    "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1": "dense products",
    "nvjet_sm90_qqtst_256x128_64x4_2x1_v_bz_coopA_TNT": "dense products",
    "_refresh24_cutlass_kernel": "2:4 work",
    "_mvue_compress24_cutlass_kernel": "2:4 work",
    "_cast_transpose_kernel": "FP8 casts and amax",
    "_quantize_kernel": "FP8 casts and amax",
    "_amax_kernel": "FP8 casts and amax",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
    "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}>": "activation (GELU forward and backward)",
    "_scale_kernel": "scale pass",
    "void at::native::elementwise_kernel<128, 2, at::native::direct_copy_kernel_cuda>": "other elementwise and copies",
    "Memset (Device)": "other",
}


@pytest.mark.parametrize("name,kind", NAMES.items())
def test_kind_of_known_kernels(name, kind):
    assert kind_of(name) == kind


def test_kind_of_refuses_a_non_str():
    with pytest.raises(TypeError, match="name must be a str"):
        kind_of(3)


def test_summarize_sums_each_kind_and_ranks():
    rows = [("_amax_kernel", 0.25, 4.0), ("_refresh24_cutlass_kernel", 0.5, 2.0), ("_quantize_kernel", 0.125, 2.0)]
    out = summarize(rows, top=2)
    assert set(out["kinds_ms"]) == set(ORDER)
    assert out["kinds_ms"]["FP8 casts and amax"] == pytest.approx(0.375)
    assert out["kinds_ms"]["2:4 work"] == pytest.approx(0.5)
    assert out["kernels_ms"] == pytest.approx(0.875)
    assert [r["kernel"] for r in out["top"]] == ["_refresh24_cutlass_kernel", "_amax_kernel"]


def test_table_has_a_column_per_variant_and_a_row_per_kind():
    one = {"wall_ms": 2.0, **summarize([("_amax_kernel", 1.0, 1.0)])}
    two = {"wall_ms": 3.0, **summarize([("_scale_kernel", 1.5, 1.0), ("sm90_xmma_sparse_gemm_e4m3", 0.5, 1.0)])}
    text = table({"variants": {"fp8_dense": one, "fp8_24_cutlass": two}})
    lines = text.splitlines()
    assert "fp8_dense" in lines[0] and "fp8_24_cutlass" in lines[0]
    assert len(lines) == 1 + len(ORDER) + 2 + 1  # and the 2:4 variant's ceiling
    assert lines[len(ORDER) + 2].split()[-2:] == ["2.000", "3.000"]


def test_ceilings_keep_everything_but_the_products():
    from benchmarks.fp8_ffn_profile import ceilings
    dense = {"wall_ms": 11.0, **summarize([("nvjet_sm90_qqtst_x", 8.0, 6.0), ("_quantize_kernel", 2.0, 4.0)])}
    sparse = {"wall_ms": 9.0, **summarize([("sm90_xmma_sparse_gemm_e4m3", 5.0, 6.0), ("_quantize_kernel", 2.5, 4.0)])}
    bf16 = {"wall_ms": 20.0, **summarize([("nvjet_sm90_tst_x", 18.0, 6.0)])}  # a dense baseline: no ceiling
    profiled = {"variants": {"fp8_dense": dense, "fp8_24_cutlass": sparse, "bf16_dense": bf16},
                "skipped": {"fp8_24": "a test's reason"}}
    assert ceilings(profiled) == {"fp8_24_cutlass": pytest.approx(10.0 / 7.0)}  # 10 / (10 - 8 + 5)
    assert ceilings({"variants": {"fp8_24_cutlass": sparse}}) == {}
    lines = table(profiled).splitlines()
    assert lines[-2:] == ["fp8_24_cutlass: kernels 1.33x fp8_dense's, ceiling of its products 1.43x",
                          "fp8_24: skipped: a test's reason"]


def test_table_puts_the_replayed_profile_under_the_eager_one():
    from benchmarks.fp8_ffn_profile import table
    kinds = {"sparse products": 0.0, "dense products": 8.0, "2:4 work": 0.0, "FP8 casts and amax": 1.0,
             "activation (GELU forward and backward)": 0.5, "scale pass": 0.0, "other elementwise and copies": 0.4,
             "other": 0.1}
    row = {"kinds_ms": kinds, "kernels_ms": 10.0, "wall_ms": 10.5}
    lines = table({"variants": {"fp8_dense": row}, "graphed": {"fp8_dense": {**row, "wall_ms": 12.25}}}).splitlines()
    at = lines.index("graph-replayed:")
    assert lines[at - 1].startswith("eager wall (no profiler)") and lines[at - 1].split()[-1] == "10.500"
    assert lines[-1].startswith("replayed wall (no profiler)") and lines[-1].split()[-1] == "12.250"
    only_graphed = table({"variants": {}, "graphed": {"fp8_dense": row}}).splitlines()
    assert only_graphed[0] == "graph-replayed:"


def test_fp8_training_refuses_an_unknown_section_naming_the_choices(capsys):
    from benchmarks.fp8_training import main
    with pytest.raises(SystemExit) as err:
        main(["--sections", "ffn,ffn_profil"])
    assert err.value.code == 2
    message = capsys.readouterr().err
    assert "--sections: each must be one of" in message and "ffn_profile" in message and "'ffn,ffn_profil'" in message


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the message of a machine without a GPU")
def test_fp8_training_without_a_gpu_says_so(capsys):
    from benchmarks.fp8_training import main
    with pytest.raises(SystemExit) as err:
        main(["--sections", "ffn_profile"])
    assert err.value.code == 2 and "on a CUDA GPU" in capsys.readouterr().err
