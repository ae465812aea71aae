"""Where a training step's GPU time goes, by kind of work: a kernel's category from its name alone.

``classify(name)`` is a pure function of the name torch.profiler reports for a kernel (a CUDA run) or
an operator (``aten::...``, a CPU run): one of ``CATEGORIES``. The names it knows, seen on the H100
(``results/*profile*_h100.txt``) or in PyTorch's and the project's sources:

* sparse GEMMs: cuSPARSELt's kernels, ``sm90_xmma_sparse_gemm_bf16bf16_...``, ``..._sptensor...``; CUTLASS's
  SM90 sparse GEMMs (``...MainloopSm90TmaGmmaWarpSpecializedSparse...``, the "cutlass" backends)
* dense GEMMs: cuBLAS's ``nvjet_sm90_tst_...``, ``sm90_xmma_gemm_...``, ``ampere_bf16_s16816gemm...``,
  CUTLASS ``cutlass_80_tensorop_...gemm...``, ``gemv...``, split-K reductions; ``aten::mm``/``addmm`` on a CPU
* attention: flash attention (``pytorch_flash::flash_fwd_kernel``), cuDNN's ``..._sdpa_...``,
  memory-efficient attention (``fmha_cutlass...``); ``aten::_scaled_dot_product...`` on a CPU
* optimizer: fused or foreach AdamW (``FusedAdamMathFunctor``, ``multi_tensor_apply_kernel``: every
  foreach op, the master-weight copies of ``--bf16-weights`` included); ``aten::_fused_adamw_``, ``aten::_foreach_*``
* 2:4 work: the project's Triton kernels for masks, flip counts, soft threshold, compression, MVUE,
  masked decay (``_transposable24_kernel``, ``_refresh24_kernel``, ``_prepare24_kernel``,
  ``_mvue_compress24_kernel``, ...), cuSPARSELt's own compression and CUTLASS's
  (``SM90StructuredSparseCompressor``)
* norms, casts, elementwise: layer norm, PyTorch's elementwise and copy kernels (the autocast casts),
  Inductor's fused kernels (``triton_poi_/triton_per_/triton_red_fused_...``), the activations
* other: everything else (embedding, the loss's softmax, memset/memcpy, reductions, the profiler's own)

Order matters: a cuSPARSELt GEMM is a "gemm" too, so the sparse test comes first; a project kernel
is a Triton kernel like Inductor's, so the 2:4 names come before the elementwise ones.
"""
from __future__ import annotations

import re
from typing import Iterable

CATEGORIES = ("dense_gemm", "sparse_gemm", "attention", "optimizer", "norm_cast_elementwise", "two4_work", "other")
LABELS = {"dense_gemm": "dense GEMMs", "sparse_gemm": "sparse GEMMs (cuSPARSELt or CUTLASS)", "attention": "attention",
          "optimizer": "optimizer", "norm_cast_elementwise": "norms, casts, elementwise",
          "two4_work": "2:4 work (masks, soft threshold, compression, MVUE)", "other": "other"}

# the project's 2:4 Triton kernels (kernels/*.py): masks, flips, soft threshold, compression, MVUE, decay
_TWO4 = re.compile(r"(^|[\s:<])_(transposable24|transpose|count_flips|refresh24\w*|soft_threshold24|prepare24\w*|compress24"
                   r"|mvue\w*|masked_decay|prune24\w*)_kernel")
# CUTLASS's SM90 sparse GEMMs show as mangled names holding their mainloop, ...GmmaWarpSpecializedSparse...
_SPARSE_GEMM = re.compile(r"sparse_gemm|sptensor|spmma|cusparselt.*(gemm|mma)|warpspecializedsparse")
_ATTENTION = re.compile(r"flash|fmha|sdpa|attention|scaled_dot_product")
_OPTIMIZER = re.compile(r"adam|multi_tensor_apply|_foreach_")
_DENSE_GEMM = re.compile(r"gemm|nvjet|s16816|s1688|gemv|splitkreduce|cublas|^aten::(mm|addmm|bmm|baddbmm|addmv|mv)$"
                         r"|triton_tem_fused_(mm|addmm|bmm)")
_ELEMENTWISE = re.compile(r"layer_?norm|rms_?norm|elementwise|triton_(poi|per|red)_|_to_copy|copy_|cast|gelu|silu|relu"
                          r"|^aten::(add|mul|sub|div|copy_|to|_to_copy|native_layer_norm|layer_norm|gelu|gelu_backward"
                          r"|native_layer_norm_backward|add_|mul_|fill_|zero_|clone|contiguous)$")


def classify(name: str) -> str:
    """The category (one of CATEGORIES) of a profiled kernel or operator named ``name``."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    n = name.lower()
    if _SPARSE_GEMM.search(n):
        return "sparse_gemm"
    if _TWO4.search(n) or ("cusparselt" in n and "compress" in n) or "structuredsparsecompressor" in n:
        return "two4_work"
    if _ATTENTION.search(n):
        return "attention"
    if _OPTIMIZER.search(n):
        return "optimizer"
    if _DENSE_GEMM.search(n):
        return "dense_gemm"
    if _ELEMENTWISE.search(n):
        return "norm_cast_elementwise"
    return "other"


def breakdown(kernels: Iterable[tuple[str, float]]) -> dict[str, float]:
    """{category: ms} summed over (name, ms) pairs, every category present (0.0 when none)."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    for name, ms in kernels:
        out[classify(name)] += float(ms)
    return out
