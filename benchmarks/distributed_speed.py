"""Lab GPT training speed and memory, dense vs 2:4, under DDP and FSDP2 on every GPU of the machine.

    torchrun --nproc-per-node 8 -m benchmarks.distributed_speed      # all 8 GPUs
    python -m benchmarks.distributed_speed                            # world size 1
    python -m benchmarks dist ...                                                    # the same, one process
    python -m benchmarks.distributed_speed --smoke                    # plumbing on the CPU

For each parallel mode (``none``: no wrapper, only at world size 1; ``ddp``; ``fsdp``: fully_shard per
block) and each method (``dense``: the plain GPT; ``sste_mvue``: S-STE + MVUE on the FFN linears, transposable
masks, ``--backend`` products, cusparselt by default; ``sste_mvue_all``: the same on every linear of every
block; ``--mask-refresh-interval`` for both), it trains ``--warmup`` steps, then times ``--steps``
steps on random tokens (``--batch-per-gpu`` sequences of ``--context`` bytes per GPU, bf16 autocast,
AdamW). Reports tokens/s per GPU and in total, the median step time, the peak memory per rank
(compare ``--reshard-after-forward`` and ``--recompute-operands`` true/false to choose), and,
at world size 1, how far the wrapped runs' losses are from the unwrapped run's (same seed, data
and draws), and per parallel mode each 2:4 method's speed-up over dense.

The options of ``python -m benchmarks step-profile``, for the same comparison across GPUs: ``--fused-adamw``
(AdamW fused, as on one GPU; default foreach) and ``--bf16-weights`` (bf16 linear weights, float32 masters:
``MasterWeights`` under none and DDP; under FSDP2 its own form of it, ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=float32)``: float32 shards, bf16 gathered weights). A case that fails is recorded under
``errors`` and the others run. Writes results/<--name>.json with provenance (GPU kind and count, NCCL, torch, commit).

NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are set here, before any process group
starts: NVLink multicast is left off on the machines this runs on.
"""
from __future__ import annotations

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import argparse  # noqa: E402
import contextlib  # noqa: E402
import gc  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from sparsity_lab.lab.arguments import backend_name, nonnegative_int, output_folder, positive_int

RESULT_NAME = "distributed_speed"
PARALLEL = ("none", "ddp", "fsdp")
METHODS = ("dense", "sste_mvue", "sste_mvue_all")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--width", type=positive_int, default=1024, help="d_model (default 1024)")
    parser.add_argument("--layers", type=positive_int, default=8, help="transformer blocks (default 8)")
    parser.add_argument("--heads", type=positive_int, default=16, help="attention heads (default 16)")
    parser.add_argument("--context", type=positive_int, default=1024, help="sequence length (default 1024)")
    parser.add_argument("--batch-per-gpu", type=positive_int, default=8, help="sequences per GPU per step (default 8)")
    parser.add_argument("--steps", type=positive_int, default=20, help="timed steps (default 20)")
    parser.add_argument("--warmup", type=nonnegative_int, default=5, help="untimed steps first (default 5)")
    parser.add_argument("--backend", type=backend_name, default="cusparselt",
                        help="2:4 products' backend (default cusparselt)")
    parser.add_argument("--parallel", nargs="+", choices=PARALLEL, default=list(PARALLEL),
                        help="modes to run (default all; 'none' only at world size 1)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=["dense", "sste_mvue"],
                        help="default dense sste_mvue")
    parser.add_argument("--mask-refresh-interval", type=positive_int, default=1, help="2:4 methods: steps between mask "
                        "computations (default 1)")
    parser.add_argument("--fused-adamw", action="store_true", help="AdamW fused (default: foreach)")
    parser.add_argument("--bf16-weights", action="store_true", help="bf16 linear weights, float32 master weights "
                        "(MasterWeights; under FSDP2 its bf16 param_dtype)")
    parser.add_argument("--reshard-after-forward", choices=("true", "false"), default="true",
                        help="FSDP2: free the unsharded weights after the forward (default true)")
    parser.add_argument("--recompute-operands", choices=("true", "false"), default="false",
                        help="FSDP2, 2:4: rebuild the prepared operands in the backward instead of keeping them "
                        "from the forward (default false)")
    parser.add_argument("--name", default=None, help=f"result JSON name (default {RESULT_NAME}_<N>gpu)")
    parser.add_argument("--out-dir", type=output_folder, default=None, help="folder for the JSON (default results/)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes on the CPU (gloo, reference backend): checks the script, not a figure")


