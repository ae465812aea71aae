"""cuSPARSELt's FP8 (E4M3) 2:4 product called directly, with the per-tensor scales read on the device.

    D = diag(alpha) (A @ B)      A: E4M3 compressed (m, k), 2:4 along k;  B: E4M3 (k, n);  D: bfloat16

Why a binding of its own: ``torch._cslt_sparse_mm`` builds a plan per call (host time that small
products cannot hide, docs/measuring.md); ``direct`` caches plans but describes 16-bit operands only.
Here the plan describes E4M3 A and B, bfloat16 C and D, float32 compute.

The scales must stay on the device (no ``.item()``, capturable in a CUDA graph). Three ways are tried
per product, in ``SCALE_MODES`` order, each checked numerically by ``fp8_algorithms.FP8SparseProducts``.
Measured on the H100 with cuSPARSELt 0.8.0 (``results/fp8_training_h100.json``, "algorithm_choices"):
``ALPHA_VECTOR_SCALING`` (a device vector of m alphas, what PyTorch's ``_cslt_sparse_mm`` uses for an
``alpha`` of several elements) is refused for FP8 ("operation not supported"); the A/B scale pointers
are accepted but the products come out unscaled (wrong: rejected by the check); so the product runs with
alpha 1 and one elementwise pass multiplies D by ``s_a s_b`` afterwards ("multiply_after": a read and a
write of D by ``kernels/scale_product.py``, part of the time the recorded products take).

A *scalar host* alpha is honoured, though (``results/fp8_scalar_alpha_h100.json``): "host_alpha" passes
``s_a s_b`` as a host float, which a training recipe can give only where the host knows its scales
(``FP8Recipe(scale_in_product="host_alpha")``: power-of-two scales read one step late). It runs on the
plan of "multiply_after" (the same descriptors; only the alpha at the call differs), so switching to it
builds no plan, inside a CUDA-graph capture or not.

Layouts are the ones ``direct`` describes (B contiguous, or the ``.t()`` of a contiguous
(n, k); D row-major, or with ``transpose_result`` the (n, m) row-major memory of a column-major D).
Enum values from cuSPARSELt's header (``cusparseLt.h``; ``library_types.h`` for the CUDA types):
``CUDA_R_8F_E4M3 = 28``, ``CUDA_R_16BF = 14``, matmul attribute ``ALPHA_VECTOR_SCALING = 5``.
"""
from __future__ import annotations

import ctypes
from collections import Counter

import torch

from .direct import (ALIGNMENT, COMPUTE_32F, OP_N, OP_T, ORDER_COL, ORDER_ROW, SPARSITY_50, CusparseltLibrary,
                     _Opaque, _raw_stream, b_is_transposed, plan_with_algorithm)
from .ops import AlgConfig

CUDA_R_8F_E4M3 = 28
CUDA_R_16BF = 14
MATMUL_ALPHA_VECTOR_SCALING = 5
A_SCALE_MODE, B_SCALE_MODE, A_SCALE_POINTER, B_SCALE_POINTER, SCALE_SCALAR_32F = 10, 11, 15, 16, 1
# how the two per-tensor scales reach the product, in order of preference (each checked numerically):
# "scale_pointers": A/B scale pointers (device scalars, cuSPARSELt >= 0.7's matmul attributes);
# "alpha_vector": alpha as a device vector of m floats (refused for FP8 by cuSPARSELt 0.8 on the H100);
# "multiply_after": alpha 1, then one elementwise pass over D (bfloat16 product by the fp32 scale)
SCALE_MODES = ("scale_pointers", "alpha_vector", "multiply_after")
# "host_alpha": alpha = s_a s_b passed as cuSPARSELt's scalar alpha, a host float (``mm(..., alpha=)``; without it
# read from the device scales at the call, a sync: the probe's form, benchmarks/fp8_scalar_alpha.py). A CUDA graph
# holds the value as a constant. Not in the search's order: training asks for it when its recipe holds the scales
# on the host, and the search checks it numerically per product key (``FP8Choice.host_alpha``)
PROBE_MODES = ("host_alpha",)
FP8_MULTIPLE = 32  # both dimensions of an fp8 sparse operand (cuSPARSELt's minimum, as PyTorch checks)


