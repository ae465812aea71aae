"""cuSPARSELt's matmul called directly (ctypes), with one plan per product kept for the process.

Why: ``torch._cslt_sparse_mm`` builds three descriptors, a matmul descriptor, an algorithm selection
and a *plan* on every call and destroys them after it. ``cusparseLtMatmulPlanInit`` is the costly
part: on the H100 two forward products of a 4096-token FFN (d_model 1024) took several times the
dense products' time eagerly, all of it host time (docs/measuring.md,
results/cusparselt_ffn_h100.json). There are two cures,
CUDA-graph capture (``sparsity_lab.CudaGraphStep``) and a cached plan through a direct binding; this
module is the second. The library is the one PyTorch already loaded (same file, same version).

The product computed is exactly ``torch._cslt_sparse_mm``'s (see ``ops``): the same
descriptors, so the compressed operand from ``_cslt_compress`` or from ``kernels/compress24.py``
is read the same way:

    A  structured (m, k) row-major, ld k, 16-byte alignment, 50 % sparsity   (the compressed operand)
    B  dense (k, n): contiguous -> row-major (k, n), op N;
                     ``Y.t()`` of a contiguous (n, k) Y -> row-major (n, k), ld k, op T
    D  (m, n) row-major; with ``transpose_result`` column-major, ld m, i.e. (n, m) row-major memory
    compute in float32 (bf16 / fp16 operands), alpha 1, beta 0, algorithm id / split-k as chosen.

Header facts used (cuSPARSELt 0.10 ``cusparseLt.h`` from PyPI's nvidia-cusparselt-cu13 wheel; the
entry points and enum values are the same back to 0.6): the opaque structs are 512 bytes (older
releases 1024: we allocate 1024, 16-byte aligned); ``CUSPARSE_ORDER_COL = 1``, ``ROW = 2``;
``CUSPARSE_COMPUTE_32F = 2``; ``CUDA_R_16F = 2``, ``CUDA_R_16BF = 14``; alg attributes
CONFIG_ID 0, SPLIT_K 3, SPLIT_K_MODE 4.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from collections import Counter
from dataclasses import dataclass

import torch

from .ops import AlgConfig, TorchCusparseltOps

OPAQUE_BYTES = 1024  # >= sizeof of every cuSPARSELt opaque struct in any release
ORDER_COL, ORDER_ROW = 1, 2
OP_N, OP_T = 0, 1
COMPUTE_32F = 2
SPARSITY_50 = 0
ALG_DEFAULT = 0
ALG_CONFIG_ID, ALG_SPLIT_K, ALG_SPLIT_K_MODE = 0, 3, 4
CUDA_TYPES = {torch.float16: 2, torch.bfloat16: 14}
ALIGNMENT = 16  # bytes, for every pointer and leading dimension


class CusparseltBindingError(RuntimeError):
    """A cuSPARSELt call returned an error status, or the library could not be loaded."""


class _Opaque:
    """A zeroed, 16-byte aligned buffer for one cuSPARSELt opaque struct; ``ptr`` never moves."""

    def __init__(self) -> None:
        self._raw = ctypes.create_string_buffer(OPAQUE_BYTES + ALIGNMENT)
        base = ctypes.addressof(self._raw)
        self.ptr = ctypes.c_void_p(base + (-base) % ALIGNMENT)


def _library_path() -> str:
    """The libcusparseLt PyTorch loaded: its soname, else the path in this process's memory map."""
    torch.backends.cusparselt.version()  # makes PyTorch load it if it has not yet
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "libcusparseLt" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return ctypes.util.find_library("cusparseLt") or "libcusparseLt.so.0"


