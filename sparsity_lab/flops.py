"""Counting floating-point operations: the three products of a linear layer and a lab GPT's step.

A product of an (m, k) matrix with a (k, n) matrix does m * k * n multiply-adds, i.e. 2 m k n FLOPs.
A linear layer y = x W^T with x (T, d_in) and W (d_out, d_in) costs three such products per step:

    forward      Z  = X W^T     2 T d_in d_out
    grad_input   dX = dZ W      2 T d_in d_out
    grad_weight  dW = dZ^T X    2 T d_in d_out

A method changes how many of each product's multiply-adds it needs (a 2:4 weight halves the two that
use W, MVUE also halves dW; DYAD with n blocks needs 2/n of all three; a block-sparse weight of
density rho needs rho of all three): :func:`product_fractions`. These are *theoretical* counts (the
zeros skipped); whether a kernel turns them into time is what the speed benchmarks measure.
"""
from __future__ import annotations

from .ffn_width import default_ffn_hidden

PRODUCTS = ("forward", "grad_input", "grad_weight")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an (m, k) @ (k, n) product: 2 m k n (one multiply and one add per term)."""
    return 2 * _positive_int("m", m) * _positive_int("k", k) * _positive_int("n", n)


def linear_flops(tokens: int, d_in: int, d_out: int) -> dict[str, int]:
    """FLOPs of the three products of one linear layer in one training step, by product name."""
    flops = matmul_flops(tokens, d_in, d_out)
    return {name: flops for name in PRODUCTS}


def tflops(flops: float, ms: float) -> float:
    """Achieved rate in TFLOP/s (10^12 FLOP per second) of ``flops`` done in ``ms`` milliseconds."""
    if not ms > 0:
        raise ValueError(f"ms must be > 0, got {ms!r}")
    return flops / (ms * 1e-3) / 1e12


def product_fractions(method: str, *, n_blocks: int = 4, density: float = 0.1) -> dict[str, float]:
    """The fraction of each product's dense multiply-adds a method needs (zeros skipped).

    method: "dense"; "24" (a 2:4 weight: forward and input gradient use S(W)); "24_mvue" (also the
    weight gradient from an MVUE 2:4 dZ^T, S-STE's recipe); "dyad" (2/n_blocks of every product);
    "block" (a block-sparse weight of the given density, prune-and-regrow: the weight gradient is
    only needed on live blocks).
    """
    if method == "dense":
        parts = (1.0, 1.0, 1.0)
    elif method == "24":
        parts = (0.5, 0.5, 1.0)
    elif method == "24_mvue":
        parts = (0.5, 0.5, 0.5)
    elif method == "dyad":
        parts = (2.0 / _positive_int("n_blocks", n_blocks),) * 3
    elif method == "block":
        if not 0.0 < density <= 1.0:
            raise ValueError(f"density must be in (0, 1], got {density!r}")
        parts = (float(density),) * 3
    else:
        raise ValueError(f"method must be one of 'dense', '24', '24_mvue', 'dyad', 'block', got {method!r}")
    return dict(zip(PRODUCTS, parts))


def gpt_train_flops_per_token(n_layer: int, d_model: int, context: int, vocab_size: int, ffn_hidden: int,
                              ffn_fraction: float = 1.0, gated: bool = False) -> dict[str, float]:
    """Training FLOPs per token of the lab GPT, by part (three products per weight, as above).

    ffn_fraction scales the FFN linears (the share of their multiply-adds a method needs, averaged
    over the three products). Attention scores count Q K^T and the weighted sum of V over the full
    context (2 * 2 * context * d_model per layer and token, forward; the causal mask's zeros are
    not skipped) and, like every activation-by-activation product, three times that for training.
    Embedding look-ups, norms, softmax and the optimizer are left out (they are not products).
    """
    for name, value in (("n_layer", n_layer), ("d_model", d_model), ("context", context),
                        ("vocab_size", vocab_size), ("ffn_hidden", ffn_hidden)):
        _positive_int(name, value)
    if not 0.0 <= ffn_fraction <= 1.0:
        raise ValueError(f"ffn_fraction must be in [0, 1], got {ffn_fraction!r}")
    d, h = d_model, ffn_hidden
    per_layer_linear = {"attention_projections": 4 * d * d,  # Q, K, V and the output projection
                        "ffn": (3 if gated else 2) * d * h * ffn_fraction}
    parts = {name: 3 * 2 * n_layer * macs for name, macs in per_layer_linear.items()}
    parts["attention_scores"] = 3 * 2 * n_layer * 2 * context * d
    parts["lm_head"] = 3 * 2 * d * vocab_size
    return parts


def gpt_config_flops_per_token(config, ffn_fraction: float = 1.0) -> dict[str, float]:
    """:func:`gpt_train_flops_per_token` for a ``GPTConfig`` (or its ``to_dict()``/JSON form)."""
    get = (lambda k: config[k]) if isinstance(config, dict) else (lambda k: getattr(config, k))
    kind = get("ffn_kind")
    hidden = get("ffn_hidden")
    if hidden is None:  # the width the lab GPT gives a config that leaves it at its default
        hidden = default_ffn_hidden(get("d_model"), gated=kind in ("swiglu", "geglu"))
    return gpt_train_flops_per_token(get("n_layer"), get("d_model"), get("context"), get("vocab_size"), hidden,
                                     ffn_fraction=ffn_fraction, gated=kind in ("swiglu", "geglu"))
