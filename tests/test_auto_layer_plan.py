"""The auto policy's per-layer plan for the forward and input gradient (they share S(W)): the plan
arithmetic, the policy's caching and errors, and the backend running what the plan chose (CPU, fakes)."""
from __future__ import annotations

import math

import pytest
import torch

import sparsity_lab as sl
from sparsity_lab.backends.cusparselt.auto import AutoPolicy
from sparsity_lab.backends.cusparselt.layer_plan import PLANS, LayerShape, LayerTimes, choose_plan, plan_name
from sparsity_lab.layers import SparseLinear
from sparsity_lab.sparsify import backend_report

from test_cusparselt_backend import _rel, fake_backend, registry  # noqa: F401  (registry: a fixture)

LAYER = LayerShape(4096, 1024, 8192, "bfloat16")


def _times(**changes) -> LayerTimes:
    base = dict(dense_operand=0.2, sparse_operands=0.25, forward_operand=0.15, transposed_operand=0.15,
                forward_dense=2.0, forward_sparse=1.4, grad_input_dense=2.0, grad_input_sparse=1.4)
    return LayerTimes(**{**base, **changes})


def test_cost_of_each_plan_follows_the_table():
    t = _times()
    assert t.cost((True, True)) == pytest.approx(0.25 + 1.4 + 1.4)
    assert t.cost((False, False)) == pytest.approx(0.2 + 2.0 + 2.0)
    assert t.cost((True, False)) == pytest.approx(0.2 + 0.15 + 1.4 + 2.0)  # both operand forms paid
    assert t.cost((False, True)) == pytest.approx(0.2 + 0.15 + 2.0 + 1.4)


def test_all_sparse_when_both_products_pay():
    d = choose_plan(LAYER, _times())
    assert d.plan == (True, True) and set(d.costs) == set(PLANS)
    assert d.speedup == pytest.approx(4.2 / 3.05)
    assert d.describe().startswith("all sparse 1.38x over all dense @8192 tokens")


def test_a_mix_must_pay_for_both_operand_forms():
    # per product the forward pays (1.5 < 2.0) and the input gradient does not (2.1 > 2.0): a
    # per-product choice mixes them, but the mix costs 0.2 + 0.6 + 1.5 + 2.0 = 4.3 > all dense 4.2
    t = _times(forward_sparse=1.5, grad_input_sparse=2.1, forward_operand=0.6, sparse_operands=0.7)
    assert choose_plan(LAYER, t).plan == (False, False)
    cheap_form = _times(forward_sparse=1.5, grad_input_sparse=2.1, forward_operand=0.1, sparse_operands=0.7)
    assert choose_plan(LAYER, cheap_form).plan == (True, False)  # 3.8 against 4.2 dense, 4.3 all sparse
    reverse = _times(forward_sparse=2.1, grad_input_sparse=1.5, transposed_operand=0.1, sparse_operands=0.7)
    assert choose_plan(LAYER, reverse).plan == (False, True)


def test_min_speedup_keeps_all_dense_unless_the_best_plan_clears_it():
    t = _times()  # best 1.377x
    assert choose_plan(LAYER, t, min_speedup=1.3).plan == (True, True)
    strict = choose_plan(LAYER, t, min_speedup=1.4)
    assert strict.plan == (False, False) and ">= 1.4x" in strict.reason and strict.speedup == 1.0


def test_layer_shapes_and_times_are_checked():
    with pytest.raises(ValueError, match="tokens must be a positive int, got 0"):
        LayerShape(16, 16, 0, "bfloat16")
    with pytest.raises(ValueError, match="LayerTimes.forward_sparse must be a finite number of ms >= 0, got nan"):
        _times(forward_sparse=math.nan)
    with pytest.raises(ValueError, match="LayerTimes.dense_operand"):
        _times(dense_operand=-1.0)
    assert plan_name((True, False)) == "forward sparse, grad_input dense"


def test_policy_decides_a_layer_once_and_records_its_products():
    calls = []

    def measure_layer(shape):
        calls.append(shape)
        return _times()
    policy = AutoPolicy(measure_layer=measure_layer)
    first = policy.decide_layer(LAYER)
    assert policy.decide_layer(LAYER) is first and calls == [LAYER]
    by_product = policy.decisions_for(4096, 1024)
    fwd, gi = by_product["forward"][0], by_product["grad_input"][0]
    assert fwd.sparse and gi.sparse and fwd.layer is first
    assert (fwd.dense_ms, fwd.sparse_ms) == (2.0, 1.4)
    assert fwd.describe() == "sparse (layer plan: all sparse 1.38x over all dense @8192 tokens)"
    assert "layer (4096, 1024) @8192 tokens bfloat16: all sparse" in policy.table()
    unsupported = policy.decide_layer(LayerShape(40, 32, 16, "bfloat16"), unsupported="not a multiple of 16")
    assert unsupported.plan == (False, False) and unsupported.speedup is None and len(calls) == 1


