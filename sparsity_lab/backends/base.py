"""The backend seam: what a 2:4 layer asks of whoever runs its products.

A training method decides *what* to compute; a backend decides *how*. The reference backend
("torch") is plain PyTorch and runs anywhere. Faster backends (Triton kernels, cuSPARSELt sparse
tensor cores) implement the same operations, subclass :class:`Backend` and register themselves here.

Per optimizer step a layer calls ``mask`` (when its refresh interval is due) and ``prepare_masked``
(once: the pruned — and, for hardware backends, compressed — weight, reused by every micro-step);
per micro-step ``linear``, ``grad_input`` and ``grad_weight``; masked decay calls ``masked_decay_``.

:class:`Backend` declares the whole interface. Seven methods are required (abstract); every other
one has a default here that is correct for any backend, which a backend overrides only to be faster
or to report more. What a backend *can* do is declared in class attributes (capabilities), so that
callers (``SparseLinear``, ``graph_step``) never probe with ``getattr``/``hasattr`` and adding a
backend needs no edit anywhere else.
"""
from __future__ import annotations

import abc
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Mapping, Union

import torch

from ..methods.flip_rate import mask_flips_tensor

PRODUCTS = ("forward", "grad_input", "grad_weight")  # the three products of a linear layer's step
TIMING_MODES = ("eager", "graph")

MvueSeed = Union[torch.Generator, torch.Tensor]
"""Where one MVUE draw takes its randomness from (the ``seed`` argument of ``Backend.grad_weight``):

* eager mode: a CPU ``torch.Generator``, seeded by the layer for this draw alone (counter-based:
  draw k of a layer is a function of its seed and k, so a resumed run draws the same). A CPU
  generator even for GPU tensors: a backend takes its kernel seed from it without a host-device sync.
* under a CUDA-graph step (``sparsity_lab.graph_step``): a 0-d int64 tensor on the products' device
  that the host fills before every replay and the kernels read on the device. Only backends that
  declare ``reads_seed_from_device = True`` are given one.
"""


def is_device_seed(seed: MvueSeed | None) -> bool:
    """True for a device seed tensor (CUDA-graph mode), False for a generator or None."""
    return isinstance(seed, torch.Tensor)


def kernel_seed(seed: MvueSeed | None) -> int | torch.Tensor:
    """The seed the MVUE kernels (``kernels/mvue24.py``, ``kernels/mvue_compress24.py``) take for one draw:
    one int in [0, MAX_SEED] drawn from the generator (from torch's default generator for None),
    or the device seed tensor itself, passed through for the kernel to read."""
    from ..kernels.mvue24 import MAX_SEED  # triton: imported only when a kernel is about to run

    if is_device_seed(seed):
        return seed
    if seed is None:
        return int(torch.randint(0, MAX_SEED + 1, (1,)).item())
    return int(torch.randint(0, MAX_SEED + 1, (1,), generator=seed, device=seed.device).item())


