"""The "cusparselt" backend: CPU fallback, clear errors, operand order, algorithm checks, the auto policy.

CPU tests drive the backend through ``FakeCusparselt``, a stand-in that implements the contract of
``torch._cslt_compress`` / ``torch._cslt_sparse_mm`` as read in PyTorch's source (see
``sparsity_lab/backends/cusparselt/ops.py``): it refuses to compress anything that is not 2:4
along its rows, refuses a dense operand that cuSPARSELt would misread, and records every call.
Whether the real library follows that contract on the H100 is what the ``gpu`` tests check.
"""
import json
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsity_lab as sl
from sparsity_lab.backends import available_backends, base
from sparsity_lab.backends.cusparselt.algorithms import (AlgorithmCache, ProductKey, check_product,
                                                         choose_algorithm)
from sparsity_lab.backends.cusparselt.auto import AutoPolicy, ProductShape
from sparsity_lab.backends.cusparselt.backend import (BackendFallbackWarning, CusparseltBackend,
                                                      ReferenceFallback, cusparselt_backend)
from sparsity_lab.backends.cusparselt.ops import (AlgConfig, CusparseltUnavailable, TorchCusparseltOps,
                                                  check_sparse_shape, transposed_view, unavailable_reason)
from benchmarks import cusparselt_probe as probe
from sparsity_lab.layers import SparseLinear
from sparsity_lab.references.cusparselt_layout import decompress24_reference
from sparsity_lab.sparsify import backend_report, format_backend_report


# --- a CPU stand-in for cuSPARSELt ----------------------------------------------------------------------
class FakeCompressed:
    def __init__(self, dense: torch.Tensor) -> None:
        self.dense = dense.clone()