def test_policy_layer_errors():
    with pytest.raises(RuntimeError, match="no measure_layer function"):
        AutoPolicy().decide_layer(LAYER)
    with pytest.raises(TypeError, match="must return LayerTimes or LibraryLayerTimes, got tuple"):
        AutoPolicy(measure_layer=lambda s: (1.0, 2.0)).decide_layer(LAYER)


def test_backend_asks_the_layer_plan_for_forward_and_grad_input(registry):  # noqa: F811
    layers, products = [], []

    def measure_layer(shape):
        layers.append(shape)
        return _times(forward_sparse=1.5, grad_input_sparse=2.1, forward_operand=0.1, sparse_operands=0.7)

    def measure(shape):
        products.append(shape.product)
        return 2.0, 1.0
    backend, _ = fake_backend(policy=AutoPolicy(measure, measure_layer=measure_layer))
    assert backend._sparse("grad_input", 32, 64, 48, torch.bfloat16) is False
    assert backend._sparse("forward", 32, 64, 48, torch.bfloat16) is True
    assert backend._sparse("grad_weight", 32, 64, 48, torch.bfloat16) is True
    assert layers == [LayerShape(32, 64, 48, "bfloat16")] and products == ["grad_weight"]
    assert backend._sparse("forward", 40, 64, 48, torch.bfloat16) is False  # cuSPARSELt cannot: unmeasured
    assert len(layers) == 1
    plans = backend.summary()["layer_plans"]
    assert [p["plan"] for p in plans] == ["forward sparse, grad_input dense", "all dense"]
    assert plans[0]["costs_ms"]["all dense"] == pytest.approx(4.2)


def test_a_mixed_plan_runs_one_compressed_form_and_the_dense_weight(registry):  # noqa: F811
    times = _times(forward_sparse=1.5, grad_input_sparse=2.1, forward_operand=0.1, sparse_operands=0.7)
    backend, ops = fake_backend(policy=AutoPolicy(lambda s: (1.0, 2.0), measure_layer=lambda s: times))
    sl.backends.base.register_backend("cusparselt_fake_auto", lambda: backend)
    torch.manual_seed(0)
    layer = SparseLinear(64, 32, method=sl.SSTE(transposable=True, backend="cusparselt_fake_auto"), dtype=torch.bfloat16)
    torch.manual_seed(0)
    ref = SparseLinear(64, 32, method=sl.SSTE(transposable=True), dtype=torch.bfloat16)
    x = torch.randn(48, 64, dtype=torch.bfloat16)
    got = []
    for net in (layer, ref):
        net.train(False)
        xx = x.clone().requires_grad_(True)
        out = net(xx)
        out.float().square().sum().backward()
        got.append((out, xx.grad, net.weight.grad))
    for a, b in zip(*got):
        assert _rel(a, b) < 1e-2
    assert {(c["m"], c["k"]) for c in ops.calls} == {(32, 64)}  # the forward alone ran sparse (and was searched)
    assert backend.stats["compressions"] == 1  # one form compressed: the input gradient's was not wanted
    row = backend_report(layer)[0]
    assert row.products["forward"] == ("sparse (layer plan: forward sparse, grad_input dense 1.11x over all dense "
                                       "@48 tokens)")
    assert row.products["grad_input"].startswith("dense (layer plan: forward sparse")


# --- GPU: the measurement, and a layer trained through whatever plan it chose --------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("fused_prepare", [True, False])
def test_measure_layer_on_the_gpu_and_the_chosen_plan_matches_the_reference(fused_prepare, registry):  # noqa: F811
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run on the GPU machine: pytest -m gpu)")
    from sparsity_lab.backends.cusparselt.backend import CusparseltBackend

    backend = CusparseltBackend(policy=AutoPolicy(), fused_prepare=fused_prepare)
    backend.policy.measure, backend.policy.measure_layer = backend.measure_product, backend.measure_layer
    times = backend.measure_layer(LayerShape(1024, 512, 2048, "bfloat16"))
    assert all(getattr(times, name) > 0 for name in times.__dataclass_fields__)
    for timing in ("eager", "graph"):
        backend.timing = timing
        sl.backends.base.register_backend(f"cusparselt_auto_{timing}", lambda: backend)
        torch.manual_seed(1)
        layer = SparseLinear(512, 1024, method=sl.SSTE(transposable=True, mvue=True, backend=f"cusparselt_auto_{timing}"),
                             device="cuda", dtype=torch.bfloat16)
        torch.manual_seed(1)
        ref = SparseLinear(512, 1024, method=sl.SSTE(transposable=True, mvue=True), device="cuda", dtype=torch.bfloat16)
        x = torch.randn(2048, 512, device="cuda", dtype=torch.bfloat16) * 1e3  # large magnitudes too
        got = []
        for net in (layer, ref):
            net.train(False)
            xx = x.clone().requires_grad_(True)
            out = net(xx)
            out.float().square().mean().backward()
            got.append((out, xx.grad))  # the weight gradient is an MVUE draw: checked by the MVUE tests
        for a, b in zip(*got):
            assert _rel(a, b) < 1e-2
        plans = [p for p in backend.summary()["layer_plans"] if p["timing"] == timing]
        assert plans and all(p["plan"] in {plan_name(q) for q in PLANS} for p in plans)
