"""The masks, sparse weights and masked decay of an FP8 backend: the bf16 2:4 work, on the Triton kernels.

An FP8 layer's mask, flips, S(W) and decay are the same as a bf16 layer's; only its products and their
operands are FP8 (``fp8_train.FP8Backend``). This mixin gives ``FP8Backend`` that work: on CUDA tensors the
Triton kernels (kernel 21's one-pass refresh on the sparse engine), elsewhere the PyTorch reference. It
reads ``self.engine`` (an ``FP8Engine``) and ``self.name``.
"""
from __future__ import annotations

from ...methods.flip_rate import mask_flips_tensor


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

    def refresh_mask_(self, weight, mask, n, m, transposable, count=True):
        """The mask refresh in one pass over W where kernel 21 runs on the sparse engine (``kernels/refresh24.py``
        writing no operand: the new mask over the old one and their flips, as kernels 2 and 9 and a copy give
        them; the FP8 operand is kernel 18's, from the new mask); elsewhere ``mask``, ``mask_flips`` and a copy."""
        from .operand import refresh_kernel_takes
        if not (self.engine.fused and self.engine.engine == "cusparselt" and (n, m) == (2, 4) and transposable
                and refresh_kernel_takes(weight, mask)):
            return super().refresh_mask_(weight, mask, n, m, transposable, count=count)
        self.engine.stats["fused_refreshes"] += 1
        return self.engine.kernels().refresh24(weight, mask, forward=False, transposed=False, count=count)[0]

    def mask_flips(self, previous, current):
        if previous.is_cuda:
            return self.engine.kernels().count_flips(previous, current)
        return mask_flips_tensor(previous, current)

    def masked_decay_(self, grad, weight, mask, decay):
        self.engine.masks_on(grad).masked_decay_(grad, weight, mask, decay)
