"""``python -m benchmarks compile``: torch.compile'd dense and 2:4 training steps beside eager (GPU).

One run, one GPU, bf16, everything side by side; each time is the median of ``--reps`` calls after
``--warmup`` calls (the first call holds the compilation: its wall time is recorded as ``first_call_s``),
each call between two CUDA events.

1. FFN block y = W2 gelu(W1 x), W1 (4d, d), W2 (d, 4d), bf16 weights and inputs, x (tokens, d). One
   step: grads cleared, forward, ``y.backward(dy)``, then ``advance_step`` (what ``attach_optimizer``'s
   post-hook does after ``optimizer.step()``). FLOPs: 3 products x 2 linears x 2 tokens d 4d.
2. The lab GPT's training step (``lab.model.GPT``, bf16 autocast, fp32 master weights, fused AdamW and
   ``attach_optimizer``; attention dense, FFN linears 2:4). FLOPs: ``flops.gpt_config_flops_per_token``.

Variants: ``dense_eager``, ``dense_compiled``, ``sparse_eager``, ``sparse_compiled``. The 2:4 method is
S-STE with an MVUE weight gradient and a transposable mask recomputed every step, on the "cusparselt"
backend (all three products sparse; what ``python -m benchmarks ffn`` calls ours_mvue). ``torch.compile(module)`` with
the default Inductor backend; each 2:4 layer is one ``sparsity_lab::sparse_linear`` custom op in the graph
(``custom_ops.py``). Every variant reports ``speedup_vs_fastest_dense`` (fastest dense ms / its ms) and
the fastest dense's achieved TFLOP/s is written beside it; ``compiled_vs_eager`` is eager ms / compiled ms
of the same model.

``--smoke``: the plumbing on the CPU, tiny shapes, backend "torch", the ``aot_eager`` compiler (no
Inductor build); its numbers are not figures.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch
from torch import nn

from benchmarks.timing import bench_device, result_path
from sparsity_lab.lab.arguments import backend_name, output_file, positive_int

VARIANTS = ("dense_eager", "dense_compiled", "sparse_eager", "sparse_compiled")
FULL = dict(ffn=dict(tokens=16384, d_model=4096), gpt=dict(n_layer=2, n_head=32, d_model=4096, context=1024, batch=16))
SMOKE = dict(ffn=dict(tokens=64, d_model=32), gpt=dict(n_layer=1, n_head=2, d_model=32, context=16, batch=2))


def median_ms(fn, warmup: int, reps: int, device: torch.device) -> tuple[float, float]:
    """(median ms of fn over reps calls, wall seconds of the first call) after warmup calls in all."""
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    first_s = time.perf_counter() - start
    for _ in range(max(0, warmup - 1)):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), first_s
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for ev_start, ev_end in events:
        ev_start.record()
        fn()
        ev_end.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in events), first_s


def method(backend: str):
    import sparsity_lab as sl

    return sl.SSTE(mvue=True, transposable=True, backend=backend)


def ratios(variants: dict, flops: float, unit_count: int, unit: str) -> dict:
    """Fill speed-ups against the fastest dense variant; returns the headline (fastest dense, its TFLOP/s)."""
    from sparsity_lab.flops import tflops

    dense = {k: v["ms"] for k, v in variants.items() if k.startswith("dense") and v.get("ms")}
    fastest = min(dense, key=dense.get) if dense else None
    for name, rec in variants.items():
        ms = rec.get("ms")
        rec[f"{unit}_per_s"] = unit_count / ms * 1e3 if ms else None
        rec["speedup_vs_fastest_dense"] = dense[fastest] / ms if fastest and ms else None
        if name.startswith("dense") and ms:
            rec["tflops"] = tflops(flops, ms)
    for kind in ("dense", "sparse"):
        eager, compiled = variants.get(f"{kind}_eager", {}).get("ms"), variants.get(f"{kind}_compiled", {}).get("ms")
        variants.get(f"{kind}_compiled", {})["compiled_vs_eager"] = eager / compiled if eager and compiled else None
    return {"fastest_dense": fastest, "fastest_dense_tflops": variants[fastest]["tflops"] if fastest else None}


def _attempt(errors: dict, name: str, fn):
    try:
        return fn()
    except Exception as err:  # a failed variant is recorded and the run goes on
        errors[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"
        print(f"  {name}: ERROR {errors[name]}", flush=True)
        return {"ms": None, "error": errors[name]}
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def ffn_variant(variant: str, shape: dict, device, backend: str, compiler: str, warmup: int, reps: int) -> dict:
    import sparsity_lab as sl

    d, tokens = shape["d_model"], shape["tokens"]
    torch.manual_seed(0)
    ffn = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.GELU(), nn.Linear(4 * d, d, bias=False))
    ffn = ffn.to(device=device, dtype=torch.bfloat16)
    sparse = variant.startswith("sparse")
    if sparse:
        sl.sparsify(ffn, method(backend), select="all")
        for _, layer in sl.sparse_layers(ffn):
            layer.attached_optimizer = True  # step() below advances the counters as the post-hook would
    run = torch.compile(ffn, backend=compiler) if variant.endswith("compiled") else ffn
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(tokens, d, device=device, dtype=torch.bfloat16, generator=gen)
    dy = torch.randn(tokens, d, device=device, dtype=torch.bfloat16, generator=gen)

    def step():
        for p in ffn.parameters():
            p.grad = None
        run(x).backward(dy)
        if sparse:
            sl.training_hooks.advance_step(ffn)  # the post-hook's work: the next call refreshes the mask
    ms, first_s = median_ms(step, warmup, reps, device)
    return {"ms": ms, "first_call_s": first_s}


def gpt_variant(variant: str, g: dict, device, backend: str, compiler: str, warmup: int, reps: int) -> dict:
    import sparsity_lab as sl
    from sparsity_lab.lab.model import GPT, GPTConfig

    cfg = GPTConfig(vocab_size=256, context=g["context"], n_layer=g["n_layer"], n_head=g["n_head"], d_model=g["d_model"])
    gen = torch.Generator(device=device).manual_seed(2)
    idx = torch.randint(0, 256, (g["batch"], g["context"]), device=device, generator=gen)
    targets = torch.randint(0, 256, (g["batch"], g["context"]), device=device, generator=gen)
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    sparse = variant.startswith("sparse")
    if sparse:
        sl.sparsify(model, method(backend))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda" or None)
    if sparse:
        sl.attach_optimizer(model, opt)
    run = torch.compile(model, backend=compiler) if variant.endswith("compiled") else model
    losses = []

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            _, loss = run(idx, targets)
        loss.backward()
        opt.step()
        losses[:] = [loss.detach()]
    ms, first_s = median_ms(step, warmup, reps, device)
    return {"ms": ms, "first_call_s": first_s, "loss_after": float(losses[0])}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true", help="CPU plumbing check: tiny shapes, backend torch, "
                        "aot_eager compiler (numbers mean nothing)")
    parser.add_argument("--warmup", type=positive_int, default=None, help="calls before timing, the compiling one "
                        "included (default 5; 1 with --smoke)")
    parser.add_argument("--reps", type=positive_int, default=None, help="timed calls (default 20; 2 with --smoke)")
    parser.add_argument("--backend", type=backend_name, default=None,
                        help="2:4 backend (default cusparselt; torch with --smoke)")
    parser.add_argument("--no-gpt", action="store_true", help="skip the GPT step")
    parser.add_argument("--out", type=output_file, default=None, help="JSON path (default results/compile_h100.json; "
                        "compile_smoke.json in the current folder with --smoke)")


def run(args) -> int:
    from sparsity_lab.provenance import write_result

    smoke = args.smoke
    device = bench_device(smoke, "python -m benchmarks compile")
    if device is None:
        return 2
    sizes = SMOKE if smoke else FULL
    warmup, reps = args.warmup or (1 if smoke else 5), args.reps or (2 if smoke else 20)
    backend = args.backend or ("torch" if smoke else "cusparselt")
    compiler = "aot_eager" if smoke else "inductor"
    errors: dict = {}
    started = time.perf_counter()
    payload = {"smoke": smoke, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "dtype": "bfloat16", "backend": backend, "compiler": compiler, "method": method(backend).describe(),
               "warmup": warmup, "reps": reps}

    out = result_path(args.out, smoke, "compile")

    def save():  # after each section: a run stopped later keeps what it measured
        payload["errors"] = errors
        payload["elapsed_s"] = time.perf_counter() - started
        return write_result(out.stem, payload, directory=out.parent)

    s = sizes["ffn"]
    d, tokens = s["d_model"], s["tokens"]
    print(f"FFN block: {tokens} tokens x d_model {d} (hidden {4 * d}), bf16 ...", flush=True)
    ffn = {}
    for v in VARIANTS:
        ffn[v] = _attempt(errors, f"ffn {v}", lambda v=v: ffn_variant(v, s, device, backend, compiler, warmup, reps))
        print(f"  {v:16s} {ffn[v].get('ms')} ms (first call {ffn[v].get('first_call_s')} s)", flush=True)
    headline = ratios(ffn, 3 * 2 * 2 * tokens * d * 4 * d, tokens, "tokens")
    payload["ffn"] = {"shape": dict(s, hidden=4 * d), "variants": ffn, **headline}
    save()

    if not args.no_gpt:
        from sparsity_lab.flops import gpt_config_flops_per_token
        from sparsity_lab.lab.model import GPTConfig

        g = sizes["gpt"]
        cfg = GPTConfig(vocab_size=256, context=g["context"], n_layer=g["n_layer"], n_head=g["n_head"],
                        d_model=g["d_model"])
        step_tokens = g["batch"] * g["context"]
        print(f"GPT step: {g['n_layer']} layers, d_model {g['d_model']}, {step_tokens} tokens ...", flush=True)
        gpt = {}
        for v in VARIANTS:
            gpt[v] = _attempt(errors, f"gpt {v}", lambda v=v: gpt_variant(v, g, device, backend, compiler, warmup, reps))
            print(f"  {v:16s} {gpt[v].get('ms')} ms (first call {gpt[v].get('first_call_s')} s)", flush=True)
        flops = sum(gpt_config_flops_per_token(cfg).values()) * step_tokens
        headline = ratios(gpt, flops, step_tokens, "tokens")
        payload["gpt_step"] = {"config": dict(g, vocab_size=256, hidden=cfg.hidden), "tokens_per_step": step_tokens,
                               "variants": gpt, **headline}

    path = save()
    for part in ("ffn", "gpt_step"):
        if part in payload:
            p = payload[part]
            rows = ", ".join(f"{k} {r['speedup_vs_fastest_dense']:.3f}x" for k, r in p["variants"].items()
                             if r.get("speedup_vs_fastest_dense"))
            print(f"{part}: vs fastest dense ({p['fastest_dense']}, {p['fastest_dense_tflops'] or 0:.0f} TFLOP/s): {rows}")
    print(f"wrote {path}")
    return 1 if errors else 0
