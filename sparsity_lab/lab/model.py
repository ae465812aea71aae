"""A small GPT in the spirit of nanoGPT: config, attention, MLP, block, model.

Bytes in, next-byte logits out (vocabulary 256 by default). The feed-forward linears are named
``mlp.fc`` and ``mlp.proj`` so that ``sparsity_lab.sparsify(model, method)`` (default selector:
FFN/MLP names) makes exactly them 2:4; attention (``attn.qkv``, ``attn.proj``), the embeddings and
the head stay dense.

FFN kinds, for x (B, T, d):
    gelu    y = W2 gelu(W1 x)                       W1 (h, d), W2 (d, h), h = 4d by default
    swiglu  y = W2 (silu(G x) * (U x))              [G; U] = W1 (2h, d), h = 8d/3 rounded up to 16
    geglu   y = W2 (gelu(G x) * (U x))              same shapes as swiglu
    relu2   y = W2 relu(W1 x)^2                     W1 (h, d), W2 (d, h), h = 4d by default
The gated kinds use one fused linear for gate and up (one product, then a split). relu2 (squared
ReLU, So et al. 2021, https://arxiv.org/abs/2109.08668) gives naturally sparse activations, which
``activation_sparsity="2:4"`` prunes to 2:4 for the down projection (``sparsity_lab.activation24``);
the dense relu2 runs ``sparsity_lab.activations.relu2`` (one fused pass each way on CUDA).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..activations import relu2
from ..ffn_width import default_ffn_hidden


FFN_KINDS = ("gelu", "swiglu", "geglu", "relu2")
GATED_KINDS = ("swiglu", "geglu")
ACTIVATION_SPARSITY = ("none", "2:4")
ACT24_WEIGHT_GRADS = ("dense", "tokens24")  # activation24.WEIGHT_GRADS (not imported: the plain model needs none of it)
ARCHS = ("gpt", "llama")  # the lab's models: this GPT, or the Hugging Face Llama of lab/llama.py
# what ``sparsify`` makes 2:4 in this GPT (--select): "ffn" its FFN linears (mlp.fc, mlp.proj; sparsify's
# default), "all_linears" every linear of a block (attention qkv and proj too); never the LM head, which may share
# its weight with the token embedding
SPARSE_SELECTIONS = ("ffn", "all_linears")
BLOCK_LINEAR = re.compile(r"(^|\.)blocks\.\d+\.(attn\.(qkv|proj)|mlp\.(fc|proj))$")


def is_block_linear(name: str, module=None) -> bool:
    """A ``sparsify`` selector: every linear of a transformer block (attention qkv and proj, FFN fc and proj)."""
    return bool(BLOCK_LINEAR.search(name))


def sparse_selector(selection: str):
    """The ``select`` argument of ``sparsify`` for one of SPARSE_SELECTIONS (None: sparsify's FFN default)."""
    if selection not in SPARSE_SELECTIONS:
        raise ValueError(f"select must be one of {SPARSE_SELECTIONS}, got {selection!r}")
    return None if selection == "ffn" else is_block_linear


@dataclass
class GPTConfig:
    vocab_size: int = 256
    context: int = 256
    n_layer: int = 6
    n_head: int = 6
    d_model: int = 384
    ffn_kind: str = "gelu"
    ffn_hidden: int | None = None  # None: 4d (gelu, relu2) or 8d/3 rounded up to a multiple of 16 (gated)
    activation_sparsity: str = "none"  # "2:4": relu2's activations pruned to 2:4 for the down projection
    # with 2:4 activations: the weight gradients dense (exact) or "tokens24" (2:4 along permuted tokens,
    # the act24_dense_fraction most active hidden features exact; sparsity_lab.references.act24_tokens)
    act24_weight_grads: str = "dense"
    act24_dense_fraction: float = 0.05
    bias: bool = False
    dropout: float = 0.0
    tie_embeddings: bool = True
    arch: str = "gpt"  # "gpt" (this file) or "llama" (transformers' LlamaForCausalLM, lab/llama.py)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context", "n_layer", "n_head", "d_model"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_head={self.n_head}")
        if self.ffn_kind not in FFN_KINDS:
            raise ValueError(f"ffn_kind must be one of {FFN_KINDS}, got {self.ffn_kind!r}")
        if self.ffn_hidden is not None and (isinstance(self.ffn_hidden, bool)
                                            or not isinstance(self.ffn_hidden, int) or self.ffn_hidden < 1):
            raise ValueError(f"ffn_hidden must be a positive int or None, got {self.ffn_hidden!r}")
        if self.activation_sparsity not in ACTIVATION_SPARSITY:
            raise ValueError(f"activation_sparsity must be one of {ACTIVATION_SPARSITY}, got {self.activation_sparsity!r}")
        if self.activation_sparsity != "none" and self.ffn_kind != "relu2":
            raise ValueError(f"activation_sparsity={self.activation_sparsity!r} needs ffn_kind='relu2' (squared ReLU, "
                             f"whose activations are mostly zeros already), got ffn_kind={self.ffn_kind!r}")
        if self.act24_weight_grads not in ACT24_WEIGHT_GRADS:
            raise ValueError(f"act24_weight_grads must be one of {ACT24_WEIGHT_GRADS}, got {self.act24_weight_grads!r}")
        if self.act24_weight_grads != "dense" and self.activation_sparsity == "none":
            raise ValueError(f"act24_weight_grads={self.act24_weight_grads!r} is an option of 2:4 activations: "
                             "it needs activation_sparsity='2:4'")
        if isinstance(self.act24_dense_fraction, bool) or not isinstance(self.act24_dense_fraction, (int, float)) \
                or not 0.0 <= self.act24_dense_fraction <= 1.0:
            raise ValueError(f"act24_dense_fraction must be a number in [0, 1], got {self.act24_dense_fraction!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        if self.arch == "llama" and self.ffn_kind not in ("swiglu", "geglu"):
            raise ValueError(f"arch='llama' has a gated MLP (gate_proj, up_proj, down_proj): ffn_kind must be "
                             f"'swiglu' (Llama's) or 'geglu', got {self.ffn_kind!r}")
        if self.arch == "llama" and self.dropout:
            raise ValueError(f"arch='llama' has no dropout layers: dropout must be 0, got {self.dropout!r}")

    @property
    def hidden(self) -> int:
        """Width h of the FFN's hidden layer."""
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        return default_ffn_hidden(self.d_model, gated=self.ffn_kind in GATED_KINDS)

    def check_nm(self, m: int = 4, transposable: bool = False) -> None:
        """Raise a clear error when the FFN linears cannot take an N:M mask with groups of m.

        fc (out, in) = (h or 2h, d) and proj = (d, h): rows need in % m == 0; transposable masks
        need out % m == 0 too. Both reduce to d % m == 0 and h % m == 0.
        """
        for name, size in (("d_model", self.d_model), ("FFN hidden width", self.hidden)):
            if size % m:
                why = "in/out dims of the FFN linears" if transposable else "the in dims of the FFN linears"
                raise ValueError(f"{name}={size} is not divisible by {m}: 2:4 masks need groups of {m} "
                                 f"along {why}; choose a width divisible by {m}")


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention; stays dense (sparsify's default selector skips it)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        # (B, T, d) -> (B, heads, T, d/heads)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    """The feed-forward block: the part that 2:4 training makes sparse."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.kind = cfg.ffn_kind
        gated = cfg.ffn_kind in GATED_KINDS
        self.fc = nn.Linear(cfg.d_model, (2 if gated else 1) * cfg.hidden, bias=cfg.bias)
        self.proj = nn.Linear(cfg.hidden, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.kind == "gelu":
            h = F.gelu(h)
        elif self.kind == "relu2":
            h = relu2(h)  # relu(h)^2: fused kernels on CUDA, F.relu(h).square()'s exact values on the CPU
        else:
            gate, up = h.chunk(2, dim=-1)
            h = (F.silu(gate) if self.kind == "swiglu" else F.gelu(gate)) * up
        return self.drop(self.proj(h))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig, index: int = 0) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        if cfg.activation_sparsity == "none":
            self.mlp = MLP(cfg)
        else:  # imported here: the plain model needs none of it
            from ..activation24 import Act24MLP
            self.mlp = Act24MLP(cfg.d_model, cfg.hidden, bias=cfg.bias, dropout=cfg.dropout,
                                weight_grads=cfg.act24_weight_grads, dense_fraction=cfg.act24_dense_fraction,
                                token_seed=index)  # each block its own token permutations

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + position embeddings, n_layer blocks, a final norm and the (tied) output head."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (tied weights once); non_embedding drops the position embedding and,
        when untied, the token embedding (the head's weights are then still counted)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.pos_emb.weight.numel()
            if not self.config.tie_embeddings:
                n -= self.tok_emb.weight.numel()
        return n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx (B, T) int64 with T <= context. Returns (logits (B, T, vocab), mean cross-entropy or None)."""
        b, t = idx.shape
        if t > self.config.context:
            raise ValueError(f"sequence length {t} exceeds the model's context {self.config.context}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss
