"""``python -m benchmarks step-profile``: a whole training step of the lab GPT, dense against 2:4, where its time goes.

For each mode (the options that cut the non-GEMM tax, the same for dense and 2:4) and each configuration,
one model is built, trained ``--warmup`` steps, timed over ``--steps`` steps and profiled over a few more:

configurations (``CONFIGS``): ``dense`` (the plain GPT); ``ffn24`` (the FFN linears 2:4: S-STE + MVUE,
transposable masks recomputed every step, ``--backend`` products, cusparselt by default); ``all24`` (every
linear of every block 2:4); ``ffn24_r<k>`` / ``all24_r<k>``: the same with ``mask_refresh_interval`` k
(``--refresh-interval``, default 10).

modes (``--modes``, "+"-joined options; ``baseline`` has none): bf16 autocast and AdamW (fused on CUDA)
always, plus ``bf16w`` (the linear weights held in bf16, float32 masters in the optimizer:
``sparsity_lab.lab.master_weights``, updated by its fused kernel: one pass from the bf16 gradients to the
masters, moments and bf16 weights; under ``--smoke`` through Triton's interpreter when TRITON_INTERPRET=1),
``unfused`` (with bf16w: the masters updated by copy, PyTorch's fused AdamW, copy, as before the kernel),
``operands_apart`` (with bf16w: the optimizer's kernel does not write the 2:4 layers' next compressed operands,
kernel 26; each forward's kernel 11 does, as before that kernel),
``compile`` (``torch.compile`` of the model: Inductor fuses the norms,
residual adds, GELU and casts; the dense products stay cuBLAS calls and each 2:4 layer one custom op) and
``graph`` (forward and backward replayed by ``CudaGraphStep``; not with compile; ``graph+masks_in_graph``: the
masks refreshed inside the captured step, ``CudaGraphStep(masks_in_graph=True)``) and ``fp8`` (every block
linear's products in FP8 E4M3 with delayed scaling: the 2:4 ones on ``cusparselt_fp8`` with the scales in
the product, ``FP8Recipe(scale_in_product="host_alpha")``, or with ``--fp8-backend cutlass_fp8`` on CUTLASS's
sparse GEMMs with the scales read on the device in the epilogue; the dense ones on ``torch._scaled_mm``, as the
FP8 benchmark's dense recipe; the LM head stays bf16. With bf16w only (``bf16w+fp8``, also with graph:
the scales' histories advance eagerly after each replay); CUDA only).

Per run: wall ms per step (CUDA events between consecutive steps: the median for a mask refreshed every
step, the mean over whole refresh cycles otherwise) and tokens/s; the loss and the flip rate over the timed
steps; the per-step kernel time by category (``step_categories``: dense GEMMs, sparse GEMMs, attention,
optimizer, norms/casts/elementwise, 2:4 work, other) from torch.profiler, and the idle time (wall minus
kernels). Per 2:4 run: the speed-up over the fastest dense of the whole run (the headline, ``conditions``)
and over the dense of its own mode, its Amdahl ceiling (``step_ceiling``: the dense step with the sparse
linears' GEMMs divided by their product speed-up measured in this run, nothing else changed; the fp8
mode's from the FP8 products, ``step_products_fp8``, with ``--fp8-backend cutlass_fp8``) and the ratio
measured / ceiling, and the 2:4 work's share of its step. Around it: the dense bf16 matmul probe at the
start and the end, the dense step's TFLOP/s and its GEMMs' achieved rate against the probe
(``baseline_check``), the GPU's clocks per run (``ConditionSampler``). Every run is guarded: an error is
recorded and the next run goes on; ``--budget-s`` skips (and lists) the runs that would start after it.

Writes results/step_profile_<gpu>.json (``--name``; ``--out-dir``), rewritten after every run.
``--smoke``: the CPU, a tiny GPT, backend "torch", the aot_eager compiler, a few steps: every code path
runs (the graph mode records its "needs a CUDA GPU" error); the numbers mean nothing.
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import re
import statistics
import sys
import time
import traceback
from typing import Callable, NamedTuple

import torch

from sparsity_lab.lab.arguments import backend_name, output_folder, positive_float, positive_int

from benchmarks.conditions import ConditionSampler, baseline_check, format_conditions, headline, matmul_probe
from benchmarks.step_categories import CATEGORIES, LABELS, breakdown
from benchmarks.step_ceiling import (BLOCK_LINEARS, HEAD, PRODUCTS, SELECTIONS, amdahl, attribution, closeness,
                                     linear_shapes)

MODEL = dict(d_model=4096, n_layer=8, n_head=32, context=1024, batch=8)
SMOKE_MODEL = dict(d_model=64, n_layer=2, n_head=2, context=32, batch=2)
OPTIONS = ("bf16w", "unfused", "operands_apart", "compile", "graph", "masks_in_graph", "fp8")
FP8_BACKENDS = ("cusparselt_fp8", "cutlass_fp8")  # --fp8-backend: where the fp8 mode's 2:4 products run
DEFAULT_MODES = "baseline,bf16w+compile,bf16w"
LR = 3e-4  # constant: the loss and flip rate over a few dozen steps, not a schedule


class Config(NamedTuple):
    name: str
    select: str | None  # None: dense; else a key of SELECTIONS
    refresh: int  # mask_refresh_interval


def configs(refresh: int) -> dict[str, Config]:
    """The configurations, ``refresh`` the interval of the ``_r<k>`` ones."""
    out = {"dense": Config("dense", None, 1), "ffn24": Config("ffn24", "ffn", 1),
           "all24": Config("all24", "all_linears", 1)}
    out[f"ffn24_r{refresh}"] = Config(f"ffn24_r{refresh}", "ffn", refresh)
    out[f"all24_r{refresh}"] = Config(f"all24_r{refresh}", "all_linears", refresh)
    return out


def parse_mode(mode: str) -> frozenset[str]:
    """"baseline" -> {}; "bf16w+compile" -> {"bf16w", "compile"}; ValueError naming --modes otherwise."""
    if mode == "baseline":
        return frozenset()
    parts = mode.split("+")
    bad = [p for p in parts if p not in OPTIONS]
    if bad or not parts or len(set(parts)) != len(parts):
        raise ValueError(f"--modes: {mode!r} is not 'baseline' or a '+'-joined set of {OPTIONS}")
    for form in ("unfused", "operands_apart"):
        if form in parts and "bf16w" not in parts:
            raise ValueError(f"--modes: {mode!r}: {form} is a form of the bf16w master update; write bf16w+{form}")
    if "fp8" in parts and "bf16w" not in parts:
        raise ValueError(f"--modes: {mode!r}: fp8 takes bf16 weights (the dense FP8 recipe casts bf16 operands); "
                         "write bf16w+fp8")
    if "fp8" in parts and "compile" in parts:
        raise ValueError(f"--modes: {mode!r}: fp8 does not compile (its casts and products are custom kernels "
                         "with host-side scale state); use graph to remove the host's launch time")
    if "masks_in_graph" in parts and "graph" not in parts:
        raise ValueError(f"--modes: {mode!r}: masks_in_graph is a form of the graph mode (the masks refreshed "
                         "inside the captured step); write graph+masks_in_graph")
    if {"compile", "graph"} <= set(parts):
        raise ValueError(f"--modes: {mode!r}: compile and graph do not combine (the compiled model's custom ops "
                         "keep host-side state that a CUDA-graph replay skips); choose one")
    return frozenset(parts)


def gpu_tag(name: str | None) -> str:
    """"NVIDIA H100 80GB HBM3" -> "h100"; a name without a model number -> "gpu"."""
    found = re.search(r"\b([a-z]{1,2}\d{2,4})\b", (name or "").lower())
    return found.group(1) if found else "gpu"


# --- the timers ------------------------------------------------------------------------------------------
def time_steps(step: Callable[[int], object], first: int, count: int, device: torch.device) -> list[float]:
    """Milliseconds of each of ``count`` steps (batches first, first+1, ...): CUDA events recorded between
    consecutive steps (the GPU's wall, idle gaps included) on a GPU, the host clock on a CPU."""
    if device.type != "cuda":
        times = []
        for i in range(count):
            t0 = time.perf_counter()
            step(first + i)
            times.append((time.perf_counter() - t0) * 1e3)
        return times
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
    events[0].record()
    for i in range(count):
        step(first + i)
        events[i + 1].record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in zip(events, events[1:])]