class CusparseltLibrary:
    """The few entry points used, typed, with errors raised by name."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or _library_path()
        try:
            self._lib = ctypes.CDLL(self.path)
        except OSError as err:
            raise CusparseltBindingError(f"cannot load cuSPARSELt from {self.path!r}: {err}") from err
        p, i64, i32, u32, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_uint32, ctypes.c_size_t
        signatures = {
            "cusparseLtInit": [p], "cusparseLtGetVersion": [p, p],
            "cusparseLtDenseDescriptorInit": [p, p, i64, i64, i64, u32, i32, i32],
            "cusparseLtStructuredDescriptorInit": [p, p, i64, i64, i64, u32, i32, i32, i32],
            "cusparseLtMatmulDescriptorInit": [p, p, i32, i32, p, p, p, p, i32],
            "cusparseLtMatmulAlgSelectionInit": [p, p, p, i32],
            "cusparseLtMatmulAlgSetAttribute": [p, p, i32, p, sz],
            "cusparseLtMatmulPlanInit": [p, p, p, p],
            "cusparseLtMatmulGetWorkspace": [p, p, p],
            "cusparseLtMatmul": [p, p, p, p, p, p, p, p, p, p, i32],
        }
        for name, args in signatures.items():
            fn = getattr(self._lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
            setattr(self, name, fn)
        self._error_name = getattr(self._lib, "cusparseLtGetErrorString", None)
        if self._error_name is not None:
            self._error_name.argtypes, self._error_name.restype = [ctypes.c_int], ctypes.c_char_p

    def check(self, status: int, what: str) -> None:
        if status != 0:
            name = self._error_name(status).decode() if self._error_name is not None else ""
            raise CusparseltBindingError(f"{what} failed with cuSPARSELt status {status} {name}".rstrip())


@dataclass(frozen=True)
class PlanKey:
    """What a plan depends on: shapes, dtype, layouts, algorithm (never the data pointers)."""

    m: int
    k: int
    n: int
    dtype: torch.dtype
    b_transposed: bool
    transpose_result: bool
    config: AlgConfig


class _Plan:
    """Descriptors, algorithm selection and plan of one :class:`PlanKey`, kept alive together
    (cuSPARSELt may keep pointers between them)."""

    def __init__(self, lib: CusparseltLibrary, handle: _Opaque, key: PlanKey) -> None:
        self.key = key
        self.a, self.b, self.d, self.matmul, self.alg, self.plan = (_Opaque() for _ in range(6))
        dt, h = CUDA_TYPES[key.dtype], handle.ptr
        m, k, n = key.m, key.k, key.n
        lib.check(lib.cusparseLtStructuredDescriptorInit(h, self.a.ptr, m, k, k, ALIGNMENT, dt, ORDER_ROW,
                                                         SPARSITY_50), "structured descriptor (A)")
        if key.b_transposed:
            status = lib.cusparseLtDenseDescriptorInit(h, self.b.ptr, n, k, k, ALIGNMENT, dt, ORDER_ROW)
        else:
            status = lib.cusparseLtDenseDescriptorInit(h, self.b.ptr, k, n, n, ALIGNMENT, dt, ORDER_ROW)
        lib.check(status, "dense descriptor (B)")
        if key.transpose_result:
            status = lib.cusparseLtDenseDescriptorInit(h, self.d.ptr, m, n, m, ALIGNMENT, dt, ORDER_COL)
        else:
            status = lib.cusparseLtDenseDescriptorInit(h, self.d.ptr, m, n, n, ALIGNMENT, dt, ORDER_ROW)
        lib.check(status, "dense descriptor (D)")
        lib.check(lib.cusparseLtMatmulDescriptorInit(h, self.matmul.ptr, OP_N, OP_T if key.b_transposed else OP_N,
                                                     self.a.ptr, self.b.ptr, self.d.ptr, self.d.ptr, COMPUTE_32F),
                  "matmul descriptor")
        self.workspace_bytes = plan_with_algorithm(lib, h, self, key.config, "plan")


def plan_with_algorithm(lib, h, plan, config: AlgConfig, what: str) -> int:
    """Select ``config``'s algorithm id (and split-k, as PyTorch does: only when asked, its mode only
    when > 0) for ``plan``'s matmul descriptor, initialise the plan and return its workspace bytes.
    ``plan`` holds the opaque ``alg``, ``matmul`` and ``plan`` structures."""
    def set_alg(attribute: int, value: int, name: str) -> None:
        data = ctypes.c_int(int(value))
        lib.check(lib.cusparseLtMatmulAlgSetAttribute(h, plan.alg.ptr, attribute, ctypes.byref(data),
                                                      ctypes.sizeof(data)), name)

    lib.check(lib.cusparseLtMatmulAlgSelectionInit(h, plan.alg.ptr, plan.matmul.ptr, ALG_DEFAULT),
              "algorithm selection")
    set_alg(ALG_CONFIG_ID, config.alg_id, "algorithm id")
    if config.split_k != 1:
        set_alg(ALG_SPLIT_K, config.split_k, "split-k")
        if config.split_k_mode > 0:
            set_alg(ALG_SPLIT_K_MODE, config.split_k_mode, "split-k mode")
    lib.check(lib.cusparseLtMatmulPlanInit(h, plan.plan.ptr, plan.matmul.ptr, plan.alg.ptr), what)
    size = ctypes.c_size_t(0)
    lib.check(lib.cusparseLtMatmulGetWorkspace(h, plan.plan.ptr, ctypes.byref(size)), "workspace size")
    return int(size.value)


def b_is_transposed(b: torch.Tensor) -> bool:
    """Whether the dense operand B (k, n) is the ``.t()`` view of a contiguous (n, k) (else contiguous);
    any other strides raise."""
    k = b.shape[0]
    if b.is_contiguous():
        return False
    if b.stride() == (1, k):
        return True
    raise ValueError(f"b must be contiguous or the .t() of a contiguous tensor, got strides {b.stride()} "
                     f"for shape {tuple(b.shape)}")


def operand_shape(compressed: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int, bool]:
    """(m, k, n, b_transposed) of ``A @ B`` from the compressed A and B (k, n), checked.

    The compressed A gives m: 2-D (m, per row) as PyTorch 2.11's ``_cslt_compress`` and our kernels
    return it, or 1-D (older builds: m from the element count, as PyTorch infers it); contiguous.

    B must be contiguous or the ``.t()`` of a contiguous (n, k) tensor (the two layouts the
    descriptors describe); m is inferred from A's size as PyTorch does (9/16 of m*k for 16-bit)."""
    if not compressed.is_contiguous():
        raise ValueError(f"compressed must be contiguous (the compressed operand), got strides {compressed.stride()}")
    if b.dim() != 2:
        raise ValueError(f"b must be 2-D (k, n), got shape {tuple(b.shape)}")
    if b.dtype not in CUDA_TYPES or compressed.dtype != b.dtype:
        raise TypeError(f"compressed and b must both be float16 or bfloat16, got {compressed.dtype} and {b.dtype}")
    k, n = b.shape
    b_transposed = b_is_transposed(b)
    if compressed.dim() == 2:  # (m, per-row bytes): PyTorch 2.11's _cslt_compress and our kernels
        m = compressed.shape[0]
    else:  # 1-D (older PyTorch): PyTorch's inference, floor divisions included: cuSPARSELt pads the
        # metadata of a k that is not a multiple of 64 (A (256, 1008): 145408 elements, not 145152)
        m = compressed.numel() * 16 // 9 // k if k else 0
    if m == 0 or compressed.numel() < m * k * 9 // 16:
        raise ValueError(f"compressed has shape {tuple(compressed.shape)}, too small for the compressed form "
                         f"of a (m, {k}) 2:4 matrix (9/16 of m x {k} elements at least)")
    return m, k, n, b_transposed


