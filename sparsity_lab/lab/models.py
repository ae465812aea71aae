"""The lab's models by name: ``build_model(cfg)`` for ``cfg.arch`` in ``model.ARCHS``.

    "gpt"    model.GPT, the lab's own GPT
    "llama"  llama.LlamaLM, transformers' LlamaForCausalLM with the same sizes (needs the hf extra)

Both take (idx, targets) and return (logits, loss); the trainer builds every run through here.
"""
from __future__ import annotations

from torch import nn

from .model import GPT, GPTConfig


def build_model(cfg: GPTConfig) -> nn.Module:
    """The lab model ``cfg.arch`` names (transformers is imported only for "llama")."""
    if cfg.arch == "llama":
        from .llama import LlamaLM
        return LlamaLM(cfg)
    return GPT(cfg)
