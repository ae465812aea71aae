"""Where the masked-decay term lands in one training step, and what AdamW makes of it: measurements.

The term is  lambda_W * (1 - m) * W  (m the 2:4 mask, 1 - m the pruned entries). Three placements:

    SR-STE (Zhou et al. 2021)      g <- g + term inside the backward: gradient clipping scales it
                                   with the gradient, and AdamW normalises it;
    masked decay on gradients      g <- clip(g) + term right before the optimizer step: AdamW puts
      (Hu et al. 2024)             it through its moments and divides by their running RMS;
    masked decay on weights        W <- W - lr * term after the optimizer step: decoupled, AdamW
      (``masked_decay_weights``)   never sees it (the way SR-STE's SGD update carries over to AdamW).

``where_decay_lands`` runs one step of a small 2:4 layer with clipping active and reads the gradient
after the backward pass, after clipping and where AdamW reads it, and the weights after the step,
against the same step run by plain STE (same weights, batch and mask).

``pruned_weight_steps`` trains a layer with a tiny loss gradient under AdamW and measures how far
the pruned weights move per step: about lr with the term on gradients (Adam normalises it, whatever
lambda_W is), lr * lambda_W * |w| with the term on weights.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..methods.config import method_from_name
from ..sparsify import sparsify
from ..training_hooks import attach_optimizer

PLACEMENT_METHODS = ("srste", "masked_decay", "masked_decay_weights", "ste")


def _check_method(method: str) -> None:
    if method not in PLACEMENT_METHODS:
        raise ValueError(f"method must be one of {PLACEMENT_METHODS}, got {method!r}")


def _method(method: str, decay: float):
    options = {} if method == "ste" else {"decay": decay}
    if method.startswith("masked_decay"):
        options["dense_finetune_at"] = None  # one step, no schedule
    return method_from_name(method, **options)


def _one_step(base: nn.Module, method, x: torch.Tensor, max_norm: float, lr: float) -> dict:
    model = sparsify(copy.deepcopy(base), method, select="all")
    layer = model[0]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
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
            "weight": weight, "mask": mask, "grad_norm": total_norm,
            "weight_after": layer.weight.detach().clone(),
            "exp_avg": optimizer.state[layer.weight]["exp_avg"].clone()}


def where_decay_lands(method: str = "masked_decay", decay: float = 0.05, max_norm: float = 0.01,
                      seed: int = 0, lr: float = 1e-3) -> dict:
    """Run one AdamW step with ``method`` (one of PLACEMENT_METHODS) and with STE; say where the term went.

    Returns
        added_in_backward   after_backward - STE's after_backward == term                 (SR-STE)
        added_after_clip    at_step - after_clip == term                                   (on gradients)
        added_on_weights    W_after == STE's W_after - lr * lambda (1-m) * STE's W_after   (on weights)
        adam_sees_term      AdamW's first moment differs from STE's
        clipped             the gradient norm exceeded max_norm (clipping was active)
        clip_factor         ||after clipping|| / ||after backward||: what clipping multiplied dW by
        term_norm           ||lambda (1-m) W||, and the gradients, the term and the weights as tensors
    """
    _check_method(method)
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0 (clipping must be on to show where the term lands), got {max_norm!r}")
    torch.manual_seed(seed)
    base = nn.Sequential(nn.Linear(16, 8, bias=False)).double()
    x = torch.randn(32, 16, dtype=torch.float64)
    run = _one_step(base, _method(method, decay), x, max_norm, lr)
    ste = _one_step(base, _method("ste", decay), x, max_norm, lr)
    if not torch.equal(run["mask"], ste["mask"]):
        raise RuntimeError("the two runs computed different masks from the same weights")
    pruned = ~run["mask"]
    term = decay * (run["weight"] * pruned) if method != "ste" else torch.zeros_like(run["weight"])
    has_term = bool(term.abs().sum() > 0)

    def equal(a, b):
        return bool(torch.allclose(a, b, rtol=1e-10, atol=1e-14))

    on_weights = ste["weight_after"] - lr * decay * (ste["weight_after"] * pruned)
    return {
        "method": method, "decay": decay if method != "ste" else 0.0,
        "added_in_backward": has_term and equal(run["after_backward"] - ste["after_backward"], term),
        "added_after_clip": has_term and equal(run["at_step"] - run["after_clip"], term),
        "added_on_weights": has_term and equal(run["weight_after"], on_weights),
        "adam_sees_term": not equal(run["exp_avg"], ste["exp_avg"]),
        "clipped": run["grad_norm"] > max_norm,
        "clip_factor": float(run["after_clip"].norm() / run["after_backward"].norm()),
        "term_norm": float(term.norm()), "term": term,
        "after_backward": run["after_backward"], "after_clip": run["after_clip"], "at_step": run["at_step"],
        "weight": run["weight"], "weight_after": run["weight_after"], "ste_weight_after": ste["weight_after"],
    }


def pruned_weight_steps(method: str, decay: float, lr: float = 1e-3, steps: int = 5,
                        loss_scale: float = 1e-15, seed: int = 0) -> dict:
    """How far AdamW moves the pruned weights per step when the loss gradient is tiny.

    A 2:4 layer (32 -> 16, float64) trained for ``steps`` AdamW steps (weight_decay 0, eps 1e-8)
    on ``loss_scale * sum(output)``, whose gradient (~1e-14) is far below Adam's eps: whatever moves
    the pruned weights is the decay term. Returns, per step averaged over the pruned entries,
        step_over_lr      mean |W_t - W_{t-1}| / lr
        decay_over_lr     the same for what the term alone would do on the weights: lambda * mean |W|
    With the term on gradients AdamW divides it by its own RMS: step_over_lr is about 1 for any
    lambda_W whose term is well above eps. On weights step_over_lr equals decay_over_lr.
    """
    _check_method(method)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")
    torch.manual_seed(seed)
    model = sparsify(nn.Sequential(nn.Linear(32, 16, bias=False)).double(), _method(method, decay), select="all")
    layer = model[0]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, eps=1e-8)
    attach_optimizer(model, optimizer)
    x = torch.randn(8, 32, dtype=torch.float64)
    moves, sizes = [], []
    for _ in range(steps):
        optimizer.zero_grad()
        (loss_scale * model(x).sum()).backward()
        before, pruned = layer.weight.detach().clone(), ~layer.mask
        optimizer.step()
        moves.append(float((layer.weight.detach() - before)[pruned].abs().mean()))
        sizes.append(float(before[pruned].abs().mean()))
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"method": method, "decay": decay, "lr": lr, "steps": steps,
            "step_over_lr": mean(moves) / lr, "decay_over_lr": decay * mean(sizes),
            "per_step": moves}
