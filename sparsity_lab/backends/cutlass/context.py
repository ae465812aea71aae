"""The CUDA driver context on the calling thread, before CUTLASS's host code runs.

CUTLASS's SM90 kernels are set up through the CUDA *driver* API: ``cuTensorMapEncodeTiled`` writes each
TMA descriptor on the host. A driver call needs a context current on the calling thread, and a thread that
has made no CUDA runtime call yet has none: autograd's backward thread, for one, when a CUTLASS product is
the first CUDA work of its backward pass. The descriptor then fails (``CUDA_ERROR_INVALID_CONTEXT``), CUTLASS
only prints it, the kernel still launches with the broken descriptor and the illegal instruction it hits
poisons the process's CUDA context. ``make_current`` puts the device's primary context (the one PyTorch
and the CUDA runtime use) on the calling thread first; it costs one driver call when it is already there.
"""
from __future__ import annotations

import ctypes
import threading

import torch

_LOCK = threading.Lock()
_DRIVER: ctypes.CDLL | None = None
_PRIMARY: dict[int, ctypes.c_void_p] = {}  # device ordinal -> its primary context, retained once per process


def _driver() -> ctypes.CDLL:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = ctypes.CDLL("libcuda.so.1")
    return _DRIVER


def _check(result: int, call: str) -> None:
    if result:
        raise RuntimeError(f"CUDA driver {call} failed with CUresult {result}")


def _primary(ordinal: int) -> ctypes.c_void_p:
    with _LOCK:
        if ordinal not in _PRIMARY:
            driver, device, ctx = _driver(), ctypes.c_int(0), ctypes.c_void_p()
            _check(driver.cuInit(0), "cuInit")
            _check(driver.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
            _check(driver.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain")
            _PRIMARY[ordinal] = ctx
        return _PRIMARY[ordinal]


def make_current(device: torch.device) -> None:
    """Make ``device``'s primary context current on this thread (nothing to do when it already is)."""
    ordinal = device.index if device.index is not None else torch.cuda.current_device()
    ctx, current = _primary(ordinal), ctypes.c_void_p()
    _check(_driver().cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
    if current.value != ctx.value:
        _check(_driver().cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
