"""The "triton" backend behind the seam: same layer results as backend="torch" (MVUE: in expectation)."""
import os
import subprocess
import sys

import pytest
import torch
from _kernel_testing import DEVICE

import sparsity_lab as sl
from sparsity_lab.backends import available_backends, get_backend
from sparsity_lab.layers import SparseLinear


def _python(code: str, **env_changes) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_importing_the_package_does_not_import_triton():
    out = _python("import sys, sparsity_lab; print('triton' in sys.modules, sparsity_lab.backends.available_backends())")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "False" and "'triton'" in out.stdout


def test_without_gpu_or_interpreter_the_backend_refuses_clearly():
    code = ("from sparsity_lab.backends import get_backend\n"
            "try:\n    get_backend('triton')\nexcept RuntimeError as e:\n    print('REFUSED', e)\n")
    out = _python(code, CUDA_VISIBLE_DEVICES="")
    assert out.returncode == 0, out.stderr
    assert "REFUSED" in out.stdout and "TRITON_INTERPRET=1" in out.stdout


def test_triton_backend_is_registered_and_2_4_only():
    assert "triton" in available_backends()
    backend = get_backend("triton")
    assert backend.name == "triton"
    with pytest.raises(ValueError, match="2:4 masks only"):
        backend.mask(torch.randn(8, 8, device=DEVICE), 1, 4, False)


def _pair(method_cls, seed, **kwargs):
    """The same layer (same init, same MVUE seed) on the two backends."""
    layers = []
    for backend in ("torch", "triton"):
        torch.manual_seed(seed)
        layer = SparseLinear(24, 16, method=method_cls(backend=backend, **kwargs), device=DEVICE)
        layers.append(layer)
    return layers


def _step(layer, x):
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    sl.attach_optimizer(layer, opt)
    outs, grads = [], []
    for _ in range(2):  # two steps: the mask is refreshed from the updated weight in between
        out = layer(x)
        out.square().sum().backward()
        outs.append(out.detach().clone())
        opt.step()  # the masked decay (pre-hook) lands in the gradient before the update
        grads.append(layer.weight.grad.clone())
        opt.zero_grad()
    return outs, grads, layer.mask.clone()


@pytest.mark.parametrize("method_cls,kwargs", [
    (sl.STE, {}),
    (sl.STE, {"transposable": True}),
    (sl.SRSTE, {"decay": 0.05}),
    (sl.MaskedDecay, {"decay": 0.05, "total_steps": 10}),
    (sl.SSTE, {}),
    (sl.SSTE, {"transposable": True}),
])
def test_same_outputs_and_gradients_as_the_reference(method_cls, kwargs):
    ref, tri = _pair(method_cls, 0, **kwargs)
    assert torch.equal(ref.weight, tri.weight) and torch.equal(ref.mask, tri.mask)
    x = torch.randn(10, 24, device=DEVICE)
    out_r, grad_r, mask_r = _step(ref, x)
    out_t, grad_t, mask_t = _step(tri, x)
    assert torch.equal(mask_r, mask_t)
    for a, b in zip(out_r + grad_r, out_t + grad_t):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_mvue_weight_gradient_is_unbiased_and_reproducible():
    x = torch.randn(10, 24, device=DEVICE)  # 10 tokens: padded to 12 inside, as the reference does
    _, tri = _pair(sl.SSTE, 1, mvue=True)
    tri.train(False)  # forward and backward only: no optimizer, no mask refresh
    z = torch.nn.functional.linear(x, tri.sparse_weight(), tri.bias)
    dense = ((2 * z).t() @ x).double()  # d(sum z^2)/dW without MVUE (straight-through)
    draws = []
    for _ in range(120):
        tri.weight.grad = None
        tri(x).square().sum().backward()
        draws.append(tri.weight.grad.double().clone())
    draws = torch.stack(draws)
    assert not torch.equal(draws[0], draws[1])  # a new draw every backward
    mean, sem = draws.mean(0), draws.std(0) / len(draws) ** 0.5
    assert bool(((mean - dense).abs() <= 6 * sem + 1e-5 * dense.abs() + 1e-6).all())
    # the same layer seed and draw counter give the same gradient
    grads = []
    for _ in range(2):
        layer = _pair(sl.SSTE, 1, mvue=True)[1]
        layer.train(False)
        layer(x).square().sum().backward()
        grads.append(layer.weight.grad)
    assert torch.equal(grads[0], grads[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backends_agree_on_gpu_at_size(dtype):
    for method in (sl.STE(transposable=True, backend="triton"), sl.SSTE(backend="triton")):
        torch.manual_seed(0)
        tri = SparseLinear(1024, 512, method=method, device="cuda", dtype=dtype)
        torch.manual_seed(0)
        ref = SparseLinear(1024, 512, method=type(method)(transposable=method.transposable), device="cuda", dtype=dtype)
        kept = [(layer.weight.detach().double().abs() * layer.mask).sum() for layer in (tri, ref)]
        torch.testing.assert_close(kept[0], kept[1], rtol=1e-6, atol=0)  # optimal either way
        tri.mask.copy_(ref.mask)  # float32 near-ties may pick another optimal pattern: compare the rest
        x = torch.randn(256, 1024, device="cuda", dtype=dtype)
        tri.train(False)
        ref.train(False)
        if dtype == torch.float32:
            torch.testing.assert_close(tri(x), ref(x))
            continue
        # bf16 S-STE: the kernel rounds beta * S(W) once, the reference twice: weights within one ulp
        # of the float32 result, so outputs within that ulp propagated: eps * |x| @ |W|^T (+ rounding)
        eps = torch.finfo(dtype).eps
        w_ref = ref.sparse_weight().float()
        assert bool(((tri.sparse_weight().float() - w_ref).abs() <= 2 * eps * w_ref.abs()).all())
        bound = 2 * eps * (x.float().abs() @ w_ref.abs().t()) + eps * ref(x).float().abs()
        assert bool(((tri(x).float() - ref(x).float()).abs() <= bound + 1e-6).all())
