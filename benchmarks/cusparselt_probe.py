"""A first GPU check of the cuSPARSELt backend: is it right, what does ``_cslt_compress`` write, how fast.

``python -m benchmarks.cusparselt_probe --out $OUT/cusparselt_probe.json`` on a CUDA GPU
(about a minute on an H100 by design; a time budget, ``--budget-s``, skips what is left after it).
Four parts, each in its own try/except (a failing part, or a failing shape inside one, is recorded
in the JSON with its traceback and the rest still runs):

(a) ``correctness``: the backend's three products against float32 dense products of the same masked
    operands, bf16, at a few shapes (odd tokens included: the padding path), with the algorithm
    search's table (how many candidates, which were wrong, which raised); a SparseLinear layer on
    "cusparselt" against the same layer on "torch" (same weights, same mask) under bf16 autocast;
    S-STE + MVUE against the "triton" backend (same MVUE draws, so the weight gradients must agree).
(b) ``compress_layout``: the layout of ``torch._cslt_compress`` output. The hypothesis from a first
    fp16 32 x 64 dump on sm90: the kept values first, row-major, then the metadata. Checked here for
    bf16, fp16 (and fp8 values) at several shapes; the metadata mapped by compressing known patterns: all
    groups alike (6 patterns), then one group at a time changed to each of the 5 other patterns,
    recording which metadata bits change and the code each pattern writes there.
(c) ``timings``: the FFN linears of the speed targets (tokens 16384, d_model 4096, ffn 16384: up (ffn, d),
    down (d, ffn)), bf16, side by side in one run: forward product alone (dense ``F.linear``; sparse
    eager with the searched algorithm and with alg 0; sparse and dense captured in a CUDA graph;
    PyTorch's ``to_sparse_semi_structured`` + ``F.linear``), the weight-gradient product
    MVUE(dZ^T) X (both result layouts; with and without the per-call copy and compression), and
    forward+backward of one layer (dense
    nn.Linear; SparseLinear on "cusparselt" with the operand cached (one micro-step of a step whose
    operand is built), mask recomputed every step, and + MVUE weight gradient (S-STE)); plus the
    host overhead at a small shape (eager vs graph). Ratios are dense time / ours.
(d) ``compress_speed``: ``_cslt_compress`` time against a bandwidth floor (bytes read + written at
    the device-to-device copy rate measured in the same run).

``--dry-run`` (any machine): parses the arguments, writes the JSON (provenance, arguments, the plan,
every part marked skipped) and prints the table; no CUDA needed. Without a GPU and without
``--dry-run`` the JSON records the error and the exit status is 2.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

PARTS = ("correctness", "compress_layout", "timings", "compress_speed")
CORRECTNESS_SHAPES = ((256, 256, 512), (1000, 512, 256), (2048, 1024, 4096), (4096, 4096, 1024))  # tokens, in, out
LAYOUT_SHAPES = ((32, 64), (64, 128), (256, 512), (1024, 1024))
COMPRESS_SHAPES = ((4096, 4096), (16384, 4096), (4096, 16384), (16384, 16384))
PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))  # the 6 ways to keep 2 of 4
DEFAULT_OUT = "results/cusparselt_probe.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cusparselt_probe",
                                description=__doc__.split("\n")[0])
    p.add_argument("--out", default=DEFAULT_OUT, help="JSON file (or a directory: cusparselt_probe.json inside)")
    p.add_argument("--dry-run", action="store_true", help="no GPU work: arguments, plan and JSON only")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--d-model", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=16384)
    p.add_argument("--reps", type=int, default=10, help="timed repetitions per measurement")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=270.0, help="start nothing new after this many seconds")
    p.add_argument("--no-sweep", action="store_true", help="algorithm search: cuSPARSELt's pick only")
    args = p.parse_args(argv)
    parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    unknown = [s for s in parts if s not in PARTS]
    if unknown or not parts:
        p.error(f"--parts must be a comma-separated subset of {', '.join(PARTS)}, got {args.parts!r}")
    args.parts = parts
    for name in ("tokens", "d_model", "ffn", "reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("d_model", "ffn"):
        if getattr(args, name) % 16:
            p.error(f"--{name.replace('_', '-')} must be a multiple of 16 (cuSPARSELt minimum), "
                    f"got {getattr(args, name)}")
    if args.warmup < 0 or args.budget_s <= 0:
        p.error("--warmup must be >= 0 and --budget-s > 0")
    return args


def out_path(out: str) -> Path:
    path = Path(out)
    return path if path.suffix == ".json" else path / "cusparselt_probe.json"


def plan(args: argparse.Namespace) -> dict:
    """What a full run measures, from the arguments (also written by --dry-run)."""
    d, f = args.d_model, args.ffn
    return {
        "correctness_shapes_tokens_in_out": [list(s) for s in CORRECTNESS_SHAPES],
        "layout_shapes": [list(s) for s in LAYOUT_SHAPES],
        "ffn_linears_out_in": {"up": [f, d], "down": [d, f]},
        "tokens": args.tokens,
        "compress_shapes": [list(s) for s in COMPRESS_SHAPES],
    }


# --- robustness: every part and sub-step guarded ----------------------------------------------------
class Context:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.start = time.monotonic()

    def time_left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.start)


def _error_record(err: BaseException) -> dict:
    return {"status": "error", "error": f"{type(err).__name__}: {err}"[:2000],
            "traceback": traceback.format_exc()[-4000:]}


def guarded(label: str, fn: Callable[[], dict], ctx: Context | None = None) -> dict:
    """``{"label": label, "status": "ok", **fn()}``, or the error (never raises)."""
    if ctx is not None and ctx.time_left() <= 0:
        return {"label": label, "status": "skipped", "reason": "time budget spent"}
    try:
        record = {"label": label, "status": "ok", **fn()}
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # surface asynchronous errors here, not in the next step
        return record
    except Exception as err:  # noqa: BLE001 - the point is to record anything and go on
        return {"label": label, **_error_record(err)}
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def run_parts(parts: dict[str, Callable[[Context], dict]], ctx: Context) -> dict[str, dict]:
    """Run each part under :func:`guarded`; one failing part does not stop the others."""
    return {name: guarded(name, lambda fn=fn: fn(ctx), ctx) for name, fn in parts.items()}


# --- helpers -----------------------------------------------------------------------------------------
def _time_ms(fn: Callable[[], object], ctx: Context) -> float:
    from sparsity_lab.backends.cusparselt.ops import TorchCusparseltOps
    return TorchCusparseltOps.time_ms(fn, reps=ctx.args.reps, warmup=ctx.args.warmup)


def _graph_ms(fn: Callable[[], object], ctx: Context) -> float:
    """Milliseconds per replay of ``fn`` captured in a CUDA graph (no host work per call)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _time_ms(graph.replay, ctx)


