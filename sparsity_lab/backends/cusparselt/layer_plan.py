"""The ``auto`` policy's per-layer choice for the two products on the weight: forward and input gradient.

A layer's forward ``Z = X S(W)^T`` and input gradient ``dX = dZ S(W)`` share one operand, S(W), in
one of two forms: dense (the soft threshold writes S(W) in the product dtype) or compressed (kernel 11
writes both 2:4 forms, S(W) and S(W)^T, from W in one pass). Choosing per product can mix them (forward
sparse, input gradient dense), and then the step pays for *both* forms. So the two products are decided
together, per layer, from four plans::

    plan (forward, grad_input)   operand cost                          product cost
    sparse, sparse               sparse_operands (both forms, one pass) forward_sparse + grad_input_sparse
    dense,  dense                dense_operand                          forward_dense  + grad_input_dense
    sparse, dense                dense_operand + forward_operand        forward_sparse + grad_input_dense
    dense,  sparse               dense_operand + transposed_operand     forward_dense  + grad_input_sparse

The cheapest plan wins if it beats all-dense by ``min_speedup``; otherwise the layer runs all-dense.
The weight gradient's operand is MVUE(dZ^T), not S(W): it is decided per product (``auto.py``).

Across libraries ("sparse_auto": cuSPARSELt and CUTLASS) each product is dense or runs on one library,
``plan = (forward's, grad_input's)`` with each ``"dense"`` or a library's name, nine plans for two libraries
(:class:`LibraryLayerTimes`). A plan pays for the dense S(W) when a product is dense or a library in it
compresses from the dense S(W) (CUTLASS does), once; for both forms of one library when both products run on
it (in one pass where it can); else for the one form each library's product needs. The table above is the
case of one library: ``LayerTimes.cost`` is ``LibraryLayerTimes.cost`` of that library.
Plain Python, tested on the CPU with injected timings; the GPU measurement is ``measure.measure_layer``.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields

PLANS = ((True, True), (False, False), (True, False), (False, True))  # (forward sparse, grad_input sparse)
DENSE = "dense"  # a library plan's entry for a dense product
ALL_DENSE = ((False, False), (DENSE, DENSE))  # the all-dense plan, of one library and across libraries


def plan_name(plan: tuple) -> str:
    """In words: a plan of one library ((forward sparse, grad_input sparse)) or across libraries."""
    if isinstance(plan[0], bool):
        return {(True, True): "all sparse", (False, False): "all dense", (True, False): "forward sparse, grad_input dense",
                (False, True): "forward dense, grad_input sparse"}[plan]
    forward, grad_input = plan
    return f"all {forward}" if forward == grad_input else f"forward {forward}, grad_input {grad_input}"


def _check_ms_fields(times) -> None:
    for f in fields(times):
        value = getattr(times, f.name)
        if f.type in ("float", float) and (isinstance(value, bool) or not isinstance(value, (int, float))
                                           or not math.isfinite(value) or value < 0):
            raise ValueError(f"{type(times).__name__}.{f.name} must be a finite number of ms >= 0, got {value!r}")


@dataclass(frozen=True)
class LayerShape:
    """A layer with weight (out_features, in_features) over ``tokens`` rows, products in ``dtype``."""

    out_features: int
    in_features: int
    tokens: int
    dtype: str

    def __post_init__(self) -> None:
        for name in ("out_features", "in_features", "tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class LayerTimes:
    """Milliseconds per optimizer step of each part of the layer's weight-side work.

    dense_operand: S(W) dense in the product dtype (soft threshold or mask multiply, and the cast).
    sparse_operands: S(W) and S(W)^T compressed (one pass when kernel 11 applies).
    forward_operand / transposed_operand: one compressed form alone (a mixed plan needs only one).
    forward_dense / forward_sparse / grad_input_dense / grad_input_sparse: the products alone.
    """

    dense_operand: float
    sparse_operands: float
    forward_operand: float
    transposed_operand: float
    forward_dense: float
    forward_sparse: float
    grad_input_dense: float
    grad_input_sparse: float

    def __post_init__(self) -> None:
        _check_ms_fields(self)

    def by_library(self, library: str = "sparse") -> "LibraryLayerTimes":
        """The same times as the one library ``library`` of a :class:`LibraryLayerTimes`."""
        return LibraryLayerTimes(self.dense_operand, self.forward_dense, self.grad_input_dense, (
            (library, LibraryTimes(self.sparse_operands, self.forward_operand, self.transposed_operand,
                                   self.forward_sparse, self.grad_input_sparse)),))

    def cost(self, plan: tuple[bool, bool]) -> float:
        """Milliseconds of one step's weight-side work under ``plan`` (the table of the module docstring)."""
        return self.by_library().cost(tuple("sparse" if sparse else DENSE for sparse in plan))


