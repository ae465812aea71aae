"""FP8Recipe(scale_in_product="host_alpha"): power-of-two scales the host reads one step late, given to the
2:4 product as its scalar alpha. On the CPU: the scales are exact powers of two, the product with the host
alpha equals the product scaled after it, the lag step by step against a plain-PyTorch loop, the state in
checkpoints; on the GPU: the cuSPARSELt products against the reference, and a CUDA-graph step's recaptures."""
import copy
import dataclasses
import math
import warnings

import pytest
import torch

from sparsity_lab import STE, SSTE, SparseLinear, attach_optimizer
from sparsity_lab.backends import get_backend
from sparsity_lab.backends.cusparselt.fp8_train import FP8Backend, FP8Engine, set_fp8_recipe
from sparsity_lab.methods.fp8_scaling import (TENSORS, FP8Recipe, FP8ScalingState, decode_recipe, encode_recipe,
                                              exponent_of, pow2_scale)
from sparsity_lab.references import fp8_products

HOST = FP8Recipe(scale_in_product="host_alpha")
E4M3 = torch.float8_e4m3fn


def col(name):
    return TENSORS.index(name)


# --- the recipe -------------------------------------------------------------------------------------------------
def test_pow2_scales_are_exact_powers_of_two_at_or_above_amax_over_fp8_max():
    a = torch.cat([torch.rand(200) * 10 ** torch.randint(-6, 4, (200,)).float(),
                   torch.tensor([448.0, 224.0, 448.0 * 2 ** -20, 1e-12, 3.0])])
    fmax = torch.full_like(a, 448.0)
    for margin in (0, 2):
        s = pow2_scale(a, fmax, margin)
        mantissa, _ = torch.frexp(s)
        assert (mantissa == 0.5).all()  # a power of two
        ratio = a / (s / 2 ** margin)  # a / scale without the margin: in (224, 448], the largest fit
        assert (ratio <= 448).all() and (ratio > 224).all()
    assert pow2_scale(torch.tensor([448.0]), torch.tensor([448.0]), 0).item() == 1.0  # exactly 2**0, not 2**1
    assert exponent_of(2.0 ** -17) == -17 and exponent_of(1.0) == 0
    with pytest.raises(ValueError, match="not a power of two"):
        exponent_of(0.75)


def test_recipe_option_is_checked_and_travels_in_the_encoding():
    with pytest.raises(ValueError, match="scale_in_product must be one of"):
        FP8Recipe(scale_in_product="inside")
    with pytest.raises(ValueError, match="scale_in_product='host_alpha' needs scaling='delayed'"):
        FP8Recipe(scaling="current", scale_in_product="host_alpha")
    assert FP8Recipe().scale_in_product == "pass" and FP8Recipe().lag == 0 and HOST.lag == 1
    other = dataclasses.replace(HOST, history_len=5, margin=2, grad_format="e5m2")
    assert decode_recipe(encode_recipe(other)) == other
    assert decode_recipe(encode_recipe(FP8Recipe())[:5]) == FP8Recipe()  # an older checkpoint's five codes


def test_host_scales_arrive_one_step_late_and_equal_the_device_scales():
    state = FP8ScalingState(dataclasses.replace(HOST, history_len=2))
    amaxes = [3.0, 50.0, 0.2, 0.2]
    for k, a in enumerate(amaxes):
        assert state.uses_history == (k >= 2) and (state.host_exponents is None) == (k < 2)
        state.record("x", torch.tensor(a))
        state.advance()
    # step 4 uses D_3, the window of steps 1..2 (L = 2): max(50, 0.2) -> 2**ceil(log2(50 / 448)) = 2**-3
    assert state.host_exponent("x") == -3 and float(state.scale[col("x")]) == 2.0 ** -3
    assert float(state.inv_scale[col("x")]) == 8.0
    # next_scale is D_4 (steps 2..3: 0.2 / 448 -> 2**-11), the host gets it at the next advance
    assert float(state.next_scale[col("x")]) == 2.0 ** -11
    assert state.host_alpha("x", "w") == float(state.scale[col("x")] * state.scale[col("w")])
    assert [math.ldexp(1.0, e) for e in state.host_exponents] == state.scale.tolist()