class FakeCusparselt:
    """The documented contract on the CPU. wrong: alg ids whose products are off (``flaky``: only
    on every second call); raises: alg ids that raise; times: ms per alg id."""

    def __init__(self, wrong=(), flaky=(), raises=(), times=None, searched=AlgConfig(0), max_alg=3,
                 search_fails=False):
        self.wrong, self.flaky, self.raises = set(wrong), set(flaky), set(raises)
        self.times = times or {}
        self.searched, self.max_alg, self.search_fails = searched, max_alg, search_fails
        self.calls: list[dict] = []
        self.searches = 0
        self.compressions = 0
        self._last: AlgConfig | None = None
        self._flaky_count = 0

    @staticmethod
    def check_device(t, name):
        pass

    def compress(self, a):
        assert a.dim() == 2 and a.is_contiguous(), "cuSPARSELt compresses a contiguous row-major matrix"
        kept = (a.reshape(a.shape[0], -1, 4) != 0).sum(-1)
        assert bool((kept <= 2).all()), "the operand is not 2:4 along its rows"
        self.compressions += 1
        return FakeCompressed(a)

    def mm(self, c, b, bias, transpose_result, config):
        if isinstance(c, torch.Tensor):  # real compressed bytes (kernel 11 in the interpreter): decode them
            k = b.shape[0]
            c = FakeCompressed(decompress24_reference(c, c.numel() * 16 // 9 // k, k))
        m, k = c.dense.shape
        assert b.shape[0] == k, f"B has {b.shape[0]} rows, the sparse operand {k} columns"
        assert b.is_contiguous() or b.t().is_contiguous(), "cuSPARSELt would misread this strided B"
        if config.alg_id in self.raises:
            raise RuntimeError(f"CUSPARSE_STATUS_NOT_SUPPORTED for alg {config.alg_id}")
        self._last = config
        self.calls.append({"b": b, "b_contiguous": b.is_contiguous(), "transpose_result": transpose_result,
                           "config": config, "m": m, "k": k})
        out = c.dense.float() @ b.float()
        if bias is not None:
            out = out + bias.float()[:, None]
        if config.alg_id in self.wrong:
            out = out + 1.0
        if config.alg_id in self.flaky:
            self._flaky_count += 1
            if self._flaky_count % 2 == 0:
                out[0, 0] += 10.0
        out = out.to(b.dtype)
        return out.t().contiguous() if transpose_result else out

    def search(self, c, b, transpose_result):
        self.searches += 1
        if self.search_fails:
            raise RuntimeError("cusparseLtMatmulSearch failed")
        return self.searched, self.max_alg

    def time_ms(self, fn, reps=5, warmup=1):
        fn()
        return float(self.times.get(self._last.alg_id, 1.0))


def fake_backend(**kwargs) -> tuple[CusparseltBackend, FakeCusparselt]:
    ops = FakeCusparselt(**{k: v for k, v in kwargs.items() if k != "policy"})
    return CusparseltBackend(ops=ops, policy=kwargs.get("policy")), ops


@pytest.fixture
def registry(monkeypatch):
    """A private backend registry: tests register fakes and rebuild backends without leaking."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    monkeypatch.setattr(base, "_INSTANCES", {})
    return base


def _pair(backend_name: str, method_cls, seed=0, in_f=64, out_f=32, dtype=torch.bfloat16, **kwargs):
    layers = []
    for name in (backend_name, "torch"):
        torch.manual_seed(seed)
        layers.append(SparseLinear(in_f, out_f, method=method_cls(backend=name, **kwargs), dtype=dtype))
    return layers


def _fwd_bwd(layer, x0):
    layer.train(False)  # products only: no mask refresh, no optimizer needed
    x = x0.clone().requires_grad_(True)
    out = layer(x)
    out.float().square().sum().backward()
    return out.detach(), x.grad, layer.weight.grad, layer.bias.grad


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


# --- registration and the CPU fallback ------------------------------------------------------------------
def test_registered_lazily():
    assert {"cusparselt", "cusparselt_auto"} <= set(available_backends())
    code = ("import sys, sparsity_lab\n"
            "print(any('cusparselt' in m for m in sys.modules if m.startswith('sparsity_lab')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_without_cuda_the_reference_runs_and_says_so(monkeypatch, registry):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(BackendFallbackWarning, match="no CUDA GPU.*reference backend"):
        layer = SparseLinear(64, 32, method=sl.STE(transposable=True, backend="cusparselt"))
    assert isinstance(layer.backend, ReferenceFallback)
    assert "no CUDA GPU" in layer.backend.fallback_reason
    assert "fallback" in repr(layer)
    rows = backend_report(layer)
    assert rows[0].requested == "cusparselt" and rows[0].fallback_reason == layer.backend.fallback_reason
    assert "FALLBACK" in format_backend_report(rows)


@pytest.mark.parametrize("backend_name", ["cusparselt", "cusparselt_auto"])
@pytest.mark.parametrize("method_cls,kwargs", [(sl.STE, {}), (sl.SSTE, {"mvue": True}), (sl.SRSTE, {"decay": 0.1})])
def test_fallback_equals_the_reference(monkeypatch, registry, backend_name, method_cls, kwargs):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BackendFallbackWarning)
        fb, ref = _pair(backend_name, method_cls, dtype=torch.float32, transposable=True, **kwargs)
    assert isinstance(fb.backend, ReferenceFallback) and fb.backend.requested == backend_name
    x = torch.randn(12, 64)
    for a, b in zip(_fwd_bwd(fb, x), _fwd_bwd(ref, x)):
        assert torch.equal(a, b)


def test_fallback_warning_can_be_made_an_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BackendFallbackWarning)
        with pytest.raises(BackendFallbackWarning):
            cusparselt_backend()


# --- clear errors -----------------------------------------------------------------------------------------
def _fake_gpu(monkeypatch, capability=(9, 0), cusparselt=True):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Old GPU")
    monkeypatch.setattr(torch.backends.cusparselt, "is_available", lambda: cusparselt)


def test_old_gpu_raises_with_the_capability(monkeypatch):
    _fake_gpu(monkeypatch, capability=(7, 5))
    assert "compute capability 7.5" in unavailable_reason()
    with pytest.raises(CusparseltUnavailable, match="compute capability 7.5.*>= 8.0"):
        cusparselt_backend()
    with pytest.raises(CusparseltUnavailable, match="compute capability 7.5"):
        TorchCusparseltOps()


def test_missing_cusparselt_raises(monkeypatch):
    _fake_gpu(monkeypatch, cusparselt=False)
    with pytest.raises(CusparseltUnavailable, match="no cuSPARSELt"):
        cusparselt_backend(auto=True)


def test_usable_gpu_has_no_reason(monkeypatch):
    _fake_gpu(monkeypatch)
    assert unavailable_reason() is None


def test_cpu_tensors_on_the_real_ops_are_refused():
    with pytest.raises(ValueError, match="x is on cpu.*CUDA tensors"):
        TorchCusparseltOps.check_device(torch.zeros(2), "x")


def test_shape_dtype_and_mask_errors():
    backend, _ = fake_backend()
    with pytest.raises(ValueError, match=r"weight \(out_features, in_features\) has shape \(24, 32\).*multiples of 16"):
        backend.mask(torch.randn(24, 32), 2, 4, True)
    with pytest.raises(ValueError, match="transposable=True"):
        backend.mask(torch.randn(32, 32), 2, 4, False)
    with pytest.raises(ValueError, match="n=1, m=4"):
        backend.mask(torch.randn(32, 32), 1, 4, True)
    with pytest.raises(TypeError, match="bfloat16 or float16.*float32.*autocast"):
        backend.prepare(torch.zeros(32, 32))
    with pytest.raises(ValueError, match="has shape \\(32, 40\\)"):
        backend.prepare(torch.zeros(32, 40, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="multiples of 32"):
        check_sparse_shape(32, 48, torch.float8_e4m3fn, "the fp8 weight")
    with pytest.raises(TypeError, match="dtype in"):
        check_sparse_shape(32, 32, torch.float32, "w")


def test_layer_construction_reports_the_shape_error(registry):
    base.register_backend("cusparselt_fake", lambda: fake_backend()[0])
    with pytest.raises(ValueError, match="multiples of 16"):
        SparseLinear(40, 32, method=sl.STE(transposable=True, backend="cusparselt_fake"))
    with pytest.raises(ValueError, match="transposable=True"):
        SparseLinear(64, 32, method=sl.STE(backend="cusparselt_fake"))


# --- operand order, layouts, copies (the stand-in's contract) ----------------------------------------------
def _masked_weight(backend, out_f=32, in_f=64, dtype=torch.bfloat16):
    w = torch.randn(out_f, in_f)
    return backend.sparse_weight(w, backend.mask(w, 2, 4, True), None, 2, 4).to(dtype)


def test_products_use_views_of_the_inputs_and_transpose_result():
    backend, ops = fake_backend()
    sw = _masked_weight(backend)
    op = backend.prepare(sw)
    x, dz = torch.randn(32, 64, dtype=torch.bfloat16), torch.randn(32, 32, dtype=torch.bfloat16)
    z = backend.linear(x, op, None)
    fwd = ops.calls[-1]
    assert fwd["b"].data_ptr() == x.data_ptr() and not fwd["b_contiguous"] and fwd["transpose_result"]
    assert (fwd["m"], fwd["k"]) == (32, 64) and z.shape == (32, 32) and z.is_contiguous()
    dx = backend.grad_input(dz, op)
    bwd = ops.calls[-1]
    assert bwd["b"].data_ptr() == dz.data_ptr() and not bwd["b_contiguous"] and bwd["transpose_result"]
    assert (bwd["m"], bwd["k"]) == (64, 32) and dx.shape == (32, 64) and dx.is_contiguous()
    gen = torch.Generator().manual_seed(3)
    dw = backend.grad_weight(dz, x, True, gen)
    wgt = ops.calls[-1]
    assert wgt["b"].data_ptr() == x.data_ptr() and wgt["b_contiguous"] and not wgt["transpose_result"]
    assert (wgt["m"], wgt["k"]) == (32, 32) and dw.shape == (32, 64)
    assert backend.stats["copies"] == 0 and backend.stats["padded_calls"] == 0
    # CPU tensors: no Triton compressor, so _cslt_compress (the stand-in) on contiguous copies of
    # the transposed views S(W)^T (and MVUE(dZ)^T where the reference leaves it strided), counted
    assert backend.stats["slow_compressions"] == 3 and 1 <= backend.stats["compress_copies"] <= 2
    assert backend.summary()["slow_compress_reasons"] == {"not a CUDA tensor": 3}
    torch.testing.assert_close(z.float(), x.float() @ sw.float().t(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(dx.float(), dz.float() @ sw.float(), rtol=1e-2, atol=1e-2)


def test_odd_tokens_are_padded_and_strided_inputs_copied():
    backend, ops = fake_backend()
    sw = _masked_weight(backend)
    op = backend.prepare(sw)
    x = torch.randn(64, 21, dtype=torch.bfloat16).t()  # (21, 64), not contiguous
    z = backend.linear(x, op, None)
    assert ops.calls[-1]["b"].shape == (64, 32)  # 21 tokens padded to 32
    assert backend.stats["padded_calls"] == 1 and backend.stats["copies"] == 0  # the pad made it contiguous
    torch.testing.assert_close(z.float(), x.float() @ sw.float().t(), rtol=1e-2, atol=1e-2)
    b, copied = transposed_view(torch.randn(8, 4).t())
    assert copied and b.t().is_contiguous()


@pytest.mark.parametrize("method_cls,kwargs", [
    (sl.STE, {}), (sl.SRSTE, {"decay": 0.05}), (sl.MaskedDecay, {"decay": 0.05, "total_steps": 10}),
    (sl.SSTE, {}), (sl.SSTE, {"mvue": True}),
])
def test_layer_matches_the_reference(registry, method_cls, kwargs):
    base.register_backend("cusparselt_fake", lambda: fake_backend()[0])
    cs, ref = _pair("cusparselt_fake", method_cls, transposable=True, **kwargs)
    assert torch.equal(cs.mask, ref.mask)
    x = torch.randn(32, 64, dtype=torch.bfloat16)  # 32 tokens: no padding, so MVUE draws match the reference
    got, want = _fwd_bwd(cs, x), _fwd_bwd(ref, x)
    for name, a, b in zip(("output", "grad_input", "grad_weight", "grad_bias"), got, want):
        assert _rel(a, b) < 1e-2, name
    cs.apply_masked_decay()
    ref.apply_masked_decay()
    assert _rel(cs.weight.grad, ref.weight.grad) < 1e-2


@pytest.mark.parametrize("tokens", [20, 33])
def test_layer_with_odd_tokens_matches_the_reference(registry, tokens):
    base.register_backend("cusparselt_fake", lambda: fake_backend()[0])
    cs, ref = _pair("cusparselt_fake", sl.SRSTE, transposable=True, decay=0.05)
    x = torch.randn(tokens, 64, dtype=torch.bfloat16)
    for name, a, b in zip(("output", "grad_input", "grad_weight", "grad_bias"), _fwd_bwd(cs, x), _fwd_bwd(ref, x)):
        assert a.shape == b.shape and _rel(a, b) < 1e-2, name
    assert cs.backend.stats["padded_calls"] == 2  # forward and input gradient; dW dense (no MVUE)


def test_operand_compressed_once_per_optimizer_step(registry):
    backend, ops = fake_backend()
    base.register_backend("cusparselt_fake", lambda: backend)
    layer = SparseLinear(64, 32, method=sl.STE(transposable=True, backend="cusparselt_fake"), dtype=torch.bfloat16)
    opt = torch.optim.SGD(layer.parameters(), lr=0.01)
    sl.attach_optimizer(layer, opt)
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    for _ in range(3):  # three gradient-accumulation micro-steps
        layer(x).sum().backward()
    assert backend.stats["compressions"] == 2  # S(W) and S(W)^T, once
    opt.step()
    layer(x).sum().backward()
    assert backend.stats["compressions"] == 4
    # the library also compressed one synthetic operand per algorithm search (2 keys: forward, input grad)
    assert len(backend.algorithms.choices) == 2 and ops.compressions == 4 + 2


@pytest.mark.triton
@pytest.mark.parametrize("method_cls,kwargs", [(sl.STE, {}), (sl.SSTE, {"mvue": True})])
def test_fused_prepare_writes_both_operands_in_one_pass(registry, monkeypatch, method_cls, kwargs):
    """Kernel 11 (run by the interpreter on these CPU tensors): one pass per step writes S(W) and
    S(W)^T, the dense S(W) is never built, and the layer still matches the reference."""
    from sparsity_lab.backends.cusparselt import operand

    monkeypatch.setattr(operand, "_triton_device", lambda t: True)
    backend, ops = fake_backend()
    base.register_backend("cusparselt_fake", lambda: backend)
    cs, ref = _pair("cusparselt_fake", method_cls, in_f=128, out_f=64, transposable=True, **kwargs)
    x, dz = torch.randn(64, 128, dtype=torch.bfloat16), torch.randn(64, 64, dtype=torch.bfloat16)
    grads = []
    for layer in (cs, ref):  # a fixed dZ: MVUE then draws alike whatever the last ulp of the output
        layer.train(False)
        xi = x.clone().requires_grad_(True)
        out = layer(xi)
        out.backward(dz)
        grads.append((out.detach(), xi.grad, layer.weight.grad))
    for name, a, b in zip(("output", "grad_input", "grad_weight"), *grads):
        assert _rel(a, b) < 1e-2, name
    assert backend.stats["fused_prepares"] == 1 and backend.stats["fast_compressions"] >= 2
    operand = cs.operand_cache.value
    assert operand.compressed is not None and operand.compressed_t is not None
    assert operand._weight is None, "no dense product ran, so the dense S(W) must not have been made"
    torch.testing.assert_close(operand.weight.float(), cs.sparse_weight().to(torch.bfloat16).float())


@pytest.mark.triton
@pytest.mark.parametrize("method", [sl.SSTE(mvue=True, transposable=True), sl.SRSTE(decay=0.05, transposable=True)])
def test_fused_refresh_trains_exactly_as_the_separate_kernels(registry, monkeypatch, method):
    """Kernel 21 against kernels 2, 9 and 11 (all run by the interpreter on these CPU tensors) in a layer that
    refreshes its mask every step: masks, flip counts, outputs, gradients, weights and the state dict are the
    same to the bit at every step, and a run resumed from the fused run's checkpoint continues it exactly."""
    from sparsity_lab.backends.cusparselt import operand
    from _refresh_testing import assert_trains_exactly_as_the_separate_calls

    monkeypatch.setattr(operand, "_triton_device", lambda t: True)
    backends = {"fused": CusparseltBackend(ops=FakeCusparselt()),
                "separate": CusparseltBackend(ops=FakeCusparselt(), fused_refresh=False)}
    for name, backend in backends.items():
        base.register_backend(f"cusparselt_{name}", lambda backend=backend: backend)

    def counted():
        # kernel 21: the first mask (mask only, at construction), then mask and operands at steps 1 and 2
        assert backends["fused"].stats["fused_refreshes"] == 3 and backends["separate"].stats["fused_refreshes"] == 0
        assert backends["separate"].stats["fused_prepares"] == 3  # kernel 11 after every refresh and the first step
    assert_trains_exactly_as_the_separate_calls(method, "cusparselt_fused", "cusparselt_separate", counted)


# --- algorithm choice --------------------------------------------------------------------------------------
def test_check_product():
    ref = torch.randn(64, 48)
    out = ref.to(torch.bfloat16)
    ok, rel = check_product(out, ref, torch.bfloat16)
    assert ok and rel < 4e-3
    bad = out.clone()
    bad[3, 5] = bad[3, 5] * 1.1 + 0.5
    assert not check_product(bad, ref, torch.bfloat16)[0]
    assert check_product(out[:, :47], ref, torch.bfloat16) == (False, math.inf)
    nan = out.clone()
    nan[0, 0] = float("nan")
    assert not check_product(nan, ref, torch.bfloat16)[0]


def _cache(**kwargs) -> tuple[AlgorithmCache, FakeCusparselt]:
    ops = FakeCusparselt(**kwargs)
    return AlgorithmCache(ops), ops


KEY = ProductKey(32, 64, 48, torch.bfloat16, True, True)


def test_fastest_correct_algorithm_wins_and_is_cached():
    cache, ops = _cache(wrong={2}, times={0: 3.0, 1: 1.0, 2: 0.5, 3: 2.0}, searched=AlgConfig(2))
    assert cache.get(KEY, torch.device("cpu")) == AlgConfig(1)
    choice = cache.choices[KEY]
    assert choice.searched == AlgConfig(2) and "alg 2" in choice.summary()["wrong"]
    cache.get(KEY, torch.device("cpu"))
    assert ops.searches == 1


def test_intermittently_wrong_and_raising_algorithms_are_excluded():
    cache, _ = _cache(flaky={1}, raises={3}, times={0: 2.0, 1: 0.5, 2: 1.5, 3: 0.1})
    assert cache.get(KEY, torch.device("cpu")) == AlgConfig(2)
    summary = cache.choices[KEY].summary()
    assert "alg 1" in summary["wrong"] and "alg 3" in summary["raised"]


@settings(max_examples=40, deadline=None)
@given(times=st.lists(st.floats(0.01, 10.0), min_size=4, max_size=4),
       wrong=st.sets(st.integers(0, 3), max_size=3), raising=st.sets(st.integers(0, 3), max_size=3))
def test_choice_is_the_fastest_correct_candidate(times, wrong, raising):
    """Property: never a wrong or raising id; among the rest, the fastest (ties: the first tried)."""
    raising -= wrong
    if wrong | raising == {0, 1, 2, 3}:
        raising.discard(min(raising))  # keep one candidate alive
    cache, _ = _cache(wrong=wrong, raises=raising, times=dict(enumerate(times)))
    chosen = cache.get(KEY, torch.device("cpu")).alg_id
    alive = [i for i in range(4) if i not in wrong | raising]
    assert chosen in alive and times[chosen] == min(times[i] for i in alive)


def test_failed_search_falls_back_to_the_sweep_and_says_so():
    cache, _ = _cache(search_fails=True, times={0: 2.0, 1: 1.0})
    assert cache.get(KEY, torch.device("cpu")) == AlgConfig(1)
    summary = cache.choices[KEY].summary()
    assert summary["searched"] is None and "cusparseLtMatmulSearch failed" in summary["search_error"]


def test_no_correct_algorithm_raises():
    cache, _ = _cache(wrong={0, 1, 2, 3})
    with pytest.raises(RuntimeError, match="no cuSPARSELt algorithm gave a correct product"):
        cache.get(KEY, torch.device("cpu"))


def test_choose_algorithm_validates_repeats():
    with pytest.raises(ValueError, match="repeats"):
        choose_algorithm([AlgConfig(0)], lambda c: torch.zeros(1), torch.zeros(1), lambda c: 1.0,
                         torch.bfloat16, KEY, repeats=0)


# --- the auto policy ---------------------------------------------------------------------------------------
def test_policy_chooses_by_measured_ratio_and_caches():
    timings = {"forward": (3.0, 2.0), "grad_input": (2.0, 2.5)}
    calls = []

    def measure(shape):
        calls.append(shape)
        return timings[shape.product]

    policy = AutoPolicy(measure)
    fwd = ProductShape.of_layer("forward", 4096, 1024, 8192, "bfloat16")
    gi = ProductShape.of_layer("grad_input", 4096, 1024, 8192, "bfloat16")
    assert policy.decide(fwd).sparse and policy.decide(fwd).speedup == pytest.approx(1.5)
    assert not policy.decide(gi).sparse
    assert len(calls) == 2
    assert (gi.m, gi.k, gi.n) == (1024, 4096, 8192) and gi.weight_shape() == (4096, 1024)
    gw = ProductShape.of_layer("grad_weight", 4096, 1024, 8192, "bfloat16")
    assert (gw.m, gw.k, gw.n, gw.tokens) == (4096, 8192, 1024, 8192) and gw.weight_shape() == (4096, 1024)
    strict = AutoPolicy(measure, min_speedup=1.6)
    assert not strict.decide(fwd).sparse
    table = policy.table()
    assert "1.50x" in table and "0.80x" in table


def test_policy_unsupported_shapes_are_dense_unmeasured():
    policy = AutoPolicy(lambda s: pytest.fail("must not measure"))
    d = policy.decide(ProductShape("forward", 40, 32, 16, "bfloat16"),
                      unsupported="shape (40, 32) is not a multiple of 16")
    assert not d.sparse and d.speedup is None and "multiple of 16" in d.describe()


def test_policy_errors():
    with pytest.raises(RuntimeError, match="no measure function"):
        AutoPolicy().decide(ProductShape("forward", 16, 16, 16, "bfloat16"))
    with pytest.raises(ValueError, match="sparse_ms=0"):
        AutoPolicy(lambda s: (1.0, 0)).decide(ProductShape("forward", 16, 16, 16, "bfloat16"))
    with pytest.raises(ValueError, match="dense_ms=nan"):
        AutoPolicy(lambda s: (math.nan, 1.0)).decide(ProductShape("forward", 16, 16, 16, "bfloat16"))
    with pytest.raises(ValueError, match="min_speedup"):
        AutoPolicy(min_speedup=0)
    with pytest.raises(ValueError, match="product must be one of"):
        ProductShape("backward", 16, 16, 16, "bfloat16")
    with pytest.raises(ValueError, match="m must be a positive int"):
        ProductShape("forward", 0, 16, 16, "bfloat16")


def test_auto_backend_runs_what_was_chosen_and_reports_it(registry):
    speed = {"forward": (3.0, 2.0), "grad_input": (2.0, 2.5), "grad_weight": (2.0, 1.0)}
    policy = AutoPolicy(lambda s: speed[s.product])
    backend, ops = fake_backend(policy=policy)
    base.register_backend("cusparselt_fake_auto", lambda: backend)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        SparseLinear(64, 32, method=sl.SSTE(transposable=True, mvue=True, backend="cusparselt_fake_auto"),
                     dtype=torch.bfloat16),
        SparseLinear(32, 40, method=sl.STE(transposable=True, backend="cusparselt_fake_auto"),
                     dtype=torch.bfloat16),  # 40 outputs: below cuSPARSELt's multiple, auto runs it dense
    )
    torch.manual_seed(0)
    ref = torch.nn.Sequential(
        SparseLinear(64, 32, method=sl.SSTE(transposable=True, mvue=True), dtype=torch.bfloat16),
        SparseLinear(32, 40, method=sl.STE(transposable=True), dtype=torch.bfloat16),
    )
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    for net in (model, ref):
        net.train(False)
    outs = []
    for net in (model, ref):
        xx = x.clone().requires_grad_(True)
        out = net(xx)
        out.float().square().sum().backward()
        outs.append((out, xx.grad, net[0].weight.grad, net[1].weight.grad))
    for a, b in zip(*outs):
        assert _rel(a, b) < 1e-2
    products = [(c["m"], c["k"]) for c in ops.calls]
    assert (32, 64) in products  # layer 0 forward: sparse
    assert (64, 32) not in products  # layer 0 input gradient: measured slower, dense
    assert (32, 32) in products  # layer 0 MVUE weight gradient: sparse
    assert all(m != 40 and k != 40 for m, k in products)  # layer 1: never sparse
    rows = {r.name: r for r in backend_report(model)}
    assert rows["0"].products["forward"].startswith("sparse 1.50x")
    assert rows["0"].products["grad_input"].startswith("dense 0.80x")
    assert rows["0"].products["grad_weight"].startswith("sparse 2.00x")
    assert "not a multiple of 16" in rows["1"].products["forward"]
    assert rows["1"].products["grad_weight"] == "dense dZ^T X"
    assert "runs 'cusparselt_auto'" in format_backend_report(list(rows.values()))


def test_fixed_policy_report(registry):
    base.register_backend("cusparselt_fake", lambda: fake_backend()[0])
    layer = SparseLinear(64, 32, method=sl.SSTE(transposable=True, mvue=True, backend="cusparselt_fake"))
    row = backend_report(layer)[0]
    assert row.running == "cusparselt" and row.fallback_reason is None
    assert row.products["forward"] == "sparse" and row.products["grad_weight"].startswith("sparse (MVUE")


# --- the probe script on the CPU -----------------------------------------------------------------------------
def test_probe_dry_run_writes_json(tmp_path, capsys):
    out = tmp_path / "probe.json"
    assert probe.main(["--dry-run", "--out", str(out), "--tokens", "4096", "--parts", "timings,compress_speed"]) == 0
    data = json.loads(out.read_text())
    assert data["provenance"]["command"] and "torch" in data["provenance"]
    assert data["args"]["tokens"] == 4096 and data["plan"]["tokens"] == 4096
    assert set(data["parts"]) == {"timings", "compress_speed"}
    assert all(p["status"] == "skipped" for p in data["parts"].values())
    assert "[timings] skipped" in capsys.readouterr().out


def test_probe_out_directory(tmp_path):
    assert probe.out_path(str(tmp_path)) == tmp_path / "cusparselt_probe.json"
    assert probe.main(["--dry-run", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "cusparselt_probe.json").exists()


def test_probe_without_gpu_records_the_error(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "p.json"
    assert probe.main(["--out", str(out)]) == 2
    assert "needs a CUDA GPU" in json.loads(out.read_text())["error"]


@pytest.mark.parametrize("argv", [["--parts", "bogus"], ["--d-model", "1000"], ["--reps", "0"], ["--parts", ","]])
def test_probe_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        probe.parse_args(argv)
    assert exc.value.code == 2
    assert "--" in capsys.readouterr().err


def test_probe_parts_are_isolated():
    ctx = probe.Context(probe.parse_args(["--dry-run"]))

    def boom(_ctx):
        raise RuntimeError("cuSPARSELt exploded")

    results = probe.run_parts({"a": boom, "b": lambda _ctx: {"value": 1}}, ctx)
    assert results["a"]["status"] == "error" and "cuSPARSELt exploded" in results["a"]["error"]
    assert "Traceback" in results["a"]["traceback"]
    assert results["b"] == {"label": "b", "status": "ok", "value": 1}
    ctx.args.budget_s = 1e-9
    assert probe.run_parts({"c": lambda _ctx: {}}, ctx)["c"]["status"] == "skipped"
    table = probe.table({"parts": results})
    assert "[a] error" in table and "[b] ok" in table


# --- GPU: the real library (on a GPU machine: pytest -m gpu tests/test_cusparselt_backend.py) ----------------
@pytest.mark.gpu
def test_real_contract_transpose_result_and_transposed_b():
    from benchmarks.cusparselt_probe import _random_24
    a, _ = _random_24(64, 128, torch.bfloat16)
    y = torch.randn(48, 128, device="cuda", dtype=torch.bfloat16)  # B = y.t(): (128, 48), not contiguous
    c = torch._cslt_compress(a)
    assert c.numel() == 64 * 128 * 9 // 16
    ref = a.float() @ y.float().t()
    d = torch._cslt_sparse_mm(c, y.t())
    dt = torch._cslt_sparse_mm(c, y.t(), transpose_result=True)
    assert d.shape == (64, 48) and dt.shape == (48, 64) and dt.is_contiguous()
    assert check_product(d, ref, torch.bfloat16)[0] and check_product(dt, ref.t(), torch.bfloat16)[0]
    bias = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    db = torch._cslt_sparse_mm(c, y.t(), bias=bias, transpose_result=True)
    assert check_product(db, (ref + bias.float()[:, None]).t(), torch.bfloat16)[0]


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [512, 1000])
def test_real_products_match_dense(tokens):
    backend = CusparseltBackend(sweep=False)
    w = torch.randn(256, 512, device="cuda")
    sw = backend.sparse_weight(w, backend.mask(w, 2, 4, True), None, 2, 4).to(torch.bfloat16)
    op = backend.prepare(sw)
    x = torch.randn(tokens, 512, device="cuda", dtype=torch.bfloat16)
    dz = torch.randn(tokens, 256, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    assert check_product(backend.linear(x, op, bias), x.float() @ sw.float().t() + bias.float(), torch.bfloat16)[0]
    assert check_product(backend.grad_input(dz, op), dz.float() @ sw.float(), torch.bfloat16)[0]
    gens = [torch.Generator(device="cuda").manual_seed(5) for _ in range(2)]
    dw = backend.grad_weight(dz, x, True, gens[0])
    rows = -(-tokens // 16) * 16
    pad = torch.nn.functional.pad
    mv = backend.mvue_tokens_major(pad(dz, (0, 0, 0, rows - tokens)), gens[1])
    assert check_product(dw, mv.float().t() @ pad(x, (0, 0, 0, rows - tokens)).float(), torch.bfloat16)[0]
    for choice in backend.algorithms.choices.values():
        assert choice.rel_err < 1e-2


GPU_METHODS = [
    (sl.STE, {}, "torch"), (sl.SRSTE, {"decay": 0.05}, "torch"),
    (sl.MaskedDecay, {"decay": 0.05, "total_steps": 10}, "torch"), (sl.SSTE, {}, "torch"),
    (sl.SSTE, {"mvue": True}, "triton"),  # the same MVUE draws as the Triton backend
]


@pytest.mark.gpu
@pytest.mark.parametrize("method_cls,kwargs,reference", GPU_METHODS)
@pytest.mark.parametrize("tokens", [1024, 1000])
def test_real_layer_matches_reference_under_autocast(method_cls, kwargs, reference, tokens):
    layers = []
    for name in ("cusparselt", reference):
        torch.manual_seed(0)
        layers.append(SparseLinear(512, 256, method=method_cls(transposable=True, backend=name, **kwargs),
                                   device="cuda"))
    cs, ref = layers
    ref.mask.copy_(cs.mask)  # float ties may choose another optimal pattern: compare the products
    x0 = torch.randn(tokens, 512, device="cuda")
    # a fixed dZ: MVUE's draws flip with the last bit of dZ, so a dZ made from the output (which the
    # two backends round differently) would give the two layers different draws
    dz = torch.randn(tokens, 256, device="cuda")
    results = []
    for layer in layers:
        layer.train(False)
        x = x0.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(x)
        (out.float() * dz).sum().backward()
        layer.apply_masked_decay()
        results.append((out, x.grad, layer.weight.grad, layer.bias.grad))
    for name, a, b in zip(("output", "grad_input", "grad_weight", "grad_bias"), *results):
        assert _rel(a, b) < 1e-2, name


@pytest.mark.gpu
def test_real_training_follows_the_reference():
    """200 steps of a small MLP: the cusparselt run stays within the seed-to-seed spread of the reference."""
    def run(backend, seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda()
        sl.sparsify(model, sl.STE(transposable=True, backend=backend), select="all")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        sl.attach_optimizer(model, opt)
        gen = torch.Generator(device="cuda").manual_seed(123)
        target = torch.nn.Linear(256, 256).cuda().requires_grad_(False)
        losses = []
        for _ in range(200):
            x = torch.randn(512, 256, device="cuda", generator=gen)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = (model(x).float() - target(x)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return torch.tensor(losses)

    ref_a, ref_b, cs = run("torch", 0), run("torch", 1), run("cusparselt", 0)
    spread = (ref_a[-50:].mean() - ref_b[-50:].mean()).abs()
    assert cs[-1] < 0.5 * cs[0]  # it trains
    assert (cs[-50:].mean() - ref_a[-50:].mean()).abs() <= max(2 * spread, 0.05 * ref_a[-50:].mean())


@pytest.mark.gpu
def test_fused_mvue_compress_gives_the_same_weight_gradient_on_gpu():
    """Kernel 10 in place of MVUE + compress24: the same draws and bytes, so the same dW, bit for bit."""
    from sparsity_lab.backends.cusparselt.backend import CusparseltBackend

    torch.manual_seed(0)
    dz = torch.randn(4096, 1024, device="cuda").to(torch.bfloat16)
    x = torch.randn(4096, 512, device="cuda").to(torch.bfloat16)
    plain, fused = CusparseltBackend(fused_mvue_compress=False), CusparseltBackend(fused_mvue_compress=True)
    fused.algorithms = plain.algorithms  # one algorithm choice: the products must then agree bit for bit
    a = plain.grad_weight(dz, x, True, torch.Generator().manual_seed(5))
    b = fused.grad_weight(dz, x, True, torch.Generator().manual_seed(5))
    assert fused.stats["fused_mvue_compressions"] == 1 and plain.stats["fused_mvue_compressions"] == 0
    assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("soft", [False, True])
def test_fused_prepare_gives_the_same_products_on_gpu(soft):
    """Kernel 11's operand against prepare(sparse_weight_as(...)) at an FFN size, fp32 master weights:
    the same compressed bytes, so (one algorithm choice) the same forward and input gradient, bit for bit."""
    from sparsity_lab.backends.cusparselt.backend import CusparseltBackend

    torch.manual_seed(0)
    w = torch.randn(1024, 4096, device="cuda")
    x = torch.randn(512, 4096, device="cuda").to(torch.bfloat16)
    dz = torch.randn(512, 1024, device="cuda").to(torch.bfloat16)
    plain, fused = CusparseltBackend(fused_prepare=False), CusparseltBackend(fused_prepare=True)
    fused.algorithms = plain.algorithms
    mask = plain.mask(w, 2, 4, True)
    beta = torch.tensor(0.9, device="cuda") if soft else None
    a = plain.prepare(plain.sparse_weight_as(w, mask, beta, 2, 4, torch.bfloat16))
    b = fused.prepare_masked(w, mask, beta, 2, 4, torch.bfloat16)
    assert torch.equal(plain.linear(x, a, None), fused.linear(x, b, None))
    assert torch.equal(plain.grad_input(dz, a), fused.grad_input(dz, b))
    assert fused.stats["fused_prepares"] == 1 and b._weight is None


@pytest.mark.gpu
@pytest.mark.parametrize("method", [sl.SSTE(mvue=True, transposable=True), sl.STE(transposable=True)])
def test_fused_refresh_trains_exactly_as_the_separate_kernels_on_gpu(registry, method):
    """The lab GPT's FFN up projection (4096 -> 16384, bf16 weights, 2048 tokens), four steps with the mask
    refreshed every step: kernel 21 against kernels 2, 9 and 11 on the real backend (one algorithm choice):
    outputs, masks, flip counts and weights bit for bit, and kernel 21 ran (mask alone at construction, then
    mask and both operands at every refresh)."""
    import dataclasses

    fused, separate = CusparseltBackend(), CusparseltBackend(fused_refresh=False)
    separate.algorithms = fused.algorithms
    runs = []
    for name, backend in (("fused", fused), ("separate", separate)):
        base.register_backend(f"cusparselt_{name}", lambda backend=backend: backend)
        torch.manual_seed(0)
        layer = SparseLinear(4096, 16384, method=dataclasses.replace(method, backend=f"cusparselt_{name}"),
                             device="cuda", dtype=torch.bfloat16)
        opt = torch.optim.SGD(layer.parameters(), lr=1e-4)
        sl.attach_optimizer(layer, opt)
        runs.append((layer, opt))
    gen = torch.Generator(device="cuda").manual_seed(1)
    for k in range(4):
        x = torch.randn(2048, 4096, device="cuda", generator=gen).to(torch.bfloat16)
        dz = torch.randn(2048, 16384, device="cuda", generator=gen).to(torch.bfloat16)
        outs = []
        for layer, opt in runs:
            out = layer(x)
            out.backward(dz)
            opt.step()
            opt.zero_grad()
            outs.append(out.detach())
        (a, _), (b, _) = runs
        assert torch.equal(outs[0], outs[1]) and torch.equal(a.mask, b.mask) and torch.equal(a.weight, b.weight), k
        assert (a.last_flips, a.flips_total) == (b.last_flips, b.flips_total), k
    assert a.flips_total > 0 and a.mask_updates == 4
    assert fused.stats["fused_refreshes"] == 4 and separate.stats["fused_refreshes"] == 0


# --- the auto policy's timing mode (eager or CUDA graph), each with its own decisions ---------------------
def test_timing_modes_keep_their_own_decisions(registry):
    seen = []

    def measure(shape):
        seen.append(shape.product)
        return (1.0, 2.0) if len(seen) == 1 else (2.0, 1.0)  # eager: dense wins; graph: sparse wins
    backend, _ = fake_backend(policy=AutoPolicy(measure))
    assert backend.timing == "eager"
    assert backend._sparse("forward", 32, 64, 32, torch.bfloat16) is False
    backend.timing = "graph"
    assert backend._sparse("forward", 32, 64, 32, torch.bfloat16) is True  # measured again, in its own mode
    assert backend.policy.min_speedup == 1.0 and "in a CUDA graph" in backend.policy.decisions[0].reason
    backend.timing = "eager"
    assert backend._sparse("forward", 32, 64, 32, torch.bfloat16) is False  # the eager decision, not re-measured
    assert seen == ["forward", "forward"]
    timings = sorted((d["timing"], d["sparse"]) for d in backend.summary()["decisions"])
    assert timings == [("eager", False), ("graph", True)]
    with pytest.raises(ValueError, match="timing must be 'eager' or 'graph', got 'fast'"):
        backend.timing = "fast"


def test_graph_timing_switches_auto_backends_and_restores_them(registry):
    from sparsity_lab.graph_step import graph_timing
    auto, _ = fake_backend(policy=AutoPolicy(lambda s: (1.0, 1.0)))
    plain, _ = fake_backend()
    base.register_backend("cusparselt_fake_auto", lambda: auto)
    base.register_backend("cusparselt_fake", lambda: plain)
    model = torch.nn.Sequential(
        SparseLinear(64, 32, method=sl.STE(transposable=True, backend="cusparselt_fake_auto"), dtype=torch.bfloat16),
        SparseLinear(32, 64, method=sl.STE(transposable=True, backend="cusparselt_fake"), dtype=torch.bfloat16))
    with graph_timing(model):
        assert auto.timing == "graph"
        assert plain.timing == "eager"  # no policy: nothing to time
    assert auto.timing == "eager"
