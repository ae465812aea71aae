"""``python -m benchmarks step-profile``: the kernel classifier, the ceiling arithmetic, and the whole run on the CPU."""
import json
import warnings

import pytest

from benchmarks.__main__ import main as bench_main
from benchmarks.step_categories import CATEGORIES, breakdown, classify
from benchmarks.step_ceiling import BLOCK_LINEARS, HEAD, PRODUCTS, amdahl, attribution, closeness, linear_shapes
from benchmarks.step_profile import format_tables, gpu_tag, parse_mode, summarize

# names seen on the H100 (results/*profile*_h100.txt) and in PyTorch's and the project's kernels
SAMPLES = {
    "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NTT": "dense_gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
    "__5x_cublas": "dense_gemm",
    "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn": "dense_gemm",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(Params)": "dense_gemm",
    "void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float>(cublasSplitKParams<float>)": "dense_gemm",
    "triton_tem_fused_mm_3": "dense_gemm",
    "aten::mm": "dense_gemm",
    "sm90_xmma_sparse_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cgasize2x1x1_warpgroupsize2x": "sparse_gemm",
    "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x64_stage3_warpsize2x2x1_sptensor16x8x64_kernel": "sparse_gemm",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
    "cutlass::bfloat16_t>>(Flash_fwd_params)": "attention",
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>": "attention",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0": "attention",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)": "attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
    "(at::native::ADAM_MODE)1, false>, ...>": "optimizer",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "TensorListMetadata<2>, at::native::(anonymous namespace)::CopyFunctor<...>>": "optimizer",
    "aten::_fused_adamw_": "optimizer",
    "aten::_foreach_copy_": "optimizer",
    "_transposable24_kernel": "two4_work",
    "_transpose_kernel": "two4_work",
    "_count_flips_kernel": "two4_work",
    "_refresh24_kernel": "two4_work",
    "_refresh24_cutlass_kernel": "two4_work",
    "_soft_threshold24_kernel": "two4_work",
    "_prepare24_kernel": "two4_work",
    "_compress24_kernel": "two4_work",
    "_mvue_compress24_kernel": "two4_work",
    "_mvue_compress24_cutlass_kernel": "two4_work",
    "_prepare24_cutlass_kernel": "two4_work",
    "_mvue24_strided_tile16_kernel": "two4_work",
    "_masked_decay_kernel": "two4_work",
    "void cusparseLt::compress_kernel<...>": "two4_work",
    # CUTLASS's SM90 sparse GEMM and compressor (the "cutlass" backends), as an H200 profile named them (cut at 160)
    '_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEENS1_10collective13Col'
    'lectiveMmaINS1_40MainloopSm90TmaGmmaWarpSpecializedSparseILi': "sparse_gemm",
    'void cutlass::device_kernel<cutlass::transform::kernel::SM90StructuredSparseCompressor<cute::tuple<i'
    'nt, int, int, int>, cutlass::float_e4m3_t, cutlass::layout::': "two4_work",
    "_prepare24_cutlass_kernel": "two4_work",
    "void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)"
    "::{lambda()#1}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, ...)": "norm_cast_elementwise",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(...)": "norm_cast_elementwise",
    "void at::native::vectorized_elementwise_kernel<8, at::native::GeluBackwardCUDAKernelImpl(...)": "norm_cast_elementwise",
    "triton_per_fused__to_copy_native_layer_norm_0": "norm_cast_elementwise",
    "triton_poi_fused_add_gelu_1": "norm_cast_elementwise",
    "_cast_transpose_kernel": "norm_cast_elementwise",  # FP8's cast, not the mask's transpose
    "_relu2_fwd_kernel": "norm_cast_elementwise",
    "aten::native_layer_norm": "norm_cast_elementwise",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, ...>": "other",
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>": "other",
    "Memcpy DtoD (Device -> Device)": "other",
    "Memset (Device)": "other",
    "Activity Buffer Request": "other",
}


@pytest.mark.parametrize("name", list(SAMPLES), ids=lambda n: n[:40])
def test_classify_sample_kernel_names(name):
    assert classify(name) == SAMPLES[name]


