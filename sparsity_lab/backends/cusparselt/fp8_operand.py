"""An FP8 layer's weight operand for one optimizer step, and the fused kernels' ways of writing it.

``FP8Operand`` holds S(W) (compute dtype), q(S(W)) E4M3 and its scale, or only the compressed forms a fused kernel
wrote; ``fused_weight_operand`` writes those forms from the master W and the mask (kernel 18 for cuSPARSELt's
layout, kernel 22 for CUTLASS's), ``fused_refresh_operand`` does it in the mask refresh's own pass (kernel 21's or
24's E4M3 form), ``fused_mvue_operand`` writes the weight gradient's q(MVUE(dZ))^T (kernel 19 or 23). Each follows
the layer's FP8 recipe (``methods/fp8_scaling``): delayed scaling's history scale, or current scaling's amax first.
"""
from __future__ import annotations

import torch

from ...methods.fp8_scaling import FP8ScalingState
from ..base import MvueSeed, kernel_seed

HALF = (torch.bfloat16, torch.float16)  # the compute dtypes S(W) is rounded to before its cast


class FP8Operand:
    """One optimizer step's weight operand: S(W) (compute dtype), q(S(W)) E4M3 and its scale; the
    compressed forms (sparse engine) and q(S(W))^T (dense engine) made on first use.

    An operand made by kernel 18 (``FP8Backend.prepare_masked`` on the sparse engine) has only the
    compressed forms (``weight`` and ``q`` are None); ``make_transposed`` builds q(S(W))^T compressed
    when the forward was prepared without it."""

    def __init__(self, weight: torch.Tensor | None, q: torch.Tensor | None, scale: torch.Tensor, dense: bool = False,
                 shape: tuple[int, int] | None = None, compressed: torch.Tensor | None = None,
                 compressed_t: torch.Tensor | None = None, make_transposed=None,
                 amax: torch.Tensor | None = None, host_exp: int | None = None) -> None:
        self.weight, self.q, self.scale = weight, q, scale
        self.host_exp = host_exp  # log2 of ``scale`` on the host ("host_alpha" recipes), else None
        self.amax = amax  # amax(S(W)), recorded in the history by the backward of a forward that used it
        self.dense = dense  # a dense phase's W (no 2:4 pattern): dense FP8 products whatever the engine
        self.shape: tuple[int, int] = tuple(q.shape) if shape is None else tuple(shape)
        self.compressed = compressed
        self.compressed_t = compressed_t
        self.make_transposed = make_transposed
        self.q_t: torch.Tensor | None = None


def fused_weight_operand(state: FP8ScalingState, weight, mask, beta, dtype, backward: bool, amax_fn,
                         prepare_fn, first_fn=None) -> FP8Operand:
    """The step's sparse FP8 weight operand written from the master W and the mask by a fused kernel: the
    compressed q(S(W)) (and q(S(W))^T when ``backward``) and amax(S(W)), with the scale of ``state``'s recipe
    (current scaling: after the amax pass ``amax_fn(w, mask, beta, dtype)``). ``prepare_fn(w, mask, beta,
    inv_scale, dtype, forward=, transposed=) -> (forward form, transposed form, amax)``: kernel 18
    (cuSPARSELt's layout) or kernel 22 (CUTLASS's). ``first_fn``: what writes this step's forms instead of
    ``prepare_fn`` (the same arguments but ``forward``, the same results): kernel 21's or 24's E4M3 form, which
    refreshes the mask in the same pass, so only with the history's scale (the amax pass would read the mask
    before its refresh)."""
    if first_fn is not None and not state.uses_history:
        raise RuntimeError("a refresh that writes the FP8 operand in its pass needs the scale before the pass: "
                           "this step's scale comes from the new S(W)'s amax (current scaling)")
    observed = None if state.uses_history else amax_fn(weight, mask, beta, dtype)
    scale, inv_scale, _ = state.scales_for("w", None, observed_amax=observed)
    fwd, bwd, a = (first_fn or prepare_fn)(weight, mask, beta, inv_scale, dtype, transposed=backward)

    def make_transposed():  # the same S(W) and scale (nothing advances before this step's backward)
        return prepare_fn(weight, mask, beta, inv_scale, dtype, forward=False)[1]
    return FP8Operand(None, None, scale, shape=tuple(weight.shape), compressed=fwd, compressed_t=bwd,
                      make_transposed=None if backward else make_transposed, amax=a, host_exp=state.host_exponent("w"))


def fused_refresh_operand(state: FP8ScalingState, weight, mask, beta, dtype, backward: bool, count: bool, amax_fn,
                          prepare_fn, refresh_fn) -> tuple[torch.Tensor | None, FP8Operand]:
    """``(flips, operand)`` of a mask refresh that writes the step's FP8 operand in the same pass (kernel 21's or
    kernel 24's E4M3 form): ``refresh_fn(w, mask, beta, inv_scale, dtype, transposed=, count=) -> (flips, forward
    form, transposed form, amax)`` as ``fused_weight_operand``'s ``first_fn``, with the history's scale (the
    caller checks ``state.uses_history``)."""
    flips = []

    def first(w, mask_, beta_, inv_scale, dtype_, transposed=True):
        counted, *forms = refresh_fn(w, mask_, beta_, inv_scale, dtype_, transposed=transposed, count=count)
        flips.append(counted)
        return tuple(forms)
    operand = fused_weight_operand(state, weight, mask, beta, dtype, backward, amax_fn, prepare_fn, first_fn=first)
    return flips[0], operand


def fused_mvue_operand(state: FP8ScalingState, dz: torch.Tensor, seed: MvueSeed | None, amax_fn, compress_fn):
    """(compressed q(MVUE(dZ))^T, its scale) written by a fused kernel under ``state``'s recipe, amax recorded:
    one pass with delayed scaling, after an amax pass ``amax_fn(dz, kernel_seed)`` of the same draw with current
    scaling. ``compress_fn(dz, kernel_seed, inv_scale) -> (operand, amax)``: kernel 19 (cuSPARSELt's layout) or
    kernel 23 (CUTLASS's). The draw is ``FP8Engine.mvue``'s."""
    kseed = kernel_seed(seed)
    observed = None if state.uses_history else amax_fn(dz, kseed)
    scale, inv_scale, _ = state.scales_for("dz_mvue", None, observed_amax=observed)
    a, amax = compress_fn(dz, kseed, inv_scale)
    state.record("dz_mvue", amax)
    return a, scale
