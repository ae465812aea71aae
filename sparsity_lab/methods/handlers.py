"""Method handlers: what each method config *does* in a SparseLinear, one registered handler per config type.

A config (``STE()``, ``SRSTE(decay=...)``, ...) is data; its behaviour is the :class:`MethodHandler`
registered for its type, as torchao registers one handler per quantization config. The layer, the
optimizer hooks and the CUDA-graph step ask the handler (``method_handler(layer.method)``) and never
branch on the config's type, so a new method is a config dataclass plus a handler registered with
``register_method``, from anywhere (no edit of the layer)::

    @dataclass(frozen=True)
    class MagnitudeDecay(SparsityMethod):
        decay: float = 1e-4
        name: ClassVar[str] = "magnitude_decay"

    @register_method(MagnitudeDecay)
    class MagnitudeDecayHandler(MethodHandler):
        def decay_gradient_(self, layer, grad, weight, mask, grad_scale):
            grad.add_(layer.method.decay * grad_scale * weight.sign() * ~mask)

The hooks (each with the default every built-in method starts from: STE's):

    dense(layer)            the products use the dense W now (Dense; the dense fine-tune phase)
    tracks_mask(layer)      masks are still computed (refresh interval, flip counts)
    mask(layer, weight)     the N:M mask of W (out, in) -> bool (out, in)
    init_state(layer)       state computed once from the converted weight and its first mask (S-STE's beta)
    beta(layer)             None: S(W) = m * W; a 0-d tensor: S(W) = beta * soft_threshold(W)
    mvue(layer)             the weight gradient is MVUE(dZ^T) X (groups of 4 along the tokens)
    backward_decay(layer)   lambda added as lambda * (1 - m) * W to dW inside the backward (once per step)
    decay_gradient_(...)    on dW after unscaling and clipping, before the optimizer step
    gradient_decay(layer)   lambda when decay_gradient_ adds exactly lambda * (1 - m) * W (an optimizer
                            may then add it inside its update: MasterWeights' fused one); else 0
    decay_weight_(...)      on W after the optimizer step

A handler keeps no state of its own (one instance serves every layer of its config type): per-layer
state lives in the layer's buffers and counters, which ``state_dict`` saves. The layer calls the decay
hooks only outside a dense phase, with the tensors this process holds (a sharded layer's local rows).
"""
from __future__ import annotations

from typing import ClassVar

import torch

from .config import SRSTE, SSTE, STE, Dense, MaskedDecay, MaskedDecayOnWeights, SparsityMethod
from .soft_threshold import soft_threshold, sste_beta

_HANDLERS: dict[type, "MethodHandler"] = {}  # config type -> its registered handler
_RESOLVED: dict[type, "MethodHandler"] = {}  # config type -> handler found along its MRO (cache)


class MethodHandler:
    """The behaviour of one method config type in a SparseLinear (see the module docstring). Every hook
    takes the layer; the config is ``layer.method``. The defaults are STE's."""

    # a handler that overrides ``mask``: True when its mask runs on the device alone, so that a CUDA
    # graph may capture the refresh (``graph_step.eager_refresh_reason``)
    own_mask_capturable: ClassVar[bool] = False

    # --- schedule ---------------------------------------------------------------------------------
    def dense(self, layer) -> bool:
        """True when the products use the dense W: here, from the dense fine-tune step on."""
        start = layer.method.dense_finetune_step
        return start is not None and layer.step >= start

    def tracks_mask(self, layer) -> bool:
        """Whether masks are still computed (at ``mask_refresh_interval``): in every sparse phase."""
        return not self.dense(layer)

    # --- the mask and the weight the products use ----------------------------------------------------
    def mask(self, layer, weight: torch.Tensor) -> torch.Tensor:
        """The mask of ``weight`` (out, in), bool (out, in): the backend's N:M magnitude mask."""
        m = layer.method
        return layer.backend.mask(weight, m.n, m.m, m.transposable)

    def init_state(self, layer) -> None:
        """Compute the method's frozen state from the layer's weight and current mask (at conversion and
        when ``integrations.hf.restart_sparse_state`` restarts the layer). Nothing for STE."""

    def beta(self, layer) -> torch.Tensor | None:
        """None: the products use S(W) = m * W."""
        return None

    # --- gradients and decays -------------------------------------------------------------------------
    def mvue(self, layer) -> bool:
        """True: dW = MVUE(dZ^T) X; False: dW = dZ^T X. The config's ``mvue`` field."""
        return bool(layer.method.mvue)

    def backward_decay(self, layer) -> float:
        """lambda of the term lambda * (1 - m) * W added to dW inside the backward (the layer adds it once
        per optimizer step, on the first micro-step). 0: none."""
        return 0.0

    def decay_gradient_(self, layer, grad: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor,
                        grad_scale: float) -> None:
        """Before the optimizer step, after unscaling and clipping: change ``grad`` in place. grad_scale:
        the factor the gradients still carry (a fused optimizer under a GradScaler). Nothing here."""

    def gradient_decay(self, layer) -> float:
        """lambda when ``decay_gradient_`` adds exactly ``lambda * grad_scale * (1 - m) * W`` and nothing else, so
        an optimizer may add that term inside its own update instead (MasterWeights' fused update); 0.0 for
        any other ``decay_gradient_`` (a handler overriding one overrides both). Nothing here."""
        return 0.0

    def decay_weight_(self, layer, weight: torch.Tensor, mask: torch.Tensor, lr: float) -> None:
        """After the optimizer step: change ``weight`` in place (lr: its param group's). Nothing here."""