def test_breakdown_sums_per_category_with_every_category_present():
    parts = breakdown([("nvjet_x", 2.0), ("aten::mm", 1.0), ("_prepare24_kernel", 0.5), ("Memset (Device)", 0.25)])
    assert set(parts) == set(CATEGORIES)
    assert parts["dense_gemm"] == 3.0 and parts["two4_work"] == 0.5 and parts["other"] == 0.25
    assert parts["attention"] == 0.0
    with pytest.raises(TypeError, match="name must be a str"):
        classify(None)


def _table(dense: dict, speedup: float) -> dict:
    """A product table: per kind, every product ``dense[kind]`` ms dense and ``dense / speedup`` sparse."""
    return {kind: {p: {"dense_ms": ms, "sparse_ms": ms / speedup} for p in PRODUCTS} for kind, ms in dense.items()}


def test_the_ceiling_of_the_outside_profile():
    """The published step (dense 163-169 ms, 103-111 ms of dense GEMMs, products at 1.45x): about 1.15x with the FFN
    linears 2:4 and 1.24x with every block linear, the FFN holding 2/3 of the blocks' product time."""
    # FLOP-proportional product times at d=4096, h=4d: qkv 3d^2, proj d^2, fc 4d^2, mlp.proj 4d^2; head ~0
    table = _table({"attn.qkv": 3.0, "attn.proj": 1.0, "mlp.fc": 4.0, "mlp.proj": 4.0, HEAD: 1e-9}, 1.45)
    ffn, every = attribution(table, "ffn", n_layer=8), attribution(table, "all_linears", n_layer=8)
    assert ffn["share"] == pytest.approx(2 / 3) and every["share"] == pytest.approx(1.0)
    assert ffn["product_speedup"] == pytest.approx(1.45)
    c_ffn = amdahl(166.0, 105.0, ffn["share"], ffn["product_speedup"])
    c_all = amdahl(166.0, 105.0, every["share"], every["product_speedup"])
    made_sparse = 105.0 * 2 / 3
    assert c_ffn["gemm_ms_made_sparse"] == pytest.approx(made_sparse)
    assert c_ffn["ceiling_ms"] == pytest.approx(166.0 - made_sparse + made_sparse / 1.45)
    assert c_ffn["ceiling_speedup"] == pytest.approx(1.15, abs=0.01)
    assert c_all["ceiling_speedup"] == pytest.approx(1.24, abs=0.01)
    assert closeness(1.10, c_ffn["ceiling_speedup"]) == pytest.approx(1.10 / c_ffn["ceiling_speedup"])
    assert closeness(None, 1.2) is None


def test_attribution_counts_each_block_n_layer_times_and_the_head_once():
    table = _table({"attn.qkv": 1.0, "attn.proj": 1.0, "mlp.fc": 1.0, "mlp.proj": 1.0, HEAD: 3.0}, 2.0)
    table["mlp.fc"]["grad_weight"]["sparse_ms"] = 1.0  # this product no faster
    a = attribution(table, "ffn", n_layer=2)
    assert a["dense_ms_selected"] == pytest.approx(2 * 6.0)  # 2 kinds x 3 products x 2 layers
    assert a["dense_ms_all_linears"] == pytest.approx(2 * 12.0 + 9.0)
    assert a["sparse_ms_selected"] == pytest.approx(2 * (5 * 0.5 + 1.0))
    assert a["share"] == pytest.approx(12.0 / 33.0)
    assert a["product_speedup"] == pytest.approx(12.0 / 7.0)


def test_ceiling_inputs_are_checked():
    table = _table({k: 1.0 for k in (*BLOCK_LINEARS, HEAD)}, 1.5)
    with pytest.raises(ValueError, match="selection"):
        attribution(table, "attention", 8)
    table["mlp.proj"]["forward"]["sparse_ms"] = None
    with pytest.raises(ValueError, match="mlp.proj forward sparse_ms"):
        attribution(table, "ffn", 8)
    with pytest.raises(ValueError, match="share"):
        amdahl(100.0, 50.0, 1.5, 1.4)
    with pytest.raises(ValueError, match="dense_gemm_ms"):
        amdahl(100.0, 150.0, 0.5, 1.4)
    with pytest.raises(ValueError, match="product_speedup"):
        amdahl(100.0, 50.0, 0.5, 0.0)


