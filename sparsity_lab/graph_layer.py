"""One SparseLinear inside a CUDA-graph step: its MVUE seed read on the device and its mask refresh captured.

``CudaGraphStep`` (``graph_step.py``) runs these on every layer; the state they add lives here, plugged
into two seams of the layer, and is dropped by the ``release_*`` functions (back to eager mode):

* ``layer.seed_source``: a :class:`DeviceSeed`, the 0-d int64 device tensor the MVUE kernels read; the
  host writes the value the eager step would draw into it before each replay (``fill_device_seed``).
  None in eager mode (the backward draws from the layer's counter-based host generator).
* ``layer.flip_counts.source``: a ``GraphFlipCounts`` that the captured refresh counts flips into
  (``refresh_mask_in_graph``); the layer's flip counts fold them in when read.
"""
from __future__ import annotations

import torch

from .graph_flips import DeviceSeed, GraphFlipCounts
from .layers import SparseLinear, backend_refresh, backend_refreshes, next_mvue_generator
from .methods.handlers import MethodHandler, method_handler


# --- the MVUE seed read on the device -----------------------------------------------------------------
def use_device_seed(layer: SparseLinear, device: torch.device | str) -> DeviceSeed:
    """From now on the layer's backward draws MVUE from a device seed tensor that ``fill_device_seed``
    writes before each step (kept when it is on ``device`` already; its ``uses`` restart at 0). Refused
    for a layer without MVUE and for a backend that draws on the host (``reads_seed_from_device`` False)."""
    if not method_handler(layer.method).mvue(layer):
        raise ValueError(f"use_device_seed is for MVUE layers; this layer's method is {layer.method.describe()}")
    if not layer.backend.reads_seed_from_device:
        raise ValueError(
            f"a CUDA-graph step needs every MVUE layer on a backend whose kernels read the MVUE seed on the "
            f"device (reads_seed_from_device: e.g. 'triton', 'cusparselt'); this layer runs "
            f"{layer.backend.name!r}, which draws on the host")
    device = torch.device(device)
    if layer.seed_source is None or layer.seed_source.tensor.device != device:
        layer.seed_source = DeviceSeed(device)
    layer.seed_source.uses = 0
    return layer.seed_source


def fill_device_seed(layer: SparseLinear) -> int:
    """Write the next MVUE draw's seed into the layer's device seed: the value the eager step would draw
    (its counter-based generator for its next call; ``mvue_calls`` advances as in eager mode). Returns it."""
    if layer.seed_source is None:
        raise RuntimeError("fill_device_seed needs use_device_seed(layer, device) first")
    seed = layer.backend.device_seed_value(next_mvue_generator(layer))
    layer.seed_source.tensor.fill_(seed)
    return seed


def release_device_seed(layer: SparseLinear) -> None:
    """Back to eager mode: the backward draws from the host generator again."""
    layer.seed_source = None


# --- the mask refresh inside the graph -------------------------------------------------------------------
def mask_rule_capturable(layer: SparseLinear) -> bool:
    """True when the method computes its masks with the backend's mask (or declares its own rule capturable)."""
    handler = method_handler(layer.method)
    return type(handler).mask is MethodHandler.mask or handler.own_mask_capturable


def use_graph_flips(layer: SparseLinear, device: torch.device | str) -> GraphFlipCounts:
    """Give the layer device flip counts for a mask refresh captured in a CUDA graph (kept, with what they
    counted, when the layer has them on ``device`` already)."""
    device = torch.device(device)
    counts = layer.flip_counts
    if counts.source is None or counts.source.device != device:
        counts.take_source()
        counts.source = GraphFlipCounts(device)
    return counts.source


def release_graph_flips(layer: SparseLinear) -> None:
    """Back to eager refreshes only: what the replays counted joins the pending counts first."""
    layer.flip_counts.take_source()
    layer.flip_counts.source = None


@torch.no_grad()
def refresh_mask_in_graph(layer: SparseLinear, request: tuple[torch.dtype, bool] | None = None) -> None:
    """The device work of ``refresh_mask`` for a CUDA-graph capture: the new mask from the weight into the
    mask buffer (in place) and its flips against the previous mask into the graph flip counts. The host
    counters are not touched here (a capture runs nothing); ``after_graph_refresh`` updates them after each
    replay. Needs ``use_graph_flips`` first and a previous mask (``mask_updates`` >= 1).

    request: (the products' dtype, whether the input gradient follows) of the operand the captured step will
    ask for, on a backend that writes it with the mask (``Backend.fuses_refresh_and_prepare``): it is prepared
    here, in the same pass, and the layer's forward takes it from the operand cache."""
    counts = layer.flip_counts.source
    if counts is None:
        raise RuntimeError("refresh_mask_in_graph needs use_graph_flips(layer, device) first")
    if layer.mask_updates < 1:
        raise RuntimeError("refresh_mask_in_graph counts flips against the previous mask; this layer has "
                           "none yet (mask_updates 0): refresh it eagerly first")
    if backend_refreshes(layer):
        if not layer.backend.fuses_refresh_and_prepare:
            request = None  # the separate calls: the forward prepares the operand, as in eager mode
        flips, operand = backend_refresh(layer, True, request)
        if operand is not None:
            layer.operand_cache.put(layer, request[0], operand, backward=request[1])
    else:
        flips = layer._replace_mask(method_handler(layer.method).mask(layer, layer.weight.detach()), count=True)
    counts.record(flips)


def after_graph_refresh(layer: SparseLinear) -> None:
    """Host bookkeeping after a replay that ran ``refresh_mask_in_graph``: the counters an eager
    ``refresh_mask`` would have advanced (no device work, no sync)."""
    layer.flip_counts.source.replayed()
    layer.mask_step = layer.step
    layer.mask_updates += 1
    layer.operand_cache.clear()
