"""The backend seam: what a 2:4 layer asks of whoever runs its products.

A training method decides *what* to compute; a backend decides *how*. The reference backend
("torch") is plain PyTorch and runs anywhere. Faster backends (Triton kernels, cuSPARSELt sparse
tensor cores) implement the same operations and register themselves here.

Per optimizer step a layer calls ``mask`` (when its refresh interval is due) and ``prepare``
(once: the pruned — and, for hardware backends, compressed — weight, reused by every
micro-step); per micro-step ``linear``, ``grad_input`` and ``grad_weight``.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

import torch


class Backend(Protocol):
    name: str

    def mask(self, weight: torch.Tensor, n: int, m: int, transposable: bool) -> torch.Tensor:
        """bool (out, in): the N:M magnitude mask (row-wise along ``in``, or transposable)."""

    def sparse_weight(self, weight: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | None,
                      n: int, m: int) -> torch.Tensor:
        """The weight the products use: m * W, or beta * S(W) when beta is given (S-STE)."""

    def prepare(self, sparse_weight: torch.Tensor) -> Any:
        """Operand(s) for the products of one optimizer step (e.g. compressed W and W^T)."""

    def linear(self, x: torch.Tensor, operand: Any, bias: torch.Tensor | None) -> torch.Tensor:
        """Z = X S(W)^T + b for X (tokens, in). Returns (tokens, out)."""

    def grad_input(self, grad_out: torch.Tensor, operand: Any) -> torch.Tensor:
        """dX = dZ S(W) for dZ (tokens, out). Returns (tokens, in)."""

    def grad_weight(self, grad_out: torch.Tensor, x: torch.Tensor, mvue: bool,
                    generator: torch.Generator | None) -> torch.Tensor:
        """dW = dZ^T X, or MVUE(dZ^T) X with groups of 4 along the tokens. Returns (out, in)."""

    # optional: ``mask_flips(previous, current) -> 0-d int64 tensor`` (a faster flip count; the
    # layer uses sparsity_lab.methods.flip_rate.mask_flips_tensor when a backend has none) and
    # ``sparse_weight_as(weight, mask, beta, n, m, dtype)`` (= sparse_weight(...).to(dtype), fewer passes)

    def masked_decay_(self, grad: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor,
                      decay: float) -> None:
        """In place: grad += decay * (1 - m) * W."""


_REGISTRY: dict[str, Callable[[], Backend]] = {}
_INSTANCES: dict[str, Backend] = {}


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    _REGISTRY[name] = factory


def available_backends() -> list[str]:
    return sorted(_REGISTRY)


def get_backend(name: str) -> Backend:
    """The backend registered under ``name``; a clear error for unknown names."""
    if name not in _REGISTRY:
        raise ValueError(f"backend must be one of {available_backends()}, got {name!r}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _REGISTRY[name]()
    return _INSTANCES[name]
