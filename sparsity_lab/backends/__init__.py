"""Backends behind one interface: "torch" (reference) now; Triton and cuSPARSELt plug in here."""
from .base import Backend, available_backends, get_backend, register_backend
from .torch_reference import TorchBackend

register_backend("torch", TorchBackend)

__all__ = ["Backend", "TorchBackend", "available_backends", "get_backend", "register_backend"]
