"""Inference for the lab GPT with a key/value cache: a prefill, then one token per decode step.

``GPT.forward`` recomputes the whole sequence; generating token t + 1 that way costs a forward over t
tokens. With a cache of each layer's keys and values (B, heads, context, d/heads), a decode step runs
the model on the one new token and attends over the cached prefix:

    prefill(model, idx)            idx (B, T): logits (B, T, vocab) and a cache holding T positions
    decode_step(model, tok, cache) tok (B, 1): logits (B, 1, vocab); the cache grows by one position

Built from the model's own modules (embeddings, ``ln1``/``attn.qkv``/``attn.proj``, ``ln2``/``mlp``,
``ln_f``, ``lm_head``), so a model whose MLP linears were swapped (``sparsify``, ``sparsity_lab.export``)
runs its own layers. Eval only (no dropout); the logits equal ``model(idx)``'s at every position.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .model import GPT


@dataclass
class KVCache:
    """Keys and values per layer, (B, heads, context, head width) each (allocated at the first write, in
    the dtype the layer computes them in), valid up to ``length``."""

    context: int
    keys: list[torch.Tensor | None]
    values: list[torch.Tensor | None]
    length: int = 0

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, heads, t, head width) at the next t positions; the keys and values so far."""
        if self.keys[layer] is None:
            shape = (*k.shape[:2], self.context, k.shape[3])
            self.keys[layer] = k.new_empty(shape)
            self.values[layer] = v.new_empty(shape)
        end = self.length + k.shape[2]
        self.keys[layer][:, :, self.length:end] = k
        self.values[layer][:, :, self.length:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


def _check(model) -> None:
    if not isinstance(model, GPT):
        raise TypeError(f"prefill/decode_step run the lab GPT (sparsity_lab.lab.GPT), got {type(model).__name__}")


def _attend(block, x: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
    """Self-attention of the new positions x (B, t, d) over the cached prefix plus themselves."""
    attn = block.attn
    b, t, d = x.shape
    heads = attn.n_head
    q, k, v = attn.qkv(x).split(d, dim=2)
    q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))  # (B, heads, t, d/heads)
    start = cache.length
    keys, values = cache.write(layer, k, v)
    # a prefill from an empty cache is causal; one new token may see every cached position
    y = F.scaled_dot_product_attention(q, keys, values, is_causal=start == 0 and t > 1)
    return attn.proj(y.transpose(1, 2).reshape(b, t, d))


def _run(model: GPT, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
    t = idx.shape[1]
    if cache.length + t > model.config.context:
        raise ValueError(f"{cache.length} cached + {t} new positions exceed the model's context {model.config.context}")
    pos = torch.arange(cache.length, cache.length + t, device=idx.device)
    x = model.tok_emb(idx) + model.pos_emb(pos)
    for layer, block in enumerate(model.blocks):
        x = x + _attend(block, block.ln1(x), cache, layer)
        x = x + block.mlp(block.ln2(x))
    cache.length += t
    return model.lm_head(model.ln_f(x))


@torch.no_grad()
def prefill(model: GPT, idx: torch.Tensor) -> tuple[torch.Tensor, KVCache]:
    """Logits (B, T, vocab) of idx (B, T) and the cache of its T positions (room for the whole context)."""
    _check(model)
    if model.training:
        raise ValueError("prefill runs an eval-mode model: call model.eval() first")
    n = model.config.n_layer
    cache = KVCache(model.config.context, [None] * n, [None] * n)
    return _run(model, idx, cache), cache


@torch.no_grad()
def decode_step(model: GPT, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Logits (B, 1, vocab) of the next position, given its token (B, 1); extends the cache by one."""
    _check(model)
    if token.dim() != 2 or token.shape[1] != 1:
        raise ValueError(f"token must have shape (B, 1), got {tuple(token.shape)}")
    return _run(model, token, cache)
