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

import faulthandler
import json
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels on the CPU; before triton is imported

from sparsity_lab import SSTE, STE, SRSTE, Dense, MaskedDecay, MaskedDecayOnWeights, attach_optimizer, sparsify
from sparsity_lab.distributed import data_parallel, fully_shard_sparse, local_batch
from sparsity_lab.lab.model import GPT, GPTConfig
from sparsity_lab.training_hooks import sparse_layers

STEPS = 20
RECOMPUTE_CASES = ("srste", "sste_mvue_transposable_refresh2", "masked_decay_finetune")  # FSDP2, operands rebuilt
STEPS_TRITON = 4  # the interpreted Triton kernels are slow on the CPU (the GPU suite tests the kernels)
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
        "masked_decay_weights": MaskedDecayOnWeights(decay=2e-1, total_steps=total, dense_finetune_at=0.75),
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
    counters = {name: {**layer.counters(), "flips_total": layer.flips_total}
                for name, layer in sparse_layers(model)}
    return {"tensors": state, "counters": counters}


def make(method, parallel: str | None, **wrap_options):
    """(sparse model, what to call, optimizer) for one process (None), "ddp", "fsdp" or "fsdp_recompute"."""
    model = build(method)
    if parallel == "fsdp_recompute":
        wrap_options["recompute_operands"] = True
    wrap = {None: lambda m: m, "ddp": data_parallel, "fsdp": fully_shard_sparse,
            "fsdp_recompute": fully_shard_sparse}[parallel]
    wrapped = wrap(model, **wrap_options)
    opt = optimizer_for(wrapped)
    attach_optimizer(model, opt)
    return model, wrapped, opt


def run_steps(model, wrapped, opt, parallel: str | None, start: int, stop: int, world: int = 2,
              full_batch: bool = False) -> list:
    """Steps start..stop-1 on the global batches; returns each step's per-rank (micro-batch) losses.

    parallel None: one process, the global batch as ``world`` accumulated micro-batches (each loss
    / world), MVUE micro-batch r drawn from rank r's stream; full_batch=True: one forward instead."""
    losses = []
    mvue = [layer for _, layer in sparse_layers(model) if layer.method.mvue]
    for t, (x, y) in list(enumerate(data(stop)))[start:]:
        opt.zero_grad(set_to_none=True)
        if parallel is not None:
            rank, size = dist.get_rank(), dist.get_world_size()
            _, loss = wrapped(local_batch(x, rank, size), local_batch(y, rank, size))
            loss.backward()
            every = [None] * size
            dist.all_gather_object(every, loss.item())
        elif full_batch:
            _, loss = model(x, y)
            loss.backward()
            every = [loss.item()]
        else:
            every = []
            for r in range(world):
                for layer in mvue:  # draw as rank r draws at step t
                    layer.mvue_rank, layer.mvue_calls = r, t
                _, loss = model(local_batch(x, r, world), local_batch(y, r, world))
                (loss / world).backward()
                every.append(loss.item())
            for layer in mvue:
                layer.mvue_rank, layer.mvue_calls = None, t + 1
        opt.step()
        losses.append(every)
    return losses


def mask_stored_fraction(model) -> float:
    """The fraction of the sparse layers' mask entries that this rank stores (1 / world under FSDP2)."""
    layers = [layer for _, layer in sparse_layers(model)]
    local = sum((lay.mask.to_local() if hasattr(lay.mask, "to_local") else lay.mask).numel() for lay in layers)
    return local / sum(lay.mask.numel() for lay in layers)


def train(method, parallel: str | None, steps: int = STEPS, full_batch: bool = False) -> tuple[list, dict]:
    model, wrapped, opt = make(method, parallel)
    losses = run_steps(model, wrapped, opt, parallel, 0, steps, full_batch=full_batch)
    state = full_state(model)
    state["mask_stored_fraction"] = mask_stored_fraction(model)
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
        steps = STEPS_TRITON if method.backend == "triton" else STEPS
        reference = train(method, None, steps) if rank == 0 else None
        modes = ("ddp", "fsdp", "fsdp_recompute") if name in RECOMPUTE_CASES else ("ddp", "fsdp")
        for parallel in modes:
            start = time.perf_counter()
            got = train(method, parallel, steps)
            if rank == 0:
                record = compare(reference, got)
                record["seconds"] = round(time.perf_counter() - start, 2)
                record["dtype"] = str(dtype_for(method))
                record["mask_stored_fraction"] = got[1]["mask_stored_fraction"]
                results[f"{parallel}/{name}"] = record
        if rank == 0 and not method.mvue:
            # the accumulated reference against one forward over the whole batch: equal up to rounding
            record = compare(reference, train(method, None, steps, full_batch=True))
            record["dtype"] = str(dtype_for(method))
            results[f"full_batch/{name}"] = record


