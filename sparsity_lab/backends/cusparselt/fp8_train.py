"""FP8 training backends for SparseLinear: "cusparselt_fp8" (FP8 2:4), "fp8_dense" and "fp8_reference".

Per training step of a layer W (out, in), X (tokens, in), dZ (tokens, out), every product operand is
E4M3 with a per-tensor scale from the layer's recipe (``sparsity_lab.methods.fp8_scaling``: delayed or
current scaling, state in the layer's ``state_dict``):

    forward          Z  = s_x s_w   q(X) q(S(W))^T        q(S(W)): once per optimizer step
    input gradient   dX = s_dz s_w  q(dZ) q(S(W))
    weight gradient  dW = s_g s_x   q(MVUE(dZ))^T q(X)    (q(dZ)^T q(X) without MVUE)

How the products run (the engines):

* "cusparselt_fp8": all three on sparse FP8 tensor cores (cuSPARSELt through ``fp8_direct``, plans
  cached, algorithms chosen per shape by ``fp8_algorithms``, the scales applied on the device); the
  weight gradient only with MVUE (dZ^T has no
  2:4 pattern otherwise: then dense FP8). Needs a transposable 2:4 mask (S(W)^T must be 2:4 along
  ``out`` for dX) and ``in``/``out`` multiples of 64 (the Triton compressor's tiles).
  dZ is E4M3, not E5M2: cuSPARSELt refuses E5M2 operands (``results/cusparselt_fp8_h100.json``,
  "compress_e5m2"). E4M3 has one mantissa bit more and less range; with a per-tensor scale the range
  of a gradient tensor fits (tests/test_fp8_training.py measures dX's error against bfloat16).
* "fp8_dense": the same recipe on dense FP8 tensor cores (``torch._scaled_mm``, ``backends/fp8_dense.py``)
  with the masked weight: the FP8 baseline with the same numerics but no sparse speed-up.
* "fp8_reference": the same recipe in float32 arithmetic on dequantized operands
  (``references/fp8_products.py``); runs anywhere.
  It is what the other two are tested against, and what they fall back to without a CUDA GPU (with a
  ``BackendFallbackWarning``).

Compared with the simulation "torch_fp8sim" (S-STE's recipe: current scaling, dZ in E5M2, dZ rounded
*before* MVUE): here dZ is E4M3, delayed scaling is the default, and MVUE(dZ) is rounded after MVUE
(the sparse tensor cores multiply an FP8 operand: the MVUE output must itself be FP8). With
``FP8Recipe(scaling="current", grad_format="e5m2")`` the forward and input-gradient products equal
the simulation's.

Where each sparse product's two scales are applied is the recipe's ``scale_in_product``: "pass" (the
default) multiplies its output in one pass of its own (``kernels/scale_product.py``): cuSPARSELt 0.8 applies
neither device scale inside an FP8 2:4 product on the H100 (``fp8_direct``). "host_alpha" gives the product
``alpha = s_a s_b`` as a host float (power-of-two scales the host holds one step late,
``methods/fp8_scaling``), applied inside the product: no pass. Each operand keeps the host exponent of the
scale it was quantized with (``FP8Operand.host_exp``, ``_ForwardX.host_exp``), so the alpha of a product is
always the product of its operands' quantization scales. Where the algorithm search found that a scalar
alpha does not scale a product (``FP8Choice.host_alpha``), that product runs with the pass instead, said
once in a ``BackendFallbackWarning`` and counted (``stats["host_alpha_refused"]``); ``stats`` also counts
the sparse products called each way ("sparse_products_host_alpha", "sparse_products_pass"; a product
captured in a CUDA graph counts once per capture). The reference engine computes the same: its products
multiply by the host alpha (a Python float) where the recipe gives one.

q(X) is made once, in the forward, by one cast kernel that also writes q(X)^T (the layout the weight
gradient's product reads, ``kernels/fp8_cast_transpose.py``): the backward reuses both (no second
cast, no transpose copy). The amaxes of X and S(W) enter the history when the forward's backward runs,
so an evaluation forward (no backward, e.g. under ``torch.no_grad()``) records nothing; the price is that
q(X) and q(X)^T of the latest forward stay alive until the next forward or backward of the layer.

Each layer gets its own :class:`FP8Backend` (``Backend.for_layer``): an ``nn.Module`` holding the
layer's :class:`~sparsity_lab.methods.fp8_scaling.FP8ScalingState`, so the state is in the layer's
``state_dict`` (under ``backend.scaling.``); the :class:`FP8Engine` it points to holds what the layers
of one backend name share (the cuSPARSELt plans and algorithm choices, counters).
"""
from __future__ import annotations

