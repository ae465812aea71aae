"""CUTLASS's SM90 2:4 GEMMs against cuBLAS and cuSPARSELt, bf16 and FP8 (E4M3), one product at a time.

``python -m benchmarks cutlass`` writes ``results/cutlass_<gpu>.json`` (e.g. ``cutlass_h200.json``).
Per shape (m, n, k) the product D (m, n) = A (m, k) B (k, n) with A 2:4 along k, as a layer's forward
runs it (m = out features, n = tokens, k = in features; the FFN's other products have the same shapes
with the roles exchanged), timed side by side in one run, each replayed from a CUDA graph (kernel time,
as a graphed training step runs it):

    bf16   cublas_bf16        dense ``F.linear`` of the masked weight (cuBLAS)
           cusparselt_bf16    the "cusparselt" backend's forward (cuSPARSELt, its algorithm search)
           cutlass_bf16[cfg]  ``ops.mm`` for every built config (tile, cluster, schedule)
    E4M3   scaled_mm_fp8      dense ``torch._scaled_mm`` with per-tensor scales
           cusparselt_fp8     cuSPARSELt's FP8 2:4 product as "cusparselt_fp8" runs it (scales by the pass
                              after it), and with the host alpha where cuSPARSELt honours one
           cutlass_fp8[cfg]   ``ops.mm`` with the two scales read from device memory in the epilogue

Every product is checked against the float32 product of the same operands (``rel_err``). TFLOP/s count
the dense-equivalent 2 m n k for every variant; each 2:4 variant's ratio is taken against the dense
of its kind (bf16: cuBLAS; FP8: ``_scaled_mm``) measured in the same run, with that dense's TFLOP/s
beside it, and checked against the start-of-run matmul rate (``conditions.baseline_check``). The
weight gradient's layouts (bf16 B N-major, FP8 D row-major) are timed with every config built for them.
"""
from __future__ import annotations

import re
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = ((16384, 16384, 4096), (4096, 16384, 16384), (16384, 4096, 16384), (8192, 8192, 8192), (4096, 4096, 1024))


def add_arguments(parser) -> None:
    from sparsity_lab.lab.arguments import output_folder, positive_float, positive_int
    parser.add_argument("--out-dir", type=output_folder, default="results")
    parser.add_argument("--name", default=None, help="result name (default cutlass_<gpu>)")
    parser.add_argument("--shapes", default=";".join(",".join(map(str, s)) for s in SHAPES),
                        help="m,n,k;m,n,k;... (A is m x k, 2:4 along k)")
    parser.add_argument("--budget-s", type=positive_float, default=200.0, help="no new shape starts after this many seconds")
    parser.add_argument("--reps", type=positive_int, default=10, help="calls captured per CUDA graph")
    parser.add_argument("--candidates", nargs="+", default=None, metavar="VARIANT",
                        help="time these variants (e.g. bf16.tc.256x128x128.2x1.coop) instead of the shipped table: "
                             "built into a separate library first; the ones that do not compile are recorded")


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for part in filter(None, text.split(";")):
        values = tuple(int(v) for v in part.split(","))
        if len(values) != 3 or min(values) <= 0:
            raise ValueError(f"a shape is m,n,k with positive sizes, got {part!r}")
        shapes.append(values)
    return shapes