def _join_group() -> tuple[int, int, torch.device]:
    """Join torchrun's process group, or make a one-process group when started without torchrun."""
    if "RANK" not in os.environ:
        with socket.socket() as s:  # a free port for the one-process rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    local = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), device


def _build(args, method: str, parallel: str, device: torch.device):
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from sparsity_lab.distributed import data_parallel, fully_shard_sparse
    from sparsity_lab.lab.master_weights import lower_linear_weights
    from sparsity_lab.lab.model import GPT, GPTConfig, is_block_linear
    from sparsity_lab.methods.config import SSTE
    from sparsity_lab.sparsify import sparsify
    from sparsity_lab.training_hooks import attach_optimizer

    torch.manual_seed(0)
    with device:
        model = GPT(GPTConfig(n_layer=args.layers, n_head=args.heads, d_model=args.width, context=args.context))
    sparse = method != "dense"
    if sparse:
        sparsify(model, SSTE(mvue=True, transposable=True, backend=args.backend,
                             mask_refresh_interval=args.mask_refresh_interval),
                 select=is_block_linear if method == "sste_mvue_all" else None)
    reshard = args.reshard_after_forward == "true"
    adamw = dict(lr=1e-4, fused=True if args.fused_adamw else None)
    opt = None
    if args.bf16_weights and parallel != "fsdp":  # before DDP: it reads the bf16 parameters
        opt = lower_linear_weights(model, torch.optim.AdamW, **adamw)
    if args.bf16_weights and parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy
        fsdp_kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
    else:
        fsdp_kw = {}
    if parallel == "ddp":
        wrapped = data_parallel(model) if sparse else DistributedDataParallel(model)
    elif parallel == "fsdp":
        if sparse:
            wrapped = fully_shard_sparse(model, reshard_after_forward=reshard,
                                         recompute_operands=args.recompute_operands == "true", **fsdp_kw)
        else:
            for block in model.blocks:
                fully_shard(block, reshard_after_forward=reshard, **fsdp_kw)
            wrapped = fully_shard(model, reshard_after_forward=reshard, **fsdp_kw)
    else:
        wrapped = model
    if opt is None:
        opt = torch.optim.AdamW(model.parameters(), **adamw)
    if sparse:
        attach_optimizer(model, opt)
    return model, wrapped, opt


def _case(args, method: str, parallel: str, rank: int, world: int, device: torch.device) -> dict:
    from sparsity_lab.distributed import local_batch

    model, wrapped, opt = _build(args, method, parallel, device)
    gen = torch.Generator().manual_seed(1)
    global_batch = args.batch_per_gpu * world
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda" or args.bf16_weights
                else contextlib.nullcontext())  # bf16 weights need autocast on the CPU too
    losses, times = [], []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(0, 256, (global_batch, args.context + 1), generator=gen)
        tokens = local_batch(tokens, rank, world).to(device, non_blocking=True)
        if step == args.warmup and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        sync()
        start = time.perf_counter()
        with autocast:
            _, loss = wrapped(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # waits for the step: the timing is real
        times.append(time.perf_counter() - start)
    timed = times[args.warmup:]
    step_s = statistics.median(timed)
    tokens_per_gpu = args.batch_per_gpu * args.context / step_s
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    every: list = [None] * world
    dist.all_gather_object(every, {"step_s": step_s, "peak_gib": peak})
    del model, wrapped, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"method": method, "parallel": parallel, "median_step_s": step_s, "slowest_rank_step_s":
            max(r["step_s"] for r in every), "tokens_per_s_per_gpu": tokens_per_gpu,
            "tokens_per_s_total": args.batch_per_gpu * args.context * world / max(r["step_s"] for r in every),
            "peak_memory_gib_per_rank": [r["peak_gib"] for r in every], "losses_rank0": losses}