def profile_steps(step: Callable[[int], object], first: int, count: int, device: torch.device) -> list[tuple]:
    """(name, ms per step, calls per step) of every kernel (CUDA) or operator's own time (CPU) over
    ``count`` steps under torch.profiler, largest first."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for i in range(count):
            step(first + i)
        if cuda:
            torch.cuda.synchronize()
    return kernel_rows(prof, count, cuda)


def kernel_rows(prof, count: int, cuda: bool) -> list[tuple]:
    """(name, ms per step, calls per step) of every kernel (CUDA) or operator's own time (CPU) of a stopped
    torch.profiler that ran ``count`` steps, largest first."""
    rows = []
    for e in prof.key_averages():
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us > 0:
            rows.append((e.key, us / count / 1e3, e.count / count))
    return sorted(rows, key=lambda r: -r[1])


def _timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    from benchmarks.conditions import _host_ms, cuda_median_ms

    return cuda_median_ms if device.type == "cuda" else _host_ms


# --- the product table: dense against 2:4 products of the step's linear shapes ----------------------------
def measure_products(shapes: dict, tokens: int, backend_name: str, device: torch.device,
                     dtype: torch.dtype = torch.bfloat16) -> dict:
    """{kind: {product: {"dense_ms", "sparse_ms"}}, "how": ...} for each linear of ``shapes`` over ``tokens``
    rows (the head dense only). On the cuSPARSELt backend the sparse product alone, with the algorithm the
    layers use (``backends/cusparselt/measure.py``'s operands); on any other backend its three calls."""
    from sparsity_lab.backends import get_backend
    from sparsity_lab.backends.cusparselt.backend import CusparseltBackend

    backend = get_backend(backend_name)
    t = _timer(device)
    table: dict = {}
    cslt = isinstance(backend, CusparseltBackend)
    for kind, (out_f, in_f) in shapes.items():
        dense = _dense_products(out_f, in_f, tokens, device, dtype, t)
        if kind == HEAD:
            sparse = dict.fromkeys(PRODUCTS)
        elif cslt:
            sparse = _cusparselt_products(backend, out_f, in_f, tokens, dtype, t)
        else:
            sparse = _backend_products(backend, out_f, in_f, tokens, device, dtype, t)
        table[kind] = {p: {"dense_ms": dense[p], "sparse_ms": sparse[p],
                           "speedup": dense[p] / sparse[p] if sparse[p] else None} for p in PRODUCTS}
    table["how"] = ("sparse: the cuSPARSELt product alone (searched algorithm; compression left out, it is 2:4 work)"
                    if cslt else f"sparse: backend {backend.name!r}'s linear, grad_input and grad_weight calls "
                                 "(MVUE included)")
    return table


def _operands(out_f: int, in_f: int, tokens: int, device, dtype, seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(out_f, in_f, device=device, generator=gen).to(dtype)
    x = torch.randn(tokens, in_f, device=device, generator=gen).to(dtype)
    dz = torch.randn(tokens, out_f, device=device, generator=gen).to(dtype)
    return w, x, dz


def _dense_products(out_f, in_f, tokens, device, dtype, t) -> dict:
    import torch.nn.functional as F

    w, x, dz = _operands(out_f, in_f, tokens, device, dtype)
    return {"forward": t(lambda: F.linear(x, w)), "grad_input": t(lambda: dz @ w),
            "grad_weight": t(lambda: dz.t() @ x)}


def _backend_products(backend, out_f, in_f, tokens, device, dtype, t) -> dict:
    w, x, dz = _operands(out_f, in_f, tokens, device, dtype)
    mask = backend.mask(w, 2, 4, True)
    operand = backend.prepare_masked(w, mask, None, 2, 4, dtype)
    gen = torch.Generator().manual_seed(0)
    return {"forward": t(lambda: backend.linear(x, operand, None)), "grad_input": t(lambda: backend.grad_input(dz, operand)),
            "grad_weight": t(lambda: backend.grad_weight(dz, x, True, gen))}


def _cusparselt_products(backend, out_f, in_f, tokens, dtype, t) -> dict:
    """The sparse products alone as ``CusparseltBackend`` runs them (measure.py's synthetic operands)."""
    from sparsity_lab.backends.cusparselt.algorithms import ProductKey, synthetic_operands
    from sparsity_lab.backends.cusparselt.measure import _weight_product_ms

    rows = backend._rows_for(tokens, dtype)
    _, fwd, _ = _weight_product_ms(backend, "forward", out_f, in_f, rows, dtype, t)
    _, gin, _ = _weight_product_ms(backend, "grad_input", in_f, out_f, rows, dtype, t)
    key = ProductKey(out_f, rows, in_f, dtype, False, backend.grad_weight_transpose_result)
    a, x, _ = synthetic_operands(key, torch.device("cuda"))  # a = MVUE(dZ^T) (out, tokens)
    a_view = a.t().contiguous().t()  # tokens-major, as the MVUE kernel leaves it
    compress, _ = backend._compressor(a_view)
    compressed = compress(a_view)
    config = backend.algorithms.get(key, x.device)
    gw = t(lambda: backend._ops.mm(compressed, x, None, key.transpose_result, config))
    return {"forward": fwd, "grad_input": gin, "grad_weight": gw}


# --- one run ----------------------------------------------------------------------------------------------
class Built(NamedTuple):
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    step: Callable[[int], torch.Tensor]
    graph_step: object | None


def build(config: Config, options: frozenset, args, batches: list, device: torch.device) -> Built:
    """The model, optimizer and step of one run (same seed and initial weights for every run)."""
    import sparsity_lab as sl
    from sparsity_lab.lab.master_weights import lower_linear_weights
    from sparsity_lab.lab.model import GPT, GPTConfig, sparse_selector

    m = args.model
    cfg = GPTConfig(vocab_size=256, context=m["context"], n_layer=m["n_layer"], n_head=m["n_head"],
                    d_model=m["d_model"], bias=False, dropout=0.0)
    torch.manual_seed(0)
    with device:
        model = GPT(cfg)
    cuda = device.type == "cuda"
    fp8 = "fp8" in options
    if fp8 and not cuda:
        raise RuntimeError("the fp8 mode needs a CUDA GPU (cuSPARSELt and torch._scaled_mm in E4M3)")
    if config.select is not None:
        backend = args.fp8_backend if fp8 else args.backend
        method = sl.SSTE(mvue=True, transposable=True, backend=backend, mask_refresh_interval=config.refresh)
        sl.sparsify(model, method, select=sparse_selector(config.select))
        if fp8 and args.fp8_backend == "cusparselt_fp8":  # CUTLASS reads its scales on the device: no host alpha
            from sparsity_lab.backends.cusparselt.fp8_train import set_fp8_recipe
            from sparsity_lab.methods.fp8_scaling import FP8Recipe
            set_fp8_recipe(model, FP8Recipe(scale_in_product="host_alpha"))
    kwargs = dict(lr=LR, betas=(0.9, 0.95), weight_decay=0.1, fused=True if cuda else None)
    if "bf16w" in options:
        # the fused update: CUDA's default; on the CPU only through the interpreter (the smoke run under pytest)
        fused = False if "unfused" in options else (None if cuda else os.environ.get("TRITON_INTERPRET") == "1")
        opt = lower_linear_weights(model, torch.optim.AdamW, fused_update=fused,
                                   write_operands="operands_apart" not in options, **kwargs)
    else:
        opt = torch.optim.AdamW(model.parameters(), **kwargs)
    if config.select is not None:
        sl.attach_optimizer(model, opt)
    fp8_dense = _fp8_dense_block_linears(model) if fp8 else []  # after the lowering: they take its bf16 weights
    run_model = torch.compile(model, backend="inductor" if cuda else "aot_eager") if "compile" in options else model
    graph = "graph" in options

    def loss_fn(mod, x, y):
        with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=not graph):
            _, loss = mod(x, y)
        return loss
    graph_step = None
    if graph:
        if not cuda:
            raise RuntimeError("the graph mode needs a CUDA GPU (CudaGraphStep); the CPU runs the others")
        graph_step = sl.CudaGraphStep(model, loss_fn, masks_in_graph="masks_in_graph" in options)

    def step(i: int) -> torch.Tensor:
        x, y = batches[i]
        if graph_step is not None:
            loss = graph_step(x, y).clone()  # the replay overwrites its loss tensor
        else:
            loss = loss_fn(run_model, x, y)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for layer in fp8_dense:  # the dense FP8 recipe's scale histories (the 2:4 layers advance in their hook)
            layer.advance_step()
        return loss.detach()
    return Built(model, opt, step, graph_step)


def _fp8_dense_block_linears(model) -> list:
    """Every block linear still a plain ``nn.Linear`` replaced by the FP8 benchmark's dense FP8 layer
    (``torch._scaled_mm`` with the same delayed-scaling recipe); the replacements, for ``advance_step``."""
    from torch import nn

    from benchmarks.fp8_training import FP8DenseLinear
    from sparsity_lab.lab.model import is_block_linear

    swapped = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and is_block_linear(full, child):
                layer = FP8DenseLinear(child)
                setattr(module, child_name, layer)
                swapped.append(layer)
    return swapped


def _flip_counts(model) -> tuple[int, int]:
    """(flips summed over every mask computation, mask entries computed) so far, over every 2:4 layer."""
    from sparsity_lab.training_hooks import sparse_layers

    layers = [layer for _, layer in sparse_layers(model)]
    flips = sum(layer.flips_total for layer in layers)  # one host sync per layer: outside the timed steps
    computed = sum(max(0, layer.mask_updates - 1) * layer.mask.numel() for layer in layers)
    return flips, computed


def run_one(config: Config, mode: str, args, batches: list, sampler: ConditionSampler, device) -> dict:
    """One configuration in one mode: timings, losses, flip rate and the profile's categories."""
    options = parse_mode(mode)
    record: dict = {"config": config.name, "mode": mode, "options": sorted(options), "select": config.select,
                    "mask_refresh_interval": config.refresh if config.select else None}
    built = None
    t0 = time.monotonic()
    try:
        with sampler.section(f"{mode} {config.name}"):
            built = build(config, options, args, batches, device)
            losses = [built.step(i) for i in range(args.warmup)]
            flips0, computed0 = _flip_counts(built.model)
            times = time_steps(lambda i: losses.append(built.step(i)), args.warmup, args.steps, device)
            flips1, computed1 = _flip_counts(built.model)
            cycle = config.refresh if config.select else 1
            prof_steps = -(-max(args.profile_steps, cycle) // cycle) * cycle  # whole refresh cycles
            kernels = profile_steps(built.step, args.warmup + args.steps, prof_steps, device)
        timed = [float(v) for v in torch.stack(losses[args.warmup:]).float().cpu().tolist()]
        ms = statistics.median(times) if cycle == 1 else statistics.fmean(times)
        tokens = args.model["batch"] * args.model["context"]
        parts = breakdown((name, ms_) for name, ms_, _ in kernels)
        kernel_ms = sum(parts.values())
        record.update(
            ms=ms, timing="median of the timed steps" if cycle == 1 else f"mean over whole cycles of {cycle} steps",
            ms_median=statistics.median(times), ms_mean=statistics.fmean(times), step_ms=times,
            tokens_per_s=tokens / ms * 1e3, loss_timed=timed, loss_first=timed[0], loss_last=timed[-1],
            loss_mean=statistics.fmean(timed),
            flip_rate_timed=(flips1 - flips0) / (computed1 - computed0) if computed1 > computed0 else None,
            mask_computations_timed=(computed1 - computed0), profiled_steps=prof_steps,
            breakdown_ms=parts, kernel_ms=kernel_ms, idle_ms=ms - kernel_ms,
            top_kernels=[{"name": n[:160], "ms": v, "calls": c} for n, v, c in kernels[:25]],
            params=built.model.num_params(),
            master_update=None if "bf16w" not in options else ("fused" if built.optimizer.fused_update else "copies"))
        if config.select:
            record["two4_work_share"] = parts["two4_work"] / ms
        if built.graph_step is not None:
            from sparsity_lab.lab.trainer import graph_step_report
            record["graph_step"] = graph_step_report(built.graph_step)
        if math.isfinite(timed[-1]) is False:
            record["warning"] = "the loss is not finite"
    except Exception as err:  # noqa: BLE001 - recorded, the next run goes on
        record["error"] = f"{type(err).__name__}: {err}"[:1000]
        text = traceback.format_exc()
        record["traceback"] = text if len(text) <= 6000 else text[:3000] + "\n...\n" + text[-3000:]
    finally:
        if built is not None and built.graph_step is not None:
            built.graph_step.release()
        built = None
        if "compile" in options:
            torch._dynamo.reset()  # the compiled graphs hold this model's layers
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            record["cuda_gib_peak"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
    record["wall_s"] = time.monotonic() - t0
    return record


# --- what the runs add up to ------------------------------------------------------------------------------
def summarize(records: list[dict], products: dict | None, n_layer: int, flops_per_step: float,
              linear_flops_per_step: float, probe_tflops: float | None, fp8_products: dict | None = None) -> dict:
    """Per mode: the dense step's TFLOP/s and GEMM rate (with ``baseline_check``); per 2:4 run: the headline
    speed-up (fastest dense of the run), the same-mode speed-up, the ceiling and measured / ceiling (the fp8
    mode's from ``fp8_products``, the FP8 product table)."""
    from sparsity_lab.flops import tflops

    ok = [r for r in records if r.get("ms")]
    dense = {r["mode"]: r for r in ok if r["select"] is None}
    out: dict = {"fastest_dense": None, "modes": {}, "runs": {}}
    fastest_name, _ = min(((m, r["ms"]) for m, r in dense.items()), key=lambda p: p[1], default=(None, None))
    out["fastest_dense"] = fastest_name
    for mode, r in dense.items():
        gemm = r["breakdown_ms"]["dense_gemm"]
        rate = tflops(linear_flops_per_step, gemm) if gemm > 0 else None
        out["modes"][mode] = {"dense_ms": r["ms"], "dense_tflops": tflops(flops_per_step, r["ms"]),
                              "dense_gemm_ms": gemm, "dense_gemm_tflops": rate,
                              "baseline_check": baseline_check(rate, probe_tflops)}
    for r in ok:
        if r["select"] is None:
            continue
        h = headline({m: d["ms"] for m, d in dense.items()}, r["ms"])
        run: dict = {"speedup_vs_fastest_dense": h["speedup"], "fastest_dense": h["dense_source"],
                     "speedup_vs_dense_same_mode": h["against"].get(r["mode"]),
                     "speedup_vs_dense_baseline_mode": h["against"].get("baseline"),
                     "speedup_vs_dense": h["against"],  # every mode's dense step of this run (e.g. FP8 2:4 vs bf16)
                     "two4_work_share": r.get("two4_work_share")}
        same = dense.get(r["mode"])
        fp8 = "fp8" in r.get("options", ())
        table = fp8_products if fp8 else products  # an FP8 step's ceiling needs FP8 product speed-ups
        if same is None:
            run["ceiling_error"] = f"no dense run in mode {r['mode']!r} to compute the ceiling from"
        elif not table:
            run["ceiling_error"] = f"the {'FP8 ' if fp8 else ''}product table was not measured"
        else:
            try:
                a = attribution(table, r["select"], n_layer)
                c = amdahl(same["ms"], same["breakdown_ms"]["dense_gemm"], a["share"], a["product_speedup"])
                run.update(attribution=a, ceiling=c, measured_over_ceiling=closeness(
                    run["speedup_vs_dense_same_mode"], c["ceiling_speedup"]))
            except ValueError as err:
                run["ceiling_error"] = str(err)
        out["runs"][f"{r['mode']} {r['config']}"] = run
    return out


def format_tables(records: list[dict], summary: dict) -> str:
    """One markdown table per mode: the per-step breakdown and, for the 2:4 runs, speed-ups and ceilings."""
    lines = []
    for mode in dict.fromkeys(r["mode"] for r in records):
        runs = [r for r in records if r["mode"] == mode]
        m = summary["modes"].get(mode, {})
        head = f"mode {mode}"
        if m:
            rate = m.get("dense_gemm_tflops")
            head += (f": dense {m['dense_ms']:.1f} ms, {m['dense_tflops']:.0f} TFLOP/s"
                     + (f" (its GEMMs {rate:.0f} TFLOP/s)" if rate else ""))
        lines += ["", head, "| per step (ms) | " + " | ".join(r["config"] for r in runs) + " |",
                  "| --- " * (len(runs) + 1) + "|"]

        def cell(r: dict, fn) -> str:
            if r.get("error"):
                return "error"
            if r.get("skipped"):
                return "skipped"
            try:
                return fn(r)
            except (KeyError, TypeError):
                return "-"

        def row(label: str, fn) -> None:
            lines.append(f"| {label} | " + " | ".join(cell(r, fn) for r in runs) + " |")

        def speed(r: dict) -> str:
            s = summary["runs"].get(f"{mode} {r['config']}", {})
            return f"{r['ms']:.1f}" + (f" ({s['speedup_vs_fastest_dense']:.2f}x)" if s.get("speedup_vs_fastest_dense") else "")
        row("wall", speed)
        row("tokens/s", lambda r: f"{r['tokens_per_s']:,.0f}")
        for cat in CATEGORIES:
            if cat == "two4_work":
                row(LABELS[cat], lambda r: "-" if not r["select"] else
                    f"{r['breakdown_ms'][cat]:.1f} ({r['two4_work_share']:.1%})")
            else:
                row(LABELS[cat], lambda r, cat=cat: f"{r['breakdown_ms'][cat]:.1f}")
        row("idle (wall - kernels)", lambda r: f"{r['idle_ms']:.1f}")

        def run_of(r: dict) -> dict:
            return summary["runs"].get(f"{mode} {r['config']}", {})
        row("speed-up vs dense, same mode", lambda r: "-" if not r["select"] else
            f"{run_of(r)['speedup_vs_dense_same_mode']:.3f}x")
        for other in summary["modes"]:  # the same run's dense step of every other mode, measured beside it
            if other != mode:
                row(f"speed-up vs dense {other} ({summary['modes'][other]['dense_tflops']:.0f} TFLOP/s)",
                    lambda r, other=other: "-" if not r["select"] else f"{run_of(r)['speedup_vs_dense'][other]:.3f}x")
        row("Amdahl ceiling", lambda r: "-" if not r["select"] else f"{run_of(r)['ceiling']['ceiling_speedup']:.3f}x")
        row("measured / ceiling", lambda r: "-" if not r["select"] else f"{run_of(r)['measured_over_ceiling']:.3f}")
        row("loss (timed steps, first -> last)", lambda r: f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}")
        row("flip rate per mask computation", lambda r: "-" if r.get("flip_rate_timed") is None else
            f"{r['flip_rate_timed']:.2e}")
    return "\n".join(lines)


# --- the command ------------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--modes", default=DEFAULT_MODES, help="comma-separated; each 'baseline' or a '+'-joined set of "
                   f"{OPTIONS} (default {DEFAULT_MODES})")
    p.add_argument("--configs", default=None, help="comma-separated, from dense, ffn24, all24, ffn24_r<k>, all24_r<k> "
                   "(default all; dense is always run first in each mode)")
    p.add_argument("--refresh-interval", type=positive_int, default=10, help="k of the _r<k> configurations (default 10)")
    p.add_argument("--steps", type=positive_int, default=20, help="timed steps per run (default 20; 2 with --smoke)")
    p.add_argument("--warmup", type=positive_int, default=5, help="steps before timing (default 5; 1 with --smoke)")
    p.add_argument("--profile-steps", type=positive_int, default=3, help="profiled steps after timing, rounded up to whole "
                   "refresh cycles (default 3; 1 with --smoke)")
    p.add_argument("--width", type=positive_int, default=None, help=f"d_model (default {MODEL['d_model']})")
    p.add_argument("--layers", type=positive_int, default=None, help=f"blocks (default {MODEL['n_layer']})")
    p.add_argument("--heads", type=positive_int, default=None, help=f"attention heads (default {MODEL['n_head']})")
    p.add_argument("--context", type=positive_int, default=None, help=f"tokens per sequence (default {MODEL['context']})")
    p.add_argument("--batch", type=positive_int, default=None, help=f"sequences per step (default {MODEL['batch']})")
    p.add_argument("--backend", type=backend_name, default=None, help="2:4 products' backend (default cusparselt; torch with --smoke)")
    p.add_argument("--fp8-backend", choices=FP8_BACKENDS, default=FP8_BACKENDS[0],
                   help="the fp8 mode's 2:4 products: cuSPARSELt with the scales as a host alpha one step late "
                   "(default), or CUTLASS with the scales read on the device in its epilogue")
    p.add_argument("--budget-s", type=positive_float, default=330.0, help="no run starts after this many seconds "
                   "(the rest is listed as skipped; default 330)")
    p.add_argument("--out-dir", type=output_folder, default=None, help="folder for the JSON (default results/)")
    p.add_argument("--name", default=None, help="JSON name (default step_profile_<gpu>; step_profile_smoke)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny GPT, backend torch: the plumbing only")


def check_arguments(args: argparse.Namespace) -> None:
    """Options that do not go together, or mode and configuration names that do not exist: ValueError,
    before any work (``python -m benchmarks`` prints the usage and exits with status 2)."""
    problems = _problems(args)
    table = configs(max(2, args.refresh_interval))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    try:
        for mode in modes:
            parse_mode(mode)
    except ValueError as err:
        problems.append(f"--modes: {err}")
    if not modes:
        problems.append("--modes: none given")
    chosen = list(table) if args.configs is None else [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in chosen if c not in table]
    if bad or not chosen:
        problems.append(f"--configs: unknown {bad}; choose from {list(table)}")
    if problems:
        raise ValueError("; ".join(problems))


def _problems(args) -> list[str]:
    out = []
    for k in ("steps", "warmup", "profile_steps", "refresh_interval"):
        if getattr(args, k) < 1:
            out.append(f"--{k.replace('_', '-')} must be >= 1, got {getattr(args, k)}")
    if args.refresh_interval == 1:
        out.append("--refresh-interval must be > 1 (the _r<k> runs compare with a mask every step)")
    for k in ("width", "layers", "heads", "context", "batch"):
        if getattr(args, k) is not None and getattr(args, k) < 1:
            out.append(f"--{k} must be >= 1, got {getattr(args, k)}")
    if not args.budget_s > 0:
        out.append(f"--budget-s must be > 0, got {args.budget_s}")
    return out


def run(args: argparse.Namespace) -> int:
    from sparsity_lab.flops import gpt_config_flops_per_token
    from sparsity_lab.lab.data import BatchSampler, load_corpus
    from sparsity_lab.lab.model import GPTConfig
    from sparsity_lab.provenance import write_result

    problems = _problems(args)
    table = configs(max(2, args.refresh_interval))
    try:
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        for mode in modes:
            parse_mode(mode)
        chosen = list(table) if args.configs is None else [c.strip() for c in args.configs.split(",") if c.strip()]
        bad = [c for c in chosen if c not in table]
        if bad:
            raise ValueError(f"--configs: unknown {bad}; choose from {list(table)}")
    except ValueError as err:
        problems.append(str(err))
    if not modes:
        problems.append("--modes: none given")
    if problems:
        print("benchmarks step-profile: " + "; ".join(problems), file=sys.stderr)
        return 2
    if args.smoke:
        args.steps, args.warmup, args.profile_steps = min(args.steps, 2), 1, 1
        args.budget_s = max(args.budget_s, 1e9)
    elif not torch.cuda.is_available():
        print("benchmarks step-profile needs a CUDA GPU; --smoke runs the plumbing on the CPU", file=sys.stderr)
        return 2
    base = SMOKE_MODEL if args.smoke else MODEL
    args.model = {"d_model": args.width or base["d_model"], "n_layer": args.layers or base["n_layer"],
                  "n_head": args.heads or base["n_head"], "context": args.context or base["context"],
                  "batch": args.batch or base["batch"]}
    args.backend = args.backend or ("torch" if args.smoke else "cusparselt")
    device = torch.device("cpu" if args.smoke else "cuda")
    chosen = ["dense"] + [c for c in chosen if c != "dense"]  # the baseline of every mode first
    m = args.model
    cfg = GPTConfig(vocab_size=256, context=m["context"], n_layer=m["n_layer"], n_head=m["n_head"], d_model=m["d_model"])
    tokens = m["batch"] * m["context"]
    flops = gpt_config_flops_per_token(cfg)
    flops_per_step = sum(flops.values()) * tokens
    linear_flops_per_step = (flops["attention_projections"] + flops["ffn"] + flops["lm_head"]) * tokens
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else None
    name = args.name or ("step_profile_smoke" if args.smoke else f"step_profile_{gpu_tag(gpu)}")

    corpus = load_corpus(None, 300_000 if args.smoke else 4_000_000, min_split_bytes=m["context"] + 1)
    sampler_ = BatchSampler(corpus.train, m["batch"], m["context"], seed=0)
    longest = max(args.profile_steps, args.refresh_interval)
    batches = [sampler_.sample(device) for _ in range(args.warmup + args.steps + -(-longest // args.refresh_interval)
                                                      * args.refresh_interval)]
    started = time.monotonic()
    sampler = ConditionSampler(False if args.smoke else None).start()
    records: list[dict] = []
    result: dict = {"smoke": args.smoke, "gpu": gpu, "model": m, "tokens_per_step": tokens, "dtype": "bfloat16",
                    "backend": args.backend, "fp8_backend": args.fp8_backend, "modes": modes, "configs": chosen, "steps": args.steps,
                    "warmup": args.warmup, "profile_steps": args.profile_steps, "lr": LR,
                    "refresh_interval": args.refresh_interval, "budget_s": args.budget_s,
                    "flops_per_step": flops_per_step, "linear_flops_per_step": linear_flops_per_step,
                    "method": "S-STE + MVUE, transposable 2:4 masks, AdamW (fused on CUDA), bf16 autocast",
                    "categories": LABELS, "records": records, "skipped": [], "errors": {}}

    def save() -> str:
        result["elapsed_s"] = time.monotonic() - started
        return str(write_result(name, result, directory=args.out_dir))
    try:
        with sampler.section("matmul probe (start)"):
            result["matmul_probe"] = {"start": matmul_probe(8192, m["d_model"], 4 * m["d_model"], device, label="start")}
        print(f"products of the step's linear shapes, dense against {args.backend} ...", flush=True)
        shapes = linear_shapes(m["d_model"], cfg.hidden, 256)
        try:
            with sampler.section("product table"):
                result["products"] = measure_products(shapes, tokens, args.backend, device)
        except Exception as err:  # noqa: BLE001 - the runs go on; the ceilings say what is missing
            result["products"] = None
            result["errors"]["products"] = f"{type(err).__name__}: {err}"[:1000]
            print(f"  error in the product table: {result['errors']['products'][:300]}", flush=True)
        if any("fp8" in mode for mode in modes):
            print(f"FP8 products of the same shapes, dense FP8 against {args.fp8_backend} ...", flush=True)
            try:
                from benchmarks.step_products_fp8 import measure_fp8_products
                with sampler.section("FP8 product table"):
                    result["products_fp8"] = measure_fp8_products(
                        shapes, tokens, args.fp8_backend, device,
                        lambda o, i: _dense_products(o, i, tokens, device, torch.bfloat16, _timer(device)))
            except Exception as err:  # noqa: BLE001 - the fp8 runs go on without a ceiling, saying why
                result["products_fp8"] = None
                result["errors"]["products_fp8"] = f"{type(err).__name__}: {err}"[:1000]
                print(f"  no FP8 product table: {result['errors']['products_fp8'][:300]}", flush=True)
        save()
        for mode in modes:
            for config_name in chosen:
                elapsed = time.monotonic() - started
                if elapsed > args.budget_s:
                    result["skipped"].append({"mode": mode, "config": config_name,
                                              "reason": f"--budget-s {args.budget_s:g} spent at {elapsed:.0f} s"})
                    records.append({"mode": mode, "config": config_name, "select": table[config_name].select,
                                    "skipped": True})
                    print(f"[{elapsed:5.0f} s] {mode} {config_name}: skipped (budget)", flush=True)
                    continue
                print(f"[{elapsed:5.0f} s] {mode} {config_name} ...", flush=True)
                record = run_one(table[config_name], mode, args, batches, sampler, device)
                records.append(record)
                if record.get("error"):
                    result["errors"][f"{mode} {config_name}"] = record["error"]
                    status = f"error: {record['error'][:200]}"
                else:
                    status = (f"{record['ms']:.1f} ms/step, {record['tokens_per_s']:,.0f} tokens/s, "
                              f"loss {record['loss_last']:.3f}"
                              + (f", 2:4 work {record['two4_work_share']:.1%}" if "two4_work_share" in record else ""))
                print(f"[{time.monotonic() - started:5.0f} s] {mode} {config_name}: {status}", flush=True)
                save()
        with sampler.section("matmul probe (end)"):
            result["matmul_probe"]["end"] = matmul_probe(8192, m["d_model"], 4 * m["d_model"], device, label="end")
    finally:
        sampler.stop()
        result["conditions"] = sampler.summary()
        probe = (result.get("matmul_probe") or {}).get("start", {}).get("tflops")
        result["summary"] = summarize(records, result.get("products"), m["n_layer"], flops_per_step,
                                      linear_flops_per_step, probe, result.get("products_fp8"))
        path = save()
    print(format_conditions(result["conditions"]))
    print(format_tables(records, result["summary"]))
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks step-profile", description=__doc__.split("\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
