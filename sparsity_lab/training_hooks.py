"""Where the per-step work of 2:4 training goes in an optimizer step.

``attach_optimizer(model, optimizer)`` registers two hooks on the optimizer:
* a step *pre*-hook: masked decay, grad += decay * (1 - m) * W. ``optimizer.step()`` runs after the
  user has unscaled (``GradScaler.step`` unscales first and skips the step on inf) and clipped the
  gradients, so the decay lands after unscaling and clipping and before the update: the placement
  of Hu et al. 2024, and AdamW normalises it.
* a step *post*-hook: every sparse layer's step counter advances, which drives the mask refresh
  interval and the dense fine-tune switch.
Loops without a torch optimizer call ``apply_masked_decay(model)`` and ``advance_step(model)``.
"""
from __future__ import annotations

import torch
from torch import nn

from .layers import SparseLinear


def sparse_layers(model: nn.Module) -> list[tuple[str, SparseLinear]]:
    """(qualified name, layer) for every SparseLinear in the model, in module order."""
    return [(name, mod) for name, mod in model.named_modules() if isinstance(mod, SparseLinear)]


def apply_masked_decay(model: nn.Module) -> None:
    for _, layer in sparse_layers(model):
        layer.apply_masked_decay()


def advance_step(model: nn.Module) -> None:
    for _, layer in sparse_layers(model):
        layer.advance_step()


class AttachedOptimizer:
    """Handle returned by :func:`attach_optimizer`; ``remove()`` undoes it."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.layers = [layer for _, layer in sparse_layers(model)]
        if not self.layers:
            raise ValueError("model has no SparseLinear layers: call sparsity_lab.sparsify(model, method) first")
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        missing = [layer for layer in self.layers if id(layer.weight) not in params]
        if missing:
            raise ValueError(f"{len(missing)} sparse layer weight(s) are not in the optimizer's param_groups; "
                             "create the optimizer after sparsify()")
        self._pre = optimizer.register_step_pre_hook(lambda opt, args, kwargs: self._before_step())
        self._post = optimizer.register_step_post_hook(lambda opt, args, kwargs: self._after_step())
        for layer in self.layers:
            layer.attached_optimizer = True

    def _before_step(self) -> None:
        for layer in self.layers:
            layer.apply_masked_decay()

    def _after_step(self) -> None:
        for layer in self.layers:
            layer.advance_step()

    def remove(self) -> None:
        self._pre.remove()
        self._post.remove()
        for layer in self.layers:
            layer.attached_optimizer = False


def attach_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> AttachedOptimizer:
    """Hook masked decay (before each step) and the step counters (after it) into ``optimizer``."""
    return AttachedOptimizer(model, optimizer)
