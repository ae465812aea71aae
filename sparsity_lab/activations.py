"""Squared ReLU, y = relu(h)^2, as one autograd function: one fused pass forward and one backward on CUDA.

The lab GPT's dense ``relu2`` FFN and ``python -m benchmarks act24``'s dense baseline call :func:`relu2`. Written as
``F.relu(h).square()`` the activation costs two elementwise passes forward and four backward; the
Triton kernels of ``kernels/relu2.py`` do each direction in one pass, so the dense baseline that the
2:4-activation speed-ups are measured against is not slowed down by an unfused activation.

Where each part runs (h of any shape; y has h's shape and dtype):

    tensor                                 forward and backward
    CUDA, fp16 / bf16 / fp32, triton       the fused kernels ``relu2_forward`` / ``relu2_backward``
    CPU (any floating dtype)               ``references.relu2``: the CPU implementation, bit for bit what
                                           autograd gives for F.relu(h).square() (tested)
    CUDA float64                           ``references.relu2`` (the kernels take 16- and 32-bit floats)
    CUDA without the triton package        ``references.relu2``, with a one-time :class:`Relu2FallbackWarning`
    under ``torch.compile``                the plain expression F.relu(h).square(), which Inductor fuses into
                                           its own generated kernels (no graph break, no custom op)
    double backward (create_graph=True)    the backward is the reference's PyTorch ops, so it stays differentiable

Numerics: on CUDA the kernels compute r = relu(h), r * r and dy * (2 r) in float32 and round once to
h's dtype; for fp16 / bf16 / fp32 inputs those products are exact in float32 before the rounding, so
the fused results equal the two-pass expression's bit for bit (PyTorch's CUDA kernels also round a
float32 result once). Only h is saved for the backward (relu(h) is recomputed there). Autocast: no
operation here is on autocast's lists, so under bf16 autocast y has h's dtype, as F.relu(h).square()
gives.
"""
from __future__ import annotations

import warnings

import torch

from .references import relu2 as reference

FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class Relu2FallbackWarning(UserWarning):
    """The fused squared ReLU was wanted on a CUDA tensor but triton is not installed: PyTorch ops run."""


_KERNELS: list = []  # [module] once the kernels were imported, [None] once triton was found missing


def _kernels():
    """``sparsity_lab.kernels.relu2``, or None (with one warning) where triton is not installed."""
    if not _KERNELS:
        try:
            from .kernels import relu2 as module
        except ModuleNotFoundError as err:
            if not (err.name or "").startswith("triton"):
                raise
            warnings.warn(f"relu2 on CUDA: the fused Triton kernels need the triton package ({err}); the plain "
                          "PyTorch expression runs instead (pip install triton)", Relu2FallbackWarning, stacklevel=3)
            module = None
        _KERNELS.append(module)
    return _KERNELS[0]


def _fused_kernels(h: torch.Tensor):
    """The kernels module when h runs fused (CUDA, 16- or 32-bit float), else None."""
    if h.device.type != "cuda" or h.dtype not in FUSED_DTYPES:
        return None
    return _kernels()


class Relu2Fn(torch.autograd.Function):
    """y = relu(h)^2; saves h only; dh = 2 relu(h) dy (0 where relu(h) <= 0)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h)
        kernels = _fused_kernels(h)
        return reference.relu2(h) if kernels is None else kernels.relu2_forward(h)

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor) -> torch.Tensor:
        (h,) = ctx.saved_tensors
        grad_y = grad_y.to(h.dtype)
        kernels = _fused_kernels(h)
        if kernels is None or torch.is_grad_enabled():  # create_graph: differentiable PyTorch ops
            return reference.relu2_grad(h, grad_y)
        return kernels.relu2_backward(grad_y, h)


def relu2(h: torch.Tensor) -> torch.Tensor:
    """Squared ReLU relu(h)^2 of a floating-point tensor h (any shape) -> y of h's shape and dtype.

    Fused Triton kernels on CUDA, the reference PyTorch ops on the CPU; see the module docstring for
    the full table (float64, no triton, torch.compile).
    """
    if not isinstance(h, torch.Tensor) or not h.is_floating_point():
        raise TypeError(f"h must be a floating-point torch.Tensor, got {type(h).__name__} "
                        f"{getattr(h, 'dtype', '')}".rstrip())
    if torch.compiler.is_compiling():
        return reference.relu2(h)  # Inductor fuses relu and square (and their backward) itself
    return Relu2Fn.apply(h)
