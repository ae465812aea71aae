"""A method is a config plus one registered handler: new methods defined here, outside the package, train
through ``sparsify`` + ``attach_optimizer`` and behave as their handlers say, not as any built-in method.

    FixedMask        the mask rule: prune once at conversion, never recompute (flips stay 0)
    L1MaskedDecay    the decay: grad += decay * sign(W) * (1 - m) before the step (an L1 pull, where
                     MaskedDecay's is the L2 term decay * W * (1 - m))
"""
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch import nn

import sparsity_lab as sl
from sparsity_lab.backends.torch_reference import TorchBackend
from sparsity_lab.graph_step import eager_refresh_reason


@dataclass(frozen=True)
class FixedMask(sl.SparsityMethod):
    """One-shot pruning: the mask of the converted weight, kept for the whole run."""

    name: ClassVar[str] = "fixed_mask"


@sl.register_method(FixedMask)
class FixedMaskHandler(sl.MethodHandler):
    def mask(self, layer, weight):
        if layer.mask_updates == 0:  # at conversion: the magnitude mask of the weight
            return super().mask(layer, weight)
        return layer.mask.clone()


@dataclass(frozen=True)
class L1MaskedDecay(sl.SparsityMethod):
    decay: float = 0.05
    name: ClassVar[str] = "l1_masked_decay"


@sl.register_method(L1MaskedDecay)
class L1MaskedDecayHandler(sl.MethodHandler):
    def decay_gradient_(self, layer, grad, weight, mask, grad_scale):
        grad.add_(layer.method.decay * grad_scale * weight.sign() * ~mask)


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))


def _train(method: sl.SparsityMethod, steps: int = 6, lr: float = 0.5, seed: int = 0):
    """SGD on a fixed regression task; returns the model and the per-step masks of its first layer."""
    model = sl.sparsify(_mlp(seed), method, select="all")
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sl.attach_optimizer(model, opt)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 32, generator=gen), torch.randn(64, 32, generator=gen)
    masks = []
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        masks.append(model[0].mask.clone())
    return model, masks


def test_a_new_mask_rule_trains_and_differs_from_the_built_in_rule():
    fixed, fixed_masks = _train(FixedMask())
    ste, ste_masks = _train(sl.STE())
    first = fixed_masks[0]
    assert all(torch.equal(mask, first) for mask in fixed_masks)  # the rule held at every refresh
    assert fixed[0].mask_updates == ste[0].mask_updates == 6  # conversion + 5 refreshes, as often as STE ...
    assert fixed[0].flips_total == 0 and sl.is_nm(fixed[0].sparse_weight(), 2, 4)
    assert ste[0].flips_total > 0 and not torch.equal(ste_masks[-1], first)  # ... where STE's mask moves
    assert not torch.equal(fixed[0].weight, ste[0].weight)


def test_a_new_decay_trains_and_differs_from_masked_decay():
    lr, decay = 0.5, 0.05
    l1, _ = _train(L1MaskedDecay(decay=decay), steps=1, lr=lr)
    l2, _ = _train(sl.MaskedDecay(decay=decay, dense_finetune_at=None), steps=1, lr=lr)
    ste, _ = _train(sl.STE(), steps=1, lr=lr)
    w0 = sl.sparse_layers(sl.sparsify(_mlp(), sl.STE(), select="all"))[0][1].weight.detach()
    mask = ste[0].mask  # one step: every method computed its mask from the same w0
    assert torch.equal(l1[0].mask, mask) and torch.equal(l2[0].mask, mask)
    # one SGD step: the handler's term joins the gradient the optimizer reads
    torch.testing.assert_close(l1[0].weight.detach(), ste[0].weight.detach() - lr * decay * w0.sign() * ~mask)
    torch.testing.assert_close(l2[0].weight.detach(), ste[0].weight.detach() - lr * decay * w0 * ~mask)
    assert not torch.allclose(l1[0].weight, l2[0].weight)


def test_the_layer_asks_the_handler_not_the_config_type():
    assert isinstance(sl.method_handler(FixedMask()), FixedMaskHandler)

    @dataclass(frozen=True)
    class MySRSTE(sl.SRSTE):  # a config subclass without a handler of its own: its base's behaviour
        pass

    assert sl.method_handler(MySRSTE()) is sl.method_handler(sl.SRSTE())
    assert sl.method_handler(sl.STE()) is not sl.method_handler(sl.SRSTE())


def test_a_config_without_a_handler_is_refused_by_name():
    @dataclass(frozen=True)
    class Unregistered(sl.SparsityMethod):
        name: ClassVar[str] = "unregistered"

    with pytest.raises(TypeError, match=r"no handler is registered for Unregistered.*register_method\(Unregistered\)"):
        sl.sparsify(_mlp(), Unregistered(), select="all")
    with pytest.raises(TypeError, match="SparsityMethod subclass"):
        sl.register_method(int)
    with pytest.raises(TypeError, match="MethodHandler subclass"):
        sl.register_method(Unregistered)(object)
    with pytest.raises(ValueError, match="FixedMask already has the handler FixedMaskHandler"):
        sl.register_method(FixedMask)(L1MaskedDecayHandler)


def test_a_cuda_graph_refreshes_a_new_mask_rule_eagerly_unless_it_says_it_can_be_captured():
    class CapturableTorch(TorchBackend):
        name = "torch_capturable"
        mask_refresh_capturable = True

    layer = sl.SparseLinear(16, 8, method=FixedMask())
    layer.backend = CapturableTorch()
    assert "FixedMaskHandler computes its own masks" in eager_refresh_reason(layer, masks_in_graph=True)
    FixedMaskHandler.own_mask_capturable = True
    try:
        assert eager_refresh_reason(layer, masks_in_graph=True) is None
    finally:
        FixedMaskHandler.own_mask_capturable = False
