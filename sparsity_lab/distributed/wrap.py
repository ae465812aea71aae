"""Sparsify first, then wrap: data-parallel (DDP) and fully sharded (FSDP2) 2:4 training.

Supported order: ``sparsify(model, method)`` on every rank (same seed, so the same weights, masks,
beta and MVUE seeds), then ``data_parallel(model)`` or ``fully_shard_sparse(model, blocks)``; then
the optimizer and ``attach_optimizer``. The other order (wrap, then sparsify) is refused: DDP has
already bucketed the parameters, and FSDP2 has replaced them by shards from which no rank can
compute a mask.
"""
from __future__ import annotations

import hashlib
import inspect
from typing import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from ..layers import SparseLinear
from ..training_hooks import sparse_layers
from .sharded_layer import ShardedSparseLinear


def _require_process_group() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("torch.distributed is not initialised: launch with torchrun and call "
                           "torch.distributed.init_process_group() (backend 'nccl' on GPUs, 'gloo' on CPUs) first")


def _layer_signature(layer: SparseLinear) -> dict:
    """What must agree across ranks before training starts, as plain data."""
    digest = hashlib.sha256()
    for tensor in (layer.weight, layer.mask, layer.beta):
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        digest.update(local.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return {"method": repr(layer.method), "counters": layer.get_extra_state(), "tensors": digest.hexdigest()}


def check_ranks_agree(model: nn.Module, group=None) -> None:
    """Raise ValueError naming the first layer whose method, counters (MVUE seed included), weight,
    mask or beta differ between ranks. One ``all_gather_object``; call it before wrapping."""
    _require_process_group()
    mine = [(name, _layer_signature(layer)) for name, layer in sparse_layers(model)]
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    reference = everyone[0]
    for rank, theirs in enumerate(everyone):
        if [name for name, _ in theirs] != [name for name, _ in reference]:
            raise ValueError(f"rank {rank} has sparse layers {[n for n, _ in theirs]} but rank 0 has "
                             f"{[n for n, _ in reference]}: build and sparsify the same model on every rank")
        for (name, sig), (_, sig0) in zip(theirs, reference):
            for key, what in (("method", "method"), ("counters", "counters (step, MVUE seed, ...)"),
                              ("tensors", "weight, mask or beta")):
                if sig[key] != sig0[key]:
                    raise ValueError(
                        f"layer {name!r}: the {what} on rank {rank} are not those of rank 0 "
                        f"({sig[key]!r} vs {sig0[key]!r}); call torch.manual_seed(seed) with the same seed on "
                        "every rank before building and sparsifying the model, and pass every rank the same method")


def refuse_wrapped(model: nn.Module) -> None:
    """Raise when ``model`` is already wrapped by DDP or sharded by FSDP2 (sparsify must come first)."""
    from torch.nn.parallel import DistributedDataParallel
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    if isinstance(model, DistributedDataParallel):
        raise TypeError("the model is already wrapped in DistributedDataParallel: call sparsify(model, method) "
                        "on the plain module first, then wrap it (sparsity_lab.distributed.data_parallel)")
    if any(isinstance(m, FSDPModule) for m in model.modules()) or \
            any(isinstance(p, DTensor) for p in model.parameters()):
        raise TypeError("the model is already sharded (fully_shard): call sparsify(model, method) first, then "
                        "sparsity_lab.distributed.fully_shard_sparse(model, blocks)")


def data_parallel(model: nn.Module, **ddp_kwargs) -> nn.Module:
    """``DistributedDataParallel(model)`` for a sparsified model, after checking that every rank holds
    the same sparse state. Masks and beta are not broadcast before each forward (unless
    ``broadcast_buffers`` / ``forward_sync_buffers`` is given): every rank computes the same mask from
    the same W.

    MVUE draws: layer draw k on rank r uses the seed ``mvue_stream_seed(seed, r, k)``: independent
    across ranks, reproducible from (seed, rank)."""
    from torch.nn.parallel import DistributedDataParallel

    _require_process_group()
    refuse_wrapped(model)
    if not sparse_layers(model):
        raise ValueError("model has no SparseLinear layers: call sparsity_lab.sparsify(model, method) first")
    check_ranks_agree(model)
    if not {"broadcast_buffers", "forward_sync_buffers"} & set(ddp_kwargs):
        # torch >= 2.13 renames the switch; both keep the start-up broadcast from rank 0
        newer = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        ddp_kwargs["forward_sync_buffers" if newer else "broadcast_buffers"] = False
    return DistributedDataParallel(model, **ddp_kwargs)


BlockSelector = Callable[[str, nn.Module], bool]


def _blocks(model: nn.Module, blocks: Iterable[nn.Module] | BlockSelector | None) -> list[nn.Module]:
    if blocks is None:
        # the usual unit: every module that directly holds a list of repeated blocks
        found = [child for m in model.modules() if isinstance(m, nn.ModuleList) for child in m]
        if not found:
            raise ValueError("found no nn.ModuleList of blocks to shard: pass blocks=[...] (the modules to "
                             "fully_shard one by one, e.g. model.blocks)")
        return found
    if callable(blocks) and not isinstance(blocks, nn.Module):
        return [m for name, m in model.named_modules() if name and blocks(name, m)]
    return list(blocks)


def fully_shard_sparse(model: nn.Module, blocks: Iterable[nn.Module] | BlockSelector | None = None, *,
                       mesh=None, reshard_after_forward: bool = True, recompute_operands: bool = False,
                       check: bool = True, **fsdp_kwargs) -> nn.Module:
    """FSDP2 for a sparsified model: ``fully_shard`` each block, then the root, and shard every sparse
    layer's mask like its weight (see ``sharded_layer``). Returns the model (sharded in place).

    blocks: modules to shard one by one (default: the members of every nn.ModuleList), or
    ``fn(name, module) -> bool``. mesh: a 1-D DeviceMesh (default: all ranks). recompute_operands:
    drop each layer's prepared operand and full mask after the forward and rebuild them in the
    backward (less memory between forward and backward, more work; docs/distributed.md). Other keyword
    arguments go to ``fully_shard`` (e.g. ``mp_policy``); ``shard_placement_fn`` is refused because
    masks are sharded along dim 0 like FSDP2's default.
    """
    from torch.distributed.fsdp import fully_shard

    _require_process_group()
    refuse_wrapped(model)
    if mesh is not None and mesh.ndim != 1:
        raise ValueError(f"mesh must be 1-D (plain FSDP2), got a {mesh.ndim}-D mesh: HSDP is not supported for sparse "
                         "layers yet; pass a 1-D DeviceMesh or mesh=None (all ranks)")
    if "shard_placement_fn" in fsdp_kwargs:
        raise ValueError("shard_placement_fn is not supported: sparse layers shard their weight and mask along "
                         "dim 0 (FSDP2's default); drop the argument")
    layers = sparse_layers(model)
    if not layers:
        raise ValueError("model has no SparseLinear layers: call sparsity_lab.sparsify(model, method) first")
    if any(layer.attached_optimizer for _, layer in layers):
        raise ValueError("an optimizer is already attached: shard first, then build the optimizer over the "
                         "sharded parameters and call attach_optimizer(model, optimizer)")
    if check:
        check_ranks_agree(model)
    for _, layer in layers:
        if type(layer) is SparseLinear:
            layer.__class__ = ShardedSparseLinear
    chosen = _blocks(model, blocks)
    for block in chosen:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, **fsdp_kwargs)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, **fsdp_kwargs)
    for name, layer in layers:
        if not isinstance(layer, ShardedSparseLinear):
            raise TypeError(f"layer {name!r} is a {type(layer).__name__}, which cannot shard its mask")
        layer.shard_mask_like_weight()
        layer.recompute_operands = bool(recompute_operands)
    return model
