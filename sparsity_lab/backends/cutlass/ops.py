"""The CUTLASS sparse GEMMs as tensor functions: compress a 2:4 operand, multiply it (ctypes, no torch C++).

    compress(A)                      A (m, k) row-major, 2:4 along k  ->  SparseOperand (values, metadata)
    mm(A24, B, b_layout, out_layout, scale_a, scale_b)
        D = s_a s_b (A @ B)          s_a, s_b: float32 device scalars read in the epilogue (None: 1)

    b_layout "k": B given as (n, k) row-major (K-major B: e.g. X for Z^T = S(W) X^T)
             "n": B given as (k, n) row-major (N-major B: e.g. X for dW = MVUE(dZ^T) X; bfloat16 only)
    out_layout "col": the result as (n, m) row-major (D column-major: Z itself for Z^T = S(W) X^T)
               "row": the result as (m, n) row-major

bfloat16 operands give bfloat16; float8_e4m3fn operands (both) give bfloat16. Accumulation in float32.

Which kernel runs is a *variant* of ``sparse_gemm.cu`` (its table: element, layouts, tile, cluster,
schedule); ``config`` picks one by its tail (e.g. "256x128x128.2x1.coop"), default the one measured best at
the product's shape (``SHAPE_CONFIGS``), else ``DEFAULT_CONFIGS``, else the table's first for the element and
layouts. Shapes: ``shape_problem`` states the alignment rules (16-byte rows for
TMA) on the CPU; what the kernel itself refuses (its ``can_implement``) raises :class:`ValueError` too.
The compressor (CUTLASS's own, on the GPU) reads at most two non-zeros per group of four along k and
treats -0.0 as zero; a group with more is not 2:4 and its compressed form is undefined. The layout it
writes is stated, with a plain-PyTorch equivalent, in ``references/cutlass_layout.py``; the backends' weight
operands are written in it by kernel 22 (``kernels/prepare24_cutlass.py``), the weight gradient's MVUE(dZ^T)
by kernel 23 (``kernels/mvue_compress24_cutlass.py``).
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import torch

from .build import CutlassUnavailable, library_path
from .context import make_current

DTYPE_CODES = {torch.bfloat16: 0, torch.float8_e4m3fn: 1}
B_LAYOUTS = ("k", "n")
OUT_LAYOUTS = ("col", "row")
STATUS = {1: "the kernel cannot run this shape (CUTLASS can_implement)", 2: "initializing the kernel failed",
          3: "launching the kernel failed", 4: "no such variant", 5: "unsupported dtype",
          6: "workspace too small"}
# layout codes of the variant names: "<element>.<b><d>.<tile>.<cluster>.<schedule>"
_B_CODE, _D_CODE = {"k": "t", "n": "n"}, {"col": "c", "row": "r"}
_ELEMENT = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "e4m3"}
# the config a product runs when none is asked for, per "<element>.<b><d>", chosen on the H200 at the FFN's three
# product shapes (16384 x 16384 x 4096, 4096 x 16384 x 16384, 16384 x 4096 x 16384), every candidate timed side by
# side in one run (results/cutlass_h200_search.json; docs/measuring.md). bf16: the 256 x 128 tile was within 3 % of
# the fastest CUTLASS variant at every shape, where 128 x 256 (the earlier default) ran 16384 x 16384 x 4096 no
# faster than dense.
# E4M3 (the fast-accumulation schedule: no promotion to float32 inside the K loop; "128x128x128.1x2.coop"
# promotes): 128 x 256 was the fastest at the two shapes with k = 16384, 256 x 128 at k = 4096 (SHAPE_CONFIGS).
# A layout not named here runs the first config the table builds for it (bf16 "tr", which no backend product
# uses, has one: the earlier table's 128 x 128 tile, not searched).
DEFAULT_CONFIGS = {"bf16.tc": "256x128x128.2x1.coop", "e4m3.tc": "128x256x128.1x2.coopfast",
                   "bf16.nr": "256x128x128.1x2.coop", "e4m3.tr": "128x256x128.1x2.coopfast"}
# exceptions measured at one product shape (m, n, k): ("<element>.<b><d>", m, n, k) -> config
SHAPE_CONFIGS = {("e4m3.tc", 16384, 16384, 4096): "256x128x128.1x2.coopfast"}


def row_alignment(dtype: torch.dtype) -> int:
    """Elements per 16 bytes: every row of a TMA operand starts on a 16-byte boundary."""
    return 16 // torch.empty((), dtype=dtype).element_size()


def check_weight_for_products(backend: str, weight_shape: tuple[int, int], n: int, m: int, transposable: bool,
                              dtype: torch.dtype, tokens_multiple: int, fallback: str) -> None:
    """Refuse, with the reason, a mask request whose products a CUTLASS backend cannot run: dX = dZ S(W) runs
    on sparse tensor cores too, so the mask must be a transposable 2:4 one, and both W (forward) and W^T
    (input gradient) must meet the kernels' alignment (``shape_problem``) at a token count that is a
    multiple of ``tokens_multiple``. ``fallback``: the backend the message offers instead."""
    if (n, m) != (2, 4) or not transposable:
        raise ValueError(f"backend {backend!r} runs dX = dZ S(W) on 2:4 sparse tensor cores, which needs a "
                         f"transposable 2:4 mask: e.g. STE(transposable=True, backend={backend!r}) (got n={n}, "
                         f"m={m}, transposable={transposable}); or backend={fallback!r}")
    out_f, in_f = weight_shape
    for rows, cols, what in ((out_f, in_f, "forward"), (in_f, out_f, "input gradient")):
        problem = shape_problem(rows, tokens_multiple, cols, dtype, "k", "col")
        if problem:
            raise ValueError(f"backend {backend!r}, weight ({out_f}, {in_f}), {what} product: {problem}")


def shape_problem(m: int, n: int, k: int, dtype: torch.dtype, b_layout: str, out_layout: str) -> str | None:
    """Why the product (m, k) x (k, n) cannot run with these layouts, or None. The rules: the compressed
    A's rows (k/2 elements) and B's rows are 16-byte aligned, D's rows too (bfloat16: 8 elements)."""
    if dtype not in DTYPE_CODES:
        return f"dtype must be one of {sorted(map(str, DTYPE_CODES))}, got {dtype}"
    if b_layout not in B_LAYOUTS or out_layout not in OUT_LAYOUTS:
        return f"b_layout must be one of {B_LAYOUTS} and out_layout one of {OUT_LAYOUTS}"
    if dtype == torch.float8_e4m3fn and b_layout != "k":
        return "float8 products read B K-major only (b_layout='k'): Hopper's FP8 tensor cores take K-major operands"
    if min(m, n, k) <= 0:
        return f"every dimension must be positive, got m={m}, n={n}, k={k}"
    per_row = row_alignment(dtype)
    rules = [(k, 2 * per_row, "k (the compressed A's rows hold k/2 elements)")]
    rules.append((k, per_row, "k (B's rows)") if b_layout == "k" else (n, per_row, "n (B's rows)"))
    rules.append((m, 8, "m (D's rows, bfloat16)") if out_layout == "col" else (n, 8, "n (D's rows, bfloat16)"))
    for value, multiple, what in rules:
        if value % multiple:
            return (f"{what} must be a multiple of {multiple} for CUTLASS's 16-byte aligned rows, got {value} "
                    f"(product m={m}, n={n}, k={k}, {dtype}); pad it, or use backend 'cusparselt' or 'torch'")
    return None


