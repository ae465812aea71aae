""""sparse_auto": per product dense, cuSPARSELt or CUTLASS, chosen by measurement (``backends/sparse_auto.py``).

CPU: the policy's choice among libraries from injected timings (per product and per layer), the cost of each
plan across libraries, the backend running what it chose (cuSPARSELt and CUTLASS calls computed densely by
stand-ins, against the reference layer), its report naming the library and the speed-up, and a machine
without CUTLASS, where it chooses among what is there and says so.

GPU (``pytest -m gpu``, Hopper for CUTLASS): the measurements themselves, and layers trained through each
library's products against the reference.
"""
from __future__ import annotations

import math

import pytest
import torch

import sparsity_lab as sl
from sparsity_lab.backends.cusparselt.auto import AutoPolicy, ProductShape
from sparsity_lab.backends.cusparselt.layer_plan import (LayerShape, LayerTimes, LibraryLayerTimes, LibraryTimes,
                                                         choose_plan, plan_name)
from sparsity_lab.backends.cutlass import ops as cutlass_ops
from sparsity_lab.backends.cutlass.backend import CutlassBackend, product_problem
from sparsity_lab.backends.sparse_auto import SparseAutoBackend
from sparsity_lab.layers import SparseLinear
from sparsity_lab.sparsify import backend_report

from test_cusparselt_backend import FakeCusparselt, _rel, registry  # noqa: F401  (registry: a fixture)
from test_cutlass_backend import _DenseStandIn

BF16 = torch.bfloat16
GW = ProductShape("grad_weight", 4096, 8192, 1024, "bfloat16")
LAYER = LayerShape(4096, 1024, 8192, "bfloat16")


# --- the choice among libraries, per product --------------------------------------------------------------------
def test_the_fastest_library_is_chosen_where_it_beats_dense_and_named_with_every_speedup():
    d = AutoPolicy(lambda s: {"dense": 2.0, "cusparselt": 1.6, "cutlass": 1.25}).decide(GW)
    assert d.sparse and d.library == "cutlass" and d.runs_on == "cutlass"
    assert (d.dense_ms, d.sparse_ms, d.speedup) == (2.0, 1.25, pytest.approx(1.6))
    assert d.describe() == "sparse on cutlass 1.60x @8192 tokens [cusparselt 1.25x, cutlass 1.60x]"
    d = AutoPolicy(lambda s: {"dense": 2.0, "cusparselt": 1.6, "cutlass": 1.7}).decide(GW)
    assert d.runs_on == "cusparselt" and d.speedup == pytest.approx(1.25)


def test_dense_wins_below_min_speedup_and_the_fastest_library_is_still_reported():
    d = AutoPolicy(lambda s: {"dense": 2.0, "cusparselt": 2.1, "cutlass": 1.9}, min_speedup=1.1).decide(GW)
    assert not d.sparse and d.runs_on == "dense" and d.library == "cutlass"
    assert d.describe() == "dense 1.05x @8192 tokens [cusparselt 0.95x, cutlass 1.05x]"


def test_a_library_that_cannot_run_the_shape_is_reported_and_not_measured():
    measured = []

    def measure(shape):
        measured.append(shape)
        return {"dense": 2.0, "cusparselt": 1.5}
    policy = AutoPolicy(measure)
    d = policy.decide(GW, excluded={"cutlass": "n (B's rows) must be a multiple of 8"})
    assert d.runs_on == "cusparselt" and d.excluded == (("cutlass", "n (B's rows) must be a multiple of 8"),)
    assert d.describe().endswith("; cutlass cannot run it: n (B's rows) must be a multiple of 8")
    assert policy.decide(GW) is d and measured == [GW]  # once per shape
    no_one = policy.decide(ProductShape("grad_weight", 40, 16, 36, "bfloat16"), "cusparselt: not 16; cutlass: not 8",
                           {"cusparselt": "not 16", "cutlass": "not 8"})
    assert no_one.runs_on == "dense" and no_one.speedup is None and len(measured) == 1


