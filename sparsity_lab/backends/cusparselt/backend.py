"""The "cusparselt" backend: a 2:4 linear layer whose products run on sparse tensor cores.

For W (out, in), X (tokens, in), dZ (tokens, out), and cuSPARSELt computing ``A @ B`` with the
sparse, compressed operand A on the left (``ops`` states the contract, read in PyTorch's
source, with file names; the products go through ``direct``, which calls cuSPARSELt with
PyTorch's descriptors and one cached plan per product shape, or through ``torch._cslt_sparse_mm``):

    forward         Z^T  = S(W)   X^T    A = S(W)      (out, in), 2:4 along in     B = X.t()   -> Z  (tokens, out)
    input gradient  dX^T = S(W)^T dZ^T   A = S(W)^T    (in, out), 2:4 along out    B = dZ.t()  -> dX (tokens, in)
    weight gradient dW   = MVUE(dZ^T) X  A = MVUE(dZ^T)(out, tokens), 2:4 along tokens  B = X  -> dW (out, in)

The first two pass B as the ``.t()`` view of the contiguous X or dZ (no copy: cuSPARSELt reads
it as a transposed row-major operand) and ask ``transpose_result=True``, so the result arrives as
Z or dX, row-major, with no transpose after. The weight gradient passes X as it is and takes the
result as dW (``transpose_result=False``; the other layout is measured by the probe).

Per optimizer step (``operand.py``): ``prepare_masked`` (what SparseLinear calls) makes a :class:`CusparseltOperand`
from W, the mask and beta; on first use kernel 11 (``kernels/prepare24.py``) writes the compressed
S(W) and S(W)^T in one pass over W, and the dense S(W) is made only if a dense product asks for it
(``prepare`` wraps an already masked S(W) instead). When the mask is recomputed right before the
step's products, ``refresh_and_prepare`` does mask, flip count and both compressed forms in one pass
over W (kernel 21, ``kernels/refresh24.py``). The operand is reused by every micro-step (the
layer caches it per step). The MVUE operand of the weight gradient is drawn straight into the
compressed layout by kernel 10 (``kernels/mvue_compress24.py``). Both exist only because the mask is
transposable: S(W)^T is 2:4 along ``out`` only then, so ``mask`` refuses ``transposable=False``.
Masks, the soft threshold, MVUE and the masked decay use the Triton kernels on CUDA tensors (the
reference on CPU tensors, e.g. a layer built on the CPU before ``.cuda()``).

Algorithm choice: per product key, searched and checked numerically on first use
(``algorithms``). Tokens that are not a multiple of 16 (bf16/fp16) are padded with zero
rows (a copy, counted in ``stats["padded_calls"]``); weights whose dimensions are not multiples of
16 raise (``backend="cusparselt_auto"`` runs them dense and reports it).

Two names: "cusparselt" (every product sparse that can be, errors otherwise) and
"cusparselt_auto" (:class:`AutoPolicy`: sparse only where measured faster than the dense product
of the same masked operands). On a machine without a CUDA GPU either name gives
:class:`ReferenceFallback`: the reference backend, with a :class:`BackendFallbackWarning` and its
``fallback_reason`` in ``backend_report(model)``. A GPU that cannot run cuSPARSELt (compute
capability < 8.0, no cuSPARSELt in the build) raises :class:`CusparseltUnavailable`.

Verified on the H100 (torch 2.11, cuSPARSELt 0.8.0): the contract above, every product against
float32 dense products of the same masked operands (``pytest -m gpu tests/test_cusparselt_backend.py``,
``python -m benchmarks.cusparselt_probe``), S-STE + MVUE gradients equal to the "triton"
backend's (same draws), 200 STE training steps within the reference's seed spread. Compression goes
through ``kernels/compress24.py`` (bit for bit ``_cslt_compress``'s bytes, much faster) for shapes
whose rows and columns are multiples of 64; speeds in ``results/cusparselt_ffn_h100.json`` and
``results/cusparselt_NOTES.md``.

Memory: an operand keeps S(W) (dense, compute dtype) and up to two compressed forms (9/16 of it
each) alive for the optimizer step.
"""
from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F

