"""torchtitan's trainer on the CPU, for the smoke run of ``python -m benchmarks torchtitan-gpus --device cpu``.

torchtitan 0.3 picks its device when ``torchtitan.tools.utils`` is imported: the first accelerator it
finds, else ``"cuda"``, and several of its modules copy that choice (``device_type``,
``device_module``) at import. On a machine without a GPU its trainer then calls into ``torch.cuda``
and stops. :func:`use_cpu` points every copy at the CPU (gloo as the process group's backend) and
gives a stand-in for the few ``torch.cuda`` calls the trainer makes (device name, memory statistics,
synchronize); FSDP2's gradient reductions become plain sums (gloo has no pre-scaled sum). It is applied by ``benchmarks.torchtitan_record`` at import when
``SPARSITY_LAB_TITAN_DEVICE=cpu``, before the trainer is built. Figures from such a run say that the
path works, not how fast anything is.
"""
import importlib
import platform
import resource
import sys
from types import SimpleNamespace

import torch

DEVICE_ENV = "SPARSITY_LAB_TITAN_DEVICE"

# torchtitan's modules that hold their own copy of the device choice (from ... import device_type)
_HOLDERS = ("torchtitan.tools.utils", "torchtitan.components.metrics", "torchtitan.distributed.parallel_dims",
            "torchtitan.distributed.utils", "torchtitan.models.common.token_dispatcher")


def _peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class CPUDeviceModule:
    """What torchtitan's trainer asks of ``torch.cuda``, answered for the CPU. The peak memory it reports
    is the process's peak resident memory (the CPU has no allocator statistics)."""

    @staticmethod
    def set_device(device) -> None:
        pass

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def device_count() -> int:
        return 1  # torchtitan then uses cpu:0 in every process

    @staticmethod
    def synchronize(device=None) -> None:
        pass

    @staticmethod
    def get_device_name(device=None) -> str:
        return platform.processor() or platform.machine() or "cpu"

    @staticmethod
    def get_device_properties(device=None):
        import os
        return SimpleNamespace(total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                               name=CPUDeviceModule.get_device_name())

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def memory_stats(device=None) -> dict:
        peak = _peak_rss_bytes()
        return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak, "num_alloc_retries": 0,
                "num_ooms": 0}


def _sum_reductions_for_gloo() -> None:
    """torchtitan scales gradients itself (FSDP's division off); FSDP then reduces with a pre-scaled sum,
    which gloo does not have: ask FSDP for a plain sum, as on NCCL with a factor of 1."""
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.distributed import fsdp as titan_fsdp

    disable_division = titan_fsdp.disable_fsdp_gradient_division

    def disable_division_and_sum(model) -> None:
        disable_division(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    titan_fsdp.disable_fsdp_gradient_division = disable_division_and_sum


def use_cpu() -> None:
    """Point torchtitan's device choice at the CPU in every module that copied it, and its FSDP reductions at
    what gloo offers."""
    if torch.cuda.is_available():
        raise RuntimeError(f"{DEVICE_ENV}=cpu is the smoke run for machines without a GPU; this one has "
                           f"{torch.cuda.device_count()} CUDA device(s): unset {DEVICE_ENV}")
    for name in _HOLDERS:
        module = importlib.import_module(name)
        if hasattr(module, "device_type"):
            module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = CPUDeviceModule
    _sum_reductions_for_gloo()
