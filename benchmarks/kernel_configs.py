"""Launch configurations of the activation and FP8 kernels, timed on the GPU: which defaults to ship.

``python -m benchmarks.kernel_configs --out-dir results/`` writes
``act24_kernels_sweep_h100.json``. At the FFN shapes of the recorded benchmarks (activations 16384 x 16384
bf16, weights 16384 x 4096 fp32) it times every block size and warp count of kernel 12 (``act24``), 13
(``act24_backward``), 18 (``prepare24_fp8``) and 19 (``mvue_compress24_fp8``), after checking that each
configuration writes the bytes of the default one, with ``triton.testing.do_bench`` medians. A copy of the
activation tensor is timed in the same run as the memory-bandwidth reference (it moves 4 bytes per element:
read 2, write 2).

``--sections step`` times instead the 2:4 work of the lab GPT's bf16 step (``benchmarks step-profile``):
kernel 10 (``mvue_compress24``, dZ of 8192 tokens x 16384, bf16), 11 (``prepare24``) and 21 (``refresh24``,
the mask refresh with both operands; and its E4M3 form, the FP8 step's) on both bf16 FFN weights (16384 x 4096
and 4096 x 16384) with S-STE's scale, with a copy of each input as its bandwidth reference.

``--sections optimizer`` times kernel 26 (``adamw_master_prepare24_``: a 2:4 weight's AdamW step writing its next
compressed operands) at 4 to 32 warps beside kernel 20 followed by kernel 11, on both FFN weights.

``--sections gelu`` times the baseline ``benchmarks.baselines.gelu_mvue_compress24`` (GELU's backward and kernel 10's
operand of its result, one pass; not shipped) at every block size and warp count beside the pair it would replace
(PyTorch's GELU backward, then kernel 10) and each part alone, at the lab GPT's up projection (8192 tokens x 16384,
bf16).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

BLOCKS = (8, 16, 32)
WARPS = (2, 4, 8)


def _bytes(t: torch.Tensor | None):
    return None if t is None else t.contiguous().reshape(-1).view(torch.uint8)


def _same(a, b) -> bool:
    return all((x is None and y is None) or torch.equal(_bytes(x), _bytes(y)) for x, y in zip(a, b))


def sweep(kernel, configs, reference) -> dict:
    """{config label: median ms, or the error text}; a config whose output differs from ``reference``'s
    is reported as such and not timed."""
    from triton.testing import do_bench
    out = {}
    for label, kwargs in configs:
        try:
            result = kernel(**kwargs)
            result = result if isinstance(result, tuple) else (result,)
            if not _same(result[:2], reference[:2]):
                out[label] = "output differs from the default configuration's"
                continue
            out[label] = do_bench(lambda: kernel(**kwargs), warmup=25, rep=200)
        except Exception as e:  # a configuration the compiler refuses (registers, shared memory)
            out[label] = f"{type(e).__name__}: {str(e)[:200]}"
    return out


def measure_step_work(tokens: int = 8192, hidden: int = 16384, d_model: int = 4096) -> dict:
    """Kernels 10, 11 and 21 at the lab GPT step's FFN shapes, every warp count (and kernel 10's block sizes);
    the weight kernels at both FFN weights (up: hidden x d_model, down: d_model x hidden)."""
    from triton.testing import do_bench
    from sparsity_lab import kernels as k
    gen = torch.Generator(device="cuda").manual_seed(0)
    dz = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    beta = torch.tensor(0.9, device="cuda")
    warps = [(f"num_warps={n}", {"num_warps": n}) for n in (2, 4, 8, 16)]
    out = {"shapes": {"dz": [tokens, hidden], "weights": [[hidden, d_model], [d_model, hidden]]},
           "copy_dz_ms": do_bench(lambda: dz.clone(), warmup=25, rep=200),
           "mvue_compress24": sweep(lambda **c: (k.mvue_compress24(dz, 1, **c),),
                                    [(f"block_groups={b}, num_warps={n}", {"block_groups": b, "num_warps": n})
                                     for b in (16, 32) for n in (2, 4, 8)], (k.mvue_compress24(dz, 1),))}
    for name, shape in (("up", (hidden, d_model)), ("down", (d_model, hidden))):
        w = torch.randn(*shape, device="cuda", generator=gen).to(torch.bfloat16)
        mask = k.transposable_mask24(w, pruned=False)[0]

        def refresh(_w=w, _mask=mask, **c):  # the mask is rewritten in place: the same one after the first call
            return k.refresh24(_w, _mask, beta, **c)[1:]
        out[f"copy_weight_{name}_ms"] = do_bench(lambda: w.clone(), warmup=25, rep=200)
        out[f"prepare24_{name}"] = sweep(lambda _w=w, _m=mask, **c: k.prepare24(_w, _m, beta, **c), warps,
                                         k.prepare24(w, mask, beta))
        out[f"refresh24_{name}"] = sweep(refresh, warps, refresh())
        inv_w = (448.0 / w.float().abs().amax()).reshape(1)

        def refresh_fp8(_w=w, _mask=mask.clone(), **c):  # the FP8 step's refresh: E4M3 forms with a given scale
            return k.refresh24_fp8(_w, _mask, beta, inv_w, **c)[1:3]
        out[f"refresh24_fp8_{name}"] = sweep(refresh_fp8, warps, refresh_fp8())
    out["defaults"] = {"mvue_compress24": f"block_groups 32, num_warps {k.mvue_compress24.__defaults__[-1]}",
                       "prepare24": f"num_warps {k.prepare24.__defaults__[-1]}",
                       "refresh24": f"num_warps {k.refresh24.__defaults__[-1]}",
                       "refresh24_fp8": f"num_warps {k.refresh24_fp8.__defaults__[-1]}"}
    return out


def measure_optimizer_pass(hidden: int = 16384, d_model: int = 4096) -> dict:
    """Kernel 26 (a 2:4 weight's AdamW step writing its next operands) at every warp count, beside the pair it
    replaces (kernel 20, then kernel 11 on the weight written), on both bf16 FFN weights with S-STE's scale. Each
    configuration's bytes (master, moments, W, both operands) after one step from the same state are checked
    against the pair's; the timed calls then keep stepping that state (the lab's AdamW settings)."""
    from triton.testing import do_bench
    from sparsity_lab import kernels as k
    gen = torch.Generator(device="cuda").manual_seed(0)
    beta = torch.tensor(0.9, device="cuda")
    hyper = dict(step=10, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    out = {"shapes": {"weights": [[hidden, d_model], [d_model, hidden]]}}
    for name, shape in (("up", (hidden, d_model)), ("down", (d_model, hidden))):
        master = torch.randn(*shape, device="cuda", generator=gen)
        start = {"low": master.to(torch.bfloat16), "master": master, "m": torch.zeros_like(master),
                 "v": torch.zeros_like(master).add_(1e-4),
                 "grad": torch.randn(*shape, device="cuda", generator=gen).to(torch.bfloat16)}
        mask = k.transposable_mask24(start["low"], pruned=False)[0]

        def pair(s):
            k.adamw_master_([s["low"]], [s["grad"]], [s["master"]], [s["m"]], [s["v"]], **hyper)
            return (s["master"], s["m"], s["v"], s["low"], *k.prepare24(s["low"], mask, beta))

        def fused(s, **c):
            forms = k.adamw_master_prepare24_(s["low"], s["grad"], s["master"], s["m"], s["v"], mask, beta, **hyper,
                                              **c)
            return (s["master"], s["m"], s["v"], s["low"], *forms)

        def fresh():
            return {key: t.clone() for key, t in start.items()}
        expected = pair(fresh())
        state = fresh()
        rows = {"kernels 20 + 11": do_bench(lambda: pair(state), warmup=25, rep=200)}
        for n in (4, 8, 16, 32):
            got = fused(fresh(), num_warps=n)
            # the masters may differ in the last bits where the compilers contract a * b + c differently: the
            # operands are compared as kernel 11's of the W written here, the float state to a float32 rounding
            same_forms = _same(got[4:], k.prepare24(got[3], mask, beta))
            close = all(torch.allclose(a, b, rtol=1e-6, atol=1e-9) for a, b in zip(got[:3], expected[:3]))
            if not (same_forms and close):
                rows[f"num_warps={n}"] = "output differs from kernels 20 + 11"
                continue
            state = fresh()
            rows[f"num_warps={n}"] = do_bench(lambda n=n: fused(state, num_warps=n), warmup=25, rep=200)
        out[f"adamw_prepare24_{name}"] = rows
        out[f"copy_master_{name}_ms"] = do_bench(lambda: master.clone(), warmup=25, rep=200)
    out["defaults"] = {"adamw_master_prepare24": f"num_warps {k.adamw_master_prepare24_.__kwdefaults__['num_warps']}"}
    return out


def measure_gelu_mvue(tokens: int = 8192, hidden: int = 16384) -> dict:
    """The GELU + MVUE baseline at every block size and warp count beside PyTorch's GELU backward, then kernel 10. A
    configuration's dZ must equal the default configuration's and its operand must be kernel 10's of that dZ."""
    from triton.testing import do_bench
    from benchmarks.baselines.gelu_mvue_compress24 import gelu_backward_mvue_compress24
    from sparsity_lab import kernels as k
    gen = torch.Generator(device="cuda").manual_seed(0)
    dh = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    z = (3 * torch.randn(tokens, hidden, device="cuda", generator=gen)).to(torch.bfloat16)
    seed = torch.tensor(7, dtype=torch.int64, device="cuda")
    dz_torch = torch.ops.aten.gelu_backward(dh, z)
    fused = gelu_backward_mvue_compress24(dh, z, seed)
    out = {"shapes": {"dz": [tokens, hidden]},
           "copy_dz_ms": do_bench(lambda: dh.clone(), warmup=25, rep=200),
           "parts_ms": {"torch gelu_backward": do_bench(lambda: torch.ops.aten.gelu_backward(dh, z), warmup=25,
                                                         rep=200),
                        "kernel 10": do_bench(lambda: k.mvue_compress24(dz_torch, seed), warmup=25, rep=200),
                        "torch gelu_backward, then kernel 10": do_bench(
                            lambda: k.mvue_compress24(torch.ops.aten.gelu_backward(dh, z), seed), warmup=25, rep=200)},
           "operand_is_kernel_10s": _same((fused[1],), (k.mvue_compress24(fused[0], seed),)),
           "dz_entries_unlike_torch": int((fused[0] != dz_torch).sum()),
           "gelu_mvue_compress24": sweep(lambda **c: gelu_backward_mvue_compress24(dh, z, seed, **c),
                                         [(f"block_groups={b}, num_warps={n}", {"block_groups": b, "num_warps": n})
                                          for b in (8, 16, 32) for n in (4, 8, 16)], fused)}
    out["defaults"] = {"gelu_mvue_compress24": "block_groups 32, num_warps "
                       f"{gelu_backward_mvue_compress24.__defaults__[-1]}"}
    return out


