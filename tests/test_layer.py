"""SparseLinear against a plain dense reference written out by hand, for every method.

    forward  Z  = X S^T + b        S = m * W (STE family), beta * soft_threshold(W, m) (S-STE), W (dense)
    dX = dZ S       dW = dZ^T X (straight-through) [+ lambda (1 - m) W for SR-STE]       db = sum dZ
"""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sparsity_lab as sl
from sparsity_lab.masks.nm import is_nm, nm_mask
from sparsity_lab.masks.transposable import transposable_mask
from sparsity_lab.methods.soft_threshold import soft_threshold

pytestmark = pytest.mark.filterwarnings("ignore:SparseLinear is training but no optimizer")

METHODS = {
    "dense": sl.Dense(),
    "ste": sl.STE(),
    "ste_transposable": sl.STE(transposable=True),
    "ste_4of8": sl.STE(n=4, m=8),
    "srste": sl.SRSTE(decay=0.1),
    "srste_transposable": sl.SRSTE(decay=0.1, transposable=True),
    "masked_decay": sl.MaskedDecay(decay=0.1, total_steps=100),
    "sste": sl.SSTE(),
    "sste_transposable": sl.SSTE(transposable=True),
}


def reference_operand(layer: sl.SparseLinear) -> torch.Tensor:
    """S from the layer's weight alone (the mask recomputed here, not read from the layer)."""
    method, w = layer.method, layer.weight.detach()
    if not method.sparse_forward:
        return w
    mask = transposable_mask(w, method.n, method.m) if method.transposable else nm_mask(w, method.n, method.m, dim=1)
    assert torch.equal(layer.mask, mask)
    if method.soft_threshold:
        return layer.beta.to(w.dtype) * soft_threshold(w, mask, method.n, method.m)
    return w * mask


def reference_grads(layer, x2, dz2, s):
    """(dX, dW, db) for flattened x (tokens, in) and dZ (tokens, out)."""
    dw = dz2.t() @ x2
    decay = layer.method.decay_in_backward
    if decay:
        dw = dw + decay * (layer.weight.detach() * ~layer.mask)  # W first: keeps W's dtype
    return dz2 @ s, dw, dz2.sum(0)