class Backend(abc.ABC):
    """The operations of a 2:4 (N:M) linear layer. Shapes: W (out, in), X (tokens, in), dZ (tokens, out).

    Required: ``name`` (str, the registry name or a description of what runs) and the seven abstract
    methods. Optional methods have defaults in terms of the required ones. Capabilities (class
    attributes a subclass sets): ``reads_seed_from_device``, ``mask_refresh_capturable``, ``measures_products``,
    ``products_in_dense_phase``.
    """

    name: str

    # --- capabilities ---------------------------------------------------------------------------------
    reads_seed_from_device: ClassVar[bool] = False
    """True when ``grad_weight`` accepts a device seed tensor (a 0-d int64 tensor that its kernels read
    on the device), which a CUDA-graph step needs: the host cannot hand a new generator to a replay."""

    products_in_dense_phase: ClassVar[bool] = False
    """True when the products carry a number format of their own (FP8): in a dense phase (a Dense method,
    the dense fine-tune) the layer then still runs its products here, on the dense W prepared by
    ``prepare_dense``, instead of ``F.linear`` in the autocast dtype; a dense FP8 run stays FP8."""

    mask_refresh_capturable: ClassVar[bool] = False
    """True when ``mask`` (2:4) and ``mask_flips`` on CUDA tensors are device kernels only (no host sync, no
    CPU solver, no shape that depends on the values), so that a CUDA graph can capture a mask refresh
    (``CudaGraphStep`` refreshes due-every-step masks inside its graph on such backends)."""

    measures_products: bool = False
    """True when this backend chooses how to run each product by timing the candidates (an auto policy);
    then ``timing`` says how it times them ("eager" or "graph") and ``graph_timing`` switches it."""

    fallback_reason: str | None = None
    """Why this object stands in for the backend that was asked for (e.g. no CUDA GPU), else None."""

    stats: Mapping[str, int] = MappingProxyType({})
    """Counters of what the backend did (products, compressions, copies, ...); empty when it counts nothing."""

    # --- required -------------------------------------------------------------------------------------
    @abc.abstractmethod
    def mask(self, weight: torch.Tensor, n: int, m: int, transposable: bool) -> torch.Tensor:
        """bool (out, in): the N:M magnitude mask (row-wise along ``in``, or transposable)."""

    @abc.abstractmethod
    def sparse_weight(self, weight: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | None,
                      n: int, m: int) -> torch.Tensor:
        """The weight the products use: m * W, or beta * S(W) when beta is given (S-STE)."""

    @abc.abstractmethod
    def prepare(self, sparse_weight: torch.Tensor) -> Any:
        """Operand(s) for the products of one optimizer step from S(W) already in the products' dtype
        (e.g. compressed S(W) and S(W)^T)."""

    @abc.abstractmethod
    def linear(self, x: torch.Tensor, operand: Any, bias: torch.Tensor | None) -> torch.Tensor:
        """Z = X S(W)^T + b for X (tokens, in). Returns (tokens, out)."""

    @abc.abstractmethod
    def grad_input(self, grad_out: torch.Tensor, operand: Any) -> torch.Tensor:
        """dX = dZ S(W) for dZ (tokens, out). Returns (tokens, in)."""

    @abc.abstractmethod
    def grad_weight(self, grad_out: torch.Tensor, x: torch.Tensor, mvue: bool,
                    seed: MvueSeed | None) -> torch.Tensor:
        """dW = dZ^T X, or MVUE(dZ^T) X with groups of 4 along the tokens. Returns (out, in).
        seed: where the MVUE draw comes from (:data:`MvueSeed`); None when ``mvue`` is False."""

    @abc.abstractmethod
    def masked_decay_(self, grad: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor,
                      decay: float) -> None:
        """In place: grad += decay * (1 - m) * W."""

    # --- optional, with defaults ------------------------------------------------------------------------
    def mask_flips(self, previous: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """0-d int64 count of entries that differ between two masks, on their device (no host sync)."""
        return mask_flips_tensor(previous, current)

    def sparse_weight_as(self, weight: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | None,
                         n: int, m: int, dtype: torch.dtype) -> torch.Tensor:
        """``sparse_weight(...).to(dtype)``; a backend may do it in fewer passes."""
        return self.sparse_weight(weight, mask, beta, n, m).to(dtype)

    def prepare_masked(self, weight: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | None,
                       n: int, m: int, dtype: torch.dtype, backward: bool = True) -> Any:
        """The step's operand straight from the master W and the mask: ``prepare(sparse_weight_as(...))``.
        backward: whether the input gradient will be asked for (a backend may prepare both forms at once)."""
        return self.prepare(self.sparse_weight_as(weight, mask, beta, n, m, dtype))

    def prepare_dense(self, weight: torch.Tensor, dtype: torch.dtype) -> Any:
        """The operand of a dense phase's products from the dense W (out, in): asked only of backends with
        ``products_in_dense_phase``; ``linear``/``grad_input`` then take it like a prepared S(W)."""
        raise NotImplementedError(f"backend {self.name!r} runs no products in a dense phase "
                                  "(products_in_dense_phase is False): the layer uses F.linear there")

    def for_layer(self, layer: torch.nn.Module) -> "Backend":
        """The backend a layer keeps (``SparseLinear`` calls this once, at set-up). Default: this shared
        object. A backend with per-layer state (the FP8 backends: scales and amax histories) returns a
        new object per layer; when that object is an ``nn.Module``, the layer registers it as its child
        ``backend``, so its state is in the layer's ``state_dict()`` (under ``backend.``) and follows ``.to()``."""
        return self

    def advance_step(self) -> None:
        """End of an optimizer step of the layer that holds this backend (``SparseLinear.advance_step``).
        Default: nothing; a backend with per-step state updates it here (the FP8 recipe's amax history)."""

    def device_seed_value(self, generator: torch.Generator) -> int:
        """The int this backend's MVUE draw would take from ``generator`` in eager mode: what a layer in
        CUDA-graph mode writes into its device seed tensor before a replay, so that the replay draws what
        the eager step would. Asked only of backends with ``reads_seed_from_device``; the default is the
        draw of the project's MVUE kernels (:func:`kernel_seed`)."""
        return int(kernel_seed(generator))

    @property
    def timing(self) -> str:
        """How the products this backend chooses by measurement are timed: "eager" (back-to-back calls,
        the host's launch cost counts) or "graph" (replayed from a CUDA graph). Always "eager" for a
        backend that measures nothing."""
        return "eager"

    @timing.setter
    def timing(self, mode: str) -> None:
        if mode not in TIMING_MODES:
            raise ValueError(f"timing must be one of {TIMING_MODES}, got {mode!r}")
        if mode != "eager":
            raise ValueError(f"backend {self.name!r} measures no products (measures_products is False): "
                             f"its timing stays 'eager', got {mode!r}")

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


_REGISTRY: dict[str, Callable[[], Backend]] = {}
_INSTANCES: dict[str, Backend] = {}


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    """Register ``factory`` (a Backend subclass, or a function returning a Backend instance; called once,
    on first use) under ``name``. A factory that is a class not derived from Backend is refused here; what
    a function returns is checked when the backend is first asked for (``get_backend``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    if not callable(factory):
        raise TypeError(f"factory for backend {name!r} must be callable (a Backend subclass or a function "
                        f"returning a Backend), got {type(factory).__name__}")
    if isinstance(factory, type) and not issubclass(factory, Backend):
        raise TypeError(f"factory for backend {name!r} must be a subclass of sparsity_lab.backends.Backend, "
                        f"got class {factory.__name__}")
    _REGISTRY[name] = factory


def available_backends() -> list[str]:
    return sorted(_REGISTRY)


def _checked(name: str, backend: object) -> Backend:
    if not isinstance(backend, Backend):
        raise TypeError(f"the factory registered as backend {name!r} returned a {type(backend).__name__}, not a "
                        "sparsity_lab.backends.Backend: subclass Backend (it declares the required methods "
                        "and defaults for the optional ones)")
    if not isinstance(getattr(backend, "name", None), str):
        raise TypeError(f"backend {name!r} ({type(backend).__name__}) must have a str attribute 'name'")
    return backend


def get_backend(name: str) -> Backend:
    """The backend registered under ``name``; a clear error for unknown names."""
    if name not in _REGISTRY:
        raise ValueError(f"backend must be one of {available_backends()}, got {name!r}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _checked(name, _REGISTRY[name]())
    return _INSTANCES[name]
