"""Simulated FP8 products (the S-STE + FP8 row): operands on the FP8 grid, around any backend.

"torch_fp8sim" must keep the numerics it had as a TorchBackend subclass (runs and results carry the
name); "triton_fp8sim" runs the same rounding around the Triton kernels (interpreted on the CPU).
"""
import argparse
import copy
import json
import os
import subprocess
import sys

import pytest
import torch

from sparsity_lab import SSTE, STE, SparseLinear
from sparsity_lab.backends import available_backends, get_backend
from sparsity_lab.backends.fp8_sim import FP8SimBackend, fp8_sim_backend_for, register_fp8_sim
from sparsity_lab.backends.torch_reference import TorchBackend
from sparsity_lab.lab.cli import main
from sparsity_lab.lab import GPTConfig, TrainConfig
from sparsity_lab.lab.compare import VARIANTS, run_comparison, variant_config
from sparsity_lab.backends.fp8_sim import NAME, fake_fp8
from sparsity_lab.lab.train import method_options

# CPU (the Triton kernels through the interpreter) in CI, CUDA on the GPU machine
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def rel(a, b):
    return float((a - b).norm() / b.norm())


def seeded(seed):
    return torch.Generator(device=DEVICE).manual_seed(seed)


@pytest.mark.parametrize("fmt,dtype", [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)])
def test_fake_fp8_lands_on_the_fp8_grid(fmt, dtype):
    x = torch.randn(37, 13) * 3
    y = fake_fp8(x, fmt)
    fmax = torch.finfo(dtype).max
    scale = x.abs().max() / fmax
    # y / scale is a representable FP8 value, and the largest |x| maps to the largest FP8 value
    q = y / scale
    torch.testing.assert_close(q.to(dtype).float(), q, rtol=1e-5, atol=0)
    assert float(y.abs().max()) == pytest.approx(float(x.abs().max()), rel=1e-6)
    bits = 3 if fmt == "e4m3" else 2
    assert 1e-3 < rel(y, x) < 2.0 ** -bits  # rounding to 3 (2) mantissa bits


def test_backend_products_are_fp8_rounded_versions_of_the_exact_ones():
    torch.manual_seed(0)
    backend, exact = get_backend(NAME), get_backend("torch")
    assert NAME == "torch_fp8sim" and backend.name == NAME
    x, w, dz = torch.randn(24, 16), torch.randn(12, 16), torch.randn(24, 12)
    op = backend.prepare(w)
    torch.testing.assert_close(backend.linear(x, op, None), fake_fp8(x, "e4m3") @ fake_fp8(w, "e4m3").T)
    torch.testing.assert_close(backend.grad_input(dz, op), fake_fp8(dz, "e5m2") @ fake_fp8(w, "e4m3"))
    torch.testing.assert_close(backend.grad_weight(dz, x, False, None), fake_fp8(dz, "e5m2").T @ fake_fp8(x, "e4m3"))
    assert 1e-3 < rel(backend.linear(x, op, None), exact.linear(x, w, None)) < 0.1
    assert 1e-3 < rel(backend.grad_weight(dz, x, False, None), exact.grad_weight(dz, x, False, None)) < 0.2


class _SubclassFP8Sim(TorchBackend):
    """torch_fp8sim as it was before it wrapped any backend (a TorchBackend subclass): the baseline."""

    def prepare(self, sparse_weight):
        return fake_fp8(sparse_weight, "e4m3")

    def linear(self, x, operand, bias):
        return super().linear(fake_fp8(x, "e4m3"), operand, bias)

    def grad_input(self, grad_out, operand):
        return super().grad_input(fake_fp8(grad_out, "e5m2"), operand)

    def grad_weight(self, grad_out, x, mvue, generator):
        return super().grad_weight(fake_fp8(grad_out, "e5m2"), fake_fp8(x, "e4m3"), mvue, generator)