from .activation import TILE, ActivationProducts
from .auto import AutoPolicy, ProductShape
from .layer_plan import LayerShape
from ..base import Backend, MvueSeed, kernel_seed
from .algorithms import AlgorithmCache, ProductKey
from ...methods.flip_rate import mask_flips_tensor
from .reporting import CusparseltReporting
from . import operand as operand_module  # its _triton_device: where the Triton kernels run (tests widen it)
from .operand import CusparseltOperand, OperandPreparation, refresh_kernel_takes
from .ops import (PRODUCT_DTYPES, SPARSE_MULTIPLE, check_product_dtype, check_sparse_shape, padded,
                  sparse_shape_problem, transposed_view, unavailable_reason)
from ..torch_reference import TorchBackend

MIN_MULTIPLE = min(SPARSE_MULTIPLE[d] for d in PRODUCT_DTYPES)  # 16: what any weight must meet


class BackendFallbackWarning(UserWarning):
    """A requested backend cannot run here and the reference runs instead.
    ``warnings.simplefilter("error", BackendFallbackWarning)`` turns the fallback into an error."""


class ReferenceFallback(TorchBackend):
    """The reference backend standing in for ``requested`` on a machine that cannot run it."""

    def __init__(self, requested: str, reason: str) -> None:
        self.requested = requested
        self.fallback_reason = reason
        self.name = f"torch (fallback for {requested})"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x with zero rows appended up to ``rows`` (zero tokens change no product and no MVUE draw)."""
    return x if x.shape[0] == rows else F.pad(x, (0, 0, 0, rows - x.shape[0]))


class CusparseltBackend(OperandPreparation, Backend, CusparseltReporting):
    """2:4 products on sparse tensor cores through cuSPARSELt (see the module docstring).

    ops: the cuSPARSELt calls (default: PyTorch's, which checks the GPU; tests pass a stand-in).
    policy: None runs every product sparse; an :class:`AutoPolicy` decides per shape.
    sweep: try every algorithm id, not only cuSPARSELt's own pick.
    grad_weight_transpose_result: take the weight gradient's result as (in, out) and return its
    ``.t()`` view (the probe measures which layout is faster).
    fast_compress, fused_mvue_compress, fused_prepare, fused_refresh: the Triton kernels 8, 10, 11 and 21
    (compress24, MVUE drawn straight into the compressed layout, S(W) and S(W)^T compressed straight from W,
    and the mask refresh with its flips and both compressed forms in one pass); False brings back the
    slower path each replaces (same bytes), for a benchmark's A/B run.
    """

    reads_seed_from_device = True  # MVUE runs in the Triton kernels, which read a device seed under graph capture
    mask_refresh_capturable = True  # masks and flip counts are the Triton kernels on CUDA tensors
    fuses_refresh_and_prepare = True  # kernel 21: mask, flips and both compressed forms in one pass (operand.py)

    def __init__(self, ops: Any = None, policy: AutoPolicy | None = None, sweep: bool = True,
                 grad_weight_transpose_result: bool = False, fast_compress: bool = True,
                 fused_mvue_compress: bool = True, fused_prepare: bool = True, fused_refresh: bool = True) -> None:
        if ops is None:  # the direct binding (cached plans), PyTorch's ops if it cannot start (warned)
            from .direct import make_ops
            ops = make_ops()
        self._ops = ops
        self.policy = policy
        self.name = "cusparselt" if policy is None else "cusparselt_auto"
        self.algorithms = AlgorithmCache(self._ops, sweep=sweep)
        self.grad_weight_transpose_result = bool(grad_weight_transpose_result)
        self.fast_compress = bool(fast_compress)
        # kernel 10 (MVUE straight into the compressed layout): the same bytes as mvue24 + compress24
        # (GPU-tested) and faster than the two on the H100 (docs/measuring.md, results/kernels_h100.json)
        self.fused_mvue_compress = bool(fused_mvue_compress)
        # kernel 11 (S(W) and S(W)^T compressed straight from W): the same bytes as soft threshold +
        # compress24 twice (tested); prepare_masked uses it where shapes allow
        self.fused_prepare = bool(fused_prepare)
        # kernel 21 (mask, flips and both compressed forms in one pass over W, when a refresh precedes the
        # products): the same mask, count and bytes as kernels 2, 9 and 11 (tested); refresh_and_prepare
        self.fused_refresh = bool(fused_refresh)
        self.stats: Counter = Counter()
        self._decided: dict[tuple, bool] = {}  # (product, out, in, tokens, dtype) -> sparse, the policy's choice
        self.slow_compress_reasons: Counter = Counter()
        self._reference = TorchBackend()
        self._kernels = None
        self._activation_products: ActivationProducts | None = None
        # how the auto policy times a product: "eager" (back-to-back calls: the host's launch cost
        # counts) or "graph" (replayed from a CUDA graph: kernel time only), each mode with its own
        # decisions. sparsity_lab.graph_step.graph_timing switches it around CudaGraphStep's eager steps.
        self._timing = "eager"
        self._by_timing: dict[str, tuple] = {}  # the other mode's (policy, decided)

    def __deepcopy__(self, memo):
        # one backend per process (its algorithm cache and auto decisions): a deep-copied model shares it
        return self

    # --- masks and weights: Triton kernels on CUDA tensors, the reference elsewhere -----------------
    def _k(self):
        if self._kernels is None:
            import sparsity_lab.kernels as kernels  # triton: imported only when a CUDA tensor needs it
            self._kernels = kernels
        return self._kernels

    def mask(self, weight, n, m, transposable):
        if (n, m) != (2, 4):
            raise ValueError(f"backend {self.name!r} runs 2:4 sparse tensor cores, got n={n}, m={m}; "
                             "use backend='torch' for other N:M")
        if not transposable:
            raise ValueError(
                f"backend {self.name!r} computes dX = dZ S(W) on sparse tensor cores, which needs S(W)^T to be "
                "2:4 as well: set transposable=True in the method (e.g. STE(transposable=True, "
                f"backend={self.name!r})), or use backend='torch'")
        if self.policy is None:
            out_f, in_f = weight.shape
            if out_f % MIN_MULTIPLE or in_f % MIN_MULTIPLE:
                check_sparse_shape(out_f, in_f, torch.bfloat16, "the layer's weight (out_features, in_features)")
        if operand_module._triton_device(weight):
            return self._k().transposable_mask24(weight, pruned=False)[0]
        return self._reference.mask(weight, n, m, transposable)

    def sparse_weight_as(self, weight, mask, beta, n, m, dtype):
        """``sparse_weight(...).to(dtype)`` in fewer passes on CUDA: the soft threshold writes
        ``dtype`` itself; m * W casts before masking (a smaller temporary)."""
        if not weight.is_cuda:
            return self.sparse_weight(weight, mask, beta, n, m).to(dtype)
        if beta is None:
            return weight.to(dtype) * mask
        return self._k().soft_threshold24(weight, mask, beta, out_dtype=dtype)

    def refresh_mask_(self, weight, mask, n, m, transposable, count=True):
        """The mask refresh in one pass over W where kernel 21 runs (``kernels/refresh24.py`` writing neither
        compressed form: the new mask over the old one and their flips, as kernels 2 and 9 and a copy give
        them); elsewhere ``mask``, ``mask_flips`` and a copy."""
        if not (self.fused_refresh and (n, m) == (2, 4) and transposable and refresh_kernel_takes(weight, mask)):
            return super().refresh_mask_(weight, mask, n, m, transposable, count=count)
        self.stats["fused_refreshes"] += 1
        return self._k().refresh24(weight, mask, forward=False, transposed=False, count=count)[0]

    def mask_flips(self, previous, current):
        """0-d int64 count of differing entries, on the device (kernel 9 on CUDA tensors)."""
        if operand_module._triton_device(previous):
            return self._k().count_flips(previous, current)
        return mask_flips_tensor(previous, current)

    def sparse_weight(self, weight, mask, beta, n, m):
        if not weight.is_cuda:
            return self._reference.sparse_weight(weight, mask, beta, n, m)
        if beta is None:
            return weight * mask
        return self._k().soft_threshold24(weight, mask, beta)

    def masked_decay_(self, grad, weight, mask, decay):
        if grad.is_cuda:
            self._k().masked_decay_(grad, weight, mask, decay)
        else:
            self._reference.masked_decay_(grad, weight, mask, decay)

    # --- products (the operand's preparation and compression: OperandPreparation, operand.py) ----------
    def _sparse(self, product: str, out_f: int, in_f: int, tokens: int, dtype: torch.dtype) -> bool:
        """Run this product of a layer (out_f, in_f) over ``tokens`` rows sparse? Cached per key in a
        plain dict: in eager training at small shapes the host is the bottleneck, so the per-call cost
        of deciding must be a lookup."""
        if self.policy is None:
            check_product_dtype(dtype)
            return True
        key = (product, out_f, in_f, tokens, dtype)
        sparse = self._decided.get(key)
        if sparse is None:
            if product != "grad_weight" and self.policy.measure_layer is not None:
                # forward and grad_input share S(W): one plan for the layer (layer_plan.py)
                layer = LayerShape(out_f, in_f, tokens, _dtype_name(dtype))
                plan = self.policy.decide_layer(layer, sparse_shape_problem(out_f, in_f, dtype)).plan
                self._decided[("forward",) + key[1:]], self._decided[("grad_input",) + key[1:]] = plan
                return self._decided[key]
            shape = ProductShape.of_layer(product, out_f, in_f, tokens, _dtype_name(dtype))
            rows, cols = {"forward": (out_f, in_f), "grad_input": (in_f, out_f), "grad_weight": (out_f, tokens)}[product]
            sparse = self._decided[key] = self.policy.decide(shape, sparse_shape_problem(rows, cols, dtype)).sparse
        return sparse

    @staticmethod
    def padded_rows(tokens: int, dtype: torch.dtype) -> int:
        """The rows a product of ``tokens`` rows runs on here (zero rows appended to the dtype's multiple)."""
        return padded(tokens, dtype) if dtype in SPARSE_MULTIPLE else tokens + (-tokens) % 4

    def _rows_for(self, tokens: int, dtype: torch.dtype) -> int:
        rows = self.padded_rows(tokens, dtype)
        if rows != tokens:
            self.stats["padded_calls"] += 1
        return rows

    def _b_transposed(self, x: torch.Tensor) -> torch.Tensor:
        b, copied = transposed_view(x)
        self.stats["copies"] += int(copied)
        return b

    def linear(self, x, operand: CusparseltOperand, bias):
        out_f, in_f = operand.shape
        tokens, dtype = x.shape[0], operand.dtype
        if not self._sparse("forward", out_f, in_f, tokens, dtype):
            self.stats["dense_products"] += 1
            return F.linear(x, operand.weight, bias)
        self._ops.check_device(x, "x")
        rows = self._rows_for(tokens, dtype)
        b = self._b_transposed(_pad_rows(x, rows))  # X^T (in, rows), a view
        if operand.compressed is None:
            # the input gradient's operand in the same pass when the backward will run it sparse too
            want_t = (operand.backward and operand.compressed_t is None
                      and self._sparse("grad_input", out_f, in_f, tokens, dtype))
            self.compress_operand(operand, transposed=False, want_other=want_t)
        config = self.algorithms.get(ProductKey(out_f, in_f, rows, dtype, True, True), x.device)
        self.stats["sparse_products"] += 1
        z = self._ops.mm(operand.compressed, b, bias, True, config)  # (rows, out) = Z
        return z if rows == tokens else z[:tokens]

    def grad_input(self, grad_out, operand: CusparseltOperand):
        out_f, in_f = operand.shape
        tokens, dtype = grad_out.shape[0], operand.dtype
        if not self._sparse("grad_input", out_f, in_f, tokens, dtype):
            self.stats["dense_products"] += 1
            return grad_out @ operand.weight
        self._ops.check_device(grad_out, "grad_out")
        rows = self._rows_for(tokens, dtype)
        b = self._b_transposed(_pad_rows(grad_out, rows))  # dZ^T (out, rows), a view
        if operand.compressed_t is None:
            self.compress_operand(operand, transposed=True, want_other=False)
        config = self.algorithms.get(ProductKey(in_f, out_f, rows, dtype, True, True), grad_out.device)
        self.stats["sparse_products"] += 1
        dx = self._ops.mm(operand.compressed_t, b, None, True, config)  # (rows, in) = dX
        return dx if rows == tokens else dx[:tokens]

    def mvue_tokens_major(self, grad_out: torch.Tensor, seed: MvueSeed | None) -> torch.Tensor:
        """MVUE(dZ) with groups of 4 along the tokens, (tokens, out): the Triton kernel on CUDA
        (the same call and seed as the "triton" backend, so both draw alike), the reference elsewhere."""
        if grad_out.is_cuda:
            return self._k().mvue24(grad_out, dim=0, seed=kernel_seed(seed))
        from ...methods.mvue import mvue24
        from ..torch_reference import generator_on
        return mvue24(grad_out, dim=0, generator=generator_on(grad_out.device, seed), check=False)

    def grad_weight(self, grad_out, x, mvue, seed):
        if not mvue:  # dZ^T X has no 2:4 operand: dense
            self.stats["dense_products"] += 1
            return self._reference.grad_weight(grad_out, x, False, None)
        tokens, out_f = grad_out.shape
        in_f, dtype = x.shape[1], grad_out.dtype
        rows = self._rows_for(tokens, dtype)
        dz_p = _pad_rows(grad_out, rows)
        x_p = _pad_rows(x, rows)
        sparse = self._sparse("grad_weight", out_f, in_f, rows, dtype)
        fused = (sparse and self.fused_mvue_compress and dz_p.is_cuda and dz_p.is_contiguous()
                 and dtype in (torch.bfloat16, torch.float16) and rows % 64 == 0 and out_f % 64 == 0)
        if fused:  # the same seed as the two-kernel path: the same draws, the same bytes
            mv, drawn = None, kernel_seed(seed)
        else:
            mv = self.mvue_tokens_major(dz_p, seed)  # (rows, out)
        if not sparse:
            self.stats["dense_products"] += 1
            return mv.t() @ x_p
        self._ops.check_device(x_p, "x")
        if not x_p.is_contiguous():
            x_p = x_p.contiguous()
            self.stats["copies"] += 1
        if mv is None:  # fused: MVUE(dZ^T) drawn and compressed in one pass
            self.stats["compressions"] += 1
            self.stats["fused_mvue_compressions"] += 1
            a = self._k().mvue_compress24(dz_p, seed=drawn)
        else:
            a = self._compress(mv.t())  # MVUE(dZ^T) (out, rows), 2:4 along the tokens: a view, read strided
        tr = self.grad_weight_transpose_result
        config = self.algorithms.get(ProductKey(out_f, rows, in_f, dtype, False, tr), x_p.device)
        self.stats["sparse_products"] += 1
        dw = self._ops.mm(a, x_p, None, tr, config)
        return dw.t() if tr else dw

    # --- 2:4 activation products (activation.py): the activation is the sparse operand ---------------------
    token_feature_multiple = TILE  # pruned features in whole 64-row tiles of the compressed operand

    def _activation(self) -> ActivationProducts:
        if self._activation_products is None:
            self._activation_products = ActivationProducts(self._ops, self.algorithms)
        return self._activation_products

    def act24_linear(self, h, weight):
        return self._activation().linear(h, weight)

    def act24_grad(self, h, grad_a24):
        return self._activation().grad(h, grad_a24)

    def act24_grad_input(self, operand, weight):
        return self._activation().grad_input(operand, weight)

    def tokens24_weight_grad(self, a, g, perm, dense_count):
        return self._activation().tokens24_weight_grad(a, g, perm, dense_count)



def reference_fallback(name: str) -> ReferenceFallback:
    """What backend ``name`` gives on a machine without a CUDA GPU: the reference, with a
    :class:`BackendFallbackWarning` naming the reason."""
    reason = unavailable_reason()
    warnings.warn(f"backend {name!r} was requested, but {reason}: SparseLinear layers run the reference "
                  "backend ('torch', dense products of the same masked weights) instead; "
                  "sparsity_lab.sparsify.backend_report(model) lists them",
                  BackendFallbackWarning, stacklevel=4)
    return ReferenceFallback(name, reason)


def cusparselt_backend(auto: bool = False, min_speedup: float = 1.0, fused_mvue_compress: bool = True,
                       fused_prepare: bool = True):
    """What ``get_backend("cusparselt")`` (or ``"cusparselt_auto"``) builds; a benchmark that compares
    variants builds its own with the arguments (``CusparseltBackend``'s, e.g. ``fused_prepare=False``).

    No CUDA GPU: :class:`ReferenceFallback`, with a :class:`BackendFallbackWarning`. A GPU that
    cannot run cuSPARSELt: raises :class:`CusparseltUnavailable`. Otherwise the real backend.
    """
    name = "cusparselt_auto" if auto else "cusparselt"
    fused, prepare = fused_mvue_compress, fused_prepare
    if not torch.cuda.is_available():
        return reference_fallback(name)
    if not auto:
        return CusparseltBackend(fused_mvue_compress=fused, fused_prepare=prepare)
    backend = CusparseltBackend(policy=AutoPolicy(min_speedup=min_speedup), fused_mvue_compress=fused,
                                fused_prepare=prepare)
    backend.policy.measure = backend.measure_product
    backend.policy.measure_layer = backend.measure_layer
    return backend
