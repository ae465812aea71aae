"""``sparsity-lab bench-kernels``: the Triton kernels against the copy ceiling and their baselines (GPU).

One run, one GPU, everything side by side:
* the ceiling: device-to-device copy bandwidth (bytes read + bytes written per second), measured first;
* memory-bound kernels (1 prune, 3 soft threshold, 4 MVUE, 5 masked decay, 7 FP8): tensors of at
  least 64 MiB, bytes counted as each input read once and each output written once, printed as a
  fraction of the ceiling (target >= 0.70); a few block sizes / warp counts are timed per kernel
  and the best is reported (all are in the JSON);
* 2 transposable mask: exact (checked against the 90-pattern reference in the same run), timed
  against ``torch._sparse_semi_structured_tile`` on the same matrix and against the plain PyTorch
  90-pattern search (``masks.patterns.solve_patterns`` plus the pruned W and W^T); targets >= 1x
  and >= 10x;
* 6 gated activations: fused against the unfused PyTorch sequence (forward: split, activation,
  product; backward: autograd of that sequence), both layouts, ratio printed.
Every kernel's output is checked against its PyTorch reference on the benchmark tensors before it
is timed. Times: ``triton.testing.do_bench`` medians (it clears the L2 between runs).
The last line of the table is the worst fraction of the ceiling. Writes results/<name>.json.
``--smoke`` runs tiny sizes on the CPU through the Triton interpreter (a test of this script; its
numbers mean nothing).
"""
from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

import torch

from .timing import Timer, sync

TARGET_FRACTION = 0.70
MIB = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out-dir", default=None, help="where to write <name>.json (default results/)")
    parser.add_argument("--name", default="kernels_h100", help="result file name (default kernels_h100)")
    parser.add_argument("--mib", type=int, default=128,
                        help="size of each kernel's main bf16 tensor in MiB (default 128; the targets need >= 64)")
    parser.add_argument("--rep-ms", type=int, default=100, help="do_bench repetition time per measurement (ms)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes on the CPU through the Triton interpreter: checks the script, not the figures")


# --- timing -----------------------------------------------------------------------------------
# --- the table ----------------------------------------------------------------------------------
class Report:
    def __init__(self, copy_gbps: float) -> None:
        self.copy_gbps = copy_gbps
        self.rows: list[dict] = []

    def memory_bound(self, kernel: str, variant: str, shape, nbytes: int, ms: float, config: dict,
                     all_configs: list | None = None, counts_for_target: bool = True, note: str = "") -> dict:
        gbps = nbytes / ms / 1e6
        row = {"kernel": kernel, "variant": variant, "shape": list(shape), "bytes": nbytes, "ms": ms,
               "gbps": gbps, "fraction_of_copy": gbps / self.copy_gbps, "config": config,
               "all_configs": all_configs or [], "counts_for_target": counts_for_target, "note": note}
        self.rows.append(row)
        return row

    def ratio(self, kernel: str, variant: str, shape, ms: float, baseline: str, baseline_ms: float | None,
              target: float | None, nbytes: int | None = None, note: str = "") -> dict:
        row = {"kernel": kernel, "variant": variant, "shape": list(shape), "ms": ms, "baseline": baseline,
               "baseline_ms": baseline_ms, "speedup": (baseline_ms / ms) if baseline_ms else None,
               "target_speedup": target, "note": note}
        if nbytes is not None:
            row.update(bytes=nbytes, gbps=nbytes / ms / 1e6, fraction_of_copy=nbytes / ms / 1e6 / self.copy_gbps)
        self.rows.append(row)
        return row

    def summary(self) -> dict:
        counted = [r for r in self.rows if r.get("counts_for_target")]
        if not counted:
            return {"copy_gbps": self.copy_gbps, "worst_fraction": None, "worst_kernel": None,
                    "target_fraction": TARGET_FRACTION, "target_met": False}
        worst = min(counted, key=lambda r: r["fraction_of_copy"])
        return {"copy_gbps": self.copy_gbps, "worst_fraction": worst["fraction_of_copy"],
                "worst_kernel": f"{worst['kernel']} {worst['variant']}", "target_fraction": TARGET_FRACTION,
                "target_met": worst["fraction_of_copy"] >= TARGET_FRACTION}

    def print(self) -> None:
        print(f"\n{'kernel':<22}{'variant':<34}{'ms':>9}{'GB/s':>9}{'x copy':>8}   vs baseline")
        for r in self.rows:
            frac = f"{r['fraction_of_copy']:.2f}" if "fraction_of_copy" in r else ""
            gbps = f"{r['gbps']:.0f}" if "gbps" in r else ""
            extra = ""
            if r.get("baseline"):
                if r["speedup"] is None:
                    extra = f"{r['baseline']}: n/a ({r['note']})"
                else:
                    tgt = f" (target >= {r['target_speedup']:g}x)" if r.get("target_speedup") else ""
                    extra = f"{r['speedup']:.2f}x faster than {r['baseline']} {r['baseline_ms']:.3f} ms{tgt}"
            elif r.get("note"):
                extra = r["note"]
            print(f"{r['kernel']:<22}{r['variant']:<34}{r['ms']:>9.3f}{gbps:>9}{frac:>8}   {extra}")
        s = self.summary()
        if s["worst_fraction"] is None:
            print("worst fraction of the copy ceiling: no memory-bound kernel was timed")
            return
        print(f"worst fraction of the copy ceiling ({self.copy_gbps:.0f} GB/s) over the one-pass memory-bound "
              f"kernels: {s['worst_fraction']:.2f} ({s['worst_kernel']}); target {TARGET_FRACTION:.2f}: "
              f"{'met' if s['target_met'] else 'NOT met'}")


