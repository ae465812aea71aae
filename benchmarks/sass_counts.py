"""Where a kernel's instructions go, counted offline: the step's 2:4 kernels compiled for sm_90, no GPU needed.

Nsight Compute measured the step's 2:4 kernels as instruction-bound (86-92 % SM throughput, 27-34 % DRAM,
``results/ncu_step_kernels_h200.json``), so their speed follows the instructions each thread issues. These
kernels have no loops: the SASS a thread runs is the SASS of the kernel, once. So counting the disassembly's
instructions per source line (the cubin's line table) tells, before any GPU run, how many instructions each
helper costs per element, and whether a change removed some.

``python -m benchmarks.sass_counts`` compiles kernels 10, 11, 21, 23 and 24 as the lab GPT's bf16 step launches
them (S-STE, bf16 operands, their default warps and blocks), the E4M3 forms of kernels 19 and 23 (16 groups a
program, with the amax, as the FP8 backends launch them) and the optimizer's kernel 20 (alone and with the
masked decay), with Triton's sm_90 compiler, disassembles them
with the ``nvdisasm`` Triton ships, and prints per kernel: instructions per thread, per element, the barriers and
shared-memory accesses (values moved between threads), the opcode mix
(the ALU pipe runs at half the FP32 rate on Hopper: compares, selects and logic cost twice an add) and the
count of every ``@triton.jit`` helper, its inlined callees included in the callee's own count. ``--json``
writes ``results/sass_counts_<triton version>.json``.

These are static counts for one Triton version; the GPU machine's Triton may schedule differently. They rank
changes, the GPU's timings decide them.
"""
from __future__ import annotations

import argparse
import collections
import importlib
import inspect
import json
import re
import subprocess
import tempfile
from pathlib import Path

# Hopper's ALU pipe (integer and logic ops, float compares, selects, min/max) issues a warp every 2 cycles
ALU_OPS = {"SEL", "FSEL", "FSETP", "ISETP", "LOP3", "FMNMX", "IMNMX", "PLOP3", "P2R", "R2P", "SHF", "PRMT",
           "HSETP2", "SGXT", "VIMNMX", "BMSK", "FLO", "POPC", "BREV"}
FMA_OPS = {"FADD", "FMUL", "FFMA", "IMAD", "HFMA2", "HADD2", "HMUL2", "IADD3", "LEA", "VIADD"}

