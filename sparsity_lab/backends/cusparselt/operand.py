"""The cuSPARSELt backend's weight operand: S(W) prepared once per optimizer step, compressed lazily.

``CusparseltOperand`` holds one step's S(W) (out, in) and its two compressed forms: S(W), 2:4 along
``in`` (forward) and S(W)^T, 2:4 along ``out`` (input gradient, which needs the transposable mask).
``OperandPreparation`` is the part of ``CusparseltBackend`` that builds and compresses them
(``prepare``, ``prepare_masked``, ``compress_operand``); the products that use them are in
``backend.py``. Compression goes through ``kernels/compress24.py`` (bit for bit the bytes of
``_cslt_compress``) where shapes allow, through kernel 11 (``kernels/prepare24.py``: both forms
from W in one pass) when the operand was made by ``prepare_masked``, else ``_cslt_compress``. A mask
refresh right before the step's products (``refresh_and_prepare``) writes the mask, its flips and both
forms in one pass over W instead (kernel 21, ``kernels/refresh24.py``).
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from ...references.cusparselt_layout import fast_layout_problem
from .ops import PRODUCT_DTYPES, check_product_dtype, check_sparse_shape


class CusparseltOperand:
    """One optimizer step's weight operand: S(W) (out, in) and its compressed forms, built lazily.

    ``compressed``: S(W), 2:4 along in (forward). ``compressed_t``: S(W)^T (in, out), 2:4 along out
    (input gradient; transposable mask). ``weight``: the dense S(W) in the product dtype, given, or
    (for an operand made by ``prepare_masked``) built on first use by ``dense_fn`` (only a dense
    product, e.g. chosen by the auto policy, needs it). ``source``: (W, mask, beta, dtype) when the
    compressed forms can be written straight from W by kernel 11; ``backward``: whether the
    input gradient is expected (then the first compression writes both forms in one pass).
    """

    def __init__(self, weight: torch.Tensor | None = None, shape: tuple[int, int] | None = None,
                 dtype: torch.dtype | None = None, dense_fn=None, source: tuple | None = None,
                 backward: bool = True) -> None:
        if weight is None and (shape is None or dtype is None or dense_fn is None):
            raise ValueError("an operand needs the dense weight, or its shape, dtype and a function that makes it")
        self._weight = weight
        self._shape = tuple(weight.shape) if weight is not None else tuple(shape)
        self.dtype = weight.dtype if weight is not None else dtype
        self._dense_fn = dense_fn
        self.source = source
        self.backward = backward
        self.compressed: torch.Tensor | None = None
        self.compressed_t: torch.Tensor | None = None
        # another library's operand of the same S(W), by library name, made on first use ("sparse_auto")
        self.library_forms: dict[str, Any] = {}

    @property
    def weight(self) -> torch.Tensor:
        if self._weight is None:
            self._weight = self._dense_fn()
        return self._weight

    @property
    def shape(self) -> tuple[int, int]:
        return self._shape


def _triton_device(t: torch.Tensor) -> bool:
    """Where the fused Triton kernels run: CUDA tensors (tests widen it to the CPU interpreter)."""
    return t.is_cuda


def refresh_kernel_takes(weight: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether kernel 21 (``kernels/refresh24.py``) takes (weight, mask): a Triton device, a float32 / 16-bit W
    of whole 64 x 64 tiles, a contiguous mask on a 4-byte boundary (the kernel reads it as int32 words)."""
    return (_triton_device(weight) and weight.dim() == 2 and weight.shape[0] % 64 == 0 and weight.shape[1] % 64 == 0
            and weight.dtype in (torch.float32, torch.bfloat16, torch.float16) and mask.is_contiguous()
            and mask.storage_offset() % 4 == 0)