def sparse_grads(model) -> dict:
    return {name: layer.weight.grad.detach().clone() for name, layer in sparse_layers(model)}


def check_mvue(results: dict) -> None:
    """MVUE across ranks: independent draws, reproducible from (seed, rank), an unbiased average."""
    rank, world = dist.get_rank(), dist.get_world_size()
    method = SSTE(mvue=True)
    x, y = data(1)[0]
    # the same data on every rank, no wrapper: only the rank's stream differs
    model = build(method)
    attach_optimizer(model, optimizer_for(model))
    model(x, y)[1].backward()
    every = [None] * world
    dist.all_gather_object(every, sparse_grads(model))
    if rank == 0:
        replay = build(method)
        attach_optimizer(replay, optimizer_for(replay))
        for _, layer in sparse_layers(replay):
            layer.mvue_rank = 1
        replay(x, y)[1].backward()
        again = sparse_grads(replay)
        results["mvue/streams"] = {
            "ranks_differ": all(not torch.equal(every[0][k], every[1][k]) for k in every[0]),
            "rank1_replayed_on_rank0": all(torch.equal(every[1][k], again[k]) for k in again),
        }
    # unbiased: the DDP-averaged MVUE gradient, averaged over draws, against the exact gradient
    draws = 200
    model, wrapped, opt = make(method, "ddp")
    exact_model, exact_wrapped, _ = make(SSTE(), "ddp")
    xr, yr = local_batch(x, rank, world), local_batch(y, rank, world)
    exact_wrapped(xr, yr)[1].backward()
    exact = sparse_grads(exact_model)
    samples = {k: [] for k in exact}
    for _ in range(draws):
        opt.zero_grad(set_to_none=True)
        wrapped(xr, yr)[1].backward()
        for k, g in sparse_grads(model).items():
            samples[k].append(g)
    if rank == 0:
        z2, zmax, exact_where_no_spread = [], 0.0, True
        for k, gs in samples.items():
            stack = torch.stack(gs)
            mean, std = stack.mean(0), stack.std(0)
            spread = std > 1e-12
            exact_where_no_spread &= bool(torch.allclose(mean[~spread], exact[k][~spread], rtol=0, atol=1e-12))
            z = (mean[spread] - exact[k][spread]) / (std[spread] / draws ** 0.5)
            z2.append(z.pow(2))
            zmax = max(zmax, z.abs().max().item())
        results["mvue/unbiased"] = {"draws": draws, "mean_z2": torch.cat(z2).mean().item(), "max_abs_z": zmax,
                                    "entries": int(torch.cat(z2).numel()),
                                    "exact_where_no_spread": exact_where_no_spread}


def expect_error(results: dict, name: str, fn, error: type, words: list[str]) -> None:
    try:
        fn()
    except error as err:
        message = str(err)
        record = {"raised": type(err).__name__, "message": message,
                  "names_fix": all(w.lower() in message.lower() for w in words)}
    except Exception as err:  # the wrong type is a failure the test reports
        record = {"raised": type(err).__name__, "message": str(err), "names_fix": False}
    else:
        record = {"raised": None, "message": "", "names_fix": False}
    if dist.get_rank() == 0:
        results[f"error/{name}"] = record


def check_errors(results: dict) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from sparsity_lab.graph_step import CudaGraphStep

    rank = dist.get_rank()

    def seeds_differ():
        torch.manual_seed(rank)
        data_parallel(sparsify(GPT(GPTConfig(**CONFIG)).double(), SSTE(mvue=True)))

    def methods_differ():
        data_parallel(build(STE(transposable=rank == 1)))

    def shard_then_sparsify():
        torch.manual_seed(0)
        model = GPT(GPTConfig(**CONFIG)).double()
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        sparsify(model, STE())

    def ddp_then_sparsify():
        torch.manual_seed(0)
        sparsify(DistributedDataParallel(GPT(GPTConfig(**CONFIG)).double()), STE())

    def placement_fn():
        fully_shard_sparse(build(STE()), shard_placement_fn=lambda p: None)

    def graph_step_under_ddp():
        CudaGraphStep(build(STE()), lambda model, x, y: model(x, y)[1])

    expect_error(results, "seeds_differ", seeds_differ, ValueError, ["manual_seed", "counters"])
    expect_error(results, "methods_differ", methods_differ, ValueError, ["method", "rank 1"])
    expect_error(results, "fully_shard_then_sparsify", shard_then_sparsify, TypeError,
                 ["sparsify(model, method) first", "fully_shard_sparse"])
    expect_error(results, "ddp_then_sparsify", ddp_then_sparsify, TypeError, ["DistributedDataParallel", "first"])
    expect_error(results, "shard_placement_fn", placement_fn, ValueError, ["shard_placement_fn", "dim 0"])
    expect_error(results, "graph_step_under_ddp", graph_step_under_ddp, RuntimeError, ["CudaGraphStep", "process"])
    expect_error(results, "batch_not_divisible", lambda: local_batch(torch.zeros(3, 2), rank, 2), ValueError,
                 ["multiple of 2"])