def test_linear_shapes_of_the_lab_gpt():
    shapes = linear_shapes(4096, 16384, 256)
    assert shapes == {"attn.qkv": (12288, 4096), "attn.proj": (4096, 4096), "mlp.fc": (16384, 4096),
                      "mlp.proj": (4096, 16384), HEAD: (256, 4096)}


def _record(mode, config, select, ms, gemm, two4=0.0):
    parts = dict.fromkeys(CATEGORIES, 0.0)
    parts.update(dense_gemm=gemm, two4_work=two4)
    r = {"mode": mode, "config": config, "select": select, "ms": ms, "tokens_per_s": 8192 / ms * 1e3,
         "breakdown_ms": parts, "idle_ms": 0.0, "loss_first": 5.0, "loss_last": 4.0, "flip_rate_timed": None}
    if select:
        r["two4_work_share"] = two4 / ms
    return r


def test_summarize_uses_the_fastest_dense_for_the_headline_and_the_same_mode_for_the_ceiling():
    table = _table({"attn.qkv": 3.0, "attn.proj": 1.0, "mlp.fc": 4.0, "mlp.proj": 4.0, HEAD: 1e-9}, 1.45)
    records = [_record("baseline", "dense", None, 165.0, 107.0), _record("baseline", "ffn24", "ffn", 150.0, 40.0, 5.0),
               _record("bf16w", "dense", None, 150.0, 107.0), _record("bf16w", "ffn24", "ffn", 130.0, 40.0, 3.0),
               {"mode": "bf16w", "config": "all24", "select": "all_linears", "error": "boom"}]
    s = summarize(records, table, n_layer=8, flops_per_step=1e15, linear_flops_per_step=8e14, probe_tflops=800.0)
    assert s["fastest_dense"] == "bf16w"
    base = s["runs"]["baseline ffn24"]
    assert base["speedup_vs_fastest_dense"] == pytest.approx(150.0 / 150.0)
    assert base["speedup_vs_dense_same_mode"] == pytest.approx(165.0 / 150.0)
    expected = amdahl(165.0, 107.0, 2 / 3, 1.45)["ceiling_speedup"]
    assert base["ceiling"]["ceiling_speedup"] == pytest.approx(expected)
    assert base["measured_over_ceiling"] == pytest.approx((165.0 / 150.0) / expected)
    assert s["runs"]["bf16w ffn24"]["ceiling"]["ceiling_speedup"] == pytest.approx(
        amdahl(150.0, 107.0, 2 / 3, 1.45)["ceiling_speedup"])
    assert "bf16w all24" not in s["runs"]  # a failed run has no figures
    mode = s["modes"]["baseline"]
    assert mode["dense_tflops"] == pytest.approx(1e15 / 0.165 / 1e12)
    assert mode["dense_gemm_tflops"] == pytest.approx(8e14 / 0.107 / 1e12)
    assert mode["baseline_check"]["checked"]
    no_products = summarize(records, None, 8, 1e15, 8e14, None)["runs"]["baseline ffn24"]
    assert "not measured" in no_products["ceiling_error"]
    # every run against every mode's dense step of the same run (an FP8 2:4 step against bf16 dense, say)
    assert base["speedup_vs_dense"] == {"baseline": pytest.approx(165.0 / 150.0), "bf16w": pytest.approx(1.0)}
    text = format_tables(records, s)
    assert "| Amdahl ceiling |" in text and "error" in text and "2:4 work" in text
    assert "| speed-up vs dense bf16w (6667 TFLOP/s) | - | 1.000x |" in text
    assert "| speed-up vs dense baseline (6061 TFLOP/s) | - | 1.269x | error |" in text


