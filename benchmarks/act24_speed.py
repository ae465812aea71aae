"""``python -m benchmarks act24``: the squared-ReLU FFN, dense against 2:4 activations (GPU).

One training step of one FFN (forward and backward: dx and both weight gradients), x (tokens, d),
hidden 4d, bf16, no bias, variants of the same architecture and the same initial weights:

    variant           sparse products (of y, dA24, dW2, dx, dW1 and the up projection's forward)
    dense_relu2       none: y = relu(x W1^T)^2 W2^T with nn.Linear (squared ReLU fused on CUDA)
    weights24         2:4 weights on both linears (STE, transposable): both forwards, dA24, dx
    weights24_mvue    the same + MVUE weight gradients: all six (the weight-only path at its fullest)
    act24             2:4 activations (``activation24.Act24MLP``): y = A24 W2^T and dx = dH W1
    act24_fc24        + 2:4 weights on the up projection: up forward, y, dx (on S(W1))
    act24_w24         + 2:4 weights on both linears: up forward, y (A24 sparse), dA24 (on S(W2)), dx
    act24_w24_mvue    + MVUE weight gradients: all six products sparse
    act24_tok24       act24 + weight gradients 2:4 along permuted tokens (``weight_grads="tokens24"``, 5 % of
                      the hidden features dense): y, dx, and dW2, dW1 outside the dense features
    act24_w24_tok24   act24_w24 + the same token-dimension weight gradients (in place of MVUE): all six sparse

The tokens24 variants draw a token permutation on the host per weight-gradient product, which a CUDA
graph would freeze: they are timed eagerly only (their rows say so in ``graph_skipped``), and their
headline ratio is their eager step against the fastest dense step of either mode.

Each variant is timed eagerly and replayed from a CUDA graph (``CudaGraphStep``; the input x is a
parameter of a wrapper there, so the graph computes dx too), in ``--rounds`` rounds; in each round
every variant is timed once per mode. The headline speed-up of a variant is, per round, the fastest
dense step of the round (either mode) over the variant's fastest step of the round, and the median
over rounds (pairing in time removes the GPU clock's drift from the ratio); per-mode ratios are kept
too. Dense TFLOP/s counts the six products, 12 tokens d hidden floating-point operations. Before
timing, every activation variant's output and input gradient are checked against the reference
products (the "torch" backend's: dense products of the same pruned operands) by relative error, and
the weight gradients too (for tokens24 the reference of the same permutations and dense features);
the tokens24 rows report the share of A24 and dH that the token-dimension 2:4 drops (``dropped``,
from that checking step: random inputs and initial weights, not a trained model's activations).

After the FFN section, the GPT section (``act24_gpt``; ``--no-gpt`` skips it): one training step of the
lab GPT at d_model 4096 (AdamW included), dense gelu and dense relu2 against 2:4 activations alone and
combined with 2:4 weights (S-STE + MVUE), tokens/s, alone and in paired rounds, the headline against
the fastest dense relu2 of the run; stored under ``gpt_step``. Around both sections: the dense matmul
rate at the start and at the end of the run (``baseline``) and the GPU's clocks, power and temperature
per section (``conditions``; ``benchmarks/conditions.py``).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn

from sparsity_lab.activations import relu2
from sparsity_lab.lab.arguments import nonnegative_float, output_file, output_folder, positive_int

VARIANTS = ("dense_relu2", "weights24", "weights24_mvue", "act24", "act24_fc24", "act24_w24", "act24_w24_mvue",
            "act24_tok24", "act24_w24_tok24")
DENSE_FRACTION = 0.05  # the tokens24 variants' share of dense hidden features
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
    gpt: dict | None = None  # the GPT section's model and batch (act24_gpt.DEFAULTS); None: no GPT section
    idle_s: float = 0.5  # idle GPU before each turn of the GPT section's paired rounds


class Relu2FFN(nn.Module):
    """y = relu(x W1^T)^2 W2^T; linears named ``fc`` and ``proj`` as in the lab GPT. The activation is
    ``activations.relu2``, one fused pass each way on CUDA, as in the lab GPT's dense relu2 FFN."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, hidden, bias=False)
        self.proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.proj(relu2(self.fc(x)))