def _sweep(timer: Timer, make_fn, configs: list[dict]) -> tuple[float, dict, list]:
    """Time fn(**config) for each config; (best ms, best config, [(config, ms)])."""
    results = []
    for cfg in configs:
        results.append((cfg, timer(make_fn(**cfg))))
    best_cfg, best_ms = min(results, key=lambda t: t[1])
    return best_ms, best_cfg, [{"config": c, "ms": ms} for c, ms in results]


# --- the checks (references on the benchmark tensors) -------------------------------------------------
def _ulp_ok(actual: torch.Tensor, expected: torch.Tensor, ulps: float = 1.0) -> bool:
    info = torch.finfo(expected.dtype)
    a, e = actual.float(), expected.float()
    return bool(((a - e).abs() <= ulps * info.eps * e.abs() + info.tiny).all())


class CheckFailed(AssertionError):
    pass


def _check(name: str, ok: bool) -> None:
    print(f"  check {name}: {'ok' if ok else 'FAILED'}")
    if not ok:
        raise CheckFailed(f"{name} does not match its reference")


@contextlib.contextmanager
def section(name: str, failures: list):
    """A kernel's check and timings: a failed check is recorded and the kernel is not timed."""
    try:
        yield
    except CheckFailed as err:
        failures.append(str(err))
        print(f"  {name}: NOT timed ({err})")