def test_the_fp8_mode_takes_its_ceiling_from_the_fp8_product_table():
    """An fp8 run's ceiling uses the FP8 products' speed-ups (not the bf16 table's); without that table it
    says so, and the bf16 runs are unchanged."""
    bf16 = _table({"attn.qkv": 3.0, "attn.proj": 1.0, "mlp.fc": 4.0, "mlp.proj": 4.0, HEAD: 1e-9}, 1.45)
    fp8 = _table({"attn.qkv": 1.5, "attn.proj": 0.5, "mlp.fc": 2.0, "mlp.proj": 2.0, HEAD: 1e-9}, 1.3)
    records = [_record("bf16w", "dense", None, 150.0, 107.0), _record("bf16w", "ffn24", "ffn", 130.0, 40.0, 3.0),
               {**_record("bf16w+fp8", "dense", None, 130.0, 57.0), "options": ("bf16w", "fp8")},
               {**_record("bf16w+fp8", "ffn24", "ffn", 115.0, 20.0, 5.0), "options": ("bf16w", "fp8")}]
    s = summarize(records, bf16, 8, 1e15, 8e14, None, fp8)
    assert s["runs"]["bf16w+fp8 ffn24"]["ceiling"]["ceiling_speedup"] == pytest.approx(
        amdahl(130.0, 57.0, 2 / 3, 1.3)["ceiling_speedup"])
    assert s["runs"]["bf16w ffn24"]["ceiling"]["ceiling_speedup"] == pytest.approx(
        amdahl(150.0, 107.0, 2 / 3, 1.45)["ceiling_speedup"])
    without = summarize(records, bf16, 8, 1e15, 8e14, None)["runs"]["bf16w+fp8 ffn24"]
    assert "FP8 product table was not measured" in without["ceiling_error"] and "ceiling" not in without


def test_the_fp8_product_table_refuses_a_backend_without_scales_in_its_product():
    from benchmarks.step_products_fp8 import measure_fp8_products
    with pytest.raises(ValueError, match="host alpha"):
        measure_fp8_products({}, 8192, "cusparselt_fp8", None, lambda o, i: {})


def test_modes_and_gpu_names():
    assert parse_mode("baseline") == frozenset()
    assert parse_mode("bf16w+compile") == {"bf16w", "compile"}
    assert parse_mode("bf16w+unfused") == {"bf16w", "unfused"}
    assert parse_mode("bf16w+fp8") == {"bf16w", "fp8"}
    assert parse_mode("bf16w+fp8+graph+masks_in_graph") == {"bf16w", "fp8", "graph", "masks_in_graph"}
    for bad in ("fast", "bf16w+bf16w", "compile+graph", "unfused", "unfused+compile", "fp8", "bf16w+fp8+compile",
                "bf16w+masks_in_graph"):
        with pytest.raises(ValueError, match="--modes"):
            parse_mode(bad)
    assert gpu_tag("NVIDIA H100 80GB HBM3") == "h100" and gpu_tag("NVIDIA H200") == "h200"
    assert gpu_tag("NVIDIA A100-SXM4-80GB") == "a100" and gpu_tag(None) == "gpu"


def test_smoke_run_of_the_unfused_master_update(tmp_path):
    status = bench_main(["step-profile", "--smoke", "--modes", "bf16w+unfused", "--configs", "dense",
                         "--out-dir", str(tmp_path), "--name", "unfused"])
    assert status == 0
    (record,) = json.loads((tmp_path / "unfused.json").read_text())["records"]
    assert "error" not in record, record.get("traceback")
    assert record["master_update"] == "copies" and record["options"] == ["bf16w", "unfused"]


def test_bad_arguments_name_the_flag(tmp_path, capsys):
    """Refused while the command line is read (usage, the message, exit status 2), before any work."""
    for flag, value in (("--modes", "turbo"), ("--configs", "dense,ffn48"), ("--refresh-interval", "1")):
        with pytest.raises(SystemExit) as exit_:
            bench_main(["step-profile", "--smoke", flag, value, "--out-dir", str(tmp_path)])
        assert exit_.value.code == 2 and flag in capsys.readouterr().err