def check_checkpoints(results: dict, tmp: str) -> None:
    """Stop at step k, save (DCP), load, continue to N == the straight run; across world sizes 2 -> 1 -> 2."""
    from sparsity_lab.distributed.checkpoint import load_distributed, save_distributed

    rank = dist.get_rank()
    stop_at = STEPS // 2
    for name in ("masked_decay_finetune", "sste_mvue_transposable_refresh2"):
        method = methods()[name]
        straight = train(method, "fsdp")
        for parallel in ("ddp", "fsdp"):
            path = os.path.join(tmp, f"{name}-{parallel}")
            model, wrapped, opt = make(method, parallel)
            first = run_steps(model, wrapped, opt, parallel, 0, stop_at)
            save_distributed(path, model, opt, meta={"step": stop_at})
            model, wrapped, opt = make(method, parallel)
            meta = load_distributed(path, model, opt)
            rest = run_steps(model, wrapped, opt, parallel, meta["step"], STEPS)
            state = full_state(model)  # collective under FSDP2: every rank
            if rank == 0:
                record = compare(straight, (first + rest, state))
                results[f"dcp/{parallel}_resume/{name}"] = record
        # saved by 2 ranks (FSDP2), loaded by 1 process, continued there
        two_rank_path = os.path.join(tmp, f"{name}-fsdp")
        one_rank_path = os.path.join(tmp, f"{name}-one")
        if rank == 0:
            model, wrapped, opt = make(method, None)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                meta = load_distributed(two_rank_path, model, opt, no_dist=True)
            rest = run_steps(model, wrapped, opt, None, meta["step"], STEPS)
            record = compare(straight, (straight[0][:stop_at] + rest, full_state(model)))
            record["warned_rng"] = any("RNG" in str(w.message) for w in caught)
            results[f"dcp/2_to_1/{name}"] = record
            # and back: one process saves at step k, two ranks load it and continue
            model, wrapped, opt = make(method, None)
            run_steps(model, wrapped, opt, None, 0, stop_at)
            save_distributed(one_rank_path, model, opt, meta={"step": stop_at}, no_dist=True)
        dist.barrier()
        model, wrapped, opt = make(method, "fsdp")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            meta = load_distributed(one_rank_path, model, opt)
        rest = run_steps(model, wrapped, opt, "fsdp", meta["step"], STEPS)
        state = full_state(model)
        if rank == 0:
            results[f"dcp/1_to_2/{name}"] = compare(straight, (straight[0][:stop_at] + rest, state))


LAB_SIZES = ["--layers", "2", "--width", "32", "--heads", "2", "--context", "16", "--batch-size", "4", "--steps", "6",
             "--eval-interval", "3", "--eval-batches", "2", "--data-max-bytes", "200000", "--no-progress"]
LAB_METHOD = ["--method", "masked_decay"]  # decay before the step and the dense fine-tune switch at step 5


def check_lab(results: dict, tmp: str) -> None:
    """``sparsity-lab train --parallel fsdp`` stopped at step 4, resumed with ``--parallel ddp``
    (``python -m sparsity_lab`` runs the same ``cli.main`` on each rank that torchrun starts)."""
    import contextlib
    import io

    from sparsity_lab.lab.cli import main as cli

    out = os.path.join(tmp, "lab")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        first = cli(["train", *LAB_METHOD, *LAB_SIZES, "--parallel", "fsdp", "--out", out,
                     "--checkpoint-interval", "2", "--stop-at", "4"])
        second = cli(["train", "--parallel", "ddp", "--resume", os.path.join(out, "checkpoint.dcp")])
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, {"codes": [first, second], "printed": printed.getvalue()})
    if dist.get_rank() == 0:
        results["lab"] = {"out": out, "ranks": every, "argv": [*LAB_METHOD, *LAB_SIZES]}


COMPARE_ARGV = ["--variants", "dense,srste", *LAB_SIZES]