def build(variant: str, s: Settings) -> nn.Module:
    import sparsity_lab as sl
    from sparsity_lab.activation24 import Act24MLP
    from sparsity_lab.backends import get_backend

    d, hidden = s.d_model, 4 * s.d_model
    torch.manual_seed(0)
    if variant == "dense_relu2" or variant.startswith("weights24"):
        model = Relu2FFN(d, hidden)
    else:
        tokens24 = variant.endswith("_tok24")
        model = Act24MLP(d, hidden, weight_grads="tokens24" if tokens24 else "dense", dense_fraction=DENSE_FRACTION)
    model = model.to(device=s.device, dtype=torch.bfloat16)
    if variant.startswith("act24"):
        model.backend = get_backend("torch" if s.smoke else "cusparselt")  # the activation products
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
    """Relative errors of y, dx, dW1 and dW2 against the same model with reference (dense) activation
    products (for tokens24: the same permutations and dense features), and for tokens24 the dropped share
    of each weight-gradient operand (``dropped``: {"dW2": ..., "dW1": ...} of ``tokens24_dropped``)."""
    from sparsity_lab.backends.torch_reference import TorchBackend

    tokens24 = model.weight_grads == "tokens24"

    def run():
        if tokens24:  # both runs draw the same permutations
            model.set_weight_grads(model.weight_grads, model.dense_fraction, token_seed=int(model.token_seed))
        xx = x.detach().clone().requires_grad_(True)
        y = model(xx)
        y.backward(dy)
        out = [y.detach().float(), xx.grad.float(), model.fc.weight.grad.float(), model.proj.weight.grad.float()]
        for p in model.parameters():
            p.grad = None
        return out

    fast = run()
    saved = model.backend
    model.backend = TorchBackend(token_feature_multiple=saved.token_feature_multiple)
    model.record_dropped = tokens24
    try:
        ref = run()
    finally:
        model.backend, model.record_dropped = saved, False
    rel = [float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(fast, ref)]
    out = {"y_rel_err": rel[0], "dx_rel_err": rel[1], "dw1_rel_err": rel[2], "dw2_rel_err": rel[3]}
    if tokens24:
        out["dropped"] = dict(model.last_dropped)
        out["dense_fraction"] = model.dense_fraction
    return out


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
    from sparsity_lab.training_hooks import advance_step, sparse_layers
    from benchmarks.ffn.graph import InputHeld
    from benchmarks.ffn.variants import train_step

    sparse = bool(sparse_layers(model))
    eager = train_step(model, x, dy)  # dx included: x requires grad
    fns = {"eager": eager}
    if s.graph and s.device.type == "cuda" and not graph_skipped(model):
        from sparsity_lab.graph_step import CudaGraphStep
        graphed = CudaGraphStep(InputHeld(model, x), lambda held, dy: held(dy), warmup_steps=2)

        def graph():
            graphed(dy)
            if sparse:
                advance_step(model)
        for _ in range(graphed.warmup_steps + 1):
            graph()
        fns["graph"] = graph
    return fns


def graph_skipped(model: nn.Module) -> str | None:
    """Why a variant is not replayed from a CUDA graph (None: it is)."""
    if getattr(model, "weight_grads", "dense") == "tokens24":
        return "weight_grads='tokens24' draws a token permutation on the host per product (a graph would freeze it)"
    return None


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
        if v in models and s.graph and s.device.type == "cuda" and graph_skipped(models[v]):
            row["graph_skipped"] = graph_skipped(models[v])
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