class _FP8Plan:
    """Descriptors, algorithm and plan of one FP8 product (kept alive together)."""

    def __init__(self, lib: CusparseltLibrary, set_attribute, handle: _Opaque, m: int, k: int, n: int,
                 b_transposed: bool, transpose_result: bool, config: AlgConfig, mode: str, device) -> None:
        self.key = (m, k, n, b_transposed, transpose_result, config, mode)
        self.mode = mode
        self.scales = torch.ones(4, dtype=torch.float32, device=device)  # [s_a, s_b] at 16-byte aligned slots 0, 1
        self.a, self.b, self.d, self.matmul, self.alg, self.plan = (_Opaque() for _ in range(6))
        h, e4m3, bf16 = handle.ptr, CUDA_R_8F_E4M3, CUDA_R_16BF
        lib.check(lib.cusparseLtStructuredDescriptorInit(h, self.a.ptr, m, k, k, ALIGNMENT, e4m3, ORDER_ROW,
                                                         SPARSITY_50), "fp8 structured descriptor (A)")
        if b_transposed:
            status = lib.cusparseLtDenseDescriptorInit(h, self.b.ptr, n, k, k, ALIGNMENT, e4m3, ORDER_ROW)
        else:
            status = lib.cusparseLtDenseDescriptorInit(h, self.b.ptr, k, n, n, ALIGNMENT, e4m3, ORDER_ROW)
        lib.check(status, "fp8 dense descriptor (B)")
        if transpose_result:
            status = lib.cusparseLtDenseDescriptorInit(h, self.d.ptr, m, n, m, ALIGNMENT, bf16, ORDER_COL)
        else:
            status = lib.cusparseLtDenseDescriptorInit(h, self.d.ptr, m, n, n, ALIGNMENT, bf16, ORDER_ROW)
        lib.check(status, "bf16 descriptor (C, D)")
        lib.check(lib.cusparseLtMatmulDescriptorInit(h, self.matmul.ptr, OP_N, OP_T if b_transposed else OP_N,
                                                     self.a.ptr, self.b.ptr, self.d.ptr, self.d.ptr, COMPUTE_32F),
                  "fp8 matmul descriptor")
        on = ctypes.c_int(1)
        if mode == "alpha_vector":
            lib.check(set_attribute(h, self.matmul.ptr, MATMUL_ALPHA_VECTOR_SCALING, ctypes.byref(on),
                                    ctypes.sizeof(on)), "alpha vector scaling")
        elif mode == "scale_pointers":
            scalar = ctypes.c_int(SCALE_SCALAR_32F)
            for attr, what in ((A_SCALE_MODE, "A scale mode"), (B_SCALE_MODE, "B scale mode")):
                lib.check(set_attribute(h, self.matmul.ptr, attr, ctypes.byref(scalar), ctypes.sizeof(scalar)), what)
            self._ptrs = [ctypes.c_void_p(self.scales.data_ptr()), ctypes.c_void_p(self.scales.data_ptr() + 4)]
            for attr, ptr, what in ((A_SCALE_POINTER, self._ptrs[0], "A scale pointer"),
                                    (B_SCALE_POINTER, self._ptrs[1], "B scale pointer")):
                lib.check(set_attribute(h, self.matmul.ptr, attr, ctypes.byref(ptr), ctypes.sizeof(ptr)), what)
        self.workspace_bytes = plan_with_algorithm(lib, h, self, config, "fp8 plan")


def fp8_operand_shape(compressed: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int, bool]:
    """(m, k, n, b_transposed) of ``A @ B`` for the compressed E4M3 A (2-D (m, bytes per row) or 1-D)
    and E4M3 B (k, n), contiguous or the ``.t()`` of a contiguous (n, k)."""
    if compressed.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise TypeError(f"compressed and b must both be float8_e4m3fn, got {compressed.dtype} and {b.dtype}")
    if not compressed.is_contiguous() or b.dim() != 2:
        raise ValueError("compressed must be contiguous and b 2-D (k, n)")
    k, n = b.shape
    b_transposed = b_is_transposed(b)
    m = compressed.shape[0] if compressed.dim() == 2 else compressed.numel() * 16 // 10 // k
    if m == 0 or compressed.numel() < m * k * 10 // 16:
        raise ValueError(f"compressed has shape {tuple(compressed.shape)}, too small for a ({m}, {k}) fp8 2:4 matrix")
    return m, k, n, b_transposed