@dataclass(frozen=True)
class SparseOperand:
    """A compressed 2:4 operand: ``values`` (m, k/2 padded) and ``metadata`` in CUTLASS's SM90 layout, for a
    logical (m, k) matrix of ``dtype``."""

    values: torch.Tensor
    metadata: torch.Tensor
    shape: tuple[int, int]

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype


class _Library:
    """The loaded shared library and its variant table (one per process, loaded on first use)."""

    def __init__(self, path) -> None:
        lib = ctypes.CDLL(str(path))
        p, i, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_size_t
        lib.sl_cutlass_gemm.argtypes = [i, p, p, p, p, i, i, i, p, p, p, sz, ctypes.POINTER(sz), i, p]
        lib.sl_cutlass_compressed_shape.argtypes = [i, i, i, ctypes.POINTER(i64)]
        lib.sl_cutlass_compress.argtypes = [i, p, i64, p, p, i, i, p, p]
        lib.sl_cutlass_variant_name.restype = ctypes.c_char_p
        lib.sl_cutlass_last_cuda_error.restype = ctypes.c_char_p
        self.lib = lib
        self.names = [lib.sl_cutlass_variant_name(v).decode() for v in range(lib.sl_cutlass_variant_count())]
        self.workspace: dict[tuple, int] = {}  # (variant, m, n, k) -> bytes

    def variant(self, dtype: torch.dtype, b_layout: str, out_layout: str, config: str | None,
                shape: tuple[int, int, int] | None = None) -> int:
        """The variant of these layouts running ``config``; None: the one measured best at ``shape`` (m, n, k)
        where ``SHAPE_CONFIGS`` names one, else the layouts' default."""
        prefix = f"{_ELEMENT[dtype]}.{_B_CODE[b_layout]}{_D_CODE[out_layout]}."
        if config is None:
            chosen = (shape and SHAPE_CONFIGS.get((prefix[:-1], *shape))) or DEFAULT_CONFIGS.get(prefix[:-1])
            if chosen and prefix + chosen in self.names:
                config = chosen
        for v, name in enumerate(self.names):
            if name.startswith(prefix) and (config is None or name[len(prefix):] == config):
                return v
        offered = [n[len(prefix):] for n in self.names if n.startswith(prefix)]
        raise ValueError(f"no CUTLASS variant {prefix}{config or '*'}; configs for these layouts: {offered}")