def register_method(config_type: type):
    """Class decorator: register a :class:`MethodHandler` subclass as the behaviour of ``config_type``
    (a ``SparsityMethod`` subclass) and of its subclasses that register none of their own."""
    if not (isinstance(config_type, type) and issubclass(config_type, SparsityMethod)):
        raise TypeError(f"register_method takes a SparsityMethod subclass, got {config_type!r}")

    def register(handler_type: type) -> type:
        if not (isinstance(handler_type, type) and issubclass(handler_type, MethodHandler)):
            raise TypeError(f"register_method({config_type.__name__}) decorates a MethodHandler subclass, "
                            f"got {handler_type!r}")
        known = _HANDLERS.get(config_type)
        if known is not None and type(known) is not handler_type:
            raise ValueError(f"{config_type.__name__} already has the handler {type(known).__name__}; a config "
                             "type has one handler (subclass the config for a new behaviour)")
        _HANDLERS[config_type] = handler_type()
        _RESOLVED.clear()
        return handler_type

    return register


def method_handler(method: SparsityMethod) -> MethodHandler:
    """The handler registered for ``type(method)`` or, failing that, for its nearest registered base."""
    kind = type(method)
    found = _RESOLVED.get(kind)
    if found is None:
        if not isinstance(method, SparsityMethod):
            raise TypeError(f"method must be a SparsityMethod (e.g. STE()), got {kind.__name__}")
        found = next((_HANDLERS[base] for base in kind.__mro__ if base in _HANDLERS), None)
        if found is None:
            raise TypeError(f"no handler is registered for {kind.__name__}: decorate a MethodHandler subclass "
                            f"with @sparsity_lab.register_method({kind.__name__})")
        _RESOLVED[kind] = found
    return found


# --- the built-in methods ---------------------------------------------------------------------------------
register_method(STE)(MethodHandler)


@register_method(Dense)
class DenseHandler(MethodHandler):
    """Dense training: dense W always; the would-be mask is computed only when ``track_flips``."""

    def dense(self, layer) -> bool:
        return True

    def tracks_mask(self, layer) -> bool:
        return bool(layer.method.track_flips)


@register_method(SRSTE)
class SRSTEHandler(MethodHandler):
    """SR-STE: dW += decay * (1 - m) * W inside the backward."""

    def backward_decay(self, layer) -> float:
        return layer.method.decay_in_backward


@register_method(MaskedDecay)
class MaskedDecayHandler(MethodHandler):
    """Masked decay on gradients: grad += decay * (1 - m) * W right before the optimizer step."""

    def decay_gradient_(self, layer, grad, weight, mask, grad_scale) -> None:
        decay = self.gradient_decay(layer)
        if decay:
            layer.backend.masked_decay_(grad, weight, mask, decay * grad_scale)

    def gradient_decay(self, layer) -> float:
        return float(layer.method.decay_before_step or 0.0)


@register_method(MaskedDecayOnWeights)
class MaskedDecayOnWeightsHandler(MethodHandler):
    """Masked decay on the weights: W -= lr * decay * (1 - m) * W after the optimizer step."""

    def decay_weight_(self, layer, weight, mask, lr) -> None:
        decay = layer.method.decay_after_step
        if decay:
            # in place, elementwise: w += (-lr * decay) * (1 - m) * w
            layer.backend.masked_decay_(weight, weight, mask, -float(lr) * decay)


@register_method(SSTE)
class SSTEHandler(MethodHandler):
    """S-STE: S(W) = beta * soft_threshold(W), beta computed once at conversion and frozen (updating it
    makes it grow)."""

    @torch.no_grad()
    def init_state(self, layer) -> None:
        m, w = layer.method, layer.weight.detach()
        layer.beta.copy_(sste_beta(w, soft_threshold(w, layer.mask, m.n, m.m)))

    def beta(self, layer) -> torch.Tensor:
        return layer.beta
