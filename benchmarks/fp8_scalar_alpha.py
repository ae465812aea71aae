"""Does cuSPARSELt apply a scalar alpha to an FP8 (E4M3) 2:4 product on this GPU, and what does it save?

    python -m benchmarks fp8-scalar-alpha            # writes results/fp8_scalar_alpha_<gpu>.json

A per-tensor FP8 product is D = (s_a s_b) (q(A) q(B)). cuSPARSELt on the H100 refuses the alpha *vector* for
E4M3 and ignores the A/B scale pointers, so training multiplies D by s_a s_b in a pass of its own
("multiply_after"). This probe asks the cheaper question: with the scalar alpha set to s_a s_b (read from the
host at the call), is the product scaled, and how fast is it against the product with its pass? Per shape
(tokens, in -> out, the forward product q(W) q(X)^T): the fastest correct algorithm of "multiply_after" is
searched, then "host_alpha" runs with the same algorithm and layout, each checked against the float32 product of
the dequantized operands and timed (median of CUDA-event times, host sync of the scale excluded: the scale is a
host number before the timed calls), beside dense FP8 (``torch._scaled_mm``) and dense bf16.
"""
from __future__ import annotations

import argparse
import ctypes

import torch
import torch.nn.functional as F

from benchmarks.fp8_sparse import _ms
from sparsity_lab.lab.arguments import output_folder

SHAPES = ((16384, 4096, 16384), (16384, 16384, 4096), (4096, 4096, 16384))


def measure(tokens: int, d_in: int, d_out: int) -> dict:
    from sparsity_lab.backends.cusparselt.fp8_algorithms import FP8SparseProducts
    from sparsity_lab.kernels import compress24

    products = FP8SparseProducts(modes=("multiply_after",))
    ops = products.ops
    gen = torch.Generator(device="cuda").manual_seed(0)
    m, k, n = d_out, d_in, tokens
    w = torch.randn(m, k, device="cuda", generator=gen)
    keep = torch.rand(m, k // 4, 4, device="cuda", generator=gen).argsort(-1)[..., :2]
    mask = torch.zeros(m, k // 4, 4, device="cuda", dtype=torch.bool).scatter_(-1, keep, True).reshape(m, k)
    q_w = (w * mask * 50).to(torch.float8_e4m3fn)
    q_x = (torch.randn(n, k, device="cuda", generator=gen) * 50).to(torch.float8_e4m3fn)
    s_w, s_x = torch.tensor(0.013, device="cuda"), torch.tensor(0.021, device="cuda")
    comp = compress24(q_w)
    ref = ((q_w.float() @ q_x.float().t()) * (s_w * s_x)).t()  # (tokens, out): transpose_result
    choice = products.choose(m, k, n, [(True, True)], torch.device("cuda"))
    b = q_x.t()
    row = {"tokens": tokens, "in": d_in, "out": d_out, "algorithm": choice.config.describe()}
    for mode in ("multiply_after", "host_alpha"):
        try:
            out = ops.mm(comp, b, s_w, s_x, True, choice.config, mode)
        except Exception as err:  # a refusal is the finding
            row[mode] = {"error": f"{type(err).__name__}: {err}"[:200]}
            continue
        rel = float((out.float() - ref).norm() / ref.norm())
        unscaled = float((out.float() - ref / (s_w * s_x)).norm() / (ref / (s_w * s_x)).norm())
        entry = {"rel_err": rel, "rel_err_if_unscaled": unscaled, "scaled": rel < 1e-2}
        if mode == "host_alpha":  # time without the .item() sync: the scale as a host number, as a lagged recipe holds it
            alpha = ctypes.c_float(float((s_w * s_x).item()))
            plan = ops.plan(m, k, n, True, True, choice.config, mode, b.device)

            def call():
                out_ = torch.empty((n, m), dtype=torch.bfloat16, device="cuda")
                ws = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device="cuda") if plan.workspace_bytes else None
                from sparsity_lab.backends.cusparselt.direct import _raw_stream
                stream = ctypes.c_void_p(_raw_stream(b.device.index))
                ops.lib.check(ops.lib.cusparseLtMatmul(ops.handle.ptr, plan.plan.ptr, ctypes.byref(alpha), comp.data_ptr(),
                                                       b.data_ptr(), ops._beta_p, out_.data_ptr(), out_.data_ptr(),
                                                       ws.data_ptr() if ws is not None else None, ctypes.byref(stream), 1),
                              "cusparseLtMatmul")
            entry["ms"] = _ms(call)
        else:
            entry["ms"] = _ms(lambda: ops.mm(comp, b, s_w, s_x, True, choice.config, mode))
        row[mode] = entry
    x_bf, w_bf = (q_x.float() * s_x).to(torch.bfloat16), (q_w.float() * s_w).to(torch.bfloat16)
    row["dense_bf16_ms"] = _ms(lambda: F.linear(x_bf, w_bf))
    row["dense_fp8_ms"] = dense = _ms(lambda: torch._scaled_mm(q_x, q_w.t(), scale_a=s_x, scale_b=s_w,
                                                              out_dtype=torch.bfloat16))
    row["dense_fp8_tflops"] = 2 * m * k * n / dense / 1e9
    for mode in ("multiply_after", "host_alpha"):
        if "ms" in row.get(mode, {}):
            row[mode]["speedup_vs_dense_fp8"] = dense / row[mode]["ms"]
    return row


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out-dir", type=output_folder, default=None, help="folder for the JSON (default results/)")


def run(args: argparse.Namespace) -> int:
    from sparsity_lab.provenance import write_result

    if not torch.cuda.is_available():
        print("fp8-scalar-alpha needs a CUDA GPU with cuSPARSELt")
        return 2
    rows = []
    for shape in SHAPES:
        try:
            rows.append(measure(*shape))
        except Exception as err:
            rows.append({"shape": shape, "error": f"{type(err).__name__}: {err}"[:300]})
        print(rows[-1])
    gpu = torch.cuda.get_device_name().split()[1].lower()
    path = write_result(f"fp8_scalar_alpha_{gpu}", {"rows": rows}, directory=args.out_dir)
    print(f"wrote {path}")
    return 0
