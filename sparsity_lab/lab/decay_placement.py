"""Where the decay term lands in one training step: a measurement, not a claim.

One optimizer step of a single 2:4 linear layer (16 -> 8, no bias) on a fixed batch, with gradient
clipping that is active. The gradient of W is read at three points:

    after backward      what loss.backward() left in W.grad
    after clipping      after clip_grad_norm_(params, max_norm)
    at the step         what AdamW reads (a step pre-hook registered after attach_optimizer's)

and compared with the same step run by plain STE (same weights, same batch, same mask). The decay
term is  lambda_W * (1 - m) * W.
    SR-STE        adds it inside the backward: it is in "after backward" and clipping scales it.
    MaskedDecay   attach_optimizer's pre-hook adds it after clipping, right before the update
                  (Hu et al. 2024): "at the step" - "after clipping" is exactly the term.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..methods.config import method_from_name
from ..sparsify import sparsify
from ..training_hooks import attach_optimizer


def _one_step(base: nn.Module, method, x: torch.Tensor, max_norm: float) -> dict:
    model = sparsify(copy.deepcopy(base), method, select="all")
    layer = model[0]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    attach_optimizer(model, optimizer)
    seen = {}

    def record(opt, args, kwargs) -> None:
        seen["grad"] = layer.weight.grad.clone()

    # registered after attach_optimizer's hook, so it runs after it: it sees what AdamW will read
    optimizer.register_step_pre_hook(record)
    loss = model(x).square().mean()
    loss.backward()
    after_backward = layer.weight.grad.clone()
    total_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    after_clip = layer.weight.grad.clone()
    weight, mask = layer.weight.detach().clone(), layer.mask.clone()
    optimizer.step()
    return {"after_backward": after_backward, "after_clip": after_clip, "at_step": seen["grad"],
            "weight": weight, "mask": mask, "grad_norm": total_norm}


def where_decay_lands(method: str = "masked_decay", decay: float = 0.05, max_norm: float = 0.01,
                      seed: int = 0) -> dict:
    """Run one step with ``method`` ("masked_decay", "srste" or "ste") and with STE; say where the term went.

    Returns
        added_in_backward   after_backward - STE's after_backward == lambda (1-m) W   (SR-STE)
        added_after_clip    at_step - after_clip == lambda (1-m) W                     (masked decay)
        clipped             the gradient norm exceeded max_norm (clipping was active)
        clip_factor         ||after clipping|| / ||after backward||: what clipping multiplied dW by
        term_norm           ||lambda (1-m) W||, and the three gradients and the term as tensors
    """
    if method not in ("masked_decay", "srste", "ste"):
        raise ValueError(f"method must be 'masked_decay', 'srste' or 'ste', got {method!r}")
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0 (clipping must be on to show where the term lands), got {max_norm!r}")
    torch.manual_seed(seed)
    base = nn.Sequential(nn.Linear(16, 8, bias=False)).double()
    x = torch.randn(32, 16, dtype=torch.float64)
    options = {} if method == "ste" else {"decay": decay}
    if method == "masked_decay":
        options["total_steps"] = 10  # its dense fine-tune schedule needs the planned steps
    run = _one_step(base, method_from_name(method, **options), x, max_norm)
    ste = _one_step(base, method_from_name("ste"), x, max_norm)
    if not torch.equal(run["mask"], ste["mask"]):
        raise RuntimeError("the two runs computed different masks from the same weights")
    term = decay * (run["weight"] * ~run["mask"]) if method != "ste" else torch.zeros_like(run["weight"])
    has_term = bool(term.abs().sum() > 0)

    def equal(a, b):
        return bool(torch.allclose(a, b, rtol=1e-10, atol=1e-14))

    return {
        "method": method, "decay": decay if method != "ste" else 0.0,
        "added_in_backward": has_term and equal(run["after_backward"] - ste["after_backward"], term),
        "added_after_clip": has_term and equal(run["at_step"] - run["after_clip"], term),
        "clipped": run["grad_norm"] > max_norm,
        "clip_factor": float(run["after_clip"].norm() / run["after_backward"].norm()),
        "term_norm": float(term.norm()), "term": term,
        "after_backward": run["after_backward"], "after_clip": run["after_clip"], "at_step": run["at_step"],
    }