_LOCK = threading.Lock()
_LIBRARY: _Library | None = None


def library() -> _Library:
    """The library, built (cached on disk) and loaded on first call."""
    global _LIBRARY
    with _LOCK:
        if _LIBRARY is None:
            _LIBRARY = _Library(library_path())
        return _LIBRARY


def use_library(path) -> _Library:
    """Load the library at ``path`` (e.g. ``build.candidate_library``'s, for a search) in place of the shipped
    one: every later product of this process runs its variants."""
    global _LIBRARY
    with _LOCK:
        _LIBRARY = _Library(path)
        return _LIBRARY


def configs(dtype: torch.dtype, b_layout: str = "k", out_layout: str = "col") -> list[str]:
    """The ``config`` names built for an element type and layouts (tile.cluster.schedule)."""
    prefix = f"{_ELEMENT[dtype]}.{_B_CODE[b_layout]}{_D_CODE[out_layout]}."
    return [n[len(prefix):] for n in library().names if n.startswith(prefix)]


def _stream(device: torch.device) -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)


def _check_cuda(t: torch.Tensor, what: str) -> None:
    if not t.is_cuda:
        raise ValueError(f"{what} must be a CUDA tensor, got one on {t.device}")
    if t.data_ptr() % 16:
        raise ValueError(f"{what} must start on a 16-byte boundary (TMA), got address {t.data_ptr():#x}")


def _raise(status: int, lib, what: str) -> None:
    if status:
        cuda = lib.sl_cutlass_last_cuda_error().decode()
        raise (ValueError if status == 1 else RuntimeError)(f"CUTLASS {what}: {STATUS.get(status, status)} "
                                                            f"(CUDA: {cuda})")