# --- the arithmetic --------------------------------------------------------------------------------------------
def test_host_alpha_product_equals_the_product_scaled_after_it():
    """What cuSPARSELt computes with the scale inside (alpha times the float32 sums, rounded once to bf16)
    against the pass (the sums rounded to bf16, then multiplied by s_a s_b and rounded again): the same
    bits for power-of-two scales, within one bf16 rounding for others."""
    torch.manual_seed(0)
    q_a = (torch.randn(64, 128) * 40).to(E4M3)
    q_b = (torch.randn(128, 96) * 40).to(E4M3)
    acc = q_a.float() @ q_b.float()
    for s_a, s_b, exact in ((2.0 ** -9, 2.0 ** -4, True), (0.013, 0.021, False)):
        sa, sb = torch.tensor(s_a), torch.tensor(s_b)
        after = (acc.to(torch.bfloat16).float() * (sa * sb)).to(torch.bfloat16)
        inside = (acc * float(sa * sb)).to(torch.bfloat16)
        assert torch.equal(after, inside) == exact
        torch.testing.assert_close(inside.float(), after.float(), rtol=2 ** -7, atol=0)
    q_x, q_w = (torch.randn(32, 128) * 30).to(E4M3), (torch.randn(64, 128) * 30).to(E4M3)
    s_x, s_w = torch.tensor(2.0 ** -6), torch.tensor(2.0 ** -10)
    alpha = math.ldexp(1.0, -16)
    assert torch.equal(fp8_products.reference_forward(q_x, s_x, q_w, s_w, torch.bfloat16, alpha=alpha),
                       fp8_products.reference_forward(q_x, s_x, q_w, s_w, torch.bfloat16))


def _quantize(t, s, inv):
    return (t.float() * inv).clamp(-448, 448).to(E4M3)


def test_lagged_recipe_step_by_step_equals_a_plain_pytorch_loop():
    """The reference engine with host alphas against a loop that knows only the equations of the module
    docstring: s_t = current scaling for t < 2, else 2**ceil(log2(max(a_{t-1-L} .. a_{t-2}) / 448)); every
    product is alpha (q q) with alpha = s_a s_b. Equal bit for bit at every step, the host's alpha included."""
    torch.manual_seed(1)
    L = 3
    be = FP8Backend(FP8Engine("fp8_reference", "reference"), dataclasses.replace(HOST, history_len=L))
    gains = [1.0, 3.0, 0.5, 60.0, 2.0, 2.0, 0.01, 1.0]  # jumps that the lag and the powers of two must follow
    seen = {"x": [], "w": [], "dz": []}
    lag_mattered = False
    for t, gain in enumerate(gains):
        x, w, dz = torch.randn(16, 64) * gain, torch.randn(32, 64) * 0.1, torch.randn(16, 32) * 1e-3 * gain
        op = be.prepare(w)
        z, dx, dw = be.linear(x, op, None), be.grad_input(dz, op), be.grad_weight(dz, x, False, None)
        scales = {}
        for name, tensor in (("x", x), ("w", w), ("dz", dz)):
            seen[name].append(tensor.abs().amax().float())
            if t < 2:  # current scaling: the tensor's own amax
                a = seen[name][t]
                scales[name] = (a / 448, 448 / a)
            else:
                window = torch.stack(seen[name][max(0, t - 1 - L):t - 1]).amax()
                s = 2.0 ** math.ceil(math.log2(float(window) / 448))
                scales[name] = (torch.tensor(s), torch.tensor(1 / s))
                unlagged = torch.stack(seen[name][max(0, t - L):t]).amax()
                lag_mattered |= s != 2.0 ** math.ceil(math.log2(float(unlagged) / 448))
                assert be.scaling.host_exponent(name) == math.log2(s)
        q = {n: _quantize(v, *scales[n]) for n, v in (("x", x), ("w", w), ("dz", dz))}

        def alpha(a, b):
            return scales[a][0] * scales[b][0] if t < 2 else float(scales[a][0] * scales[b][0])
        assert be.scaling.host_alpha("x", "w") == (None if t < 2 else alpha("x", "w"))
        assert torch.equal(z, (q["x"].float() @ q["w"].float().t() * alpha("x", "w")).to(z.dtype)), t
        assert torch.equal(dx, (q["dz"].float() @ q["w"].float() * alpha("dz", "w")).to(dx.dtype)), t
        assert torch.equal(dw, (q["dz"].float().t() @ q["x"].float() * alpha("dz", "x")).to(dw.dtype)), t
        be.advance_step()
    assert lag_mattered  # the sequence tells the lagged recipe from the unlagged one