# --- the benchmark ------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            print("bench-kernels needs a CUDA GPU (use --smoke to check the script on a CPU)")
            return 2
        device = torch.device("cuda")
    if not args.smoke and args.mib < 64:
        print(f"warning: --mib {args.mib} is below the 64 MiB the targets are stated for")
    from .. import kernels as K
    from ..references.fp8 import dequantize_fp8 as ref_dequantize
    from ..references.fp8 import quantize_fp8 as ref_quantize
    from ..references.gated import gated_backward as ref_gated_bwd
    from ..references.gated import gated_forward as ref_gated_fwd
    from ..masks.nm import nm_mask
    from ..masks.patterns import solve_patterns, transposable_patterns
    from ..masks.tiles import to_tiles, validate_transposable_mask
    from ..methods.mvue import mvue_probabilities
    from ..methods.soft_threshold import soft_threshold
    from ..provenance import write_result

    torch.manual_seed(0)
    timer = Timer(args.smoke, args.rep_ms)
    failures: list[str] = []
    bf16 = torch.bfloat16
    # main tensor: `mib` MiB of bf16, as (rows, 4096) (smoke: a few KiB)
    cols = 64 if args.smoke else 4096
    rows = 48 if args.smoke else args.mib * MIB // (2 * cols)
    few = args.smoke  # one config per kernel in smoke mode

    # ceiling: device-to-device copy of 2 x mib MiB (bytes read + written)
    src = torch.randn(2 * rows * cols, device=device, dtype=bf16)
    dst = torch.empty_like(src)
    copy_ms = timer(lambda: dst.copy_(src))
    copy_gbps = 2 * src.numel() * 2 / copy_ms / 1e6
    del src, dst
    report = Report(copy_gbps)
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu (smoke)'}; "
          f"copy ceiling {copy_gbps:.0f} GB/s ({4 * rows * cols * 2 / MIB:.0f} MiB moved per copy)")

    # 1. row-wise 2:4 prune ---------------------------------------------------------------------------
    with section('1. row-wise 2:4', failures):
        w = torch.randn(rows, cols, device=device, dtype=bf16)
        n = w.numel()
        out, bits = K.prune24(w)
        ref_mask = nm_mask(w, 2, 4)
        _check("prune24", torch.equal(K.unpack_mask24(bits), ref_mask) and torch.equal(out, w * ref_mask))
        cfgs = [{"block": b, "num_warps": nw} for b in (512, 1024, 2048) for nw in (4, 8)][: 1 if few else None]
        ms_v, cfg, allc = _sweep(timer, lambda **c: (lambda: K.prune24(w, **c)), cfgs)
        report.memory_bound("1 prune24", "values + uint8 group mask", w.shape, 2 * n + 2 * n + n // 4, ms_v, cfg, allc)
        ms, cfg, allc = _sweep(timer, lambda **c: (lambda: K.prune24(w, values=False, **c)), cfgs)
        report.memory_bound("1 prune24", "mask only", w.shape, 2 * n + n // 4, ms, cfg, allc)
        ref_ms = timer(lambda: w * nm_mask(w, 2, 4))
        report.ratio("1 prune24", "values + mask vs PyTorch", w.shape, ms_v, "nm_mask(w) * w", ref_ms, None)
        del out, bits, ref_mask

    # 2. transposable 2:4 mask ------------------------------------------------------------------------
    with section('2. transposable 2:4', failures):
        wt = torch.randn(rows if not args.smoke else 32, cols, device=device, dtype=bf16)
        mask, p, pt = K.transposable_mask24(wt)
        validate_transposable_mask(mask, 2, 4)
        ref_t = solve_patterns(wt, 2, 4)
        pats = transposable_patterns(2, 4).to(device).reshape(90, 16).float()
        best = (to_tiles(wt.float().abs(), 4).reshape(-1, 16) @ pats.T).max(1).values
        kept = to_tiles((wt.float().abs() * mask), 4).reshape(-1, 16).sum(1)
        same_tiles = float((to_tiles(mask, 4) == to_tiles(ref_t, 4)).reshape(-1, 16).all(1).float().mean())
        _check("transposable24 (optimal mass per tile, W and W^T)",
               bool(((best - kept) <= 1e-5 * best).all()) and torch.equal(p, wt * mask) and torch.equal(pt, (wt * mask).t()))
        print(f"  transposable24: tiles with the reference's exact pattern: {same_tiles:.6f} (others: float ties)")
        del best, kept, pats
        nt = wt.numel()
        tcfgs = [{"block_a": a, "block_b": b, "num_warps": nw}
                 for a, b, nw in ((4, 64, 4), (8, 64, 8), (8, 32, 4), (2, 64, 4), (4, 128, 8))][: 1 if few else None]
        # W^T three ways (see kernels/transposable24.py); the default's row carries the comparisons
        from ..kernels.transposable24 import DEFAULT_TRANSPOSE
        variants = {}
        for mode in ("permute", "trans", "separate"):
            cm, cp, ct = K.transposable_mask24(wt, transpose=mode)
            _check(f"transposable24 transpose={mode}", torch.equal(cm, mask) and torch.equal(cp, p) and torch.equal(ct, pt))
            del cm, cp, ct
            variants[mode] = _sweep(timer, lambda **c: (lambda: K.transposable_mask24(wt, transpose=mode, **c)), tcfgs)
        for mode, (ms_v, cfg_v, all_v) in variants.items():
            moved = "9n (a second pass reads and writes W)" if mode == "separate" else "7n"
            report.ratio("2 transposable24", f"mask + W + W^T, W^T by {mode}", wt.shape, ms_v, "", None, None,
                         nbytes=7 * nt, note=f"counted 7n bytes, moves {moved}")
            report.rows[-1].update(config=cfg_v, all_configs=all_v)
        ms_t, cfg_t, all_t = variants[DEFAULT_TRANSPOSE]
        ms_m, cfg_m, all_m = _sweep(timer, lambda **c: (lambda: K.transposable_mask24(wt, pruned=False, **c)), tcfgs)

        def plain_pytorch():
            m = solve_patterns(wt, 2, 4)
            pw = wt * m
            return m, pw, pw.t().contiguous()

        plain_ms = timer(plain_pytorch)
        semi_ms, semi_note = None, ""
        if device.type == "cuda":
            for kwargs in ({}, {"use_cutlass": False}):
                try:
                    semi_ms = timer(lambda: torch._sparse_semi_structured_tile(wt, **kwargs))
                    semi_note = f"_sparse_semi_structured_tile({', '.join(f'{k}={v}' for k, v in kwargs.items())})"
                    break
                except Exception as err:  # recorded, not hidden: the row says why there is no ratio
                    semi_note = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
        else:
            semi_note = "GPU only"
        tbytes = 2 * nt + nt + 2 * 2 * nt
        full = f"mask + W + W^T ({DEFAULT_TRANSPOSE})"
        report.ratio("2 transposable24", full, wt.shape, ms_t, "plain PyTorch 90-pattern", plain_ms, 10.0,
                     nbytes=tbytes)
        report.rows[-1].update(config=cfg_t, all_configs=all_t, exact_tile_fraction=same_tiles)
        report.ratio("2 transposable24", full, wt.shape, ms_t, "semi_structured_tile", semi_ms, 1.0,
                     nbytes=tbytes, note=semi_note)
        report.ratio("2 transposable24", "mask only", wt.shape, ms_m, "semi_structured_tile", semi_ms, 1.0,
                     nbytes=2 * nt + nt, note=semi_note)
        report.rows[-1].update(config=cfg_m, all_configs=all_m)
        del mask, p, pt, ref_t

    # 3. soft threshold * beta --------------------------------------------------------------------------
    with section('3. soft threshold', failures):
        beta = torch.tensor(1.48, device=device)
        m24 = nm_mask(w, 2, 4)
        ref_s = (1.48 * soft_threshold(w.float(), m24)).to(bf16)
        _check("soft_threshold24", _ulp_ok(K.soft_threshold24(w, m24, beta), ref_s)
               and _ulp_ok(K.soft_threshold24(w, None, beta), ref_s))
        del ref_s
        cfgs = [{"block": b, "num_warps": nw} for b in (512, 1024, 2048) for nw in (4, 8)][: 1 if few else None]
        ms, cfg, allc = _sweep(timer, lambda **c: (lambda: K.soft_threshold24(w, m24, beta, **c)), cfgs)
        report.memory_bound("3 soft_threshold24", "given bool mask, beta", w.shape, 2 * n + n + 2 * n, ms, cfg, allc)
        ms, cfg, allc = _sweep(timer, lambda **c: (lambda: K.soft_threshold24(w, None, beta, **c)), cfgs)
        report.memory_bound("3 soft_threshold24", "mask in kernel, beta", w.shape, 2 * n + 2 * n, ms, cfg, allc)
        del m24

    # 4. MVUE 2:4 ----------------------------------------------------------------------------------------
    with section('4. MVUE 2:4', failures):
        dz = torch.randn(rows, cols, device=device, dtype=bf16)  # (tokens, out): groups along the tokens
        for dim, label in ((0, "dim 0 (tokens of dZ)"), (1, "last dim")):
            y = K.mvue24(dz, dim=dim, seed=1)
            xs, ys = (dz[:4096], y[:4096]) if dim == 0 else (dz[:256], y[:256])
            gx = xs.double().movedim(dim, -1).reshape(-1, 4)
            gy = ys.double().movedim(dim, -1).reshape(-1, 4)
            pr = mvue_probabilities(gx)
            expect = gx / pr.clamp_min(1e-300)  # kept entries are x / p
            keep = gy != 0
            _check(f"mvue24 {label}", bool(((keep.sum(1)) <= 2).all())
                   and bool(((gy - expect).abs()[keep] <= 1.6e-2 * expect.abs()[keep]).all()))
            del y, gx, gy, pr, expect
            wcfg = (4, 8) if dim == 1 else (2, 4)
            cfgs = [{"block": b, "num_warps": nw} for b in (512, 1024, 2048) for nw in wcfg][: 1 if few else None]
            ms, cfg, allc = _sweep(timer, lambda **c: (lambda: K.mvue24(dz, dim=dim, seed=3, **c)), cfgs)
            report.memory_bound("4 mvue24", label, dz.shape, 4 * n, ms, cfg, allc)
        del dz

    # 5. masked decay (fp32 gradient and weight, bool mask) ---------------------------------------------------
    with section('5. masked decay', failures):
        rows32 = rows // 2 if not args.smoke else rows  # same MiB in float32
        g = torch.randn(rows32, cols, device=device)
        w32 = torch.randn(rows32, cols, device=device)
        m32 = torch.rand(rows32, cols, device=device) < 0.5
        expected = g + 2e-4 * w32 * ~m32
        g_check = g.clone()
        K.masked_decay_(g_check, w32, m32, 2e-4)
        _check("masked_decay_", bool(torch.allclose(g_check, expected, rtol=2e-7, atol=1e-9)))
        del expected, g_check
        n32 = g.numel()
        cfgs = [{"block": b, "num_warps": nw} for b in (2048, 4096, 8192) for nw in (4, 8)][: 1 if few else None]
        ms, cfg, allc = _sweep(timer, lambda **c: (lambda: K.masked_decay_(g, w32, m32, 2e-4, **c)), cfgs)
        report.memory_bound("5 masked_decay_", "fp32 g, fp32 w, bool m", g.shape, 13 * n32, ms, cfg, allc)
        ref_ms = timer(lambda: g.add_(w32 * ~m32, alpha=2e-4))
        report.ratio("5 masked_decay_", "vs PyTorch g.add_(w * ~m)", g.shape, ms, "PyTorch", ref_ms, None)
        del g, w32, m32

    # 7. FP8 ------------------------------------------------------------------------------------------------
    with section('7. FP8', failures):
        x = torch.randn(rows, cols, device=device, dtype=bf16)
        for fmt in ("e4m3", "e5m2"):
            q, scale = K.quantize_fp8(x, fmt)
            q_ref, scale_ref = ref_quantize(x, fmt)
            _check(f"fp8 {fmt}", torch.equal(scale, scale_ref) and torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
                   and _ulp_ok(K.dequantize_fp8(q, scale, bf16), ref_dequantize(q_ref, scale_ref, bf16)))
        q, scale = K.quantize_fp8(x, "e4m3")
        inv = (448.0 / x.abs().amax().float())
        cfgs = [{"block": b, "num_warps": nw} for b in (2048, 4096, 8192) for nw in (4, 8)][: 1 if few else None]
        ms, cfg, allc = _sweep(timer, lambda **c: (lambda: K.quantize_fp8_with_scale(x, inv, "e4m3", **c)), cfgs)
        report.memory_bound("7 fp8", "cast with given scale + amax", x.shape, 2 * n + n, ms, cfg, allc)
        ms, cfg, allc = _sweep(timer, lambda **c: (lambda: K.amax(x, **c)), cfgs)
        report.memory_bound("7 fp8", "amax alone", x.shape, 2 * n, ms, cfg, allc)
        ms, cfg, allc = _sweep(timer, lambda **c: (lambda: K.dequantize_fp8(q, scale, bf16, **c)), cfgs)
        report.memory_bound("7 fp8", "dequantize to bf16", x.shape, n + 2 * n, ms, cfg, allc)
        ms, cfg, allc = _sweep(timer, lambda **c: (lambda: K.quantize_fp8(x, "e4m3", **c)), cfgs)
        report.memory_bound("7 fp8", "current amax (2 passes)", x.shape, 2 * n + n, ms, cfg, allc,
                            counts_for_target=False, note="x read twice: at most 3/5 of the copy rate")
        ref_ms = timer(lambda: ref_quantize(x, "e4m3"))
        report.ratio("7 fp8", "current amax vs PyTorch reference", x.shape, ms, "PyTorch", ref_ms, None)
        del x, q

    # 6. gated activations -----------------------------------------------------------------------------------
    with section('6. gated activations', failures):
        import torch.nn.functional as F

        tokens = rows // 2 if not args.smoke else 8
        ffn = cols
        act = {"swiglu": F.silu, "geglu": F.gelu}
        gcfgs = [{"block": b, "num_warps": nw} for b, nw in ((2048, 4), (4096, 8), (1024, 4))][: 1 if few else None]
        for layout, split_dim in (("row-major h (T, 2F)", -1), ("transposed h^T (2F, T)", 0)):
            shape = (tokens, 2 * ffn) if split_dim == -1 else (2 * ffn, tokens)
            h = torch.randn(shape, device=device, dtype=bf16)
            dout = torch.randn((tokens, ffn) if split_dim == -1 else (ffn, tokens), device=device, dtype=bf16)
            ne = dout.numel()
            for kind in ("swiglu", "geglu"):
                _check(f"gated {kind} {layout}",
                       bool(torch.allclose(K.gated_forward(h, kind, split_dim).float(),
                                           ref_gated_fwd(h, kind, split_dim).float(), rtol=2e-2, atol=1e-5))
                       and bool(torch.allclose(K.gated_backward(dout, h, kind, split_dim).float(),
                                               ref_gated_bwd(dout, h, kind, split_dim).float(), rtol=2e-2, atol=1e-5)))
                ms_f, cfg_f, all_f = _sweep(timer, lambda **c: (lambda: K.gated_forward(h, kind, split_dim, **c)), gcfgs)
                ms_b, cfg_b, all_b = _sweep(
                    timer, lambda **c: (lambda: K.gated_backward(dout, h, kind, split_dim, **c)), gcfgs)

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

    # 8. compress into cuSPARSELt's layout (row-major W, and W^T read as a transposed view) -------------------
    with section('8. compress24', failures):
        from ..references.cusparselt_layout import compress24_reference
        crow = rows - rows % 64 if rows >= 64 else 64
        w = torch.randn(crow, cols, device=device, dtype=bf16)
        w = w * nm_mask(w, 2, 4)
        wt = w.t().contiguous().t()  # the same matrix stored column-major: how W^T and MVUE(dZ)^T arrive
        _check("compress24", torch.equal(K.compress24(w).view(torch.uint8), compress24_reference(w).view(torch.uint8))
               and torch.equal(K.compress24(wt).view(torch.uint8), compress24_reference(w).view(torch.uint8)))
        n = w.numel()
        nbytes = 2 * n + n + n // 8  # read bf16, write half the values + 4 bits per group
        cfgs = [{"block_groups": b, "num_warps": nw} for b in (16, 32) for nw in (4, 8)][: 1 if few else None]
        for variant, a in (("row-major", w), ("transposed view (W^T, MVUE^T)", wt)):
            ms, cfg, allc = _sweep(timer, lambda a=a, **c: (lambda: K.compress24(a, **c)), cfgs)
            report.memory_bound("8 compress24", variant, w.shape, nbytes, ms, cfg, allc, counts_for_target=False,
                                note="added after the copy-rate target was set: not counted in it")
        if device.type == "cuda":
            ref_ms = timer(lambda: torch._cslt_compress(w))
            report.ratio("8 compress24", "row-major vs _cslt_compress", w.shape,
                         min(r["ms"] for r in report.rows if r["kernel"] == "8 compress24"), "_cslt_compress", ref_ms,
                         None)
        del w, wt

    # 9. flip count of two bool masks -----------------------------------------------------------------------------
    with section('9. count_flips', failures):
        prev = torch.rand(rows, cols, device=device) < 0.5
        new = prev ^ (torch.rand(rows, cols, device=device) < 0.01)
        _check("count_flips", int(K.count_flips(prev, new)) == int((prev != new).sum()))
        n = prev.numel()
        cfgs = [{"block": b, "num_warps": nw} for b in (4096, 8192, 16384) for nw in (4, 8)][: 1 if few else None]
        ms, cfg, allc = _sweep(timer, lambda **c: (lambda: K.count_flips(prev, new, **c)), cfgs)
        report.memory_bound("9 count_flips", "two bool masks", prev.shape, 2 * n, ms, cfg, allc, counts_for_target=False,
                            note="added after the copy-rate target was set: not counted in it")
        ref_ms = timer(lambda: (prev ^ new).sum())
        report.ratio("9 count_flips", "vs PyTorch (prev ^ new).sum()", prev.shape, ms, "PyTorch", ref_ms, None)
        del prev, new

    # 10. MVUE straight into the compressed layout, against mvue24 then compress24 ------------------------------
    with section('10. mvue_compress24', failures):
        ctok = rows - rows % 64 if rows >= 64 else 64
        dz = torch.randn(ctok, cols, device=device, dtype=bf16)
        fused_out = K.mvue_compress24(dz, seed=5)
        _check("mvue_compress24", torch.equal(fused_out.view(torch.uint8),
                                              K.compress24(K.mvue24(dz, dim=0, seed=5).t()).view(torch.uint8)))
        n = dz.numel()
        cfgs = [{"block_groups": b, "num_warps": nw} for b in (16, 32) for nw in (4, 8)][: 1 if few else None]
        ms, cfg, allc = _sweep(timer, lambda **c: (lambda: K.mvue_compress24(dz, seed=5, **c)), cfgs)
        report.memory_bound("10 mvue_compress24", "dZ (tokens, out) -> compressed MVUE(dZ)^T", dz.shape,
                            2 * n + n + n // 8, ms, cfg, allc, counts_for_target=False,
                            note="added after the copy-rate target was set: not counted in it")
        two_ms = timer(lambda: K.compress24(K.mvue24(dz, dim=0, seed=5).t()))
        report.ratio("10 mvue_compress24", "vs mvue24 then compress24", dz.shape, ms, "two kernels", two_ms, None)
        del dz, fused_out

    # 11. S(W) and S(W)^T compressed straight from W (fp32 master or bf16), against threshold + compress twice ----
    with section('11. prepare24', failures):
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
                _check(f"prepare24 {wname} {mname}", all(torch.equal(g.view(torch.uint8), e.view(torch.uint8))
                                                         for g, e in zip(got, want)))
                n = w.numel()
                nbytes = w.element_size() * n + n + 2 * (n + n // 8)  # W, mask; two compressed forms
                cfgs = [{"num_warps": nw} for nw in (4, 8)][: 1 if few else None]
                ms, cfg, allc = _sweep(timer, lambda w=w, b=b, **c: (
                    lambda: K.prepare24(w, mask, b, out_dtype=bf16, **c)), cfgs)
                report.memory_bound("11 prepare24", f"{wname} W, {mname} -> S(W), S(W)^T compressed", w.shape,
                                    nbytes, ms, cfg, allc, counts_for_target=False,
                                    note="added after the copy-rate target was set: not counted in it")
                two_ms = timer(lambda w=w, b=b: unfused(w, b))
                report.ratio("11 prepare24", f"{wname} {mname} vs threshold then compress24 twice", w.shape, ms,
                             "three kernels", two_ms, None)
        del w32, mask

    sync(device)
    payload = {"smoke": bool(args.smoke), "main_tensor_mib": (rows * cols * 2) / MIB, "summary": report.summary(),
               "failed_checks": failures, "rows": report.rows}
    path = write_result(args.name, payload, directory=Path(args.out_dir) if args.out_dir else None)
    print(f"wrote {path}")
    if args.smoke:
        print("(smoke run on the CPU interpreter: the numbers below are not measurements of the kernels)")
    if failures:
        print(f"FAILED checks (not timed): {failures}")
    report.print()
    return 1 if failures else 0