def check_compare(results: dict, tmp: str) -> None:
    """``sparsity-lab compare --parallel fsdp`` of two variants; each rank records what it printed
    and which result files it wrote (rank 0 alone should)."""
    import contextlib
    import io

    from sparsity_lab.lab.cli import main as cli
    from sparsity_lab.lab import compare as compare_module

    written = []

    def recording(fn):
        def wrapped(*args, **kwargs):
            path = fn(*args, **kwargs)
            written.append(str(args[0]) if path is None else str(path))
            return path
        return wrapped

    out = os.path.join(tmp, "compare")
    printed = io.StringIO()
    originals = compare_module.write_table, compare_module.write_result
    compare_module.write_table, compare_module.write_result = map(recording, originals)
    try:
        with contextlib.redirect_stdout(printed):
            code = cli(["compare", *COMPARE_ARGV, "--parallel", "fsdp", "--out", out])
    finally:
        compare_module.write_table, compare_module.write_result = originals
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, {"code": code, "printed": printed.getvalue(), "written": written})
    if dist.get_rank() == 0:
        results["compare"] = {"out": out, "ranks": every, "argv": COMPARE_ARGV}


def check_bench(results: dict, tmp: str) -> None:
    """``benchmarks dist --smoke``: the GPU script's plumbing (DDP and FSDP2, dense and 2:4) on 2 CPU ranks."""
    import contextlib
    import io

    from benchmarks.distributed_speed import main as bench

    with contextlib.redirect_stdout(io.StringIO()):
        code = bench(["--smoke", "--out-dir", os.path.join(tmp, "bench")])
    if dist.get_rank() == 0:
        with open(os.path.join(tmp, "bench", "distributed_speed_2cpu_smoke.json")) as f:
            results["bench"] = {"code": code, "result": json.load(f)}


def check_no_full_size_state_after_step(results: dict) -> None:
    """Under FSDP2 nothing full-size outlives a step: no cached operand, no full mask, sharded masks."""
    from sparsity_lab.distributed import ShardedSparseLinear

    def plans_between_forward_and_backward(parallel: str) -> list:
        """The backward plans the autograd graph holds after one forward (walked from the loss)."""
        model, wrapped, opt = make(SRSTE(decay=2e-2), parallel)
        x, y = data(1)[0]
        rank, world = dist.get_rank(), dist.get_world_size()
        _, loss = wrapped(local_batch(x, rank, world), local_batch(y, rank, world))
        plans, seen, todo = [], set(), [loss.grad_fn]
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if hasattr(node, "plan"):
                plans.append(node.plan)
            todo.extend(next_node for next_node, _ in node.next_functions)
        held = [(p.operand is not None, p.mask is not None, p.rebuild is not None) for p in plans]
        loss.backward()  # the backward rebuilds what was dropped (the training check compares the results)
        return held

    keep, recompute = plans_between_forward_and_backward("fsdp"), plans_between_forward_and_backward("fsdp_recompute")
    model, wrapped, opt = make(SSTE(mvue=True, mask_refresh_interval=2), "fsdp")
    run_steps(model, wrapped, opt, "fsdp", 0, 3)
    layers = [layer for _, layer in sparse_layers(model)]
    if dist.get_rank() == 0:
        results["fsdp_between_forward_and_backward"] = {"keep": keep, "recompute": recompute}
        results["fsdp_state_after_step"] = {
            "sharded_layers": all(isinstance(layer, ShardedSparseLinear) and layer.mask_is_sharded for layer in layers),
            "no_cached_operand": all(layer.operand_cache.entry is None for layer in layers),
            "no_full_mask": all(layer._full_mask is None for layer in layers),
            "local_mask_rows": [tuple(layer.mask.to_local().shape) for layer in layers],
            "full_mask_shapes": [tuple(layer.mask.shape) for layer in layers],
        }


CHECKS = ("training", "mvue", "errors", "checkpoints", "lab", "compare", "bench")


def main() -> None:
    """argv: OUT.json TMPDIR [check or method name ...] (default: every check, every method)."""
    out, tmp = sys.argv[1], sys.argv[2]
    # a collective that one rank never joins would hang CI: print every thread's stack and exit instead
    faulthandler.dump_traceback_later(float(os.environ.get("SPARSITY_LAB_DIST_TIMEOUT", "300")), exit=True)
    wanted = sys.argv[3:]
    names = [w for w in wanted if w in methods()] or list(methods())
    checks = [w for w in wanted if w in CHECKS] or list(CHECKS)
    dist.init_process_group("gloo")
    results: dict = {"world_size": dist.get_world_size(), "seconds": {}}
    for check in checks:
        start = time.perf_counter()
        if check == "training":
            check_training(results, names)
        elif check == "mvue":
            check_mvue(results)
        elif check == "errors":
            check_errors(results)
        elif check == "checkpoints":
            check_checkpoints(results, tmp)
            check_no_full_size_state_after_step(results)
        elif check == "bench":
            check_bench(results, tmp)
        elif check == "compare":
            check_compare(results, tmp)
        else:
            check_lab(results, tmp)
        results["seconds"][check] = round(time.perf_counter() - start, 2)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f, indent=1, default=str)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