def compile_error_line(stderr: str) -> str:
    """The compiler's first ``error:`` line (nvcc ends with a count of errors, which says nothing), else its last."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    if errors:
        return errors[0][:300]
    return lines[-1][:300] if lines else "no compiler output"


def check_arguments(args) -> None:
    parse_shapes(args.shapes)
    if args.candidates:
        from sparsity_lab.backends.cutlass.build import variant_row
        if len(set(args.candidates)) != len(args.candidates):
            raise ValueError(f"--candidates: each variant once, got {args.candidates}")
        for name in args.candidates:
            try:
                variant_row(0, name)
            except ValueError as err:
                raise ValueError(f"--candidates: {err}") from None


def gpu_tag(name: str) -> str:
    """'NVIDIA H200' -> 'h200' (the result file's suffix)."""
    found = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", name)
    return (found.group(1) if found else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")).lower()


def tflops(m: int, n: int, k: int, ms: float | None) -> float | None:
    return None if not ms else 2.0 * m * n * k / (ms * 1e-3) / 1e12


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def _time(fn, reps: int) -> tuple[float, str]:
    """(ms per call, how): replayed from a CUDA graph, or back-to-back eager calls where capture fails."""
    from sparsity_lab.backends.cusparselt.measure import graph_time_ms
    try:
        return graph_time_ms(fn, reps=reps, warmup=2), "graph"
    except Exception:  # noqa: BLE001 - a product that cannot be captured is timed eagerly, and says so
        torch.cuda.synchronize()
        from benchmarks.conditions import cuda_median_ms
        return cuda_median_ms(fn, reps=20, warmup=3), "eager"


def _entry(fn, ref: torch.Tensor, m: int, n: int, k: int, reps: int) -> dict:
    try:
        out = fn()
        torch.cuda.synchronize()
        row = {"rel_err": _rel(out, ref)}
        del out
        row["ms"], row["timing"] = _time(fn, reps)
        row["tflops"] = tflops(m, n, k, row["ms"])
        return row
    except Exception as err:  # noqa: BLE001 - recorded per variant, the others go on
        return {"error": f"{type(err).__name__}: {err}"[:400]}


def measure_shape(m: int, n: int, k: int, reps: int) -> dict:
    from sparsity_lab.backends import get_backend
    from sparsity_lab.backends.cusparselt.fp8_algorithms import FP8SparseProducts
    from sparsity_lab.backends.cutlass import ops
    from sparsity_lab.kernels import compress24
    from sparsity_lab.masks import nm_mask
    from sparsity_lab.references.fp8 import quantize_fp8

    gen = torch.Generator(device="cuda").manual_seed(m + 3 * n + 7 * k)
    w = torch.randn(m, k, device="cuda", generator=gen) * 0.02
    sw = w * nm_mask(w, 2, 4)  # 2:4 along k (a transposable mask is not needed for one product)
    x = torch.randn(n, k, device="cuda", generator=gen)
    row: dict = {"m": m, "n": n, "k": k, "bf16": {}, "fp8": {}}

    # --- bf16 -------------------------------------------------------------------------------------------
    sw_bf, x_bf = sw.to(torch.bfloat16), x.to(torch.bfloat16)
    ref = x_bf.float() @ sw_bf.float().t()  # (n, m): D^T, the layout the forward returns
    bf = row["bf16"]
    bf["cublas_bf16"] = _entry(lambda: F.linear(x_bf, sw_bf), ref, m, n, k, reps)
    try:
        cslt = get_backend("cusparselt")
        operand = cslt.prepare(sw_bf)
        bf["cusparselt_bf16"] = _entry(lambda: cslt.linear(x_bf, operand, None), ref, m, n, k, reps)
    except Exception as err:  # noqa: BLE001
        bf["cusparselt_bf16"] = {"error": f"{type(err).__name__}: {err}"[:400]}
    comp = ops.compress(sw_bf)
    for config in ops.configs(torch.bfloat16, "k", "col"):
        bf[f"cutlass_bf16[{config}]"] = _entry(lambda c=config: ops.mm(comp, x_bf, "k", "col", config=c),
                                               ref, m, n, k, reps)
    x_kn = x_bf.t().contiguous()  # (k, n): B N-major, the weight gradient's layout (X as it is)
    for config in ops.configs(torch.bfloat16, "n", "row"):
        bf[f"cutlass_bf16_b_nmajor_d_row[{config}]"] = _entry(
            lambda c=config: ops.mm(comp, x_kn, "n", "row", config=c), ref.t(), m, n, k, reps)
    del ref

    # --- FP8 (E4M3) -------------------------------------------------------------------------------------
    q_w, s_w = quantize_fp8(sw, "e4m3")
    q_x, s_x = quantize_fp8(x, "e4m3")
    s_w, s_x = s_w.float().reshape(()), s_x.float().reshape(())
    ref = (q_x.float() @ q_w.float().t()) * (s_x * s_w)
    f8 = row["fp8"]
    f8["scaled_mm_fp8"] = _entry(lambda: torch._scaled_mm(q_x, q_w.t(), scale_a=s_x, scale_b=s_w,
                                                          out_dtype=torch.bfloat16), ref, m, n, k, reps)
    try:
        sparse = FP8SparseProducts()
        choice = sparse.choose(m, k, n, [(True, True)], x.device)
        comp_c = compress24(q_w)
        f8["cusparselt_fp8"] = _entry(lambda: sparse.mm(comp_c, q_x.t(), s_w, s_x, choice), ref, m, n, k, reps)
        f8["cusparselt_fp8"]["scale_mode"] = choice.mode
        if choice.host_alpha_ok:
            alpha = float((s_w * s_x).item())
            f8["cusparselt_fp8_host_alpha"] = _entry(lambda: sparse.mm(comp_c, q_x.t(), s_w, s_x, choice, alpha=alpha),
                                                     ref, m, n, k, reps)
    except Exception as err:  # noqa: BLE001
        f8["cusparselt_fp8"] = {"error": f"{type(err).__name__}: {err}"[:400]}
    comp8 = ops.compress(q_w)
    s_w1, s_x1 = s_w.reshape(1), s_x.reshape(1)
    for config in ops.configs(torch.float8_e4m3fn, "k", "col"):
        f8[f"cutlass_fp8[{config}]"] = _entry(
            lambda c=config: ops.mm(comp8, q_x, "k", "col", s_w1, s_x1, config=c), ref, m, n, k, reps)
    for config in ops.configs(torch.float8_e4m3fn, "k", "row"):
        f8[f"cutlass_fp8_d_row[{config}]"] = _entry(
            lambda c=config: ops.mm(comp8, q_x, "k", "row", s_w1, s_x1, config=c), ref.t(), m, n, k, reps)
    del ref
    _ratios(row)
    return row


def _ratios(row: dict) -> None:
    """Each variant's speed-up against the dense of its kind (and FP8's against bf16 dense too)."""
    dense = {"bf16": row["bf16"].get("cublas_bf16", {}).get("ms"), "fp8": row["fp8"].get("scaled_mm_fp8", {}).get("ms")}
    for kind, variants in (("bf16", row["bf16"]), ("fp8", row["fp8"])):
        for entry in variants.values():
            if entry.get("ms"):
                entry["vs_dense_same_kind"] = dense[kind] / entry["ms"] if dense[kind] else None
                entry["vs_cublas_bf16"] = dense["bf16"] / entry["ms"] if dense["bf16"] else None
    for kind in ("bf16", "fp8"):
        prefix = "cutlass_bf16[" if kind == "bf16" else "cutlass_fp8["
        timed = {name: e["ms"] for name, e in row[kind].items() if name.startswith(prefix) and e.get("ms")}
        if timed:
            best = min(timed, key=timed.get)
            row[f"best_cutlass_{kind}"] = {"variant": best, "ms": timed[best],
                                           "vs_dense_same_kind": row[kind][best].get("vs_dense_same_kind")}


def _lines(row: dict) -> list[str]:
    out = [f"shape m={row['m']} n={row['n']} k={row['k']}"]
    for kind in ("bf16", "fp8"):
        for name, e in row[kind].items():
            if "error" in e:
                out.append(f"  {name:<44} ERROR {e['error'][:150]}")
                continue
            ratio = e.get("vs_dense_same_kind")
            ratio = "-" if ratio is None else f"{ratio:.2f}"
            out.append(f"  {name:<44} {e['ms']:8.3f} ms {e['tflops']:7.1f} TFLOP/s  x{ratio} vs dense {kind}"
                       f"  err {e['rel_err']:.1e}  ({e['timing']})")
    return out


def run(args) -> int:
    from benchmarks.conditions import ConditionSampler, baseline_check, format_conditions, matmul_probe
    from sparsity_lab.backends.cutlass import ops
    from sparsity_lab.provenance import write_result

    if not torch.cuda.is_available():
        print("python -m benchmarks cutlass needs a CUDA GPU (Hopper)")
        return 1
    t0 = time.perf_counter()
    name = args.name or f"cutlass_{gpu_tag(torch.cuda.get_device_name())}"
    result: dict = {"shapes": [], "errors": {}, "skipped": []}
    start = time.perf_counter()
    if args.candidates:  # a search: the candidates' own library, those that fail to compile named
        from sparsity_lab.backends.cutlass.build import candidate_library
        path, failed = candidate_library(args.candidates, log=lambda line: print(line, flush=True))
        lib = ops.use_library(path)
        result["candidates"] = {"asked": args.candidates, "failed_to_compile": failed}
        for variant, err in failed.items():
            print(f"candidate {variant} did not compile: {compile_error_line(err)}")
    else:
        lib = ops.library()  # built on first use, or found in the cache
    result["library"] = {"load_or_build_s": time.perf_counter() - start, "variants": lib.names}
    print(f"CUTLASS library ready in {result['library']['load_or_build_s']:.1f} s: {len(lib.names)} variants", flush=True)
    sampler = ConditionSampler().start()
    result["probe_start"] = matmul_probe(8192, 8192, 8192, label="start")
    print("matmul probe (bf16 8192^3):", f"{result['probe_start']['tflops']:.0f} TFLOP/s", flush=True)
    for m, n, k in parse_shapes(args.shapes):
        if time.perf_counter() - t0 > args.budget_s:
            result["skipped"].append([m, n, k])
            continue
        try:
            with sampler.section(f"{m}x{n}x{k}"):
                row = measure_shape(m, n, k, args.reps)
            dense_tf = row["bf16"].get("cublas_bf16", {}).get("tflops")
            row["baseline_check"] = baseline_check(dense_tf, result["probe_start"]["tflops"]) if (m, n, k) == (8192, 8192, 8192) else None
            result["shapes"].append(row)
            print("\n".join(_lines(row)), flush=True)
            write_result(name, result, directory=Path(args.out_dir))  # kept if a later shape is cut short
        except Exception:  # noqa: BLE001
            result["errors"][f"{m}x{n}x{k}"] = traceback.format_exc()[-2000:]
            print(f"shape {m}x{n}x{k}: ERROR", traceback.format_exc()[-800:], flush=True)
        torch.cuda.empty_cache()
    result["probe_end"] = matmul_probe(8192, 8192, 8192, label="end")
    sampler.stop()
    result["conditions"] = sampler.summary()
    print(format_conditions(result["conditions"]), flush=True)
    path = write_result(name, result, directory=Path(args.out_dir))
    print("wrote", path, f"in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0
