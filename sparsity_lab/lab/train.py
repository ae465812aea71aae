"""``sparsity-lab train``: one pre-training run of the lab GPT with one method.

    sparsity-lab train --method sste --mvue --steps 2000 --out runs/sste
    sparsity-lab train --resume runs/sste/checkpoint.pt        # continue exactly where it stopped

Writes OUT/log.jsonl (one row per step), OUT/checkpoint.pt (every --checkpoint-interval steps
and at the end) and OUT/summary.json.

Across processes (docs/distributed.md), the same run with the global batch split over the ranks:
    torchrun --nproc-per-node 2 -m sparsity_lab train --method sste --mvue --parallel fsdp --out runs/sste2
writes the log and summary once (rank 0) and the checkpoint as one DCP directory OUT/checkpoint.dcp.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..backends.fp8_sim import fp8_sim_backend_for
from .atomic_io import ensure_folder, write_text_atomic
from .arguments import existing_path, nonnegative_int, output_folder, plural, positive_int
from .config_file import add_config_argument, resolved_options, write_resolved
from .reporting import add_report_argument, attach_reporters, check_report_to, reporters_for
from .options import (TRAJECTORY_OPTIONS, add_common_arguments, add_method_arguments, cli_errors,
                      check_data_options, common_method_options, config_from_args, given,
                      resolve_tokenizer, resolved_from_config)
from .trainer import Trainer


def add_arguments(parser) -> None:
    add_config_argument(parser)
    add_method_arguments(parser)
    add_common_arguments(parser)
    g = parser.add_argument_group("output")
    g.add_argument("--out", type=output_folder, default=None, help="run folder (default runs/<method>)")
    g.add_argument("--checkpoint-interval", type=nonnegative_int, default=0,
                   help="steps between checkpoints (default 0: only at the end)")
    g.add_argument("--resume", metavar="CHECKPOINT", type=existing_path, default=None,
                   help="continue a run from its checkpoint (its settings come from the checkpoint)")
    g.add_argument("--overwrite", action="store_true", help="replace an existing run in --out")
    add_report_argument(g)
    g.add_argument("--stop-at", type=positive_int, default=None, metavar="STEP",
                   help="stop after this step (the schedule still plans --steps); continue later with --resume")
    g = parser.add_argument_group("across processes (under torchrun)")
    g.add_argument("--parallel", choices=("none", "ddp", "fsdp"), default="none",
                   help="ddp: DistributedDataParallel; fsdp: FSDP2 (fully_shard per block, masks sharded "
                   "like weights). --batch-size stays the global batch, split over the processes")


# structure options: CLI name -> the structure's field
STRUCTURE_OPTIONS = {"dyad_blocks": "n_blocks", "dyad_variant": "variant", "sparsity": "sparsity",
                     "block_size": "block", "regrow_every": "update_every"}


def method_options(args) -> dict:
    opts = common_method_options(args)
    for cli_name, field in STRUCTURE_OPTIONS.items():
        if cli_name in vars(args):
            opts[field] = getattr(args, cli_name)
    for name in ("decay", "dense_finetune_at"):
        if name in vars(args):
            opts[name] = getattr(args, name)
    if "mvue" in vars(args):
        opts["mvue"] = True
    if "fp8_sim" in vars(args):  # FP8-rounded operands around the chosen backend: torch -> torch_fp8sim
        try:
            opts["backend"] = fp8_sim_backend_for(opts.get("backend", "torch"))
        except ValueError as err:
            raise ValueError(f"--fp8-sim with --backend: {err}") from None
    return opts


def check_arguments(args) -> None:
    """Options that do not go together (ValueError naming them), before any work."""
    if args.resume:
        clash = given(args, *TRAJECTORY_OPTIONS)
        if clash:
            raise ValueError(f"--resume takes the run's settings from the checkpoint; drop "
                             f"{', '.join('--' + c.replace('_', '-') for c in clash)}")
    check_report_to(args.report_to)
    if not args.resume:
        check_data_options(args)
    steps = getattr(args, "steps", None)
    if args.stop_at is not None and steps is not None and args.stop_at > steps:
        raise ValueError(f"--stop-at {args.stop_at} is past --steps {steps}")


@cli_errors("train")
def run(args) -> int:
    check_arguments(args)  # also when run() is called without the command line
    if args.out:  # fail now, naming the path, not after the set-up (e.g. a regular file in the way)
        ensure_folder(args.out, "--out run")
    parallel = getattr(args, "parallel", "none")
    if parallel != "none":
        return _run_parallel(args, parallel)
    if args.resume:
        out = Path(args.out) if args.out else Path(args.resume).parent
        trainer = Trainer.resume(args.resume, log_path=str(out / "log.jsonl"),
                                 checkpoint_path=str(out / "checkpoint.pt"),
                                 checkpoint_interval=args.checkpoint_interval, progress=not args.no_progress)
        print(f"resumed {args.resume} at step {trainer.step} of {trainer.config.steps}")
        attach_reporters(trainer, reporters_for(args.report_to, out, out.name, trainer.config.to_dict()))
    else:
        method = getattr(args, "method", "ste")
        out = ensure_folder(args.out or f"runs/{method}", "--out run")
        log = out / "log.jsonl"
        if log.exists():
            if not args.overwrite and not (out / "checkpoint.pt").exists():
                raise ValueError(f"{str(out)!r} holds a run that stopped before its first checkpoint; pass "
                                 "--overwrite to start it again, or another --out")
            if not args.overwrite:
                raise ValueError(f"{str(out)!r} already holds a run; pass --resume {out / 'checkpoint.pt'}, "
                                 "--overwrite or another --out")
            log.unlink()
        resolve_tokenizer(args, out)
        config = config_from_args(args, method=method, method_options=method_options(args), log_path=str(log),
                                  checkpoint_path=str(out / "checkpoint.pt"),
                                  checkpoint_interval=args.checkpoint_interval)
        write_run_config(args, out, config, "train")
        trainer = Trainer(config)
        attach_reporters(trainer, reporters_for(args.report_to, out, out.name, config.to_dict()))
        # one fact a line: the method, the sizes, the corpus (its source can be a long path)
        print(f"{trainer.describe()}\n  {trainer.model.num_params():,} parameters, {config.steps} steps of "
              f"{config.tokens_per_step:,} tokens on {trainer.device}\n  corpus {trainer.corpus.source} "
              f"({trainer.corpus.train.numel():,} training "
              f"{'bytes' if trainer.corpus.tokenizer is None else 'tokens'})")
    summary = trainer.run(stop_at=args.stop_at)
    trainer.close()
    summary.update(config=trainer.config.to_dict(), corpus=trainer.corpus.describe())
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n", "run summary")
    speed = summary["median_tokens_per_s"]
    print(f"step {summary['step']}: val loss {_loss(summary['final_val_loss'])}, median "
          f"{'n/a' if speed is None else f'{speed:.0f}'} tokens/s\n  log: {out / 'log.jsonl'}")
    return 0


def write_run_config(args, out: Path, config, command: str, skip: tuple[str, ...] = ()) -> None:
    """OUT/config.toml: every option of the run as resolved (``--config`` reads it back)."""
    parser = vars(args).get("_parser")
    if parser is None:  # run() called without the command line: no options to write
        return
    options = resolved_options(parser, args, resolved_from_config(config),
                               skip=("resume", "overwrite", "stop_at", "figures_from", *skip))
    write_resolved(out, options, command)


def _loss(value) -> str:
    """A loss for people: 4 decimals (the log and summary keep every digit)."""
    return "n/a" if value is None else f"{value:.4f}"


def _run_parallel(args, parallel: str) -> int:
    """``run`` on the processes torchrun started: rank 0 prints and writes the summary."""
    import torch.distributed as dist

    from .distributed_trainer import DistributedTrainer

    started_here = not (dist.is_available() and dist.is_initialized())  # else the caller owns the group

    if args.resume:
        out = Path(args.out) if args.out else Path(args.resume).parent
        trainer = DistributedTrainer.resume(args.resume, parallel, log_path=str(out / "log.jsonl"),
                                            checkpoint_path=str(out / "checkpoint.dcp"),
                                            checkpoint_interval=args.checkpoint_interval,
                                            progress=not args.no_progress)
        lead = trainer.rank == 0
        if lead:
            print(f"resumed {args.resume} at step {trainer.step} of {trainer.config.steps} on "
                  f"{plural(trainer.world, 'process', 'processes')}")
    else:
        method = getattr(args, "method", "ste")
        out = Path(args.out or f"runs/{method}")
        log = out / "log.jsonl"
        if log.exists() and not args.overwrite:
            raise ValueError(f"{str(out)!r} already holds a run; pass --resume {out / 'checkpoint.dcp'}, "
                             "--overwrite or another --out")
        config = config_from_args(args, method=method, method_options=method_options(args), log_path=str(log),
                                  checkpoint_path=str(out / "checkpoint.dcp"),
                                  checkpoint_interval=args.checkpoint_interval)
        trainer = DistributedTrainer(config, parallel)
        lead = trainer.rank == 0
        if lead:
            write_run_config(args, out, config, "train")
        if lead and log.exists():
            log.unlink()  # --overwrite
        dist.barrier()
        if lead:
            print(f"{trainer.method.describe()}\n  on {plural(trainer.world, 'process', 'processes')} ({parallel}): "
                  f"{trainer.gpt.num_params():,} parameters, {config.steps} steps of {config.tokens_per_step:,} "
                  f"tokens (global batch) on {trainer.device}")
    if lead:
        attach_reporters(trainer, reporters_for(args.report_to, out, out.name, trainer.config.to_dict()))
    summary = trainer.run(stop_at=args.stop_at)
    trainer.close()
    if lead:
        summary.update(config=trainer.config.to_dict(), corpus=trainer.corpus.describe())
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        speed = summary["median_tokens_per_s"]
        print(f"step {summary['step']}: val loss {_loss(summary['final_val_loss'])}, median "
              f"{'n/a' if speed is None else f'{speed:.0f}'} tokens/s (all processes)\n  log: {out / 'log.jsonl'}")
    if started_here:
        dist.destroy_process_group()
    return 0