_LINE = re.compile(r'\s*//## File "(.+?)", line (\d+)')
_INSTR = re.compile(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def _default_warps(launcher) -> int:
    return inspect.signature(launcher).parameters["num_warps"].default


def _kernel_specs() -> dict:
    """name -> (jit function, signature, constexprs, num_warps, elements per program): the step's launches."""
    import triton.language as tl

    m10 = importlib.import_module("sparsity_lab.kernels.mvue_compress24")
    k10 = m10._mvue_compress24_kernel
    k11 = importlib.import_module("sparsity_lab.kernels.prepare24")
    k21 = importlib.import_module("sparsity_lab.kernels.refresh24")
    k23 = importlib.import_module("sparsity_lab.kernels.mvue_compress24_cutlass")._mvue_compress24_cutlass_kernel
    k24 = importlib.import_module("sparsity_lab.kernels.refresh24_cutlass")._refresh24_cutlass_kernel
    fp8_constexprs = importlib.import_module("sparsity_lab.kernels.prepare24_cutlass").fp8_constexprs
    fp8_off, fp8_on = fp8_constexprs(False), fp8_constexprs(True)
    mvue_fp8_off = dict(FP8=False, WRITE_VALUES=True, WRITE_AMAX=False, FMAX=448.0, MBITS=3, EMIN=-6)
    sig10 = dict(dz_ptr="*bf16", vals_ptr="*i16", meta_ptr="*u8", n_cols="i32", quads_per_row="i32",
                 half_cols="i32", seed="*i64", col_tiles="i32", inv_scale_ptr="*fp32", partial_ptr="*fp32")
    sig11 = dict(w_ptr="*bf16", mask_ptr="*u8", beta_ptr="*fp32", vals_ptr="*i16", meta_ptr="*u8", vals_t_ptr="*i16",
                 meta_t_ptr="*u8", inv_scale_ptr="*u8", partial_ptr="*u8", stride_r="i32", stride_c="i32",
                 n_rows="i32", n_cols="i32")
    sig21 = dict(w_ptr="*bf16", mask_ptr="*i32", beta_ptr="*fp32", flips_ptr="*i64", vals_ptr="*i16", meta_ptr="*u8",
                 vals_t_ptr="*i16", meta_t_ptr="*u8", inv_scale_ptr="*fp32", partial_ptr="*fp32", stride_r="i32",
                 stride_c="i32", n_rows="i32", n_cols="i32")
    fp8_21 = dict(fp8_on, TILE_COLS=64)
    sig23 = dict(dz_ptr="*bf16", vals_ptr="*i16", meta_ptr="*u8", inv_scale_ptr="*fp32", partial_ptr="*fp32",
                 n_tokens="i32", n_cols="i32", k_tokens="i32", seed="*i64")
    sig24 = dict(w_ptr="*fp32", mask_ptr="*i32", beta_ptr="*fp32", flips_ptr="*i64", vals_ptr="*i16", meta_ptr="*u8",
                 vals_t_ptr="*i16", meta_t_ptr="*u8", inv_scale_ptr="*fp32", partial_ptr="*fp32", stride_r="i32",
                 stride_c="i32", n_rows="i32", n_cols="i32")
    k20 = importlib.import_module("sparsity_lab.kernels.adamw_master")
    sig20 = dict(g_ptr="*bf16", p_ptr="*fp32", m_ptr="*fp32", v_ptr="*fp32", low_ptr="*i16", n="i32", keep="fp32",
                 beta1="fp32", one_minus_beta1="fp32", beta2="fp32", one_minus_beta2="fp32", step_size="fp32",
                 bc2_sqrt="fp32", eps="fp32", mask_ptr="*u8", decay="fp32")
    k26 = importlib.import_module("sparsity_lab.kernels.adamw_prepare24")
    sig26 = dict(g_ptr="*bf16", p_ptr="*fp32", m_ptr="*fp32", v_ptr="*fp32", low_ptr="*i16", mask_ptr="*u8",
                 beta_ptr="*fp32", vals_ptr="*i16", meta_ptr="*u8", vals_t_ptr="*i16", meta_t_ptr="*u8", n_rows="i32",
                 n_cols="i32", keep="fp32", beta1="fp32", one_minus_beta1="fp32", beta2="fp32", one_minus_beta2="fp32",
                 step_size="fp32", bc2_sqrt="fp32", eps="fp32", decay="fp32")
    bf16 = tl.bfloat16
    return {
        "20 adamw_master": (k20._adamw_master_kernel, sig20, dict(BLOCK=k20.DEFAULT_BLOCK, MASKED_DECAY=False),
                            k20.DEFAULT_WARPS, k20.DEFAULT_BLOCK),
        "20 adamw_master masked decay": (k20._adamw_master_kernel, sig20, dict(BLOCK=k20.DEFAULT_BLOCK, MASKED_DECAY=True),
                                         k20.DEFAULT_WARPS, k20.DEFAULT_BLOCK),
        "26 adamw_prepare24": (k26._adamw_prepare24_kernel, sig26,
                               dict(SOFT=True, MASKED_DECAY=False, SIGN_OFF=0x7FFF, TILE_COLS=32), k26.DEFAULT_WARPS,
                               64 * 64),
        "10 mvue_compress24": (k10, sig10, dict(BLOCK_G=32, SEED_PTR=True, **mvue_fp8_off),
                               _default_warps(m10.mvue_compress24), 64 * 4 * 32),
        "11 prepare24": (k11._prepare24_kernel, sig11, dict(
            SOFT=True, WRITE_W=True, WRITE_T=True, OUT_DTYPE=bf16, stride_c=1, FP8=False, WRITE_AMAX=False,
            FMAX=448.0, MBITS=3, EMIN=-6, SIGN_OFF=0x7FFF, TILE_COLS=32), _default_warps(k11.prepare24), 64 * 64),
        "21 refresh24": (k21._refresh24_kernel, sig21, dict(SOFT=True, COUNT=True, WRITE_W=True, WRITE_T=True,
                                                            OUT_DTYPE=bf16, stride_c=1, **fp8_off, TILE_COLS=32),
                         k21.DEFAULT_WARPS, 64 * 64),
        "21 refresh24_fp8": (k21._refresh24_kernel, dict(sig21, vals_ptr="*u8", vals_t_ptr="*u8"), dict(
            SOFT=True, COUNT=True, WRITE_W=True, WRITE_T=True, OUT_DTYPE=bf16, stride_c=1, **fp8_21),
            k21.DEFAULT_WARPS, 64 * 64),
        "23 mvue_compress24_cutlass": (k23, sig23, dict(BLOCK_G=32, SEED_PTR=True, SIGN_OFF=0x7FFF, **mvue_fp8_off),
                                       4, 64 * 4 * 32),
        "19 mvue_compress24_fp8": (k10, dict(sig10, vals_ptr="*u8"), dict(
            BLOCK_G=16, SEED_PTR=True, **dict(mvue_fp8_off, FP8=True, WRITE_AMAX=True)), 4, 64 * 4 * 16),
        "23 mvue_compress24_cutlass_fp8": (k23, dict(sig23, vals_ptr="*u8"), dict(
            BLOCK_G=16, SEED_PTR=True, SIGN_OFF=0x7F, **dict(mvue_fp8_off, FP8=True, WRITE_AMAX=True)), 4,
            64 * 4 * 16),
        "24 refresh24_cutlass": (k24, sig24, dict(SOFT=True, COUNT=True, WRITE_W=True, WRITE_T=True, OUT_DTYPE=bf16,
                                                  EDGE=False, stride_c=1, **fp8_off), 4, 64 * 64),
        "24 refresh24_cutlass_fp8": (k24, dict(sig24, vals_ptr="*u8", vals_t_ptr="*u8"), dict(
            SOFT=True, COUNT=True, WRITE_W=True, WRITE_T=True, OUT_DTYPE=bf16, EDGE=False, stride_c=1,
            **fp8_on), 4, 64 * 64),
    }


def compile_sm90(fn, signature: dict, constexprs: dict, num_warps: int) -> bytes:
    """The sm_90 cubin of a @triton.jit function, as the JIT builds it for whole tiles (int32 sizes and pointers
    divisible by 16), compiled here without a GPU."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    params = list(inspect.signature(fn.fn).parameters)
    full = {p: ("constexpr" if p in constexprs else signature[p]) for p in params if p in signature or p in constexprs}
    attrs = {(params.index(p),): [["tt.divisibility", 16]] for p, kind in full.items() if kind != "constexpr"}
    compiled = triton.compile(ASTSource(fn=fn, signature=full, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    return compiled.asm["cubin"]


def nvdisasm() -> Path:
    """Triton's bundled nvdisasm."""
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    if not path.exists():
        raise FileNotFoundError(f"nvdisasm not found at {path}: this Triton ships no NVIDIA tools")
    return path


def count_lines(sass: str) -> collections.Counter:
    """{(file name, line, opcode): count} from ``nvdisasm -g`` output (the line table as comments)."""
    counts: collections.Counter = collections.Counter()
    where = ("?", 0)
    for text in sass.splitlines():
        m = _LINE.match(text)
        if m:
            where = (Path(m.group(1)).name, int(m.group(2)))
            continue
        m = _INSTR.match(text)
        if m and m.group(1) != "NOP":
            counts[(*where, m.group(1))] += 1
    return counts


def helper_ranges(modules) -> list[tuple[str, int, int, str]]:
    """(file name, first line, last line, function name) of every @triton.jit function in the modules."""
    out = []
    for mod in modules:
        for name, obj in vars(mod).items():
            fn = getattr(obj, "fn", None)
            if fn is None or not inspect.isfunction(fn) or fn.__module__ != mod.__name__:
                continue
            lines, first = inspect.getsourcelines(fn)
            out.append((Path(inspect.getsourcefile(fn)).name, first, first + len(lines) - 1, name))
    return out


def attribute(counts: collections.Counter, ranges) -> dict:
    """Instructions per helper: each line goes to the innermost (shortest) jit function containing it; lines in
    no project function (Triton's own library, e.g. Philox) keep their file name."""
    per: collections.Counter = collections.Counter()
    for (fname, line, _op), n in counts.items():
        inside = [(last - first, name) for f, first, last, name in ranges if f == fname and first <= line <= last]
        per[min(inside)[1] if inside else fname] += n
    return dict(per.most_common())


def kernel_report(name: str, spec, ranges) -> dict:
    fn, sig, constexprs, warps, elements = spec
    cubin = compile_sm90(fn, sig, constexprs, warps)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([str(nvdisasm()), "-g", "-c", f.name], check=True, capture_output=True, text=True).stdout
    counts = count_lines(sass)
    ops: collections.Counter = collections.Counter()
    for (_f, _l, op), n in counts.items():
        ops[op] += n
    total = sum(ops.values())
    alu = sum(n for op, n in ops.items() if op in ALU_OPS)
    fma = sum(n for op, n in ops.items() if op in FMA_OPS)
    per_thread = None if elements is None else elements / (32 * warps)
    return {"kernel": name, "num_warps": warps, "constexprs": {k: str(v) for k, v in constexprs.items()},
            "instructions_per_thread": total, "elements_per_thread": per_thread,
            "instructions_per_element": None if per_thread is None else round(total / per_thread, 1),
            "alu_pipe": alu, "fma_pipe": fma, "other": total - alu - fma,
            "alu_cycles_per_element": None if per_thread is None else round(2 * alu / per_thread, 1),
            # values moved between threads: barriers and shared-memory accesses (a layout conversion, a transpose)
            "barriers": ops["BAR"], "shared_memory": ops["LDS"] + ops["STS"] + ops["LDSM"] + ops["STSM"],
            "helpers": attribute(counts, ranges), "opcodes": dict(ops.most_common())}


def measure(only: list[str] | None = None) -> dict:
    import os

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("sass_counts compiles the kernels for sm_90: unset TRITON_INTERPRET (the interpreter's "
                           "kernels cannot be compiled)")
    import triton

    from sparsity_lab import kernels as package  # noqa: F401  (kernels import their helpers)
    specs = _kernel_specs()
    modules = [importlib.import_module(f"sparsity_lab.kernels.{p.stem}")
               for p in sorted(Path(package.__file__).parent.glob("*.py")) if p.stem != "__init__"]
    ranges = helper_ranges(modules)
    names = [n for n in specs if not only or any(n.startswith(o) for o in only)]
    if not names:
        raise ValueError(f"--kernels {only} matches none of {list(specs)}")
    return {"triton": triton.__version__, "target": "sm_90 (compiled offline)",
            "kernels": [kernel_report(n, specs[n], ranges) for n in names]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernels", nargs="*", help="kernel number prefixes to count (default: all), e.g. 10 21")
    p.add_argument("--json", action="store_true", help="write results/sass_counts_<triton version>.json")
    p.add_argument("--out-dir", default="results")
    args = p.parse_args(argv)
    result = measure(args.kernels)
    for k in result["kernels"]:
        per_el = k["instructions_per_element"]
        print(f"kernel {k['kernel']}: {k['instructions_per_thread']} instructions a thread"
              + (f", {per_el} an element, ALU-pipe cycles {k['alu_cycles_per_element']} an element" if per_el else "")
              + f" (ALU {k['alu_pipe']}, FMA {k['fma_pipe']}, other {k['other']}; {k['barriers']} barriers,"
              f" {k['shared_memory']} shared-memory accesses)")
        for helper, n in list(k["helpers"].items())[:8]:
            print(f"    {n:5d}  {helper}")
    if args.json:
        from sparsity_lab.provenance import provenance

        import sys

        command = " ".join(["python -m benchmarks.sass_counts", *(argv or sys.argv[1:])])
        result["provenance"] = provenance(command=command)
        out = Path(args.out_dir) / f"sass_counts_triton{result['triton']}.json"
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
