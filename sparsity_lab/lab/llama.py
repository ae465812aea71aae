"""The lab's Llama: ``transformers.LlamaForCausalLM`` built from the lab's model options (``--model llama``).

The same sizes as the lab GPT (``GPTConfig``: width, layers, heads, context, FFN hidden width), mapped
onto a ``LlamaConfig`` (nothing downloaded; the weights start from transformers' own initialisation
under the run's seed):

    hidden_size = d_model            num_hidden_layers = n_layer        intermediate_size = h
    num_attention_heads = num_key_value_heads = n_head (full multi-head attention, like the GPT)
    max_position_embeddings = context (rotary positions)      vocab_size = 256 (bytes)
    hidden_act = silu (swiglu, Llama's) or gelu (geglu)       tie_word_embeddings, attention/mlp bias

Its MLP, y = down(act(gate(x)) * up(x)), has three linears, each (h, d) or (d, h): the 2:4 layers are
the ones the Hugging Face selector table names for ``model_type="llama"``
(``sparsity_lab/architectures.py``): ``mlp.gate_proj``, ``mlp.up_proj``, ``mlp.down_proj``.
Attention, embeddings, norms and the head stay dense, as in the GPT.

``LlamaLM`` gives it the lab's interface, ``(idx, targets) -> (logits, loss)`` with the loss the GPT
computes (targets are already shifted by the data sampler; transformers' own loss would shift again).
Needs the ``hf`` extra: ``pip install -e ".[hf]"``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..architectures import ARCHITECTURES
from .model import GPTConfig

HIDDEN_ACT = {"swiglu": "silu", "geglu": "gelu"}  # ffn_kind -> LlamaConfig.hidden_act (gate activation)


def require_transformers():
    """``transformers``, or an ImportError that names the extra to install."""
    try:
        import transformers
    except ImportError as err:
        raise ImportError("the Llama model (--model llama) is built by Hugging Face transformers, which is not "
                          "installed: pip install -e \".[hf]\" (or pip install transformers)") from err
    return transformers


def llama_config(cfg: GPTConfig):
    """The ``transformers.LlamaConfig`` with the lab config's sizes (see the module docstring)."""
    if cfg.arch != "llama":
        raise ValueError(f"llama_config needs a GPTConfig with arch='llama', got arch={cfg.arch!r}")
    transformers = require_transformers()
    return transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.hidden,
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_head,
        max_position_embeddings=cfg.context, hidden_act=HIDDEN_ACT[cfg.ffn_kind],
        attention_bias=cfg.bias, mlp_bias=cfg.bias, tie_word_embeddings=cfg.tie_embeddings,
        use_cache=False)


class LlamaLM(nn.Module):
    """``transformers.LlamaForCausalLM`` (as ``self.hf``) behind the lab GPT's interface."""

    mlp_selector = staticmethod(ARCHITECTURES["llama"][1])  # the HF table's gate/up/down_proj selector

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        transformers = require_transformers()
        self.config = cfg
        self.hf = transformers.LlamaForCausalLM(llama_config(cfg))

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (tied weights once); non_embedding drops the token embedding when untied
        (rotary positions have no parameters), as ``GPT.num_params`` does."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and not self.config.tie_embeddings:
            n -= self.hf.get_input_embeddings().weight.numel()
        return n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx (B, T) int64 with T <= context. Returns (logits (B, T, vocab), mean cross-entropy or None)."""
        t = idx.shape[1]
        if t > self.config.context:
            raise ValueError(f"sequence length {t} exceeds the model's context {self.config.context}")
        logits = self.hf(input_ids=idx, use_cache=False).logits
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss
