"""Where an eager FFN step's time goes at a small shape, for dense, S-STE + MVUE with dense products, through
``cusparselt_auto`` and on ``cusparselt`` (``python -m benchmarks.ffn.profile_small``; a CUDA GPU).

Per variant: the wall time of one eager step (median of 20, synchronized), the GPU kernels' time per step under
``torch.profiler`` (5 steps after the warm-up, in which the auto policy decides), the top kernels, and for
auto its decisions (which products it runs sparse). Wall time well above the kernels' time means the step
is bound by the host's launches, not by the GPU.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.kernel_profile import kernel_lines, kernel_profile
from benchmarks.ffn.settings import Settings
from benchmarks.ffn.variants import build_ffn, sparse_backend, train_step
from sparsity_lab.backends.report import measures_products

VARIANTS = ("dense", "ours_mvue_dense_products", "auto", "ours_mvue")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--d-model", type=int, default=1024)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_small needs a CUDA GPU")
    s = Settings(smoke=False, device=torch.device("cuda"), dtype=torch.bfloat16, tokens=[args.tokens],
                 d_models=[args.d_model], target=(args.tokens, args.d_model), reps=5, warmup=5, budget_s=60.0,
                 graph=False, gpt=None,
                 backends={"cusparselt": "cusparselt", "cusparselt_auto": "cusparselt_auto", "dense_products": "triton"})
    x = torch.randn(args.tokens, args.d_model, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(args.tokens, args.d_model, device="cuda", dtype=torch.bfloat16)
    print(f"FFN {args.tokens} tokens x d_model {args.d_model} (hidden {4 * args.d_model}), bf16, eager steps")
    for variant in VARIANTS:
        model = build_ffn(variant, args.d_model, s)
        step = train_step(model, x, dy)
        for _ in range(8):  # warm-up: compiles, algorithm searches, the auto policy's measurements
            step()
        torch.cuda.synchronize()
        walls = []
        for _ in range(20):
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t0) * 1e3)
        total, kernels = kernel_profile(step)
        print(f"== {variant}: wall {statistics.median(walls):.3f} ms per step, kernels {total:.3f} ms per step")
        print("\n".join(kernel_lines(kernels, top=8, width=90)))
        backend = sparse_backend(model)
        if backend is not None and measures_products(backend):
            for d in backend.summary().get("decisions", []):
                print(f"   auto: {d}"[:200])
        del model, step
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