def make_layer(method, dtype=torch.float32, bias=True, seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(16, 8, bias=bias, dtype=dtype)
    return sl.SparseLinear.from_linear(lin, method)


@pytest.mark.parametrize("name", list(METHODS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("x_shape", [(7, 16), (2, 5, 16)], ids=["2d", "3d"])
def test_forward_and_gradients_match_dense_reference(name, dtype, x_shape):
    layer = make_layer(METHODS[name], dtype)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(*x_shape, generator=gen, dtype=dtype, requires_grad=True)
    dz = torch.randn(*x_shape[:-1], 8, generator=gen, dtype=dtype)
    s = reference_operand(layer)
    y = layer(x)
    assert y.shape == (*x_shape[:-1], 8) and y.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y, x.detach() @ s.t() + layer.bias.detach(), **tol)
    y.backward(dz)
    dx, dw, db = reference_grads(layer, x.detach().reshape(-1, 16), dz.reshape(-1, 8), s)
    torch.testing.assert_close(x.grad, dx.reshape(x_shape), **tol)
    torch.testing.assert_close(layer.weight.grad, dw, **tol)
    torch.testing.assert_close(layer.bias.grad, db, **tol)
    assert layer.weight.grad.dtype == layer.bias.grad.dtype == dtype


def test_srste_gradient_differs_from_ste_by_the_decay_term():
    """The SR-STE term is in .grad right after backward (so before any clipping)."""
    x = torch.randn(5, 16)
    grads = {}
    for name in ("ste", "srste"):
        layer = make_layer(METHODS[name], seed=3)
        layer(x).sum().backward()
        grads[name] = layer.weight.grad
    expected = 0.1 * (~nm_mask(layer.weight.detach(), dim=1)) * layer.weight.detach()
    assert float(expected.abs().sum()) > 0
    torch.testing.assert_close(grads["srste"] - grads["ste"], expected, rtol=1e-6, atol=1e-6)


def test_no_bias_layer():
    layer = make_layer(sl.STE(), bias=False)
    x = torch.randn(4, 16, requires_grad=True)
    y = layer(x)
    s = reference_operand(layer)
    torch.testing.assert_close(y, x.detach() @ s.t())
    y.sum().backward()
    assert layer.bias is None and x.grad is not None


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_odd_sizes_property(out_groups, in_groups, tokens, seed):
    """Random shapes (out = 4a, in = 4b, any token count): output and gradients match the reference."""
    torch.manual_seed(seed)
    out, inp = 4 * out_groups, 4 * in_groups
    for method in (sl.STE(transposable=True), sl.SSTE()):
        layer = sl.SparseLinear(inp, out, method=method)
        x = torch.randn(tokens, inp, requires_grad=True)
        dz = torch.randn(tokens, out)
        s = reference_operand(layer)
        y = layer(x)
        torch.testing.assert_close(y, x.detach() @ s.t() + layer.bias.detach(), rtol=1e-5, atol=1e-5)
        y.backward(dz)
        torch.testing.assert_close(x.grad, dz @ s, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.weight.grad, dz.t() @ x.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["ste", "srste_transposable", "sste", "dense"])
def test_bf16_autocast_on_cpu(name):
    """Under autocast the products run in bf16, like nn.Linear's: compare with F.linear of the same
    S under the same autocast (dense autograd reference), bf16 tolerance."""
    layer = make_layer(METHODS[name], seed=4)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 6, 16, generator=gen, requires_grad=True)
    dz = torch.randn(2, 6, 8, generator=gen)
    s_leaf = reference_operand(layer).clone().requires_grad_(True)
    b_leaf = layer.bias.detach().clone().requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
        y_ref = F.linear(x_ref, s_leaf, b_leaf)
    assert y.dtype == y_ref.dtype == torch.bfloat16
    tol = dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(y.float(), y_ref.float(), **tol)
    y.backward(dz)
    y_ref.backward(dz)
    dw_ref = s_leaf.grad
    if layer.method.decay_in_backward:
        dw_ref = dw_ref + layer.method.decay_in_backward * (layer.weight.detach() * ~layer.mask)
    assert x.grad.dtype == torch.float32 and layer.weight.grad.dtype == torch.float32
    torch.testing.assert_close(x.grad, x_ref.grad, **tol)
    torch.testing.assert_close(layer.weight.grad, dw_ref, **tol)
    torch.testing.assert_close(layer.bias.grad, b_leaf.grad, **tol)
    # and bf16 really was used: the fp32 result differs from the bf16 one by more than fp32 noise
    if name != "dense":
        y32 = x.detach() @ s_leaf.detach().t() + layer.bias.detach()
        assert float((y.detach().float() - y32).abs().max()) > 1e-4


def test_operand_prepared_once_per_optimizer_step_across_micro_steps():
    layer = make_layer(sl.SSTE(), seed=6)
    opt = torch.optim.SGD(layer.parameters(), lr=0.05)
    sl.attach_optimizer(layer, opt)
    micro = [torch.randn(3, 16) for _ in range(3)]
    for step in range(3):
        opt.zero_grad()
        expected_dw = torch.zeros_like(layer.weight)
        prepared_before = layer.operand_cache.prepare_count
        operands = set()
        for i, x in enumerate(micro):
            y = layer(x)
            if i == 0:
                s = reference_operand(layer)  # after the first forward: the mask of this step
            operands.add(id(layer.operand_cache.value))
            torch.testing.assert_close(y, x @ s.t() + layer.bias.detach())
            (y.sum() / len(micro)).backward()
            expected_dw += torch.ones(3, 8).t() @ x / len(micro)
        assert layer.operand_cache.prepare_count == prepared_before + 1, step  # one prepare for 3 micro-steps
        assert len(operands) == 1
        assert layer.mask_updates == 1 + step  # one mask per optimizer step (interval 1)
        torch.testing.assert_close(layer.weight.grad, expected_dw)
        opt.step()


def test_operand_rebuilt_when_weight_changes_by_hand():
    layer = make_layer(sl.STE(), seed=7)
    x = torch.randn(2, 16)
    layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)
    y = layer(x)
    torch.testing.assert_close(y, x @ (layer.weight.detach() * layer.mask).t() + layer.bias.detach())


