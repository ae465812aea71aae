"""Kernel benchmark sections for the gradient-side kernels: 4 mvue24 and 5 masked_decay_."""
from __future__ import annotations

import torch

from sparsity_lab import kernels as K
from sparsity_lab.methods.mvue import mvue_probabilities
from benchmarks.kernels.bench import BF16 as bf16
from benchmarks.kernels.bench import Bench
from benchmarks.kernels.checks import check


def mvue24(bench: Bench) -> None:
    """4. MVUE 2:4 with groups along the tokens of dZ (dim 0) and along the last dim."""
    device, rows, cols, report = bench.device, bench.rows, bench.cols, bench.report
    dz = torch.randn(rows, cols, device=device, dtype=bf16)  # (tokens, out): groups along the tokens
    n = dz.numel()
    for dim, label in ((0, "dim 0 (tokens of dZ)"), (1, "last dim")):
        y = K.mvue24(dz, dim=dim, seed=1)
        xs, ys = (dz[:4096], y[:4096]) if dim == 0 else (dz[:256], y[:256])
        gx = xs.double().movedim(dim, -1).reshape(-1, 4)
        gy = ys.double().movedim(dim, -1).reshape(-1, 4)
        pr = mvue_probabilities(gx)
        expect = gx / pr.clamp_min(1e-300)  # kept entries are x / p
        keep = gy != 0
        check(f"mvue24 {label}", bool(((keep.sum(1)) <= 2).all())
              and bool(((gy - expect).abs()[keep] <= 1.6e-2 * expect.abs()[keep]).all()))
        del y, gx, gy, pr, expect
        wcfg = (4, 8) if dim == 1 else (2, 4)
        cfgs = [{"block": b, "num_warps": nw} for b in (512, 1024, 2048) for nw in wcfg]
        ms, cfg, allc = bench.sweep(lambda **c: (lambda: K.mvue24(dz, dim=dim, seed=3, **c)), cfgs)
        report.memory_bound("4 mvue24", label, dz.shape, 4 * n, ms, cfg, allc)


def masked_decay(bench: Bench) -> None:
    """5. g += lambda * (1 - m) * w in place (fp32 gradient and weight, bool mask)."""
    device, rows, cols, timer, report = bench.device, bench.rows, bench.cols, bench.timer, bench.report
    rows32 = rows // 2 if not bench.smoke else rows  # same MiB in float32
    g = torch.randn(rows32, cols, device=device)
    w32 = torch.randn(rows32, cols, device=device)
    m32 = torch.rand(rows32, cols, device=device) < 0.5
    expected = g + 2e-4 * w32 * ~m32
    g_check = g.clone()
    K.masked_decay_(g_check, w32, m32, 2e-4)
    check("masked_decay_", bool(torch.allclose(g_check, expected, rtol=2e-7, atol=1e-9)))
    del expected, g_check
    n32 = g.numel()
    cfgs = [{"block": b, "num_warps": nw} for b in (2048, 4096, 8192) for nw in (4, 8)]
    ms, cfg, allc = bench.sweep(lambda **c: (lambda: K.masked_decay_(g, w32, m32, 2e-4, **c)), cfgs)
    report.memory_bound("5 masked_decay_", "fp32 g, fp32 w, bool m", g.shape, 13 * n32, ms, cfg, allc)
    ref_ms = timer(lambda: g.add_(w32 * ~m32, alpha=2e-4))
    report.ratio("5 masked_decay_", "vs PyTorch g.add_(w * ~m)", g.shape, ms, "PyTorch", ref_ms, None)
