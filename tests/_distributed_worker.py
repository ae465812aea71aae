"""One torchrun job that runs every distributed check (one launch: process start-up dominates on CPU).

Launched by tests/test_distributed.py as
    torchrun --nproc-per-node 2 tests/_distributed_worker.py OUT.json [check ...]
Every rank trains the same tiny sparse GPT (float64 on the reference backend, so that summation
order is the only source of difference) under DDP and under FSDP2, and rank 0 trains the
one-process reference with the same global batch: the global batch split into world-size
micro-batches, each loss divided by the world size (gradient accumulation), which is what data
parallelism computes. For MVUE the reference draws micro-batch r from rank r's stream
(``layer.mvue_rank = r``), so the comparison is exact there too. Rank 0 writes OUT.json: one record
per check with the measured differences; the test asserts on them.
"""
from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import torch
import torch.distributed as dist

from sparsity_lab import SSTE, STE, SRSTE, MaskedDecay, Dense, attach_optimizer, sparsify
from sparsity_lab.distributed import data_parallel, fully_shard_sparse, local_batch
from sparsity_lab.lab.model import GPT, GPTConfig
from sparsity_lab.training_hooks import sparse_layers

STEPS = 20
GLOBAL_BATCH = 4
CONFIG = dict(vocab_size=32, context=8, n_layer=2, n_head=2, d_model=16)


def methods() -> dict:
    total = STEPS
    return {
        "ste": STE(),
        "ste_transposable": STE(transposable=True),
        "ste_refresh3": STE(mask_refresh_interval=3),
        "srste": SRSTE(decay=2e-2),
        "masked_decay_finetune": MaskedDecay(decay=2e-2, total_steps=total, dense_finetune_at=0.75),
        "sste": SSTE(),
        "sste_mvue": SSTE(mvue=True),
        "sste_mvue_transposable_refresh2": SSTE(mvue=True, transposable=True, mask_refresh_interval=2),
        "dense_tracking_flips": Dense(),
        "triton_sste_mvue_transposable": SSTE(mvue=True, transposable=True, backend="triton"),
        "triton_srste": SRSTE(decay=2e-2, backend="triton"),
    }


def dtype_for(method) -> torch.dtype:
    return torch.float32 if method.backend == "triton" else torch.float64


def build(method, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**CONFIG)).to(dtype_for(method))
    return sparsify(model, method)


