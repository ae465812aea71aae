"""Where the GPU time of one FFN training step goes: torch.profiler's kernel table per variant.

``python -m benchmarks.ffn_profile --tokens 16384 --d-model 4096`` (GPU). Uses the
FFN and the step of ``python -m benchmarks ffn`` (``benchmarks/ffn/``) (same model, same step), profiles 3 steps after warm-up and
prints the kernels sorted by total CUDA time, so a slow 2:4 step can be traced to its kernels.

``--host``: where the *host* time goes instead (small shapes, eager: the GPU waits for Python):
cProfile over 20 steps, the functions sorted by their own time, and the host ms per step.
"""
from __future__ import annotations

import argparse

import torch


def main(argv=None) -> int:
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.ffn.measure import _inputs
    from benchmarks.ffn.settings import Settings
    from benchmarks.ffn.variants import build_ffn, train_step

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--d-model", type=int, default=4096)
    p.add_argument("--variants", default="dense,ours_fixed_mask,ours_mvue")
    p.add_argument("--rows", type=int, default=22)
    p.add_argument("--host", action="store_true", help="cProfile the host side instead of the kernels")
    args = p.parse_args(argv)
    s = Settings(smoke=False, device=torch.device("cuda"), dtype=torch.bfloat16, tokens=[args.tokens],
                 d_models=[args.d_model], target=(args.tokens, args.d_model), reps=1, warmup=1, budget_s=1.0,
                 graph=False, gpt=None, backends={"cusparselt": "cusparselt", "cusparselt_auto": "cusparselt_auto",
                                                     "dense_products": "triton"})
    for variant in args.variants.split(","):
        model = build_ffn(variant, args.d_model, s)
        x, dy = _inputs(args.tokens, args.d_model, s)
        step = train_step(model, x, dy)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        if args.host:
            _host_profile(variant, step, args)
            del model, x, dy, step
            continue
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        print(f"=== {variant}: {args.tokens} tokens x d_model {args.d_model}, 3 steps", flush=True)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=70),
              flush=True)
        del model, x, dy, step
        torch.cuda.empty_cache()
    return 0


def _host_profile(variant: str, step, args, steps: int = 20) -> None:
    import cProfile
    import io
    import pstats
    import time

    start = time.perf_counter()
    for _ in range(steps):
        step()
    host_ms = (time.perf_counter() - start) * 1e3 / steps  # launches only: no sync inside the loop
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.rows)
    print(f"=== {variant}: {args.tokens} tokens x d_model {args.d_model}: host {host_ms:.3f} ms per step "
          f"(no profiler); cProfile over {steps} steps, by own time:", flush=True)
    print(out.getvalue(), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
