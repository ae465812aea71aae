"""The CUTLASS backends ("cutlass", "cutlass_fp8") and their products (``sparsity_lab/backends/cutlass/``).

CPU: asking for either backend without a Hopper GPU, nvcc or CUTLASS raises, naming what is missing and
the backend to use instead (no silent fallback); the shape rules and argument checks refuse with a
message before any GPU work.

GPU (``pytest -m gpu``, Hopper only): every product layout against the dense product of the same masked
operands (float32 on the same bf16/E4M3 values, so only the output's bfloat16 rounding differs) on fresh
random inputs, at odd sizes the kernels accept; -0.0 in the operand; adversarial magnitudes; the E4M3
scales read from device memory (changed between CUDA-graph replays); every built config agrees; the
layers against the "triton" / "fp8_reference" backends on the same weights and MVUE draws.
"""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import sparsity_lab as sl
from sparsity_lab.backends import get_backend
from sparsity_lab.backends.cutlass import backend as cutlass_backend
from sparsity_lab.backends.cutlass import ops
from sparsity_lab.backends.cutlass.build import CutlassUnavailable
from sparsity_lab.sparsify import backend_report
from _refresh_testing import assert_trains_exactly_as_the_separate_calls

BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn


# --- CPU: clear refusals ------------------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only refusal")
@pytest.mark.parametrize("name,instead", [("cutlass", "cusparselt"), ("cutlass_fp8", "cusparselt_fp8")])
def test_without_a_gpu_the_backends_raise_naming_the_reason_and_the_fallback(name, instead):
    with pytest.raises(CutlassUnavailable, match=rf"no CUDA GPU.*backend='{instead}'"):
        get_backend(name)


def test_a_gpu_that_is_not_hopper_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100")
    with pytest.raises(CutlassUnavailable, match=r"A100\) has compute capability 8\.0.*sm_90a.*'cusparselt'"):
        cutlass_backend.require_cutlass("cutlass")


