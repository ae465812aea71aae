"""What a backend tells about its work, and how an auto policy times the products it chooses between:
two small interfaces apart from the products (``base.Backend``).

* :class:`BackendReport`: what ``sparsify.backend_report`` and the benchmarks read: per product of a
  layer, how it runs (``product_plan``); why a stand-in runs (``fallback_reason``); counters
  (``stats``) and a record for a result file (``summary``). A backend that reports subclasses it next
  to ``Backend``; :func:`report_of` gives any other backend the default description (dense products).
* :class:`MeasuresProducts`: a backend that chooses how to run each product by timing the candidates
  ("cusparselt_auto"); ``graph_timing`` switches its ``timing`` while a CUDA-graph step decides.
"""
from __future__ import annotations

import abc
from types import MappingProxyType
from typing import Mapping

from .base import PRODUCTS

TIMING_MODES = ("eager", "graph")


class BackendReport:
    """What a backend reports (a mixin with defaults that describe dense products of the masked weight)."""

    name: str

    fallback_reason: str | None = None
    """Why this object stands in for the backend that was asked for (e.g. no CUDA GPU), else None."""

    stats: Mapping[str, int] = MappingProxyType({})
    """Counters of what the backend did (products, compressions, copies, ...); empty when it counts nothing."""

    def product_plan(self, out_features: int, in_features: int, mvue: bool) -> dict[str, str]:
        """Per product (``PRODUCTS``), how a layer (out, in) runs here, in words (for ``backend_report``).
        Default: dense products of the masked weight."""
        label = "dense masked W (reference)" if self.fallback_reason else f"dense masked W (backend {self.name!r})"
        plan = {p: label for p in PRODUCTS}
        if not mvue:
            plan["grad_weight"] = "dense dZ^T X"
        return plan

    def summary(self) -> dict:
        """What a benchmark records about the backend: its name, counters, the algorithms it searched
        and the decisions its policy took (empty lists for a backend that searches and decides nothing)."""
        return {"name": self.name, "stats": dict(self.stats), "algorithms": [], "decisions": []}


class _Described(BackendReport):
    """The default report of a backend that is no :class:`BackendReport` itself."""

    def __init__(self, name: str) -> None:
        self.name = name


def report_of(backend) -> BackendReport:
    """``backend``'s report: the backend itself when it reports, else the default description."""
    return backend if isinstance(backend, BackendReport) else _Described(backend.name)


class MeasuresProducts(abc.ABC):
    """A backend that decides how to run each product by timing the candidates on the device (an auto
    policy). ``timing`` says how it times those it has not decided yet: "eager" (back-to-back calls, the
    host's launch cost counts) or "graph" (replayed from a CUDA graph: kernel time only), each mode
    with its own decisions; ``measures_products`` is False where an instance has no policy to time for."""

    measures_products: bool = True

    @property
    @abc.abstractmethod
    def timing(self) -> str:
        """"eager" or "graph"."""

    @timing.setter
    @abc.abstractmethod
    def timing(self, mode: str) -> None:
        """Switch the timing mode (one of ``TIMING_MODES``; anything else raises ValueError)."""


def measures_products(backend) -> bool:
    """True when ``backend`` times the products it chooses between (``graph_timing`` switches those)."""
    return isinstance(backend, MeasuresProducts) and backend.measures_products