def measure(s: Settings) -> dict:
    """The whole run: the dense matmul rate at the start, the FFN section (``benchmark``), the GPT
    section (``act24_gpt.measure_gpt_step``, when ``s.gpt``), the matmul rate again at the end; the GPU's
    clocks, power and temperature sampled throughout, per section (``conditions.ConditionSampler``)."""
    from benchmarks.act24_gpt import gpt_settings, measure_gpt_step
    from benchmarks.conditions import ConditionSampler, matmul_probe
    from benchmarks.ffn.measure import Recorder

    gs = gpt_settings(s.smoke, s.gpt, reps=s.reps, warmup=s.warmup, rounds=s.rounds, idle_s=s.idle_s)
    shapes = {"ffn": (s.tokens, s.d_model, 4 * s.d_model)}  # x W1^T, the largest product of each section
    if s.gpt:
        shapes["gpt"] = (s.gpt["batch"] * s.gpt["context"], s.gpt["d_model"], 4 * s.gpt["d_model"])
    sampler = ConditionSampler(False if s.smoke else None).start()
    rec = Recorder(gs, sampler)

    def probes(when: str) -> dict:
        """{"<m>x<k>x<n>": matmul_probe} for each distinct shape (one probe when both sections share it)."""
        out = {}
        with rec.section(f"matmul probe ({when})"):
            for shape in dict.fromkeys(shapes.values()):
                p, err = rec.attempt(f"matmul probe {shape} ({when})", lambda shape=shape: matmul_probe(
                    *shape, s.device, torch.bfloat16, label="x W1^T"))
                out["x".join(map(str, shape))] = p if p is not None else {"error": err}
        return out
    try:
        start = probes("start")
        with rec.section("ffn"):
            result = benchmark(s)
        if s.gpt:
            probe = start.get("x".join(map(str, shapes["gpt"])))
            with rec.section("gpt step"):
                gpt, err = rec.attempt("gpt step", lambda: measure_gpt_step(gs, rec, probe))
            result["gpt_step"] = gpt if gpt is not None else {"config": dict(s.gpt), "variants": {}, "error": err}
        result["baseline"] = {"matmul_probe_start": start, "matmul_probe_end": probes("end")}
    finally:
        sampler.stop()
    result["conditions"] = sampler.summary()
    result["errors"] = rec.errors
    return result


def format_table(result: dict) -> str:
    from benchmarks.conditions import format_conditions

    lines = [f"{'variant':16} {'eager ms':>9} {'x':>6} {'graph ms':>9} {'x':>6} {'x fastest dense':>16}  y/dx rel err"]
    for r in result["rows"]:
        def f(key, spec=".2f"):
            v = r.get(key)
            return format(v, spec) if isinstance(v, (int, float)) else "-"
        err = f"{r['y_rel_err']:.1e}/{r['dx_rel_err']:.1e}" if "y_rel_err" in r else ""
        if r.get("dropped"):
            err += "  dropped mass dW2 {:.1%} dW1 {:.1%}".format(r["dropped"]["dW2"]["mass_fraction"],
                                                                r["dropped"]["dW1"]["mass_fraction"])
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
    gpt = result.get("gpt_step")
    if gpt:
        from benchmarks.act24_gpt import format_gpt
        lines.append(format_gpt(gpt) if not gpt.get("error") else f"GPT step: {gpt['error'][:300]}")
    for when, probes in (result.get("baseline") or {}).items():
        for shape, p in probes.items():
            rate = f"{p['ms']:.3f} ms = {p['tflops']:.0f} TFLOP/s" if "tflops" in p else p.get("error", "-")[:200]
            lines.append(f"{when.replace('_', ' ')}, {shape} bf16: {rate}")
    if result.get("conditions"):
        lines.append(format_conditions(result["conditions"]))
    if result.get("errors"):
        lines.append(f"{len(result['errors'])} error(s) recorded (JSON 'errors'); first: "
                     f"{result['errors'][0]['where']}: {result['errors'][0]['error'][:200]}")
    return "\n".join(lines)


