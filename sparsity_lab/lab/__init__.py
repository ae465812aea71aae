"""The pre-training lab: a small GPT on bytes, a trainer, the method comparison, the decay search.

    from sparsity_lab.lab import GPTConfig, TrainConfig, Trainer
    trainer = Trainer(TrainConfig(method="sste", model=GPTConfig(n_layer=2, d_model=64, n_head=2, context=64),
                                  steps=200, device="cpu"))
    trainer.run()
"""
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .data import BatchSampler, ByteCorpus, load_corpus
from .model import GPT, GPTConfig
from .runlog import RunLog, read_log
from .trainer import TrainConfig, Trainer, TrainingDiverged, WarmupCosine

__all__ = [
    "BatchSampler", "ByteCorpus", "CheckpointError", "GPT", "GPTConfig", "RunLog", "TrainConfig", "Trainer",
    "TrainingDiverged", "WarmupCosine", "load_checkpoint", "load_corpus", "read_log", "save_checkpoint",
]
