"""The direct cuSPARSELt binding (``backends/cusparselt/direct.py``).

CPU: the operand checks, and the descriptors each layout gets, against a stand-in library that
records the calls (the contract of ``cusparselt_ops``: PyTorch's descriptors). GPU (marker ``gpu``):
the real library, bytes equal to ``torch._cslt_sparse_mm`` with the same algorithm, against a
float32 dense product, with a bias, inside a CUDA graph, and the misaligned-pointer fallback.
"""
from __future__ import annotations

import ctypes
import warnings

import pytest
import torch

from benchmarks.__main__ import main as bench_main
from sparsity_lab.backends.cusparselt import direct
from sparsity_lab.backends.cusparselt.ops import AlgConfig, CusparseltUnavailable, TorchCusparseltOps


# --- operand checks (CPU tensors: only shapes, strides and dtypes are read) -------------------------
def _compressed(m: int, k: int, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.empty(m, k * 9 // 16, dtype=dtype)


@pytest.mark.parametrize("m,k,n", [(16, 16, 16), (48, 80, 112), (4096, 1024, 32)])
def test_operand_shape_of_both_b_layouts(m, k, n):
    c = _compressed(m, k)
    assert direct.operand_shape(c, torch.empty(k, n, dtype=torch.bfloat16)) == (m, k, n, False)
    assert direct.operand_shape(c, torch.empty(n, k, dtype=torch.bfloat16).t()) == (m, k, n, True)


def test_operand_shape_refuses_other_strides():
    b = torch.empty(64, 128, dtype=torch.bfloat16)[:, ::2]  # (64, 64), strides (128, 2)
    with pytest.raises(ValueError, match="b must be contiguous or the .t"):
        direct.operand_shape(_compressed(32, 64), b)


def test_operand_shape_refuses_a_size_too_small_for_a_compressed_matrix():
    with pytest.raises(ValueError, match=r"too small for the compressed form of a \(m, 64\)"):
        direct.operand_shape(torch.empty(30, dtype=torch.bfloat16), torch.empty(64, 16, dtype=torch.bfloat16))


def test_operand_shape_reads_m_as_pytorch_does_with_padded_metadata():
    # measured on the H100: A (256, 1008) bf16 compresses to 145408 elements (metadata padded)
    assert direct.operand_shape(torch.empty(145408, dtype=torch.bfloat16),
                                torch.empty(1008, 512, dtype=torch.bfloat16)) == (256, 1008, 512, False)


def test_operand_shape_refuses_dtypes():
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        direct.operand_shape(_compressed(16, 16, torch.float16), torch.empty(16, 16, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        direct.operand_shape(_compressed(16, 16, torch.float32), torch.empty(16, 16))


def test_operand_shape_refuses_ranks():
    with pytest.raises(ValueError, match="compressed must be contiguous"):
        direct.operand_shape(torch.empty(16, 9, dtype=torch.bfloat16).t(), torch.empty(16, 16, dtype=torch.bfloat16))
    # 2-D, as PyTorch 2.11's _cslt_compress returns it: m is its first dimension, whatever the padding
    assert direct.operand_shape(torch.empty(16, 9, dtype=torch.bfloat16),
                                torch.empty(16, 32, dtype=torch.bfloat16)) == (16, 16, 32, False)
    assert direct.operand_shape(torch.empty(48, 72, dtype=torch.bfloat16),
                                torch.empty(80, 112, dtype=torch.bfloat16)) == (48, 80, 112, False)
    with pytest.raises(ValueError, match="b must be 2-D"):
        direct.operand_shape(_compressed(16, 16), torch.empty(16, dtype=torch.bfloat16))


def test_opaque_buffers_are_aligned_and_large_enough():
    for _ in range(20):
        o = direct._Opaque()
        assert o.ptr.value % direct.ALIGNMENT == 0
        assert o.ptr.value + direct.OPAQUE_BYTES <= ctypes.addressof(o._raw) + len(o._raw)


# --- the descriptors each layout gets (a stand-in library records them) -----------------------------
class RecordingLibrary:
    """Every entry point returns success and records its arguments; the workspace size is 256."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str):
        if not name.startswith("cusparseLt"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append((name, args))
            if name == "cusparseLtMatmulGetWorkspace":
                args[2]._obj.value = 256
            return 0
        return call

    def check(self, status: int, what: str) -> None:
        assert status == 0

    def named(self, name: str) -> list[tuple]:
        return [args for n, args in self.calls if n == name]


def _plan(b_transposed: bool, transpose_result: bool, config=AlgConfig(17)):
    lib = RecordingLibrary()
    key = direct.PlanKey(64, 128, 32, torch.bfloat16, b_transposed, transpose_result, config)
    plan = direct._Plan(lib, direct._Opaque(), key)
    return lib, plan


@pytest.mark.parametrize("b_transposed", [False, True])
@pytest.mark.parametrize("transpose_result", [False, True])
def test_plan_descriptors_follow_pytorchs(b_transposed, transpose_result):
    lib, plan = _plan(b_transposed, transpose_result)
    (structured,) = lib.named("cusparseLtStructuredDescriptorInit")
    # A: (m, k) row-major, ld k, 16-byte alignment, bf16 (14), 50 % sparsity
    assert structured[2:] == (64, 128, 128, 16, 14, direct.ORDER_ROW, direct.SPARSITY_50)
    b_desc, d_desc = lib.named("cusparseLtDenseDescriptorInit")
    if b_transposed:  # Y.t() of a contiguous (n, k) Y: row-major (n, k), ld k, op T
        assert b_desc[2:] == (32, 128, 128, 16, 14, direct.ORDER_ROW)
    else:  # contiguous (k, n): row-major, ld n, op N
        assert b_desc[2:] == (128, 32, 32, 16, 14, direct.ORDER_ROW)
    if transpose_result:  # (m, n) column-major, ld m: the memory of a row-major (n, m)
        assert d_desc[2:] == (64, 32, 64, 16, 14, direct.ORDER_COL)
    else:
        assert d_desc[2:] == (64, 32, 32, 16, 14, direct.ORDER_ROW)
    (matmul,) = lib.named("cusparseLtMatmulDescriptorInit")
    assert matmul[2:4] == (direct.OP_N, direct.OP_T if b_transposed else direct.OP_N)
    assert matmul[4:8] == (plan.a.ptr, plan.b.ptr, plan.d.ptr, plan.d.ptr)  # C and D: the result
    assert matmul[8] == direct.COMPUTE_32F
    assert plan.workspace_bytes == 256


def _alg_attributes(lib) -> dict[int, int]:
    return {args[2]: args[3]._obj.value for args in lib.named("cusparseLtMatmulAlgSetAttribute")}


def test_plan_sets_split_k_only_when_asked():
    lib, _ = _plan(True, True, AlgConfig(17))
    assert _alg_attributes(lib) == {direct.ALG_CONFIG_ID: 17}
    lib, _ = _plan(True, True, AlgConfig(3, split_k=-1, split_k_mode=-1))
    assert _alg_attributes(lib) == {direct.ALG_CONFIG_ID: 3, direct.ALG_SPLIT_K: -1}
    lib, _ = _plan(True, True, AlgConfig(3, split_k=4, split_k_mode=2))
    assert _alg_attributes(lib) == {direct.ALG_CONFIG_ID: 3, direct.ALG_SPLIT_K: 4, direct.ALG_SPLIT_K_MODE: 2}


def test_loading_a_missing_library_names_the_path():
    with pytest.raises(direct.CusparseltBindingError, match="/nonexistent/libcusparseLt.so.0"):
        direct.CusparseltLibrary("/nonexistent/libcusparseLt.so.0")


# --- choosing the ops ---------------------------------------------------------------------------------
def test_make_ops_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="kind must be None, 'direct' or 'torch', got 'fast'"):
        direct.make_ops("fast")


def test_make_ops_reads_no_environment_switch(monkeypatch):
    """The ops are chosen by the argument alone: an environment variable changes nothing."""
    monkeypatch.setenv("SPARSITY_LAB_CUSPARSELT_OPS", "fast")
    monkeypatch.setattr(TorchCusparseltOps, "__init__", lambda self: None)  # a usable GPU, pretended
    assert isinstance(direct.make_ops("torch"), TorchCusparseltOps)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_make_ops_without_a_gpu_says_why():
    with pytest.raises(CusparseltUnavailable, match="no CUDA GPU"):
        direct.make_ops()


def test_default_falls_back_to_pytorchs_call_with_a_warning(monkeypatch):
    monkeypatch.setattr(TorchCusparseltOps, "__init__", lambda self: None)  # a usable GPU, pretended

    def broken(self, library=None):
        raise direct.CusparseltBindingError("cannot load cuSPARSELt from 'x'")
    monkeypatch.setattr(direct.DirectCusparseltOps, "__init__", broken)
    with pytest.warns(direct.DirectOpsFallbackWarning, match="torch._cslt_sparse_mm instead"):
        ops = direct.make_ops()
    assert type(ops) is TorchCusparseltOps and ops.name == "torch"
    # asked for by name, the direct binding raises instead of falling back
    with pytest.raises(direct.CusparseltBindingError):
        direct.make_ops("direct")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert type(direct.make_ops("torch")) is TorchCusparseltOps


# --- GPU: the real library ----------------------------------------------------------------------------
def _operands(m, k, n, b_transposed, seed=0):
    from sparsity_lab.backends.cusparselt.algorithms import ProductKey, synthetic_operands
    key = ProductKey(m, k, n, torch.bfloat16, b_transposed, False)
    return synthetic_operands(key, torch.device("cuda"), seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n", [(64, 64, 64), (48, 80, 112), (1024, 4096, 4096), (4096, 1024, 208)])
@pytest.mark.parametrize("b_transposed", [False, True])
@pytest.mark.parametrize("transpose_result", [False, True])
def test_direct_product_is_pytorchs_product(m, k, n, b_transposed, transpose_result):
    from sparsity_lab.backends.cusparselt.algorithms import check_product
    ops, theirs = direct.DirectCusparseltOps(), TorchCusparseltOps()
    a, b, ref = _operands(m, k, n, b_transposed)
    compressed = theirs.compress(a)
    for config in (AlgConfig(0), theirs.search(compressed, b, transpose_result)[0]):
        ours = ops.mm(compressed, b, None, transpose_result, config)
        expected = theirs.mm(compressed, b, None, transpose_result, config)
        assert ours.shape == expected.shape and ours.is_contiguous()
        ok, rel = check_product(ours, ref.t() if transpose_result else ref, torch.bfloat16)
        assert ok, f"{config.describe()}: rel err {rel}"
        if config.split_k == 1:  # one kernel, one order of sums: the same bytes
            assert torch.equal(ours, expected), config.describe()
    assert not ops.stats


@pytest.mark.gpu
def test_direct_product_adds_the_bias_per_row_of_the_product():
    ops = direct.DirectCusparseltOps()
    a, b, ref = _operands(256, 128, 96, True, seed=1)
    bias = torch.randn(256, device="cuda").to(torch.bfloat16)
    compressed = torch._cslt_compress(a)
    out = ops.mm(compressed, b, bias, True, AlgConfig(0))  # (n, m): bias along the last dim
    torch.testing.assert_close(out.float(), ref.t() + bias.float(), rtol=2e-2, atol=5e-2)
    out = ops.mm(compressed, b, bias, False, AlgConfig(0))
    torch.testing.assert_close(out.float(), ref + bias.float()[:, None], rtol=2e-2, atol=5e-2)


@pytest.mark.gpu
def test_direct_product_replays_in_a_cuda_graph():
    ops = direct.DirectCusparseltOps()
    a, b, _ = _operands(512, 256, 128, True, seed=2)
    compressed = torch._cslt_compress(a)
    x = b.t().contiguous()  # the tokens, (n, k): the graph reads this buffer
    ops.mm(compressed, x.t(), None, True, AlgConfig(0))  # plan made outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.mm(compressed, x.t(), None, True, AlgConfig(0))
    for seed in (3, 4):
        x.copy_(torch.randn(x.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        graph.replay()
        torch.testing.assert_close(out, ops.mm(compressed, x.t(), None, True, AlgConfig(0)), rtol=0, atol=0)


@pytest.mark.gpu
def test_misaligned_operand_is_copied_aligned_and_counted():
    ops = direct.DirectCusparseltOps()
    a, b, ref = _operands(64, 64, 48, False, seed=5)
    storage = torch.empty(b.numel() + 1, dtype=b.dtype, device="cuda")
    shifted = storage[1:].view(b.shape)  # 2 bytes past an aligned address
    shifted.copy_(b)
    out = ops.mm(torch._cslt_compress(a), shifted, None, False, AlgConfig(0))
    assert ops.stats == {"aligned_copies": 1}
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=5e-2)


@pytest.mark.gpu
def test_backend_uses_the_direct_binding_by_default():
    from sparsity_lab.backends.cusparselt.backend import CusparseltBackend
    backend = CusparseltBackend()
    assert backend.summary()["ops"] == "direct"
    assert backend.summary()["ops_stats"] == {}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit; on a GPU the command measures")
def test_bench_cslt_calls_without_a_gpu_exits_2_with_the_reason(capsys):
    from sparsity_lab.lab.cli import main
    assert bench_main(["cslt-calls", "--tokens", "64", "--d-model", "16"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_raw_stream_is_the_current_stream():
    assert direct._raw_stream(0) == torch.cuda.current_stream(0).cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert direct._raw_stream(0) == side.cuda_stream


@pytest.mark.gpu
def test_direct_product_refuses_operands_on_the_cpu():
    ops = direct.DirectCusparseltOps()
    with pytest.raises(ValueError, match="same CUDA device"):
        ops.mm(_compressed(64, 64), torch.empty(64, 32, dtype=torch.bfloat16), None, False, AlgConfig(0))