SMOKE_FFN = {"tokens": 64, "d_model": 16}  # --smoke's FFN shape unless --tokens / --d-model say otherwise


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=positive_int, default=None,
                        help="tokens per FFN step (default 16384; --smoke 64)")
    parser.add_argument("--d-model", type=positive_int, default=None,
                        help="FFN width; hidden = 4 d (default 4096; --smoke 16)")
    parser.add_argument("--rounds", type=positive_int, default=3, help="paired timing rounds (default 3)")
    parser.add_argument("--reps", type=positive_int, default=5, help="timed steps per variant and round (default 5)")
    parser.add_argument("--no-graph", action="store_true", help="eager timing only (FFN section)")
    parser.add_argument("--no-gpt", action="store_true", help="skip the GPT section")
    parser.add_argument("--gpt-layers", type=positive_int, default=None, help="GPT blocks (default 2)")
    parser.add_argument("--gpt-batch", type=positive_int, default=None, help="sequences per GPT step (default 16)")
    parser.add_argument("--gpt-context", type=positive_int, default=None, help="bytes per sequence (default 1024)")
    parser.add_argument("--idle-s", type=nonnegative_float, default=0.5,
                        help="seconds of idle GPU before each turn of the GPT paired rounds (default 0.5)")
    parser.add_argument("--smoke", action="store_true", help="tiny CPU run with the reference products: checks "
                        "that the script runs; the numbers mean nothing")
    parser.add_argument("--out", type=output_file, default=None, help="write the JSON to this file instead (default: "
                        "results/act24_<gpu>.json on a GPU, nothing in --smoke)")
    parser.add_argument("--out-dir", type=output_folder, default=None,
                        help="folder of act24_<gpu>.json (default results/)")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from the command line; ValueError naming the flag for bad input."""
    from benchmarks.act24_gpt import DEFAULTS

    tokens = args.tokens if args.tokens is not None else (SMOKE_FFN["tokens"] if args.smoke else 16384)
    d_model = args.d_model if args.d_model is not None else (SMOKE_FFN["d_model"] if args.smoke else 4096)
    for flag, value in (("--tokens", tokens), ("--d-model", d_model), ("--rounds", args.rounds),
                        ("--reps", args.reps)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if d_model % 16 or tokens % 64:
        raise ValueError(f"--d-model must be a multiple of 16 and --tokens of 64, got {d_model} and {tokens}")
    if not args.idle_s >= 0:
        raise ValueError(f"--idle-s must be >= 0, got {args.idle_s}")
    gpt = None
    if not args.no_gpt:
        gpt = dict(DEFAULTS["smoke" if args.smoke else "full"])
        for key, flag in (("n_layer", "--gpt-layers"), ("batch", "--gpt-batch"), ("context", "--gpt-context")):
            value = getattr(args, flag[2:].replace("-", "_"))
            if value is not None:
                if value < 1:
                    raise ValueError(f"{flag} must be >= 1, got {value}")
                gpt[key] = value
    s = Settings(smoke=args.smoke, device=torch.device("cpu" if args.smoke else "cuda"), tokens=tokens,
                 d_model=d_model, rounds=args.rounds, reps=args.reps, graph=not args.no_graph, gpt=gpt,
                 idle_s=args.idle_s)
    if s.smoke:
        s = dataclasses.replace(s, warmup=0, reps=1, rounds=min(s.rounds, 2), idle_s=0.0)
    return s


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from sparsity_lab.provenance import provenance, write_result

    try:
        s = settings_from_args(args)
    except ValueError as err:
        raise SystemExit(f"python -m benchmarks act24: error: {err}")
    if not s.smoke and not torch.cuda.is_available():
        print("python -m benchmarks act24: error: needs a CUDA GPU (or --smoke for a CPU check of the script)")
        return 2
    result = measure(s)
    print(format_table(result))
    if args.out:
        Path(args.out).write_text(json.dumps({"provenance": provenance(), **result}, indent=2, default=str) + "\n")
    elif not s.smoke:
        gpu = torch.cuda.get_device_name().split()[1].lower() if " " in torch.cuda.get_device_name() else "gpu"
        print("wrote", write_result(f"act24_{gpu}", result, directory=args.out_dir))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks act24", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
