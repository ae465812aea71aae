"""Per-shape cuSPARSELt algorithm choice, each candidate checked against a dense product first.

Why: on the H100 the default ``alg_id=0`` is rarely the fastest: the search picked another id at 15
of the 16 FFN products of ``results/cusparselt_calls_h100.json``, and at the large ones (often id 17
for bf16) the picked id is the one that beats dense there (docs/measuring.md). And some algorithms return wrong
results, non-deterministically (https://github.com/pytorch/pytorch/issues/155333). So for every product key
(m, k, n, dtype, B layout, transpose_result), once:

1. build synthetic operands of exactly that key: A (m, k) with a random 2:4 pattern along its
   rows, B (k, n) in the layout the backend passes (contiguous, or the ``.t()`` of a contiguous
   (n, k)), and the reference ``A @ B`` in float32 (TF32 off);
2. candidates: cuSPARSELt's own pick (``mm_search``), then every id up to its ``max_alg_id``;
3. each candidate runs ``repeats`` times; every run must pass :func:`check_product`; a candidate
   that raises (an id the shape does not support) is recorded and skipped;
4. the fastest passing candidate wins; none passing raises (a wrong product is never used).

Synthetic rather than the layer's own data: the check then does not depend on what a weight or a
gradient happens to hold (all-zero groups would hide a wrong metadata read), and the choice can be
cached per shape. The whole table (time, error, failure of every candidate) is kept for reports.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

from .ops import AlgConfig


@dataclass(frozen=True)
class ProductKey:
    """One sparse product ``A (m, k) @ B (k, n)``: shapes, dtype and layouts."""

    m: int
    k: int
    n: int
    dtype: torch.dtype
    b_transposed: bool  # B passed as Y.t() of a contiguous (n, k) Y
    transpose_result: bool  # result returned as (n, m) row-major

    def describe(self) -> str:
        dt = str(self.dtype).replace("torch.", "")
        return (f"A({self.m}x{self.k})@B({self.k}x{self.n}) {dt} B{'^T' if self.b_transposed else ''} "
                f"{'result^T' if self.transpose_result else 'result'}")


@dataclass
class CandidateResult:
    config: AlgConfig
    ms: float | None = None
    rel_err: float | None = None  # worst relative Frobenius error over the repeats
    ok: bool = False
    error: str | None = None


@dataclass
class AlgorithmChoice:
    key: ProductKey
    config: AlgConfig
    ms: float
    rel_err: float
    searched: AlgConfig | None  # cuSPARSELt's own pick (None when the search failed)
    candidates: list[CandidateResult] = field(default_factory=list)
    search_error: str | None = None  # why cuSPARSELt's own search failed, if it did

    def summary(self) -> dict:
        wrong = [c.config.describe() for c in self.candidates if c.error is None and not c.ok]
        failed = [c.config.describe() for c in self.candidates if c.error is not None]
        return {
            "key": self.key.describe(), "chosen": self.config.describe(), "ms": self.ms, "rel_err": self.rel_err,
            "searched": self.searched.describe() if self.searched else None, "search_error": self.search_error,
            "candidates": len(self.candidates), "wrong": wrong, "raised": failed,
        }


def check_product(out: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> tuple[bool, float]:
    """Is ``out`` (the product rounded to ``dtype``) the float32 ``reference``? Returns (ok, rel_err).

    Bound per element: ``|out - ref| <= 2 eps (|ref| + rms(ref))``. One rounding to ``dtype`` costs
    at most eps/2 |ref|; float32 accumulation in another order costs far less than eps rms(ref) at
    these depths. A wrong algorithm (wrong metadata, a skipped tile) misses by O(|ref|). The relative
    Frobenius error is returned for reports.
    """
    if out.shape != reference.shape:
        return False, math.inf
    out32, ref = out.float(), reference.float()
    if not bool(torch.isfinite(out32).all()):
        return False, math.inf
    eps = torch.finfo(dtype).eps
    rms = ref.pow(2).mean().sqrt()
    err = (out32 - ref).abs()
    ok = bool((err <= 2 * eps * (ref.abs() + rms)).all())
    rel = float(err.pow(2).sum().sqrt() / ref.pow(2).sum().sqrt().clamp_min(1e-30))
    return ok, rel


def choose_algorithm(candidates: Sequence[AlgConfig], run: Callable[[AlgConfig], torch.Tensor],
                     reference: torch.Tensor, time_ms: Callable[[AlgConfig], float], dtype: torch.dtype,
                     key: ProductKey, searched: AlgConfig | None = None, repeats: int = 2) -> AlgorithmChoice:
    """The fastest candidate whose every run passes :func:`check_product`; raises if none does."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    results: list[CandidateResult] = []
    seen: set[AlgConfig] = set()
    for config in candidates:
        if config in seen:
            continue
        seen.add(config)
        result = CandidateResult(config)
        results.append(result)
        try:
            errs = []
            ok = True
            for _ in range(repeats):  # wrong algorithms are wrong only sometimes (pytorch/pytorch#155333)
                run_ok, rel = check_product(run(config), reference, dtype)
                ok &= run_ok
                errs.append(rel)
            result.rel_err, result.ok = max(errs), ok
            if ok:
                result.ms = float(time_ms(config))
        except Exception as err:  # an id the shape does not support raises inside cuSPARSELt
            result.error = f"{type(err).__name__}: {err}"[:300]
    passing = [r for r in results if r.ok and r.ms is not None and math.isfinite(r.ms)]
    if not passing:
        lines = "; ".join(f"{r.config.describe()}: " + (r.error or f"rel_err {r.rel_err:.3g}") for r in results)
        raise RuntimeError(f"no cuSPARSELt algorithm gave a correct product for {key.describe()} "
                           f"(each checked against a float32 dense product): {lines}")
    best = min(passing, key=lambda r: r.ms)
    return AlgorithmChoice(key, best.config, best.ms, best.rel_err, searched, results)