def data(steps: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shape = (GLOBAL_BATCH, CONFIG["context"])
    return [(torch.randint(0, CONFIG["vocab_size"], shape, generator=g),
             torch.randint(0, CONFIG["vocab_size"], shape, generator=g)) for _ in range(steps)]


def optimizer_for(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)


def full_state(model: torch.nn.Module) -> dict:
    """Every tensor of the state dict as a full plain tensor, and the layers' counters."""
    state = {}
    for key, value in model.state_dict().items():
        if isinstance(value, torch.Tensor):
            state[key] = (value.full_tensor() if hasattr(value, "full_tensor") else value).detach().clone()
    counters = {name: {**layer.get_extra_state(), "flips_total": layer.flips_total}
                for name, layer in sparse_layers(model)}
    return {"tensors": state, "counters": counters}


def train_full_batch(method, steps: int = STEPS) -> tuple[list, dict]:
    """One process, one forward over the global batch (no MVUE: its draws cannot match)."""
    model = build(method)
    opt = optimizer_for(model)
    attach_optimizer(model, opt)
    losses = []
    for x, y in data(steps):
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append([loss.item()])
    return losses, full_state(model)


def train_reference(method, world: int, steps: int = STEPS) -> tuple[list, dict]:
    """One process, the same global batch, as ``world`` accumulated micro-batches."""
    model = build(method)
    opt = optimizer_for(model)
    attach_optimizer(model, opt)
    mvue = [layer for _, layer in sparse_layers(model) if layer.method.mvue]
    losses = []
    for t, (x, y) in enumerate(data(steps)):
        opt.zero_grad(set_to_none=True)
        step_losses = []
        for r in range(world):
            for layer in mvue:  # draw as rank r draws at step t
                layer.mvue_rank, layer.mvue_calls = r, t
            _, loss = model(local_batch(x, r, world), local_batch(y, r, world))
            (loss / world).backward()
            step_losses.append(loss.item())
        for layer in mvue:
            layer.mvue_rank, layer.mvue_calls = None, t + 1
        opt.step()
        losses.append(step_losses)
    return losses, full_state(model)


def train_parallel(method, parallel: str, steps: int = STEPS) -> tuple[list, dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build(method)
    if parallel == "ddp":
        wrapped = data_parallel(model)
    else:
        wrapped = fully_shard_sparse(model)
    opt = optimizer_for(wrapped)
    attach_optimizer(model, opt)
    losses = []
    for x, y in data(steps):
        opt.zero_grad(set_to_none=True)
        _, loss = wrapped(local_batch(x, rank, world), local_batch(y, rank, world))
        loss.backward()
        opt.step()
        every = [None] * world
        dist.all_gather_object(every, loss.item())
        losses.append(every)
    state = full_state(model)
    # the fraction of the sparse layers' mask entries that this rank stores (1 / world under FSDP2)
    layers = [layer for _, layer in sparse_layers(model)]
    local = sum((lay.mask.to_local() if hasattr(lay.mask, "to_local") else lay.mask).numel() for lay in layers)
    state["mask_stored_fraction"] = local / sum(lay.mask.numel() for lay in layers)
    return losses, state


def max_diff(a: dict, b: dict, floating: bool) -> float:
    worst = 0.0
    for key in a:
        x, y = a[key], b[key]
        if x.dtype.is_floating_point == floating:
            diff = (x.double() - y.double()).abs().max().item() if floating else float((x != y).sum().item())
            worst = max(worst, diff)
    return worst


def compare(reference: tuple, got: tuple) -> dict:
    (ref_losses, ref_state), (losses, state) = reference, got
    ref_t, t = ref_state["tensors"], state["tensors"]
    masks = {k for k in ref_t if k.endswith(".mask")}
    return {
        "same_keys": sorted(ref_t) == sorted(t),
        "loss_max_diff": max(abs(sum(ra) / len(ra) - sum(rb) / len(rb)) for ra, rb in zip(ref_losses, losses)),
        "float_max_diff": max_diff({k: ref_t[k] for k in ref_t if k not in masks}, t, floating=True),
        "mask_entries_differing": max_diff({k: ref_t[k] for k in masks}, t, floating=False),
        "masks_checked": len(masks),
        "counters_equal": ref_state["counters"] == state["counters"],
        "counters": state["counters"],
        "reference_counters": ref_state["counters"],
        "loss_first_last": [sum(losses[0]) / len(losses[0]), sum(losses[-1]) / len(losses[-1])],
    }


def check_training(results: dict, names: list[str]) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    for name in names:
        method = methods()[name]
        reference = train_reference(method, world) if rank == 0 else None
        for parallel in ("ddp", "fsdp"):
            start = time.perf_counter()
            got = train_parallel(method, parallel)
            if rank == 0:
                record = compare(reference, got)
                record["seconds"] = round(time.perf_counter() - start, 2)
                record["dtype"] = str(dtype_for(method))
                record["mask_stored_fraction"] = got[1]["mask_stored_fraction"]
                results[f"{parallel}/{name}"] = record
        if rank == 0 and not method.mvue:
            # the accumulated reference against one forward over the whole batch: equal up to rounding
            record = compare(reference, train_full_batch(method))
            results[f"full_batch/{name}"] = record


CHECKS = {"training": check_training}


def main() -> None:
    out = sys.argv[1]
    names = sys.argv[2:] or list(methods())
    dist.init_process_group("gloo")
    results: dict = {"world_size": dist.get_world_size()}
    start = time.perf_counter()
    check_training(results, names)
    results["seconds_total"] = round(time.perf_counter() - start, 2)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f, indent=1, default=str)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