@pytest.mark.parametrize("times,match", [({"cutlass": 1.0}, "expected ms for 'dense'"),
                                         ({"dense": 1.0}, "at least one library"),
                                         ({"dense": 1.0, "cutlass": math.nan}, "cutlass ms=nan")])
def test_bad_library_timings_are_refused(times, match):
    with pytest.raises(ValueError, match=match):
        AutoPolicy(lambda s: times).decide(GW)


# --- the layer plan across libraries -------------------------------------------------------------------------------
def _libraries(**changes) -> LibraryLayerTimes:
    base = {"dense_operand": 0.2, "forward_dense": 2.0, "grad_input_dense": 2.0}
    cslt = LibraryTimes(both_operands=0.25, forward_operand=0.15, transposed_operand=0.15, forward=1.4, grad_input=1.4)
    cut = LibraryTimes(both_operands=0.3, forward_operand=0.12, transposed_operand=0.18, forward=1.3, grad_input=1.5,
                       from_dense_operand=True)
    libs = dict(changes.pop("libraries", {"cusparselt": cslt, "cutlass": cut}))
    return LibraryLayerTimes(**{**base, **changes}, libraries=tuple(libs.items()))


def test_each_plan_across_libraries_pays_the_operand_forms_it_needs_once():
    t = _libraries()
    assert len(t.plans()) == 9 and t.plans()[0] == ("dense", "dense")
    assert t.cost(("dense", "dense")) == pytest.approx(0.2 + 2.0 + 2.0)
    assert t.cost(("cusparselt", "cusparselt")) == pytest.approx(0.25 + 1.4 + 1.4)  # both forms in one pass
    assert t.cost(("cutlass", "cutlass")) == pytest.approx(0.2 + 0.3 + 1.3 + 1.5)  # from the dense S(W)
    assert t.cost(("cutlass", "cusparselt")) == pytest.approx(0.2 + 0.12 + 0.15 + 1.3 + 1.4)
    assert t.cost(("cusparselt", "dense")) == pytest.approx(0.2 + 0.15 + 1.4 + 2.0)
    assert t.cost(("dense", "cutlass")) == pytest.approx(0.2 + 0.18 + 2.0 + 1.5)  # the dense S(W) paid once
    with pytest.raises(ValueError, match=r"names \['cublas'\]"):
        t.cost(("cublas", "dense"))


def test_one_library_is_the_case_of_the_table():
    one = LayerTimes(dense_operand=0.2, sparse_operands=0.25, forward_operand=0.15, transposed_operand=0.15,
                     forward_dense=2.0, forward_sparse=1.4, grad_input_dense=2.0, grad_input_sparse=1.4)
    by = one.by_library("cusparselt")
    for plan in ((True, True), (False, False), (True, False), (False, True)):
        named = tuple("cusparselt" if p else "dense" for p in plan)
        assert one.cost(plan) == pytest.approx(by.cost(named))


def test_the_cheapest_plan_across_libraries_wins_a_mix_included():
    assert choose_plan(LAYER, _libraries()).plan == ("cusparselt", "cusparselt")  # 3.05 against 3.3 on CUTLASS
    fast_cutlass_forward = _libraries(libraries={
        "cusparselt": LibraryTimes(0.25, 0.15, 0.15, 1.4, 1.4),
        "cutlass": LibraryTimes(0.3, 0.05, 0.18, 0.9, 1.5, from_dense_operand=True)})
    d = choose_plan(LAYER, fast_cutlass_forward)  # 0.2 + 0.05 + 0.15 + 0.9 + 1.4 = 2.7
    assert d.plan == ("cutlass", "cusparselt") and d.speedup == pytest.approx(4.2 / 2.7)
    assert d.describe() == "forward cutlass, grad_input cusparselt 1.56x over all dense @8192 tokens"
    assert choose_plan(LAYER, _libraries(), min_speedup=1.4).plan == ("dense", "dense")  # best 1.377x
    assert plan_name(("cutlass", "cutlass")) == "all cutlass" and plan_name(("dense", "dense")) == "all dense"


