"""Backends behind one interface (``base.Backend``): "torch" (the reference), "triton", "cusparselt",
"cusparselt_auto", "cutlass", "cutlass_fp8", "sparse_auto" (per product dense, cuSPARSELt or CUTLASS, as
measured) and the FP8 simulations; a new one subclasses Backend and calls ``register_backend``."""
from .base import Backend, MvueSeed, available_backends, get_backend, register_backend
from .fp8_sim import register_fp8_sim
from .torch_reference import TorchBackend

register_backend("torch", TorchBackend)


def _triton_backend():
    # imported only when asked for: `import sparsity_lab` must not import triton
    from .triton import TritonBackend
    return TritonBackend()


register_backend("triton", _triton_backend)


def _cusparselt_backend(auto: bool):
    # imported only when asked for; without a CUDA GPU it returns the reference with a warning
    from .cusparselt.backend import cusparselt_backend
    return cusparselt_backend(auto=auto)


register_backend("cusparselt", lambda: _cusparselt_backend(False))
register_backend("cusparselt_auto", lambda: _cusparselt_backend(True))
register_fp8_sim("torch")  # "torch_fp8sim": simulated FP8 products around any backend (fp8_sim.py)
register_fp8_sim("triton")  # "triton_fp8sim"


def _fp8_training_backend(name: str):
    # imported only when asked for, like the other cuSPARSELt backends: `import sparsity_lab` stays light
    from .cusparselt.fp8_train import fp8_training_backend
    return fp8_training_backend(name)


for _name in ("cusparselt_fp8", "fp8_dense", "fp8_reference"):  # cusparselt/fp8_train.py: FP8 training
    register_backend(_name, lambda name=_name: _fp8_training_backend(name))
del _name


def _cutlass_backend(name: str):
    # imported only when asked for; raises CutlassUnavailable (naming what is missing) where it cannot run
    if name == "cutlass":
        from .cutlass.backend import cutlass_backend
        return cutlass_backend()
    from .cutlass.fp8 import cutlass_fp8_backend
    return cutlass_fp8_backend()


for _name in ("cutlass", "cutlass_fp8"):  # cutlass/: CUTLASS SM90 sparse GEMMs, built on first use
    register_backend(_name, lambda name=_name: _cutlass_backend(name))
del _name

def _sparse_auto_backend():
    # imported only when asked for, like cusparselt_auto; builds CUTLASS's library where it can run
    from .sparse_auto import sparse_auto_backend
    return sparse_auto_backend()


register_backend("sparse_auto", _sparse_auto_backend)

__all__ = ["Backend", "MvueSeed", "TorchBackend", "available_backends", "get_backend", "register_backend"]
