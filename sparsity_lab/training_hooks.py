"""Where the per-step work of 2:4 training goes in an optimizer step.

``attach_optimizer(model, optimizer)`` registers two hooks on the optimizer:
* a step *pre*-hook: masked decay, grad += decay * (1 - m) * W (an optimizer with ``takes_masked_decay(W)``
  true, MasterWeights' fused update, is handed the term through ``defer_masked_decay`` and adds it inside
  its update instead). ``optimizer.step()`` runs after the
  user has unscaled (``GradScaler.step`` unscales first and skips the step on inf) and clipped the
  gradients, so the decay lands after unscaling and clipping and before the update: the placement
  of Hu et al. 2024, and AdamW normalises it. A *fused* optimizer (``fused=True``) under a GradScaler
  is the exception: the scaler calls its step with the gradients still scaled and with inf found,
  leaving both to the fused kernel; the hooks read ``optimizer.grad_scale`` / ``found_inf`` then,
  scale the decay to match and treat an inf step as skipped. Then an optimizer that can write a 2:4 layer's
  next compressed operands in its own pass (``takes_operand(W)``, MasterWeights' fused update) is asked to
  (``defer_operand``) where the next forward would use them (``optimizer_operands.operand_request``).
* a step *post*-hook: the decoupled masked decay of ``MaskedDecayOnWeights``,
  W -= lr * decay * (1 - m) * W with lr read from the weight's param group (the optimizer never sees
  it); then every sparse layer's step counter advances, which drives the mask refresh interval and
  the dense fine-tune switch; then the operands the optimizer wrote go into the layers' operand caches. A
  step the GradScaler skips runs neither.
Loops without a torch optimizer call ``apply_masked_decay(model)`` before their update,
``apply_decay_on_weights(model, lr)`` after it, and ``advance_step(model)``.

Once per optimizer step, however the step is called: an optimizer class whose ``step`` calls
``super().step()`` runs the registered hooks once per class level (PyTorch wraps each level's
``step``). The hooks therefore open a step in the first pre-hook and close it in the first
post-hook; the nested calls in between do nothing. The decay is further keyed on the gradient
itself (its identity and version), so a gradient never receives it twice.
"""
from __future__ import annotations

import weakref

import torch
from torch import nn

from .layers import SparseLinear
from .methods.handlers import method_handler
from .optimizer_operands import operand_request, put_optimizer_operand


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
    layers = [layer for _, layer in sparse_layers(model)]
    for layer in layers:
        layer.advance_step()
    sum_flips_over_ranks(layers)


def sum_flips_over_ranks(layers: list) -> None:
    """After each optimizer step, on every rank at once: layers sharded across processes sum their flip
    counts over the ranks (``ShardedSparseLinear.sum_flips_over_ranks``); a layer of one process has
    counted its flips already."""
    for sum_flips in {getattr(type(layer), "sum_flips_over_ranks", None) for layer in layers} - {None}:
        sum_flips(layers)


def gradient_decay_now(layer: SparseLinear) -> float:
    """lambda of the masked decay lambda * (1 - m) * W that ``layer.apply_masked_decay`` would add to its gradient
    now, for an optimizer that adds it inside its update (``MethodHandler.gradient_decay``); 0.0 when none is due
    (no such term, a dense phase, no gradient)."""
    layer.refuse_plain_fully_shard()
    if layer.dense_now or layer.weight.grad is None:
        return 0.0
    return method_handler(layer.method).gradient_decay(layer)


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
        for _, layer in named:
            layer.refuse_plain_fully_shard()  # before the first step, not inside it
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
        self._grad_scale = 1.0
        self._step_open = False  # between the first pre-hook and the first post-hook of a step
        # per layer: (weakref to the gradient that received the decay, its version afterwards)
        self._decayed: list[tuple | None] = [None] * len(self.layers)
        self._pre = optimizer.register_step_pre_hook(lambda opt, args, kwargs: self._before_step(opt))
        self._post = optimizer.register_step_post_hook(lambda opt, args, kwargs: self._after_step(opt))
        for layer in self.layers:
            layer.attached_optimizer = True

    def _open_step(self) -> None:
        """Mark a step as under way (nested ``super().step()`` levels find it open already). A step
        that raised never reached its post-hook: the next step finds it open and carries on with it,
        so the counters advance once for the failed call and the next one together."""
        self._step_open = True

    def _close_step(self) -> bool:
        """True for the first post-hook of an open step; the outer levels' post-hooks get False."""
        if not self._step_open:
            return False
        self._step_open = False
        return True

    def _before_step(self, optimizer: torch.optim.Optimizer) -> None:
        self._open_step()
        # every level sees the same scaler attributes (set for the duration of the outer step)
        self._grad_scale, self._skipping = _fused_scaler_state(optimizer)
        if self._skipping:
            return
        for k, layer in enumerate(self.layers):
            grad = layer.weight.grad
            done = self._decayed[k]
            if grad is None or (done is not None and done[0]() is grad and done[1] == grad._version):
                continue  # no gradient, or this very gradient already carries the decay
            decay = gradient_decay_now(layer)
            if decay and getattr(optimizer, "takes_masked_decay", lambda p: False)(layer.weight):
                # the optimizer adds lambda (1 - m) W inside this update (MasterWeights' fused one): no pass here. The
                # gradient stays as it is, so a later step on it is handed the term of its own W (a handover replaces
                # the one before it: nested levels of one step add it once)
                optimizer.defer_masked_decay(layer.weight, layer.mask, decay * self._grad_scale)
                continue
            layer.apply_masked_decay(self._grad_scale)
            self._decayed[k] = (weakref.ref(grad), grad._version)
        if getattr(optimizer, "takes_operand", None) is None:
            return
        for layer in self.layers:  # the next forward's operands, written by the optimizer's pass over W
            request = operand_request(layer) if optimizer.takes_operand(layer.weight) else None
            if request is not None:
                optimizer.defer_operand(layer.weight, *request)

    def _after_step(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._close_step():  # a nested level of the same optimizer step
            return
        if self._skipping:  # the fused kernel skipped the update: the schedule does not advance
            return
        for layer, group in zip(self.layers, self._groups):
            layer.apply_decay_on_weights(group["lr"])
            layer.advance_step()
        sum_flips_over_ranks(self.layers)
        take = getattr(optimizer, "take_operand", None)
        for layer in self.layers if take is not None else ():
            forms = take(layer.weight)
            if forms is not None:
                put_optimizer_operand(layer, forms)

    def remove(self) -> None:
        self._pre.remove()
        self._post.remove()
        for layer in self.layers:
            layer.attached_optimizer = False


def attach_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> AttachedOptimizer:
    """Hook masked decay (on gradients before each step, on weights after it) and the step counters
    (after it) into ``optimizer``."""
    return AttachedOptimizer(model, optimizer)