def test_library_times_are_checked():
    with pytest.raises(ValueError, match="LibraryTimes.forward must be a finite number of ms >= 0, got -1"):
        LibraryTimes(0.1, 0.1, 0.1, -1, 0.1)
    with pytest.raises(ValueError, match="distinct names other than 'dense'"):
        _libraries(libraries={"dense": LibraryTimes(0.1, 0.1, 0.1, 0.1, 0.1)})
    with pytest.raises(ValueError, match="LibraryLayerTimes.dense_operand"):
        _libraries(dense_operand=math.inf)


# --- the backend, on the CPU (stand-ins for the libraries' calls) ---------------------------------------------
def _backend(monkeypatch, with_cutlass=True, layer_times=None, product_times=None):
    monkeypatch.setattr(cutlass_ops, "compress", _DenseStandIn.compress)
    monkeypatch.setattr(cutlass_ops, "mm", _DenseStandIn.mm)
    cutlass = CutlassBackend() if with_cutlass else None
    missing = {} if with_cutlass else {"cutlass": "missing nvcc (no nvcc on the PATH)"}
    backend = SparseAutoBackend(cutlass, missing, ops=FakeCusparselt())
    backend.policy.measure_layer = lambda shape: layer_times
    backend.policy.measure = lambda shape: product_times
    return backend


def _layer_and_reference(backend, registry, reference="torch", name="sparse_auto_fake"):  # noqa: F811
    """A layer on ``backend`` and one on ``reference`` with the same weights and MVUE seed. On CPU tensors
    the MVUE draw is the reference's where the cuSPARSELt backend or a dense product draws it ("torch"), and
    the Triton kernel's where CUTLASS does ("triton"); on the GPU both are the Triton kernel."""
    registry.register_backend(name, lambda: backend)
    torch.manual_seed(0)
    layer = SparseLinear(64, 32, method=sl.SSTE(transposable=True, mvue=True, backend=name), dtype=BF16)
    torch.manual_seed(0)
    ref = SparseLinear(64, 32, method=sl.SSTE(transposable=True, mvue=True, backend=reference), dtype=BF16)
    ref.mvue_seed = layer.mvue_seed
    return layer, ref


def _run(layer, ref, tokens=48, device="cpu", scale=1.0):
    """Forward and backward of both layers on the same X and dZ: Z, dX and dW agree (a fixed dZ: the MVUE draw
    of dW then reads the same values, where a loss of Z would hand it two roundings of Z)."""
    x = torch.randn(tokens, layer.in_features, device=device, dtype=BF16) * scale
    dz = torch.randn(tokens, layer.out_features, device=device, dtype=BF16)
    got = []
    for net in (layer, ref):
        net.train(False)
        xx = x.clone().requires_grad_(True)
        out = net(xx)
        out.backward(dz)
        got.append((out, xx.grad, net.weight.grad))
    for a, b in zip(*got):
        assert _rel(a, b) < 1e-2


