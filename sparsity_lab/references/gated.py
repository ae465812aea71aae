"""Gated activations of a transformer FFN (SwiGLU, GEGLU): the plain PyTorch reference.

The FFN's up-projection produces ``h`` with ``2 * ffn`` features: the **first half is the gate**
``g``, the **second half the value** ``v``. The gated activation is

    out = act(g) * v,      act = silu (SwiGLU) or gelu with erf (GEGLU),

and its backward, for an incoming gradient ``dout``, is

    dg = dout * v * act'(g),     dv = dout * act(g),

returned stacked like ``h`` (dg in the gate half, dv in the value half), which is exactly the
gradient the up-projection needs. With ``s = sigmoid(g)``: silu'(g) = s * (1 + g * (1 - s));
with ``Phi``/``phi`` the standard normal cdf/pdf: gelu'(g) = Phi(g) + g * phi(g).

Layouts (``split_dim``)
    ``split_dim=-1``: row-major ``h`` (..., 2 * ffn), tokens in the rows (``h = X W_up^T``).
    ``split_dim=0``:  the output of the transposed product ``h^T = W_up X^T`` (2 * ffn, tokens):
                      gate rows first, then value rows; the output is (ffn, tokens), ready for the
                      next transposed product. (A sparse operand must be on the left of a
                      cuSPARSELt product, so a 2:4 FFN computes its products transposed.)
Arithmetic is float32 (float64 for float64 input); results are rounded once to ``h``'s dtype.
"""
from __future__ import annotations

import math

import torch

GATED_KINDS = ("swiglu", "geglu")


def check_gated_args(h: torch.Tensor, kind: str, split_dim: int) -> int:
    """Validate and return the normalised split dimension."""
    if kind not in GATED_KINDS:
        raise ValueError(f"kind must be one of {GATED_KINDS}, got {kind!r}")
    if not isinstance(h, torch.Tensor) or not h.dtype.is_floating_point:
        raise TypeError(f"h must be a floating-point tensor, got {getattr(h, 'dtype', type(h).__name__)}")
    if split_dim not in (0, -1, h.dim() - 1):
        raise ValueError(f"split_dim must be -1 (row-major h (..., 2*ffn)) or 0 (transposed h^T "
                         f"(2*ffn, tokens)), got {split_dim}")
    if split_dim == 0 and h.dim() != 2:
        raise ValueError(f"split_dim=0 expects the 2-D transposed product (2*ffn, tokens), got shape {tuple(h.shape)}")
    dim = split_dim % h.dim()
    if h.shape[dim] % 2:
        raise ValueError(f"h has {h.shape[dim]} features along dim {dim}; expected an even number (gate | value)")
    return dim


def _compute(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.float()


def split_gate_value(h: torch.Tensor, split_dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, value): the first and second halves of h along ``split_dim`` (views)."""
    return torch.chunk(h, 2, dim=split_dim)


def activation(g: torch.Tensor, kind: str) -> torch.Tensor:
    """act(g): silu for SwiGLU, exact (erf) gelu for GEGLU."""
    if kind == "swiglu":
        return g * torch.sigmoid(g)
    return 0.5 * g * (1.0 + torch.erf(g / math.sqrt(2.0)))


def activation_grad(g: torch.Tensor, kind: str) -> torch.Tensor:
    """act'(g)."""
    if kind == "swiglu":
        s = torch.sigmoid(g)
        return s * (1.0 + g * (1.0 - s))
    cdf = 0.5 * (1.0 + torch.erf(g / math.sqrt(2.0)))
    pdf = torch.exp(-0.5 * g * g) / math.sqrt(2.0 * math.pi)
    return cdf + g * pdf


def gated_forward(h: torch.Tensor, kind: str = "swiglu", split_dim: int = -1) -> torch.Tensor:
    """out = act(gate) * value. h (..., 2F) -> (..., F), or h^T (2F, T) -> (F, T) with split_dim=0."""
    dim = check_gated_args(h, kind, split_dim)
    g, v = split_gate_value(_compute(h), dim)
    return (activation(g, kind) * v).to(h.dtype)


def gated_backward(grad_out: torch.Tensor, h: torch.Tensor, kind: str = "swiglu",
                   split_dim: int = -1) -> torch.Tensor:
    """d out / d h contracted with grad_out: [dg | dv] shaped like h (see the module docstring)."""
    dim = check_gated_args(h, kind, split_dim)
    g, v = split_gate_value(_compute(h), dim)
    if grad_out.shape != g.shape:
        raise ValueError(f"grad_out has shape {tuple(grad_out.shape)}, expected the output's {tuple(g.shape)}")
    d = _compute(grad_out)
    dg = d * v * activation_grad(g, kind)
    dv = d * activation(g, kind)
    return torch.cat([dg, dv], dim=dim).to(h.dtype)
