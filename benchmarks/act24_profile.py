"""Where an FFN step's GPU time goes, per kernel, for benchmarks act24's variants (``python -m
benchmarks.act24_profile``; needs a CUDA GPU).

16384 tokens, d_model 4096, hidden 16384, bf16, eager steps (dx included) under ``torch.profiler``: the
kernels of five steps after three warm-up steps, per step. The variants run one after the other, so the
GPU's clocks (power cap) differ between them: compare the kernels within a variant, and across variants
only kernel by kernel with that in mind; benchmarks act24 gives the timed ratios.
"""
from __future__ import annotations

import torch

from benchmarks.act24_speed import Settings, build, step_fns
from benchmarks.kernel_profile import kernel_lines, kernel_profile

VARIANTS = ("dense_relu2", "weights24_mvue", "act24_w24_mvue", "act24")


def main() -> int:
    if not torch.cuda.is_available():
        raise SystemExit("act24_profile needs a CUDA GPU")
    s = Settings(smoke=False, device=torch.device("cuda"), tokens=16384, d_model=4096, rounds=1, graph=False)
    x = torch.randn(s.tokens, s.d_model, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(s.tokens, s.d_model, device="cuda", dtype=torch.bfloat16)
    for variant in VARIANTS:
        model = build(variant, s)
        fn = step_fns(model, x, dy, s)["eager"]
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        total, kernels = kernel_profile(fn)
        print(f"== {variant}: {total:.2f} ms of kernels per step")
        print("\n".join(kernel_lines(kernels, top=12, width=95)))
        del model, fn
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
