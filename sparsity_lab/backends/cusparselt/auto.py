"""The ``auto`` policy: per product shape, sparse where it beats dense, and a report that says which.

Both choices compute the same mathematics: the sparse product on the compressed 2:4 operand, or the
dense product of the same masked operand (S(W), S(W)^T or MVUE(dZ^T) with its zeros). Only speed
differs, so the choice is a measurement: for each :class:`ProductShape` the first time it is seen,
``measure(shape)`` returns ``(dense_ms, sparse_ms)`` and the sparse path is taken when
``dense_ms / sparse_ms >= min_speedup``. Shapes cuSPARSELt cannot run (dtype, minimum sizes) are
dense with the reason recorded and no measurement.

What ``sparse_ms`` counts is the measure function's business (the cuSPARSELt backend counts the
per-step compression of the operand once, as if each optimizer step had a single micro-step: the
conservative case). The measuring runs only on a GPU; the selection and the report here are plain
Python, tested on the CPU with injected timings.

The forward and the input gradient share the operand S(W): with ``measure_layer`` set (the cuSPARSELt
backend sets it) they are decided together per layer (``layer_plan.py``: a mixed plan pays for both
operand forms, so it wins only where that still pays); the weight gradient stays per product.

Across libraries ("sparse_auto", ``backends/sparse_auto.py``) ``measure(shape)`` returns a mapping
``{"dense": ms, library: ms, ...}`` instead, one entry per library that can run the shape: the fastest
library is taken when ``dense_ms / its ms >= min_speedup``, and the :class:`Decision` names it
(``library``) beside every library's time (``library_ms``) and the libraries that could not run the
shape, with the reason (``excluded``). ``measure_layer`` returns ``LibraryLayerTimes`` for such a policy.

``sparsity_lab.sparsify.backend_report(model)`` lists every SparseLinear: which backend it asked
for, which one runs (with the reason when the reference runs instead), and per product whether it
is sparse, with the measured speed-up where ``auto`` decided (and on which library).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..base import PRODUCTS
from .layer_plan import (DENSE, LayerDecision, LayerShape, LayerTimes, LibraryLayerTimes, choose_plan, plan_name,
                         unsupported_plan)


@dataclass(frozen=True)
class ProductShape:
    """``A (m, k) @ B (k, n)`` of one product of a linear layer with weight (out, in) and ``tokens`` rows.

    forward     Z^T  = S(W) X^T          m = out, k = in,     n = tokens
    grad_input  dX^T = S(W)^T dZ^T       m = in,  k = out,    n = tokens
    grad_weight dW   = MVUE(dZ^T) X      m = out, k = tokens, n = in
    """

    product: str
    m: int
    k: int
    n: int
    dtype: str

    def __post_init__(self) -> None:
        if self.product not in PRODUCTS:
            raise ValueError(f"product must be one of {PRODUCTS}, got {self.product!r}")
        for name in ("m", "k", "n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")

    @classmethod
    def of_layer(cls, product: str, out_features: int, in_features: int, tokens: int, dtype: str) -> "ProductShape":
        if product == "forward":
            return cls(product, out_features, in_features, tokens, dtype)
        if product == "grad_input":
            return cls(product, in_features, out_features, tokens, dtype)
        return cls(product, out_features, tokens, in_features, dtype)

    def weight_shape(self) -> tuple[int, int]:
        """(out, in) of the layer this product belongs to."""
        if self.product == "forward":
            return self.m, self.k
        if self.product == "grad_input":
            return self.k, self.m
        return self.m, self.n

    @property
    def tokens(self) -> int:
        return self.k if self.product == "grad_weight" else self.n


@dataclass(frozen=True)
class Decision:
    shape: ProductShape
    sparse: bool
    dense_ms: float | None
    sparse_ms: float | None
    reason: str
    layer: LayerDecision | None = None  # set when the layer's plan decided this product
    # across libraries (sparse_auto): the library sparse_ms is of (the one run when sparse; else the fastest
    # measured), every measured library's ms, and the libraries that cannot run the shape with the reason
    library: str | None = None
    library_ms: tuple[tuple[str, float], ...] = ()
    excluded: tuple[tuple[str, str], ...] = ()

    @property
    def speedup(self) -> float | None:
        """dense_ms / sparse_ms (> 1: sparse is faster), None when nothing was measured."""
        if self.dense_ms is None or self.sparse_ms is None:
            return None
        return self.dense_ms / self.sparse_ms

    @property
    def runs_on(self) -> str:
        """"dense", or the library the product runs on ("sparse" for a policy of one library)."""
        return self.library or "sparse" if self.sparse else DENSE

    def describe(self) -> str:
        what = "sparse" if self.sparse else "dense"
        if self.library is not None and self.sparse:
            what = f"sparse on {self.library}"
        if self.layer is not None:
            text = f"{what} (layer plan: {self.layer.describe()})"
        elif self.speedup is None:
            text = f"{what} ({self.reason})"
        else:
            text = f"{what} {self.speedup:.2f}x @{self.shape.tokens} tokens"
        if len(self.library_ms) > 1 and self.dense_ms is not None:
            text += " [" + ", ".join(f"{name} {self.dense_ms / ms:.2f}x" for name, ms in self.library_ms) + "]"
        return text + "".join(f"; {name} cannot run it: {why}" for name, why in self.excluded)


def _check_ms(value: object, name: str, shape: ProductShape) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"measure({shape}) returned {name}={value!r}; expected a positive finite number of ms")
    return float(value)


def _layer_product(shape: ProductShape, choice, times, decision: LayerDecision,
                   excluded: tuple[tuple[str, str], ...]) -> Decision:
    """One product's :class:`Decision` under a layer's plan: ``choice`` is its entry of the plan (a bool for
    one library, "dense" or a library's name across libraries); the times are the product's alone."""
    product = shape.product
    if not isinstance(times, LibraryLayerTimes):  # one library (or unmeasured)
        dense_ms = getattr(times, f"{product}_dense") if times else None
        sparse_ms = getattr(times, f"{product}_sparse") if times else None
        return Decision(shape, bool(choice) and choice != DENSE, dense_ms, sparse_ms, decision.reason, decision,
                        excluded=excluded)
    by_library = tuple((name, getattr(t, product)) for name, t in times.libraries)
    library, sparse_ms = (choice, dict(by_library)[choice]) if choice != DENSE else min(by_library, key=lambda p: p[1])
    return Decision(shape, choice != DENSE, getattr(times, f"{product}_dense"), sparse_ms, decision.reason, decision,
                    library, by_library, excluded)


@dataclass
class AutoPolicy:
    """Sparse or dense per product shape, decided once per shape from ``measure``.

    measure: ProductShape -> (dense_ms, sparse_ms); on a GPU the cuSPARSELt backend supplies one.
    measure_layer: LayerShape -> LayerTimes, for ``decide_layer`` (forward and grad_input together);
    None: those two are decided per product too.
    min_speedup: sparse is chosen when dense_ms / sparse_ms >= min_speedup (default 1.0).
    """

    measure: Callable[[ProductShape], tuple[float, float]] | None = None
    min_speedup: float = 1.0
    label: str = ""  # how the timings were taken, for the reasons (e.g. " in a CUDA graph")
    measure_layer: Callable[[LayerShape], LayerTimes] | None = None
    _decisions: dict[ProductShape, Decision] = field(default_factory=dict, repr=False)
    _layers: dict[LayerShape, LayerDecision] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        s = self.min_speedup
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
            raise ValueError(f"min_speedup must be a positive finite number, got {s!r}")

    def decide(self, shape: ProductShape, unsupported: str | None = None,
               excluded: Mapping[str, str] | None = None) -> Decision:
        """The (cached) decision for ``shape``; ``unsupported`` (a reason) forces dense unmeasured;
        ``excluded``: {library: why it cannot run the shape}, reported with the decision."""
        if shape in self._decisions:
            return self._decisions[shape]
        left_out = tuple((excluded or {}).items())
        if unsupported is not None:
            decision = Decision(shape, False, None, None, unsupported, excluded=left_out)
        else:
            if self.measure is None:
                raise RuntimeError("AutoPolicy has no measure function: it decides from timings taken on a GPU "
                                   "(the cuSPARSELt backend provides one); pass measure=... to decide elsewhere")
            measured = self.measure(shape)
            by_library = dict(measured) if isinstance(measured, Mapping) else None
            if by_library is not None:  # across libraries: {"dense": ms, library: ms, ...}
                if DENSE not in by_library or len(by_library) < 2:
                    raise ValueError(f"measure({shape}) returned {by_library!r}; expected ms for 'dense' and at "
                                     "least one library")
                dense_ms = _check_ms(by_library.pop(DENSE), "dense_ms", shape)
                times = tuple((name, _check_ms(ms, f"{name} ms", shape)) for name, ms in by_library.items())
                library, sparse_ms = min(times, key=lambda pair: pair[1])
            else:
                dense_ms, sparse_ms = measured
                dense_ms = _check_ms(dense_ms, "dense_ms", shape)
                sparse_ms = _check_ms(sparse_ms, "sparse_ms", shape)
                library, times = None, ()
            sparse = dense_ms / sparse_ms >= self.min_speedup
            reason = f"measured{self.label}; sparse needs >= {self.min_speedup:g}x"
            decision = Decision(shape, sparse, dense_ms, sparse_ms, reason, None, library, times, left_out)
        self._decisions[shape] = decision
        return decision

    def decide_layer(self, shape: LayerShape, unsupported: str | None = None,
                     excluded: Mapping[str, str] | None = None) -> LayerDecision:
        """The (cached) plan for the forward and grad_input of a layer ``shape`` (``layer_plan.py``);
        their per-product :class:`Decision` entries are recorded too (with the product times alone),
        so the reports list them. ``unsupported`` (a reason) forces all-dense, unmeasured; ``excluded``:
        {library: why it cannot run the layer} (a policy across libraries: measure_layer gives
        ``LibraryLayerTimes``), reported with the decisions."""
        if shape in self._layers:
            return self._layers[shape]
        left_out = tuple((excluded or {}).items())
        if unsupported is not None:
            decision, times = unsupported_plan(shape, unsupported, libraries=excluded is not None), None
        else:
            if self.measure_layer is None:
                raise RuntimeError("AutoPolicy has no measure_layer function: per-layer plans are decided from "
                                   "timings taken on a GPU (the cuSPARSELt backend provides one)")
            times = self.measure_layer(shape)
            if not isinstance(times, (LayerTimes, LibraryLayerTimes)):
                raise TypeError(f"measure_layer({shape}) must return LayerTimes or LibraryLayerTimes, got "
                                f"{type(times).__name__}")
            decision = choose_plan(shape, times, self.min_speedup, self.label)
        self._layers[shape] = decision
        for product, choice in zip(("forward", "grad_input"), decision.plan):
            ps = ProductShape.of_layer(product, shape.out_features, shape.in_features, shape.tokens, shape.dtype)
            self._decisions[ps] = _layer_product(ps, choice, times, decision, left_out)
        return decision

    @property
    def layer_decisions(self) -> list[LayerDecision]:
        return list(self._layers.values())

    @property
    def decisions(self) -> list[Decision]:
        return list(self._decisions.values())

    def decisions_for(self, out_features: int, in_features: int) -> dict[str, list[Decision]]:
        """Decisions per product for a layer with weight (out, in) (one per token count seen)."""
        found: dict[str, list[Decision]] = {p: [] for p in PRODUCTS}
        for d in self._decisions.values():
            if d.shape.weight_shape() == (out_features, in_features):
                found[d.shape.product].append(d)
        return found

    def table(self) -> str:
        rows = [f"{'product':<12} {'m':>6} {'k':>6} {'n':>6} {'dtype':<9} {'dense ms':>9} {'sparse ms':>9} "
                f"{'speed-up':>8}  choice"]
        for d in self._decisions.values():
            s = d.shape
            dense = f"{d.dense_ms:9.3f}" if d.dense_ms is not None else f"{'-':>9}"
            sparse = f"{d.sparse_ms:9.3f}" if d.sparse_ms is not None else f"{'-':>9}"
            speed = f"{d.speedup:7.2f}x" if d.speedup is not None else f"{'-':>8}"
            rows.append(f"{s.product:<12} {s.m:>6} {s.k:>6} {s.n:>6} {s.dtype:<9} {dense} {sparse} {speed}  "
                        f"{'sparse' if d.sparse else 'dense'}{f' on {d.library}' if d.sparse and d.library else ''} "
                        f"({d.reason})")
        for layer in self._layers.values():
            s = layer.shape
            costs = ", ".join(f"{plan_name(p)} {ms:.3f} ms" for p, ms in layer.costs.items())
            rows.append(f"layer ({s.out_features}, {s.in_features}) @{s.tokens} tokens {s.dtype}: "
                        f"{layer.describe()}" + (f" [{costs}]" if costs else ""))
        return "\n".join(rows)