def _raw_stream(index: int) -> int:
    """The current CUDA stream of device ``index`` as an address (PyTorch's C call where it has one:
    ``torch.cuda.current_stream`` costs several microseconds of Python per product)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def loaded_library() -> dict:
    """{"version": int, "path": str} of the cuSPARSELt this process runs (which may differ from the one
    PyTorch was built with, ``torch.backends.cusparselt.version()``, e.g. a newer one preloaded)."""
    lib = CusparseltLibrary()
    handle = _Opaque()
    lib.check(lib.cusparseLtInit(handle.ptr), "cusparseLtInit")
    version = ctypes.c_int(0)
    lib.check(lib.cusparseLtGetVersion(handle.ptr, ctypes.byref(version)), "cusparseLtGetVersion")
    return {"version": int(version.value), "path": lib.path}


class DirectCusparseltOps(TorchCusparseltOps):
    """:class:`TorchCusparseltOps` with ``mm`` through cached plans (compression, the algorithm search
    and timing stay PyTorch's: they run once per shape). An operand whose address is not 16-byte
    aligned (a view into another tensor; cuSPARSELt refuses it, as PyTorch's call does) is copied
    to a fresh, aligned tensor of the same layout first, counted in ``stats["aligned_copies"]``."""

    name = "direct"

    def __init__(self, library: CusparseltLibrary | None = None) -> None:
        super().__init__()
        self.lib = library or CusparseltLibrary()
        self.handle = _Opaque()
        self.lib.check(self.lib.cusparseLtInit(self.handle.ptr), "cusparseLtInit")
        version = ctypes.c_int(0)
        self.lib.check(self.lib.cusparseLtGetVersion(self.handle.ptr, ctypes.byref(version)), "cusparseLtGetVersion")
        self.version = int(version.value)
        self.plans: dict[tuple, _Plan] = {}  # keyed by PlanKey's fields as a plain tuple (a cheaper hash)
        self.stats: Counter = Counter()
        self._alpha, self._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._alpha_p, self._beta_p = ctypes.addressof(self._alpha), ctypes.addressof(self._beta)

    def _aligned(self, t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() % ALIGNMENT == 0:
            return t
        self.stats["aligned_copies"] += 1
        return t.clone(memory_format=torch.preserve_format)  # same strides, fresh (aligned) memory

    def plan(self, m: int, k: int, n: int, dtype: torch.dtype, b_transposed: bool, transpose_result: bool,
             config: AlgConfig) -> _Plan:
        fields = (m, k, n, dtype, b_transposed, transpose_result, config)
        plan = self.plans.get(fields)
        if plan is None:
            plan = self.plans[fields] = _Plan(self.lib, self.handle, PlanKey(*fields))
        return plan

    def mm(self, compressed: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, transpose_result: bool,
           config: AlgConfig) -> torch.Tensor:
        """``A @ B`` (m, n), or ``(A @ B)^T`` (n, m) contiguous with ``transpose_result`` (+ bias per
        row of A @ B, added after the product)."""
        m, k, n, b_t = operand_shape(compressed, b)
        if not b.is_cuda or compressed.device != b.device:
            raise ValueError(f"compressed ({compressed.device}) and b ({b.device}) must be on the same CUDA device")
        compressed, b = self._aligned(compressed), self._aligned(b)
        plan = self.plan(m, k, n, b.dtype, b_t, transpose_result, config)
        out = torch.empty((n, m) if transpose_result else (m, n), dtype=b.dtype, device=b.device)
        workspace = (torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=b.device)
                     if plan.workspace_bytes else None)
        stream = ctypes.c_void_p(_raw_stream(b.device.index))
        status = self.lib.cusparseLtMatmul(
            self.handle.ptr, plan.plan.ptr, self._alpha_p, compressed.data_ptr(), b.data_ptr(), self._beta_p,
            out.data_ptr(), out.data_ptr(), workspace.data_ptr() if workspace is not None else None,
            ctypes.byref(stream), 1)
        self.lib.check(status, f"cusparseLtMatmul ({plan.key})")
        if bias is not None:  # one value per row of A @ B: per column of the transposed result
            out.add_(bias if transpose_result else bias[:, None])
        return out


class DirectOpsFallbackWarning(UserWarning):
    """The direct binding could not start; the backend runs PyTorch's ``_cslt_sparse_mm`` instead."""


def make_ops(kind: str | None = None):
    """The ops the backend uses, by ``kind`` (a benchmark's A/B run passes it, e.g.
    ``CusparseltBackend(ops=make_ops("torch"))``):

    * None: the direct binding, or, if it cannot start, PyTorch's ops with a
      :class:`DirectOpsFallbackWarning` (the same products, more host time per call);
    * "direct": the direct binding or an error (an A/B run must not quietly measure the other path);
    * "torch": PyTorch's ops."""
    import warnings

    asked = kind
    if asked is not None and (not isinstance(asked, str) or asked.lower() not in ("direct", "torch")):
        raise ValueError(f"kind must be None, 'direct' or 'torch', got {asked!r}")
    if asked is not None and asked.lower() == "torch":
        return TorchCusparseltOps()
    if asked is not None:
        return DirectCusparseltOps()
    TorchCusparseltOps()  # the environment's own errors (no GPU, old GPU) first, as they are
    try:
        return DirectCusparseltOps()
    except (CusparseltBindingError, OSError, AttributeError) as err:
        warnings.warn(f"cuSPARSELt's direct binding could not start ({err}); the 'cusparselt' backend calls "
                      "torch._cslt_sparse_mm instead (same products, a plan built per call: slower at small "
                      "shapes)", DirectOpsFallbackWarning, stacklevel=3)
        return TorchCusparseltOps()
