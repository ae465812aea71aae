"""Backends behind one interface: "torch" (reference) now; Triton and cuSPARSELt plug in here."""
from .base import Backend, available_backends, get_backend, register_backend
from .torch_reference import TorchBackend

register_backend("torch", TorchBackend)


def _triton_backend():
    # imported only when asked for: `import sparsity_lab` must not import triton
    from .triton_backend import TritonBackend
    return TritonBackend()


register_backend("triton", _triton_backend)

__all__ = ["Backend", "TorchBackend", "available_backends", "get_backend", "register_backend"]