def compress(a: torch.Tensor) -> SparseOperand:
    """CUTLASS's compressed form of a 2:4 matrix a (m, k), row-major (unit column stride), on the GPU."""
    if a.dim() != 2 or a.dtype not in DTYPE_CODES:
        raise ValueError(f"compress takes a 2-D bfloat16 or float8_e4m3fn tensor, got {tuple(a.shape)} {a.dtype}")
    _check_cuda(a, "the operand to compress")
    m, k = a.shape
    if a.stride(1) != 1 or a.stride(0) < k:
        raise ValueError(f"the operand to compress must be row-major (unit column stride), got strides {a.stride()}")
    if k % (2 * row_alignment(a.dtype)):
        raise ValueError(f"k={k} must be a multiple of {2 * row_alignment(a.dtype)} for {a.dtype} "
                         "(the compressed rows hold k/2 elements, 16-byte aligned)")
    lib = library()
    code = DTYPE_CODES[a.dtype]
    sizes = (ctypes.c_int64 * 6)()
    _raise(lib.lib.sl_cutlass_compressed_shape(code, m, k, sizes), lib.lib, "compressed shape")
    mc, kc, me, ke, e_bytes, ws = list(sizes)
    values = torch.zeros(mc, kc, dtype=a.dtype, device=a.device)
    metadata = torch.zeros(me * ke * e_bytes, dtype=torch.uint8, device=a.device)
    workspace = torch.empty(max(ws, 1), dtype=torch.uint8, device=a.device)
    with torch.cuda.device(a.device):  # the entry points launch on the current device
        make_current(a.device)
        status = lib.lib.sl_cutlass_compress(code, a.data_ptr(), a.stride(0), values.data_ptr(),
                                             metadata.data_ptr(), m, k, workspace.data_ptr(), _stream(a.device))
    _raise(status, lib.lib, "compress")
    return SparseOperand(values, metadata, (m, k))


def mm(a: SparseOperand, b: torch.Tensor, b_layout: str = "k", out_layout: str = "col",
       scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None,
       config: str | None = None) -> torch.Tensor:
    """D = s_a s_b (A @ B) for the compressed A (m, k) (see the module docstring for the layouts).
    Returns bfloat16, (n, m) for out_layout "col", (m, n) for "row"."""
    m, k = a.shape
    if b.dim() != 2 or not b.is_contiguous():
        raise ValueError(f"B must be a contiguous 2-D tensor, got shape {tuple(b.shape)} strides {b.stride()}")
    if b.dtype != a.dtype:
        raise ValueError(f"A and B must have one dtype, got {a.dtype} and {b.dtype}")
    if b_layout == "k":
        n, kb = b.shape
    else:
        kb, n = b.shape
    if kb != k:
        raise ValueError(f"inner dimensions differ: A is {tuple(a.shape)}, B ({b_layout}-major) is {tuple(b.shape)}")
    problem = shape_problem(m, n, k, a.dtype, b_layout, out_layout)
    if problem:
        raise ValueError(problem)
    _check_cuda(b, "B")
    if a.values.device != b.device:
        raise ValueError(f"A and B must be on one device, got {a.values.device} and {b.device}")
    scales = []
    for s, what in ((scale_a, "scale_a"), (scale_b, "scale_b")):
        if s is not None and (s.dtype != torch.float32 or s.numel() != 1 or s.device != b.device):
            raise ValueError(f"{what} must be a one-element float32 tensor on {b.device}, got {s.dtype} "
                             f"{tuple(s.shape)} on {s.device}")
        scales.append(None if s is None else s.data_ptr())
    lib = library()
    variant = lib.variant(a.dtype, b_layout, out_layout, config, (m, n, k))
    out = torch.empty((n, m) if out_layout == "col" else (m, n), dtype=torch.bfloat16, device=b.device)
    key = (variant, m, n, k)
    needed = lib.workspace.get(key)
    if needed is None:  # ask once per shape: whether it runs, and the workspace it needs
        size = ctypes.c_size_t(0)
        _raise(lib.lib.sl_cutlass_gemm(variant, None, None, None, None, m, n, k, None, None, None, 0,
                                       ctypes.byref(size), 0, None), lib.lib, f"gemm {lib.names[variant]} m={m} n={n} k={k}")
        needed = lib.workspace[key] = size.value
    workspace = torch.empty(needed, dtype=torch.uint8, device=b.device) if needed else None
    with torch.cuda.device(b.device):  # the entry points launch on the current device
        make_current(b.device)  # the TMA descriptors are written through the driver API (context.py)
        status = lib.lib.sl_cutlass_gemm(variant, a.values.data_ptr(), a.metadata.data_ptr(), b.data_ptr(),
                                         out.data_ptr(), m, n, k, scales[0], scales[1],
                                         None if workspace is None else workspace.data_ptr(), needed, None, 1,
                                         _stream(b.device))
    _raise(status, lib.lib, f"gemm {lib.names[variant]} m={m} n={n} k={k}")
    return out
