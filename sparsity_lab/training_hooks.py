"""Where the per-step work of 2:4 training goes in an optimizer step.

``attach_optimizer(model, optimizer)`` registers two hooks on the optimizer:
* a step *pre*-hook: masked decay, grad += decay * (1 - m) * W. ``optimizer.step()`` runs after the
  user has unscaled (``GradScaler.step`` unscales first and skips the step on inf) and clipped the
  gradients, so the decay lands after unscaling and clipping and before the update: the placement
  of Hu et al. 2024, and AdamW normalises it. A *fused* optimizer (``fused=True``) under a GradScaler
  is the exception: the scaler calls its step with the gradients still scaled and with inf found,
  leaving both to the fused kernel; the hooks read ``optimizer.grad_scale`` / ``found_inf`` then,
  scale the decay to match and treat an inf step as skipped.
* a step *post*-hook: the decoupled masked decay of ``MaskedDecayOnWeights``,
  W -= lr * decay * (1 - m) * W with lr read from the weight's param group (the optimizer never sees
  it); then every sparse layer's step counter advances, which drives the mask refresh interval and
  the dense fine-tune switch. A step the GradScaler skips runs neither.
Loops without a torch optimizer call ``apply_masked_decay(model)`` before their update,
``apply_decay_on_weights(model, lr)`` after it, and ``advance_step(model)``.
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


def apply_decay_on_weights(model: nn.Module, lr: float) -> None:
    """After the update: W -= lr * decay * (1 - m) * W on layers whose method decays the weights."""
    for _, layer in sparse_layers(model):
        layer.apply_decay_on_weights(lr)


def advance_step(model: nn.Module) -> None:
    for _, layer in sparse_layers(model):
        layer.advance_step()


def _fused_scaler_state(optimizer: torch.optim.Optimizer) -> tuple[float, bool]:
    """(factor the gradients still carry, whether this step will be skipped) for this step.

    ``GradScaler.step`` sets ``grad_scale`` (None once ``unscale_`` ran) and ``found_inf`` on
    optimizers that unscale inside their step (fused ones) for the duration of the step.
    """
    found_inf = getattr(optimizer, "found_inf", None)
    grad_scale = getattr(optimizer, "grad_scale", None)
    skipped = found_inf is not None and bool(found_inf.item())  # one sync, only in this mode
    return (float(grad_scale) if grad_scale is not None else 1.0), skipped


class AttachedOptimizer:
    """Handle returned by :func:`attach_optimizer`; ``remove()`` undoes it."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        named = sparse_layers(model)
        if not named:
            raise ValueError("model has no SparseLinear layers: call sparsity_lab.sparsify(model, method) first")
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        missing = [name for name, layer in named if id(layer.weight) not in params]
        if missing:
            raise ValueError(f"sparse layer weight(s) of {missing} are not in the optimizer's param_groups; "
                             "pass model.parameters() to the optimizer (after sparsify() or before: the "
                             "Parameters are shared)")
        attached = [name for name, layer in named if layer.attached_optimizer]
        if attached:
            # a second attachment would add the decay twice and advance the counters twice per step
            raise ValueError(f"layers {attached} already have an optimizer attached; call .remove() on "
                             "the earlier handle first")
        self.layers = [layer for _, layer in named]
        # the param group of each layer's weight: its "lr" (changed by schedulers) scales the decay on weights
        self._groups = [next(g for g in optimizer.param_groups if any(p is layer.weight for p in g["params"]))
                        for layer in self.layers]
        self._skipping = False
        self._pre = optimizer.register_step_pre_hook(lambda opt, args, kwargs: self._before_step(opt))
        self._post = optimizer.register_step_post_hook(lambda opt, args, kwargs: self._after_step())
        for layer in self.layers:
            layer.attached_optimizer = True

    def _before_step(self, optimizer: torch.optim.Optimizer) -> None:
        grad_scale, self._skipping = _fused_scaler_state(optimizer)
        if self._skipping:
            return
        for layer in self.layers:
            layer.apply_masked_decay(grad_scale)

    def _after_step(self) -> None:
        if self._skipping:  # the fused kernel skipped the update: the schedule does not advance
            return
        for layer, group in zip(self.layers, self._groups):
            layer.apply_decay_on_weights(group["lr"])
            layer.advance_step()

    def remove(self) -> None:
        self._pre.remove()
        self._post.remove()
        for layer in self.layers:
            layer.attached_optimizer = False


def attach_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> AttachedOptimizer:
    """Hook masked decay (on gradients before each step, on weights after it) and the step counters
    (after it) into ``optimizer``."""
    return AttachedOptimizer(model, optimizer)
