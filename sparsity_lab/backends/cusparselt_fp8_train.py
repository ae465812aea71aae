"""FP8 training backends for SparseLinear: "cusparselt_fp8" (FP8 2:4), "fp8_dense" and "fp8_reference".

Per training step of a layer W (out, in), X (tokens, in), dZ (tokens, out), every product operand is
E4M3 with a per-tensor scale from the layer's recipe (``sparsity_lab.fp8_scaling``: delayed or
current scaling, state in the layer's ``state_dict``):

    forward          Z  = s_x s_w   q(X) q(S(W))^T        q(S(W)): once per optimizer step
    input gradient   dX = s_dz s_w  q(dZ) q(S(W))
    weight gradient  dW = s_g s_x   q(MVUE(dZ))^T q(X)    (q(dZ)^T q(X) without MVUE)

How the products run (``fp8_products``):

* "cusparselt_fp8": all three on sparse FP8 tensor cores (cuSPARSELt, plans cached, the scales
  applied on the device in the product's epilogue); the weight gradient only with MVUE (dZ^T has no
  2:4 pattern otherwise: then dense FP8). Needs a transposable 2:4 mask (S(W)^T must be 2:4 along
  ``out`` for dX) and ``in``/``out`` multiples of 64 (the Triton compressor's tiles).
  dZ is E4M3, not E5M2: cuSPARSELt refuses E5M2 operands (``results/cusparselt_fp8_h100.json``,
  "compress_e5m2"). E4M3 has one mantissa bit more and less range; with a per-tensor scale the range
  of a gradient tensor fits (tests/test_fp8_training.py measures dX's error against bfloat16).
* "fp8_dense": the same recipe on dense FP8 tensor cores (``torch._scaled_mm``) with the masked
  weight: the FP8 baseline with the same numerics but no sparse speed-up.
* "fp8_reference": the same recipe in float32 arithmetic on dequantized operands; runs anywhere.
  It is what the other two are tested against, and what they fall back to without a CUDA GPU (with a
  ``BackendFallbackWarning``).

Compared with the simulation "torch_fp8sim" (S-STE's recipe: current scaling, dZ in E5M2, dZ rounded
*before* MVUE): here dZ is E4M3, delayed scaling is the default, and MVUE(dZ) is rounded after MVUE
(the sparse tensor cores multiply an FP8 operand: the MVUE output must itself be FP8). With
``FP8Recipe(scaling="current", grad_format="e5m2")`` the forward and input-gradient products equal
the simulation's.

Each layer gets its own :class:`FP8LayerBackend` (``for_layer``): an ``nn.Module`` holding the
layer's :class:`~sparsity_lab.fp8_scaling.FP8ScalingState`; the process-wide :class:`FP8Training`
keeps what layers share (the cuSPARSELt plans and algorithm choices).
"""
from __future__ import annotations

import warnings
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from ..fp8_scaling import FP8Recipe, FP8ScalingState, quantize_reference
from ..methods.flip_rate import mask_flips_tensor
from . import fp8_products as products
from .torch_reference import TorchBackend, generator_on

NAMES = {"cusparselt_fp8": "cusparselt", "fp8_dense": "scaled_mm", "fp8_reference": "reference"}
HALF = (torch.bfloat16, torch.float16)


class FP8Operand:
    """One optimizer step's weight operand: S(W) (compute dtype), q(S(W)) E4M3 and its scale; the
    compressed forms (sparse engine) and q(S(W))^T (dense engine) made on first use."""

    def __init__(self, weight: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
        self.weight, self.q, self.scale = weight, q, scale
        self.compressed: torch.Tensor | None = None
        self.compressed_t: torch.Tensor | None = None
        self.q_t: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)


