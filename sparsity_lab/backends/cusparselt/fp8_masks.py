"""The masks, sparse weights and masked decay of an FP8 backend: the bf16 2:4 work, on the Triton kernels.

An FP8 layer's mask, flips, S(W) and decay are the same as a bf16 layer's; only its products and their
operands are FP8 (``fp8_train.FP8Backend``). This mixin gives ``FP8Backend`` that work: on CUDA tensors the
Triton kernels (kernel 21's one-pass refresh on the sparse engine, with both E4M3 operands where the step's
products come next and its scale is known: ``refresh_and_prepare``), elsewhere the PyTorch reference. It reads
``self.engine`` (an ``FP8Engine``), ``self.scaling`` and ``self.name``.
"""
from __future__ import annotations

from ...methods.flip_rate import mask_flips_tensor
from .fp8_operand import HALF, fused_refresh_operand


class FP8MaskWork:
    """``Backend``'s mask, weight and decay methods for an FP8 backend (placed before ``Backend`` in its bases)."""

    def mask(self, weight, n, m, transposable):
        out_f, in_f = weight.shape
        engine = self.engine.engine
        if engine == "cusparselt":
            if (n, m) != (2, 4) or not transposable:
                raise ValueError(f"backend {self.name!r} runs dX = dZ S(W) on 2:4 sparse tensor cores, which needs a "
                                 f"transposable 2:4 mask: use e.g. STE(transposable=True, backend={self.name!r}) "
                                 f"(got n={n}, m={m}, transposable={transposable}), or backend='fp8_dense'")
            if out_f % 64 or in_f % 64:
                raise ValueError(f"backend {self.name!r} needs in_features and out_features that are multiples of 64 "
                                 f"(the FP8 compressor's tiles), got a weight ({out_f}, {in_f}): resize the layer "
                                 "or use backend='fp8_dense'")
        elif engine == "scaled_mm" and (out_f % 16 or in_f % 16):
            raise ValueError(f"backend {self.name!r} (torch._scaled_mm) needs in_features and out_features that are "
                             f"multiples of 16, got a weight ({out_f}, {in_f})")
        if weight.is_cuda and (n, m) == (2, 4):
            return self.engine.masks_on(weight).mask(weight, n, m, transposable)
        return self.engine.reference.mask(weight, n, m, transposable)

    def sparse_weight(self, weight, mask, beta, n, m):
        if weight.is_cuda and (n, m) == (2, 4):
            return self.engine.masks_on(weight).sparse_weight(weight, mask, beta, n, m)
        return self.engine.reference.sparse_weight(weight, mask, beta, n, m)

    def sparse_weight_as(self, weight, mask, beta, n, m, dtype):
        if weight.is_cuda and beta is not None and (n, m) == (2, 4):
            return self.engine.kernels().soft_threshold24(weight, mask, beta, out_dtype=dtype)
        if beta is None:
            return weight.to(dtype) * mask
        return self.sparse_weight(weight, mask, beta, n, m).to(dtype)

    @property
    def fuses_refresh_and_prepare(self) -> bool:
        """Kernel 21's E4M3 form writes the mask, its flips and both operands in one pass (``refresh_and_prepare``):
        the fused sparse engine only."""
        return self.engine.fused and self.engine.engine == "cusparselt"

    def _refreshes_in_one_pass(self, weight, mask, n, m, transposable) -> bool:
        """Whether kernel 21 refreshes (weight, mask): the fused sparse engine, a transposable 2:4 mask, a weight
        and mask it takes (``operand.refresh_kernel_takes``)."""
        from .operand import refresh_kernel_takes
        # the engine itself, not fuses_refresh_and_prepare: a subclass on another engine sets that for its own kernel
        return (self.engine.fused and self.engine.engine == "cusparselt" and (n, m) == (2, 4) and transposable
                and refresh_kernel_takes(weight, mask))

    def refresh_mask_(self, weight, mask, n, m, transposable, count=True):
        """The mask refresh in one pass over W where kernel 21 runs on the sparse engine (``kernels/refresh24.py``
        writing no operand: the new mask over the old one and their flips, as kernels 2 and 9 and a copy give
        them); elsewhere ``mask``, ``mask_flips`` and a copy."""
        if not self._refreshes_in_one_pass(weight, mask, n, m, transposable):
            return super().refresh_mask_(weight, mask, n, m, transposable, count=count)
        self.engine.stats["fused_refreshes"] += 1
        return self.engine.kernels().refresh24(weight, mask, forward=False, transposed=False, count=count)[0]

    def refresh_and_prepare(self, weight, mask, beta, n, m, transposable, dtype, backward=True, count=True):
        """``Backend.refresh_and_prepare`` in one pass over W where kernel 21 runs: the mask into ``mask``, its
        flips, q(S(W)) and (``backward``) q(S(W))^T compressed with the recipe's scale, and amax(S(W)) kept for
        the history (``kernels.refresh24_fp8``), bit for bit the separate calls' (kernels 2, 9 and 18). That needs
        the scale before the pass: at a step whose scale is the new S(W)'s own amax (current scaling, delayed
        scaling's first step) the mask is refreshed alone, then kernel 18 takes the amax and writes the forms,
        counted in ``stats["refresh_then_prepare_current_scaling"]``. Elsewhere the separate calls run."""
        if not (self._refreshes_in_one_pass(weight, mask, n, m, transposable) and dtype in HALF
                and self.scaling.recipe.format_of("w") == "e4m3"):
            return super().refresh_and_prepare(weight, mask, beta, n, m, transposable, dtype, backward=backward,
                                               count=count)
        if not self.scaling.uses_history:
            self.engine.stats["refresh_then_prepare_current_scaling"] += 1
            return super().refresh_and_prepare(weight, mask, beta, n, m, transposable, dtype, backward=backward,
                                               count=count)
        k = self.engine.kernels()
        refreshed = fused_refresh_operand(self.scaling, weight, mask, beta, dtype, backward, count, k.prepare24_amax,
                                          k.prepare24_fp8, k.refresh24_fp8)
        self.engine.stats["fused_refreshes"] += 1
        return refreshed

    def mask_flips(self, previous, current):
        if previous.is_cuda:
            return self.engine.kernels().count_flips(previous, current)
        return mask_flips_tensor(previous, current)

    def masked_decay_(self, grad, weight, mask, decay):
        self.engine.masks_on(grad).masked_decay_(grad, weight, mask, decay)
