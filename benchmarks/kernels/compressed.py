"""Kernel benchmark sections for the kernels that write cuSPARSELt's compressed layout:
8 compress24, 10 mvue_compress24, 11 prepare24 and 17 prune24_tokens; and CUTLASS's: 22 prepare24_cutlass and 23
mvue_compress24_cutlass. The one-pass mask refreshes (21, 24) are in ``refresh``."""
from __future__ import annotations

import torch

from sparsity_lab import kernels as K
from sparsity_lab.masks.nm import nm_mask
from sparsity_lab.references.act24_tokens import top2of4_tokens_mask
from sparsity_lab.references.cusparselt_layout import compress24_reference
from benchmarks.kernels.bench import BF16 as bf16
from benchmarks.kernels.bench import Bench
from benchmarks.kernels.checks import check


def compress24(bench: Bench) -> None:
    """8. A 2:4 matrix into the compressed layout: row-major W, and W^T read as a transposed view."""
    device, rows, cols, timer, report = bench.device, bench.rows, bench.cols, bench.timer, bench.report
    crow = rows - rows % 64 if rows >= 64 else 64
    w = torch.randn(crow, cols, device=device, dtype=bf16)
    w = w * nm_mask(w, 2, 4)
    wt = w.t().contiguous().t()  # the same matrix stored column-major: how W^T and MVUE(dZ)^T arrive
    check("compress24", torch.equal(K.compress24(w).view(torch.uint8), compress24_reference(w).view(torch.uint8))
          and torch.equal(K.compress24(wt).view(torch.uint8), compress24_reference(w).view(torch.uint8)))
    n = w.numel()
    nbytes = 2 * n + n + n // 8  # read bf16, write half the values + 4 bits per group
    cfgs = [{"block_groups": b, "num_warps": nw} for b in (16, 32) for nw in (4, 8)]
    for variant, a in (("row-major", w), ("transposed view (W^T, MVUE^T)", wt)):
        ms, cfg, allc = bench.sweep(lambda a=a, **c: (lambda: K.compress24(a, **c)), cfgs)
        report.memory_bound("8 compress24", variant, w.shape, nbytes, ms, cfg, allc, counts_for_target=False,
                            note="added after the copy-rate target was set: not counted in it")
    if device.type == "cuda":
        ref_ms = timer(lambda: torch._cslt_compress(w))
        report.ratio("8 compress24", "row-major vs _cslt_compress", w.shape,
                     min(r["ms"] for r in report.rows if r["kernel"] == "8 compress24"), "_cslt_compress", ref_ms,
                     None)


def mvue_compress24(bench: Bench) -> None:
    """10. MVUE of dZ straight into the compressed layout, against mvue24 then compress24."""
    device, rows, cols, timer, report = bench.device, bench.rows, bench.cols, bench.timer, bench.report
    ctok = rows - rows % 64 if rows >= 64 else 64
    dz = torch.randn(ctok, cols, device=device, dtype=bf16)
    fused_out = K.mvue_compress24(dz, seed=5)
    check("mvue_compress24", torch.equal(fused_out.view(torch.uint8),
                                         K.compress24(K.mvue24(dz, dim=0, seed=5).t()).view(torch.uint8)))
    n = dz.numel()
    cfgs = [{"block_groups": b, "num_warps": nw} for b in (16, 32) for nw in (4, 8)]
    ms, cfg, allc = bench.sweep(lambda **c: (lambda: K.mvue_compress24(dz, seed=5, **c)), cfgs)
    report.memory_bound("10 mvue_compress24", "dZ (tokens, out) -> compressed MVUE(dZ)^T", dz.shape,
                        2 * n + n + n // 8, ms, cfg, allc, counts_for_target=False,
                        note="added after the copy-rate target was set: not counted in it")
    two_ms = timer(lambda: K.compress24(K.mvue24(dz, dim=0, seed=5).t()))
    report.ratio("10 mvue_compress24", "vs mvue24 then compress24", dz.shape, ms, "two kernels", two_ms, None)


