"""``sparsity-lab bench-act24``: the squared-ReLU FFN, dense against 2:4 activations (GPU).

One training step of one FFN (forward and backward: dx and both weight gradients), x (tokens, d),
hidden 4d, bf16, no bias, variants of the same architecture and the same initial weights:

    variant           sparse products (of y, dA24, dW2, dx, dW1 and the up projection's forward)
    dense_relu2       none: y = relu(x W1^T)^2 W2^T with nn.Linear
    weights24         2:4 weights on both linears (STE, transposable): both forwards, dA24, dx
    weights24_mvue    the same + MVUE weight gradients: all six (the weight-only path at its fullest)
    act24             2:4 activations (``activation24.Act24MLP``): y = A24 W2^T and dx = dH W1
    act24_fc24        + 2:4 weights on the up projection: up forward, y, dx (on S(W1))
    act24_w24         + 2:4 weights on both linears: up forward, y (A24 sparse), dA24 (on S(W2)), dx
    act24_w24_mvue    + MVUE weight gradients: all six products sparse

Each variant is timed eagerly and replayed from a CUDA graph (``CudaGraphStep``; the input x is a
parameter of a wrapper there, so the graph computes dx too), in ``--rounds`` rounds; in each round
every variant is timed once per mode. The headline speed-up of a variant is, per round, the fastest
dense step of the round (either mode) over the variant's fastest step of the round, and the median
over rounds (pairing in time removes the GPU clock's drift from the ratio); per-mode ratios are kept
too. Dense TFLOP/s counts the six products, 12 tokens d hidden floating-point operations. Before
timing, every activation variant's output and input gradient are checked against the reference
products (``ReferenceProducts``: dense products of the same pruned operands) by relative error.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

VARIANTS = ("dense_relu2", "weights24", "weights24_mvue", "act24", "act24_fc24", "act24_w24", "act24_w24_mvue")
TARGETS = {"act24": 1.25, "act24_w24_mvue": 1.5}


@dataclass
class Settings:
    smoke: bool
    device: torch.device
    tokens: int
    d_model: int
    rounds: int
    reps: int = 5
    warmup: int = 2
    graph: bool = True


class Relu2FFN(nn.Module):
    """y = relu(x W1^T)^2 W2^T; linears named ``fc`` and ``proj`` as in the lab GPT."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, hidden, bias=False)
        self.proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.proj(F.relu(self.fc(x)).square())


def build(variant: str, s: Settings) -> nn.Module:
    import sparsity_lab as sl
    from ..activation24 import Act24MLP, CusparseltProducts, ReferenceProducts

    d, hidden = s.d_model, 4 * s.d_model
    torch.manual_seed(0)
    if variant == "dense_relu2" or variant.startswith("weights24"):
        model = Relu2FFN(d, hidden)
    else:
        model = Act24MLP(d, hidden)
    model = model.to(device=s.device, dtype=torch.bfloat16)
    if variant.startswith("act24"):
        model.products = ReferenceProducts() if s.smoke else CusparseltProducts()
    backend = "torch" if s.smoke else "cusparselt"
    mvue = variant.endswith("_mvue")
    method = sl.STE(transposable=True, mvue=mvue, backend=backend)
    if variant.startswith("weights24") or variant.startswith("act24_w24"):
        sl.sparsify(model, method, select=["fc", "proj"])
    elif variant == "act24_fc24":
        sl.sparsify(model, method, select=["fc"])
    if sl.sparse_layers(model):
        sl.attach_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.0))
    return model


def check_against_reference(model: nn.Module, x: torch.Tensor, dy: torch.Tensor) -> dict:
    """Relative errors of y and dx against the same model with reference (dense) activation products."""
    from ..activation24 import ReferenceProducts

    def run():
        xx = x.detach().clone().requires_grad_(True)
        y = model(xx)
        y.backward(dy)
        for p in model.parameters():
            p.grad = None
        return y.detach().float(), xx.grad.float()

    fast = run()
    saved, model.products = model.products, ReferenceProducts()
    try:
        ref = run()
    finally:
        model.products = saved
    rel = [float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(fast, ref)]
    return {"y_rel_err": rel[0], "dx_rel_err": rel[1]}