def test_missing_tools_are_named_with_how_to_install(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(cutlass_backend, "missing_tools", lambda: ["nvcc (none found)"])
    with pytest.raises(CutlassUnavailable, match=r"missing nvcc.*Install: pip install nvidia-cutlass.*fp8_dense"):
        cutlass_backend.require_cutlass("cutlass_fp8")


@pytest.mark.parametrize("m,n,k,dtype,b_layout,out_layout,found", [
    (256, 100, 512, BF16, "k", "col", None),          # any token count (n) with a K-major B
    (256, 100, 520, BF16, "k", "col", "multiple of 16"),  # k/2 bf16 = 16-byte rows
    (256, 128, 528, E4M3, "k", "col", "multiple of 32"),  # k/2 e4m3 = 16-byte rows
    (260, 128, 512, BF16, "k", "col", "m \\(D's rows"),   # a column-major D: m is its row length
    (256, 100, 512, BF16, "n", "row", "n \\(B's rows"),   # an N-major B: n is its row length
    (256, 128, 512, E4M3, "n", "row", "K-major only"),
    (256, 128, 512, torch.float16, "k", "col", "dtype must be"),
    (0, 128, 512, BF16, "k", "col", "positive"),
])
def test_shape_rules(m, n, k, dtype, b_layout, out_layout, found):
    problem = ops.shape_problem(m, n, k, dtype, b_layout, out_layout)
    if found is None:
        assert problem is None
    else:
        assert problem is not None and __import__("re").search(found, problem), problem


def test_operands_are_checked_before_any_gpu_work():
    a = ops.SparseOperand(torch.zeros(64, 32, dtype=BF16), torch.zeros(8, dtype=torch.uint8), (64, 64))
    with pytest.raises(ValueError, match="one dtype"):
        ops.mm(a, torch.zeros(16, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="inner dimensions"):
        ops.mm(a, torch.zeros(16, 48, dtype=BF16))
    with pytest.raises(ValueError, match="contiguous"):
        ops.mm(a, torch.zeros(64, 16, dtype=BF16).t())
    with pytest.raises(ValueError, match="CUDA tensor"):
        ops.mm(a, torch.zeros(16, 64, dtype=BF16))
    with pytest.raises(ValueError, match="multiple of 16"):
        ops.mm(ops.SparseOperand(a.values, a.metadata, (64, 72)), torch.zeros(16, 72, dtype=BF16))
    with pytest.raises(ValueError, match="2-D bfloat16 or float8"):
        ops.compress(torch.zeros(4, 8, 8, dtype=BF16))
    with pytest.raises(ValueError, match="CUDA tensor"):
        ops.compress(torch.zeros(64, 64, dtype=BF16))


def test_a_product_without_a_config_runs_the_default_of_its_layouts_or_of_its_shape():
    lib = object.__new__(ops._Library)  # the variant table alone, no library loaded
    lib.names = ["bf16.tc.a", "bf16.tc.256x128x128.2x1.coop", "bf16.nr.b", "e4m3.tc.c",
                 "e4m3.tc.128x256x128.1x2.coopfast", "e4m3.tc.256x128x128.1x2.coopfast"]
    assert lib.variant(BF16, "k", "col", None) == 1  # DEFAULT_CONFIGS
    assert lib.variant(BF16, "k", "col", "a") == 0
    assert lib.variant(BF16, "n", "row", None) == 2  # the default is not built here: the first of the layouts
    assert lib.variant(E4M3, "k", "col", None) == 4
    assert lib.variant(E4M3, "k", "col", None, (4096, 16384, 16384)) == 4
    assert lib.variant(E4M3, "k", "col", None, (16384, 16384, 4096)) == 5  # SHAPE_CONFIGS
    assert lib.variant(E4M3, "k", "col", "c", (16384, 16384, 4096)) == 3  # an asked config wins
    assert ("e4m3.tc", 16384, 16384, 4096) in ops.SHAPE_CONFIGS
    with pytest.raises(ValueError, match=r"configs for these layouts: \['a', '256x128x128.2x1.coop'\]"):
        lib.variant(BF16, "k", "col", "z")


def test_every_default_and_shape_config_is_in_the_shipped_table():
    from sparsity_lab.backends.cutlass import build

    names = set(build.variant_names(build.SOURCE.read_text()))
    assert {f"{layouts}.{config}" for layouts, config in ops.DEFAULT_CONFIGS.items()} <= names
    assert {f"{key[0]}.{config}" for key, config in ops.SHAPE_CONFIGS.items()} <= names


def test_the_driver_context_is_made_current_only_where_it_is_not(monkeypatch):
    """context.make_current: the primary context is retained once per device and set on a thread only when
    another (or none) is current there."""
    import ctypes

    from sparsity_lab.backends.cutlass import context

    class FakeDriver:
        def __init__(self):
            self.current, self.calls = None, []

        def _out(self, ref, value):
            ctypes.cast(ref, ctypes.POINTER(type(value))).contents.value = value.value

        def cuInit(self, flags):
            self.calls.append("init")
            return 0

        def cuDeviceGet(self, ref, ordinal):
            self._out(ref, ctypes.c_int(ordinal))
            return 0

        def cuDevicePrimaryCtxRetain(self, ref, device):
            self.calls.append(f"retain {device.value}")
            self._out(ref, ctypes.c_void_p(0x1000 + device.value))
            return 0

        def cuCtxGetCurrent(self, ref):
            self._out(ref, ctypes.c_void_p(self.current))
            return 0

        def cuCtxSetCurrent(self, ctx):
            self.calls.append(f"set {ctx.value:#x}")
            self.current = ctx.value
            return 0

    fake = FakeDriver()
    monkeypatch.setattr(context, "_DRIVER", fake)
    monkeypatch.setattr(context, "_PRIMARY", {})
    context.make_current(torch.device("cuda", 0))  # none current: retained and set
    context.make_current(torch.device("cuda", 0))  # already current: nothing
    context.make_current(torch.device("cuda", 1))  # another device: its own context
    context.make_current(torch.device("cuda", 0))  # back: set again, not retained again
    assert fake.calls == ["init", "retain 0", "set 0x1000", "init", "retain 1", "set 0x1001", "set 0x1000"]
    fake.cuCtxSetCurrent = lambda ctx: 201
    fake.current = None
    with pytest.raises(RuntimeError, match="cuCtxSetCurrent failed with CUresult 201"):
        context.make_current(torch.device("cuda", 0))


def test_the_bf16_backend_refuses_masks_it_cannot_multiply():
    backend = cutlass_backend.CutlassBackend()  # the Triton interpreter on the CPU: no GPU needed to build it
    w = torch.randn(64, 64)
    with pytest.raises(ValueError, match="transposable 2:4 mask"):
        backend.mask(w, 2, 4, False)
    with pytest.raises(ValueError, match="input gradient product.*multiple of 16"):
        backend.mask(torch.randn(40, 64), 2, 4, True)  # S(W)^T (64, 40): k = 40
    with pytest.raises(TypeError, match="bfloat16"):
        backend.prepare(w)
    assert backend.product_plan(64, 64, mvue=False)["grad_weight"] == "dense dZ^T X"
    assert "CUTLASS" in backend.product_plan(64, 64, mvue=True)["grad_weight"]


class _DenseStandIn:
    """``ops.compress`` / ``ops.mm`` computed densely in float32 on any device, with the layouts and scales of
    the real ones: the backends' plumbing (which operand, which layout, which scale, padding) is then checked
    on the CPU against the reference backends; the kernels themselves are the GPU tests' job."""

    @staticmethod
    def compress(a):
        return ops.SparseOperand(a.clone(), torch.zeros(0, dtype=torch.uint8), tuple(a.shape))

    @staticmethod
    def mm(a, b, b_layout="k", out_layout="col", scale_a=None, scale_b=None, config=None):
        assert b.is_contiguous() and b.dtype == a.dtype and ops.shape_problem(
            a.shape[0], b.shape[0] if b_layout == "k" else b.shape[1], a.shape[1], a.dtype, b_layout, out_layout) is None
        d = _dense(a.values, b, b_layout, out_layout)
        for s in (scale_a, scale_b):
            d = d if s is None else d * s.float().reshape(())
        return d.to(BF16)


@pytest.mark.parametrize("name,reference", [("cutlass", "triton"), ("cutlass_fp8", "fp8_reference")])
@pytest.mark.parametrize("method", [sl.STE(transposable=True, mvue=True), sl.SSTE(transposable=True, mvue=True)],
                         ids=["ste_mvue", "sste_mvue"])
def test_the_backends_route_each_product_like_the_reference(name, reference, method, monkeypatch):
    """With a dense stand-in for the CUTLASS calls, each backend's three products equal the reference
    backend's on the same layer, weights and MVUE draws (on the CPU; the Triton kernels run interpreted)."""
    from sparsity_lab.backends.cusparselt.fp8_train import FP8Engine

    monkeypatch.setattr(ops, "compress", _DenseStandIn.compress)
    monkeypatch.setattr(ops, "mm", _DenseStandIn.mm)
    monkeypatch.setattr(FP8Engine, "check", lambda self, t, what: None)  # its GPU engines refuse CPU tensors
    real, ref, x, x2 = _cpu_layer_pair(name, reference, method, seed=0)
    for _ in range(2):
        z, z_ref = real(x), ref(x2)
        dz = torch.randn_like(z)
        z.backward(dz)
        z_ref.backward(dz)
        assert _rel(z, z_ref) < 1e-2 and _rel(x.grad, x2.grad) < 1e-2
        assert _rel(real.weight.grad, ref.weight.grad) < 1e-2
        for layer in (real, ref):
            layer.advance_step()
            layer.weight.grad = None
        x.grad = x2.grad = None
    assert backend_report(real)[0].products["grad_weight"].startswith("MVUE 2:4 sparse" if name == "cutlass" else "2:4")


class _LayoutStandIn:
    """``ops.compress`` / ``ops.mm`` on the CPU through the layout's reference (``references/cutlass_layout``):
    real CUTLASS bytes in, the product of what they decode to out. With it the operands kernel 22 writes (run
    interpreted) go through the backends' plumbing on the CPU."""

    @staticmethod
    def compress(a):
        from sparsity_lab.references import cutlass_layout
        return ops.SparseOperand(*cutlass_layout.compress(a), tuple(a.shape))

    @staticmethod
    def mm(a, b, b_layout="k", out_layout="col", scale_a=None, scale_b=None, config=None):
        from sparsity_lab.references import cutlass_layout
        dense = cutlass_layout.decompress(a.values, a.metadata, *a.shape)
        return _DenseStandIn.mm(ops.SparseOperand(dense, a.metadata, a.shape), b, b_layout, out_layout, scale_a,
                                scale_b, config)


def _cpu_layer_pair(name: str, reference: str, method, seed: int):
    """A CPU layer (64 -> 32, bf16) on backend ``name`` and its copy on ``reference``, the same weights and
    MVUE seed, both with an optimizer attached (lr 0), and one input for each: 30 tokens, padded for the
    weight gradient."""
    from sparsity_lab.backends.cusparselt.fp8_train import FP8Engine
    from sparsity_lab.backends.cutlass.fp8 import CutlassFP8Backend

    torch.manual_seed(seed)
    real = sl.SparseLinear(64, 32, method=dataclasses.replace(method, backend=reference), dtype=BF16)
    ref = copy.deepcopy(real)
    if name == "cutlass":
        real.backend = cutlass_backend.CutlassBackend()
    else:
        # kernel 23 draws MVUE with kernel 4's Philox stream; "fp8_reference" on the CPU with its own generator
        real.backend = CutlassFP8Backend(FP8Engine(name, "scaled_mm"), fused_mvue=False).for_layer(real)
    real.method = dataclasses.replace(method, backend=name)
    ref.mvue_seed = real.mvue_seed
    x = torch.randn(30, 64, dtype=BF16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    for layer in (real, ref):
        sl.attach_optimizer(layer, torch.optim.SGD(layer.parameters(), lr=0.0))
    return real, ref, x, x2


def _kernel_mvue(engine, dz, seed):
    """``FP8Engine.mvue`` as it draws on CUDA (kernel 4), for CPU tensors too (there it uses the reference's
    generator): the draws of kernel 23, which the tests run interpreted."""
    from sparsity_lab.backends.base import kernel_seed
    return engine.kernels().mvue24(dz, dim=0, seed=kernel_seed(seed))


@pytest.mark.parametrize("name,reference,tol", [("cutlass", "triton", 1e-2), ("cutlass_fp8", "fp8_reference", 2e-2)])
@pytest.mark.parametrize("method", [sl.STE(transposable=True, mvue=True), sl.SSTE(transposable=True)],
                         ids=["ste_mvue", "sste"])
def test_the_weight_operands_written_by_kernel_22_give_the_reference_products(name, reference, tol, method,
                                                                              monkeypatch):
    """prepare_masked on the fused path (kernel 22 from W and the mask, widened to the CPU interpreter; kernel 24
    at the step that refreshes the mask): the layer's products through those bytes equal the reference
    backend's, step after step, and the forms are written once per step, both in one pass. FP8's tolerance is the GPU layer test's: the interpreter
    truncates S to bf16 where PyTorch rounds, which can move amax(S), hence the scale, hence every q."""
    from sparsity_lab.backends.cusparselt.fp8_train import FP8Engine

    monkeypatch.setattr(ops, "compress", _LayoutStandIn.compress)
    monkeypatch.setattr(ops, "mm", _LayoutStandIn.mm)
    monkeypatch.setattr(cutlass_backend, "_fused_device", lambda t: True)
    monkeypatch.setattr(FP8Engine, "check", lambda self, t, what: None)
    from sparsity_lab.backends.cutlass import fp8 as cutlass_fp8
    monkeypatch.setattr(cutlass_fp8, "_fused_device", lambda t: True)
    calls = []
    import sparsity_lab.kernels as kernels
    for fn in ("prepare24_cutlass", "prepare24_cutlass_fp8", "refresh24_cutlass", "refresh24_cutlass_fp8"):
        original = getattr(kernels, fn)
        monkeypatch.setattr(kernels, fn, lambda *a, _f=original, _n=fn, **k: calls.append((_n, k)) or _f(*a, **k))
    real, ref, x, x2 = _cpu_layer_pair(name, reference, method, seed=1)
    for _ in range(2):
        z, z_ref = real(x), ref(x2)
        dz = torch.randn_like(z)
        z.backward(dz)
        z_ref.backward(dz)
        assert _rel(z, z_ref) < tol and _rel(x.grad, x2.grad) < tol
        assert _rel(real.weight.grad, ref.weight.grad) < tol
        for layer in (real, ref):
            layer.advance_step()
            layer.weight.grad = None
        x.grad = x2.grad = None
    # one pass per step writing both forms: kernel 22, or kernel 24 at the step that refreshes the mask (step 1)
    suffix = "" if name == "cutlass" else "_fp8"
    fused = [(n, k) for n, k in calls if n in (f"prepare24_cutlass{suffix}", f"refresh24_cutlass{suffix}")
             and k.get("forward", True)]
    assert [n for n, _ in fused] == [f"prepare24_cutlass{suffix}", f"refresh24_cutlass{suffix}"]
    assert all(k.get("transposed", True) for _, k in fused)


def test_the_fused_bf16_operand_is_written_on_first_use_and_equals_the_compressors_path(monkeypatch):
    """CutlassBackend.prepare_masked with kernel 22 (interpreted) against fused_prepare=False (S(W), then the
    compressor, here the layout's reference): the same bytes for both forms; nothing runs before first use.
    W is a multiple of 1/16 up to 4 and beta 0.75, so S-STE's S is exact in bf16 (the interpreter truncates
    float32 -> bf16 where PyTorch rounds); the many equal magnitudes are ties for the mask and the threshold."""
    from sparsity_lab.kernels import transposable_mask24

    monkeypatch.setattr(ops, "compress", _LayoutStandIn.compress)
    monkeypatch.setattr(cutlass_backend, "_fused_device", lambda t: True)
    w = torch.randint(-64, 65, (48, 80), generator=torch.Generator().manual_seed(3)).float() / 16
    mask = transposable_mask24(w, pruned=False)[0]
    beta = torch.tensor(0.75)
    fused, plain = cutlass_backend.CutlassBackend(), cutlass_backend.CutlassBackend(fused_prepare=False)
    a = fused.prepare_masked(w, mask, beta, 2, 4, BF16)
    b = plain.prepare_masked(w, mask, beta, 2, 4, BF16)
    assert a.weight is None and a.compressed is None and fused.stats["fused_prepares"] == 0
    assert a.shape == b.shape == (48, 80) and a.dtype == b.dtype == BF16
    for transposed in (False, True):
        x, y = fused._compressed(a, transposed), plain._compressed(b, transposed)
        assert x.shape == y.shape and torch.equal(x.values.view(torch.int16), y.values.view(torch.int16))
        assert torch.equal(x.metadata, y.metadata)
    assert fused.stats["fused_prepares"] == 1 and fused.stats["compressions"] == 2
    with pytest.raises(TypeError, match="bfloat16"):
        fused.prepare_masked(w, mask, beta, 2, 4, torch.float16)


@pytest.mark.parametrize("name", ["cutlass", "cutlass_fp8"])
@pytest.mark.parametrize("tokens", [30, 64])
def test_the_weight_gradient_through_kernel_23_equals_the_compressors_path(name, tokens, monkeypatch):
    """dW with MVUE(dZ^T) written compressed by kernel 23 (interpreted; dZ's token padding read as zeros) and
    with mvue24, the transposed copy and the compressor (here the layout's reference): the same bits, step
    after step (FP8: current scaling at the first step, delayed after it; the same dz_mvue amax recorded).
    The unfused FP8 layer runs FP8Engine(fused=False), so its weight operands take the unfused path too."""
    from sparsity_lab.backends.cusparselt.fp8_train import FP8Engine
    from sparsity_lab.backends.cutlass import fp8 as cutlass_fp8

    monkeypatch.setattr(ops, "compress", _LayoutStandIn.compress)
    monkeypatch.setattr(ops, "mm", _LayoutStandIn.mm)
    monkeypatch.setattr(cutlass_backend, "_fused_device", lambda t: True)
    monkeypatch.setattr(cutlass_fp8, "_fused_device", lambda t: True)
    monkeypatch.setattr(FP8Engine, "check", lambda self, t, what: None)
    monkeypatch.setattr(FP8Engine, "mvue", _kernel_mvue)  # the unfused draw as on CUDA: kernel 4
    torch.manual_seed(2)
    method = sl.STE(transposable=True, mvue=True, backend=name)
    fused = sl.SparseLinear(64, 32, method=dataclasses.replace(method, backend="triton"), dtype=BF16)
    plain = copy.deepcopy(fused)
    if name == "cutlass":
        fused.backend = cutlass_backend.CutlassBackend(fused_mvue_compress=True)
        plain.backend = cutlass_backend.CutlassBackend(fused_mvue_compress=False)
    else:
        fused.backend = cutlass_fp8.CutlassFP8Backend(FP8Engine(name, "scaled_mm"), fused_mvue=True).for_layer(fused)
        plain.backend = cutlass_fp8.CutlassFP8Backend(FP8Engine(name, "scaled_mm", fused=False)).for_layer(plain)
    for layer in (fused, plain):
        layer.method = method
        sl.attach_optimizer(layer, torch.optim.SGD(layer.parameters(), lr=0.0))
    plain.mvue_seed = fused.mvue_seed
    for _ in range(2):
        x = torch.randn(tokens, 64, dtype=BF16)
        zs = [layer(x) for layer in (fused, plain)]
        dz = torch.randn_like(zs[0])
        dz[:4] = 0.0  # whole zero groups, and -0.0 entries, reach the draw
        dz[4::5, ::3] = -0.0
        for z in zs:
            z.backward(dz)
        assert fused.weight.grad.abs().sum() > 0
        assert torch.equal(fused.weight.grad.view(torch.int16), plain.weight.grad.view(torch.int16))
        if name == "cutlass_fp8":
            history = [layer.backend.scaling.amax_history for layer in (fused, plain)]
            assert torch.equal(history[0], history[1])
        for layer in (fused, plain):
            layer.advance_step()
            layer.weight.grad = None
    stats = [layer.backend.stats if name == "cutlass" else layer.backend.engine.stats for layer in (fused, plain)]
    assert stats[0]["fused_mvue_compressions"] == 2 and stats[1]["fused_mvue_compressions"] == 0


def _refresh_pair(name: str, recipe, fused_refresh: bool):
    """A CUTLASS backend (``name``) with kernel 24 on or off; the FP8 one with ``recipe``."""
    from sparsity_lab.backends.cusparselt.fp8_train import FP8Engine
    from sparsity_lab.backends.cutlass.fp8 import CutlassFP8Backend

    if name == "cutlass":
        return cutlass_backend.CutlassBackend(fused_refresh=fused_refresh)
    return CutlassFP8Backend(FP8Engine(name, "scaled_mm"), recipe, fused_refresh=fused_refresh)


@pytest.mark.parametrize("name,scaling", [("cutlass", None), ("cutlass_fp8", "delayed"), ("cutlass_fp8", "current")])
@pytest.mark.parametrize("method", [sl.SSTE(mvue=True, transposable=True), sl.SRSTE(decay=0.05, transposable=True)],
                         ids=["sste_mvue", "srste"])
def test_fused_refresh_trains_exactly_as_the_separate_kernels(name, scaling, method, monkeypatch):
    """Kernel 24 against kernels 2, 9 and 22 (all interpreted on these CPU tensors; the products through the
    layout's reference) in a layer that refreshes its mask every step: outputs, masks, flip counts, weights, the
    FP8 amax history and the state dict the same to the bit at every step, and a run resumed from the fused
    run's checkpoint continues it exactly. FP8 with delayed scaling refreshes and writes both E4M3 forms in one
    pass; at a current-scaling step the mask is refreshed alone and kernel 22 follows, which the stats say."""
    from sparsity_lab.backends import base
    from sparsity_lab.backends.cusparselt.fp8_train import FP8Engine
    from sparsity_lab.backends.cutlass import fp8 as cutlass_fp8
    from sparsity_lab.backends.triton import TritonBackend
    from sparsity_lab.methods.fp8_scaling import FP8Recipe

    monkeypatch.setattr(ops, "compress", _LayoutStandIn.compress)
    monkeypatch.setattr(ops, "mm", _LayoutStandIn.mm)
    monkeypatch.setattr(cutlass_backend, "_fused_device", lambda t: True)
    monkeypatch.setattr(cutlass_fp8, "_fused_device", lambda t: True)
    monkeypatch.setattr(FP8Engine, "check", lambda self, t, what: None)
    masks = TritonBackend()  # the FP8 backends' masks as on CUDA (kernel 2), not the CPU reference's
    monkeypatch.setattr(FP8Engine, "masks_on", lambda self, t: masks)
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    monkeypatch.setattr(base, "_INSTANCES", {})
    recipe = FP8Recipe(scaling=scaling) if scaling else None
    backends = {kind: _refresh_pair(name, recipe, kind == "fused") for kind in ("fused", "separate")}
    for kind, backend in backends.items():
        base.register_backend(f"{name}_{kind}", lambda backend=backend: backend)

    def counted():
        stats = {kind: backend.stats for kind, backend in backends.items()}
        # kernel 24: the first mask (mask only, at construction), then at the refreshes of steps 1 and 2: mask and
        # operands in one pass, or (current scaling) the mask alone with kernel 22 after it
        assert stats["fused"]["fused_refreshes"] == 3 and stats["separate"]["fused_refreshes"] == 0
        assert stats["fused"]["refresh_then_prepare_current_scaling"] == (2 if scaling == "current" else 0)
    assert_trains_exactly_as_the_separate_calls(method, f"{name}_fused", f"{name}_separate", counted)


# --- GPU ------------------------------------------------------------------------------------------------------
def _is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


hopper = pytest.mark.skipif(not _is_hopper(), reason="needs a Hopper GPU (sm_90)")


def _sparse24(m: int, k: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """A random (m, k) float32 matrix, 2:4 along k (the two largest of each group of four kept)."""
    from sparsity_lab.masks import nm_mask
    a = torch.randn(m, k, device="cuda", generator=gen) * scale
    return a * nm_mask(a, 2, 4)


def _dense(a: torch.Tensor, b: torch.Tensor, b_layout: str, out_layout: str, absolute: bool = False) -> torch.Tensor:
    """The float32 product of the same values, in the layout ``ops.mm`` returns; ``absolute``: of |a| and |b|
    (the size of the summands, which bounds the accumulation error where they cancel)."""
    a, b = (a.float().abs(), b.float().abs()) if absolute else (a.float(), b.float())
    d = a @ (b.t() if b_layout == "k" else b)  # (m, n)
    return d.t() if out_layout == "col" else d


def _check(out: torch.Tensor, a, b, b_layout: str = "k", out_layout: str = "col", scale: float = 1.0,
           accumulation: float | None = None) -> None:
    """out within the bfloat16 rounding of the float32 product (relative 2^-7 of each entry) plus the
    accumulation's noise: 2^-16 of the summands' absolute sum for bf16 operands (float32 accumulators), 2^-13
    for E4M3 (Hopper's FP8 tensor cores keep fewer accumulator bits between the promotions to float32: seen on
    the H200 as a few entries with heavy cancellation, up to about 2^-15 of that sum off)."""
    ref = _dense(a, b, b_layout, out_layout) * scale
    if accumulation is None:
        accumulation = 2 ** -13 if a.dtype == E4M3 else 2 ** -16
    tol = ref.abs() * 2 ** -7 + _dense(a, b, b_layout, out_layout, absolute=True) * scale * accumulation
    assert out.dtype == BF16 and out.shape == ref.shape
    bad = (out.float() - ref).abs() > tol
    assert not bad.any(), (f"{int(bad.sum())} of {bad.numel()} entries outside bf16 rounding; worst "
                           f"{float(((out.float() - ref).abs() / tol.clamp_min(1e-38)).max()):.3g} x the tolerance")


LAYOUTS = [(BF16, "k", "col"), (BF16, "n", "row"), (BF16, "k", "row"), (E4M3, "k", "col"), (E4M3, "k", "row")]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype,b_layout,out_layout", LAYOUTS, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("m,n,k", [(256, 256, 512), (200, 136, 96), (72, 40, 160), (1040, 520, 1056)])
def test_gpu_products_equal_the_dense_product_of_the_same_operands(dtype, b_layout, out_layout, m, n, k):
    problem = ops.shape_problem(m, n, k, dtype, b_layout, out_layout)
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + k)
    a = _sparse24(m, k, gen).to(dtype)
    b = torch.randn(*((n, k) if b_layout == "k" else (k, n)), device="cuda", generator=gen).to(dtype)
    if problem:  # refused with the rule, before the kernel
        with pytest.raises(ValueError, match="multiple of"):
            ops.mm(ops.compress(a), b, b_layout, out_layout)
        return
    _check(ops.mm(ops.compress(a), b, b_layout, out_layout), a, b, b_layout, out_layout)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [BF16, E4M3], ids=["bf16", "e4m3"])
def test_gpu_negative_zero_in_the_operand_is_a_zero(dtype):
    """-0.0 where the mask pruned, and as a kept value: CUTLASS's compressor must not count it as a
    non-zero (an older one did, and then wrote a group with three 'non-zeros')."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    m, n, k = 128, 64, 256
    a = _sparse24(m, k, gen)
    a = torch.where(a == 0, torch.full_like(a, -0.0), a)  # every pruned entry is -0.0
    a[::3, 0:4] = torch.tensor([-0.0, 2.0, -0.0, -0.0], device="cuda")  # a group with one value and three -0.0
    a[1::3, 4:8] = -0.0  # a group of four -0.0
    a = a.to(dtype)
    assert (a.float() == 0).logical_and(torch.signbit(a.float())).any()
    b = torch.randn(n, k, device="cuda", generator=gen).to(dtype)
    _check(ops.mm(ops.compress(a), b), a, b)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [BF16, E4M3], ids=["bf16", "e4m3"])
def test_gpu_products_run_from_a_thread_that_has_made_no_cuda_call(dtype):
    """A fresh thread has no current CUDA context (autograd's backward thread is one): the product there must
    equal the main thread's, not fail its TMA descriptor and launch with it (which poisons the process)."""
    import threading

    gen = torch.Generator(device="cuda").manual_seed(5)
    a = _sparse24(256, 512, gen).to(dtype)
    b = torch.randn(128, 512, device="cuda", generator=gen).to(dtype)
    operand = ops.compress(a)
    here = ops.mm(operand, b)
    there = {}

    def product():
        try:
            there["out"] = ops.mm(operand, b)
            torch.cuda.current_stream().synchronize()
        except Exception as error:  # noqa: BLE001 -- reported on the main thread below
            there["error"] = error
    worker = threading.Thread(target=product)
    worker.start()
    worker.join()
    assert "error" not in there, there.get("error")
    assert torch.equal(there["out"], here)
    _check(here, a, b)


@pytest.mark.gpu
@hopper
def test_gpu_adversarial_magnitudes():
    """Rows of A spanning 2^-60 .. 2^60 and columns of B likewise (bfloat16 has float32's range); values
    that cancel within a row; each entry within bfloat16 rounding of the float32 product."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    m, n, k = 128, 128, 256
    rows = torch.pow(2.0, torch.linspace(-60, 60, m, device="cuda")).unsqueeze(1)
    a = (_sparse24(m, k, gen) * rows).to(BF16)
    cols = torch.pow(2.0, torch.linspace(-40, 40, n, device="cuda")).unsqueeze(1)
    b = (torch.randn(n, k, device="cuda", generator=gen) * cols).to(BF16)
    b[0] = 1.0  # column 0 of D sums a row of A: kept values that cancel are summed exactly in float32
    _check(ops.mm(ops.compress(a), b), a, b)


@pytest.mark.gpu
@hopper
def test_gpu_e4m3_scales_are_read_from_device_memory_at_each_replay():
    gen = torch.Generator(device="cuda").manual_seed(5)
    m, n, k = 256, 128, 512
    a = _sparse24(m, k, gen).to(E4M3)
    b = torch.randn(n, k, device="cuda", generator=gen).to(E4M3)
    comp = ops.compress(a)
    s_a = torch.tensor([0.5], device="cuda")
    s_b = torch.tensor([3.0], device="cuda")
    _check(ops.mm(comp, b, scale_a=s_a, scale_b=s_b), a, b, scale=1.5)
    out = ops.mm(comp, b, scale_a=s_a, scale_b=s_b)  # warm up before capture (workspace query)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.mm(comp, b, scale_a=s_a, scale_b=s_b)
    for sa, sb in ((0.5, 3.0), (2.0 ** -9, 4.0), (7.0, 0.25)):
        s_a.fill_(sa)
        s_b.fill_(sb)
        graph.replay()
        torch.cuda.synchronize()
        _check(out, a, b, scale=sa * sb)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [BF16, E4M3], ids=["bf16", "e4m3"])
def test_gpu_every_built_config_computes_the_product(dtype):
    gen = torch.Generator(device="cuda").manual_seed(9)
    m, n, k = 384, 320, 768
    a = _sparse24(m, k, gen).to(dtype)
    b = torch.randn(n, k, device="cuda", generator=gen).to(dtype)
    comp = ops.compress(a)
    configs = ops.configs(dtype)
    assert len(configs) >= 4
    for config in configs:  # "fast": FP8 fast accumulation, no promotion to float32 inside the K loop
        _check(ops.mm(comp, b, config=config), a, b, accumulation=2 ** -9 if config.endswith("fast") else None)
    with pytest.raises(ValueError, match="configs for these layouts"):
        ops.mm(comp, b, config="1x1x1.1x1.none")


def _layer_pair(name: str, reference: str, method, shape=(256, 512), tokens=200, seed=4):
    torch.manual_seed(seed)
    real = sl.SparseLinear(shape[1], shape[0], method=dataclasses.replace(method, backend=name), device="cuda",
                           dtype=BF16)
    ref = copy.deepcopy(real)
    ref.method = dataclasses.replace(method, backend=reference)
    ref.backend = get_backend(reference).for_layer(ref)
    ref.mvue_seed = real.mvue_seed
    x = torch.randn(tokens, shape[1], device="cuda", dtype=BF16, requires_grad=True)
    return real, ref, x


def _rel(a, b):
    return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm())


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("name,reference,tol", [("cutlass", "triton", 1e-2), ("cutlass_fp8", "fp8_reference", 2e-2)])
@pytest.mark.parametrize("method", [sl.STE(transposable=True, mvue=True), sl.SSTE(transposable=True, mvue=True),
                                    sl.STE(transposable=True)], ids=["ste_mvue", "sste_mvue", "ste"])
def test_gpu_layers_match_the_reference_backend(name, reference, tol, method):
    """The same layer, weights, mask and MVUE draws on the CUTLASS backend and on the reference: outputs
    and both gradients agree over three steps (the FP8 one: current scaling first, then delayed)."""
    real, ref, x = _layer_pair(name, reference, method)
    assert real.backend.name == name
    x2 = x.detach().clone().requires_grad_(True)
    for layer in (real, ref):
        sl.attach_optimizer(layer, torch.optim.SGD(layer.parameters(), lr=0.0))
    for _ in range(3):
        z, z_ref = real(x), ref(x2)
        assert _rel(z, z_ref) < tol
        dz = torch.randn_like(z)
        z.backward(dz)
        z_ref.backward(dz)
        assert _rel(x.grad, x2.grad) < tol
        assert _rel(real.weight.grad, ref.weight.grad) < tol
        for layer in (real, ref):
            layer.advance_step()
            layer.weight.grad = None
        x.grad = x2.grad = None
    assert backend_report(real)[0].products["forward"].startswith("2:4 sparse")


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [BF16, E4M3], ids=["bf16", "e4m3"])
@pytest.mark.parametrize("soft", [False, True], ids=["ste", "sste"])
@pytest.mark.parametrize("out_f,in_f", [(512, 1024), (224, 352), (1056, 544)])
def test_gpu_products_through_kernel_22_operands_equal_the_dense_product(dtype, soft, out_f, in_f):
    """S(W) and S(W)^T written by kernel 22 (W with -0.0 and ties) multiply like the dense S: the forward
    (Z^T = S X^T) and the input gradient (dX^T = S^T dZ^T), both D layouts."""
    from sparsity_lab.kernels import prepare24_cutlass, prepare24_cutlass_fp8, quantize_fp8_with_scale
    from sparsity_lab.kernels import soft_threshold24, transposable_mask24

    gen = torch.Generator(device="cuda").manual_seed(out_f + in_f + soft)
    w = torch.randn(out_f, in_f, device="cuda", generator=gen)
    w[::5, ::3] = -0.0
    w[1::9] = torch.tensor([1.5, -1.5, 1.5, -1.5], device="cuda").repeat(in_f // 4)
    mask = transposable_mask24(w, pruned=False)[0]
    beta = torch.tensor(0.8, device="cuda") if soft else None
    s = soft_threshold24(w, mask, beta, out_dtype=BF16) if soft else w.to(BF16) * mask
    if dtype == BF16:
        fwd, bwd = prepare24_cutlass(w, mask, beta)
    else:
        inv_scale = torch.tensor([448.0 / 4.0], device="cuda")
        s, _ = quantize_fp8_with_scale(s, inv_scale)
        fwd, bwd, _ = prepare24_cutlass_fp8(w, mask, beta, inv_scale)
    a, a_t = ops.SparseOperand(*fwd, (out_f, in_f)), ops.SparseOperand(*bwd, (in_f, out_f))
    x = torch.randn(136, in_f, device="cuda", generator=gen).to(dtype)
    dz = torch.randn(136, out_f, device="cuda", generator=gen).to(dtype)
    for out_layout in ("col", "row"):
        _check(ops.mm(a, x, "k", out_layout), s, x, "k", out_layout)
        _check(ops.mm(a_t, dz, "k", out_layout), s.t(), dz, "k", out_layout)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("name", ["cutlass", "cutlass_fp8"])
@pytest.mark.parametrize("method", [sl.STE(transposable=True, mvue=True), sl.SSTE(transposable=True, mvue=True)],
                         ids=["ste_mvue", "sste_mvue"])
def test_gpu_fused_prepare_changes_no_bit_of_the_layer(name, method):
    """The same layer with its weight operands from kernel 22 and from S(W) then CUTLASS's compressor: the same
    bytes, so every output, gradient (and FP8 amax history) equal bit for bit, at the current-scaling first
    step and the delayed steps after it, the weights moving; a forward prepared without the input-gradient
    form (evaluation) writes it on demand, the same bytes."""
    from sparsity_lab.backends.cusparselt.fp8_train import FP8Engine
    from sparsity_lab.backends.cutlass.fp8 import CutlassFP8Backend

    torch.manual_seed(6)
    fused = sl.SparseLinear(512, 256, method=dataclasses.replace(method, backend=name), device="cuda", dtype=BF16)
    plain = copy.deepcopy(fused)
    if name == "cutlass":
        fused.backend = cutlass_backend.CutlassBackend()
        plain.backend = cutlass_backend.CutlassBackend(fused_prepare=False)
    else:
        fused.backend = CutlassFP8Backend(FP8Engine(name, "scaled_mm")).for_layer(fused)
        plain.backend = CutlassFP8Backend(FP8Engine(name, "scaled_mm", fused=False)).for_layer(plain)
    plain.mvue_seed = fused.mvue_seed
    opts = [torch.optim.SGD(layer.parameters(), lr=0.5) for layer in (fused, plain)]
    for layer, opt in zip((fused, plain), opts):
        sl.attach_optimizer(layer, opt)
    for _ in range(4):
        x = torch.randn(192, 512, device="cuda", dtype=BF16)
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        zs = [layer(xi) for layer, xi in zip((fused, plain), xs)]
        assert torch.equal(zs[0], zs[1])
        dz = torch.randn_like(zs[0])
        for z in zs:
            z.backward(dz)
        assert torch.equal(xs[0].grad, xs[1].grad) and torch.equal(fused.weight.grad, plain.weight.grad)
        if name == "cutlass_fp8":
            assert torch.equal(fused.backend.scaling.amax_history, plain.backend.scaling.amax_history)
        for opt in opts:
            opt.step()
            opt.zero_grad()
    if name == "cutlass":
        # each step's forms from kernel 22, or from kernel 24 at the steps that refresh the mask; none from kernel 22
        # on the compressor's path (which refreshes its masks with kernel 24 too, writing no forms)
        assert fused.backend.stats["fused_prepares"] + fused.backend.stats["fused_refreshes"] == 4
        assert fused.backend.stats["fused_refreshes"] == 3 and plain.backend.stats["fused_prepares"] == 0
    with torch.no_grad():
        assert torch.equal(fused(x), plain(x))
    beta = fused.beta if method.soft_threshold else None
    op = fused.backend.prepare_masked(fused.weight.detach(), fused.mask, beta, 2, 4, BF16, backward=False)
    full = fused.backend.prepare_masked(fused.weight.detach(), fused.mask, beta, 2, 4, BF16)
    first, late = fused.backend._compressed(op, False), fused.backend._compressed(op, True)
    assert op.compressed_t is late  # written on demand, after the forward form alone
    for a, b in ((first, fused.backend._compressed(full, False)), (late, fused.backend._compressed(full, True))):
        assert torch.equal(a.values.view(torch.uint8), b.values.view(torch.uint8)) and torch.equal(a.metadata,
                                                                                                    b.metadata)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("name", ["cutlass", "cutlass_fp8"])
@pytest.mark.parametrize("tokens", [200, 1024])
def test_gpu_kernel_23_changes_no_bit_of_the_weight_gradient(name, tokens):
    """dW with MVUE(dZ^T) from kernel 23 and from mvue24, (the cast,) the transposed copy and CUTLASS's compressor:
    equal bit for bit over three steps (200 tokens: padded; FP8: current scaling first, then delayed, the same
    amax history). The unfused FP8 layer runs FP8Engine(fused=False), its weight operands unfused too."""
    from sparsity_lab.backends.cusparselt.fp8_train import FP8Engine
    from sparsity_lab.backends.cutlass.fp8 import CutlassFP8Backend

    torch.manual_seed(7)
    method = sl.STE(transposable=True, mvue=True, backend=name)
    fused = sl.SparseLinear(512, 384, method=method, device="cuda", dtype=BF16)
    plain = copy.deepcopy(fused)
    if name == "cutlass":
        fused.backend = cutlass_backend.CutlassBackend(fused_mvue_compress=True)
        plain.backend = cutlass_backend.CutlassBackend(fused_mvue_compress=False)
    else:
        fused.backend = CutlassFP8Backend(FP8Engine(name, "scaled_mm"), fused_mvue=True).for_layer(fused)
        plain.backend = CutlassFP8Backend(FP8Engine(name, "scaled_mm", fused=False)).for_layer(plain)
    plain.mvue_seed = fused.mvue_seed
    for layer in (fused, plain):
        sl.attach_optimizer(layer, torch.optim.SGD(layer.parameters(), lr=0.0))
    for _ in range(3):
        x = torch.randn(tokens, 512, device="cuda", dtype=BF16)
        zs = [layer(x) for layer in (fused, plain)]
        dz = torch.randn_like(zs[0])
        dz[::9] = -0.0
        for z in zs:
            z.backward(dz)
        assert torch.equal(fused.weight.grad.view(torch.int16), plain.weight.grad.view(torch.int16))
        if name == "cutlass_fp8":
            assert torch.equal(fused.backend.scaling.amax_history, plain.backend.scaling.amax_history)
        for layer in (fused, plain):
            layer.advance_step()
            layer.weight.grad = None
    stats = [layer.backend.stats if name == "cutlass" else layer.backend.engine.stats for layer in (fused, plain)]
    assert stats[0]["fused_mvue_compressions"] == 3 and stats[1]["fused_mvue_compressions"] == 0


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("name", ["cutlass", "cutlass_fp8"])
def test_gpu_fused_refresh_trains_exactly_as_the_separate_kernels(name):
    """A layer refreshing its mask every step (S-STE with MVUE, 1024 -> 4096, bf16, 512 tokens), four steps on the
    real backend with kernel 24 on and off: outputs, masks, flip counts, weights and (FP8: delayed scaling, the
    first step's scale its own amax) the amax history bit for bit, and kernel 24 ran."""
    torch.manual_seed(8)
    method = sl.SSTE(mvue=True, transposable=True, backend=name)
    layers = [sl.SparseLinear(1024, 4096, method=method, device="cuda", dtype=BF16)]
    layers.append(copy.deepcopy(layers[0]))
    layers[1].backend = _refresh_pair(name, None, fused_refresh=False)
    if name == "cutlass_fp8":
        layers[1].backend = layers[1].backend.for_layer(layers[1])
    layers[1].mvue_seed = layers[0].mvue_seed
    opts = [torch.optim.SGD(layer.parameters(), lr=0.5) for layer in layers]
    for layer, opt in zip(layers, opts):
        sl.attach_optimizer(layer, opt)
    gen = torch.Generator(device="cuda").manual_seed(1)
    for k in range(4):
        x = torch.randn(512, 1024, device="cuda", generator=gen).to(BF16)
        dz = torch.randn(512, 4096, device="cuda", generator=gen).to(BF16)
        outs = []
        for layer, opt in zip(layers, opts):
            out = layer(x)
            out.backward(dz)
            opt.step()
            opt.zero_grad()
            outs.append(out.detach())
        a, b = layers
        assert torch.equal(outs[0], outs[1]) and torch.equal(a.mask, b.mask) and torch.equal(a.weight, b.weight), k
        assert (a.last_flips, a.flips_total) == (b.last_flips, b.flips_total), k
        if name == "cutlass_fp8":
            assert torch.equal(a.backend.scaling.amax_history, b.backend.scaling.amax_history), k
    assert a.flips_total > 0 and a.mask_updates == 4
    assert a.backend.stats["fused_refreshes"] >= 3 and b.backend.stats["fused_refreshes"] == 0
