"""The "cutlass" backend: a 2:4 linear layer whose products run on CUTLASS's SM90 sparse GEMMs (bfloat16).

For W (out, in), X (tokens, in), dZ (tokens, out), with the 2:4 operand on the left, K-major, as
Hopper's sparse tensor cores take it (``ops.mm``; D column-major is the transpose the layer wants):

    forward         Z^T  = S(W)   X^T     A = S(W)       (out, in), 2:4 along in      B = X  (K-major)  -> Z  (tokens, out)
    input gradient  dX^T = S(W)^T dZ^T    A = S(W)^T     (in, out), 2:4 along out     B = dZ (K-major)  -> dX (tokens, in)
    weight gradient dW   = MVUE(dZ^T) X   A = MVUE(dZ^T) (out, tokens), 2:4 along tokens  B = X (N-major) -> dW (out, in)

No copy of X or dZ and no padding of the tokens for the first two (any token count); the weight
gradient pads the tokens with zero rows to a multiple of 16 (the compressed rows' alignment). The
second product needs S(W)^T to be 2:4 along ``out``, so masks must be transposable. S(W) and S(W)^T are
written on first use per optimizer step by kernel 22 (``kernels/prepare24_cutlass.py``), straight from
W and the mask into CUTLASS's layout, both in one pass when the input gradient is expected (an operand
made by ``prepare_masked``, what SparseLinear calls; ``fused_prepare=False``, or an operand given as the
dense S(W) to ``prepare``, uses CUTLASS's own compressor instead: the same bytes). A mask refresh right
before the step's products (``refresh_and_prepare``) writes the mask, its flips and both forms in one pass
over W instead (kernel 24, ``kernels/refresh24_cutlass.py``; ``fused_refresh=False``: kernels 2, 9, a copy
and kernel 22, the same bytes). MVUE(dZ^T) is drawn
and written compressed in one pass per call by kernel 23 (``kernels/mvue_compress24_cutlass.py``, the
token padding read as zeros, dZ not copied); ``fused_mvue_compress=False`` draws it with kernel 4, copies it
transposed and compresses it with CUTLASS's compressor (the same bytes). The bias is added after the product.

Masks, the soft threshold, MVUE and the masked decay are the Triton kernels (``TritonBackend``), so
this backend draws what "triton" and "cusparselt" draw for the same seed.

Where it cannot run, asking for it raises :class:`CutlassUnavailable` saying what is missing and which
backend to use instead (no silent fallback): it needs a Hopper GPU (compute capability 9.0), nvcc and
the CUTLASS headers (``build.py``).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..triton import TritonBackend
from . import ops
from .build import INSTALL_HINT, CutlassUnavailable, missing_tools

# what to use instead, per backend name (no silent fallback: the error says it)
FALLBACKS = {"cutlass": "use backend='cusparselt' (2:4 products on cuSPARSELt) or 'triton'/'torch' (dense "
                        "products of the same masked weights)",
             "cutlass_fp8": "use backend='cusparselt_fp8' (FP8 2:4 products on cuSPARSELt), 'fp8_dense' or "
                            "'fp8_reference'"}


def unavailable_reason() -> str | None:
    """Why the CUTLASS backends cannot run here, or None. Checks the GPU before the tools."""
    if not torch.cuda.is_available():
        return "no CUDA GPU is available (torch.cuda.is_available() is False)"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return (f"the GPU ({torch.cuda.get_device_name()}) has compute capability {major}.{minor}; the kernels are "
                "built for Hopper (sm_90a) only")
    missing = missing_tools()
    return f"missing {' and '.join(missing)}" if missing else None


def require_cutlass(name: str) -> None:
    """Raise :class:`CutlassUnavailable` naming what is missing and what to use instead when backend ``name``
    cannot run here; where it can, build (or find in the cache) the kernel library."""
    reason = unavailable_reason()
    install = f" Install: {INSTALL_HINT}." if reason and reason.startswith("missing") else ""
    if reason:
        raise CutlassUnavailable(f"backend {name!r} cannot run here: {reason}.{install} Or {FALLBACKS[name]}")
    try:
        ops.library()
    except CutlassUnavailable as err:
        raise CutlassUnavailable(f"backend {name!r}: {err}\nOr {FALLBACKS[name]}") from err


def product_problem(product: str, out_features: int, in_features: int, tokens: int, dtype: torch.dtype) -> str | None:
    """Why :class:`CutlassBackend` cannot run ``product`` of a layer (out, in) over ``tokens`` rows (for the
    forward and the input gradient: both, since they share the operand), or None. ``tokens`` of the weight
    gradient: the rows after its padding to a multiple of 16."""
    if dtype != torch.bfloat16:
        return f"backend 'cutlass' multiplies bfloat16 operands, the layer computes in {str(dtype).replace('torch.', '')}"
    if product == "grad_weight":
        return ops.shape_problem(out_features, in_features, tokens, dtype, "n", "row")
    return (ops.shape_problem(out_features, tokens, in_features, dtype, "k", "col")
            or ops.shape_problem(in_features, tokens, out_features, dtype, "k", "col"))


def _fused_device(t: torch.Tensor) -> bool:
    """Where kernels 22, 23 and 24 run: CUDA tensors (tests widen it to the CPU interpreter)."""
    return t.is_cuda


def refresh_kernel_takes(weight: torch.Tensor, mask: torch.Tensor, n: int, m: int, transposable: bool) -> bool:
    """Whether kernel 24 (``kernels/refresh24_cutlass.py``) refreshes this mask: a transposable 2:4 one, a float32 /
    16-bit W on its device, a contiguous mask on a 4-byte boundary (the kernel reads and writes it as int32
    words). The shapes are the products' rule (``ops.check_weight_for_products``), checked before it runs."""
    return ((n, m) == (2, 4) and transposable and _fused_device(weight) and weight.dim() == 2
            and weight.dtype in (torch.float32, torch.bfloat16, torch.float16) and mask.is_contiguous()
            and mask.storage_offset() % 4 == 0)