class OperandPreparation:
    """Building and compressing the step's operand: the part of ``CusparseltBackend`` before its
    products. Uses the backend's ``_ops`` (the cuSPARSELt calls), ``policy``, ``fast_compress``,
    ``fused_prepare``, ``fused_refresh``, ``stats``, ``slow_compress_reasons``, ``_k()`` (the Triton kernels)
    and ``sparse_weight_as``."""

    _ops: Any
    policy: Any
    fast_compress: bool
    fused_prepare: bool
    fused_refresh: bool
    stats: Counter
    slow_compress_reasons: Counter

    def prepare(self, sparse_weight: torch.Tensor) -> CusparseltOperand:
        if sparse_weight.dim() != 2:
            raise ValueError(f"the sparse weight must be 2-D (out, in), got shape {tuple(sparse_weight.shape)}")
        self._ops.check_device(sparse_weight, "the layer's weight")
        if self.policy is None:
            check_product_dtype(sparse_weight.dtype)
            check_sparse_shape(*sparse_weight.shape, sparse_weight.dtype,
                               "the layer's weight (out_features, in_features)")
        return CusparseltOperand(sparse_weight.contiguous())

    def prepare_masked(self, weight, mask, beta, n, m, dtype, backward: bool = True) -> CusparseltOperand:
        """The step's operand straight from W and the mask (``prepare(sparse_weight_as(...))`` in fewer
        passes): on CUDA, for whole-tile shapes, kernel 11 later writes S(W) and S(W)^T compressed
        from W in one pass and the dense S(W) is made only if a dense product asks for it.
        ``backward``: the input gradient is expected (both forms are then written together)."""
        if weight.dim() != 2:
            raise ValueError(f"the weight must be 2-D (out, in), got shape {tuple(weight.shape)}")
        self._ops.check_device(weight, "the layer's weight")
        if self.policy is None:
            check_product_dtype(dtype)
            check_sparse_shape(*weight.shape, dtype, "the layer's weight (out_features, in_features)")

        def dense() -> torch.Tensor:
            return self.sparse_weight_as(weight, mask, beta, n, m, dtype).contiguous()
        return CusparseltOperand(shape=tuple(weight.shape), dtype=dtype, dense_fn=dense, backward=backward,
                                 source=(weight, mask, beta, dtype) if self._from_weight(weight, mask, dtype) else None)

    def takes_optimizer_operand(self, weight: torch.Tensor, mask: torch.Tensor, n: int, m: int,
                                dtype: torch.dtype) -> bool:
        """``Backend.takes_optimizer_operand``: where kernel 11 would write the operand of a bf16 W in bf16 and every
        product runs sparse (no auto policy), the optimizer's kernel 26 may write the same bytes instead."""
        return (self.policy is None and (n, m) == (2, 4) and dtype == torch.bfloat16 and weight.dtype == torch.bfloat16
                and weight.dim() == 2 and weight.is_contiguous() and self._from_weight(weight, mask, dtype))

    def operand_from_forms(self, weight, mask, beta, n, m, dtype, forms: tuple) -> CusparseltOperand:
        """The operand of (weight, mask) whose compressed S(W) and S(W)^T were written elsewhere (``forms``, by the
        optimizer's kernel 26), counted as kernel 11's two forms would be ("optimizer_prepares")."""
        operand = self.prepare_masked(weight, mask, beta, n, m, dtype, backward=True)
        operand.compressed, operand.compressed_t = forms
        self.stats["compressions"] += 2
        self.stats["fast_compressions"] += 2
        self.stats["optimizer_prepares"] += 1
        return operand

    def _from_weight(self, weight: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> bool:
        """Whether the compressed forms of (weight, mask) in ``dtype`` are written straight from W (kernels 11
        and 21): a Triton device, whole 64 x 64 tiles, a contiguous mask, the fast compression switched on."""
        return (self.fast_compress and self.fused_prepare and _triton_device(weight) and mask.is_contiguous()
                and dtype in PRODUCT_DTYPES and fast_layout_problem(*weight.shape, dtype) is None)

    def refresh_and_prepare(self, weight, mask, beta, n, m, transposable, dtype, backward: bool = True,
                            count: bool = True):
        """``Backend.refresh_and_prepare`` in one pass over W where it applies (kernel 21, ``kernels/refresh24.py``):
        the transposable 2:4 mask written into ``mask``, its flips, and the compressed S(W) and (``backward``)
        S(W)^T in the operand, bit for bit the separate calls' (kernels 2, 9 and 11). It applies when every
        product runs sparse (no auto policy: it would compress what a dense product never reads), the operand
        would be written straight from W and ``fused_refresh`` is on; elsewhere the separate calls run."""
        if not (self.fused_refresh and self.policy is None and (n, m) == (2, 4) and transposable
                and self._from_weight(weight, mask, dtype) and refresh_kernel_takes(weight, mask)):
            return super().refresh_and_prepare(weight, mask, beta, n, m, transposable, dtype, backward=backward,
                                               count=count)
        operand = self.prepare_masked(weight, mask, beta, n, m, dtype, backward=backward)
        flips, fwd, bwd = self._k().refresh24(weight, mask, beta, out_dtype=dtype, transposed=backward, count=count)
        operand.compressed, operand.compressed_t = fwd, bwd
        written = 1 + int(backward)
        self.stats["compressions"] += written
        self.stats["fast_compressions"] += written
        self.stats["fused_refreshes"] += 1
        return flips, operand

    def compress_operand(self, operand: CusparseltOperand, transposed: bool, want_other: bool) -> None:
        """Fill ``operand.compressed`` (or ``compressed_t`` when ``transposed``); with ``want_other``
        and a fusable source, kernel 11 writes the other form in the same pass."""
        if operand.source is None:
            if transposed:
                operand.compressed_t = self._compress(operand.weight.t())  # a view: read strided
            else:
                operand.compressed = self._compress(operand.weight)
            return
        w, mask, beta, dtype = operand.source
        forward, backward = (want_other, True) if transposed else (True, want_other)
        fwd, bwd = self._k().prepare24(w, mask, beta, out_dtype=dtype, forward=forward, transposed=backward)
        written = int(forward) + int(backward)
        self.stats["compressions"] += written
        self.stats["fast_compressions"] += written
        self.stats["fused_prepares"] += 1
        operand.compressed = fwd if fwd is not None else operand.compressed
        operand.compressed_t = bwd if bwd is not None else operand.compressed_t

    def _compressor(self, a: torch.Tensor):
        """(function, reason): how ``a`` gets compressed. CUDA tensors of whole-tile shapes go
        through the Triton compressor (``kernels/compress24.py``: bit for bit the bytes of
        ``_cslt_compress``, at memory speed, reading transposed views in place); other shapes
        through ``_cslt_compress`` on a contiguous copy, with the reason."""
        problem = fast_layout_problem(*a.shape, a.dtype) if a.is_cuda else "not a CUDA tensor"
        if problem is None and self.fast_compress:
            return self._k().compress24, None
        return (lambda t: self._ops.compress(t.contiguous())), problem or "fast_compress=False"

    def _compress(self, a: torch.Tensor) -> torch.Tensor:
        """The compressed form of the 2:4 matrix ``a`` (any strides: W^T and MVUE(dZ)^T arrive as
        transposed views), counted in ``stats``: "fast_compressions" or "slow_compressions" (the
        reasons in ``slow_compress_reasons``; the copy a transposed view needs there in "compress_copies")."""
        self.stats["compressions"] += 1
        fn, reason = self._compressor(a)
        if reason is None:
            self.stats["fast_compressions"] += 1
        else:
            self.stats["slow_compressions"] += 1
            self.slow_compress_reasons[reason] += 1
            self.stats["compress_copies"] += int(not a.is_contiguous())
        return fn(a)
