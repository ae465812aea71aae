"""The "sparse_auto" backend: per product, dense or 2:4 on whichever library measured fastest here.

"cusparselt_auto" chooses per product shape between the dense product and cuSPARSELt's 2:4 product. This
backend adds CUTLASS's SM90 sparse GEMMs (backend "cutlass", Hopper only) as a third candidate, by the same
measurement and the same policy (``cusparselt/auto.py``, ``cusparselt/layer_plan.py``):

    forward, input gradient  per layer: each dense, on cuSPARSELt or on CUTLASS (nine plans), every operand
                             form a plan needs paid once (CUTLASS compresses from the dense S(W); cuSPARSELt
                             writes both forms from W in one pass, kernel 11)
    weight gradient          per product: dense, or the MVUE product of the fastest library

Every candidate computes the same mathematics on the same masked operands and the same MVUE draws (the
Triton kernels, seeded alike in "cusparselt" and "cutlass"), so only speed differs. A library that cannot
run a shape (``excluded``: dtype, alignment) is no candidate for it; a product no library can run is dense.

What runs where: masks, the soft threshold, MVUE and the masked decay are the Triton kernels; a product on
cuSPARSELt is ``CusparseltBackend``'s (this class is one, with the policy); a product on CUTLASS is
``CutlassBackend``'s, on the dense S(W) the step's operand holds, compressed by CUTLASS on first use per step.

Where CUTLASS cannot run at all (no Hopper GPU, no nvcc or CUTLASS headers, a failed build) the backend
chooses among dense and cuSPARSELt and says so: ``missing`` (in every ``backend_report`` product and in
``summary()["libraries"]``). Without a CUDA GPU the name gives the reference with a warning, as
"cusparselt_auto" does.
"""
from __future__ import annotations

import torch

from .cusparselt.auto import AutoPolicy, ProductShape
from .cusparselt.backend import CusparseltBackend, _dtype_name, reference_fallback
from .cusparselt.layer_plan import DENSE, LayerShape, LibraryLayerTimes
from .cusparselt.ops import sparse_shape_problem

NAME = "sparse_auto"
CUSPARSELT, CUTLASS = "cusparselt", "cutlass"