def median_ms(fn, s: Settings) -> float:
    for _ in range(s.warmup):
        fn()
    if s.device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(s.reps)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def step_fns(model: nn.Module, x: torch.Tensor, dy: torch.Tensor, s: Settings) -> dict:
    """{"eager": fn, "graph": fn (CUDA only)}: one training step each, dx included (and the 2:4
    layers' step counters)."""
    from ..training_hooks import advance_step, sparse_layers
    from .ffn.graph import InputHeld
    from .ffn.variants import train_step

    sparse = bool(sparse_layers(model))
    eager = train_step(model, x, dy)  # dx included: x requires grad
    fns = {"eager": eager}
    if s.graph and s.device.type == "cuda":
        from ..graph_step import CudaGraphStep
        graphed = CudaGraphStep(InputHeld(model, x), lambda held, dy: held(dy), warmup_steps=2)

        def graph():
            graphed(dy)
            if sparse:
                advance_step(model)
        for _ in range(graphed.warmup_steps + 1):
            graph()
        fns["graph"] = graph
    return fns


def benchmark(s: Settings) -> dict:
    t, d = s.tokens, s.d_model
    hidden = 4 * d
    torch.manual_seed(1)
    x = torch.randn(t, d, device=s.device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(t, d, device=s.device, dtype=torch.bfloat16) * d ** -0.5
    flops = 12 * t * d * hidden
    models, fns, checks, errors = {}, {}, {}, {}
    for variant in VARIANTS:
        try:
            models[variant] = build(variant, s)
            if variant.startswith("act24"):
                checks[variant] = check_against_reference(models[variant], x, dy)
            fns[variant] = step_fns(models[variant], x, dy, s)
        except Exception as err:  # one failing variant leaves the others (the report says why)
            errors[variant] = f"{type(err).__name__}: {err}"[:400]
            models.pop(variant, None)
            print(f"{variant}: {errors[variant]}", flush=True)
    modes = sorted({m for f in fns.values() for m in f})
    times = {v: {m: [] for m in fns[v]} for v in fns}
    ratios = {v: {m: [] for m in fns[v]} for v in fns}
    headline = {v: [] for v in fns}
    for r in range(s.rounds):
        this_round = {v: {} for v in fns}
        for mode in modes:
            round_ms = {v: median_ms(fns[v][mode], s) for v in fns if mode in fns[v]}
            for v, ms in round_ms.items():
                times[v][mode].append(ms)
                this_round[v][mode] = ms
            dense = round_ms.get("dense_relu2")
            if dense is not None:
                for v, ms in round_ms.items():
                    ratios[v][mode].append(dense / ms)
        if this_round.get("dense_relu2"):
            fastest_dense = min(this_round["dense_relu2"].values())
            for v, by_mode in this_round.items():
                headline[v].append(fastest_dense / min(by_mode.values()))
        print(f"round {r + 1}/{s.rounds} done", flush=True)
    rows = []
    for v in VARIANTS:
        row = {"variant": v, "tokens": t, "d_model": d, "hidden": hidden, "error": errors.get(v)}
        row.update(checks.get(v, {}))
        for mode in modes:
            ms = times.get(v, {}).get(mode)
            if ms:
                row[f"{mode}_ms"] = statistics.median(ms)
                row[f"{mode}_speedup"] = statistics.median(ratios[v][mode]) if ratios[v][mode] else None
                row[f"{mode}_speedup_min_max"] = [min(ratios[v][mode]), max(ratios[v][mode])] if ratios[v][mode] else None
        rows.append(row)
    dense_row = rows[0]
    dense_best = min((dense_row.get(f"{m}_ms") for m in modes if dense_row.get(f"{m}_ms")), default=None)
    for row in rows:
        done = {m: row[f"{m}_ms"] for m in modes if row.get(f"{m}_ms")}
        row["best_mode"] = min(done, key=done.get) if done else None
        h = headline.get(row["variant"])
        row["speedup_vs_fastest_dense"] = statistics.median(h) if h else None
        row["speedup_vs_fastest_dense_min_max"] = [min(h), max(h)] if h else None
        row["speedup"] = row["speedup_vs_fastest_dense"]
    targets = {v: {"threshold": th, "measured": next((r["speedup"] for r in rows if r["variant"] == v), None)}
               for v, th in TARGETS.items()}
    for tgt in targets.values():  # a smoke run (CPU, reference products) judges nothing
        tgt["met"] = None if s.smoke else (tgt["measured"] is not None and tgt["measured"] >= tgt["threshold"])
    return {"settings": {"tokens": t, "d_model": d, "hidden": hidden, "dtype": "bfloat16", "rounds": s.rounds,
                         "reps": s.reps, "smoke": s.smoke},
            "dense_flops_per_step": flops,
            "fastest_dense_ms": dense_best,
            "fastest_dense_tflops": flops / (dense_best * 1e-3) / 1e12 if dense_best else None,
            "dense_tflops_by_mode": {m: flops / (dense_row[f"{m}_ms"] * 1e-3) / 1e12
                                     for m in modes if dense_row.get(f"{m}_ms")},
            "rows": rows, "targets": targets,
            "notes": __doc__.split("\n\n", 1)[1].strip()}


def format_table(result: dict) -> str:
    lines = [f"{'variant':16} {'eager ms':>9} {'x':>6} {'graph ms':>9} {'x':>6} {'x fastest dense':>16}  y/dx rel err"]
    for r in result["rows"]:
        def f(key, spec=".2f"):
            v = r.get(key)
            return format(v, spec) if isinstance(v, (int, float)) else "-"
        err = f"{r['y_rel_err']:.1e}/{r['dx_rel_err']:.1e}" if "y_rel_err" in r else ""
        lines.append(f"{r['variant']:16} {f('eager_ms'):>9} {f('eager_speedup'):>6} {f('graph_ms'):>9} "
                     f"{f('graph_speedup'):>6} {f('speedup_vs_fastest_dense', '.3f'):>16}  {err}"
                     f"{'  ' + r['error'] if r.get('error') else ''}")
    tf = result.get("fastest_dense_tflops")
    lines.append(f"fastest dense {result['fastest_dense_ms']:.3f} ms = {tf:.0f} TFLOP/s" if tf else "no dense time")
    for v, tgt in result["targets"].items():
        m = tgt["measured"]
        verdict = "not judged (smoke)" if tgt["met"] is None else "met" if tgt["met"] else "missed"
        lines.append(f"target {v} >= {tgt['threshold']}x: {verdict} "
                     f"({'-' if m is None else format(m, '.3f')}x)")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per step (default 16384)")
    parser.add_argument("--d-model", type=int, default=4096, help="model width; hidden = 4 d (default 4096)")
    parser.add_argument("--rounds", type=int, default=3, help="paired timing rounds (default 3)")
    parser.add_argument("--reps", type=int, default=5, help="timed steps per variant and round (default 5)")
    parser.add_argument("--no-graph", action="store_true", help="eager timing only")
    parser.add_argument("--smoke", action="store_true", help="tiny CPU run with the reference products: checks "
                        "that the script runs; the numbers mean nothing")
    parser.add_argument("--out", default=None, help="write the JSON to this file instead (default: "
                        "results/act24_<gpu>.json on a GPU, nothing in --smoke)")
    parser.add_argument("--out-dir", default=None, help="folder of act24_<gpu>.json (default results/)")


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from ..provenance import provenance, write_result

    for name in ("tokens", "d_model", "rounds", "reps"):
        if getattr(args, name) < 1:
            raise SystemExit(f"sparsity-lab bench-act24: error: --{name.replace('_', '-')} must be >= 1")
    if not args.smoke and not torch.cuda.is_available():
        print("sparsity-lab bench-act24: error: needs a CUDA GPU (or --smoke for a CPU check of the script)")
        return 2
    if args.d_model % 16 or args.tokens % 64:
        print("sparsity-lab bench-act24: error: --d-model must be a multiple of 16 and --tokens of 64")
        return 2
    s = Settings(smoke=args.smoke, device=torch.device("cpu" if args.smoke else "cuda"), tokens=args.tokens,
                 d_model=args.d_model, rounds=args.rounds, reps=args.reps, graph=not args.no_graph)
    if s.smoke:
        s = dataclasses.replace(s, warmup=0, reps=1)
    result = benchmark(s)
    print(format_table(result))
    if args.out:
        Path(args.out).write_text(json.dumps({"provenance": provenance(), **result}, indent=2, default=str) + "\n")
    elif not s.smoke:
        gpu = torch.cuda.get_device_name().split()[1].lower() if " " in torch.cuda.get_device_name() else "gpu"
        print("wrote", write_result(f"act24_{gpu}", result, directory=args.out_dir))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparsity-lab bench-act24", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
