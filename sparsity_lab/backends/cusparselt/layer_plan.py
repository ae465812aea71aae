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
Plain Python, tested on the CPU with injected timings; the GPU measurement is ``measure.measure_layer``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

PLANS = ((True, True), (False, False), (True, False), (False, True))  # (forward sparse, grad_input sparse)


def plan_name(plan: tuple[bool, bool]) -> str:
    return {(True, True): "all sparse", (False, False): "all dense",
            (True, False): "forward sparse, grad_input dense", (False, True): "forward dense, grad_input sparse"}[plan]


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
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"LayerTimes.{f.name} must be a finite number of ms >= 0, got {value!r}")

    def cost(self, plan: tuple[bool, bool]) -> float:
        """Milliseconds of one step's weight-side work under ``plan`` (the table of the module docstring)."""
        fwd_sparse, gi_sparse = plan
        products = ((self.forward_sparse if fwd_sparse else self.forward_dense)
                    + (self.grad_input_sparse if gi_sparse else self.grad_input_dense))
        if fwd_sparse and gi_sparse:
            return self.sparse_operands + products
        operand = self.dense_operand
        if fwd_sparse:
            operand += self.forward_operand
        if gi_sparse:
            operand += self.transposed_operand
        return operand + products


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
        dense, chosen = self.costs.get((False, False)), self.costs.get(self.plan)
        return dense / chosen if dense and chosen else None

    def describe(self) -> str:
        if self.speedup is None:
            return f"{plan_name(self.plan)} ({self.reason})"
        return f"{plan_name(self.plan)} {self.speedup:.2f}x over all dense @{self.shape.tokens} tokens"


def choose_plan(shape: LayerShape, times: LayerTimes, min_speedup: float = 1.0, label: str = "") -> LayerDecision:
    """The cheapest of ``PLANS`` under ``times``, kept only if all-dense / its cost >= min_speedup."""
    costs = {plan: times.cost(plan) for plan in PLANS}
    best = min((p for p in PLANS if p != (False, False)), key=lambda p: costs[p])
    dense = costs[(False, False)]
    plan = best if costs[best] > 0 and dense / costs[best] >= min_speedup else (False, False)
    reason = f"measured per layer{label}; a plan with a sparse product needs >= {min_speedup:g}x over all dense"
    return LayerDecision(shape, plan, costs, reason)


def unsupported_plan(shape: LayerShape, reason: str) -> LayerDecision:
    """All dense, unmeasured: cuSPARSELt cannot run this weight (dtype or shape)."""
    return LayerDecision(shape, (False, False), {}, reason)