def test_the_backend_runs_each_product_on_the_library_it_chose(monkeypatch, registry):  # noqa: F811
    """Forward on CUTLASS, input gradient on cuSPARSELt (the layer's plan), weight gradient on CUTLASS: each the
    same as the reference layer's (same weights, same MVUE draws), and the report names the library."""
    times = _libraries(libraries={"cusparselt": LibraryTimes(0.25, 0.15, 0.15, 1.4, 1.4),
                                  "cutlass": LibraryTimes(0.3, 0.05, 0.18, 0.9, 1.5, from_dense_operand=True)})
    backend = _backend(monkeypatch, layer_times=times, product_times={"dense": 2.0, "cusparselt": 1.5, "cutlass": 1.2})
    layer, ref = _layer_and_reference(backend, registry, "triton")
    _run(layer, ref)
    assert backend.cutlass.stats["sparse_products"] == 2  # the forward and the weight gradient
    assert {(c["m"], c["k"]) for c in backend._ops.calls} == {(64, 32)}  # dX^T = S(W)^T dZ^T on cuSPARSELt (searched)
    assert backend.stats["sparse_products"] == 1 and backend.stats["dense_products"] == 0
    assert backend.library_for("grad_weight", 32, 64, 48, BF16) == "cutlass"
    products = backend_report(layer)[0].products
    assert products["forward"].startswith("sparse on cutlass (layer plan: forward cutlass, grad_input cusparselt 1.56x")
    assert products["forward"].endswith("[cusparselt 1.43x, cutlass 2.22x]")
    assert products["grad_input"].startswith("sparse on cusparselt (layer plan: forward cutlass, grad_input cusparselt")
    assert products["grad_weight"] == "sparse on cutlass 1.67x @48 tokens [cusparselt 1.33x, cutlass 1.67x]"
    summary = backend.summary()
    assert summary["libraries"] == {"cusparselt": "candidate", "cutlass": "candidate"}
    assert summary["layer_plans"][0]["plan"] == "forward cutlass, grad_input cusparselt"
    assert summary["decisions"][-1]["library"] == "cutlass" and summary["cutlass_stats"]["sparse_products"] == 2


def test_all_dense_when_no_library_pays(monkeypatch, registry):  # noqa: F811
    slow = LibraryTimes(0.5, 0.3, 0.3, 2.5, 2.5)
    times = _libraries(libraries={"cusparselt": slow, "cutlass": slow})
    backend = _backend(monkeypatch, layer_times=times, product_times={"dense": 1.0, "cusparselt": 1.5, "cutlass": 1.2})
    layer, ref = _layer_and_reference(backend, registry)
    _run(layer, ref)
    assert backend.cutlass.stats["sparse_products"] == 0 and backend.stats["sparse_products"] == 0
    assert backend.stats["dense_products"] == 3
    assert backend_report(layer)[0].products["grad_weight"].startswith("dense 0.83x @48 tokens")


def test_without_cutlass_it_chooses_among_what_is_there_and_says_so(monkeypatch, registry):  # noqa: F811
    times = LayerTimes(0.2, 0.25, 0.15, 0.15, 2.0, 1.4, 2.0, 1.4).by_library("cusparselt")
    backend = _backend(monkeypatch, with_cutlass=False, layer_times=times,
                       product_times={"dense": 2.0, "cusparselt": 1.5})
    assert backend.libraries == ("cusparselt",) and backend.problems("grad_weight", 32, 36, 48, BF16) == {}
    layer, ref = _layer_and_reference(backend, registry)
    _run(layer, ref)
    assert backend.stats["sparse_products"] == 3
    products = backend_report(layer)[0].products
    for text in products.values():
        assert text.startswith("sparse on cusparselt")
        assert text.endswith("; cutlass is no candidate on this machine: missing nvcc (no nvcc on the PATH)")
    assert backend.summary()["libraries"] == {"cusparselt": "candidate", "cutlass": "missing nvcc (no nvcc on the PATH)"}