@pytest.mark.parametrize("transposable", [False, True])
def test_torch_fp8sim_keeps_the_numerics_of_the_subclass_bit_for_bit(transposable):
    torch.manual_seed(2)
    old, new = _SubclassFP8Sim(), get_backend("torch_fp8sim")
    w, x, dz = torch.randn(12, 20) * 0.3, torch.randn(23, 20) * 5, torch.randn(23, 12) * 1e-3  # odd tokens
    bias, beta = torch.randn(12), torch.tensor(1.4)
    mask = old.mask(w, 2, 4, transposable)
    assert torch.equal(new.mask(w, 2, 4, transposable), mask)
    for b in (None, beta):
        assert torch.equal(new.sparse_weight(w, mask, b, 2, 4), old.sparse_weight(w, mask, b, 2, 4))
    sw = old.sparse_weight(w, mask, beta, 2, 4)
    op_old, op_new = old.prepare(sw), new.prepare(sw)
    assert torch.equal(op_new, op_old)
    assert torch.equal(new.linear(x, op_new, bias), old.linear(x, op_old, bias))
    assert torch.equal(new.grad_input(dz, op_new), old.grad_input(dz, op_old))
    assert torch.equal(new.grad_weight(dz, x, False, None), old.grad_weight(dz, x, False, None))
    g_new, g_old = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for _ in range(2):  # MVUE: the same draws from the same generator state
        assert torch.equal(new.grad_weight(dz, x, True, g_new), old.grad_weight(dz, x, True, g_old))
    grads = [torch.randn(12, 20) for _ in range(2)]
    grads[1].copy_(grads[0])
    new.masked_decay_(grads[0], w, mask, 0.1)
    old.masked_decay_(grads[1], w, mask, 0.1)
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("inner", ["torch", pytest.param("triton", marks=pytest.mark.triton)])
def test_every_operation_is_the_inner_one_on_fp8_rounded_operands(inner):
    """The wrapper adds the rounding and nothing else: the inner backend's mask, soft threshold, MVUE."""
    torch.manual_seed(3)
    sim, base = get_backend(f"{inner}_fp8sim"), get_backend(inner)
    assert isinstance(sim, FP8SimBackend) and sim.inner is base and sim.name == f"{inner}_fp8sim"
    w = torch.randn(16, 24, device=DEVICE)
    x, dz = torch.randn(10, 24, device=DEVICE), torch.randn(10, 16, device=DEVICE)  # 10 tokens: MVUE pads
    beta = torch.tensor(1.5, device=DEVICE)
    mask = sim.mask(w, 2, 4, True)
    assert torch.equal(mask, base.mask(w, 2, 4, True))
    sw = sim.sparse_weight(w, mask, beta, 2, 4)
    assert torch.equal(sw, base.sparse_weight(w, mask, beta, 2, 4))  # full precision: S(W) is not rounded
    op = sim.prepare(sw)
    q4x, q5dz = fake_fp8(x, "e4m3"), fake_fp8(dz, "e5m2")
    assert torch.equal(op, base.prepare(fake_fp8(sw, "e4m3")))
    assert torch.equal(sim.linear(x, op, None), base.linear(q4x, op, None))
    assert torch.equal(sim.grad_input(dz, op), base.grad_input(q5dz, op))
    assert torch.equal(sim.grad_weight(dz, x, True, seeded(7)), base.grad_weight(q5dz, q4x, True, seeded(7)))


def _layers(method_cls, **kwargs):
    """The same layer (same init) on torch_fp8sim and triton_fp8sim."""
    layers = []
    for backend in ("torch_fp8sim", "triton_fp8sim"):
        torch.manual_seed(4)
        layer = SparseLinear(28, 20, method=method_cls(backend=backend, **kwargs), device=DEVICE)
        layer.train(False)  # forward and backward only: no optimizer, no mask refresh
        layers.append(layer)
    return layers


@pytest.mark.triton
@pytest.mark.parametrize("method_cls,kwargs", [(SSTE, {}), (SSTE, {"transposable": True}), (STE, {})])
def test_triton_fp8sim_matches_torch_fp8sim_on_forward_and_input_gradient(method_cls, kwargs):
    ref, tri = _layers(method_cls, **kwargs)
    assert torch.equal(ref.mask, tri.mask)
    torch.testing.assert_close(tri.sparse_weight(), ref.sparse_weight(), rtol=1e-6, atol=0)
    x = torch.randn(23, 28, device=DEVICE)  # 23 tokens: not a multiple of 4
    outs = []
    for layer in (ref, tri):
        xi = x.clone().requires_grad_()
        z = layer(xi)
        z.square().sum().backward()
        outs.append((z.detach(), xi.grad, layer.weight.grad.detach()))
    for a, b in zip(*outs):  # no MVUE: the weight gradient is deterministic too
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    exact = torch.nn.functional.linear(x, ref.sparse_weight(), ref.bias).detach()
    assert 1e-3 < rel(outs[0][0], exact) < 0.1  # the products did use FP8-rounded operands


@pytest.mark.triton
def test_triton_fp8sim_mvue_weight_gradient_is_unbiased_and_reproducible():
    torch.manual_seed(6)
    sim = get_backend("triton_fp8sim")
    # 7 tokens: one full group of 4 and one padded with a zero row (few tokens: the interpreter is slow)
    x, dz = torch.randn(7, 24, device=DEVICE), torch.randn(7, 16, device=DEVICE)
    exact = sim.grad_weight(dz, x, False, None).double()  # q5(dZ)^T q4(X): what MVUE(q5(dZ))^T q4(X) averages to
    gen = seeded(11)
    draws = torch.stack([sim.grad_weight(dz, x, True, gen).double() for _ in range(100)])
    assert not torch.equal(draws[0], draws[1])  # a new draw every call
    mean, sem = draws.mean(0), draws.std(0) / len(draws) ** 0.5
    assert bool(((mean - exact).abs() <= 6 * sem + 1e-5 * exact.abs() + 1e-6).all())
    # the MVUE noise is real (a biased or MVUE-less gradient would have sem == 0 everywhere)
    assert float(sem.max()) > 1e-3
    assert torch.equal(sim.grad_weight(dz, x, True, seeded(3)), sim.grad_weight(dz, x, True, seeded(3)))


