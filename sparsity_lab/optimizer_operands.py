"""A 2:4 layer's next compressed operands written by the optimizer's step instead of the next forward.

Between mask refreshes the next forward's operand (S(W) and S(W)^T compressed) depends only on the weight the
optimizer is about to write, the mask and S-STE's frozen beta. An optimizer that can write it in its own pass
over the weight (``MasterWeights`` under its fused update: kernel 26) is asked to by ``attach_optimizer``'s
pre-hook (``operand_request``), and its post-hook puts what was written into the layer's operand cache
(``put_optimizer_operand``), which the forward then serves. Where the next forward would not use it (its mask
refresh is due, a dense phase, a CUDA graph that prepares it inside) nothing is asked, and an operand that the
layer's state no longer matches is dropped.
"""
from __future__ import annotations

import torch

from .layers import SparseLinear, refreshes_mask_with_own_hooks
from .methods.handlers import method_handler

OPERAND_DTYPE = torch.bfloat16  # the products' dtype kernel 26 writes


def mask_due_next_step(layer: SparseLinear) -> bool:
    """Whether the layer's mask will be due in the forward after this optimizer step (``SparseLinear.mask_due``
    once the step counter has advanced)."""
    return (method_handler(layer.method).tracks_mask(layer)
            and layer.step + 1 - layer.mask_step >= layer.method.mask_refresh_interval)


def operand_request(layer: SparseLinear) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(mask, beta) for an optimizer to write the layer's next operand with, or None where the next forward would
    not serve it: no gradient, a dense phase, a mask due next step, products asked in another dtype or without the
    input gradient last time (``OperandCache.last_request``), a layer in a CUDA graph (``operand_in_graph``), a
    sharded layer, or a backend that does not take it (``Backend.takes_optimizer_operand``)."""
    if layer.weight.grad is None or layer.dense_now or mask_due_next_step(layer):
        return None
    if layer.operand_cache.last_request != (OPERAND_DTYPE, True) or getattr(layer, "operand_in_graph", False):
        return None
    if not refreshes_mask_with_own_hooks(layer):  # a sharded layer's weight and mask are not the products' operands
        return None
    m = layer.method
    if not layer.backend.takes_optimizer_operand(layer.weight.detach(), layer.mask, m.n, m.m, OPERAND_DTYPE):
        return None
    return layer.mask, method_handler(m).beta(layer)


def put_optimizer_operand(layer: SparseLinear, forms: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """After the step counter advanced: the operand made of ``forms`` (S(W), S(W)^T written by the optimizer) into
    the layer's operand cache, where the next forward finds it. False (dropped) when that forward would not serve
    it: its mask is due or it runs dense."""
    if layer.dense_now or layer.mask_due():
        return False
    m = layer.method
    operand = layer.backend.operand_from_forms(layer.weight.detach(), layer.mask, method_handler(m).beta(layer), m.n,
                                               m.m, OPERAND_DTYPE, forms)
    layer.operand_cache.put(layer, OPERAND_DTYPE, operand, backward=True)
    return True
