"""cuSPARSELt through PyTorch: the environment checks, the minimum shapes and a thin wrapper.

The contract (read in PyTorch's source, not yet re-verified on a GPU by this module's tests)
    ``torch._cslt_compress(A)``: A 2-D, contiguous, row-major (rows, cols), already 2:4 along each
    row (groups of 4 consecutive columns). Returns a 1-D tensor of A's dtype with
    ``rows * cols * 9 / 16`` elements for 16-bit dtypes (``* 10 / 16`` for int8 / fp8): the kept
    values plus the metadata. The layout is not documented: on sm90 the values come first, row-major, then
    the metadata, as mapped from dumps on the H100 (``sparsity_lab.references.cusparselt_layout``
    states it; ``benchmarks.cusparselt_probe`` part (b) probes it).
    Source: pytorch/pytorch ``aten/src/ATen/native/sparse/cuda/cuSPARSELtOps.cpp``,
    ``_cslt_compress``: ``cusparseLtStructuredDescriptorInit(rows=size(0), cols=size(1),
    ld=size(1), CUSPARSE_ORDER_ROW, CUSPARSELT_SPARSITY_50_PERCENT)`` then ``cusparseLtSpMMACompress2``.

    ``torch._cslt_sparse_mm(A_c, B, bias=None, alpha=None, out_dtype=None, transpose_result=False,
    alg_id=0, split_k=1, split_k_mode=-1)`` computes ``D = A @ B`` with A the compressed sparse
    operand, (m, k) row-major, and B dense (k, n). Same file, ``_cslt_sparse_mm_impl``:

    * ``k = B.size(0)``, ``n = B.size(1)``, ``m = A_c.numel() * 16 / compression_factor / k``:
      the sparse operand's shape is inferred from B, nothing checks it against the compressed one;
    * B contiguous: described as row-major (k, n), op NON_TRANSPOSE. B *not contiguous*: described
      as row-major (n, k) with ld k and op TRANSPOSE, i.e. B is assumed to be ``Y.t()`` for a
      contiguous (n, k) tensor Y. Any other strided B would be read wrongly and silently, so this
      module only ever passes a contiguous tensor or the ``.t()`` of one (``transposed_view``);
    * ``transpose_result=False``: D is allocated (m, n), descriptor row-major (m, n).
      ``transpose_result=True``: D is allocated (n, m), descriptor column-major (m, n) with ld m:
      the same memory as a row-major (n, m) tensor, i.e. the call returns ``(A @ B)^T``, contiguous;
    * ``bias``: a pointer set as ``CUSPARSELT_MATMUL_BIAS_POINTER``, one value per row of D (length
      m); the meta function (``torch/_meta_registrations.py``, ``meta__cslt_sparse_mm``) checks
      ``bias.size(0) == m`` and gives the output shape ``(n, m) if transpose_result else (m, n)``;
    * ``alpha`` with one element is read with ``.item()`` (a host sync, and not capturable in a
      CUDA graph): never passed here.

    ``torch._C._cusparselt.mm_search(A_c, B, bias, alpha, out_dtype, transpose_result)`` runs
    ``cusparseLtMatmulSearch`` and returns ``(alg_id, split_k, split_k_mode, max_alg_id)``
    (pytorch/pytorch ``torch/csrc/cuda/shared/cusparselt.cpp``, ``mmSearch``; older builds return a
    bool in third place). ``torch._cslt_sparse_mm_search`` is the deprecated form (alg id only).

    Versions read (stored copies of the public source): the
    cuSPARSELtOps.cpp with ``split_k`` / ``split_k_one_kernel`` and the FP8 cases (cuSPARSELt >= 0.6.2),
    and an early one without alg ids; the operand, ``transpose_result`` and bias logic above is
    identical in both. The installed torch 2.13 stubs (``torch/_C/_VariableFunctions.pyi``) show the
    newer signature with ``split_k_mode: int = -1``; torch 2.11 on the H100 machine returns a split_k mode
    from ``mm_search`` too (``results/cusparselt_calls_h100.json``: "alg 17 split_k -1 mode 2").

Minimum shapes (PyTorch's ``SparseSemiStructuredTensorCUSPARSELT`` constraints in
``torch/sparse/semi_structured.py``): the sparse operand's rows and columns are multiples of 16 for float16 / bfloat16 and of 32 for
int8 / float8_e4m3fn. The dense operand's other dimension (the tokens) is padded by the backend
to the same multiple.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

# multiple required of both dimensions of the sparse operand, per dtype
SPARSE_MULTIPLE: dict[torch.dtype, int] = {
    torch.float16: 16,
    torch.bfloat16: 16,
    torch.int8: 32,
    torch.float8_e4m3fn: 32,
}
# dtypes this backend runs its products in (fp8 is a separate path: backends/cusparselt/fp8_train.py)
PRODUCT_DTYPES = (torch.bfloat16, torch.float16)
MIN_CAPABILITY = (8, 0)


@dataclass(frozen=True)
class AlgConfig:
    """One cuSPARSELt algorithm configuration: what ``_cslt_sparse_mm`` takes besides operands."""

    alg_id: int = 0
    split_k: int = 1
    split_k_mode: int = -1

    def describe(self) -> str:
        if self.split_k == 1:
            return f"alg {self.alg_id}"
        return f"alg {self.alg_id} split_k {self.split_k} mode {self.split_k_mode}"


class CusparseltUnavailable(RuntimeError):
    """cuSPARSELt cannot run here (no CUDA GPU, compute capability < 8.0, or not built in)."""


def unavailable_reason(device: torch.device | int | None = None) -> str | None:
    """Why cuSPARSELt 2:4 products cannot run on ``device`` (default: the current GPU); None if they can."""
    if not torch.cuda.is_available():
        return "no CUDA GPU is available (torch.cuda.is_available() is False)"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (f"the GPU ({name}) has compute capability {major}.{minor}; 2:4 sparse tensor cores "
                f"need >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} (Ampere or newer)")
    cslt = getattr(torch.backends, "cusparselt", None)
    if cslt is None or not cslt.is_available():
        return (f"this PyTorch build ({torch.__version__}) has no cuSPARSELt "
                "(torch.backends.cusparselt.is_available() is False)")
    return None


def require_cusparselt(device: torch.device | int | None = None) -> None:
    """Raise :class:`CusparseltUnavailable` with the reason when cuSPARSELt cannot run."""
    reason = unavailable_reason(device)
    if reason is not None:
        raise CusparseltUnavailable(f"backend 'cusparselt' cannot run: {reason}; use backend='torch'")


def sparse_multiple(dtype: torch.dtype) -> int:
    if dtype not in SPARSE_MULTIPLE:
        names = ", ".join(str(d).replace("torch.", "") for d in SPARSE_MULTIPLE)
        raise TypeError(f"cuSPARSELt 2:4 operands must have dtype in ({names}), got {dtype}")
    return SPARSE_MULTIPLE[dtype]


def check_product_dtype(dtype: torch.dtype) -> None:
    if dtype not in PRODUCT_DTYPES:
        raise TypeError(
            f"backend 'cusparselt' runs bfloat16 or float16 products, but the layer computes in {dtype}: "
            "run under torch.autocast('cuda', dtype=torch.bfloat16) or convert the model to bfloat16 "
            "(or use backend='cusparselt_auto', which runs unsupported products dense and reports it)")


def check_sparse_shape(rows: int, cols: int, dtype: torch.dtype, what: str) -> None:
    """Both dimensions of a sparse operand multiples of the dtype's minimum (16 or 32)."""
    mult = sparse_multiple(dtype)
    if rows % mult or cols % mult:
        raise ValueError(
            f"{what} has shape ({rows}, {cols}); cuSPARSELt needs both dimensions of a {dtype} 2:4 "
            f"operand to be multiples of {mult}: resize the layer, or use backend='cusparselt_auto' "
            "(runs such layers dense and reports it) or backend='torch'")