class FP8Training:
    """What the layers of one backend name share: the engine, and for the sparse engine the
    cuSPARSELt products (plans, algorithm choices). ``for_layer`` gives a layer its own backend."""

    def __init__(self, name: str, engine: str, recipe: FP8Recipe | None = None,
                 fallback_reason: str | None = None) -> None:
        if engine not in products.ENGINES:
            raise ValueError(f"engine must be one of {products.ENGINES}, got {engine!r}")
        self.name, self.engine = name, engine
        self.recipe = recipe if recipe is not None else FP8Recipe()
        self.fallback_reason = fallback_reason
        self._reference = TorchBackend()
        self._triton = None
        self._sparse: products.FP8SparseProducts | None = None
        self.stats: Counter = Counter()  # e.g. "x_requantized": backward calls that could not reuse q(X)

    def __deepcopy__(self, memo):
        return self  # one per process (plans, algorithm choices): a deep-copied model shares it

    def for_layer(self, layer: nn.Module) -> "FP8LayerBackend":
        return FP8LayerBackend(self, FP8ScalingState(self.recipe, device=layer.weight.device))

    # --- masks and weights: Triton kernels on CUDA tensors, the reference elsewhere -------------------
    def masks_on(self, t: torch.Tensor):
        if t.is_cuda:
            if self._triton is None:
                from .triton_backend import TritonBackend
                self._triton = TritonBackend()
            return self._triton
        return self._reference

    def kernels(self):
        from .. import kernels  # triton: only when a CUDA tensor needs it
        return kernels

    @property
    def sparse(self) -> products.FP8SparseProducts:
        if self._sparse is None:
            self._sparse = products.FP8SparseProducts()
        return self._sparse


