"""What the cuSPARSELt backend reports and how its auto policy times products: the two interfaces of
``backends/report.py`` for ``CusparseltBackend``, apart from its products (``backend.py``).

A mixin: it reads the backend's own state (``policy``, ``_decided``, ``_timing``, ``_by_timing``,
``stats``, ``algorithms``, ``_ops``), which ``CusparseltBackend.__init__`` sets.
"""
from __future__ import annotations

from .auto import PRODUCTS, AutoPolicy, ProductShape
from .layer_plan import LayerShape, plan_name
from .measure import measure_layer, measure_product
from ..report import BackendReport, MeasuresProducts


class CusparseltReporting(BackendReport, MeasuresProducts):
    """``backend_report``'s plan and a benchmark's summary of the backend; the auto policy's timing mode
    and its measurements of one product or one layer."""

    @property
    def measures_products(self) -> bool:
        """True with an auto policy: it times the sparse and dense product of each new shape."""
        return self.policy is not None

    @property
    def timing(self) -> str:
        return self._timing

    @timing.setter
    def timing(self, mode: str) -> None:
        if mode not in ("eager", "graph"):
            raise ValueError(f"timing must be 'eager' or 'graph', got {mode!r}")
        if mode == self._timing:
            return
        self._by_timing[self._timing] = (self.policy, self._decided)
        if mode in self._by_timing:
            self.policy, self._decided = self._by_timing[mode]
        else:
            policy = None
            if self.policy is not None:
                policy = AutoPolicy(measure=self.policy.measure, min_speedup=self.policy.min_speedup,
                                    measure_layer=self.policy.measure_layer,
                                    label=" in a CUDA graph" if mode == "graph" else "")
            self.policy, self._decided = policy, {}
        self._timing = mode

    # --- what the auto policy measures (report.MeasuresProducts) -------------------------------------------
    def measure_product(self, shape: ProductShape) -> tuple[float, float]:
        """(dense_ms, sparse_ms) of one product of ``shape`` on the GPU, for the auto policy
        (``measure.measure_product``)."""
        return measure_product(self, shape)

    def measure_layer(self, shape: LayerShape):
        """``LayerTimes`` of a layer's weight-side work on the GPU, for the auto policy's per-layer plan
        (``measure.measure_layer``)."""
        return measure_layer(self, shape)

    # --- reports -------------------------------------------------------------------------------------
    def product_plan(self, out_features: int, in_features: int, mvue: bool) -> dict[str, str]:
        """Per product, how a layer (out, in) runs here (for ``backend_report``)."""
        if self.policy is None:
            return {"forward": "sparse", "grad_input": "sparse",
                    "grad_weight": "sparse (MVUE dZ^T, compressed per call)" if mvue else "dense dZ^T X"}
        found = self.policy.decisions_for(out_features, in_features)
        plan = {}
        for product in PRODUCTS:
            if product == "grad_weight" and not mvue:
                plan[product] = "dense dZ^T X"
            elif found[product]:
                plan[product] = "; ".join(d.describe() for d in found[product])
            else:
                plan[product] = "auto: not measured yet (decided on first use)"
        return plan

    def summary(self) -> dict:
        return {"name": self.name, "ops": getattr(self._ops, "name", type(self._ops).__name__),
                "ops_stats": dict(getattr(self._ops, "stats", {})), "stats": dict(self.stats),
                "slow_compress_reasons": dict(self.slow_compress_reasons), "algorithms": self.algorithms.summary(),
                "decisions": [dict(product=d.shape.product, m=d.shape.m, k=d.shape.k, n=d.shape.n,
                                   dtype=d.shape.dtype, sparse=d.sparse, dense_ms=d.dense_ms,
                                   sparse_ms=d.sparse_ms, speedup=d.speedup, reason=d.reason, timing=mode,
                                   library=d.library, library_ms=dict(d.library_ms), excluded=dict(d.excluded))
                              for mode, policy in self._policies()
                              for d in (policy.decisions if policy else [])],
                "layer_plans": [dict(out_features=d.shape.out_features, in_features=d.shape.in_features,
                                     tokens=d.shape.tokens, dtype=d.shape.dtype, plan=plan_name(d.plan),
                                     speedup=d.speedup, reason=d.reason, timing=mode,
                                     costs_ms={plan_name(p): ms for p, ms in d.costs.items()})
                                for mode, policy in self._policies()
                                for d in (policy.layer_decisions if policy else [])]}

    def _policies(self) -> list[tuple[str, AutoPolicy | None]]:
        """(timing mode, policy) for the current mode and the other one, if it was used."""
        found = [(self._timing, self.policy)]
        return found + [(mode, pair[0]) for mode, pair in self._by_timing.items() if mode != self._timing]