def prepare24(bench: Bench) -> None:
    """11. S(W) and S(W)^T compressed straight from W (fp32 or bf16), against threshold then compress twice."""
    device, rows, cols, timer, report = bench.device, bench.rows, bench.cols, bench.timer, bench.report
    prow = rows - rows % 64 if rows >= 64 else 64
    w32 = torch.randn(prow, cols, device=device)
    if device.type != "cuda":  # the CPU interpreter truncates fp32 -> bf16 (the GPU rounds): bf16-exact weights
        w32 = w32.to(bf16).float()
    mask = K.transposable_mask24(w32, pruned=False)[0]
    beta = torch.tensor(0.8, device=device)

    def unfused(w, b):
        s = K.soft_threshold24(w, mask, b, out_dtype=bf16) if b is not None else w.to(bf16) * mask
        return K.compress24(s), K.compress24(s.t())
    for w in (w32, w32.to(bf16)):
        wname = "fp32" if w.dtype == torch.float32 else "bf16"
        for b, mname in ((beta, "S-STE"), (None, "STE")):
            got, want = K.prepare24(w, mask, b, out_dtype=bf16), unfused(w, b)
            check(f"prepare24 {wname} {mname}", all(torch.equal(g.view(torch.uint8), e.view(torch.uint8))
                                                    for g, e in zip(got, want)))
            n = w.numel()
            nbytes = w.element_size() * n + n + 2 * (n + n // 8)  # W, mask; two compressed forms
            cfgs = [{"num_warps": nw} for nw in (4, 8)]
            ms, cfg, allc = bench.sweep(lambda w=w, b=b, **c: (
                lambda: K.prepare24(w, mask, b, out_dtype=bf16, **c)), cfgs)
            report.memory_bound("11 prepare24", f"{wname} W, {mname} -> S(W), S(W)^T compressed", w.shape,
                                nbytes, ms, cfg, allc, counts_for_target=False,
                                note="added after the copy-rate target was set: not counted in it")
            two_ms = timer(lambda w=w, b=b: unfused(w, b))
            report.ratio("11 prepare24", f"{wname} {mname} vs threshold then compress24 twice", w.shape, ms,
                         "three kernels", two_ms, None)


def _cutlass_compress(device: torch.device):
    """(compress, name): CUTLASS's own compressor (``ops.compress``) where the CUTLASS backend runs, else the
    layout's plain-PyTorch reference; compress(S) -> (values, metadata)."""
    if device.type == "cuda":
        from sparsity_lab.backends.cutlass.backend import unavailable_reason
        if unavailable_reason() is None:
            from sparsity_lab.backends.cutlass import ops

            def compress(s):
                c = ops.compress(s)
                return c.values, c.metadata
            return compress, "CUTLASS's compressor"
    from sparsity_lab.references import cutlass_layout
    return cutlass_layout.compress, "the layout's reference"


def prepare24_cutlass(bench: Bench) -> None:
    """22. S(W) and S(W)^T straight from W into CUTLASS's layout, against what the CUTLASS backend did before:
    S(W), a transposed copy and CUTLASS's compressor twice (timed where that backend runs)."""
    device, rows, cols, timer, report = bench.device, bench.rows, bench.cols, bench.timer, bench.report
    prow, pcol = max(16, rows - rows % 16), max(16, cols - cols % 16)
    w32 = torch.randn(prow, pcol, device=device)
    if device.type != "cuda":  # the CPU interpreter truncates fp32 -> bf16 (the GPU rounds): bf16-exact weights
        w32 = w32.to(bf16).float()
    mask = K.transposable_mask24(w32, pruned=False)[0]
    beta = torch.tensor(0.8, device=device)
    compress, compressor = _cutlass_compress(device)

    def unfused(w, b):
        s = K.soft_threshold24(w, mask, b, out_dtype=bf16) if b is not None else w.to(bf16) * mask
        return compress(s), compress(s.t().contiguous())
    for w in (w32, w32.to(bf16)):
        wname = "fp32" if w.dtype == torch.float32 else "bf16"
        for b, mname in ((beta, "S-STE"), (None, "STE")):
            got, want = K.prepare24_cutlass(w, mask, b), unfused(w, b)
            check(f"prepare24_cutlass {wname} {mname} against {compressor}",
                  all(torch.equal(g.view(torch.uint8), e.view(torch.uint8))
                      for g_form, e_form in zip(got, want) for g, e in zip(g_form, e_form)))
            n = w.numel()
            nbytes = w.element_size() * n + n + 2 * (n + n // 8)  # W, mask; two compressed forms (+ padding)
            cfgs = [{"num_warps": nw} for nw in (4, 8)]
            ms, cfg, allc = bench.sweep(lambda w=w, b=b, **c: (lambda: K.prepare24_cutlass(w, mask, b, **c)), cfgs)
            report.memory_bound("22 prepare24_cutlass", f"{wname} W, {mname} -> S(W), S(W)^T in CUTLASS's layout",
                                w.shape, nbytes, ms, cfg, allc, counts_for_target=False,
                                note="added after the copy-rate target was set: not counted in it")
            if compressor == "CUTLASS's compressor":
                report.ratio("22 prepare24_cutlass", f"{wname} {mname} vs threshold, transposed copy, CUTLASS's "
                             "compressor twice", w.shape, ms, "four kernels", timer(lambda w=w, b=b: unfused(w, b)),
                             None)


def mvue_compress24_cutlass(bench: Bench) -> None:
    """23. MVUE(dZ)^T straight into CUTLASS's layout (bf16, and E4M3 with its amax), against what the CUTLASS
    backends did before: mvue24, (E4M3: the cast,) a transposed copy and CUTLASS's compressor (timed where that
    backend runs). dZ (rows, cols) as (tokens, out), the tokens a multiple of 64 as the backends pad them."""
    device, rows, cols, timer, report = bench.device, bench.rows, bench.cols, bench.timer, bench.report
    dz = torch.randn(max(64, rows - rows % 64), cols, device=device, dtype=bf16)
    inv_scale = (448.0 / (2 * dz.abs().amax().float())).reshape(1)
    compress, compressor = _cutlass_compress(device)

    def unfused_bf16():
        return compress(K.mvue24(dz, dim=0, seed=5).t().contiguous())

    def unfused_e4m3():
        q, amax = K.quantize_fp8_with_scale(K.mvue24(dz, dim=0, seed=5), inv_scale)
        return (*compress(q.t().contiguous()), amax)

    fused = {"bf16": lambda **c: (lambda: K.mvue_compress24_cutlass(dz, seed=5, **c)),
             "E4M3": lambda **c: (lambda: K.mvue_compress24_cutlass_fp8(dz, 5, inv_scale, **c))}
    n = dz.numel()
    for variant, unfused, size in (("bf16", unfused_bf16, 2), ("E4M3", unfused_e4m3, 1)):
        got, want = fused[variant]()(), unfused()
        check(f"mvue_compress24_cutlass {variant} against {compressor}",
              all(torch.equal(g.view(torch.uint8), e.view(torch.uint8)) for g, e in zip(got[:2], want[:2]))
              and (variant == "bf16" or torch.equal(got[2], want[2])))
        cfgs = [{"block_groups": b, "num_warps": nw} for b in (16, 32) for nw in (4, 8)]
        ms, cfg, allc = bench.sweep(fused[variant], cfgs)
        report.memory_bound("23 mvue_compress24_cutlass", f"dZ (tokens, out) -> MVUE(dZ)^T {variant} in CUTLASS's "
                            "layout", dz.shape, 2 * n + size * n // 2 + n // 8, ms, cfg, allc,
                            counts_for_target=False, note="added after the copy-rate target was set: not counted in it")
        if compressor == "CUTLASS's compressor":
            steps = "mvue24, transposed copy, CUTLASS's compressor" if variant == "bf16" else \
                "mvue24, cast, transposed copy, CUTLASS's compressor"
            report.ratio("23 mvue_compress24_cutlass", f"{variant} vs {steps}", dz.shape, ms,
                         "three kernels" if variant == "bf16" else "four kernels", timer(unfused), None)


def prune24_tokens(bench: Bench) -> None:
    """17. Permuted tokens of 15/16 of the features gathered, 2:4 along the tokens, compressed, against a
    torch gather, ``prune24`` of the transposed copy and ``compress24``."""
    device, rows, cols, timer, report = bench.device, bench.rows, bench.cols, bench.timer, bench.report
    tokens = rows - rows % 64 if rows >= 64 else 64
    hidden = cols - cols % 64 if cols >= 64 else 64
    gen = torch.Generator().manual_seed(17)
    a = (torch.relu(torch.randn(tokens, hidden, generator=gen)) ** 2).to(device=device, dtype=bf16)  # like A24 / dH
    perm = torch.randperm(tokens, generator=gen).to(device)
    n_feat = max(64, hidden * 15 // 16 // 64 * 64)
    feats = torch.sort(torch.randperm(hidden, generator=gen)[:n_feat]).values.to(device)
    b = a[perm][:, feats]
    want = compress24_reference((b * top2of4_tokens_mask(b)).t().contiguous())
    check("prune24_tokens", torch.equal(K.prune24_tokens(a, perm, feats).view(torch.uint8), want.view(torch.uint8)))
    n = b.numel()
    cfgs = [{"num_warps": nw} for nw in (4, 8)]
    ms, cfg, allc = bench.sweep(lambda **c: (lambda: K.prune24_tokens(a, perm, feats, **c)), cfgs)
    report.memory_bound("17 prune24_tokens", "A (tokens, hidden) -> compressed top2of4_tokens(A[P][:, S])^T",
                        (n_feat, tokens), 2 * n + n + n // 8, ms, cfg, allc, counts_for_target=False,
                        note="added after the copy-rate target was set: not counted in it")
    unfused_ms = timer(lambda: K.compress24(K.prune24(a[perm][:, feats].t().contiguous())[0]))
    report.ratio("17 prune24_tokens", "vs gather, prune24 of the transposed copy, compress24", (n_feat, tokens), ms,
                 "three passes", unfused_ms, None)
