"""A small live FFN measurement for the speed notebook: dense against 2:4, side by side.

One FFN (Linear d->ffn, GELU, Linear ffn->d) per shape, timed in the row schema of the recorded
``cusparselt_ffn_h100.json`` (``viz.speedup_view.FFN_KEYS``), so the notebook draws a live run with
the same figures as the recorded one.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..methods.config import STE
from ..sparsify import sparsify
from ..training_hooks import sparse_layers
from ..viz.speedup_view import PHASES
from .timing import Timer


def _ffn(d_model: int, ffn: int, device, dtype) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_model, ffn, device=device, dtype=dtype), nn.GELU(),
                         nn.Linear(ffn, d_model, device=device, dtype=dtype))


def _check_shapes(shapes) -> list[tuple[int, int, int]]:
    out = []
    for s in shapes:
        if not (isinstance(s, (list, tuple)) and len(s) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in s)):
            raise ValueError(f"shapes must be (tokens, d_model, ffn) triples of positive ints, got {s!r}")
        out.append(tuple(s))
    if not out:
        raise ValueError("shapes is empty: give at least one (tokens, d_model, ffn)")
    return out


def _reference_output(model: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """The FFN with S(W) = mask * W, in float32: what the 2:4 products must reproduce."""
    up, down = model[0], model[2]
    h = F.gelu(F.linear(x.float(), (up.mask * up.weight).float(), up.bias.float()))
    return F.linear(h, (down.mask * down.weight).float(), down.bias.float())


def measure_ffn(shapes, backend: str = "cusparselt", device: str = "cuda", dtype: torch.dtype = torch.bfloat16,
                rep_ms: int = 100, seed: int = 0) -> list[dict]:
    """Time one FFN (Linear d->ffn, GELU, Linear ffn->d) dense and 2:4, side by side, per shape and phase.

    Variants: "dense" (nn.Linear), "ours_fixed_mask" (SparseLinear, STE with a transposable mask, the
    prepared operand reused: the mask does not change between calls) and "ours_mask_every_step" (the
    mask recomputed and the operand rebuilt before every call, as in training with refresh interval 1).
    Phases: "fwd" (forward with autograd recording) and "fwd_bwd" (plus the input and weight gradients).
    Returns rows in the schema of FFN_KEYS; the "fwd" rows of ours also carry ``rel_err``, the relative
    error of the 2:4 output against a float32 product with the same masked weights.
    On a CUDA device the times are medians of triton's do_bench over about rep_ms; on the CPU each is
    one call after a warm-up (it checks that the code runs; the numbers mean nothing).
    """
    shapes = _check_shapes(shapes)
    device = torch.device(device)
    timer = Timer(smoke=device.type != "cuda", rep_ms=rep_ms)
    rows = []
    for tokens, d_model, ffn in shapes:
        torch.manual_seed(seed)
        dense = _ffn(d_model, ffn, device, dtype)
        x = torch.randn(tokens, d_model, device=device, dtype=dtype, requires_grad=True)
        dy = torch.randn(tokens, d_model, device=device, dtype=dtype)
        models = {"dense": (dense, False)}
        for variant, every_step in (("ours_fixed_mask", False), ("ours_mask_every_step", True)):
            model = sparsify(copy.deepcopy(dense), STE(transposable=True, backend=backend), select="all")
            for _, layer in sparse_layers(model):
                layer.attached_optimizer = True  # no optimizer here: the steps are advanced below
            models[variant] = (model, every_step)

        def call(model, every_step: bool, backward: bool):
            def run():
                if every_step:
                    for _, layer in sparse_layers(model):
                        layer.advance_step()  # a new step: the mask is due and the operand is rebuilt
                model.zero_grad(set_to_none=True)
                x.grad = None
                y = model(x)
                if backward:
                    y.backward(dy)
            return run

        times = {}
        for phase in PHASES:
            for variant, (model, every_step) in models.items():
                times[(variant, phase)] = timer(call(model, every_step, phase == "fwd_bwd"))
        for phase in PHASES:
            for variant, (model, _) in models.items():
                ms = times[(variant, phase)]
                row = {"tokens": tokens, "d_model": d_model, "ffn": ffn, "variant": variant, "phase": phase,
                       "ms": ms, "speedup_vs_dense": times[("dense", phase)] / ms}
                if variant != "dense" and phase == "fwd":
                    with torch.no_grad():
                        ref = _reference_output(model, x.detach())
                        out = model(x.detach()).float()
                    row["rel_err"] = float((out - ref).norm() / ref.norm())
                rows.append(row)
    return rows
