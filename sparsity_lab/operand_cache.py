"""A layer's prepared weight operand: one per optimizer step, reused by every gradient-accumulation micro-step.

Preparing is the pruned weight S(W) (m * W, or beta * soft_threshold(W) for S-STE) and, for hardware
backends, its compressed form (``Backend.prepare_masked``). It is rebuilt when anything it was made
from changes: the step, W, the mask, beta, a mask computation, the products' dtype or W's device.
"""
from __future__ import annotations

from typing import Any

import torch

from .methods.handlers import method_handler


class OperandCache:
    """``get(layer, dtype, backward)``: the operand for this call, prepared at most once per state of the
    layer; ``put`` keeps one prepared elsewhere; ``clear()`` forgets it; ``prepare_count`` counts
    preparations (a diagnostic, not saved)."""

    # (dtype, backward) of the latest preparation, kept by clear(): a CUDA-graph capture that refreshes the mask
    # prepares the operand the products will ask for together with it (``graph_layer.refresh_mask_in_graph``)
    last_request: tuple[torch.dtype, bool] | None = None

    def __init__(self) -> None:
        self.entry: tuple[tuple, Any] | None = None
        self.prepare_count = 0

    @property
    def value(self) -> Any:
        """The operand prepared last, or None."""
        return None if self.entry is None else self.entry[1]

    def clear(self) -> None:
        """Forget the operand: the next call prepares it again (a CUDA-graph capture must prepare it inside
        the graph, and the captured one must not serve a later eager call)."""
        self.entry = None

    @staticmethod
    def _key(layer, dtype: torch.dtype) -> tuple:
        return (layer.step, layer.weight._version, layer.mask._version, layer.beta._version, layer.mask_updates,
                dtype, layer.weight.device)

    def put(self, layer, dtype: torch.dtype, operand: Any, backward: bool = True) -> None:
        """Keep ``operand``, prepared for the layer's state now in ``dtype`` together with its mask (a mask
        refresh that writes the operand in the same pass, ``layers.refresh_mask_and_operand``): counted as a
        preparation, served by ``get`` until the state changes."""
        self.prepare_count += 1
        self.last_request = (dtype, backward)
        self.entry = (self._key(layer, dtype), operand)

    def get(self, layer, dtype: torch.dtype, backward: bool = True) -> Any:
        """The operand of ``layer``'s products in ``dtype`` (backward: also what the input gradient needs)."""
        key = self._key(layer, dtype)
        if self.entry is None or self.entry[0] != key:
            self.prepare_count += 1
            self.last_request = (dtype, backward)
            weight = layer.weight.detach()
            if layer.dense_now:  # only reached for a backend with products_in_dense_phase
                operand = layer.backend.prepare_dense(weight, dtype)
            else:
                m = layer.method
                operand = layer.backend.prepare_masked(weight, layer._mask_for_products(),
                                                       method_handler(m).beta(layer), m.n, m.m, dtype,
                                                       backward=backward)
            self.entry = (key, operand)
        return self.entry[1]
