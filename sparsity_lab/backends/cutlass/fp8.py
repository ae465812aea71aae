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
as kernel 18 does for "cusparselt_fp8"; a mask refresh right before the step's products writes the mask,
its flips and both operands in one pass instead (kernel 24, ``kernels/refresh24_cutlass.py``) where the
scale is the history's (delayed scaling after its first step); with ``FP8Engine(fused=False)``, or an operand given as the dense
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

from ..cusparselt.fp8_operand import HALF, FP8Operand, fused_mvue_operand, fused_refresh_operand, fused_weight_operand
from ..cusparselt.fp8_train import FP8Backend, FP8Engine, _pad_rows, _padded_rows
from . import ops
from .backend import _fused_device, refresh_kernel_takes, require_cutlass

NAME = "cutlass_fp8"


class CutlassFP8Backend(FP8Backend):
    """``FP8Backend`` on the "scaled_mm" engine (dense phase, dense weight gradient) with its sparse
    products on CUTLASS (see the module docstring). ``config``: the variant of the forward and
    input-gradient products (``ops.configs(torch.float8_e4m3fn)``); None: ``ops.DEFAULT_CONFIGS``, the
    fast-accumulation schedule; "128x128x128.1x2.coop" promotes the accumulators to float32 in the K loop.
    ``fused_mvue``: the weight gradient's q(MVUE(dZ))^T from kernel 23 (with ``engine.fused``). ``fused_refresh``
    (with ``engine.fused``): a mask refresh by kernel 24, with both E4M3 operands when the products come next and
    the step's scale is the history's (``refresh_and_prepare``); False: kernels 2 and 9 and a copy (then
    kernel 22), the same mask, count and bytes."""

    fuses_refresh_and_prepare = True  # kernel 24 (delayed scaling): mask, flips and both E4M3 forms in one pass

    def __init__(self, engine: FP8Engine, recipe=None, device=None, config: str | None = None,
                 fused_mvue: bool = True, fused_refresh: bool = True) -> None:
        super().__init__(engine, recipe, device=device)
        self.config = config
        self.fused_mvue = bool(fused_mvue)
        self.fused_refresh = bool(fused_refresh)

    def for_layer(self, layer):
        return CutlassFP8Backend(self.engine, self.scaling.recipe, device=layer.weight.device, config=self.config,
                                 fused_mvue=self.fused_mvue, fused_refresh=self.fused_refresh)

    def product_plan(self, out_features, in_features, mvue):
        kind = "2:4 sparse FP8 E4M3 (CUTLASS SM90, scales in the epilogue)"
        return {"forward": kind, "grad_input": kind,
                "grad_weight": kind if mvue else "dense FP8 E4M3 dZ^T X (torch._scaled_mm)"}

    def _check_products(self, weight, n, m, transposable) -> None:
        ops.check_weight_for_products(self.name, tuple(weight.shape), n, m, transposable, torch.float8_e4m3fn, 64,
                                      "fp8_dense")

    def mask(self, weight, n, m, transposable):
        self._check_products(weight, n, m, transposable)
        return super().mask(weight, n, m, transposable)

    def _check_e4m3(self, q: torch.Tensor) -> None:
        if q.dtype != torch.float8_e4m3fn:  # CUTLASS's sparse FP8 GEMMs here take E4M3 A and B alike
            raise ValueError(f"backend {self.name!r} multiplies E4M3 operands; the recipe casts the gradient to "
                             f"{q.dtype}: use FP8Recipe(grad_format='e4m3')")

    def _fused_weight(self, weight, n, m, dtype) -> bool:
        """Whether kernels 22 and 24 write the step's E4M3 weight operands (a CUDA weight, the engine's ``fused``)."""
        return (self.engine.fused and _fused_device(weight) and (n, m) == (2, 4) and dtype in HALF
                and self.scaling.recipe.format_of("w") == "e4m3")

    @staticmethod
    def _forms(fwd, bwd, shape) -> tuple:
        """The (values, metadata) pairs a kernel wrote for W of ``shape`` (None: not written) as sparse operands."""
        out_f, in_f = shape
        return (None if fwd is None else ops.SparseOperand(*fwd, (out_f, in_f)),
                None if bwd is None else ops.SparseOperand(*bwd, (in_f, out_f)))

    def _kernel22(self, w, mask, beta, inv_scale, dtype, forward=True, transposed=True):
        """``fused_weight_operand``'s ``prepare_fn``: kernel 22's E4M3 forms of the mask as it is, and the amax."""
        fwd, bwd, amax = self.engine.kernels().prepare24_cutlass_fp8(w, mask, beta, inv_scale, dtype, forward=forward,
                                                                     transposed=transposed)
        return (*self._forms(fwd, bwd, w.shape), amax)

    def prepare_masked(self, weight, mask, beta, n, m, dtype, backward: bool = True) -> FP8Operand:
        """The step's operand from the master W and the mask: kernel 22 writes q(S(W)) (and q(S(W))^T when
        ``backward``) compressed, and amax(S(W)), in one pass (on a CUDA weight, with the engine's ``fused``);
        otherwise S(W), then ``prepare``."""
        if not self._fused_weight(weight, n, m, dtype):
            return super().prepare_masked(weight, mask, beta, n, m, dtype, backward)
        return fused_weight_operand(self.scaling, weight, mask, beta, dtype, backward,
                                    self.engine.kernels().prepare24_cutlass_amax, self._kernel22)

    def refresh_mask_(self, weight, mask, n, m, transposable, count=True):
        """The mask refresh in one pass over W where kernel 24 runs (no operand: the new mask over the old one and
        their flips, as kernels 2 and 9 and a copy give them); elsewhere ``mask``, ``mask_flips`` and a copy."""
        if not (self.fused_refresh and self.engine.fused and refresh_kernel_takes(weight, mask, n, m, transposable)):
            return super().refresh_mask_(weight, mask, n, m, transposable, count=count)
        self._check_products(weight, n, m, transposable)
        self.engine.stats["fused_refreshes"] += 1
        return self.engine.kernels().refresh24_cutlass(weight, mask, forward=False, transposed=False, count=count)[0]

    def refresh_and_prepare(self, weight, mask, beta, n, m, transposable, dtype, backward: bool = True,
                            count: bool = True):
        """``Backend.refresh_and_prepare`` in one pass over W where kernel 24 runs: the mask into ``mask``, its flips,
        q(S(W)) and (``backward``) q(S(W))^T compressed with the recipe's scale, and amax(S(W)) kept for the
        history, bit for bit the separate calls' (kernels 2, 9 and 22). That needs the scale before the pass: at
        a step whose scale is the new S(W)'s own amax (current scaling; delayed scaling's first step) the mask
        is refreshed alone (kernel 24), then kernel 22 takes the amax and writes the forms, counted in
        ``stats["refresh_then_prepare_current_scaling"]``. Elsewhere the separate calls run."""
        if not (self.fused_refresh and self._fused_weight(weight, n, m, dtype)
                and refresh_kernel_takes(weight, mask, n, m, transposable)):
            return super().refresh_and_prepare(weight, mask, beta, n, m, transposable, dtype, backward=backward,
                                               count=count)
        if not self.scaling.uses_history:
            self.engine.stats["refresh_then_prepare_current_scaling"] += 1
            return super().refresh_and_prepare(weight, mask, beta, n, m, transposable, dtype, backward=backward,
                                               count=count)
        self._check_products(weight, n, m, transposable)

        def kernel24(w, mask_, beta_, inv_scale, dtype_, transposed=True, count=True):
            flips, fwd, bwd, amax = self.engine.kernels().refresh24_cutlass_fp8(w, mask_, beta_, inv_scale, dtype_,
                                                                                transposed=transposed, count=count)
            return (flips, *self._forms(fwd, bwd, w.shape), amax)
        refreshed = fused_refresh_operand(self.scaling, weight, mask, beta, dtype, backward, count,
                                          self.engine.kernels().prepare24_cutlass_amax, self._kernel22, kernel24)
        self.engine.stats["fused_refreshes"] += 1
        return refreshed

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