class SparseAutoBackend(CusparseltBackend):
    """2:4 products on the library measured fastest per product shape, or dense (see the module docstring).

    cutlass: the ``CutlassBackend`` whose products are the CUTLASS candidates, None where it cannot run;
    missing: {library: why it is no candidate on this machine}. The other arguments are ``CusparseltBackend``'s
    (``ops``: the cuSPARSELt calls, a stand-in in the CPU tests); the policy is an :class:`AutoPolicy`
    with ``min_speedup`` whose measurements are this backend's own."""

    def __init__(self, cutlass=None, missing: dict[str, str] | None = None, min_speedup: float = 1.0,
                 ops=None, **kwargs) -> None:
        super().__init__(ops=ops, policy=AutoPolicy(min_speedup=min_speedup), **kwargs)
        self.name = NAME
        self.cutlass = cutlass
        self.missing = dict(missing or {})
        self.libraries = (CUSPARSELT,) + ((CUTLASS,) if cutlass is not None else ())
        self.policy.measure, self.policy.measure_layer = self.measure_product, self.measure_layer

    # --- the choice -----------------------------------------------------------------------------------------
    def problems(self, product: str, out_f: int, in_f: int, tokens: int, dtype: torch.dtype) -> dict[str, str]:
        """{library: why it cannot run this product} (the forward and input gradient: the layer's two)."""
        found = {}
        rows, cols = (out_f, tokens) if product == "grad_weight" else (out_f, in_f)
        if (problem := sparse_shape_problem(rows, cols, dtype)) is not None:
            found[CUSPARSELT] = problem
        if self.cutlass is not None:
            from .cutlass.backend import product_problem
            if (problem := product_problem(product, out_f, in_f, tokens, dtype)) is not None:
                found[CUTLASS] = problem
        return found

    def library_for(self, product: str, out_f: int, in_f: int, tokens: int, dtype: torch.dtype) -> str:
        """"dense" or the library this product of a layer (out_f, in_f) over ``tokens`` rows runs on, decided
        on first use (measured) and then a dict lookup (the per-call cost in eager training)."""
        key = (product, out_f, in_f, tokens, dtype)
        found = self._decided.get(key)
        if found is not None:
            return found
        problems = self.problems(product, out_f, in_f, tokens, dtype)
        # the layer's dense times are measured with cuSPARSELt's: a layer it cannot run is dense (CUTLASS's
        # alignment is no weaker for a bfloat16 weight, so nothing is lost)
        unsupported = None  # the reasons are the decision's ``excluded``
        if set(self.libraries) <= set(problems):
            unsupported = "not measured: no candidate library can run it"
        elif product != "grad_weight" and CUSPARSELT in problems:
            unsupported = "not measured: the dense products are timed with cuSPARSELt's, which cannot run it"
        name = _dtype_name(dtype)
        if product != "grad_weight":
            plan = self.policy.decide_layer(LayerShape(out_f, in_f, tokens, name), unsupported, problems).plan
            self._decided[("forward",) + key[1:]], self._decided[("grad_input",) + key[1:]] = plan
            return self._decided[key]
        shape = ProductShape.of_layer(product, out_f, in_f, tokens, name)
        found = self._decided[key] = self.policy.decide(shape, unsupported, problems).runs_on
        return found

    def _sparse(self, product, out_f, in_f, tokens, dtype) -> bool:
        """What ``CusparseltBackend``'s products ask: run this one on cuSPARSELt?"""
        return self.library_for(product, out_f, in_f, tokens, dtype) == CUSPARSELT

    # --- the products: CUTLASS's where chosen, else CusparseltBackend's (dense or cuSPARSELt) -------------------
    def _cutlass_operand(self, operand):
        form = operand.library_forms.get(CUTLASS)
        if form is None:
            form = operand.library_forms[CUTLASS] = self.cutlass.prepare(operand.weight)
        return form

    def linear(self, x, operand, bias):
        if self.library_for("forward", *operand.shape, x.shape[0], operand.dtype) == CUTLASS:
            return self.cutlass.linear(x, self._cutlass_operand(operand), bias)
        return super().linear(x, operand, bias)

    def grad_input(self, grad_out, operand):
        if self.library_for("grad_input", *operand.shape, grad_out.shape[0], operand.dtype) == CUTLASS:
            return self.cutlass.grad_input(grad_out, self._cutlass_operand(operand))
        return super().grad_input(grad_out, operand)

    def grad_weight(self, grad_out, x, mvue, seed):
        rows = self.padded_rows(grad_out.shape[0], grad_out.dtype)
        if mvue and self.library_for("grad_weight", grad_out.shape[1], x.shape[1], rows, grad_out.dtype) == CUTLASS:
            return self.cutlass.grad_weight(grad_out, x, mvue, seed)
        return super().grad_weight(grad_out, x, mvue, seed)

    # --- the measurements (GPU) ---------------------------------------------------------------------------------
    def _timer(self):
        from .cusparselt.measure import graph_time_ms
        return graph_time_ms if self.timing == "graph" else self._ops.time_ms

    def measure_product(self, shape: ProductShape) -> dict[str, float]:
        """{"dense": ms, library: ms, ...} of the weight gradient of ``shape``, for each library that can run it
        (the forward and input gradient are decided per layer: ``measure_layer``)."""
        if shape.product != "grad_weight":
            raise ValueError(f"sparse_auto measures the {shape.product} product per layer (measure_layer), "
                             "not alone")
        dtype = getattr(torch, shape.dtype)
        problems = self.problems("grad_weight", shape.m, shape.n, shape.k, dtype)
        times = {}
        if CUSPARSELT not in problems:
            times[DENSE], times[CUSPARSELT] = super().measure_product(shape)
        if CUTLASS in self.libraries and CUTLASS not in problems:
            from .cutlass.measure import grad_weight_times
            dense_ms, times[CUTLASS] = grad_weight_times(shape.m, shape.k, shape.n, dtype, self._timer())
            times.setdefault(DENSE, dense_ms)
        return times

    def measure_layer(self, shape: LayerShape) -> LibraryLayerTimes:
        """``LibraryLayerTimes`` of a layer's weight-side work: dense and cuSPARSELt as "cusparselt_auto"
        measures them (``cusparselt.measure.measure_layer``), CUTLASS on the same kind of S(W) where it can."""
        times = super().measure_layer(shape).by_library(CUSPARSELT)
        dtype = getattr(torch, shape.dtype)
        if CUTLASS not in self.libraries or CUTLASS in self.problems("forward", shape.out_features,
                                                                     shape.in_features, shape.tokens, dtype):
            return times
        from .cutlass.measure import weight_side_times
        gen = torch.Generator(device="cuda").manual_seed(0)
        w = torch.randn(shape.out_features, shape.in_features, generator=gen, device="cuda").to(dtype)
        s_w = self.sparse_weight_as(w, self.mask(w, 2, 4, True), torch.tensor(0.9, device="cuda"), 2, 4, dtype)
        cutlass = weight_side_times(s_w.contiguous(), shape.tokens, self._timer(), self.cutlass.config)
        return LibraryLayerTimes(times.dense_operand, times.forward_dense, times.grad_input_dense,
                                 times.libraries + ((CUTLASS, cutlass),))

    # --- reports ------------------------------------------------------------------------------------------------
    def product_plan(self, out_features, in_features, mvue):
        plan = super().product_plan(out_features, in_features, mvue)
        note = "".join(f"; {name} is no candidate on this machine: {why}" for name, why in self.missing.items())
        return {product: text + note for product, text in plan.items()}

    def summary(self) -> dict:
        out = super().summary()
        out["libraries"] = {**{name: "candidate" for name in self.libraries}, **self.missing}
        out["cutlass_stats"] = dict(self.cutlass.stats) if self.cutlass is not None else {}
        return out


def sparse_auto_backend(min_speedup: float = 1.0):
    """What ``get_backend("sparse_auto")`` builds: the reference with a warning without a CUDA GPU; else the
    backend with CUTLASS among its candidates where it can run (built, or taken from the cache, here), and
    without it, saying why, where not."""
    if not torch.cuda.is_available():
        return reference_fallback(NAME)
    from .cutlass.backend import cutlass_backend, unavailable_reason
    from .cutlass.build import CutlassUnavailable
    try:
        cutlass, missing = cutlass_backend(), {}
    except CutlassUnavailable as err:  # the short reason where the machine says it, else the build's first line
        cutlass, missing = None, {CUTLASS: unavailable_reason() or str(err).splitlines()[0][:300]}
    return SparseAutoBackend(cutlass, missing, min_speedup)