# --- the sparse engine's choice: the check, the fallback -----------------------------------------------------------
class _StandInOps:
    """cuSPARSELt's FP8 products on the CPU: "multiply_after" works, a host alpha is applied or ignored."""

    def __init__(self, honours_alpha: bool) -> None:
        self.honours_alpha, self.alphas = honours_alpha, []

    def mm(self, a, b, s_a, s_b, transpose_result, config, mode, alpha=None):
        if mode not in ("multiply_after", "host_alpha"):
            raise RuntimeError("not supported")
        out = a.float() @ b.float()
        if mode == "host_alpha":
            self.alphas.append(alpha)
            out = out * alpha if self.honours_alpha else out
        else:
            out = out * (s_a * s_b)
        return (out.t() if transpose_result else out).to(torch.bfloat16)


@pytest.mark.parametrize("honours", [True, False], ids=["honoured", "ignored"])
def test_search_checks_the_host_alpha_and_the_engine_falls_back_visibly(honours):
    from sparsity_lab.backends.cusparselt.backend import BackendFallbackWarning
    from sparsity_lab.backends.cusparselt.fp8_algorithms import FP8SparseProducts
    ops = _StandInOps(honours)
    products = FP8SparseProducts(ops=ops, compress=lambda a: a)
    products.max_algorithms = 2
    choice = products.choose(64, 128, 32, [(True, True)], torch.device("cpu"))
    assert choice.mode == "multiply_after" and choice.host_alpha_ok == honours
    assert products.summary()[0]["host_alpha"] == choice.host_alpha
    engine = FP8Engine("cusparselt_fp8", "cusparselt")
    engine._sparse = products
    a, b = (torch.randn(64, 128) * 20).to(E4M3), (torch.randn(128, 32) * 20).to(E4M3)
    s = torch.tensor(2.0 ** -5)
    ops.alphas.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [engine.sparse_mm(a, b, s, s, choice, 2.0 ** -10) for _ in range(2)]
    refusals = [w for w in caught if issubclass(w.category, BackendFallbackWarning)]
    want = ((a.float() @ b.float()) * 2.0 ** -10).t().to(torch.bfloat16)
    assert all(torch.equal(out, want) for out in outs)  # scaled either way: inside, or by the pass
    if honours:
        assert ops.alphas == [2.0 ** -10] * 2 and not refusals
        assert engine.stats["sparse_products_host_alpha"] == 2 and engine.stats["host_alpha_refused"] == 0
    else:
        assert ops.alphas == [] and len(refusals) == 1 and "applied by the pass" in str(refusals[0].message)
        assert engine.stats["sparse_products_pass"] == 2 and engine.stats["host_alpha_refused"] == 2


def test_graph_constants_are_the_host_exponents_on_the_sparse_engine_only():
    sparse = FP8Backend(FP8Engine("cusparselt_fp8", "cusparselt"), HOST)
    plain = FP8Backend(FP8Engine("cusparselt_fp8", "cusparselt"))
    reference = FP8Backend(FP8Engine("fp8_reference", "reference"), HOST)
    assert plain.graph_constants() == () and reference.graph_constants() == ()
    seen = []
    for gain in (1.0, 1.0, 1.0, 1000.0, 1.0):
        seen.append(sparse.graph_constants())
        sparse.scaling.record("x", torch.tensor(gain))
        sparse.advance_step()
    assert seen[0] == seen[1] == (None,)  # steps 0 and 1: current scaling, nothing on the host
    assert seen[2] == seen[3] == seen[4] and seen[2][0][col("x")] == -8  # 2**ceil(log2(1 / 448))
    # the jump recorded at step 3 reaches the host scales used at step 5 (the lag of one step)
    assert sparse.graph_constants() != seen[4] and sparse.graph_constants()[0][col("x")] == 2  # 1000 / 448 -> 2**2


