"""Kernel 6: fused gated activations (SwiGLU, GEGLU), forward and backward.

The idea
    The FFN's up-projection output ``h`` holds the gate (first half of the features) and the value
    (second half); ``sparsity_lab.references.gated`` is the reference and documents the layout and formulas.
    Unfused, PyTorch runs split (views), the activation (reads g, writes act(g)), and the product
    (reads act(g) and v, writes out): 3 reads and 2 writes of an (tokens, ffn) tensor forward, more
    backward. Fused, one pass reads g and v and writes out (forward), or reads g, v and dout and
    writes dg and dv (backward), recomputing act(g) instead of storing it.

Layouts
    Both layouts are the same kernel: the output (R, C) is row-major and, for output element
    (r, c), the gate sits at ``h + r * h_stride + c`` and the value ``value_offset`` further on.
    * row-major h (..., 2F) (``split_dim=-1``): R = tokens, C = F, h_stride = 2F, value_offset = F;
    * transposed product h^T (2F, T) (``split_dim=0``, "column-major h", what a 2:4 FFN computes
      when the sparse weight is the left operand): R = F, C = T, h_stride = T, value_offset = F T.
      The output (F, T) is what the next transposed product consumes. One pass either way: the
      gate and value rows are read directly, no split copy and no transpose.

Bytes (dtype size s, output numel n = R * C)
    forward: read 2 s n, write s n.   backward: read 3 s n (g, v, dout), write 2 s n (dg, dv).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import HALF_AND_FLOAT, check_device, check_tensor, contiguous

DEFAULT_BLOCK = 2048  # output elements per program (BLOCK_R x BLOCK_C)
DEFAULT_WARPS = 4
_KIND_ID = {"swiglu": 0, "geglu": 1}

_INV_SQRT2 = tl.constexpr(0.7071067811865476)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


@triton.jit
def _act_and_grad(g, KIND: tl.constexpr):
    """act(g) and act'(g), float32. KIND 0: silu; 1: gelu (erf)."""
    if KIND == 0:
        s = tl.sigmoid(g)
        return g * s, s * (1.0 + g * (1.0 - s))
    else:
        cdf = 0.5 * (1.0 + tl.math.erf(g * _INV_SQRT2))
        pdf = tl.exp(-0.5 * g * g) * _INV_SQRT_2PI
        return g * cdf, cdf + g * pdf


@triton.jit
def _gated_fwd_kernel(h_ptr, out_ptr, n_rows, n_cols, h_stride, value_offset, KIND: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    gate_offs = rows[:, None] * h_stride + cols[None, :]
    g = tl.load(h_ptr + gate_offs, mask=ok, other=0.0).to(tl.float32)
    v = tl.load(h_ptr + gate_offs + value_offset, mask=ok, other=0.0).to(tl.float32)
    a, _ = _act_and_grad(g, KIND)
    out_offs = rows[:, None] * n_cols + cols[None, :]
    tl.store(out_ptr + out_offs, (a * v).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _gated_bwd_kernel(dout_ptr, h_ptr, dh_ptr, n_rows, n_cols, h_stride, value_offset, KIND: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    gate_offs = rows[:, None] * h_stride + cols[None, :]
    g = tl.load(h_ptr + gate_offs, mask=ok, other=0.0).to(tl.float32)
    v = tl.load(h_ptr + gate_offs + value_offset, mask=ok, other=0.0).to(tl.float32)
    d = tl.load(dout_ptr + rows[:, None] * n_cols + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    a, da = _act_and_grad(g, KIND)
    dt = dh_ptr.dtype.element_ty
    tl.store(dh_ptr + gate_offs, (d * v * da).to(dt), mask=ok)
    tl.store(dh_ptr + gate_offs + value_offset, (d * a).to(dt), mask=ok)


def _geometry(h: torch.Tensor, kind: str, split_dim: int):
    """(rows, cols, h_stride, value_offset, out_shape) of the unified row-major view."""
    from sparsity_lab.references.gated import check_gated_args

    dim = check_gated_args(h, kind, split_dim)
    if dim == h.dim() - 1:
        f = h.shape[-1] // 2
        rows = h.numel() // h.shape[-1]
        return rows, f, 2 * f, f, (*h.shape[:-1], f)
    f, t = h.shape[0] // 2, h.shape[1]
    return f, t, t, f * t, (f, t)


def _blocks(n_cols: int, block: int) -> tuple[int, int]:
    block_c = min(triton.next_power_of_2(n_cols), block)
    return max(1, block // block_c), block_c


def gated_forward(h: torch.Tensor, kind: str = "swiglu", split_dim: int = -1, block: int = DEFAULT_BLOCK,
                  num_warps: int = DEFAULT_WARPS) -> torch.Tensor:
    """Fused ``act(gate) * value``: h (..., 2F) -> (..., F), or h^T (2F, T) -> (F, T) with split_dim=0."""
    check_tensor(h, "h", HALF_AND_FLOAT)
    rows, cols, h_stride, value_offset, out_shape = _geometry(h, kind, split_dim)
    check_device(_gated_fwd_kernel, h=h)
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 1, got {block}")
    h = contiguous(h)
    out = torch.empty(out_shape, dtype=h.dtype, device=h.device)
    block_r, block_c = _blocks(cols, block)
    grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c))
    _gated_fwd_kernel[grid](h, out, rows, cols, h_stride, value_offset, KIND=_KIND_ID[kind],
                            BLOCK_R=block_r, BLOCK_C=block_c, num_warps=num_warps)
    return out


def gated_backward(grad_out: torch.Tensor, h: torch.Tensor, kind: str = "swiglu", split_dim: int = -1,
                   block: int = DEFAULT_BLOCK, num_warps: int = DEFAULT_WARPS) -> torch.Tensor:
    """Fused backward: returns dh shaped like h, [dgate | dvalue] along the split dimension."""
    check_tensor(h, "h", HALF_AND_FLOAT)
    check_tensor(grad_out, "grad_out", HALF_AND_FLOAT)
    rows, cols, h_stride, value_offset, out_shape = _geometry(h, kind, split_dim)
    if tuple(grad_out.shape) != tuple(out_shape):
        raise ValueError(f"grad_out has shape {tuple(grad_out.shape)}, expected the output's {tuple(out_shape)}")
    check_device(_gated_bwd_kernel, h=h, grad_out=grad_out)
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 1, got {block}")
    h = contiguous(h)
    grad_out = contiguous(grad_out)
    dh = torch.empty_like(h)
    block_r, block_c = _blocks(cols, block)
    grid = (triton.cdiv(rows, block_r), triton.cdiv(cols, block_c))
    _gated_bwd_kernel[grid](grad_out, h, dh, rows, cols, h_stride, value_offset, KIND=_KIND_ID[kind],
                            BLOCK_R=block_r, BLOCK_C=block_c, num_warps=num_warps)
    return dh
