"""The default hidden width of a transformer's feed-forward block, for a model width d.

    plain (GELU) FFN   h = 4d                       (the Transformer's d_ff = 4 d_model,
                                                     https://arxiv.org/abs/1706.03762; GPT-2 keeps it)
    gated FFN          h = 8d/3, rounded up to 16   (three matrices instead of two at the same
                                                     parameter count, 3 d h = 2 d (4d): Shazeer,
                                                     https://arxiv.org/abs/2002.05202; LLaMA,
                                                     https://arxiv.org/abs/2302.13971)

One rule read by the lab GPT (``lab.model.GPTConfig.hidden``) and by the FLOP count of a recorded
config that left the width at its default (``flops.gpt_config_flops_per_token``).
"""
from __future__ import annotations

import math

GATED_MULTIPLE = 16  # the gated width is rounded up to a multiple of this (tensor-core and 2:4 friendly)


def default_ffn_hidden(d_model: int, gated: bool) -> int:
    """Hidden width h of the FFN for model width ``d_model``: 4d, or 8d/3 rounded up to a multiple of 16
    when ``gated`` (the FFN multiplies a gate by an up projection)."""
    if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 1:
        raise ValueError(f"d_model must be a positive int, got {d_model!r}")
    if not gated:
        return 4 * d_model
    return int(math.ceil(8 * d_model / 3 / GATED_MULTIPLE) * GATED_MULTIPLE)
