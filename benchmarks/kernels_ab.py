"""The step's 2:4 kernels of this tree against another tree's, timed side by side on one GPU.

A kernel change is judged by its time beside the code it replaces, measured in the same call. ``python -m
benchmarks.kernels_ab --before DIR`` times kernels 10, 11, 19, 21, 23 and 24 at the lab GPT step's FFN shapes
(dZ of 8192 tokens x 16384 and x 4096, bf16 weights 16384 x 4096 and 4096 x 16384, S-STE's scale, E4M3 with a
given scale for 19 and the FP8 forms of 21, 23 and 24, each kernel's default launch; a tree without kernel 21's
FP8 form runs the chain it replaces, kernel 21's mask-only pass and kernel 18), the FP8 casts 7 and 14
of X (8192 x 4096) and kernel 20 on a 16384 x 4096 weight, alone and with MaskedDecay's term (a tree whose
kernel 20 does not take it runs kernel 5 first), kernel 26 on that weight (a tree without it runs kernel 20 then
kernel 11), once with this tree's ``sparsity_lab`` and
once with the one under DIR (a checkout or ``git archive`` of another commit: its ``sparsity_lab/`` and
``kernels/``), alternating the trees for ``--rounds`` rounds, each tree in its own process. Each process also
hashes every kernel's outputs: the two trees must write the same bytes (a speed change that changes results is
reported as one).

It prints, per kernel and shape, both medians (the best round), after / before, and whether the bytes
agree, and writes ``<out-dir>/<name>.json`` with provenance. ``--smoke`` checks the script on a CPU through
the Triton interpreter at small shapes (the times mean nothing there).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


class _TreeFinder(importlib.abc.MetaPathFinder):
    """Imports ``sparsity_lab`` from a tree's ``sparsity_lab/`` and ``sparsity_lab.kernels`` from its ``kernels/``
    (the layout the package's build maps), ahead of any installed or editable copy."""

    def __init__(self, tree: Path) -> None:
        self.roots = {"sparsity_lab.kernels": tree / "kernels", "sparsity_lab": tree / "sparsity_lab"}

    def find_spec(self, fullname, path=None, target=None):
        for package, root in self.roots.items():
            if fullname == package or fullname.startswith(package + "."):
                parts = fullname[len(package):].lstrip(".").split(".") if fullname != package else []
                base = root.joinpath(*parts)
                if (base / "__init__.py").exists():
                    return importlib.util.spec_from_file_location(fullname, base / "__init__.py",
                                                                  submodule_search_locations=[str(base)])
                if base.with_suffix(".py").exists():
                    return importlib.util.spec_from_file_location(fullname, base.with_suffix(".py"))
                return None
        return None


def _digest(*outputs) -> str:
    """A hash of the bytes of every tensor in the outputs (nested tuples walked, None skipped)."""
    import torch

    h = hashlib.sha256()
    for t in outputs:
        if isinstance(t, (tuple, list)):
            h.update(_digest(*t).encode())
        elif t is not None:
            h.update(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _cases(k, torch, device, smoke: bool) -> dict:
    """name -> (a call returning the kernel's outputs), at the step's shapes (small ones for a smoke run)."""
    tokens, hidden, d_model = (64, 128, 64) if smoke else (8192, 16384, 4096)
    gen = torch.Generator(device=device).manual_seed(0)
    beta = torch.tensor(0.9, device=device)
    seed = torch.tensor(7, dtype=torch.int64, device=device)
    cases = {}
    for out_f in (hidden, d_model):
        dz = torch.randn(tokens, out_f, device=device, dtype=torch.bfloat16, generator=gen)
        cases[f"10 mvue_compress24 dZ {tokens}x{out_f}"] = lambda dz=dz: (k.mvue_compress24(dz, seed),)
        cases[f"23 mvue_compress24_cutlass dZ {tokens}x{out_f}"] = lambda dz=dz: k.mvue_compress24_cutlass(dz, seed)
        inv_scale = (448.0 / dz.float().abs().amax()).reshape(1)
        cases[f"19 mvue_compress24_fp8 dZ {tokens}x{out_f}"] = lambda dz=dz, s=inv_scale: k.mvue_compress24_fp8(
            dz, seed, s)
        cases[f"23 mvue_compress24_cutlass_fp8 dZ {tokens}x{out_f}"] = (
            lambda dz=dz, s=inv_scale: k.mvue_compress24_cutlass_fp8(dz, seed, s))
    for shape in ((hidden, d_model), (d_model, hidden)):
        w = torch.randn(*shape, device=device, generator=gen).to(torch.bfloat16)
        mask = k.transposable_mask24(w, pruned=False)[0]
        label = f"W {shape[0]}x{shape[1]}"
        cases[f"11 prepare24 {label}"] = lambda w=w, m=mask: k.prepare24(w, m, beta)
        # the mask is rewritten in place: after the first call it is the same mask each time
        cases[f"21 refresh24 {label}"] = lambda w=w, m=mask.clone(): k.refresh24(w, m, beta)
        cases[f"24 refresh24_cutlass {label}"] = lambda w=w, m=mask.clone(): k.refresh24_cutlass(w, m, beta)
        inv_w = (448.0 / w.float().abs().amax()).reshape(1)
        cases[f"24 refresh24_cutlass_fp8 {label}"] = lambda w=w, m=mask.clone(), s=inv_w: k.refresh24_cutlass_fp8(
            w, m, beta, s)
        cases[f"21 refresh24_fp8 {label}"] = lambda w=w, m=mask.clone(), s=inv_w: _refresh24_fp8(k, w, m, beta, s)
    # the optimizer pass of a MaskedDecay layer with bf16 weights: kernel 20 taking the masked decay, or in a tree
    # without it kernel 5's pass and then kernel 20. The mask is all True, so both trees write the same bytes; neither
    # kernel's time depends on the mask's values (a select per weight)
    master = torch.randn(hidden, d_model, device=device, generator=gen)
    opt_state = {"low": master.to(torch.bfloat16), "master": master,
                 "grad": torch.randn(hidden, d_model, device=device, generator=gen).to(torch.bfloat16),
                 "m": torch.zeros_like(master), "v": torch.zeros_like(master),
                 "mask": torch.ones(hidden, d_model, dtype=torch.bool, device=device)}
    cases[f"20 adamw_master masked decay W {hidden}x{d_model}"] = lambda: _adamw_step(k, **opt_state)
    plain_state = {name: t.clone() for name, t in opt_state.items() if name != "mask"}
    cases[f"20 adamw_master W {hidden}x{d_model}"] = lambda: _adamw_step(k, **plain_state)
    # a 2:4 weight's optimizer step and its next operands: kernel 26, or in a tree without it kernel 20 then kernel 11
    w24_state = {name: t.clone() for name, t in opt_state.items() if name != "mask"}
    w24_state["mask"] = k.transposable_mask24(w24_state["low"], pruned=False)[0]
    cases[f"26 adamw_prepare24 W {hidden}x{d_model}"] = lambda: _adamw_prepare24(k, beta=beta, **w24_state)
    # the FP8 casts both FP8 recipes run: X for its products (q and q^T, kernel 14), dZ (kernel 7)
    x = torch.randn(tokens, d_model, device=device, dtype=torch.bfloat16, generator=gen)
    inv_x = (448.0 / x.float().abs().amax()).reshape(())
    cases[f"14 quantize_fp8_transposed X {tokens}x{d_model}"] = lambda: k.quantize_fp8_transposed(x, inv_x)
    cases[f"7 quantize_fp8_with_scale X {tokens}x{d_model}"] = lambda: k.quantize_fp8_with_scale(x, inv_x)
    return cases


def _refresh24_fp8(k, w, mask, beta, inv_scale):
    """Kernel 21's E4M3 form, or in a tree without it the chain it replaces (kernel 21 writing the mask and its flips
    only, then kernel 18 on the new mask): the same outputs, (flips, q(S(W)), q(S(W))^T, amax)."""
    if hasattr(k, "refresh24_fp8"):
        return k.refresh24_fp8(w, mask, beta, inv_scale)
    flips = k.refresh24(w, mask, forward=False, transposed=False)[0]
    return (flips, *k.prepare24_fp8(w, mask, beta, inv_scale))


def _adamw_step(k, low, master, grad, m, v, mask=None):
    """One AdamW step (the lab's betas, step 10), with MaskedDecay's term where a mask is given: (master, m, v, low)
    after it."""
    import inspect

    hyper = dict(step=10, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    if mask is None:
        k.adamw_master_([low], [grad], [master], [m], [v], **hyper)
    elif "masked_decays" in inspect.signature(k.adamw_master_).parameters:
        k.adamw_master_([low], [grad], [master], [m], [v], masked_decays={0: (mask, 2e-4)}, **hyper)
    else:
        k.masked_decay_(grad, low, mask, 2e-4)
        k.adamw_master_([low], [grad], [master], [m], [v], **hyper)
    return master, m, v, low


def _adamw_prepare24(k, low, master, grad, m, v, mask, beta):
    """One AdamW step of a 2:4 weight (as ``_adamw_step``) and its compressed S(W), S(W)^T from the new bf16 weight:
    kernel 26, or in a tree without it kernel 20 then kernel 11 (the same bytes). (master, m, v, low, S(W), S(W)^T)."""
    hyper = dict(step=10, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    if hasattr(k, "adamw_master_prepare24_"):
        forms = k.adamw_master_prepare24_(low, grad, master, m, v, mask, beta, **hyper)
    else:
        k.adamw_master_([low], [grad], [master], [m], [v], **hyper)
        forms = k.prepare24(low, mask, beta)
    return master, m, v, low, *forms


def worker(tree: Path, smoke: bool, only: list[str] | None = None) -> dict:
    """Time every case with the tree's kernels (this process imports them from ``tree``)."""
    sys.meta_path.insert(0, _TreeFinder(tree))
    import torch

    import sparsity_lab.kernels as k
    if Path(k.__file__).resolve().parent != (tree / "kernels").resolve():
        raise RuntimeError(f"imported the kernels from {k.__file__}, not from {tree}")
    device = torch.device("cpu" if smoke else "cuda")
    out = {}
    for name, call in _cases(k, torch, device, smoke).items():
        if only and name.split()[0] not in only:
            continue
        first = call()  # compiles, and for the refresh kernels writes the steady mask
        second = call()
        if smoke:
            ms = 0.0
        else:
            from triton.testing import do_bench
            ms = float(do_bench(call, warmup=50, rep=300, return_mode="median"))
        out[name] = {"ms": ms, "bytes": _digest(*second), "first_call_bytes": _digest(*first)}
    return out


def _run_worker(tree: Path, smoke: bool, only: list[str] | None) -> dict:
    env = dict(os.environ)
    if smoke:
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, "-m", "benchmarks.kernels_ab", "--worker", str(tree)]
    cmd += (["--smoke"] if smoke else []) + (["--only", *only] if only else [])
    done = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the worker for {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(before: Path, rounds: int, smoke: bool, only: list[str] | None = None) -> dict:
    runs = {"before": [], "after": []}
    for r in range(rounds):
        for which, tree in (("before", before), ("after", HERE)) if r % 2 == 0 else (("after", HERE),
                                                                                      ("before", before)):
            print(f"round {r + 1}/{rounds}: {which} ({tree})", flush=True)
            runs[which].append(_run_worker(tree, smoke, only))
    rows = {}
    for name in runs["after"][0]:
        b = min(run[name]["ms"] for run in runs["before"])
        a = min(run[name]["ms"] for run in runs["after"])
        same = len({run[name]["bytes"] for run in runs["before"] + runs["after"]}) == 1
        rows[name] = {"before_ms": b, "after_ms": a, "after_over_before": (a / b) if b else None,
                      "same_bytes": same, "before_runs_ms": [run[name]["ms"] for run in runs["before"]],
                      "after_runs_ms": [run[name]["ms"] for run in runs["after"]]}
    return {"before_tree": str(before), "rounds": rounds, "smoke": smoke, "kernels": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", type=Path, help="the other tree (its sparsity_lab/ and kernels/)")
    p.add_argument("--rounds", type=int, default=2, help="rounds, the trees alternating (default 2)")
    p.add_argument("--smoke", action="store_true", help="CPU through the Triton interpreter, small shapes")
    p.add_argument("--out-dir", default="results")
    p.add_argument("--name", default="kernels_ab")
    p.add_argument("--only", nargs="*", help="kernel numbers to time (default: all), e.g. 10 23")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.smoke, args.only)))
        return 0
    if args.before is None or not (args.before / "kernels").is_dir() or not (args.before / "sparsity_lab").is_dir():
        p.error(f"--before must name a tree with sparsity_lab/ and kernels/ folders, got {args.before}")
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if not args.smoke:
        import torch
        if not torch.cuda.is_available():
            print("kernels_ab needs a CUDA GPU (use --smoke to check the script on a CPU)")
            return 1
    result = compare(args.before.resolve(), args.rounds, args.smoke, args.only)
    if not result["kernels"]:
        p.error(f"--only {args.only} matches none of the kernels 10, 11, 19, 21, 23, 24")
    print(f"{'kernel and shape':48s} {'before ms':>10s} {'after ms':>10s} {'after/before':>12s}  same bytes")
    for name, row in result["kernels"].items():
        ratio = f"{row['after_over_before']:.3f}" if row["after_over_before"] else "-"
        print(f"{name:48s} {row['before_ms']:10.4f} {row['after_ms']:10.4f} {ratio:>12s}  {row['same_bytes']}")
    from sparsity_lab.provenance import provenance

    result["provenance"] = provenance(command="python -m benchmarks.kernels_ab " + " ".join(argv or sys.argv[1:]))
    out = Path(args.out_dir) / f"{args.name}{'_smoke' if args.smoke else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0 if all(r["same_bytes"] for r in result["kernels"].values()) else 2


if __name__ == "__main__":
    raise SystemExit(main())