def measure(tokens: int = 16384, hidden: int = 16384, d_model: int = 4096) -> dict:
    from triton.testing import do_bench
    from sparsity_lab import kernels as k
    gen = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    da = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(hidden, d_model, device="cuda", generator=gen)
    mask = k.transposable_mask24(w, pruned=False)[0]
    inv = torch.tensor(10.0, device="cuda")
    grid = [(f"block_groups={b}, num_warps={n}", {"block_groups": b, "num_warps": n}) for b in BLOCKS for n in WARPS]
    out = {"shapes": {"activation": [tokens, hidden], "weight": [hidden, d_model]},
           "copy_ms": do_bench(lambda: h.clone(), warmup=25, rep=200)}
    out["act24"] = sweep(lambda **c: k.act24(h, **c), grid, k.act24(h))
    out["act24_backward"] = sweep(lambda **c: k.act24_backward(h, da, **c), grid, k.act24_backward(h, da))
    out["act24_backward_no_dense"] = sweep(lambda **c: k.act24_backward(h, da, dense=False, **c), grid,
                                           k.act24_backward(h, da, dense=False))
    fp8_grid = [(f"block_groups={b}, num_warps={n}", {"block_groups": b, "num_warps": n}) for b in (16, 32)
                for n in (4, 8)]
    out["mvue_compress24_fp8"] = sweep(lambda **c: k.mvue_compress24_fp8(h, 1, inv, **c), fp8_grid,
                                       k.mvue_compress24_fp8(h, 1, inv))
    out["prepare24_fp8"] = sweep(lambda **c: k.prepare24_fp8(w, mask, None, inv, **c),
                                 [(f"num_warps={n}", {"num_warps": n}) for n in WARPS], k.prepare24_fp8(w, mask, None, inv))
    out["defaults"] = {
        "act24": k.act24.__defaults__, "act24_backward": "num_warps 8 for 32 groups per program, else 4",
        "mvue_compress24_fp8": "block_groups 16, num_warps 4", "prepare24_fp8": "num_warps 4"}
    return out