def test_a_shape_one_library_cannot_run_leaves_it_out_with_the_reason(monkeypatch):
    backend = _backend(monkeypatch)
    assert backend.problems("grad_weight", 32, 36, 48, BF16) == {  # CUTLASS's N-major B: rows of 8
        "cutlass": "n (B's rows) must be a multiple of 8 for CUTLASS's 16-byte aligned rows, got 36 (product m=32, "
                   "n=36, k=48, torch.bfloat16); pad it, or use backend 'cusparselt' or 'torch'"}
    assert set(backend.problems("forward", 32, 64, 48, torch.float16)) == {"cutlass"}  # CUTLASS's is bf16 only
    assert "bfloat16" in product_problem("forward", 32, 64, 48, torch.float16)
    assert set(backend.problems("forward", 40, 64, 48, BF16)) == {"cusparselt", "cutlass"}
    assert backend.library_for("forward", 40, 64, 48, BF16) == "dense"  # no library can: unmeasured, dense
    decision = backend.policy.decisions_for(40, 64)["forward"][0]
    assert decision.speedup is None and decision.describe() == (
        "dense (layer plan: all dense (not measured: no candidate library can run it)); cusparselt cannot run it: "
        "shape (40, 64) is not a multiple of 16; cutlass cannot run it: k (the compressed A's rows hold k/2 elements) "
        "must be a multiple of 16 for CUTLASS's 16-byte aligned rows, got 40 (product m=64, n=48, k=40, "
        "torch.bfloat16); pad it, or use backend 'cusparselt' or 'torch'")  # the input gradient's S(W)^T
    backend.policy.measure = lambda shape: {"dense": 2.0, "cusparselt": 1.5}
    assert backend.library_for("grad_weight", 32, 36, 48, BF16) == "cusparselt"
    with pytest.raises(ValueError, match="per layer"):
        SparseAutoBackend.measure_product(backend, ProductShape("forward", 32, 64, 48, "bfloat16"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only fallback")
def test_without_a_gpu_the_name_gives_the_reference_with_a_warning(registry):  # noqa: F811
    from sparsity_lab.backends import get_backend
    from sparsity_lab.backends.cusparselt.backend import BackendFallbackWarning, ReferenceFallback
    with pytest.warns(BackendFallbackWarning, match="'sparse_auto' was requested, but no CUDA GPU"):
        backend = get_backend("sparse_auto")
    assert isinstance(backend, ReferenceFallback) and backend.requested == "sparse_auto"


# --- GPU --------------------------------------------------------------------------------------------------------
def _forcing(plan: tuple[str, str], grad_weight: str) -> tuple:
    """(measure_layer, measure) whose timings make ``plan`` and ``grad_weight`` the cheapest choices (checked by
    a CPU test below)."""
    def lib(name, product):
        return 1.0 if name == (plan[0] if product == "forward" else plan[1]) else 5.0

    def measure_layer(shape):
        libs = tuple((n, LibraryTimes(0.1, 0.1, 0.1, lib(n, "forward"), lib(n, "grad_input"))) for n in ("cusparselt",
                                                                                                          "cutlass"))
        return LibraryLayerTimes(0.1, 1.0 if plan[0] == "dense" else 4.0, 1.0 if plan[1] == "dense" else 4.0, libs)
    return measure_layer, lambda shape: {"dense": 3.0, "cusparselt": 1.0 if grad_weight == "cusparselt" else 5.0,
                                         "cutlass": 1.0 if grad_weight == "cutlass" else 5.0}


def _hopper_backend():
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        pytest.skip("needs a Hopper GPU (sm_90) for CUTLASS")
    from sparsity_lab.backends.sparse_auto import sparse_auto_backend
    backend = sparse_auto_backend()
    if backend.cutlass is None:
        pytest.skip(f"CUTLASS cannot run here: {backend.missing}")
    return backend


@pytest.mark.gpu
def test_gpu_measurements_of_every_library():
    backend = _hopper_backend()
    times = backend.measure_layer(LayerShape(1024, 512, 2048, "bfloat16"))
    assert [name for name, _ in times.libraries] == ["cusparselt", "cutlass"]
    assert times.dense_operand > 0 and all(getattr(t, f) > 0 for _, t in times.libraries
                                           for f in ("both_operands", "forward", "grad_input"))
    by_library = backend.measure_product(ProductShape("grad_weight", 1024, 2048, 512, "bfloat16"))
    assert set(by_library) == {"dense", "cusparselt", "cutlass"} and min(by_library.values()) > 0
    backend.timing = "graph"
    assert backend.measure_layer(LayerShape(1024, 512, 2048, "bfloat16")).libraries[1][1].forward > 0


@pytest.mark.gpu
def test_gpu_cutlass_weight_gradient_is_timed_on_the_operand_its_compressor_writes(monkeypatch):
    """The weight-gradient measurement compresses MVUE(dZ)^T with the project's layout kernel (the backend's
    kernel 23 writes the same layout while drawing): the bytes CUTLASS's own compressor writes for that
    matrix, and the timed product is the dense product of it."""
    _hopper_backend()
    from sparsity_lab.backends.cutlass import measure, ops
    from sparsity_lab.references import cutlass_layout as layout

    seen = {}
    real_mm = ops.mm

    def spy(a, b, *args, **kwargs):
        seen["a"], seen["b"] = a, b
        return real_mm(a, b, *args, **kwargs)
    monkeypatch.setattr(ops, "mm", spy)
    dense_ms, sparse_ms = measure.grad_weight_times(1024, 2048, 512, torch.bfloat16, lambda fn: (fn(), 1.0)[1])
    assert (dense_ms, sparse_ms) == (1.0, 2.0)  # the dense product; the compression plus the product
    a, x = seen["a"], seen["b"]
    matrix = layout.decompress(a.values, a.metadata, 1024, 2048)
    assert int((matrix != 0).sum()) > 0.45 * matrix.numel()  # a 2:4 draw, not an empty operand
    theirs = ops.compress(matrix.contiguous())
    assert torch.equal(a.values.view(torch.uint8), theirs.values.view(torch.uint8))
    assert torch.equal(a.metadata, theirs.metadata)
    torch.testing.assert_close(real_mm(a, x, "n", "row").float(), matrix.float() @ x.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("plan,grad_weight", [(("cutlass", "cutlass"), "cutlass"),
                                              (("cutlass", "cusparselt"), "cusparselt"),
                                              (("dense", "cutlass"), "dense"),
                                              (("cusparselt", "dense"), "cutlass")])
def test_gpu_each_library_plan_matches_the_reference(plan, grad_weight, registry):  # noqa: F811
    backend = _hopper_backend()
    backend.policy.measure_layer, backend.policy.measure = _forcing(plan, grad_weight)
    registry.register_backend("sparse_auto_forced", lambda: backend)
    torch.manual_seed(1)
    layer = SparseLinear(512, 1024, method=sl.SSTE(transposable=True, mvue=True, backend="sparse_auto_forced"),
                         device="cuda", dtype=BF16)
    torch.manual_seed(1)
    ref = SparseLinear(512, 1024, method=sl.SSTE(transposable=True, mvue=True, backend="triton"), device="cuda",
                       dtype=BF16)
    ref.mvue_seed = layer.mvue_seed
    _run(layer, ref, tokens=1000, device="cuda", scale=1e3)  # 1000 tokens: padded to 1008 for the weight gradient
    assert backend.library_for("forward", 1024, 512, 1000, BF16) == plan[0]
    assert backend.library_for("grad_input", 1024, 512, 1000, BF16) == plan[1]
    assert backend.library_for("grad_weight", 1024, 512, 1008, BF16) == grad_weight
    expected = sum(p == "cutlass" for p in plan) + (grad_weight == "cutlass")
    assert backend.cutlass.stats["sparse_products"] == expected


def test_the_forcing_timings_of_the_gpu_test_choose_what_they_force():
    for plan, grad_weight in [(("cutlass", "cutlass"), "cutlass"), (("cutlass", "cusparselt"), "cusparselt"),
                              (("dense", "cutlass"), "dense"), (("cusparselt", "dense"), "cutlass")]:
        measure_layer, measure = _forcing(plan, grad_weight)
        assert choose_plan(LAYER, measure_layer(LAYER)).plan == plan
        assert AutoPolicy(measure).decide(GW).runs_on == grad_weight