def test_sste_layer_trains_with_simulated_fp8():
    torch.manual_seed(1)
    linear = torch.nn.Linear(16, 8)
    ref = SparseLinear.from_linear(copy.deepcopy(linear), SSTE())
    sim = SparseLinear.from_linear(copy.deepcopy(linear), SSTE(backend=NAME))
    assert torch.equal(ref.mask, sim.mask) and torch.equal(ref.beta, sim.beta)
    for layer in (ref, sim):
        layer.attached_optimizer = True  # one forward/backward, no optimizer needed here
    x = torch.randn(20, 16)
    ref(x).square().sum().backward()
    sim(x).square().sum().backward()
    assert 1e-3 < rel(sim.weight.grad, ref.weight.grad) < 0.2


def test_names_and_bad_input():
    assert {"torch_fp8sim", "triton_fp8sim"} <= set(available_backends())
    assert fp8_sim_backend_for("torch") == "torch_fp8sim" and fp8_sim_backend_for("triton") == "triton_fp8sim"
    assert fp8_sim_backend_for("triton_fp8sim") == "triton_fp8sim"  # already simulating: itself
    with pytest.raises(ValueError, match=r"backend must be one that FP8 simulation wraps.*'torch'.*got 'foo'"):
        fp8_sim_backend_for("foo")
    with pytest.raises(ValueError, match="inner must be a registered backend"):
        register_fp8_sim("foo")
    with pytest.raises(ValueError, match="not an FP8 simulation"):
        FP8SimBackend("torch_fp8sim")


@pytest.mark.triton
def test_triton_fp8sim_without_gpu_or_interpreter_refuses_naming_both_backends():
    code = ("from sparsity_lab.backends import get_backend\n"
            "try:\n    get_backend('triton_fp8sim')\nexcept RuntimeError as e:\n    print('REFUSED', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 0, out.stderr
    assert "REFUSED backend 'triton_fp8sim' runs its products on backend 'triton'" in out.stdout
    assert "TRITON_INTERPRET=1" in out.stdout


@pytest.mark.parametrize("given,expected", [({}, "torch_fp8sim"), ({"backend": "torch"}, "torch_fp8sim"),
                                            ({"backend": "triton"}, "triton_fp8sim")])
def test_train_fp8_sim_follows_backend(given, expected):
    args = argparse.Namespace(method="sste", mvue=True, fp8_sim=True, **given)
    assert method_options(args) == {"mvue": True, "backend": expected}


def test_train_fp8_sim_with_unwrappable_backend_is_a_clear_error():
    with pytest.raises(ValueError, match=r"--fp8-sim with --backend: backend must be one that FP8 simulation "
                                         r"wraps, one of \[.*'torch', .*'triton'.*\], got 'foo'"):
        method_options(argparse.Namespace(fp8_sim=True, backend="foo"))


def test_compare_fp8sim_variant_follows_backend():
    base = TrainConfig(model=GPTConfig(n_layer=1, n_head=2, d_model=16, context=16))
    for common, expected in (({}, "torch_fp8sim"), ({"backend": "triton"}, "triton_fp8sim")):
        cfg = variant_config(base, "sste_mvue_fp8sim", common, None, None)
        assert cfg.method == "sste" and cfg.method_options == {**common, "mvue": True, "backend": expected}
    assert variant_config(base, "sste_mvue", {"backend": "triton"}, None, None).method_options["backend"] == "triton"
    assert "backend" not in VARIANTS["sste_mvue_fp8sim"][1]  # the table entry itself stays backend-free
    with pytest.raises(ValueError, match="got 'foo'"):
        variant_config(base, "sste_mvue_fp8sim", {"backend": "foo"}, None, None)


@pytest.mark.triton
def test_cli_train_fp8_sim_on_triton(tmp_path):
    """--fp8-sim --backend triton trains (Triton kernels interpreted on the CPU) and records triton_fp8sim."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def f(x):\n    return x * 2\n" * 200)
    out = tmp_path / "run"
    code = main(["train", "--method", "sste", "--mvue", "--fp8-sim", "--backend", "triton", "--data", str(corpus),
                 "--steps", "2", "--eval-interval", "2", "--layers", "1", "--heads", "2", "--width", "16",
                 "--context", "16", "--batch-size", "4", "--eval-batches", "1", "--no-progress",
                 "--device", "cpu" if DEVICE.type == "cpu" else "cuda", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["method_options"] == {"mvue": True, "backend": "triton_fp8sim"}
    assert summary["step"] == 2 and 0 < summary["final_val_loss"] < 10


def test_compare_rejects_an_unwrappable_backend_before_training(tmp_path):
    base = TrainConfig(model=GPTConfig(n_layer=1, n_head=2, d_model=16, context=16), steps=2, device="cpu",
                       progress=False)
    with pytest.raises(ValueError, match="FP8 simulation wraps"):  # not the dense run's unknown-backend error
        run_comparison(base, ["dense", "sste_mvue_fp8sim"], tmp_path, common={"backend": "foo"}, figures=False)
    assert not (tmp_path / "dense").exists()