@dataclass
class CutlassOperand:
    """One optimizer step's weight (out, in) in the products' dtype and its compressed forms, made on first
    use (S(W) for the forward, S(W)^T for the input gradient): from ``weight``, the dense S(W), by CUTLASS's
    compressor, or from ``source`` = (W, mask, beta) by kernel 22 (``backward``: the input gradient is
    expected, so the first use writes both forms in one pass)."""

    weight: torch.Tensor | None = None
    source: tuple | None = None
    backward: bool = True
    shape: tuple[int, int] | None = None
    compressed: ops.SparseOperand | None = None
    compressed_t: ops.SparseOperand | None = None

    def __post_init__(self) -> None:
        if self.weight is not None:
            self.shape = tuple(self.weight.shape)
        elif self.source is None or self.shape is None:
            raise ValueError("an operand needs the dense S(W), or (W, mask, beta) and its shape")

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.weight is None else self.weight.dtype


class CutlassBackend(TritonBackend):
    """2:4 products on CUTLASS SM90 sparse GEMMs (see the module docstring). ``config`` picks the kernel
    variant of the forward and input-gradient products (``ops.configs``); None: ``ops.DEFAULT_CONFIGS``.
    ``fused_prepare``: the weight operands written from W by kernel 22 (False: S(W), then CUTLASS's
    compressor, for an A/B run; the bytes are the same). ``fused_mvue_compress``: the weight gradient's
    MVUE(dZ^T) written compressed by kernel 23 (False: kernel 4, a transposed copy, CUTLASS's compressor;
    the same bytes). ``fused_refresh``: a mask refresh by kernel 24, with both operands when the products come
    next (``refresh_and_prepare``, with ``fused_prepare``); False: kernels 2 and 9 and a copy (then kernel 22),
    the same mask, count and bytes."""

    name = "cutlass"
    fuses_refresh_and_prepare = True  # kernel 24: mask, flips and both compressed forms in one pass

    def __init__(self, config: str | None = None, fused_prepare: bool = True, fused_mvue_compress: bool = True,
                 fused_refresh: bool = True) -> None:
        super().__init__()
        self.config = config
        self.fused_prepare = bool(fused_prepare)
        self.fused_mvue_compress = bool(fused_mvue_compress)
        self.fused_refresh = bool(fused_refresh)
        self.stats: Counter = Counter()

    def _check_products(self, weight, n, m, transposable) -> None:
        ops.check_weight_for_products(self.name, tuple(weight.shape), n, m, transposable, torch.bfloat16, 8, "torch")

    def mask(self, weight, n, m, transposable):
        self._check_products(weight, n, m, transposable)
        return super().mask(weight, n, m, transposable)

    def refresh_mask_(self, weight, mask, n, m, transposable, count=True):
        """The mask refresh in one pass over W where kernel 24 runs (writing neither compressed form: the new mask
        over the old one and their flips, as kernels 2 and 9 and a copy give them); elsewhere ``mask``,
        ``mask_flips`` and a copy."""
        if not (self.fused_refresh and refresh_kernel_takes(weight, mask, n, m, transposable)):
            return super().refresh_mask_(weight, mask, n, m, transposable, count=count)
        self._check_products(weight, n, m, transposable)
        self.stats["fused_refreshes"] += 1
        return self._k.refresh24_cutlass(weight, mask, forward=False, transposed=False, count=count)[0]

    def refresh_and_prepare(self, weight, mask, beta, n, m, transposable, dtype, backward: bool = True,
                            count: bool = True):
        """``Backend.refresh_and_prepare`` in one pass over W where kernel 24 runs: the transposable 2:4 mask written
        into ``mask``, its flips, and S(W) and (``backward``) S(W)^T compressed in the operand, bit for bit the
        separate calls' (kernels 2, 9 and 22). Elsewhere (``fused_refresh`` or ``fused_prepare`` off, a weight
        kernel 24 does not take, products not in bfloat16) the separate calls run."""
        if not (self.fused_refresh and self.fused_prepare and dtype == torch.bfloat16
                and refresh_kernel_takes(weight, mask, n, m, transposable)):
            return super().refresh_and_prepare(weight, mask, beta, n, m, transposable, dtype, backward=backward,
                                               count=count)
        self._check_products(weight, n, m, transposable)
        flips, fwd, bwd = self._k.refresh24_cutlass(weight, mask, beta, transposed=backward, count=count)
        # the source stays: kernel 22 writes S(W)^T from it should an operand prepared without it be asked for it
        operand = CutlassOperand(source=(weight, mask, beta), backward=backward, shape=tuple(weight.shape))
        self._keep_forms(operand, fwd, bwd)
        self.stats["compressions"] += 1 + int(backward)
        self.stats["fused_refreshes"] += 1
        return flips, operand

    def prepare(self, sparse_weight):
        if sparse_weight.dtype != torch.bfloat16:
            raise TypeError(f"backend {self.name!r} multiplies bfloat16 operands, got {sparse_weight.dtype}: run under "
                            "torch.autocast('cuda', dtype=torch.bfloat16) or convert the model to bfloat16")
        return CutlassOperand(sparse_weight.contiguous())

    def prepare_masked(self, weight, mask, beta, n, m, dtype, backward: bool = True):
        """The step's operand from W and the mask: kernel 22 writes its compressed forms on first use (on a
        CUDA weight, with ``fused_prepare``); otherwise ``prepare(sparse_weight_as(...))``."""
        if dtype != torch.bfloat16:
            raise TypeError(f"backend {self.name!r} multiplies bfloat16 operands, got {dtype}: run under "
                            "torch.autocast('cuda', dtype=torch.bfloat16) or convert the model to bfloat16")
        if not (self.fused_prepare and _fused_device(weight) and (n, m) == (2, 4)):
            return super().prepare_masked(weight, mask, beta, n, m, dtype, backward)
        return CutlassOperand(source=(weight, mask, beta), backward=backward, shape=tuple(weight.shape))

    def _write_from_source(self, operand: CutlassOperand, transposed: bool) -> None:
        """Kernel 22: the form asked for, and with it S(W)^T when the forward asks first and the input
        gradient is expected (one pass for both)."""
        w, mask, beta = operand.source
        forward = not transposed
        backward = transposed or (operand.backward and operand.compressed_t is None)
        fwd, bwd = self._k.prepare24_cutlass(w, mask, beta, forward=forward, transposed=backward)
        self.stats["compressions"] += int(forward) + int(backward)
        self.stats["fused_prepares"] += 1
        self._keep_forms(operand, fwd, bwd)

    @staticmethod
    def _keep_forms(operand: CutlassOperand, fwd, bwd) -> None:
        """The (values, metadata) pairs a kernel wrote (None: not written) as the operand's compressed forms."""
        out_f, in_f = operand.shape
        if fwd is not None:
            operand.compressed = ops.SparseOperand(*fwd, (out_f, in_f))
        if bwd is not None:
            operand.compressed_t = ops.SparseOperand(*bwd, (in_f, out_f))

    def _compressed(self, operand: CutlassOperand, transposed: bool) -> ops.SparseOperand:
        if operand.source is not None and (operand.compressed_t if transposed else operand.compressed) is None:
            self._write_from_source(operand, transposed)
        if transposed:
            if operand.compressed_t is None:
                self.stats["compressions"] += 1
                operand.compressed_t = ops.compress(operand.weight.t().contiguous())
            return operand.compressed_t
        if operand.compressed is None:
            self.stats["compressions"] += 1
            operand.compressed = ops.compress(operand.weight)
        return operand.compressed

    def _b(self, t: torch.Tensor) -> torch.Tensor:
        if t.dtype != torch.bfloat16:
            raise TypeError(f"backend {self.name!r} multiplies bfloat16 operands, got {t.dtype}")
        if not t.is_contiguous():
            self.stats["copies"] += 1
            t = t.contiguous()
        return t

    def linear(self, x, operand: CutlassOperand, bias):
        self.stats["sparse_products"] += 1
        z = ops.mm(self._compressed(operand, False), self._b(x), "k", "col", config=self.config)  # (tokens, out)
        return z if bias is None else z + bias.to(z.dtype)

    def grad_input(self, grad_out, operand: CutlassOperand):
        self.stats["sparse_products"] += 1
        return ops.mm(self._compressed(operand, True), self._b(grad_out), "k", "col", config=self.config)

    def grad_weight(self, grad_out, x, mvue, seed):
        if not mvue:  # dZ^T X has no 2:4 operand: dense
            self.stats["dense_products"] += 1
            return self._reference.grad_weight(grad_out, x, False, None)
        tokens, out_f = grad_out.shape
        pad = (-tokens) % (2 * ops.row_alignment(grad_out.dtype))
        if pad:  # zero tokens change no product and no MVUE draw of the other groups
            x = F.pad(x, (0, 0, 0, pad))
        self.stats["compressions"] += 1
        self.stats["sparse_products"] += 1
        if self.fused_mvue_compress and _fused_device(grad_out):  # kernel 23: dZ's padding read as zeros
            self.stats["fused_mvue_compressions"] += 1
            form = self._k.mvue_compress24_cutlass(self._b(grad_out), seed=self._seed(seed), tokens=tokens + pad)
            a = ops.SparseOperand(*form, (out_f, tokens + pad))
        else:
            dz = F.pad(grad_out, (0, 0, 0, pad)) if pad else grad_out
            drawn = self._k.mvue24(dz, dim=0, seed=self._seed(seed))  # (tokens, out), 2:4 along tokens
            a = ops.compress(drawn.t().contiguous())  # MVUE(dZ^T) (out, tokens), row-major
        return ops.mm(a, self._b(x), "n", "row")  # (out, in)

    @staticmethod
    def _seed(seed):
        from ..base import kernel_seed
        return kernel_seed(seed)

    def product_plan(self, out_features, in_features, mvue):
        plan = {"forward": "2:4 sparse bf16 (CUTLASS SM90)", "grad_input": "2:4 sparse bf16 (CUTLASS SM90)",
                "grad_weight": "MVUE 2:4 sparse bf16 (CUTLASS SM90)" if mvue else "dense dZ^T X"}
        return plan


def cutlass_backend(config: str | None = None, fused_prepare: bool = True,
                    fused_mvue_compress: bool = True, fused_refresh: bool = True) -> CutlassBackend:
    """What ``get_backend("cutlass")`` builds: raises :class:`CutlassUnavailable` where it cannot run; builds
    (or finds in the cache) the kernel library before returning, so the first product does not wait for nvcc."""
    require_cutlass("cutlass")
    return CutlassBackend(config, fused_prepare, fused_mvue_compress, fused_refresh)
