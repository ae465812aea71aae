"""Launch configurations of the activation and FP8 kernels, timed on the GPU: which defaults to ship.

``python -m benchmarks.kernel_configs --out-dir results/`` writes
``act24_kernels_sweep_h100.json``. At the FFN shapes of the recorded benchmarks (activations 16384 x 16384
bf16, weights 16384 x 4096 fp32) it times every block size and warp count of kernel 12 (``act24``), 13
(``act24_backward``), 18 (``prepare24_fp8``) and 19 (``mvue_compress24_fp8``), after checking that each
configuration writes the bytes of the default one, with ``triton.testing.do_bench`` medians. A copy of the
activation tensor is timed in the same run as the memory-bandwidth reference (it moves 4 bytes per element:
read 2, write 2).
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
    p.add_argument("--name", default="act24_kernels_sweep_h100")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("kernel_configs times kernels on a CUDA GPU; none is available here")
    result = measure()
    for kernel, rows in result.items():
        if isinstance(rows, dict) and kernel not in ("shapes", "defaults"):
            for label, ms in rows.items():
                print(f"{kernel:<26} {label:<32} {ms if isinstance(ms, str) else f'{ms:.3f} ms'}")
    print(f"copy of the activation: {result['copy_ms']:.3f} ms")
    print("wrote", write_result(args.name, result, directory=Path(args.out_dir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
