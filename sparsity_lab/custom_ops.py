"""torch.compile support: a SparseLinear call as two ``torch.library`` custom ops.

A 2:4 layer's call is more than its products: when due it recomputes the mask (and counts flips),
prepares the operand once per optimizer step, draws the MVUE seed of this call from a counter and
adds SR-STE's decay once per step. That host-side state (Python ints on the module) would make
Dynamo break the graph or recompile at every step. Under ``torch.compile`` SparseLinear therefore
calls
    sparsity_lab::sparse_linear(x, W, b, layer_key, dtype, training, grad_needed) -> (Z, ticket)
    sparsity_lab::sparse_linear_backward(dZ, x, W, ticket, layer_key, ...) -> (dX, dW, db)
whose fake (meta) implementations give only shapes and dtypes, so Dynamo traces straight through
(``fullgraph=True`` works) while the real implementations run the layer's eager code: the same
masks, counters, MVUE draws and products as without compile, on every backend (the Triton and
cuSPARSELt kernels are called from inside the op, which the compiler does not look into).
``layer_key`` names the layer in a registry of weak references; ``ticket`` hands the forward's
plan (operand, MVUE seed, decay) to its backward.

Both ops are tagged ``cudagraph_unsafe``: their Python bookkeeping must run at every call, so
Inductor's CUDA graphs (``mode="reduce-overhead"``) must not capture them; for a graphed step use
``sparsity_lab.CudaGraphStep``.
"""
from __future__ import annotations

import itertools
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor

from .layer_products import compute_dtype, products_backward, products_forward

_LAYERS: dict[int, weakref.ref] = {}
_KEYS = itertools.count()
_PLANS: dict[int, dict[int, tuple[int, object]]] = {}  # layer key -> ticket -> (layer step, plan or None)
_TICKETS = itertools.count()
_TAGS = (torch.Tag.cudagraph_unsafe,)


def register_layer(layer) -> int:
    """A key under which the custom ops find ``layer`` (held weakly)."""
    key = next(_KEYS)
    _LAYERS[key] = weakref.ref(layer, lambda _ref, key=key: (_LAYERS.pop(key, None), _PLANS.pop(key, None)))
    return key


def _layer(key: int):
    ref = _LAYERS.get(key)
    layer = ref() if ref is not None else None
    if layer is None:
        raise RuntimeError(f"sparsity_lab custom op: no live SparseLinear under key {key}")
    return layer


def _stash(key: int, step: int, plan) -> int:
    plans = _PLANS.setdefault(key, {})
    for old in [t for t, (s, _) in plans.items() if s < step]:  # forwards whose backward never came
        del plans[old]
    ticket = next(_TICKETS)
    plans[ticket] = (step, plan)
    return ticket


@torch.library.custom_op("sparsity_lab::sparse_linear", mutates_args=(), tags=_TAGS)
def sparse_linear(x: Tensor, weight: Tensor, bias: Tensor | None, layer_key: int, dtype: torch.dtype,
                  training: bool, grad_needed: bool) -> tuple[Tensor, Tensor]:
    """Z (..., out) in ``dtype`` = X S(W)^T + b (dense W in a dense phase), and a 0-d int64 CPU ticket."""
    layer = _layer(layer_key)
    plan = layer.call_plan(x, training, grad_needed, dtype)
    if plan is None:  # dense phase: nn.Linear's product, in the dtype autocast would give it
        z = F.linear(x.to(dtype), weight.to(dtype), bias.to(dtype) if bias is not None else None)
    else:
        x2 = x.reshape(-1, x.shape[-1]).to(dtype)
        z = products_forward(x2, bias, plan).reshape(*x.shape[:-1], weight.shape[0])
    ticket = _stash(layer_key, layer.step, plan) if grad_needed else -1
    return z, torch.tensor(ticket, dtype=torch.int64)


@sparse_linear.register_fake
def _sparse_linear_fake(x, weight, bias, layer_key, dtype, training, grad_needed):
    return (x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=dtype),
            torch.empty((), dtype=torch.int64, device="cpu"))


@torch.library.custom_op("sparsity_lab::sparse_linear_backward", mutates_args=(), tags=_TAGS)
def sparse_linear_backward(grad_z: Tensor, x: Tensor, weight: Tensor, ticket: Tensor, layer_key: int,
                           dtype: torch.dtype, bias_dtype: torch.dtype, need_x: bool, need_w: bool,
                           need_b: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dX, dW, db) of the forward call that issued ``ticket``; an empty tensor for each one not needed."""
    plans = _PLANS.get(layer_key, {})
    if int(ticket) not in plans:
        raise RuntimeError("sparsity_lab custom op: backward of a forward whose plan is gone (a second backward "
                           "through the same graph needs retain_graph, which the compiled layer does not support)")
    _, plan = plans.pop(int(ticket))
    x2 = x.reshape(-1, x.shape[-1]).to(dtype)
    if plan is None:  # dense phase: nn.Linear's gradients
        dz = grad_z.reshape(-1, grad_z.shape[-1]).to(dtype)
        grad_x = (dz @ weight.to(dtype)).to(x.dtype).reshape(x.shape) if need_x else None
        grad_w = (dz.t() @ x2).to(weight.dtype) if need_w else None
        grad_b = dz.sum(0).to(bias_dtype) if need_b else None
    else:
        grad_x, grad_w, grad_b = products_backward(plan, grad_z, x2, x.shape, x.dtype, weight,
                                                    bias_dtype if need_b else None, (need_x, need_w, need_b))
    # one new empty tensor per gradient not needed: a custom op's outputs may not alias each other
    return tuple(g if g is not None else x.new_empty(0) for g in (grad_x, grad_w, grad_b))


@sparse_linear_backward.register_fake
def _sparse_linear_backward_fake(grad_z, x, weight, ticket, layer_key, dtype, bias_dtype, need_x, need_w, need_b):
    return (torch.empty_like(x) if need_x else x.new_empty(0),
            torch.empty_like(weight) if need_w else x.new_empty(0),
            weight.new_empty(weight.shape[0], dtype=bias_dtype) if need_b else x.new_empty(0))


def _setup_context(ctx, inputs, output):
    x, weight, bias, layer_key, dtype, _training, _grad_needed = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.layer_key, ctx.dtype, ctx.has_bias = layer_key, dtype, bias is not None
    ctx.bias_dtype = bias.dtype if bias is not None else weight.dtype


def _backward(ctx, grad_z, _grad_ticket):
    x, weight, ticket = ctx.saved_tensors
    need_x, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2] and ctx.has_bias
    grad_x, grad_w, grad_b = torch.ops.sparsity_lab.sparse_linear_backward(
        grad_z, x, weight, ticket, ctx.layer_key, ctx.dtype, ctx.bias_dtype, need_x, need_w, need_b)
    return (grad_x if need_x else None, grad_w if need_w else None, grad_b if need_b else None,
            None, None, None, None)


sparse_linear.register_autograd(_backward, setup_context=_setup_context)


def compiled_sparse_linear(layer, x: Tensor) -> Tensor:
    """What ``SparseLinear.forward`` runs while Dynamo traces it: one custom op call. The flags and the
    products' dtype (autocast's, read at trace time) are constants of the graph, guarded by Dynamo."""
    grad_enabled = torch.is_grad_enabled()
    dtype = compute_dtype(x, layer.weight)
    z, _ticket = torch.ops.sparsity_lab.sparse_linear(
        x, layer.weight, layer.bias, layer.op_key, dtype, layer.training and grad_enabled,
        grad_enabled and layer.weight.requires_grad)
    return z
