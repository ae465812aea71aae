"""The backend seam: what a 2:4 layer asks of whoever runs its products.

A training method decides *what* to compute; a backend decides *how*. The reference backend
("torch") is plain PyTorch and runs anywhere. Faster backends (Triton kernels, cuSPARSELt sparse
tensor cores) implement the same operations, subclass :class:`Backend` and register themselves here.

Per optimizer step a layer calls ``refresh_mask_`` (when its refresh interval is due: ``mask``, then
``mask_flips``, by default) and ``prepare_masked`` (once: the pruned — and, for hardware backends,
compressed — weight, reused by every micro-step), or both in one call, ``refresh_and_prepare``, when
the refresh comes right before its products;
per micro-step ``linear``, ``grad_input`` and ``grad_weight``; masked decay calls ``masked_decay_``.
A 2:4 activation (``sparsity_lab.activation24``) asks for the products whose 2:4 operand is the
activation, not the weight: ``act24_linear``, ``act24_grad``, ``act24_grad_input`` and
``tokens24_weight_grad``.

:class:`Backend` declares the products only. Seven methods are required (abstract); every other
one has a default here that is correct for any backend (the activation products' default is the
reference of ``references.act24``), which a backend overrides only to be faster. What a backend
*can* do is declared in class attributes (capabilities), so that callers (``SparseLinear``,
``graph_step``) never probe with ``getattr``/``hasattr`` and adding a backend needs no edit anywhere
else. What a backend tells about its work (the per-product plan of ``backend_report``, counters) and
how an auto policy times the products it chooses between are separate interfaces (``report.py``).
"""
from __future__ import annotations

import abc
from typing import Any, Callable, ClassVar, Union

import torch

from ..methods.flip_rate import mask_flips_tensor
from ..references.act24 import act24, act24_grad
from ..references.act24_tokens import tokens24_weight_grad

PRODUCTS = ("forward", "grad_input", "grad_weight")  # the three products of a linear layer's step

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
    attributes a subclass sets): ``reads_seed_from_device``, ``mask_refresh_capturable``,
    ``products_in_dense_phase``, ``fuses_refresh_and_prepare``, ``token_feature_multiple``.
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

    fuses_refresh_and_prepare: ClassVar[bool] = False
    """True when ``refresh_and_prepare`` writes the mask and the operand in fewer passes than the separate calls:
    a CUDA-graph step that refreshes a mask inside its graph then prepares the operand with it (at the start
    of the captured step) instead of in the layer's forward."""

    token_feature_multiple: int = 1
    """``tokens24_weight_grad``'s features pruned along the tokens come in whole groups of this many
    (64 on cuSPARSELt: whole tiles of the compressed operand); the dense features are chosen to match."""

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

    def refresh_and_prepare(self, weight: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | None, n: int, m: int,
                            transposable: bool, dtype: torch.dtype, backward: bool = True,
                            count: bool = True) -> tuple[torch.Tensor | None, Any]:
        """A mask refresh and the step's operand for the new mask (what ``SparseLinear`` runs when its mask is due
        and its products come next): the N:M mask of ``weight`` written into ``mask`` in place, ``(flips,
        operand)``: the entries where it differs from the mask it replaces (0-d int64 on the device; None
        without ``count``) and ``prepare_masked``'s operand. Default: those separate calls (``mask``,
        ``mask_flips``, a copy, ``prepare_masked``); a backend may do them in fewer passes over W (and then
        sets ``fuses_refresh_and_prepare``)."""
        flips = self.refresh_mask_(weight, mask, n, m, transposable, count=count)
        return flips, self.prepare_masked(weight, mask, beta, n, m, dtype, backward=backward)

    def refresh_mask_(self, weight: torch.Tensor, mask: torch.Tensor, n: int, m: int, transposable: bool,
                      count: bool = True) -> torch.Tensor | None:
        """A mask refresh: the N:M mask of ``weight`` written into ``mask`` in place; returns the entries where
        it differs from the mask it replaces (0-d int64 on the device), None without ``count``. Default:
        ``mask``, ``mask_flips``, a copy; a backend may do it in one pass."""
        new = self.mask(weight, n, m, transposable)
        flips = self.mask_flips(mask, new) if count else None
        mask.copy_(new)
        return flips

    def takes_optimizer_operand(self, weight: torch.Tensor, mask: torch.Tensor, n: int, m: int,
                                dtype: torch.dtype) -> bool:
        """Whether an optimizer's step may write this layer's next operand of (weight, mask) in ``dtype``
        (``MasterWeights.defer_operand``: kernel 26's S(W) and S(W)^T in cuSPARSELt's layout); the backend then
        builds it with ``operand_from_forms``. Default: no."""
        return False

    def operand_from_forms(self, weight: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | None, n: int, m: int,
                           dtype: torch.dtype, forms: tuple) -> Any:
        """The operand of (weight, mask) from compressed forms written elsewhere (``forms``: the optimizer's), for a
        backend whose ``takes_optimizer_operand`` says yes."""
        raise NotImplementedError(f"backend {self.name!r} takes no operand from the optimizer "
                                  "(takes_optimizer_operand is False)")

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

    def graph_constants(self) -> tuple:
        """Host values that this backend's products take as constants (a captured CUDA graph keeps them as
        they were at the capture): ``CudaGraphStep`` recaptures when they change. Default: none. The FP8
        backends with ``FP8Recipe(scale_in_product="host_alpha")`` return their scales' host exponents."""
        return ()

    def device_seed_value(self, generator: torch.Generator) -> int:
        """The int this backend's MVUE draw would take from ``generator`` in eager mode: what a layer in
        CUDA-graph mode writes into its device seed tensor before a replay, so that the replay draws what
        the eager step would. Asked only of backends with ``reads_seed_from_device``; the default is the
        draw of the project's MVUE kernels (:func:`kernel_seed`)."""
        return int(kernel_seed(generator))

    # --- 2:4 activation products: a dense weight times a 2:4 activation (sparsity_lab.activation24) ---------
    def act24_linear(self, h: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(A24 W^T (tokens, out), A24 (tokens, hidden)) for the pre-activation h (tokens, hidden) and a
        dense weight (out, hidden): A24 = top2of4(relu(h)^2), 2:4 along hidden, the summed dimension."""
        a24, _ = act24(h)
        return a24 @ weight.t(), a24

    def act24_grad(self, h: torch.Tensor, grad_a24: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """(dH (tokens, hidden), the operand ``act24_grad_input`` reads): dH = dA24 * 2 relu(h) on A24's
        pattern, so dH is 2:4 along hidden like A24."""
        dh = act24_grad(h, grad_a24, h.dtype)
        return dh, dh

    def act24_grad_input(self, operand: Any, weight: torch.Tensor) -> torch.Tensor:
        """dX = dH W for the operand of ``act24_grad`` and the up projection's weight (hidden, d)."""
        return operand @ weight

    def tokens24_weight_grad(self, a: torch.Tensor, g: torch.Tensor, perm: torch.Tensor,
                             dense_count: int) -> torch.Tensor:
        """C (hidden, k) ~ A^T G for A (tokens, hidden), G (tokens, k): the ``dense_count`` features with
        the most non-zeros exact, the others 2:4 along the tokens permuted by ``perm``
        (``references.act24_tokens.tokens24_weight_grad``)."""
        return tokens24_weight_grad(a, g, perm, dense_count)


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
