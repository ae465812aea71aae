"""The "cutlass_fp8" backend: the FP8 training recipe of "cusparselt_fp8" with CUTLASS's SM90 sparse E4M3 GEMMs.

Per training step of a layer W (out, in), X (tokens, in), dZ (tokens, out), E4M3 operands q(.) with
per-tensor scales s (the layer's recipe, ``methods/fp8_scaling``: delayed or current scaling):

    forward          Z  = s_w s_x   (q(S(W)) q(X)^T)^T       A = q(S(W))   (out, in)     B = q(X)   (tokens, in)
    input gradient   dX = s_w s_dz  (q(S(W))^T q(dZ)^T)^T    A = q(S(W))^T (in, out)     B = q(dZ)  (tokens, out)
    weight gradient  dW = s_g s_x   q(MVUE(dZ))^T q(X)       A = q(MVUE(dZ))^T (out, tokens)  B = q(X)^T (in, tokens)

Every B is K-major (Hopper's FP8 tensor cores take no other), the result bfloat16. The two scales are
read from device memory in the GEMM's epilogue (``ops.mm``): no pass after the product, no host alpha,
no host sync, so a CUDA graph captures the products and the recipe's scales may change between replays.

The weight's two operands q(S(W)) and q(S(W))^T are written once per optimizer step by kernel 22
(``kernels/prepare24_cutlass.py``) from the master W and the mask, cast with the recipe's scale and
compressed into CUTLASS's layout in one pass (current scaling: after an amax pass of the same kernel),
as kernel 18 does for "cusparselt_fp8"; with ``FP8Engine(fused=False)``, or an operand given as the dense
S(W) to ``prepare``, q(S(W)) is cast and CUTLASS's compressor compresses it (the same bytes). The weight
gradient's q(MVUE(dZ))^T is drawn, cast and compressed in one pass by kernel 23
(``kernels/mvue_compress24_cutlass.py``, current scaling: after its amax pass), as kernel 19 does for
"cusparselt_fp8"; with ``fused_mvue=False`` (or ``FP8Engine(fused=False)``) kernel 4 draws it and CUTLASS's
compressor compresses the cast (the same bytes).

Everything else is ``FP8Backend``'s (quantization, the amax history, q(X)^T made by the forward's cast,
the dense phase on ``torch._scaled_mm``, masks and MVUE by the Triton kernels): this class replaces only
the weight's preparation and the three sparse products. Without MVUE the weight gradient is dense FP8
(``torch._scaled_mm``).
"""
from __future__ import annotations

import torch

from ..cusparselt.fp8_train import (HALF, FP8Backend, FP8Engine, FP8Operand, _pad_rows, _padded_rows,
                                    fused_mvue_operand, fused_weight_operand)
from . import ops
from .backend import _fused_device, require_cutlass

NAME = "cutlass_fp8"