class FP8DirectOps:
    """FP8 2:4 products through cached plans on the cuSPARSELt PyTorch loaded."""

    name = "direct_fp8"

    def __init__(self, library: CusparseltLibrary | None = None) -> None:
        self.lib = library or CusparseltLibrary()
        fn = self.lib._lib.cusparseLtMatmulDescSetAttribute
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        fn.restype = ctypes.c_int
        self._set_attribute = fn
        self.handle = _Opaque()
        self.lib.check(self.lib.cusparseLtInit(self.handle.ptr), "cusparseLtInit")
        self.plans: dict[tuple, _FP8Plan] = {}
        self.stats: Counter = Counter()
        self._beta = ctypes.c_float(0.0)
        self._beta_p = ctypes.addressof(self._beta)

    def plan(self, m, k, n, b_transposed, transpose_result, config: AlgConfig, mode: str, device) -> _FP8Plan:
        key = (m, k, n, b_transposed, transpose_result, config, mode)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = _FP8Plan(self.lib, self._set_attribute, self.handle, m, k, n, b_transposed,
                                              transpose_result, config, mode, device)
        return plan

    def mm(self, compressed: torch.Tensor, b: torch.Tensor, s_a: torch.Tensor, s_b: torch.Tensor,
           transpose_result: bool, config: AlgConfig, mode: str = "scale_pointers",
           alpha: float | None = None) -> torch.Tensor:
        """``s_a s_b (A @ B)`` as bfloat16 (m, n), or its transpose (n, m) contiguous. s_a, s_b: float32
        one-element tensors on b's device (the per-tensor dequantization scales of A and B). alpha: mode
        "host_alpha" only, s_a s_b as a host float (the caller vouches that it equals the device scales'
        product; None reads it from them, a sync)."""
        m, k, n, b_t = fp8_operand_shape(compressed, b)
        if mode not in SCALE_MODES + PROBE_MODES:
            raise ValueError(f"mode must be one of {SCALE_MODES + PROBE_MODES}, got {mode!r}")
        if not (b.is_cuda and compressed.device == b.device == s_a.device == s_b.device):
            raise ValueError("compressed, b and the scales must be on one CUDA device")
        for t in (compressed, b):
            if t.data_ptr() % ALIGNMENT:
                raise ValueError("fp8 operands must be 16-byte aligned (a fresh tensor, not a view into another)")
        if alpha is not None and mode != "host_alpha":
            raise ValueError(f"alpha is given to mode 'host_alpha' only, got mode {mode!r}")
        plan_mode = "multiply_after" if mode == "host_alpha" else mode  # the same descriptors, alpha at the call
        plan = self.plan(m, k, n, b_t, transpose_result, config, plan_mode, b.device)
        alpha_host = ctypes.c_float(1.0)
        if mode == "scale_pointers":
            plan.scales[0:2].copy_(torch.stack((s_a.float().reshape(()), s_b.float().reshape(()))))
            alpha_p = ctypes.addressof(alpha_host)
        elif mode == "alpha_vector":
            alpha = (s_a.float() * s_b.float()).reshape(1).expand(m).contiguous()
            alpha_p = alpha.data_ptr()
        elif mode == "host_alpha":
            alpha_host = ctypes.c_float(float((s_a.float() * s_b.float()).item()) if alpha is None else float(alpha))
            alpha_p = ctypes.addressof(alpha_host)
        else:
            alpha_p = ctypes.addressof(alpha_host)
        out = torch.empty((n, m) if transpose_result else (m, n), dtype=torch.bfloat16, device=b.device)
        workspace = (torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=b.device)
                     if plan.workspace_bytes else None)
        stream = ctypes.c_void_p(_raw_stream(b.device.index))
        status = self.lib.cusparseLtMatmul(
            self.handle.ptr, plan.plan.ptr, ctypes.c_void_p(alpha_p), compressed.data_ptr(), b.data_ptr(),
            self._beta_p, out.data_ptr(), out.data_ptr(),
            workspace.data_ptr() if workspace is not None else None, ctypes.byref(stream), 1)
        self.lib.check(status, f"cusparseLtMatmul fp8 {plan.key}")
        self.stats["products"] += 1
        if mode == "multiply_after":  # (a plan's mode is "multiply_after" under "host_alpha" too: not this test)
            from ...kernels import scale_product_  # one pass at the copy bandwidth (kernels/scale_product.py)
            scale_product_(out, s_a.float(), s_b.float())
        return out


def torch_fp8_mm(compressed: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor, transpose_result: bool,
                 config: AlgConfig) -> torch.Tensor:  # alpha: (m,) float32 on the device
    """The same product through ``torch._cslt_sparse_mm`` (a plan per call): the check for the binding."""
    kwargs = {"split_k": config.split_k, "split_k_mode": config.split_k_mode} if config.split_k != 1 else {}
    return torch._cslt_sparse_mm(compressed, b, alpha=alpha, out_dtype=torch.bfloat16,
                                 transpose_result=transpose_result, alg_id=config.alg_id, **kwargs)