@pytest.mark.parametrize("tokens", [8, 7])
def test_mvue_weight_gradient_unbiased_over_seeds(tokens):
    """SSTE(mvue=True): dX and db are exact; dW = MVUE(dZ^T) X is random but unbiased. Each forward
    draws from a new counter value; the mean over draws is within 6 standard errors of dZ^T X."""
    layer = make_layer(sl.SSTE(mvue=True), seed=8)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(tokens, 16, generator=gen, dtype=torch.float32)
    dz = torch.randn(tokens, 8, generator=gen)
    s = reference_operand(layer)
    exact_dw = dz.t() @ x
    draws = []
    for _ in range(1500):
        layer.weight.grad = None
        xg = x.clone().requires_grad_(True)
        layer(xg).backward(dz)
        torch.testing.assert_close(xg.grad, dz @ s, rtol=1e-5, atol=1e-5)
        draws.append(layer.weight.grad.clone())
    draws = torch.stack(draws).double()
    assert not torch.allclose(draws[0], exact_dw.double(), atol=1e-3)  # a single draw is random
    assert not torch.equal(draws[0], draws[1])
    mean, se = draws.mean(0), draws.std(0) / draws.shape[0] ** 0.5
    assert bool(((mean - exact_dw.double()).abs() <= 6 * se + 1e-6).all())
    assert layer.mvue_calls == 1500


def test_mvue_groups_run_along_tokens():
    """With X = I (tokens = in), dW = MVUE(dZ^T) = MVUE(dZ)^T: at most 2 of 4 consecutive tokens
    survive in every output column."""
    layer = make_layer(sl.SSTE(mvue=True), bias=False, seed=10)
    x = torch.eye(16)
    dz = torch.randn(16, 8)
    layer(x).backward(dz)
    mvue_dz = layer.weight.grad.t()  # (tokens, out)
    assert is_nm(mvue_dz, 2, 4, dim=0, exact=False)
    assert not is_nm(dz, 2, 4, dim=0, exact=False)
    kept = mvue_dz != 0
    assert bool((torch.sign(mvue_dz[kept]) == torch.sign(dz[kept])).all())


def test_no_grad_forward_does_not_consume_mvue_draws():
    layer = make_layer(sl.SSTE(mvue=True), seed=11)
    with torch.no_grad():
        layer(torch.randn(4, 16))
    layer.eval()
    layer(torch.randn(4, 16)).sum()  # eval with grad still draws (a backward may follow)
    assert layer.mvue_calls == 1


def test_srste_decay_is_added_once_per_optimizer_step_across_micro_steps():
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("mlp", torch.nn.Linear(8, 8))
    sl.sparsify(model, sl.SRSTE(decay=0.5))
    layer = model.mlp
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sl.attach_optimizer(model, opt)
    xs = [torch.randn(4, 8) for _ in range(3)]
    for x in xs:  # three micro-steps of one optimizer step
        model(x).sum().backward()
    dense_sum = sum(torch.ones(4, 8).T @ x for x in xs)
    expected = dense_sum + 0.5 * layer.weight.detach() * (~layer.mask)
    torch.testing.assert_close(layer.weight.grad, expected)
    opt.step()
    opt.zero_grad()
    model(xs[0]).sum().backward()  # the next step carries the decay again
    torch.testing.assert_close(layer.weight.grad,
                               torch.ones(4, 8).T @ xs[0] + 0.5 * layer.weight.detach() * (~layer.mask))