@dataclass(frozen=True)
class LibraryTimes:
    """One library's part of a layer's weight-side work, ms per optimizer step (:class:`LibraryLayerTimes`).

    both_operands: S(W) and S(W)^T compressed for this library (in one pass where it can); forward_operand /
    transposed_operand: one form alone; forward / grad_input: the products alone. from_dense_operand: the forms
    are compressed from the dense S(W) (the plan then pays for it, once, beside them)."""

    both_operands: float
    forward_operand: float
    transposed_operand: float
    forward: float
    grad_input: float
    from_dense_operand: bool = False

    def __post_init__(self) -> None:
        _check_ms_fields(self)


@dataclass(frozen=True)
class LibraryLayerTimes:
    """A layer's weight-side times with several 2:4 libraries: the dense parts and, per library, its
    :class:`LibraryTimes` (``libraries``: (name, times) pairs, in the order the report lists them)."""

    dense_operand: float
    forward_dense: float
    grad_input_dense: float
    libraries: tuple[tuple[str, LibraryTimes], ...]

    def __post_init__(self) -> None:
        _check_ms_fields(self)
        names = [name for name, _ in self.libraries]
        if DENSE in names or len(set(names)) != len(names):
            raise ValueError(f"libraries must have distinct names other than {DENSE!r}, got {names}")

    def plans(self) -> list[tuple[str, str]]:
        """Every (forward's, grad_input's) choice, all dense first."""
        choices = (DENSE, *(name for name, _ in self.libraries))
        return list(itertools.product(choices, repeat=2))

    def cost(self, plan: tuple[str, str]) -> float:
        """Milliseconds of one step's weight-side work under ``plan`` (the rule of the module docstring)."""
        by_name = dict(self.libraries)
        unknown = [p for p in plan if p != DENSE and p not in by_name]
        if unknown:
            raise ValueError(f"plan {plan} names {unknown}; the libraries are {sorted(by_name)}")
        forward, grad_input = plan
        cost = ((self.forward_dense if forward == DENSE else by_name[forward].forward)
                + (self.grad_input_dense if grad_input == DENSE else by_name[grad_input].grad_input))
        if DENSE in plan or any(by_name[p].from_dense_operand for p in plan):
            cost += self.dense_operand
        if forward == grad_input != DENSE:
            return cost + by_name[forward].both_operands
        if forward != DENSE:
            cost += by_name[forward].forward_operand
        if grad_input != DENSE:
            cost += by_name[grad_input].transposed_operand
        return cost


@dataclass(frozen=True)
class LayerDecision:
    """The plan chosen for one layer shape, with every plan's cost (ms) and why."""

    shape: LayerShape
    plan: tuple[bool, bool]
    costs: dict  # plan -> ms (only the plans allowed)
    reason: str

    @property
    def speedup(self) -> float | None:
        """all-dense cost / chosen cost (> 1: the chosen plan is faster), None when nothing was measured."""
        dense = next((self.costs[p] for p in ALL_DENSE if p in self.costs), None)
        chosen = self.costs.get(self.plan)
        return dense / chosen if dense and chosen else None

    def describe(self) -> str:
        if self.speedup is None:
            return f"{plan_name(self.plan)} ({self.reason})"
        return f"{plan_name(self.plan)} {self.speedup:.2f}x over all dense @{self.shape.tokens} tokens"


def choose_plan(shape: LayerShape, times: LayerTimes | LibraryLayerTimes, min_speedup: float = 1.0,
                label: str = "") -> LayerDecision:
    """The cheapest plan under ``times`` (``PLANS`` for ``LayerTimes``, every library plan for
    ``LibraryLayerTimes``), kept only if all-dense / its cost >= min_speedup."""
    plans, all_dense = (PLANS, (False, False)) if isinstance(times, LayerTimes) else (times.plans(), (DENSE, DENSE))
    costs = {plan: times.cost(plan) for plan in plans}
    best = min((p for p in plans if p != all_dense), key=lambda p: costs[p])
    dense = costs[all_dense]
    plan = best if costs[best] > 0 and dense / costs[best] >= min_speedup else all_dense
    reason = f"measured per layer{label}; a plan with a sparse product needs >= {min_speedup:g}x over all dense"
    return LayerDecision(shape, plan, costs, reason)


def unsupported_plan(shape: LayerShape, reason: str, libraries: bool = False) -> LayerDecision:
    """All dense, unmeasured: no library can run this weight (dtype or shape). libraries: a plan across
    libraries (("dense", "dense")), else of one library ((False, False))."""
    return LayerDecision(shape, ALL_DENSE[int(libraries)], {}, reason)