class FP8LayerBackend(nn.Module):
    """One layer's FP8 backend: the shared engine plus this layer's scaling state (``scaling``)."""

    def __init__(self, shared: FP8Training, scaling: FP8ScalingState) -> None:
        super().__init__()
        self.shared = shared
        self.name = shared.name
        self.scaling = scaling
        self._x_cache: tuple | None = None  # (x, its version, padded q(X), s_x) from the forward

    @property
    def fallback_reason(self) -> str | None:
        return self.shared.fallback_reason

    def set_recipe(self, recipe: FP8Recipe) -> None:
        """A fresh scaling state with ``recipe`` (history and scales start over)."""
        self.scaling = FP8ScalingState(recipe, device=self.scaling.scale.device)

    def advance_step(self) -> None:
        """End of an optimizer step (``SparseLinear.advance_step``): the recipe's update."""
        self.scaling.advance()

    # --- masks, weights, decay --------------------------------------------------------------------------
    def mask(self, weight, n, m, transposable):
        out_f, in_f = weight.shape
        if self.shared.engine == "cusparselt":
            if (n, m) != (2, 4) or not transposable:
                raise ValueError(f"backend {self.name!r} runs dX = dZ S(W) on 2:4 sparse tensor cores, which needs a "
                                 f"transposable 2:4 mask: use e.g. STE(transposable=True, backend={self.name!r}) "
                                 f"(got n={n}, m={m}, transposable={transposable}), or backend='fp8_dense'")
            if out_f % 64 or in_f % 64:
                raise ValueError(f"backend {self.name!r} needs in_features and out_features that are multiples of 64 "
                                 f"(the FP8 compressor's tiles), got a weight ({out_f}, {in_f}): resize the layer "
                                 "or use backend='fp8_dense'")
        elif self.shared.engine == "scaled_mm" and (out_f % 16 or in_f % 16):
            raise ValueError(f"backend {self.name!r} (torch._scaled_mm) needs in_features and out_features that are "
                             f"multiples of 16, got a weight ({out_f}, {in_f})")
        if weight.is_cuda and (n, m) == (2, 4):
            return self.shared.masks_on(weight).mask(weight, n, m, transposable)
        return self.shared._reference.mask(weight, n, m, transposable)

    def sparse_weight(self, weight, mask, beta, n, m):
        if weight.is_cuda and (n, m) == (2, 4):
            return self.shared.masks_on(weight).sparse_weight(weight, mask, beta, n, m)
        return self.shared._reference.sparse_weight(weight, mask, beta, n, m)

    def sparse_weight_as(self, weight, mask, beta, n, m, dtype):
        if weight.is_cuda and beta is not None and (n, m) == (2, 4):
            return self.shared.kernels().soft_threshold24(weight, mask, beta, out_dtype=dtype)
        if beta is None:
            return weight.to(dtype) * mask
        return self.sparse_weight(weight, mask, beta, n, m).to(dtype)

    def mask_flips(self, previous, current):
        if previous.is_cuda:
            return self.shared.kernels().count_flips(previous, current)
        return mask_flips_tensor(previous, current)

    def masked_decay_(self, grad, weight, mask, decay):
        self.shared.masks_on(grad).masked_decay_(grad, weight, mask, decay)

    # --- quantization -----------------------------------------------------------------------------------
    def quantize(self, tensor: str, x: torch.Tensor, record: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, scale) of x as ``tensor`` (one of ``fp8_scaling.TENSORS``) under this layer's recipe:
        the Triton cast kernel on CUDA (one pass with delayed scaling), the reference elsewhere."""
        state = self.scaling
        if not x.is_cuda:
            return quantize_reference(state, tensor, x, record)
        k = self.shared.kernels()
        fmt = state.recipe.format_of(tensor)
        if state.uses_history:
            scale, inv_scale, _ = state.scales_for(tensor, x)
            q, a = k.quantize_fp8_with_scale(x, inv_scale, fmt)
        else:
            a = k.amax(x)
            scale, inv_scale, a = state.scales_for(tensor, x, observed_amax=a)
            q, _ = k.quantize_fp8_with_scale(x, inv_scale.reshape(()), fmt)
        if record:
            state.record(tensor, a)
        return q, scale

    # --- products ---------------------------------------------------------------------------------------
    def _check(self, t: torch.Tensor, what: str) -> None:
        if self.shared.engine == "reference":
            return
        if not t.is_cuda:
            raise ValueError(f"{what} is on {t.device}; backend {self.name!r} runs its products on CUDA tensors: move "
                             "the model and its inputs to the GPU (or use backend='fp8_reference')")
        if t.dtype not in HALF:
            raise TypeError(f"backend {self.name!r} runs bfloat16/float16 layers, but {what} is {t.dtype}: run under "
                            "torch.autocast('cuda', dtype=torch.bfloat16) or convert the model to bfloat16")

    @staticmethod
    def _rows(tokens: int, t: torch.Tensor) -> int:
        multiple = products.TOKEN_MULTIPLE if t.is_cuda else 4
        return -(-tokens // multiple) * multiple

    @staticmethod
    def _pad(x: torch.Tensor, rows: int) -> torch.Tensor:
        return x if x.shape[0] == rows else F.pad(x, (0, 0, 0, rows - x.shape[0]))

    def prepare(self, sparse_weight: torch.Tensor) -> FP8Operand:
        if sparse_weight.dim() != 2:
            raise ValueError(f"the sparse weight must be 2-D (out, in), got shape {tuple(sparse_weight.shape)}")
        self._check(sparse_weight, "the layer's weight")
        w = sparse_weight.contiguous()
        q, scale = self.quantize("w", w)  # zeros stay zeros: the 2:4 pattern survives the cast
        return FP8Operand(w, q, scale)

    def linear(self, x, operand: FP8Operand, bias):
        self._check(x, "x")
        tokens, engine = x.shape[0], self.shared.engine
        training = torch.is_grad_enabled()
        rows = self._rows(tokens, x)
        q_x, s_x = self.quantize("x", self._pad(x, rows), record=training)
        self._x_cache = (x, x._version, q_x, s_x) if training else None
        out_f = operand.shape[0]
        if engine == "reference":
            z = products.reference_forward(q_x, s_x, operand.q, operand.scale, x.dtype)
        elif engine == "scaled_mm":
            z = products.scaled_mm_forward(q_x, s_x, operand.q, operand.scale)
        else:
            if operand.compressed is None:
                operand.compressed = self.shared.kernels().compress24(operand.q)
            choice = self.shared.sparse.choose(out_f, operand.shape[1], rows, [(True, True)], x.device)
            z = self.shared.sparse.mm(operand.compressed, q_x.t(), operand.scale, s_x, choice)
        z = z[:tokens].to(x.dtype)
        return z if bias is None else z + bias.to(z.dtype)

    def grad_input(self, grad_out, operand: FP8Operand):
        self._check(grad_out, "grad_out")
        tokens, engine = grad_out.shape[0], self.shared.engine
        rows = self._rows(tokens, grad_out)
        q_dz, s_dz = self.quantize("dz", self._pad(grad_out, rows))
        in_f = operand.shape[1]
        if engine == "reference":
            dx = products.reference_grad_input(q_dz, s_dz, operand.q, operand.scale, grad_out.dtype)
        elif engine == "scaled_mm":
            if operand.q_t is None:
                operand.q_t = operand.q.t().contiguous()
            dx = products.scaled_mm_grad_input(q_dz, s_dz, operand.q_t, operand.scale)
        else:
            if operand.compressed_t is None:  # q(S(W))^T: 2:4 along out (transposable mask), read strided
                operand.compressed_t = self.shared.kernels().compress24(operand.q.t())
            choice = self.shared.sparse.choose(in_f, operand.shape[0], rows, [(True, True)], grad_out.device)
            dx = self.shared.sparse.mm(operand.compressed_t, q_dz.t(), operand.scale, s_dz, choice)
        return dx[:tokens].to(grad_out.dtype)

    def _mvue(self, dz: torch.Tensor, generator) -> torch.Tensor:
        """MVUE(dZ), groups of 4 along the tokens: the Triton kernel on CUDA (the draws of backends
        "triton" and "cusparselt" for the same seed), the reference elsewhere."""
        if dz.is_cuda:
            from .triton_backend import TritonBackend
            return self.shared.kernels().mvue24(dz, dim=0, seed=TritonBackend._seed(generator))
        from ..methods.mvue import mvue24
        return mvue24(dz, dim=0, generator=generator_on(dz.device, generator), check=False)

    def _q_x_for_backward(self, x: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """q(X) of the forward when this is its x (same tensor, unchanged), else quantized again (the
        same scale: nothing advanced in between)."""
        cached, self._x_cache = self._x_cache, None
        if (cached is not None and cached[0] is x and cached[1] == x._version and cached[2].shape[0] == rows):
            return cached[2], cached[3]
        self.shared.stats["x_requantized"] += 1
        return self.quantize("x", self._pad(x, rows))

    def grad_weight(self, grad_out, x, mvue, generator):
        self._check(grad_out, "grad_out")
        tokens, engine = grad_out.shape[0], self.shared.engine
        rows = self._rows(tokens, grad_out)
        dz = self._pad(grad_out, rows)
        q_x, s_x = self._q_x_for_backward(x, rows)
        if mvue:
            q_g, s_g = self.quantize("dz_mvue", self._mvue(dz, generator))
        else:
            q_g, s_g = self.quantize("dz", dz)
        if engine == "reference":
            return products.reference_grad_weight(q_g, s_g, q_x, s_x, grad_out.dtype)
        if engine == "scaled_mm" or not mvue:
            return products.scaled_mm_grad_weight(q_g, s_g, q_x, s_x).to(grad_out.dtype)
        out_f, in_f = q_g.shape[1], q_x.shape[1]
        a = self.shared.kernels().compress24(q_g.t())  # q(MVUE(dZ))^T (out, rows), 2:4 along the tokens
        choice = self.shared.sparse.choose(out_f, rows, in_f, [(False, False), (True, True)], grad_out.device)
        b_transposed, transpose_result = choice.layout
        b = q_x.t().contiguous().t() if b_transposed else q_x
        dw = self.shared.sparse.mm(a, b, s_g, s_x, choice)
        return (dw.t() if transpose_result else dw).to(grad_out.dtype)


def fp8_training_backend(name: str) -> FP8Training:
    """What ``get_backend(name)`` builds for the three names; the GPU engines fall back to the
    reference (with a ``BackendFallbackWarning``) where no CUDA GPU is available."""
    engine = NAMES[name]
    if engine != "reference" and not torch.cuda.is_available():
        from .cusparselt_backend import BackendFallbackWarning
        reason = "no CUDA GPU is available (torch.cuda.is_available() is False)"
        warnings.warn(f"backend {name!r} was requested, but {reason}: its layers compute the same FP8 recipe in "
                      "float32 arithmetic ('fp8_reference') instead", BackendFallbackWarning, stacklevel=3)
        return FP8Training(f"fp8_reference (fallback for {name})", "reference", fallback_reason=reason)
    return FP8Training(name, engine)


def register_fp8_training() -> None:
    from .base import register_backend
    for name in NAMES:
        register_backend(name, lambda name=name: fp8_training_backend(name))


def set_fp8_recipe(model: nn.Module, recipe: FP8Recipe) -> int:
    """Give every FP8 layer of ``model`` a fresh scaling state with ``recipe``; returns how many."""
    if not isinstance(recipe, FP8Recipe):
        raise TypeError(f"recipe must be an FP8Recipe, got {type(recipe).__name__}")
    found = [m for m in model.modules() if isinstance(m, FP8LayerBackend)]
    for backend in found:
        backend.set_recipe(recipe)
    return len(found)
