"""Run torchtitan 0.2's own trainer and record what the 2:4 converter did: losses, step times, 2:4 checks.

    SPARSITY_LAB_RECORD=run.json torchrun --standalone --nproc-per-node 1 \\
        -m benchmarks.torchtitan_record --job.config_file debug_model.toml \\
        --job.custom_config_module sparsity_lab.integrations.torchtitan --model.converters sparsity24 ...

The arguments are torchtitan's (``torchtitan.train``); this module only swaps its ``Trainer`` for a subclass
that, around each ``train_step``,

- times the step (the device synchronised before and after; the first steps include warm-up),
- keeps the loss torchtitan logs (its ``global_avg_loss``; run with ``metrics.log_freq = 1``),
- checks every 2:4 layer after the optimizer step: its mask keeps exactly 2 of every 4 weights along the
  input dimension and the weight its products use next (``SparseLinear.sparse_weight()``) has at most 2
  non-zeros in every group of 4,

and writes them with the backend each layer ran and the run's provenance to ``$SPARSITY_LAB_RECORD``.
One process only (the converter refuses split models).
"""
import dataclasses
import json
import os
import statistics
import sys
import time

import torch
from torchtitan.tools.utils import device_module
from torchtitan.train import Trainer, main

from sparsity_lab.integrations import torchtitan as _register_converter  # noqa: F401  (registers "sparsity24")
from sparsity_lab.provenance import provenance
from sparsity_lab.sparsify import backend_report
from sparsity_lab.training_hooks import sparse_layers

RECORD_ENV = "SPARSITY_LAB_RECORD"


def nonzeros_per_group(weight: torch.Tensor, m: int = 4) -> torch.Tensor:
    """(out, in) -> (out, in/m) count of non-zeros in each group of m consecutive inputs."""
    return (weight.detach() != 0).reshape(weight.shape[0], -1, m).sum(-1)


def check_24(model_parts) -> dict:
    """The 2:4 state of every SparseLinear in the model parts now."""
    layers = [(name, layer) for part in model_parts for name, layer in sparse_layers(part)]
    if not layers:
        return {"layers": 0, "masks_exactly_2_of_4": None, "max_nonzeros_per_4_in_used_weight": None, "dense_now": []}
    masks_exact = all(bool((nonzeros_per_group(layer.mask) == 2).all()) for _, layer in layers)
    used_max = max(int(nonzeros_per_group(layer.sparse_weight()).max()) for _, layer in layers)
    dense_now = [name for name, layer in layers if layer.dense_now]
    return {"layers": len(layers), "masks_exactly_2_of_4": masks_exact,
            "max_nonzeros_per_4_in_used_weight": used_max, "dense_now": dense_now}


class RecordingTrainer(Trainer):
    """torchtitan's Trainer, recording each step's loss, time and the layers' 2:4 state."""

    def __init__(self, job_config) -> None:
        super().__init__(job_config)
        self.record = {"losses": {}, "step_s": {}, "checks": {}}
        log = self.metrics_processor.log

        def keep_loss(step, global_avg_loss, *args, **kwargs):
            self.record["losses"][step] = float(global_avg_loss)
            return log(step, global_avg_loss, *args, **kwargs)

        self.metrics_processor.log = keep_loss
        self.record["before_training"] = check_24(self.model_parts)

    def train_step(self, data_iterator):
        device_module.synchronize()
        start = time.perf_counter()
        super().train_step(data_iterator)
        device_module.synchronize()
        self.record["step_s"][self.step] = time.perf_counter() - start
        self.record["checks"][self.step] = check_24(self.model_parts)

    def train(self):
        super().train()
        self.write_record()

    def write_record(self) -> None:
        path = os.environ.get(RECORD_ENV)
        if not path or torch.distributed.get_rank() != 0:
            return
        import torchtitan

        rec = self.record
        times = [rec["step_s"][s] for s in sorted(rec["step_s"])][2:]  # steps 1-2: warm-up
        checks = list(rec["checks"].values())
        layers = [(name, layer) for part in self.model_parts for name, layer in sparse_layers(part)]
        out = {
            "provenance": provenance(" ".join(sys.argv)),
            "torchtitan": torchtitan.__version__,
            "converters": list(self.job_config.model.converters),
            "sparsity24": (dataclasses.asdict(self.job_config.sparsity24)
                           if "sparsity24" in self.job_config.model.converters else None),
            "steps": self.job_config.training.steps,
            "tokens_per_step": self.job_config.training.local_batch_size * self.job_config.training.seq_len,
            "losses": [rec["losses"][s] for s in sorted(rec["losses"])],
            "step_s": [rec["step_s"][s] for s in sorted(rec["step_s"])],
            "median_step_s_after_2": statistics.median(times) if times else None,
            "sparse_layers": [name for name, _ in layers],
            "backends": sorted({(r.running, r.fallback_reason or "") for part in self.model_parts
                                for r in backend_report(part)}),
            "check_before_training": rec["before_training"],
            "checks": [rec["checks"][s] for s in sorted(rec["checks"])],
            "two_four_every_step": None if not layers else all(
                c["layers"] == len(layers) and c["masks_exactly_2_of_4"]
                and c["max_nonzeros_per_4_in_used_weight"] <= 2 and not c["dense_now"] for c in checks),
        }
        with open(path, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main(RecordingTrainer)
