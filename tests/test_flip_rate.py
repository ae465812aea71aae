"""Flip rate r_t = ||m_t XOR m_{t-1}||_1 / D: the functions, and the counters a SparseLinear keeps.

Layer tests set the weights by hand between optimizer steps (SGD with lr=0 leaves them alone) so
that the mask changes are known in advance.
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import sparsity_lab as sl
from sparsity_lab.masks.nm import nm_mask
from sparsity_lab.masks.transposable import transposable_mask
from sparsity_lab.methods.flip_rate import flip_rate, mask_flips, overall_flip_rate


def test_flip_rate_on_hand_made_masks():
    m0 = torch.tensor([[1, 1, 0, 0], [0, 0, 1, 1]], dtype=torch.bool)
    m1 = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
    m2 = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    assert mask_flips(m0, m1) == 2 and flip_rate(m0, m1) == 2 / 8
    assert mask_flips(m1, m2) == 4 and flip_rate(m1, m2) == 4 / 8
    assert flip_rate(m0, m0) == 0.0
    # masks given as 0/1 numbers count the same way
    assert flip_rate(m0.float(), m1.int()) == 2 / 8
    # overall: flips summed over sizes summed, not the mean of the per-layer rates
    assert overall_flip_rate([(2, 8), (1, 100)]) == pytest.approx(3 / 108)
    assert overall_flip_rate([(2, 8), (1, 100)]) != pytest.approx((2 / 8 + 1 / 100) / 2)
    assert math.isnan(overall_flip_rate([]))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 6))
def test_flip_rate_properties(seed, rows):
    gen = torch.Generator().manual_seed(seed)
    a, b, c = (torch.rand(rows, 8, generator=gen) < 0.5 for _ in range(3))
    assert 0.0 <= flip_rate(a, b) <= 1.0
    assert flip_rate(a, b) == flip_rate(b, a)
    assert flip_rate(a, c) <= flip_rate(a, b) + flip_rate(b, c) + 1e-12  # Hamming distance
    assert mask_flips(a, b) == int((a != b).sum())
    assert flip_rate(a, ~a) == 1.0


def linear_with(weight: torch.Tensor, method) -> sl.SparseLinear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(weight)
    return sl.SparseLinear.from_linear(lin, method)


def set_weight(layer: nn.Linear, weight: torch.Tensor) -> None:
    with torch.no_grad():
        layer.weight.copy_(weight)


W_A = torch.tensor([[4.0, 3.0, 2.0, 1.0, 4.0, 3.0, 2.0, 1.0],
                    [1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]])       # masks 1100 1100 / 0011 0011
W_B = torch.tensor([[2.0, 3.0, 4.0, 1.0, 4.0, 3.0, 2.0, 1.0],
                    [1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]])       # row 0 group 0 -> 0110: 2 flips
W_C = torch.tensor([[2.0, 3.0, 4.0, 1.0, 4.0, 3.0, 2.0, 1.0],
                    [4.0, 3.0, 2.0, 1.0, 4.0, 3.0, 1.0, 2.0]])       # row 1: 0011 -> 1100 twice: 8 flips


def test_layer_counts_known_flips_and_report():
    big_w = torch.arange(32.0).reshape(4, 8)  # second layer: 32 weights, masks 0011 0011 per row
    model = nn.Sequential(linear_with(W_A, sl.STE()), linear_with(big_w, sl.STE()))
    small, big = model[0], model[1]
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sl.attach_optimizer(model, opt)
    x = torch.randn(3, 8)

    def train_step():
        opt.zero_grad()
        small(x).sum().backward()
        big(x).sum().backward()
        opt.step()

    # step 0: only the conversion mask exists, so no flip rate yet
    train_step()
    assert small.mask_updates == 1 and math.isnan(small.last_flip_rate)
    report = sl.flip_report(model)
    assert math.isnan(report["0"]) and math.isnan(report["1"]) and math.isnan(report["overall"])

    # step 1: two entries of the small layer flip, none of the big one
    set_weight(small, W_B)
    train_step()
    assert small.mask_updates == 2 and small.last_flips == 2
    assert small.last_flip_rate == 2 / 16
    assert big.last_flips == 0 and big.last_flip_rate == 0.0
    report = sl.flip_report(model)
    assert report["0"] == 2 / 16 and report["1"] == 0.0
    assert report["overall"] == pytest.approx((2 + 0) / (16 + 32))

    # step 2: eight flips in the small layer; the big layer's first row reversed: 0011 -> 1100 twice
    set_weight(small, W_C)
    set_weight(big, torch.cat([big_w[:1].flip(-1), big_w[1:]]))
    train_step()
    assert small.last_flips == 8 and small.flips_total == 10
    assert big.last_flips == 8 and big.flips_total == 8
    report = sl.flip_report(model)
    assert report["0"] == 8 / 16 and report["1"] == 8 / 32
    assert report["overall"] == pytest.approx((8 + 8) / (16 + 32))
    assert torch.equal(small.mask, nm_mask(W_C))


def test_transposable_layer_counts_flips_of_its_mask():
    gen = torch.Generator().manual_seed(3)
    w1, w2 = torch.randn(8, 8, generator=gen), torch.randn(8, 8, generator=gen)
    layer = linear_with(w1, sl.STE(transposable=True))
    opt = torch.optim.SGD(layer.parameters(), lr=0.0)
    sl.attach_optimizer(layer, opt)
    layer(torch.randn(2, 8)).sum().backward()
    opt.step()
    set_weight(layer, w2)
    layer(torch.randn(2, 8)).sum().backward()
    expected = mask_flips(transposable_mask(w1), transposable_mask(w2))
    assert expected > 0
    assert layer.last_flips == expected and layer.last_flip_rate == expected / 64


def test_refresh_interval_masks_every_k_steps_values_every_step():
    k = 3
    layer = linear_with(W_A, sl.STE(mask_refresh_interval=k))
    opt = torch.optim.SGD(layer.parameters(), lr=0.0)
    sl.attach_optimizer(layer, opt)
    x = torch.randn(5, 8)
    weights = [W_A, W_B, W_C, W_C, W_A, W_B, W_B, W_A]  # the magnitude mask changes at every step
    stale_mask = nm_mask(W_A)
    for step, w in enumerate(weights):
        set_weight(layer, w)
        opt.zero_grad()
        y = layer(x)
        if step % k == 0 and step > 0:
            stale_mask = nm_mask(w)  # a mask computation, from the weight of this step
        assert layer.mask_updates == 1 + step // k, step
        assert layer.mask_step == (step // k) * k
        assert torch.equal(layer.mask, stale_mask), step
        # the values are this step's weights, under the (possibly stale) mask
        torch.testing.assert_close(y, x @ (w * stale_mask).t(), rtol=0, atol=1e-6)
        if step % k != 0:
            assert not torch.equal(nm_mask(w), stale_mask)  # a fresh mask would have differed
        y.sum().backward()
        opt.step()
    # flips were counted only at the computations: step 3 (A -> C) and step 6 (C -> B)
    a_to_c, c_to_b = mask_flips(nm_mask(W_A), nm_mask(W_C)), mask_flips(nm_mask(W_C), nm_mask(W_B))
    assert a_to_c > 0 and c_to_b > 0
    assert layer.flips_total == a_to_c + c_to_b
    assert layer.last_flips == c_to_b


def test_flip_report_fresh_only_marks_stale_steps():
    layer = linear_with(W_A, sl.STE(mask_refresh_interval=2))
    model = nn.Sequential(layer)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sl.attach_optimizer(model, opt)
    x = torch.randn(2, 8)
    fresh = []
    for w in (W_A, W_B, W_C, W_A, W_B):
        set_weight(layer, w)
        opt.zero_grad()
        model(x).sum().backward()
        fresh.append(sl.flip_report(model, fresh_only=True)["0"])
        opt.step()
    # masks computed at steps 2 and 4 (step 0's is the conversion mask, without a predecessor)
    assert [math.isnan(r) for r in fresh] == [True, True, False, True, False]
    assert fresh[2] == mask_flips(nm_mask(W_A), nm_mask(W_C)) / 16
    assert fresh[4] == mask_flips(nm_mask(W_C), nm_mask(W_B)) / 16


def test_dense_method_tracks_would_be_mask_with_exact_dense_output():
    torch.manual_seed(0)
    lin = nn.Linear(8, 4)
    reference = nn.Linear(8, 4)
    reference.load_state_dict(lin.state_dict())
    layer = sl.SparseLinear.from_linear(lin, sl.Dense())
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    sl.attach_optimizer(layer, opt)
    previous = nm_mask(layer.weight)
    for step in range(4):
        x = torch.randn(3, 8)
        opt.zero_grad()
        ref_opt.zero_grad()
        y = layer(x)
        y_ref = reference(x)
        assert torch.equal(y, y_ref)
        (y ** 3).sum().backward()
        (y_ref ** 3).sum().backward()
        assert torch.equal(layer.weight.grad, reference.weight.grad)
        assert torch.equal(layer.bias.grad, reference.bias.grad)
        # the would-be mask follows the dense weight and its flips are counted
        current = nm_mask(layer.weight)
        assert torch.equal(layer.mask, current)
        if step > 0:
            assert layer.last_flips == mask_flips(previous, current)
        previous = current
        opt.step()
        ref_opt.step()
    assert layer.mask_updates == 4


def test_dense_without_flip_tracking_computes_no_masks():
    layer = sl.SparseLinear(8, 4, method=sl.Dense(track_flips=False))
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    sl.attach_optimizer(layer, opt)
    for _ in range(3):
        layer(torch.randn(2, 8)).sum().backward()
        opt.step()
    assert layer.mask_updates == 1 and math.isnan(layer.last_flip_rate)