import math
import weakref
import warnings
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...methods.fp8_scaling import FP8Recipe, FP8ScalingState, quantize_reference
from ...references import fp8_products as reference
from ...references.fp8 import amax as amax_of, quantize_with_inv_scale
from .. import fp8_dense as dense
from .fp8_masks import FP8MaskWork
from .fp8_operand import HALF, FP8Operand, fused_mvue_operand, fused_weight_operand
from ..base import Backend, MvueSeed, kernel_seed
from ..report import BackendReport
from ..torch_reference import TorchBackend, generator_on

NAMES = {"cusparselt_fp8": "cusparselt", "fp8_dense": "scaled_mm", "fp8_reference": "reference"}
ENGINES = ("reference", "scaled_mm", "cusparselt")
TOKEN_MULTIPLE = 64  # tokens padded to this for the FP8 tensor-core products (zero rows change nothing)


def _padded_rows(tokens: int, t: torch.Tensor) -> int:
    """Tokens rounded up to the products' row multiple (64 on CUDA, 4 elsewhere)."""
    multiple = TOKEN_MULTIPLE if t.is_cuda else 4
    return -(-tokens // multiple) * multiple


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    return x if x.shape[0] == rows else F.pad(x, (0, 0, 0, rows - x.shape[0]))


# the weight gradient's (B transposed, result transposed) layouts, in order of preference (the first that
# cuSPARSELt runs is used). A transposed result is dW^T's memory: as the gradient of a row-major weight,
# autograd copies it to the weight's layout, a strided copy (measured on the H200: docs/measuring.md, "Where the
# FP8 FFN step's time goes"), so a row-major dW comes first.
GRAD_WEIGHT_LAYOUTS = ((True, False), (False, False), (True, True))


@dataclass
class _ForwardX:
    """What the forward leaves for the backward: q(X) (padded rows), q(X)^T (GPU engines), s_x, X's amax
    and the amax of the S(W) it multiplied (both recorded by the backward, once)."""

    x: weakref.ref
    version: int
    q: torch.Tensor
    q_t: torch.Tensor | None
    scale: torch.Tensor
    amax: torch.Tensor
    w_amax: torch.Tensor | None = None
    recorded: bool = False
    host_exp: int | None = None  # log2 of ``scale`` on the host ("host_alpha" recipes)


def _alpha(e_a: int | None, e_b: int | None) -> float | None:
    """s_a s_b as a host float from the two scales' host exponents (exact), None if either is on the device only."""
    return None if e_a is None or e_b is None else math.ldexp(1.0, e_a + e_b)


class FP8Engine:
    """What the layers of one backend name share: how the products run (``engine``, one of
    ``ENGINES``), the cuSPARSELt products (plans, algorithm choices) and counters."""

    def __init__(self, name: str, engine: str, fallback_reason: str | None = None, fused: bool = True) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        self.name, self.engine, self.fallback_reason = name, engine, fallback_reason
        # kernels 18, 19 and 21 on the sparse engine (W's cast and both compressions in one pass; MVUE(dZ)'s
        # cast and compression in one pass; the mask refresh and its flips in one pass); fused=False brings
        # back the unfused kernels for a benchmark's A/B run: the bytes are the same
        self.fused = bool(fused)
        self.reference = TorchBackend()
        self._triton = None
        self._sparse = None
        self.stats: Counter = Counter()  # "x_requantized": backward calls that could not reuse the forward's q(X)
        self._refused_keys: set = set()  # product keys whose host-alpha refusal was already warned about

    def __deepcopy__(self, memo):
        return self  # one per process (plans, algorithm choices): a deep-copied model shares it

    def masks_on(self, t: torch.Tensor) -> Backend:
        """The Triton kernels for CUDA tensors, the reference elsewhere (masks, soft threshold, decay)."""
        if t.is_cuda:
            if self._triton is None:
                from ..triton import TritonBackend
                self._triton = TritonBackend()
            return self._triton
        return self.reference

    @staticmethod
    def kernels():
        import sparsity_lab.kernels as kernels  # triton: only when a CUDA tensor needs it
        return kernels

    @property
    def sparse(self):
        if self._sparse is None:
            from .fp8_algorithms import FP8SparseProducts
            self._sparse = FP8SparseProducts()
        return self._sparse

    def check(self, t: torch.Tensor, what: str) -> None:
        """Refuse an operand the GPU engines cannot multiply (not CUDA, not bfloat16/float16)."""
        if self.engine == "reference":
            return
        if not t.is_cuda:
            raise ValueError(f"{what} is on {t.device}; backend {self.name!r} runs its products on CUDA tensors: move "
                             "the model and its inputs to the GPU (or use backend='fp8_reference')")
        if t.dtype not in HALF:
            raise TypeError(f"backend {self.name!r} runs bfloat16/float16 layers, but {what} is {t.dtype}: run under "
                            "torch.autocast('cuda', dtype=torch.bfloat16) or convert the model to bfloat16")

    def engine_for(self, operand: FP8Operand) -> str:
        """The engine of this operand's products: a dense phase's W runs dense FP8 on the sparse engine."""
        engine = self.engine
        return "scaled_mm" if operand.dense and engine == "cusparselt" else engine

    def mvue(self, dz: torch.Tensor, seed: MvueSeed | None) -> torch.Tensor:
        """MVUE(dZ), groups of 4 along the tokens: the Triton kernel on CUDA (the draws of backends
        "triton" and "cusparselt" for the same seed), the reference elsewhere."""
        if dz.is_cuda:
            return self.kernels().mvue24(dz, dim=0, seed=kernel_seed(seed))
        from ...methods.mvue import mvue24
        return mvue24(dz, dim=0, generator=generator_on(dz.device, seed), check=False)

    def mvue_compressed(self, dz: torch.Tensor, seed: MvueSeed | None, state: FP8ScalingState
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """(compressed q(MVUE(dZ))^T, its scale) by kernel 19 under ``state``'s recipe (``fused_mvue_operand``)."""
        k = self.kernels()
        return fused_mvue_operand(state, dz, seed, k.mvue24_amax, k.mvue_compress24_fp8)

    def sparse_mm(self, a, b, s_a, s_b, choice, alpha: float | None) -> torch.Tensor:
        """The chosen sparse product, scaled inside by ``alpha`` (a host float) where one is given and the
        search found the scalar alpha honoured; else as ``choice.mode`` says (the pass), counted, and where
        an alpha was refused, said once per product in a warning."""
        if alpha is not None and choice.mode == "multiply_after" and not choice.host_alpha_ok:
            self.stats["host_alpha_refused"] += 1
            key = (tuple(a.shape), tuple(b.shape), choice.layout)
            if key not in self._refused_keys:
                self._refused_keys.add(key)
                from .backend import BackendFallbackWarning
                warnings.warn(f"backend {self.name!r}: the recipe gives this FP8 2:4 product (A {tuple(a.shape)}, B "
                              f"{tuple(b.shape)}) a host alpha, but cuSPARSELt did not apply a scalar alpha to it in "
                              f"the algorithm search ({choice.host_alpha}): its scales are applied by the pass after "
                              "it instead", BackendFallbackWarning, stacklevel=4)
            alpha = None
        elif choice.mode != "multiply_after":  # the scales reach the product inside already
            alpha = None
        self.stats["sparse_products_host_alpha" if alpha is not None else "sparse_products_pass"] += 1
        return self.sparse.mm(a, b, s_a, s_b, choice, alpha=alpha)

    def sparse_grad_weight(self, a, s_g, q_x, q_x_t, s_x, rows: int, grad_out: torch.Tensor,
                           alpha: float | None = None) -> torch.Tensor:
        """dW = s_g s_x A q(X) on sparse FP8 tensor cores, A = q(MVUE(dZ))^T compressed (out, rows); alpha:
        s_g s_x as a host float ("host_alpha" recipes) or None."""
        out_f, in_f = grad_out.shape[1], q_x.shape[1]
        choice = self.sparse.choose(out_f, rows, in_f, GRAD_WEIGHT_LAYOUTS, grad_out.device)
        b_transposed, transpose_result = choice.layout
        if b_transposed:  # B = q(X) as the .t() of the contiguous q(X)^T (in, rows)
            b = (q_x_t if q_x_t is not None else q_x.t().contiguous()).t()
        else:
            b = q_x
        dw = self.sparse_mm(a, b, s_g, s_x, choice, alpha)
        return (dw.t() if transpose_result else dw).to(grad_out.dtype)


class FP8Backend(FP8MaskWork, Backend, BackendReport, nn.Module):
    """An FP8 backend with its own scaling state (``scaling``, an :class:`FP8ScalingState`).

    ``get_backend(name)`` gives one (its state shared by whoever calls it directly, e.g. a product
    benchmark); ``for_layer`` gives each SparseLinear its own, with the same engine."""

    reads_seed_from_device = True  # MVUE on CUDA tensors is the Triton kernel, which reads a device seed
    products_in_dense_phase = True  # a Dense method or the dense fine-tune stays FP8 (dense FP8 products)
    mask_refresh_capturable = True  # 2:4 masks and flip counts on CUDA tensors are the Triton kernels

    def __init__(self, engine: FP8Engine, recipe: FP8Recipe | None = None, device=None) -> None:
        nn.Module.__init__(self)
        self.engine = engine
        self.name = engine.name
        self.scaling = FP8ScalingState(recipe, device=device)
        self._forward_x: _ForwardX | None = None

    @property
    def fallback_reason(self) -> str | None:
        return self.engine.fallback_reason

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_forward_x"] = None  # the latest forward's q(X) (and a weak reference) is not saved
        return state

    @property
    def stats(self):
        return self.engine.stats

    def for_layer(self, layer: nn.Module) -> "FP8Backend":
        return FP8Backend(self.engine, self.scaling.recipe, device=layer.weight.device)

    def set_recipe(self, recipe: FP8Recipe) -> None:
        """A fresh scaling state with ``recipe`` (history and scales start over)."""
        self.scaling = FP8ScalingState(recipe, device=self.scaling.scale.device)

    def advance_step(self) -> None:
        """End of an optimizer step (``SparseLinear.advance_step``): the recipe's update."""
        self.scaling.advance()

    def graph_constants(self) -> tuple:
        """The host exponents a captured sparse product holds as its alpha ("host_alpha" recipes on the
        sparse engine; None before they exist), else nothing: ``CudaGraphStep`` recaptures when they change."""
        if not self.scaling.recipe.lag or self.engine.engine != "cusparselt":
            return ()
        return (self.scaling.host_exponents,)

    def product_plan(self, out_features: int, in_features: int, mvue: bool) -> dict[str, str]:
        kind = {"reference": "float32 products of FP8 operands (reference)",
                "scaled_mm": "dense FP8 E4M3 (torch._scaled_mm)",
                "cusparselt": "2:4 sparse FP8 E4M3 (cuSPARSELt)"}[self.engine.engine]
        plan = dict.fromkeys(("forward", "grad_input", "grad_weight"), kind)
        if self.engine.engine == "cusparselt" and not mvue:  # dZ^T has no 2:4 pattern without MVUE
            plan["grad_weight"] = "dense FP8 E4M3 dZ^T X (torch._scaled_mm)"
        return plan

    # --- quantization -----------------------------------------------------------------------------------
    def quantize(self, tensor: str, x: torch.Tensor, record: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, scale) of x as ``tensor`` (one of ``fp8_scaling.TENSORS``) under this backend's recipe:
        the Triton cast kernel on CUDA (one pass with delayed scaling), the reference elsewhere."""
        q, _, scale, a = self._cast(tensor, x, transpose=False)
        if record:
            self.scaling.record(tensor, a)
        return q, scale

    def _cast(self, tensor: str, x: torch.Tensor, transpose: bool):
        """(q, q^T or None, scale, amax of x); records nothing. ``transpose``: also write q^T (CUDA)."""
        state = self.scaling
        if not x.is_cuda:
            scale, inv_scale, a = state.scales_for(tensor, x)
            q = quantize_with_inv_scale(x, inv_scale, state.recipe.format_of(tensor))
            return q, None, scale, (a if a is not None else amax_of(x))
        k = self.engine.kernels()
        fmt = state.recipe.format_of(tensor)
        if state.uses_history:
            scale, inv_scale, _ = state.scales_for(tensor, x)
        else:  # current scaling (or the first step): the amax first, a pass of its own
            scale, inv_scale, _ = state.scales_for(tensor, x, observed_amax=k.amax(x))
        if transpose:
            q, q_t, a = k.quantize_fp8_transposed(x, inv_scale.reshape(()), fmt)
            return q, q_t, scale, a
        q, a = k.quantize_fp8_with_scale(x, inv_scale.reshape(()), fmt)
        return q, None, scale, a

    # --- products ---------------------------------------------------------------------------------------
    def prepare(self, sparse_weight: torch.Tensor, transposed: bool | None = None) -> FP8Operand:
        """q(W) and its scale; ``transposed`` (default: on the dense engine) also q(W)^T, for dX's dense
        FP8 product, from the same cast."""
        if sparse_weight.dim() != 2:
            raise ValueError(f"the sparse weight must be 2-D (out, in), got shape {tuple(sparse_weight.shape)}")
        self.engine.check(sparse_weight, "the layer's weight")
        w = sparse_weight.contiguous()
        # zeros stay zeros: the 2:4 pattern survives the cast. The amax is recorded by a backward that
        # uses the operand (``_record_forward``): an evaluation forward records nothing. Dense FP8 products
        # read q(W)^T for dX: one cast-transpose writes both forms (a transposing FP8 copy is slow)
        if transposed is None:
            transposed = self.engine.engine == "scaled_mm"
        q, q_t, scale, a = self._cast("w", w, transpose=transposed)
        operand = FP8Operand(w, q, scale, amax=a, host_exp=self.scaling.host_exponent("w"))
        operand.q_t = q_t
        return operand

    def prepare_masked(self, weight, mask, beta, n, m, dtype, backward: bool = True) -> FP8Operand:
        """The step's operand from the master W and the mask. On the sparse engine (CUDA, 2:4, a
        half-precision dtype) kernel 18 makes both compressed FP8 forms and amax(S(W)) in one pass
        (current scaling: after an amax pass of the same kernel); otherwise S(W), then ``prepare``."""
        if not (self.engine.fused and self.engine.engine == "cusparselt" and weight.is_cuda
                and (n, m) == (2, 4) and dtype in HALF and self.scaling.recipe.format_of("w") == "e4m3"):
            return self.prepare(self.sparse_weight_as(weight, mask, beta, n, m, dtype))
        k = self.engine.kernels()
        return fused_weight_operand(self.scaling, weight, mask, beta, dtype, backward, k.prepare24_amax,
                                    k.prepare24_fp8)

    def prepare_dense(self, weight: torch.Tensor, dtype: torch.dtype) -> FP8Operand:
        """q(W) of the dense W (out, in) for a dense phase: the products run on dense FP8 tensor cores
        (``torch._scaled_mm``) on every engine but the reference, since W has no 2:4 pattern."""
        operand = self.prepare(weight.to(dtype), transposed=self.engine.engine != "reference")
        operand.dense = True
        return operand

    def linear(self, x, operand: FP8Operand, bias):
        self.engine.check(x, "x")
        tokens, engine = x.shape[0], self.engine.engine_for(operand)
        rows = _padded_rows(tokens, x)
        # one pass: q(X) for this product and q(X)^T for the weight gradient's (GPU engines)
        q_x, q_x_t, s_x, a_x = self._cast("x", _pad_rows(x, rows), transpose=engine != "reference")
        e_x = self.scaling.host_exponent("x")
        self._forward_x = _ForwardX(weakref.ref(x), x._version, q_x, q_x_t, s_x, a_x, w_amax=operand.amax, host_exp=e_x)
        alpha = _alpha(e_x, operand.host_exp)
        if engine == "reference":
            z = reference.reference_forward(q_x, s_x, operand.q, operand.scale, x.dtype, alpha=alpha)
        elif engine == "scaled_mm":
            z = dense.scaled_mm_forward(q_x, s_x, operand.q, operand.scale)
        else:
            if operand.compressed is None:
                operand.compressed = self.engine.kernels().compress24(operand.q)
            choice = self.engine.sparse.choose(operand.shape[0], operand.shape[1], rows, [(True, True)], x.device)
            z = self.engine.sparse_mm(operand.compressed, q_x.t(), operand.scale, s_x, choice, alpha)
        z = z[:tokens].to(x.dtype)
        return z if bias is None else z + bias.to(z.dtype)

    def _record_forward(self) -> None:
        """The amaxes of the forward's X and S(W) into the history, once per forward, when its backward
        runs: a forward without a backward (evaluation, ``torch.no_grad()``) leaves the history alone."""
        fx = self._forward_x
        if fx is not None and not fx.recorded:
            self.scaling.record("x", fx.amax)
            if fx.w_amax is not None:
                self.scaling.record("w", fx.w_amax)
            fx.recorded = True

    def grad_input(self, grad_out, operand: FP8Operand):
        self.engine.check(grad_out, "grad_out")
        self._record_forward()
        tokens, engine = grad_out.shape[0], self.engine.engine_for(operand)
        rows = _padded_rows(tokens, grad_out)
        q_dz, s_dz = self.quantize("dz", _pad_rows(grad_out, rows))
        alpha = _alpha(self.scaling.host_exponent("dz"), operand.host_exp)
        if engine == "reference":
            dx = reference.reference_grad_input(q_dz, s_dz, operand.q, operand.scale, grad_out.dtype, alpha=alpha)
        elif engine == "scaled_mm":
            if operand.q_t is None:
                operand.q_t = operand.q.t().contiguous()
            dx = dense.scaled_mm_grad_input(q_dz, s_dz, operand.q_t, operand.scale)
        else:
            if operand.compressed_t is None:  # q(S(W))^T: 2:4 along out (transposable mask), read strided
                operand.compressed_t = (operand.make_transposed() if operand.q is None
                                        else self.engine.kernels().compress24(operand.q.t()))
            choice = self.engine.sparse.choose(operand.shape[1], operand.shape[0], rows, [(True, True)],
                                               grad_out.device)
            dx = self.engine.sparse_mm(operand.compressed_t, q_dz.t(), operand.scale, s_dz, choice, alpha)
        return dx[:tokens].to(grad_out.dtype)

    def _x_for_backward(self, x: torch.Tensor, rows: int):
        """(q(X), q(X)^T or None, s_x, host exponent of s_x or None) of the forward when this is its x (same
        tensor, unchanged), else X cast again with the same scale (nothing advanced in between), counted in
        ``stats``."""
        self._record_forward()
        fx, self._forward_x = self._forward_x, None
        if fx is not None and fx.x() is x and fx.version == x._version and fx.q.shape[0] == rows:
            return fx.q, fx.q_t, fx.scale, fx.host_exp
        self.engine.stats["x_requantized"] += 1
        q, q_t, scale, a = self._cast("x", _pad_rows(x, rows), transpose=self.engine.engine != "reference")
        if fx is None:  # no forward recorded this X's amax
            self.scaling.record("x", a)
        return q, q_t, scale, self.scaling.host_exponent("x")

    def grad_weight(self, grad_out, x, mvue, seed):
        self.engine.check(grad_out, "grad_out")
        tokens, engine = grad_out.shape[0], self.engine.engine
        rows = _padded_rows(tokens, grad_out)
        dz = _pad_rows(grad_out, rows)
        q_x, q_x_t, s_x, e_x = self._x_for_backward(x, rows)
        g = "dz_mvue" if mvue else "dz"
        alpha = _alpha(self.scaling.host_exponent(g), e_x)
        if (mvue and engine == "cusparselt" and self.engine.fused and dz.is_cuda
                and self.scaling.recipe.format_of("dz_mvue") == "e4m3"):
            a, s_g = self.engine.mvue_compressed(dz.contiguous(), seed, self.scaling)
            return self.engine.sparse_grad_weight(a, s_g, q_x, q_x_t, s_x, rows, grad_out, alpha)
        if engine != "reference" and not mvue:  # a dense FP8 product: q(dZ)^T from the cast, not a copy
            q_g, q_g_t, s_g, a = self._cast(g, dz, transpose=True)
            self.scaling.record(g, a)
            return dense.scaled_mm_grad_weight(q_g, s_g, q_x, s_x, q_x_t, q_g_t).to(grad_out.dtype)
        q_g, s_g = self.quantize(g, self.engine.mvue(dz, seed) if mvue else dz)
        if engine == "reference":
            return reference.reference_grad_weight(q_g, s_g, q_x, s_x, grad_out.dtype, alpha=alpha)
        if engine == "scaled_mm":
            return dense.scaled_mm_grad_weight(q_g, s_g, q_x, s_x, q_x_t).to(grad_out.dtype)
        a = self.engine.kernels().compress24(q_g.t())  # q(MVUE(dZ))^T (out, rows), 2:4 along the tokens
        return self.engine.sparse_grad_weight(a, s_g, q_x, q_x_t, s_x, rows, grad_out, alpha)

    def summary(self) -> dict:
        out = super().summary()
        out["scale_in_product"] = self.scaling.recipe.scale_in_product
        if self.engine._sparse is not None:
            out["algorithms"] = self.engine.sparse.summary()
        return out


def fp8_training_backend(name: str) -> FP8Backend:
    """What ``get_backend(name)`` builds for the three names; the GPU engines fall back to the
    reference (with a ``BackendFallbackWarning``) where no CUDA GPU is available."""
    engine = NAMES[name]
    if engine != "reference" and not torch.cuda.is_available():
        from .backend import BackendFallbackWarning
        reason = "no CUDA GPU is available (torch.cuda.is_available() is False)"
        warnings.warn(f"backend {name!r} was requested, but {reason}: its layers compute the same FP8 recipe in "
                      "float32 arithmetic ('fp8_reference') instead", BackendFallbackWarning, stacklevel=3)
        return FP8Backend(FP8Engine(f"fp8_reference (fallback for {name})", "reference", fallback_reason=reason))
    return FP8Backend(FP8Engine(name, engine))


def set_fp8_recipe(model: nn.Module, recipe: FP8Recipe) -> int:
    """Give every FP8 layer of ``model`` a fresh scaling state with ``recipe``; returns how many."""
    if not isinstance(recipe, FP8Recipe):
        raise TypeError(f"recipe must be an FP8Recipe, got {type(recipe).__name__}")
    found = [m for m in model.modules() if isinstance(m, FP8Backend)]
    for backend in found:
        backend.set_recipe(recipe)
    return len(found)
