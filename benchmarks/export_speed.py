"""``python -m benchmarks export``: the exported lab GPT's prefill throughput and decode latency, 2:4 vs dense (GPU).

The lab GPT (``lab.model.GPT``, bf16 weights, eval mode), once dense and once made 2:4 by ``sparsify``
(STE, mask from the initial weights: speed does not depend on the values) and ``sparsity_lab.export``ed
(each FFN weight compressed once for cuSPARSELt; attention, embeddings and head dense). Same weights
for both up to the mask.

    prefill  ``prefill(model, idx)`` of batch x context tokens under no_grad: tokens/s, and the dense
             model's achieved TFLOP/s (forward FLOPs = a third of ``flops.gpt_config_flops_per_token``)
    decode   one token per ``decode_step`` after a prompt of ``--prompt`` tokens, with the key/value
             cache of ``lab/decode.py``: the median ms per token over ``--decode-tokens`` steps, for each
             batch size in ``--decode-batches``

``speedup_vs_dense`` is dense ms / 2:4 ms (dense is the only dense variant here, hence the fastest).
Eager PyTorch, no CUDA graphs: at batch 1 a decode step is a few hundred small kernels, and host time
can hide what the products save.

``--smoke``: the plumbing on the CPU (tiny shapes, the dense CPU fallback of ``export``); its numbers
are not figures.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from benchmarks.timing import bench_device, result_path
from benchmarks.compile_speed import median_ms
from sparsity_lab.lab.arguments import output_file, positive_int

FULL = dict(n_layer=2, n_head=32, d_model=4096, context=1024, batch=16, prompt=128, decode_tokens=64,
            decode_batches=(1, 16))
SMOKE = dict(n_layer=1, n_head=2, d_model=32, context=16, batch=2, prompt=4, decode_tokens=3, decode_batches=(1, 2))


def build(variant: str, cfg, device):
    """The eval-mode bf16 model of one variant: "dense" (the GPT) or "sparse_exported"."""
    import sparsity_lab as sl
    from sparsity_lab.export import ExportFallbackWarning
    from sparsity_lab.lab.model import GPT

    torch.manual_seed(0)
    model = GPT(cfg).to(device=device, dtype=torch.bfloat16).eval()
    report = None
    if variant == "sparse_exported":
        sl.sparsify(model, sl.STE())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ExportFallbackWarning)
            model = sl.export(model)
        report = {"kernels": sorted({r["became"] for r in model.export_report}),
                  "fallback": [str(w.message) for w in caught if issubclass(w.category, ExportFallbackWarning)]}
    return model, report


def decode_ms(model, batch: int, prompt: int, steps: int, device) -> float:
    """Median ms of one decode step (batch tokens) after a prefill of ``prompt`` tokens."""
    from sparsity_lab.lab.decode import decode_step, prefill

    gen = torch.Generator(device=device).manual_seed(3)
    idx = torch.randint(0, 256, (batch, prompt), device=device, generator=gen)
    times = []
    for round_ in range(2):  # the first round warms up (allocations, cuSPARSELt plans for this batch)
        _, cache = prefill(model, idx)
        token = idx[:, -1:]
        for _ in range(steps):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            logits = decode_step(model, token, cache)
            token = logits[:, -1:].argmax(-1)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if round_:
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true", help="CPU plumbing check (numbers mean nothing)")
    parser.add_argument("--warmup", type=positive_int, default=None, help="prefill calls before timing (default 3)")
    parser.add_argument("--reps", type=positive_int, default=None, help="timed prefill calls (default 10)")
    parser.add_argument("--out", type=output_file, default=None, help="JSON path (default results/export_h100.json; "
                        "export_smoke.json in the current folder with --smoke)")


def run(args) -> int:
    from sparsity_lab.flops import gpt_config_flops_per_token, tflops
    from sparsity_lab.lab.decode import prefill
    from sparsity_lab.lab.model import GPTConfig
    from sparsity_lab.provenance import write_result

    smoke = args.smoke
    device = bench_device(smoke, "python -m benchmarks export")
    if device is None:
        return 2
    s = SMOKE if smoke else FULL
    warmup, reps = args.warmup or (1 if smoke else 3), args.reps or (2 if smoke else 10)
    cfg = GPTConfig(vocab_size=256, context=s["context"], n_layer=s["n_layer"], n_head=s["n_head"], d_model=s["d_model"])
    tokens = s["batch"] * s["context"]
    forward_flops = sum(gpt_config_flops_per_token(cfg).values()) / 3 * tokens
    started = time.perf_counter()
    payload = {"smoke": smoke, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "dtype": "bfloat16", "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in s.items()},
               "hidden": cfg.hidden, "warmup": warmup, "reps": reps, "variants": {}}
    errors = {}
    gen = torch.Generator(device=device).manual_seed(2)
    idx = torch.randint(0, 256, (s["batch"], s["context"]), device=device, generator=gen)
    outputs = {}
    for variant in ("dense", "sparse_exported"):
        try:
            model, report = build(variant, cfg, device)
            ms, _ = median_ms(lambda: prefill(model, idx), warmup, reps, device)
            rec = {"prefill_ms": ms, "prefill_tokens_per_s": tokens / ms * 1e3}
            if variant == "dense":
                rec["prefill_tflops"] = tflops(forward_flops, ms)
            if report is not None:
                rec["export"] = report
            outputs[variant] = prefill(model, idx[:1, :8])[0].float()
            rec["decode_ms_per_token"] = {str(b): decode_ms(model, b, s["prompt"], s["decode_tokens"], device)
                                          for b in s["decode_batches"]}
            payload["variants"][variant] = rec
            print(f"{variant:16s} prefill {ms:.3f} ms ({rec['prefill_tokens_per_s']:.0f} tokens/s); decode ms/token "
                  f"{ {b: round(v, 3) for b, v in rec['decode_ms_per_token'].items()} }", flush=True)
        except Exception as err:  # recorded; the run goes on
            errors[variant] = f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"
            payload["variants"][variant] = {"error": errors[variant]}
            print(f"{variant}: ERROR {errors[variant]}", flush=True)
        model = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
    dense, sparse = payload["variants"].get("dense", {}), payload["variants"].get("sparse_exported", {})
    if "prefill_ms" in dense and "prefill_ms" in sparse:
        sparse["prefill_speedup_vs_dense"] = dense["prefill_ms"] / sparse["prefill_ms"]
        sparse["decode_speedup_vs_dense"] = {b: dense["decode_ms_per_token"][b] / sparse["decode_ms_per_token"][b]
                                             for b in sparse["decode_ms_per_token"]}
        # the 2:4 logits differ from dense by the pruned weights: a sanity figure, not a test
        payload["logits_max_abs_difference_dense_vs_24"] = float((outputs["dense"] - outputs["sparse_exported"]).abs().max())
        print(f"2:4 / dense: prefill {sparse['prefill_speedup_vs_dense']:.3f}x (dense {dense['prefill_tflops']:.0f} "
              f"TFLOP/s); decode {({b: round(v, 3) for b, v in sparse['decode_speedup_vs_dense'].items()})}")
    payload["errors"] = errors
    payload["elapsed_s"] = time.perf_counter() - started
    out = result_path(args.out, smoke, "export")
    path = write_result(out.stem, payload, directory=out.parent)
    print(f"wrote {path}")
    return 1 if errors else 0
