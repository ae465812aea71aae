"""Moved to ``sparsity_lab.backends.fp8_sim`` (it is a backend, and now wraps any backend).

Kept so that ``from sparsity_lab.lab.fp8_sim import NAME, fake_fp8`` still works.
"""
from ..backends.fp8_sim import NAME, FP8SimBackend, fake_fp8

__all__ = ["NAME", "FP8SimBackend", "fake_fp8"]