# --- checkpoints ---------------------------------------------------------------------------------------------------
def _train(layer, batches):
    opt = torch.optim.SGD(layer.parameters(), lr=0.05)
    handle = attach_optimizer(layer, opt)
    for x in batches:
        layer(x).square().sum().mul(1e-3).backward()
        opt.step()
        opt.zero_grad()
    handle.remove()


def _host_layer(seed=0):
    torch.manual_seed(seed)
    layer = SparseLinear(64, 32, method=SSTE(mvue=True, backend="fp8_reference"))
    set_fp8_recipe(layer, HOST)
    return layer


def test_checkpoint_holds_the_host_scales_and_resumes_exactly():
    layer = _host_layer()
    batches = [torch.randn(24, 64) * (1 + 20 * (i == 3)) for i in range(7)]
    cached = layer.state_dict()  # a state dict taken once follows the host exponents in place
    _train(layer, batches[:4])
    exps = layer.backend.scaling.host_exponents
    assert exps is not None and cached["backend.scaling._extra_state"][-4:].tolist() == list(exps)
    saved = copy.deepcopy(layer.state_dict())
    assert "backend.scaling.next_scale" in saved
    _train(layer, batches[4:])
    resumed = _host_layer(seed=1)
    resumed.load_state_dict(saved)
    assert resumed.backend.scaling.host_exponents == exps and resumed.backend.scaling.updates == 4
    _train(resumed, batches[4:])
    assert torch.equal(resumed.weight, layer.weight)
    for name in ("amax_history", "scale", "next_scale"):
        assert torch.equal(getattr(resumed.backend.scaling, name), getattr(layer.backend.scaling, name)), name
    assert resumed.backend.scaling.host_exponents == layer.backend.scaling.host_exponents


def test_a_checkpoint_whose_host_scales_disagree_or_of_another_recipe_is_refused():
    layer = _host_layer()
    _train(layer, [torch.randn(24, 64) for _ in range(3)])
    state = copy.deepcopy(layer.state_dict())
    state["backend.scaling._extra_state"][-1] += 1
    with pytest.raises(RuntimeError, match="host exponents .* are not those of the checkpoint's scales"):
        _host_layer().load_state_dict(state)
    plain = SparseLinear(64, 32, method=SSTE(mvue=True, backend="fp8_reference"))
    with pytest.raises(RuntimeError, match="scale_in_product='pass'.*set_fp8_recipe"):
        _host_layer().load_state_dict(plain.state_dict())