def sparse_shape_problem(rows: int, cols: int, dtype: torch.dtype) -> str | None:
    """The reason an operand cannot be sparse (dtype or shape), or None."""
    if dtype not in PRODUCT_DTYPES:
        return f"{str(dtype).replace('torch.', '')} products have no sparse path here"
    mult = SPARSE_MULTIPLE[dtype]
    if rows % mult or cols % mult:
        return f"shape ({rows}, {cols}) is not a multiple of {mult}"
    return None


def padded(size: int, dtype: torch.dtype) -> int:
    """``size`` rounded up to the dtype's multiple (the tokens of a dense or MVUE'd operand)."""
    mult = sparse_multiple(dtype)
    return -(-size // mult) * mult


def transposed_view(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``(Y.t(), copied)`` with Y = x made contiguous: the only non-contiguous B that
    ``_cslt_sparse_mm`` reads correctly (see the module docstring). ``copied`` says whether x had
    to be copied first."""
    if x.is_contiguous():
        return x.t(), False
    return x.contiguous().t(), True


class TorchCusparseltOps:
    """The cuSPARSELt calls the backend makes, through PyTorch's private ops. Construction checks
    the environment (raises :class:`CusparseltUnavailable`). Tests swap in a CPU stand-in with the
    same methods (tests/test_cusparselt_backend.py) to check the backend's operand order."""

    name = "torch"

    def __init__(self) -> None:
        require_cusparselt()

    @staticmethod
    def check_device(t: torch.Tensor, name: str) -> None:
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}; backend 'cusparselt' runs its products on CUDA "
                             "tensors: move the model and its inputs to the GPU (or use backend='torch')")

    @staticmethod
    def compress(a: torch.Tensor) -> torch.Tensor:
        """A (m, k) contiguous, 2:4 along rows -> cuSPARSELt's compressed form (1-D)."""
        return torch._cslt_compress(a)

    @staticmethod
    def mm(compressed: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, transpose_result: bool,
           config: AlgConfig) -> torch.Tensor:
        """``A @ B`` (m, n), or ``(A @ B)^T`` (n, m) contiguous with ``transpose_result``."""
        kwargs = {}
        if config.split_k != 1:  # keep the call valid on builds without the split-k arguments
            kwargs = {"split_k": config.split_k, "split_k_mode": config.split_k_mode}
        return torch._cslt_sparse_mm(compressed, b, bias=bias, transpose_result=transpose_result,
                                     alg_id=config.alg_id, **kwargs)

    @staticmethod
    def search(compressed: torch.Tensor, b: torch.Tensor, transpose_result: bool) -> tuple[AlgConfig, int | None]:
        """cuSPARSELt's own pick (``cusparseLtMatmulSearch``) and the largest algorithm id, if known."""
        search = getattr(getattr(torch._C, "_cusparselt", None), "mm_search", None)
        if search is None:  # older builds: the deprecated entry point, alg id only
            return AlgConfig(int(torch._cslt_sparse_mm_search(compressed, b, transpose_result=transpose_result))), None
        alg_id, split_k, split_k_mode, max_alg_id = search(compressed, b, None, None, None, transpose_result)
        return AlgConfig(int(alg_id), int(split_k), int(split_k_mode)), int(max_alg_id)

    @staticmethod
    def time_ms(fn: Callable[[], object], reps: int = 5, warmup: int = 1) -> float:
        """Mean milliseconds per call over ``reps`` back-to-back calls (CUDA events, eager: the host
        overhead of each call counts when it exceeds the kernel time)."""
        for _ in range(warmup):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / reps