def benchmark(args) -> tuple[dict, int]:
    rank, world, device = _join_group()
    if device.type != "cuda" and not args.smoke:
        raise SystemExit("benchmarks dist needs CUDA GPUs (torch.cuda.is_available() is False); --smoke runs the "
                         "script's plumbing on the CPU")
    modes = [p for p in args.parallel if p != "none" or world == 1]
    rows, errors = [], []
    for method in args.methods:
        for parallel in modes:
            if rank == 0:
                print(f"{method} {parallel} ...", flush=True)
            try:
                rows.append(_case(args, method, parallel, rank, world, device))
            except Exception as err:  # noqa: BLE001 - every rank fails alike (same code, same data): recorded
                errors.append({"method": method, "parallel": parallel, "rank": rank,
                               "error": f"{type(err).__name__}: {err}"[:1000]})
                print(f"  rank {rank}: error in {method} {parallel}: {errors[-1]['error'][:300]}", flush=True)
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    if world == 1:  # the wrappers should not change the run: same seed, data and MVUE draws
        for row in rows:
            plain = next((r for r in rows if r["method"] == row["method"] and r["parallel"] == "none"), None)
            if plain is not None:
                row["max_loss_diff_vs_none"] = max(abs(a - b) for a, b in zip(row["losses_rank0"], plain["losses_rank0"]))
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else None
    payload = {
        "smoke": bool(args.smoke), "world_size": world, "gpu_count": world if device.type == "cuda" else 0,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None, "nccl": nccl,
        "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
        "settings": {k: v for k, v in vars(args).items() if k not in ("name", "out_dir") and not k.startswith("_")},
        "rows": rows, "errors": errors, "speedups": speedups(rows),
    }
    return payload, rank


def speedups(rows: list[dict]) -> dict:
    """{parallel: {method: dense's median step time / the method's}} for every 2:4 method beside a dense row."""
    out: dict = {}
    for row in rows:
        dense = next((r for r in rows if r["method"] == "dense" and r["parallel"] == row["parallel"]), None)
        if row["method"] != "dense" and dense is not None:
            out.setdefault(row["parallel"], {})[row["method"]] = dense["median_step_s"] / row["median_step_s"]
    return out


def run(args: argparse.Namespace) -> int:
    from sparsity_lab.provenance import write_result
    from sparsity_lab.course.viz.distributed_view import distributed_table

    if args.smoke:
        args.width, args.layers, args.heads, args.context = 32, 2, 2, 16
        args.batch_per_gpu, args.steps, args.warmup, args.backend = 2, 2, 1, "torch"
    started_here = not dist.is_initialized()  # else the caller owns the process group
    payload, rank = benchmark(args)
    if rank == 0:
        name = args.name or f"{RESULT_NAME}_{payload['world_size']}{'cpu_smoke' if args.smoke else 'gpu'}"
        path = write_result(name, payload, directory=args.out_dir)
        print(distributed_table(payload))
        for parallel, per in payload["speedups"].items():
            print(f"{parallel}: " + ", ".join(f"{m} {x:.3f}x over dense" for m, x in per.items()))
        for e in payload["errors"]:
            print(f"error in {e['method']} {e['parallel']}: {e['error'][:300]}")
        print(f"wrote {path}")
    dist.barrier()
    if started_here:
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.distributed_speed",
                                     description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