def main(argv=None) -> int:
    from sparsity_lab.provenance import write_result
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out-dir", default="results")
    p.add_argument("--name", default=None, help="JSON name (default act24_kernels_sweep_h100; "
                   "step_kernels_sweep_<gpu> with --sections step)")
    p.add_argument("--sections", choices=("act24", "step", "optimizer", "gelu"), default="act24",
                   help="act24: the activation and FP8 kernels (default); step: the bf16 step's 2:4 work; "
                        "optimizer: kernel 26 beside kernels 20 + 11; gelu: the GELU + MVUE baseline beside GELU's "
                        "backward + kernel 10")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("kernel_configs times kernels on a CUDA GPU; none is available here")
    result = {"act24": measure, "step": measure_step_work, "optimizer": measure_optimizer_pass,
              "gelu": measure_gelu_mvue}[args.sections]()
    for kernel, rows in result.items():
        if isinstance(rows, dict) and kernel not in ("shapes", "defaults"):
            for label, ms in rows.items():
                print(f"{kernel:<26} {label:<32} {ms if isinstance(ms, str) else f'{ms:.3f} ms'}")
    for key, value in result.items():
        if key.startswith("copy"):
            print(f"{key}: {value:.3f} ms")
    if args.name is None:
        from benchmarks.step_profile import gpu_tag
        gpu = gpu_tag(torch.cuda.get_device_name())
        args.name = {"act24": "act24_kernels_sweep_h100", "step": f"step_kernels_sweep_{gpu}",
                     "optimizer": f"optimizer_kernels_sweep_{gpu}", "gelu": f"gelu_kernels_sweep_{gpu}"}[args.sections]
    print("wrote", write_result(args.name, result, directory=Path(args.out_dir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
