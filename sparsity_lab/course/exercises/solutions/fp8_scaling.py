"""Worked solutions: delayed FP8 scaling from an amax history (notebook 15, section 3) and the bytes of a
scale pass after the product (notebook 06, section 4)."""
from __future__ import annotations

import math


def delayed_scales(amaxes, history_len, margin, fp8_max):
    """The scale after each step: max of the last ``history_len`` amaxes (this step's included) /
    fp8_max * 2**margin; a max that is 0 or not finite keeps the previous scale (1 before the first)."""
    scales, scale = [], 1.0
    for t in range(len(amaxes)):
        window = amaxes[max(0, t - history_len + 1):t + 1]
        a = max(window)
        if a > 0 and math.isfinite(a):
            scale = a / fp8_max * 2.0 ** margin
        scales.append(scale)
    return scales


def pass_bytes(m, n, bytes_in, bytes_out):
    """A pass that scales an (m, n) output reads each of its m * n entries once and writes each once."""
    return m * n * (bytes_in + bytes_out)
