"""The lab's trainer across processes: ``torchrun --nproc-per-node N -m sparsity_lab train --parallel ddp|fsdp``.

Every rank builds the same model (same seed), sparsifies it, wraps it (DDP or FSDP2 per block) and
draws the same global batch of ``--batch-size`` sequences from the same sampler; each rank keeps
its ``batch / N`` rows (``local_batch``). So a run on N processes follows the run on one process with
the same options: same global batch, same masks, same schedule (tests/test_distributed_lab.py).
Rank 0 alone writes the log, the summary and the progress bar; the checkpoint is one DCP directory
(each rank writes its shards once, see ``distributed/checkpoint.py``), loadable by any number of processes.
"""
from __future__ import annotations

import io
import math
import os
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from .checkpoint import CheckpointError, load_checkpoint
from .dcp_state import check_corpus, read_dcp_extra, restore_from_dcp
from .trainer import TrainConfig, Trainer, TrainingDiverged, WarmupCosine
from .runlog import clean_row
from ..training_hooks import attach_optimizer
from ..distributed.batches import local_batch
from ..distributed.checkpoint import save_distributed
from ..distributed.sharded_layer import ShardedSparseLinear
from ..distributed.wrap import data_parallel, fully_shard_sparse

PARALLEL = ("ddp", "fsdp")