class CutlassFP8Backend(FP8Backend):
    """``FP8Backend`` on the "scaled_mm" engine (dense phase, dense weight gradient) with its sparse
    products on CUTLASS (see the module docstring). ``config``: the variant of the forward and
    input-gradient products (``ops.configs(torch.float8_e4m3fn)``); None: ``ops.DEFAULT_CONFIGS``, the
    fast-accumulation schedule; "128x128x128.1x2.coop" promotes the accumulators to float32 in the K loop.
    ``fused_mvue``: the weight gradient's q(MVUE(dZ))^T from kernel 23 (with ``engine.fused``)."""

    def __init__(self, engine: FP8Engine, recipe=None, device=None, config: str | None = None,
                 fused_mvue: bool = True) -> None:
        super().__init__(engine, recipe, device=device)
        self.config = config
        self.fused_mvue = bool(fused_mvue)

    def for_layer(self, layer):
        return CutlassFP8Backend(self.engine, self.scaling.recipe, device=layer.weight.device, config=self.config,
                                 fused_mvue=self.fused_mvue)

    def product_plan(self, out_features, in_features, mvue):
        kind = "2:4 sparse FP8 E4M3 (CUTLASS SM90, scales in the epilogue)"
        return {"forward": kind, "grad_input": kind,
                "grad_weight": kind if mvue else "dense FP8 E4M3 dZ^T X (torch._scaled_mm)"}

    def mask(self, weight, n, m, transposable):
        ops.check_weight_for_products(self.name, tuple(weight.shape), n, m, transposable, torch.float8_e4m3fn, 64,
                                      "fp8_dense")
        return super().mask(weight, n, m, transposable)

    def _check_e4m3(self, q: torch.Tensor) -> None:
        if q.dtype != torch.float8_e4m3fn:  # CUTLASS's sparse FP8 GEMMs here take E4M3 A and B alike
            raise ValueError(f"backend {self.name!r} multiplies E4M3 operands; the recipe casts the gradient to "
                             f"{q.dtype}: use FP8Recipe(grad_format='e4m3')")

    def prepare_masked(self, weight, mask, beta, n, m, dtype, backward: bool = True) -> FP8Operand:
        """The step's operand from the master W and the mask: kernel 22 writes q(S(W)) (and q(S(W))^T when
        ``backward``) compressed, and amax(S(W)), in one pass (on a CUDA weight, with the engine's ``fused``);
        otherwise S(W), then ``prepare``."""
        if not (self.engine.fused and _fused_device(weight) and (n, m) == (2, 4) and dtype in HALF
                and self.scaling.recipe.format_of("w") == "e4m3"):
            return super().prepare_masked(weight, mask, beta, n, m, dtype, backward)
        k = self.engine.kernels()
        out_f, in_f = weight.shape

        def prepare(w, mask_, beta_, inv_scale, dtype_, forward=True, transposed=True):
            fwd, bwd, amax = k.prepare24_cutlass_fp8(w, mask_, beta_, inv_scale, dtype_, forward=forward,
                                                     transposed=transposed)
            return (None if fwd is None else ops.SparseOperand(*fwd, (out_f, in_f)),
                    None if bwd is None else ops.SparseOperand(*bwd, (in_f, out_f)), amax)
        return fused_weight_operand(self.scaling, weight, mask, beta, dtype, backward, k.prepare24_cutlass_amax,
                                    prepare)

    def _compressed(self, operand: FP8Operand, transposed: bool) -> ops.SparseOperand:
        if transposed:
            if operand.compressed_t is None:  # a fused operand made without it: kernel 22 again, same scale
                operand.compressed_t = (operand.make_transposed() if operand.q is None
                                        else ops.compress(operand.q.t().contiguous()))
            return operand.compressed_t
        if operand.compressed is None:
            operand.compressed = ops.compress(operand.q)
        return operand.compressed

    def linear(self, x, operand: FP8Operand, bias):
        if operand.dense:
            return super().linear(x, operand, bias)
        self.engine.check(x, "x")
        tokens = x.shape[0]
        rows = _padded_rows(tokens, x)
        q_x, q_x_t, s_x, a_x = self._cast("x", _pad_rows(x, rows), transpose=True)  # q(X)^T for dW
        self._remember_forward(x, q_x, q_x_t, s_x, a_x, operand)
        self.engine.stats["sparse_products_epilogue_scale"] += 1
        z = ops.mm(self._compressed(operand, False), q_x, "k", "col", operand.scale, s_x, config=self.config)
        z = z[:tokens].to(x.dtype)
        return z if bias is None else z + bias.to(z.dtype)

    def _remember_forward(self, x, q_x, q_x_t, s_x, a_x, operand) -> None:
        import weakref
        from ..cusparselt.fp8_train import _ForwardX
        self._forward_x = _ForwardX(weakref.ref(x), x._version, q_x, q_x_t, s_x, a_x, w_amax=operand.amax,
                                    host_exp=self.scaling.host_exponent("x"))

    def grad_input(self, grad_out, operand: FP8Operand):
        if operand.dense:
            return super().grad_input(grad_out, operand)
        self.engine.check(grad_out, "grad_out")
        self._record_forward()
        tokens = grad_out.shape[0]
        rows = _padded_rows(tokens, grad_out)
        q_dz, s_dz = self.quantize("dz", _pad_rows(grad_out, rows))
        self._check_e4m3(q_dz)
        self.engine.stats["sparse_products_epilogue_scale"] += 1
        dx = ops.mm(self._compressed(operand, True), q_dz, "k", "col", operand.scale, s_dz, config=self.config)
        return dx[:tokens].to(grad_out.dtype)

    def grad_weight(self, grad_out, x, mvue, seed):
        if not mvue:  # dZ^T has no 2:4 pattern: dense FP8 ("scaled_mm" engine)
            return super().grad_weight(grad_out, x, mvue, seed)
        self.engine.check(grad_out, "grad_out")
        rows = _padded_rows(grad_out.shape[0], grad_out)
        q_x, q_x_t, s_x, _ = self._x_for_backward(x, rows)
        if (self.fused_mvue and self.engine.fused and _fused_device(grad_out) and grad_out.dtype in HALF
                and self.scaling.recipe.format_of("dz_mvue") == "e4m3"):
            a, s_g = self._mvue_operand(grad_out.contiguous(), rows, seed)
        else:
            q_g, s_g = self.quantize("dz_mvue", self.engine.mvue(_pad_rows(grad_out, rows), seed))  # (rows, out)
            self._check_e4m3(q_g)
            a = ops.compress(q_g.t().contiguous())  # q(MVUE(dZ))^T (out, rows), row-major
        b = q_x_t if q_x_t is not None else q_x.t().contiguous()  # q(X)^T (in, rows): K-major B
        self.engine.stats["sparse_products_epilogue_scale"] += 1
        return ops.mm(a, b, "k", "row", s_g, s_x).to(grad_out.dtype)  # (out, in)

    def _mvue_operand(self, dz: torch.Tensor, rows: int, seed) -> tuple[ops.SparseOperand, torch.Tensor]:
        """Kernel 23: q(MVUE(dZ))^T (out, rows) compressed and its scale under the recipe (current scaling:
        after its amax pass), dZ's padding to ``rows`` read as zeros; the draw and bytes of the unfused path."""
        k, out_f = self.engine.kernels(), dz.shape[1]
        self.engine.stats["fused_mvue_compressions"] += 1

        def compress(dz_, kseed, inv_scale):
            values, metadata, amax = k.mvue_compress24_cutlass_fp8(dz_, kseed, inv_scale, tokens=rows)
            return ops.SparseOperand(values, metadata, (out_f, rows)), amax
        return fused_mvue_operand(self.scaling, dz, seed, k.mvue_compress24_cutlass_amax, compress)


def cutlass_fp8_backend(config: str | None = None) -> CutlassFP8Backend:
    """What ``get_backend("cutlass_fp8")`` builds: raises :class:`CutlassUnavailable` where it cannot run."""
    require_cutlass(NAME)
    return CutlassFP8Backend(FP8Engine(NAME, "scaled_mm"), config=config)
