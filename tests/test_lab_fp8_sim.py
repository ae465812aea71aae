"""Simulated FP8 products (the S-STE + FP8 row): operands on the FP8 grid, errors of FP8's size."""
import copy

import pytest
import torch

from sparsity_lab import SSTE, SparseLinear
from sparsity_lab.backends import get_backend
from sparsity_lab.lab.fp8_sim import NAME, fake_fp8


def rel(a, b):
    return float((a - b).norm() / b.norm())


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
    x, w, dz = torch.randn(24, 16), torch.randn(12, 16), torch.randn(24, 12)
    op = backend.prepare(w)
    torch.testing.assert_close(backend.linear(x, op, None), fake_fp8(x, "e4m3") @ fake_fp8(w, "e4m3").T)
    torch.testing.assert_close(backend.grad_input(dz, op), fake_fp8(dz, "e5m2") @ fake_fp8(w, "e4m3"))
    torch.testing.assert_close(backend.grad_weight(dz, x, False, None), fake_fp8(dz, "e5m2").T @ fake_fp8(x, "e4m3"))
    assert 1e-3 < rel(backend.linear(x, op, None), exact.linear(x, w, None)) < 0.1
    assert 1e-3 < rel(backend.grad_weight(dz, x, False, None), exact.grad_weight(dz, x, False, None)) < 0.2


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