def init_from_torchrun(device: str = "auto") -> tuple[int, int, int]:
    """Join the process group torchrun set up (nccl on GPUs, gloo on CPUs), unless one runs already;
    (rank, world, local rank)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise ValueError("--parallel needs the processes that torchrun starts: run "
                         "`torchrun --nproc-per-node N -m sparsity_lab train|compare ... --parallel ddp|fsdp`")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    on_gpus = torch.cuda.is_available() and device != "cpu"
    if not dist.is_initialized():
        if on_gpus:
            torch.cuda.set_device(local_rank)  # "cuda" now means this rank's GPU
        dist.init_process_group("nccl" if on_gpus else "gloo")
    return dist.get_rank(), dist.get_world_size(), local_rank


class _RankRows:
    """The sampler's global batch, this rank's rows of it (same generator on every rank)."""

    def __init__(self, sampler, rank: int, world: int) -> None:
        self.sampler, self.rank, self.world = sampler, rank, world

    def sample(self, device):
        x, y = self.sampler.sample(device)
        return local_batch(x, self.rank, self.world), local_batch(y, self.rank, self.world)


class DistributedTrainer(Trainer):
    """``Trainer`` on ``world`` processes; ``parallel`` is "ddp" or "fsdp". Call under torchrun."""

    def __init__(self, config: TrainConfig, parallel: str, corpus=None) -> None:
        if parallel not in PARALLEL:
            raise ValueError(f"parallel must be one of {PARALLEL}, got {parallel!r}")
        if config.model.activation_sparsity != "none":  # Act24MLP reads proj's full weight and counts its own steps
            raise ValueError(f"--activation-sparsity {config.model.activation_sparsity} runs on one process; "
                             "drop --parallel (or the activation sparsity)")
        if config.bf16_weights or config.compile:  # the wrappers are built around the float32, eager model
            raise ValueError("--bf16-weights and --compile run on one process; drop --parallel (or those options)")
        self.rank, self.world, _ = init_from_torchrun(config.device)
        if config.batch_size % self.world:
            raise ValueError(f"--batch-size {config.batch_size} is the global batch; it must be a multiple of the "
                             f"{self.world} processes: choose --batch-size {self.world * max(1, config.batch_size // self.world)}")
        self.parallel = parallel
        if config.method.lower() == "dense" and not config.track_flips:
            # the wrappers shard through the SparseLinear layers: a dense run keeps Dense() (its would-be
            # masks computed) under --parallel, as before the plain dense GPT existed
            config = TrainConfig.from_dict({**config.to_dict(), "track_flips": True})
        if self.rank != 0:  # one log, one progress bar
            config = TrainConfig.from_dict({**config.to_dict(), "log_path": None, "progress": False})
        super().__init__(config, corpus)
        if not self.is_24:
            raise ValueError(f"--parallel runs the 2:4 methods; {config.method!r} (a structure) runs on one process")
        # the base class built the optimizer over the unwrapped parameters: wrap, then build it again
        self.hooks.remove()
        self.gpt = self.model
        self.wrapped = data_parallel(self.gpt) if parallel == "ddp" else fully_shard_sparse(self.gpt)
        cfg = self.config
        params = [p for p in self.gpt.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)
        self.hooks = attach_optimizer(self.gpt, self.optimizer)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, WarmupCosine(cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio))
        self.rows = _RankRows(self.sampler, self.rank, self.world)

    # --- one step --------------------------------------------------------------------------------
    def train_step(self) -> dict:
        """Trainer.train_step with this rank's rows, the wrapped model, and the loss averaged over ranks."""
        cfg = self.config
        self.wrapped.train()
        start = time.perf_counter()
        lr = self.optimizer.param_groups[0]["lr"]
        loss_sum = torch.zeros((), device=self.device)
        for _ in range(cfg.grad_accum):
            x, y = self.rows.sample(self.device)
            with self._autocast():
                _, loss = self.wrapped(x, y)
            (loss / cfg.grad_accum).backward()
            loss_sum += loss.detach()
        masks = self._mask_stats()
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.gpt.parameters(), max_norm)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        dist.all_reduce(loss_sum)  # the global batch's mean loss, as one process logs it
        loss_value = (loss_sum / (cfg.grad_accum * self.world)).item()
        seconds = time.perf_counter() - start
        if not math.isfinite(loss_value):
            raise TrainingDiverged(f"{cfg.method}: the training loss became {loss_value} at step {self.step}")
        row = {"step": self.step, "tokens": self.step * cfg.tokens_per_step, "loss": loss_value,
               "val_loss": None, "lr": lr, "grad_norm": float(grad_norm)}
        row.update(masks)
        row["tokens_per_s"] = cfg.tokens_per_step / seconds  # the global batch's tokens: all ranks together
        return clean_row(row)

    def _mask_stats(self) -> dict:
        # every rank is here at once: sum this step's flip counts over the ranks before they are read
        ShardedSparseLinear.sum_flips_over_ranks([layer for _, layer in self.layers])
        stats = super()._mask_stats()
        if self.parallel == "fsdp":  # the density read from the sharded masks is the rank's part: use the full one
            sizes = [layer.weight.numel() for _, layer in self.layers]
            used = [1.0 if layer.dense_now else float(layer.mask.full_tensor().float().mean())
                    for _, layer in self.layers]
            stats["density"] = sum(u * s for u, s in zip(used, sizes)) / sum(sizes)
        return stats

    @torch.no_grad()
    def evaluate(self) -> float:
        """Every rank scores the same validation windows (the result is the same everywhere)."""
        for _, layer in self.layers:
            if isinstance(layer, ShardedSparseLinear) and layer.mask_is_sharded:
                layer.refresh_in_next_forward = True  # the full W exists only inside the forward
            elif layer.mask_due():
                layer.refresh_mask()
        self.wrapped.eval()
        total = torch.zeros((), device=self.device)
        for x, y in self.val_batches:
            with self._autocast():
                _, loss = self.wrapped(x, y)
            total += loss
        self.wrapped.train()
        return (total / len(self.val_batches)).item()

    def summary(self) -> dict:
        out = super().summary()
        out.update(parallel=self.parallel, world_size=self.world)
        return out

    # --- checkpoints: one DCP directory ------------------------------------------------------------
    def _extra_state(self) -> dict:
        return {"step": self.step, "config": self.config.to_dict(), "corpus": self.corpus.describe(),
                "scheduler": self.scheduler.state_dict(), "sampler": self.sampler.state_dict(),
                "parallel": self.parallel}

    def save(self, path: str | Path | None = None) -> Path:
        path = path or self.config.checkpoint_path
        if path is None:
            raise ValueError("no checkpoint path: pass one or set TrainConfig.checkpoint_path")
        self.log.flush()
        buffer = io.BytesIO()
        torch.save(self._extra_state(), buffer)
        return save_distributed(path, self.gpt, self.optimizer, meta={"step": self.step},
                                extra=buffer.getvalue())

    @classmethod
    def resume(cls, path: str | Path, parallel: str, corpus=None, **run_options) -> "DistributedTrainer":
        """A trainer at the checkpoint's step: a DCP directory written by ``save`` (any world size) or the
        ``.pt`` file of a one-process run (``Trainer.save``), re-sharded over these processes."""
        if Path(path).is_file():
            return cls._resume_from_file(path, parallel, corpus, **run_options)
        extra = read_dcp_extra(path)
        config = TrainConfig.from_dict({**extra["config"], **run_options})
        trainer = cls(config, parallel, corpus)
        restore_from_dcp(trainer, trainer.gpt, path, extra, no_dist=False)
        return trainer

    @classmethod
    def _resume_from_file(cls, path: str | Path, parallel: str, corpus=None, **run_options) -> "DistributedTrainer":
        """Continue a one-process run (its ``.pt`` checkpoint) on these processes: the full tensors of the file
        are loaded on every rank and sharded like this run's (FSDP2) or copied (DDP)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        state = load_checkpoint(path)
        config = TrainConfig.from_dict({**state["config"], **run_options})
        if config.method.lower() == "dense" and not config.track_flips:
            raise CheckpointError(f"checkpoint {str(path)!r} is a plain dense run (no would-be masks); under "
                                  "--parallel a dense run keeps its would-be masks: continue it on one process")
        trainer = cls(config, parallel, corpus)
        check_corpus(trainer, state["corpus"])
        try:
            set_state_dict(trainer.gpt, trainer.optimizer, model_state_dict=state["model"],
                           optim_state_dict=_optimizer_by_name(trainer.gpt, trainer.optimizer, state["optimizer"]),
                           options=StateDictOptions(full_state_dict=True))
            trainer.scheduler.load_state_dict(state["scheduler"])
            trainer.sampler.load_state_dict(state["sampler"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise CheckpointError(f"checkpoint {str(path)!r} does not fit this run: "
                                  f"{str(err).splitlines()[0][:300]}") from err
        if trainer.world == 1:
            torch.set_rng_state(state["torch_rng"])
        else:
            warnings.warn(f"checkpoint saved by 1 process, loaded by {trainer.world}: model and optimizer are "
                          "sharded, the torch RNG state is not restored", stacklevel=2)
        trainer.step = int(state["step"])
        trainer.log.truncate_after(trainer.step)
        return trainer


def _optimizer_by_name(model, optimizer, saved: dict) -> dict:
    """A one-process optimizer state dict (parameters numbered in the order of the optimizer's groups) with the
    parameters named instead (the form ``set_state_dict`` loads into any sharding). Both runs build their
    groups the same way (``Trainer``), so the k-th parameter is the same one."""
    names = {id(p): name for name, p in model.named_parameters()}
    ordered = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    numbered = [i for group in saved["param_groups"] for i in group["params"]]
    if len(numbered) != len(ordered):
        raise ValueError(f"the checkpoint's optimizer has {len(numbered)} parameters, this run's {len(ordered)}")
    by_index = dict(zip(numbered, ordered))
    return {"state": {by_index[i]: value for i, value in saved["state"].items()},
            "param_groups": [{**group, "params": [by_index[i] for i in group["params"]]}
                             for group in saved["param_groups"]]}
