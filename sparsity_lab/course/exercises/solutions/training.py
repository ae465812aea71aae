"""Worked solutions to the training exercises (``sparsity_lab.course.exercises.training``). Try first."""
from __future__ import annotations

import statistics

import torch

from ..training import adamw_step


def flip_rate(previous: torch.Tensor, current: torch.Tensor) -> float:
    """r = ||m_t XOR m_{t-1}||_1 / D."""
    return (previous ^ current).sum().item() / previous.numel()


def overall_flip_rate(pairs) -> float:
    """Flips summed over the layers / entries summed over the layers."""
    flips = sum((p ^ c).sum().item() for p, c in pairs)
    return flips / sum(p.numel() for p, _ in pairs)


def srste_gradient(grad, weight, mask, decay):
    """grad + decay * (1 - m) * W: the pull on the pruned weights rides in the gradient."""
    return grad + decay * weight * ~mask


def adamw_on_gradients(w, g, mask, decay, lr, state):
    """The term joins the gradient: AdamW's moments see it and its normalisation divides it."""
    return adamw_step(w, g + decay * w * ~mask, lr, state)


def adamw_on_weights(w, g, mask, decay, lr, state):
    """AdamW steps with the plain gradient; then the pruned weights shrink by the factor 1 - lr * decay."""
    w = adamw_step(w, g, lr, state)
    return w - lr * decay * w * ~mask


def dense_finetune_switch(total_steps: int, dense_finetune_at: float) -> int:
    return int(round(dense_finetune_at * total_steps))


def flip_trend(flip_rates, steps: int) -> float:
    def window(lo, hi):
        vals = [r for s, r in enumerate(flip_rates, 1) if lo * steps < s <= hi * steps and r is not None]
        return sum(vals) / len(vals)
    return window(0.70, 0.80) / window(0.10, 0.20)


def seed_band(runs):
    columns = list(zip(*runs))                      # one column per step, one entry per seed
    mean = [statistics.fmean(c) for c in columns]
    std = [statistics.stdev(c) for c in columns]     # the sample standard deviation (n - 1)
    return mean, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)]


def bands_separated(higher, lower) -> bool:
    return min(higher) > max(lower)