# --- the GPU --------------------------------------------------------------------------------------------------------
def _gpu_pair(method, recipe=HOST, shape=(256, 512), tokens=192):
    torch.manual_seed(4)
    real = SparseLinear(shape[1], shape[0], method=dataclasses.replace(method, backend="cusparselt_fp8"),
                        device="cuda", dtype=torch.bfloat16)
    set_fp8_recipe(real, recipe)
    ref = copy.deepcopy(real)
    ref.method = dataclasses.replace(method, backend="fp8_reference")
    ref.backend = get_backend("fp8_reference").for_layer(ref)
    set_fp8_recipe(ref, recipe)
    ref.mvue_seed = real.mvue_seed
    return real, ref


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.gpu
def test_gpu_host_alpha_product_equals_the_reference_and_the_pass():
    """One cuSPARSELt FP8 2:4 product with a power-of-two host alpha: the float32 product of the
    dequantized operands within bf16 rounding, and the pass's product within one bf16 rounding."""
    from sparsity_lab.backends.cusparselt.fp8_algorithms import FP8SparseProducts
    from sparsity_lab.kernels import compress24, transposable_mask24
    products = FP8SparseProducts()
    w = torch.randn(512, 256, device="cuda")
    q_w = (w * transposable_mask24(w, pruned=False)[0] * 50).to(E4M3)
    q_x = (torch.randn(192, 256, device="cuda") * 50).to(E4M3)
    s_w, s_x = torch.tensor(2.0 ** -7, device="cuda"), torch.tensor(2.0 ** -3, device="cuda")
    choice = products.choose(512, 256, 192, [(True, True)], torch.device("cuda"))
    assert choice.host_alpha_ok, choice.host_alpha  # what results/fp8_scalar_alpha_h100.json found on the H100
    comp = compress24(q_w)
    inside = products.mm(comp, q_x.t(), s_w, s_x, choice, alpha=2.0 ** -10)
    after = products.mm(comp, q_x.t(), s_w, s_x, choice)
    ref = (q_w.float() @ q_x.float().t() * 2.0 ** -10).t()
    assert rel(inside, ref) < 1e-2
    torch.testing.assert_close(inside.float(), after.float(), rtol=2 ** -7, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("method", [STE(transposable=True, mvue=True), STE(transposable=True)], ids=["mvue", "dense_dw"])
def test_gpu_host_alpha_training_matches_the_reference(method):
    real, ref = _gpu_pair(method)
    for layer in (real, ref):
        attach_optimizer(layer, torch.optim.SGD(layer.parameters(), lr=0.0))
    before = real.backend.stats["sparse_products_host_alpha"]
    for step in range(5):  # current scaling twice, then the host's lagged powers of two
        x = torch.randn(192, 512, device="cuda", dtype=torch.bfloat16) * (1 + step)
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        z, z_ref = real(xs[0]), ref(xs[1])
        assert rel(z, z_ref) < 1e-2
        dz = torch.randn_like(z)
        z.backward(dz)
        z_ref.backward(dz)
        assert rel(xs[0].grad, xs[1].grad) < 2e-2 and rel(real.weight.grad, ref.weight.grad) < 2e-2
        assert real.backend.scaling.host_exponents == ref.backend.scaling.host_exponents
        for layer in (real, ref):
            layer.advance_step()
            layer.weight.grad = None
    used = real.backend.stats["sparse_products_host_alpha"] - before
    assert used >= (9 if method.mvue else 6)  # forward and dX (and dW with MVUE) at steps 2, 3 and 4
    assert real.backend.stats["host_alpha_refused"] == 0


@pytest.mark.gpu
@pytest.mark.parametrize("settle", [0, 2])
def test_gpu_graph_step_recaptures_when_a_host_scale_changes(settle):
    """settle 0: a capture at the first step with the new host scales; settle 2: two eager steps first."""
    from sparsity_lab.graph_step import CudaGraphStep
    torch.manual_seed(5)
    model = torch.nn.Sequential(SparseLinear(256, 512, method=STE(transposable=True, mvue=True, backend="cusparselt_fp8"),
                                             device="cuda", dtype=torch.bfloat16))
    set_fp8_recipe(model, dataclasses.replace(HOST, history_len=2))
    eager = copy.deepcopy(model)
    gains = [1, 1, 1, 1] + [64] * 12  # the jump reaches the host scales two steps later
    base = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)  # one input a phase: its scales stay put
    xs = [base * g for g in gains]
    loss_fn = lambda m, x: m(x).float().square().mean()  # noqa: E731
    step = CudaGraphStep(model, loss_fn, warmup_steps=2, scale_settle_steps=settle)
    opts = [torch.optim.SGD(m.parameters(), lr=1e-3) for m in (model, eager)]
    for m, opt in zip((model, eager), opts):
        attach_optimizer(m, opt)
    for x in xs:
        lg = float(step(x))
        le = loss_fn(eager, x)
        le.backward()
        for opt in opts:
            opt.step()
            opt.zero_grad()
        assert lg == pytest.approx(float(le), rel=1e-3)
        assert model[0].backend.scaling.host_exponents == eager[0].backend.scaling.host_exponents
    assert step.scale_recaptures >= 1 and step.recaptures == 1 + step.scale_recaptures
    # a capture for new scales follows `settle` eager steps with them (a wait restarts when they move again)
    assert step.scale_eager_steps >= settle * step.scale_recaptures and step.eager_steps >= 2 + step.scale_eager_steps
    assert (step.scale_eager_steps == 0) == (settle == 0)


