"""Kernel benchmark sections for the activation-side kernels: 7 FP8 cast, 6 gated activations, 16 squared ReLU."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from sparsity_lab import kernels as K
from sparsity_lab.references.fp8 import dequantize_fp8 as ref_dequantize
from sparsity_lab.references.fp8 import quantize_fp8 as ref_quantize
from sparsity_lab.references.gated import gated_backward as ref_gated_bwd
from sparsity_lab.references.gated import gated_forward as ref_gated_fwd
from sparsity_lab.references.relu2 import relu2 as ref_relu2
from sparsity_lab.references.relu2 import relu2_grad as ref_relu2_grad
from benchmarks.kernels.bench import BF16 as bf16
from benchmarks.kernels.bench import Bench
from benchmarks.kernels.checks import check, ulp_ok


def fp8(bench: Bench) -> None:
    """7. FP8 per-tensor amax, scale, cast (E4M3 / E5M2) and back, against the reference."""
    device, rows, cols, timer, report = bench.device, bench.rows, bench.cols, bench.timer, bench.report
    x = torch.randn(rows, cols, device=device, dtype=bf16)
    n = x.numel()
    for fmt in ("e4m3", "e5m2"):
        q, scale = K.quantize_fp8(x, fmt)
        q_ref, scale_ref = ref_quantize(x, fmt)
        check(f"fp8 {fmt}", torch.equal(scale, scale_ref) and torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
              and ulp_ok(K.dequantize_fp8(q, scale, bf16), ref_dequantize(q_ref, scale_ref, bf16)))
    q, scale = K.quantize_fp8(x, "e4m3")
    inv = (448.0 / x.abs().amax().float())
    cfgs = [{"block": b, "num_warps": nw} for b in (2048, 4096, 8192) for nw in (4, 8)]
    ms, cfg, allc = bench.sweep(lambda **c: (lambda: K.quantize_fp8_with_scale(x, inv, "e4m3", **c)), cfgs)
    report.memory_bound("7 fp8", "cast with given scale + amax", x.shape, 2 * n + n, ms, cfg, allc)
    ms, cfg, allc = bench.sweep(lambda **c: (lambda: K.amax(x, **c)), cfgs)
    report.memory_bound("7 fp8", "amax alone", x.shape, 2 * n, ms, cfg, allc)
    ms, cfg, allc = bench.sweep(lambda **c: (lambda: K.dequantize_fp8(q, scale, bf16, **c)), cfgs)
    report.memory_bound("7 fp8", "dequantize to bf16", x.shape, n + 2 * n, ms, cfg, allc)
    ms, cfg, allc = bench.sweep(lambda **c: (lambda: K.quantize_fp8(x, "e4m3", **c)), cfgs)
    report.memory_bound("7 fp8", "current amax (2 passes)", x.shape, 2 * n + n, ms, cfg, allc,
                        counts_for_target=False, note="x read twice: at most 3/5 of the copy rate")
    ref_ms = timer(lambda: ref_quantize(x, "e4m3"))
    report.ratio("7 fp8", "current amax vs PyTorch reference", x.shape, ms, "PyTorch", ref_ms, None)


def gated(bench: Bench) -> None:
    """6. Fused SwiGLU / GEGLU forward and backward, both layouts, against the unfused PyTorch sequence."""
    device, rows, cols, timer, report = bench.device, bench.rows, bench.cols, bench.timer, bench.report
    tokens = rows // 2 if not bench.smoke else 8
    ffn = cols
    act = {"swiglu": F.silu, "geglu": F.gelu}
    gcfgs = [{"block": b, "num_warps": nw} for b, nw in ((2048, 4), (4096, 8), (1024, 4))]
    for layout, split_dim in (("row-major h (T, 2F)", -1), ("transposed h^T (2F, T)", 0)):
        shape = (tokens, 2 * ffn) if split_dim == -1 else (2 * ffn, tokens)
        h = torch.randn(shape, device=device, dtype=bf16)
        dout = torch.randn((tokens, ffn) if split_dim == -1 else (ffn, tokens), device=device, dtype=bf16)
        ne = dout.numel()
        for kind in ("swiglu", "geglu"):
            check(f"gated {kind} {layout}",
                  bool(torch.allclose(K.gated_forward(h, kind, split_dim).float(),
                                      ref_gated_fwd(h, kind, split_dim).float(), rtol=2e-2, atol=1e-5))
                  and bool(torch.allclose(K.gated_backward(dout, h, kind, split_dim).float(),
                                          ref_gated_bwd(dout, h, kind, split_dim).float(), rtol=2e-2, atol=1e-5)))
            ms_f, cfg_f, all_f = bench.sweep(lambda **c: (lambda: K.gated_forward(h, kind, split_dim, **c)), gcfgs)
            ms_b, cfg_b, all_b = bench.sweep(
                lambda **c: (lambda: K.gated_backward(dout, h, kind, split_dim, **c)), gcfgs)

            def unfused_fwd():
                gate, value = h.chunk(2, dim=split_dim)
                return act[kind](gate) * value

            hg = h.detach().requires_grad_(True)
            gate, value = hg.chunk(2, dim=split_dim)
            out_graph = act[kind](gate) * value
            unf_f = timer(unfused_fwd)
            unf_b = timer(lambda: torch.autograd.grad(out_graph, hg, dout, retain_graph=True))
            report.ratio("6 gated", f"{kind} fwd, {layout}", shape, ms_f, "unfused PyTorch", unf_f, 1.0,
                         nbytes=2 * 2 * ne + 2 * ne)
            report.rows[-1].update(config=cfg_f, all_configs=all_f)
            report.ratio("6 gated", f"{kind} bwd, {layout}", shape, ms_b, "unfused PyTorch (autograd)", unf_b, 1.0,
                         nbytes=3 * 2 * ne + 2 * 2 * ne)
            report.rows[-1].update(config=cfg_b, all_configs=all_b)
            del hg, gate, value, out_graph
        del h, dout


def relu2(bench: Bench) -> None:
    """16. Fused squared ReLU forward and backward against the two-pass PyTorch expression F.relu(h).square().

    h and dy (rows, 4 cols) bf16: 16384 x 16384 at the default --mib 128. Fused: forward reads h and writes y,
    backward reads h and dy and writes dh. The baseline is what the dense FFN ran before: the two passes
    forward and autograd's backward of them (forward + backward timed together, graph built each call).
    """
    device, timer, report = bench.device, bench.timer, bench.report
    shape = (bench.rows, 4 * bench.cols)
    h = torch.randn(shape, device=device, dtype=bf16)
    dy = torch.randn(shape, device=device, dtype=bf16)
    n = h.numel()
    y, dh = K.relu2_forward(h), K.relu2_backward(dy, h)
    # bit for bit on a GPU; the interpreter (--smoke) truncates float32 -> bf16 (1 ulp)
    same = torch.equal if device.type == "cuda" else ulp_ok
    check("relu2 forward and backward", bool(same(y, ref_relu2(h))) and bool(same(dh, ref_relu2_grad(h, dy))))
    del y, dh
    cfgs = [{"block": b, "num_warps": nw} for b, nw in ((2048, 4), (4096, 8), (1024, 4), (8192, 8))]
    ms_f, cfg_f, all_f = bench.sweep(lambda **c: (lambda: K.relu2_forward(h, **c)), cfgs)
    report.memory_bound("16 relu2", "forward (read h, write y)", shape, 2 * n + 2 * n, ms_f, cfg_f, all_f)
    ms_b, cfg_b, all_b = bench.sweep(lambda **c: (lambda: K.relu2_backward(dy, h, **c)), cfgs)
    report.memory_bound("16 relu2", "backward (read h, dy, write dh)", shape, 3 * 2 * n, ms_b, cfg_b, all_b)

    def fused_step():
        return K.relu2_forward(h, **cfg_f), K.relu2_backward(dy, h, **cfg_b)

    hg = h.detach().requires_grad_(True)

    def two_pass_step():
        out = F.relu(hg).square()
        return out, torch.autograd.grad(out, hg, dy)

    report.ratio("16 relu2", "forward + backward", shape, timer(fused_step), "two-pass PyTorch (autograd)",
                 timer(two_pass_step), 1.0, nbytes=2 * n + 2 * n + 3 * 2 * n)
    report.ratio("16 relu2", "forward", shape, ms_f, "two-pass PyTorch", timer(lambda: F.relu(h).square()), 1.0,
                 nbytes=2 * n + 2 * n)
    del h, dy, hg