def test_smoke_run_writes_every_run_with_its_profile_and_ceiling(tmp_path, capsys):
    # the FFN and the all-linears selections, a refresh interval, bf16 weights with compile, and the graph mode
    # (no GPU: its errors recorded); the other configurations are the same code with other arguments
    status = bench_main(["step-profile", "--smoke", "--modes", "baseline,bf16w+compile,graph",
                         "--configs", "ffn24,all24_r2", "--refresh-interval", "2", "--out-dir", str(tmp_path)])
    assert status == 0
    result = json.loads((tmp_path / "step_profile_smoke.json").read_text())
    assert result["smoke"] and "provenance" in result and result["matmul_probe"]["end"]["tflops"] > 0
    assert result["configs"] == ["dense", "ffn24", "all24_r2"]  # dense first, always
    for kind in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj", HEAD):
        assert all(result["products"][kind][p]["dense_ms"] > 0 for p in PRODUCTS)
    runs = {(r["mode"], r["config"]): r for r in result["records"]}
    assert len(runs) == 9
    for mode in ("baseline", "bf16w+compile"):
        for config in result["configs"]:
            r = runs[(mode, config)]
            assert "error" not in r, r.get("traceback")
            assert r["ms"] > 0 and r["tokens_per_s"] > 0 and len(r["loss_timed"]) == 2
            assert set(r["breakdown_ms"]) == set(CATEGORIES) and r["kernel_ms"] > 0
            if config == "dense":
                assert r["flip_rate_timed"] is None and "two4_work_share" not in r
            else:
                assert r["two4_work_share"] >= 0 and r["mask_computations_timed"] > 0
                assert r["flip_rate_timed"] is not None
        assert runs[(mode, "all24_r2")]["timing"].startswith("mean over whole cycles of 2")
        assert runs[(mode, "all24_r2")]["profiled_steps"] == 2 and runs[(mode, "ffn24")]["profiled_steps"] == 1
    assert runs[("bf16w+compile", "dense")]["options"] == ["bf16w", "compile"]
    # bf16 weights take the fused master update (here through the interpreter), dense and 2:4 alike
    assert {runs[("bf16w+compile", c)]["master_update"] for c in result["configs"]} == {"fused"}
    assert runs[("baseline", "dense")]["master_update"] is None
    assert "CUDA GPU" in runs[("graph", "ffn24")]["error"]  # recorded, the run went on
    summary = result["summary"]
    assert summary["fastest_dense"] in ("baseline", "bf16w+compile")
    for mode in ("baseline", "bf16w+compile"):
        for config in ("ffn24", "all24_r2"):
            run = summary["runs"][f"{mode} {config}"]
            assert run["speedup_vs_dense_same_mode"] > 0 and run["ceiling"]["ceiling_speedup"] > 0, run
            assert run["measured_over_ceiling"] == pytest.approx(
                run["speedup_vs_dense_same_mode"] / run["ceiling"]["ceiling_speedup"])
    assert "graph ffn24" in result["errors"]
    out = capsys.readouterr().out
    assert "mode baseline" in out and "| measured / ceiling |" in out and "wrote" in out


def test_the_fp8_mode_swaps_every_block_linear_and_refuses_the_cpu(tmp_path):
    """Dense FP8 on every block linear (the LM head stays bf16); without a GPU the run records why."""
    from benchmarks.step_profile import _fp8_dense_block_linears
    from sparsity_lab.lab.model import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=256, context=32, n_layer=2, n_head=2, d_model=64))
    with warnings.catch_warnings():  # without a GPU the recipe runs in float32 arithmetic, said once per process
        warnings.simplefilter("ignore", UserWarning)
        swapped = _fp8_dense_block_linears(model)
    names = sorted(n for n, m in model.named_modules() if any(m is s for s in swapped))
    assert names == sorted(f"blocks.{i}.{k}" for i in range(2) for k in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"))
    assert type(model.lm_head).__name__ == "Linear"
    status = bench_main(["step-profile", "--smoke", "--modes", "bf16w+fp8", "--configs", "dense", "--out-dir", str(tmp_path),
                         "--name", "fp8"])
    assert status == 0
    (record,) = json.loads((tmp_path / "fp8.json").read_text())["records"]
    assert "fp8 mode needs a CUDA GPU" in record["error"]


def test_fp8_backend_is_checked_and_recorded(tmp_path, capsys):
    """--fp8-backend names where the fp8 mode's 2:4 products run; another name is refused by the parser."""
    with pytest.raises(SystemExit):
        bench_main(["step-profile", "--smoke", "--fp8-backend", "cusparselt", "--out-dir", str(tmp_path)])
    assert "--fp8-backend" in capsys.readouterr().err
    status = bench_main(["step-profile", "--smoke", "--modes", "bf16w", "--configs", "dense", "--fp8-backend",
                         "cutlass_fp8", "--out-dir", str(tmp_path), "--name", "fp8b"])
    assert status == 0
    assert json.loads((tmp_path / "fp8b.json").read_text())["fp8_backend"] == "cutlass_fp8"