# --- the benchmark's report -----------------------------------------------------------------------------------------
def test_ffn_benchmark_prints_each_sparse_variant_against_each_dense_with_its_tflops():
    from benchmarks.fp8_training import FFN_VARIANTS, dense_ratios, main, ratio_lines
    variants = {"bf16_dense": {"ms": 20.0, "tflops": 660.0}, "fp8_dense": {"ms": 12.0, "tflops": 1100.0},
                "fp8_24": {"ms": 10.0, "tflops": 1320.0}, "fp8_24_host_alpha": {"ms": 8.0, "tflops": 1650.0}}
    ratios = dense_ratios(variants)
    assert set(ratios) == {"fp8_24", "fp8_24_host_alpha"}
    assert ratios["fp8_24_host_alpha"]["fp8_dense"] == {"speedup": 1.5, "dense_ms": 12.0, "dense_tflops": 1100.0}
    assert ratios["fp8_24"]["bf16_dense"]["speedup"] == 2.0
    lines = ratio_lines(variants)
    assert lines[1].startswith("fp8_24_host_alpha: 8.000 ms") and "x1.50 vs fp8_dense (12.000 ms, 1100 TFLOP/s)" in lines[1]
    assert "fp8_24_host_alpha" in FFN_VARIANTS
    with pytest.raises(SystemExit):
        main(["--ffn-variants", "fp8_24,fp8_fast"])


def test_ffn_ratios_take_each_side_in_its_faster_mode_and_the_targets_are_judged_on_them():
    from benchmarks.fp8_training import _pair_ratios, best_of_modes, dense_ratios, judge, main, ratio_lines
    out = {"variants": {"fp8_dense": {"ms": 13.0, "tflops": 1000.0}, "fp8_24_host_alpha": {"ms": 10.0, "tflops": 1300.0}},
           "eager": {"fp8_dense": {"ms": 12.0, "tflops": 1100.0}, "fp8_24_host_alpha": {"ms": 10.4, "tflops": 1250.0}}}
    fastest = best_of_modes(out)
    assert fastest == {"fp8_dense": {"mode": "eager", "ms": 12.0, "tflops": 1100.0},
                       "fp8_24_host_alpha": {"mode": "graphed", "ms": 10.0, "tflops": 1300.0}}
    times = {"fp8_dense": [12.0, 12.5], "fp8_24_host_alpha": [10.0, 10.0]}
    _pair_ratios(out, {v: r["ms"] for v, r in fastest.items()}, times, "_fastest")
    assert out["fp8_24_host_alpha_vs_fp8_dense_fastest"] == pytest.approx(1.2)
    assert out["fp8_24_host_alpha_vs_fp8_dense_fastest_rounds"] == pytest.approx([1.2, 1.25])
    out["fp8_24_host_alpha_vs_fp8_dense"] = 1.3  # graphed against graphed: not what is judged
    judged = judge({"ffn": out})["ffn_fp8_24_host_alpha_vs_fp8_dense"]
    assert judged["measured"] == pytest.approx(1.2) and judged["met"] is False
    assert dense_ratios(fastest)["fp8_24_host_alpha"]["fp8_dense"]["dense_mode"] == "eager"
    line = ratio_lines(fastest)[0]
    assert line.startswith("fp8_24_host_alpha: 10.000 ms graphed") and "vs fp8_dense (12.000 ms eager, 1100 TFLOP/s)" in line
    with pytest.raises(SystemExit):
        main(["--ffn-modes", "graphed,replayed"])