def synthetic_operands(key: ProductKey, device: torch.device, seed: int = 0):
    """(A 2:4 along rows (m, k), B in the key's layout, float32 reference of the key's result)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    a = torch.randn(key.m, key.k, generator=gen, device=device)
    # a random one of the 6 patterns per group: keep the two smallest of 4 random ranks
    ranks = torch.rand(key.m, key.k // 4, 4, generator=gen, device=device).argsort(-1).argsort(-1)
    a = (a * (ranks < 2).reshape(key.m, key.k)).to(key.dtype)
    if key.b_transposed:
        b = torch.randn(key.n, key.k, generator=gen, device=device).to(key.dtype).t()
    else:
        b = torch.randn(key.k, key.n, generator=gen, device=device).to(key.dtype)
    with _fp32_exact():
        ref = a.float() @ b.float()
    return a, b, (ref.t() if key.transpose_result else ref)


class _fp32_exact:
    """TF32 off for the reference product (its 10-bit mantissa would blur the check)."""

    def __enter__(self):
        self._saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self._saved


class SparseOps(Protocol):
    def compress(self, a: torch.Tensor) -> torch.Tensor: ...
    def mm(self, compressed, b, bias, transpose_result: bool, config: AlgConfig) -> torch.Tensor: ...
    def search(self, compressed, b, transpose_result: bool) -> tuple[AlgConfig, int | None]: ...
    def time_ms(self, fn: Callable[[], object], reps: int = 5, warmup: int = 1) -> float: ...


class AlgorithmCache:
    """The chosen configuration per :class:`ProductKey`, searched and checked on first use.

    sweep: try every algorithm id besides cuSPARSELt's own pick (slower search, better choice).
    max_sweep: the largest id tried (also when cuSPARSELt does not report its maximum).
    """

    def __init__(self, ops: SparseOps, sweep: bool = True, repeats: int = 2, reps: int = 3, max_sweep: int = 63):
        self.ops, self.sweep, self.repeats, self.reps, self.max_sweep = ops, sweep, repeats, reps, max_sweep
        self.choices: dict[ProductKey, AlgorithmChoice] = {}

    def get(self, key: ProductKey, device: torch.device) -> AlgConfig:
        if key not in self.choices:
            self.choices[key] = self.search(key, device)
        return self.choices[key].config

    def search(self, key: ProductKey, device: torch.device) -> AlgorithmChoice:
        a, b, ref = synthetic_operands(key, device)
        compressed = self.ops.compress(a)
        searched, max_id, search_error = None, None, None
        try:
            searched, max_id = self.ops.search(compressed, b, key.transpose_result)
        except Exception as err:  # the search itself failing leaves the sweep (and the report says so)
            search_error = f"{type(err).__name__}: {err}"[:300]
        candidates = [searched] if searched is not None else []
        if self.sweep or searched is None:
            top = min(max_id, self.max_sweep) if max_id is not None else self.max_sweep
            candidates += [AlgConfig(i) for i in range(top + 1)]

        def run(config: AlgConfig) -> torch.Tensor:
            return self.ops.mm(compressed, b, None, key.transpose_result, config)

        def time_ms(config: AlgConfig) -> float:
            return self.ops.time_ms(lambda: run(config), reps=self.reps)

        choice = choose_algorithm(candidates, run, ref, time_ms, key.dtype, key, searched, self.repeats)
        choice.search_error = search_error
        return choice

    def summary(self) -> list[dict]:
        return [choice.summary() for choice in self.choices.values()]