def _random_24(rows: int, cols: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(W 2:4 along rows with a random pattern per group, its bool mask)."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    ranks = torch.rand(rows, cols // 4, 4, generator=gen, device="cuda").argsort(-1).argsort(-1)
    mask = (ranks < 2).reshape(rows, cols)
    # magnitudes in [0.5, 1.5): no kept value rounds to zero, even in fp8 (a zero would blur the layout probe)
    w = torch.randn(rows, cols, generator=gen, device="cuda").sign() * (0.5 + torch.rand(
        rows, cols, generator=gen, device="cuda"))
    return (w * mask).to(dtype), mask


def _rel(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> dict:
    from sparsity_lab.backends.cusparselt.algorithms import check_product
    ok, rel = check_product(out, ref, dtype)
    return {"rel_err": rel, "within_bound": ok}


def _rel_plain(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# --- (a) correctness ---------------------------------------------------------------------------------
def _check_products(backend, tokens: int, in_f: int, out_f: int) -> dict:
    from sparsity_lab.backends.cusparselt.backend import _pad_rows
    from sparsity_lab.backends.cusparselt.ops import padded
    from sparsity_lab.masks.nm import is_nm

    bf16 = torch.bfloat16
    torch.manual_seed(tokens + in_f + out_f)
    w = torch.randn(out_f, in_f, device="cuda")
    mask = backend.mask(w, 2, 4, True)
    sw = backend.sparse_weight(w, mask, None, 2, 4).to(bf16)
    op = backend.prepare(sw)
    x = torch.randn(tokens, in_f, device="cuda", dtype=bf16)
    dz = torch.randn(tokens, out_f, device="cuda", dtype=bf16)
    bias = torch.randn(out_f, device="cuda", dtype=bf16)
    rec = {"tokens": tokens, "in": in_f, "out": out_f,
           "mask_24_along_in": is_nm(mask, 2, 4, dim=1), "mask_24_along_out": is_nm(mask, 2, 4, dim=0)}
    rec["forward"] = _rel(backend.linear(x, op, None), x.float() @ sw.float().t())
    rec["forward_bias"] = _rel(backend.linear(x, op, bias), x.float() @ sw.float().t() + bias.float())
    rec["grad_input"] = _rel(backend.grad_input(dz, op), dz.float() @ sw.float())
    rec["grad_weight_dense"] = _rel(backend.grad_weight(dz, x, False, None), dz.float().t() @ x.float())
    gens = [torch.Generator(device="cuda") for _ in range(2)]
    for g in gens:
        g.manual_seed(1234)
    dw = backend.grad_weight(dz, x, True, gens[0])
    rows = padded(tokens, bf16)
    mv = backend.mvue_tokens_major(_pad_rows(dz, rows), gens[1])  # the same draw (same seed)
    rec["grad_weight_mvue"] = _rel(dw, mv.float().t() @ _pad_rows(x, rows).float())
    rec["mvue_operand_24_along_tokens"] = is_nm(mv != 0, 2, 4, dim=0, exact=False)  # at most 2 per group
    return rec


def _layer_pair(method_factory, backend_a: str, backend_b: str, tokens: int, in_f: int, out_f: int) -> dict:
    """The same SparseLinear (same init, same mask, same MVUE seed) on two backends, bf16 autocast."""
    from sparsity_lab.layers import SparseLinear

    layers = []
    for backend in (backend_a, backend_b):
        torch.manual_seed(0)
        layers.append(SparseLinear(in_f, out_f, method=method_factory(backend), device="cuda"))
    a, b = layers
    b.mask.copy_(a.mask)  # float ties may pick another optimal pattern: compare the products
    results = []
    x0 = torch.randn(tokens, in_f, device="cuda")
    for layer in layers:
        layer.train(False)  # forward and backward, no mask refresh
        x = x0.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(x)
        out.float().square().sum().backward()
        results.append((out, x.grad, layer.weight.grad, layer.bias.grad))
    names = ("output", "grad_input", "grad_weight", "grad_bias")
    return {n: _rel_plain(ra, rb) for n, ra, rb in zip(names, results[0], results[1])}


def part_correctness(ctx: Context) -> dict:
    import sparsity_lab as sl
    from sparsity_lab.backends.cusparselt.backend import CusparseltBackend

    backend = CusparseltBackend(sweep=not ctx.args.no_sweep)
    products = [guarded(f"{t}x{i}->{o}", lambda t=t, i=i, o=o: _check_products(backend, t, i, o), ctx)
                for t, i, o in CORRECTNESS_SHAPES]
    layers = [
        guarded("STE transposable: cusparselt vs torch",
                lambda: _layer_pair(lambda b: sl.STE(transposable=True, backend=b), "cusparselt", "torch",
                                    1000, 512, 256), ctx),
        guarded("S-STE + MVUE: cusparselt vs triton (same draws)",
                lambda: _layer_pair(lambda b: sl.SSTE(transposable=True, mvue=True, backend=b), "cusparselt", "triton",
                                    1024, 512, 256), ctx),
    ]
    return {"products": products, "layers": layers, "algorithms": backend.algorithms.summary(),
            "stats": dict(backend.stats)}


# --- (b) layout of _cslt_compress ---------------------------------------------------------------------
def _int_view(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.uint8)


def _value_region(dtype: torch.dtype, rows: int, cols: int) -> dict:
    w, mask = _random_24(rows, cols, dtype, seed=rows + cols)
    c = torch._cslt_compress(w).reshape(-1)  # torch 2.11 returns it 2-D (rows, cols * 9 / 16)
    n = rows * cols
    nv = n // 2
    kept = _int_view(w)[mask]  # row-major order of the kept entries
    vals = _int_view(c)[:nv]
    return {
        "dtype": str(dtype).replace("torch.", ""), "shape": [rows, cols], "compressed_numel": c.numel(),
        "value_elems": nv, "values_rowmajor": bool(torch.equal(vals, kept)),
        "matching_positions": int((vals == kept).sum()),
        "same_values_any_order": bool(torch.equal(vals.sort().values, kept.sort().values)),
        "metadata_bytes": (c.numel() - nv) * c.element_size(), "metadata_bytes_if_2_bits_per_kept": n // 8,
    }


def _meta_bits(c: torch.Tensor, nv: int):
    import numpy as np
    c = c.reshape(-1)
    return np.unpackbits(c[nv:].contiguous().view(torch.uint8).cpu().numpy(), bitorder="little")


def _pattern_matrix(rows: int, cols: int, dtype: torch.dtype, pair: tuple[int, int]) -> torch.Tensor:
    w = torch.zeros(rows, cols // 4, 4, device="cuda")
    w[..., pair[0]] = 1.0
    w[..., pair[1]] = 2.0  # distinct kept values: the value region shows their order
    return w.reshape(rows, cols).to(dtype)


def _metadata_map(dtype: torch.dtype, rows: int, cols: int, all_patterns: bool) -> dict:
    """Which metadata bits each group owns, and the code each pattern writes there."""
    import numpy as np

    nv = rows * cols // 2
    uniform = {}
    for pair in PAIRS:
        c = torch._cslt_compress(_pattern_matrix(rows, cols, dtype, pair)).reshape(-1)
        meta = c[nv:].contiguous().view(torch.uint8).cpu().numpy()
        words = meta.view(np.uint16)
        uniform[f"{pair[0]}{pair[1]}"] = {"first_bytes_hex": meta[:16].tobytes().hex(),
                                          "all_16bit_words_equal": bool((words == words[0]).all()),
                                          "first_values": c[:8].float().tolist()}
    base_w = _pattern_matrix(rows, cols, dtype, PAIRS[0])
    base = _meta_bits(torch._cslt_compress(base_w), nv)
    scratch = torch.randn(rows * cols, device="cuda")  # disturb the allocator between the two
    again = _meta_bits(torch._cslt_compress(base_w), nv)
    del scratch
    unstable = {int(i) for i in np.nonzero(base != again)[0]}  # e.g. uninitialised padding: never a group's bit
    others = PAIRS[1:] if all_patterns else (PAIRS[-1],)
    groups = []
    for r in range(rows):
        for g in range(cols // 4):
            bits_per_pattern = {PAIRS[0]: base}
            for pair in others:  # group (r, g) alone changed to ``pair``
                w = base_w.clone()
                w[r, 4 * g:4 * g + 4] = 0
                w[r, 4 * g + pair[0]] = 1.0
                w[r, 4 * g + pair[1]] = 2.0
                bits_per_pattern[pair] = _meta_bits(torch._cslt_compress(w), nv)
            pos = sorted({int(i) for bits in bits_per_pattern.values() for i in np.nonzero(bits != base)[0]}
                         - unstable)
            codes = {f"{a}{b}": int(sum(int(bits[p]) << i for i, p in enumerate(pos)))
                     for (a, b), bits in bits_per_pattern.items()}
            groups.append({"row": r, "group": g, "bits": pos, "codes": codes})
    n_bits = [len(gr["bits"]) for gr in groups]
    contiguous = [bool(gr["bits"]) and gr["bits"][-1] - gr["bits"][0] == len(gr["bits"]) - 1 for gr in groups]
    code_sets = {json.dumps(gr["codes"], sort_keys=True) for gr in groups}
    hypothesis = {f"{i}{j}": i | (j << 2) for i, j in PAIRS}  # two 2-bit indices, low index first
    return {
        "dtype": str(dtype).replace("torch.", ""), "shape": [rows, cols], "patterns_probed": len(others) + 1,
        "uniform": uniform, "unstable_bits": len(unstable), "metadata_bits": int(base.size),
        "bits_per_group": sorted(set(n_bits)), "all_groups_contiguous": all(contiguous),
        "same_codes_in_every_group": len(code_sets) == 1,
        "codes_group0": groups[0]["codes"],
        "codes_match_i_or_j_shl_2": all_patterns and groups[0]["codes"] == hypothesis,
        "first_bit": [[groups[r * (cols // 4) + g]["bits"][0] if groups[r * (cols // 4) + g]["bits"] else -1
                       for g in range(cols // 4)] for r in range(rows)],
        "groups": groups if all_patterns else None,
    }


def part_compress_layout(ctx: Context) -> dict:
    values = [guarded(f"values {d} {r}x{c}", lambda d=d, r=r, c=c: _value_region(d, r, c), ctx)
              for d in (torch.bfloat16, torch.float16) for r, c in LAYOUT_SHAPES]
    values.append(guarded("values float8_e4m3fn 64x128", lambda: _value_region(torch.float8_e4m3fn, 64, 128), ctx))
    metadata = [guarded("metadata bf16 32x64 (all 6 patterns)",
                        lambda: _metadata_map(torch.bfloat16, 32, 64, all_patterns=True), ctx),
                guarded("metadata fp16 32x64 (all 6 patterns)",
                        lambda: _metadata_map(torch.float16, 32, 64, all_patterns=True), ctx),
                guarded("metadata bf16 64x128 (pattern 23 only)",
                        lambda: _metadata_map(torch.bfloat16, 64, 128, all_patterns=False), ctx)]
    return {"values": values, "metadata": metadata}


# --- (c) timings ---------------------------------------------------------------------------------------
def _forward_product(ctx: Context, out_f: int, in_f: int, tokens: int) -> dict:
    from sparsity_lab.backends.cusparselt.algorithms import AlgorithmCache, ProductKey
    from sparsity_lab.backends.cusparselt.ops import AlgConfig, TorchCusparseltOps

    bf16 = torch.bfloat16
    w, _ = _random_24(out_f, in_f, bf16)
    x = torch.randn(tokens, in_f, device="cuda", dtype=bf16)
    c = torch._cslt_compress(w)
    ops = TorchCusparseltOps()
    cache = AlgorithmCache(ops, sweep=not ctx.args.no_sweep)
    key = ProductKey(out_f, in_f, tokens, bf16, True, True)
    config = cache.get(key, x.device)
    alg0 = AlgConfig(0)
    rec = {"out": out_f, "in": in_f, "tokens": tokens, "algorithm": cache.choices[key].summary()}
    rec["dense_ms"] = _time_ms(lambda: F.linear(x, w), ctx)
    rec["sparse_eager_ms"] = _time_ms(lambda: ops.mm(c, x.t(), None, True, config), ctx)
    rec["sparse_alg0_ms"] = _time_ms(lambda: ops.mm(c, x.t(), None, True, alg0), ctx)
    for label, fn in (("sparse_graph_ms", lambda: ops.mm(c, x.t(), None, True, config)),
                      ("dense_graph_ms", lambda: F.linear(x, w))):
        try:
            rec[label] = _graph_ms(fn, ctx)
        except Exception as err:  # noqa: BLE001
            rec[label + "_error"] = f"{type(err).__name__}: {err}"[:500]
    try:
        from torch.sparse import to_sparse_semi_structured
        ws = to_sparse_semi_structured(w)
        rec["pytorch_semi_structured_ms"] = _time_ms(lambda: F.linear(x, ws), ctx)
    except Exception as err:  # noqa: BLE001
        rec["pytorch_semi_structured_error"] = f"{type(err).__name__}: {err}"[:500]
    for label in ("sparse_eager_ms", "sparse_alg0_ms", "sparse_graph_ms", "pytorch_semi_structured_ms"):
        if label in rec:
            rec["speedup_" + label.removesuffix("_ms")] = rec["dense_ms"] / rec[label]
    if "sparse_graph_ms" in rec and "dense_graph_ms" in rec:
        rec["speedup_graph_vs_dense_graph"] = rec["dense_graph_ms"] / rec["sparse_graph_ms"]
    return rec


def _weight_grad_product(ctx: Context, out_f: int, in_f: int, tokens: int) -> dict:
    """dW = MVUE(dZ^T) X: dense against sparse with either result layout, and what the sparse path
    pays per call besides the product (the transpose copy of MVUE(dZ) and its compression)."""
    from sparsity_lab.backends.cusparselt.algorithms import AlgorithmCache, ProductKey
    from sparsity_lab.backends.cusparselt.ops import TorchCusparseltOps

    bf16 = torch.bfloat16
    a, _ = _random_24(out_f, tokens, bf16)  # MVUE(dZ^T) (out, tokens), 2:4 along the tokens
    a_tokens_major = a.t().contiguous()  # how the MVUE kernel leaves it: (tokens, out)
    x = torch.randn(tokens, in_f, device="cuda", dtype=bf16)
    ops = TorchCusparseltOps()
    cache = AlgorithmCache(ops, sweep=not ctx.args.no_sweep)
    c = torch._cslt_compress(a)
    rec = {"out": out_f, "in": in_f, "tokens": tokens, "dense_ms": _time_ms(lambda: a_tokens_major.t() @ x, ctx),
           "transpose_copy_ms": _time_ms(lambda: a_tokens_major.t().contiguous(), ctx),
           "compress_ms": _time_ms(lambda: torch._cslt_compress(a), ctx)}
    for tr in (False, True):
        key = ProductKey(out_f, tokens, in_f, bf16, False, tr)
        config = cache.get(key, x.device)
        label = "result_transposed" if tr else "result_rowmajor"
        rec[f"sparse_{label}_ms"] = _time_ms(lambda: ops.mm(c, x, None, tr, config), ctx)
        rec[f"algorithm_{label}"] = cache.choices[key].summary()
        rec[f"speedup_product_{label}"] = rec["dense_ms"] / rec[f"sparse_{label}_ms"]
        rec[f"speedup_with_copy_and_compress_{label}"] = rec["dense_ms"] / (
            rec[f"sparse_{label}_ms"] + rec["transpose_copy_ms"] + rec["compress_ms"])
    return rec


def _train_step_ms(ctx: Context, layer, x: torch.Tensor, dz: torch.Tensor, advance: bool) -> float:
    def step():
        if advance:
            layer.advance_step()  # a new optimizer step: mask due (interval 1), operand rebuilt
        layer.weight.grad = None
        x.grad = None
        layer(x).backward(dz)
    return _time_ms(step, ctx)


def _forward_backward(ctx: Context, out_f: int, in_f: int, tokens: int) -> dict:
    import sparsity_lab as sl
    from sparsity_lab.layers import SparseLinear

    bf16 = torch.bfloat16
    x = torch.randn(tokens, in_f, device="cuda", dtype=bf16, requires_grad=True)
    dz = torch.randn(tokens, out_f, device="cuda", dtype=bf16)
    dense = torch.nn.Linear(in_f, out_f, device="cuda", dtype=bf16)
    rec = {"out": out_f, "in": in_f, "tokens": tokens, "dense_ms": _train_step_ms(ctx, dense, x, dz, False)}
    variants = (
        ("fixed_mask_operand_cached", sl.STE(transposable=True, backend="cusparselt"), False),
        ("mask_every_step", sl.STE(transposable=True, backend="cusparselt"), True),
        ("mask_every_step_mvue_sste", sl.SSTE(transposable=True, mvue=True, backend="cusparselt"), True),
    )
    for label, method, advance in variants:
        if ctx.time_left() <= 0:
            rec[label + "_skipped"] = "time budget spent"
            continue
        try:
            layer = SparseLinear(in_f, out_f, method=method, device="cuda", dtype=bf16)
            layer.attached_optimizer = True  # the probe advances steps itself
            rec[label + "_ms"] = _train_step_ms(ctx, layer, x, dz, advance)
            rec["speedup_" + label] = rec["dense_ms"] / rec[label + "_ms"]
        except Exception as err:  # noqa: BLE001
            rec[label + "_error"] = f"{type(err).__name__}: {err}"[:500]
        finally:
            layer = None
            torch.cuda.empty_cache()
    return rec


def _host_overhead(ctx: Context) -> dict:
    return _forward_product(ctx, 4096, 4096, 512)


def part_timings(ctx: Context) -> dict:
    a = ctx.args
    linears = {"up": (a.ffn, a.d_model), "down": (a.d_model, a.ffn)}
    forward = [guarded(f"forward {name}", lambda o=o, i=i: _forward_product(ctx, o, i, a.tokens), ctx)
               for name, (o, i) in linears.items()]
    weight_grad = [guarded(f"weight grad {name}", lambda o=o, i=i: _weight_grad_product(ctx, o, i, a.tokens), ctx)
                   for name, (o, i) in linears.items()]
    fwd_bwd = [guarded(f"fwd+bwd {name}", lambda o=o, i=i: _forward_backward(ctx, o, i, a.tokens), ctx)
               for name, (o, i) in linears.items()]
    small = guarded("host overhead 512 tokens x 4096 x 4096", lambda: _host_overhead(ctx), ctx)
    return {"forward_product": forward, "weight_grad_product": weight_grad, "forward_backward": fwd_bwd,
            "host_overhead": small}


# --- (d) compression speed ---------------------------------------------------------------------------
def part_compress_speed(ctx: Context) -> dict:
    src = torch.empty(64 << 20, dtype=torch.bfloat16, device="cuda")  # 128 MiB
    dst = torch.empty_like(src)
    copy_ms = _time_ms(lambda: dst.copy_(src), ctx)
    copy_gbs = 2 * src.numel() * 2 / copy_ms / 1e6
    del src, dst
    rows = []
    for r, c in COMPRESS_SHAPES:
        def one(r=r, c=c) -> dict:
            w, _ = _random_24(r, c, torch.bfloat16)
            n = r * c
            ms = _time_ms(lambda: torch._cslt_compress(w), ctx)
            moved = 2 * n + 2 * (n * 9 // 16)  # read W, write values + metadata
            floor = moved / (copy_gbs * 1e6)
            rec = {"shape": [r, c], "compress_ms": ms, "bytes_moved": moved, "floor_ms": floor,
                   "fraction_of_copy_rate": floor / ms, "input_gbs": 2 * n / ms / 1e6}
            rec["transpose_copy_ms"] = _time_ms(lambda: w.t().contiguous(), ctx)
            return rec
        rows.append(guarded(f"compress {r}x{c}", one, ctx))
    return {"copy_gbs": copy_gbs, "shapes": rows}


PART_FUNCTIONS: dict[str, Callable[[Context], dict]] = {
    "correctness": part_correctness, "compress_layout": part_compress_layout,
    "timings": part_timings, "compress_speed": part_compress_speed,
}


# --- the table ---------------------------------------------------------------------------------------
def _fmt(value, spec: str = ".3f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def table(results: dict) -> str:
    lines = []
    for name, part in results.get("parts", {}).items():
        status = part.get("status")
        lines.append(f"[{name}] {status}" + (f": {part.get('reason') or part.get('error', '')}"[:200]
                                             if status != "ok" else ""))
        if status != "ok":
            continue
        if name == "correctness":
            for p in part["products"]:
                if p["status"] != "ok":
                    lines.append(f"  {p['label']}: {p['status']} {p.get('error', p.get('reason', ''))[:150]}")
                    continue
                errs = " ".join(f"{k}={_fmt(p[k]['rel_err'], '.1e')}{'' if p[k]['within_bound'] else '(!)'}"
                                for k in ("forward", "forward_bias", "grad_input", "grad_weight_dense",
                                          "grad_weight_mvue"))
                lines.append(f"  {p['label']}: {errs}")
            for lay in part["layers"]:
                detail = " ".join(f"{k}={_fmt(lay[k], '.1e')}" for k in ("output", "grad_input", "grad_weight",
                                                                         "grad_bias") if k in lay)
                lines.append(f"  {lay['label']}: {lay['status']} {detail or lay.get('error', '')[:150]}")
            for alg in part["algorithms"]:
                lines.append(f"  alg {alg['key']}: chose {alg['chosen']} (search: {alg['searched']}), "
                             f"{alg['candidates']} tried, wrong {alg['wrong']}, raised {len(alg['raised'])}")
        elif name == "compress_layout":
            for v in part["values"]:
                if v["status"] == "ok":
                    lines.append(f"  {v['label']}: values row-major {v['values_rowmajor']} "
                                 f"({v['matching_positions']}/{v['value_elems']}), metadata {v['metadata_bytes']} B "
                                 f"(2 bits/kept: {v['metadata_bytes_if_2_bits_per_kept']} B)")
                else:
                    lines.append(f"  {v['label']}: {v['status']} {v.get('error', '')[:150]}")
            for m in part["metadata"]:
                if m["status"] == "ok":
                    lines.append(f"  {m['label']}: bits/group {m['bits_per_group']}, contiguous "
                                 f"{m['all_groups_contiguous']}, same codes everywhere "
                                 f"{m['same_codes_in_every_group']}, "
                                 f"codes {m['codes_group0']}")
                else:
                    lines.append(f"  {m['label']}: {m['status']} {m.get('error', '')[:150]}")
        elif name == "timings":
            for rec in part["forward_product"] + [part["host_overhead"]]:
                if rec["status"] != "ok":
                    lines.append(f"  {rec['label']}: {rec['status']} {rec.get('error', '')[:150]}")
                    continue
                lines.append(f"  {rec['label']}: dense {_fmt(rec['dense_ms'])} ms | sparse eager "
                             f"{_fmt(rec.get('speedup_sparse_eager'), '.2f')}x "
                             f"alg0 {_fmt(rec.get('speedup_sparse_alg0'), '.2f')}x "
                             f"graph {_fmt(rec.get('speedup_sparse_graph'), '.2f')}x (vs dense graph "
                             f"{_fmt(rec.get('speedup_graph_vs_dense_graph'), '.2f')}x) pytorch "
                             f"{_fmt(rec.get('speedup_pytorch_semi_structured'), '.2f')}x")
            for rec in part["weight_grad_product"]:
                if rec["status"] != "ok":
                    lines.append(f"  {rec['label']}: {rec['status']} {rec.get('error', '')[:150]}")
                    continue
                lines.append(f"  {rec['label']}: dense {_fmt(rec['dense_ms'])} ms | product "
                             f"{_fmt(rec.get('speedup_product_result_rowmajor'), '.2f')}x (result^T "
                             f"{_fmt(rec.get('speedup_product_result_transposed'), '.2f')}x); with copy + compress "
                             f"{_fmt(rec.get('speedup_with_copy_and_compress_result_rowmajor'), '.2f')}x "
                             f"(compress {_fmt(rec['compress_ms'])} ms)")
            for rec in part["forward_backward"]:
                if rec["status"] != "ok":
                    lines.append(f"  {rec['label']}: {rec['status']} {rec.get('error', '')[:150]}")
                    continue
                lines.append(f"  {rec['label']}: dense {_fmt(rec['dense_ms'])} ms | " + " ".join(
                    f"{k}={_fmt(rec.get('speedup_' + k), '.2f')}x" for k in
                    ("fixed_mask_operand_cached", "mask_every_step", "mask_every_step_mvue_sste")))
        elif name == "compress_speed":
            lines.append(f"  copy rate {_fmt(part['copy_gbs'], '.0f')} GB/s")
            for rec in part["shapes"]:
                if rec["status"] == "ok":
                    lines.append(f"  {rec['label']}: {_fmt(rec['compress_ms'])} ms, floor {_fmt(rec['floor_ms'])} ms, "
                                 f"{_fmt(rec['fraction_of_copy_rate'], '.2f')} of copy rate, "
                                 f"input {_fmt(rec['input_gbs'], '.0f')} GB/s; transpose copy "
                                 f"{_fmt(rec['transpose_copy_ms'])} ms")
                else:
                    lines.append(f"  {rec['label']}: {rec['status']} {rec.get('error', '')[:150]}")
    return "\n".join(lines)


def write_json(path: Path, results: dict, command: str | None = None) -> Path:
    from sparsity_lab.provenance import provenance

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"provenance": provenance(command), **results}, indent=2, default=str) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    path = out_path(args.out)
    results: dict = {"args": {k: v for k, v in vars(args).items()}, "plan": plan(args)}
    status = 0
    if args.dry_run:
        results["parts"] = {name: {"status": "skipped", "reason": "--dry-run (no GPU work)"} for name in args.parts}
    elif not torch.cuda.is_available():
        results["error"] = "the probe needs a CUDA GPU (torch.cuda.is_available() is False); use --dry-run here"
        results["parts"] = {name: {"status": "skipped", "reason": results["error"]} for name in args.parts}
        status = 2
    else:
        ctx = Context(args)
        results["parts"] = run_parts({name: PART_FUNCTIONS[name] for name in args.parts}, ctx)
        results["elapsed_s"] = time.monotonic() - ctx.start
    write_json(path, results)
    print(table(results))
    print(f"wrote {path}")
    if status:
        print(results["error"], file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
