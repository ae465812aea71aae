"""``python -m benchmarks act24``'s GPT section: one training step of the lab GPT with 2:4 activations, tokens/s.

The lab GPT (``sparsity_lab.lab.model.GPT``, benchmarks ffn's GPT-step configuration: 2 blocks, d_model 4096,
32 heads, 16 sequences of 1024 bytes), one AdamW step (fused on CUDA) under bf16 autocast with fp32
master weights, on one fixed random batch, the same initial weights for every variant of one FFN kind.
Variants, built with the library calls the trainer (``lab/trainer.py``) makes for them:

    dense_gelu       the plain GPT, y = W2 gelu(W1 x)
    dense_relu2      the plain GPT, y = W2 relu(W1 x)^2: the dense baseline of the same architecture
    act24            ``activation_sparsity="2:4"`` (``Act24MLP`` with plain linears): y = A24 W2^T and
                     dx = dH W1 sparse, the activations compressed by the Triton kernels
    act24_as_trainer the same as ``train --method dense --activation-sparsity 2:4`` builds it: both linears
                     wrapped by ``sparsify`` in ``SparseLinear`` with the ``Dense`` method (no flip
                     tracking), so ``fc`` computes its own input gradient and dx = dH W1 runs dense: of
                     the six FFN products only y is sparse
    weights24_mvue   relu2, 2:4 weights on both FFN linears (S-STE + MVUE, transposable), activations dense
    act24_w24_mvue   2:4 activations and those 2:4 weights (``sparsify`` with ``weight_selector``, then
                     ``configure_activation_sparsity``): all six FFN products sparse, the combined method
    act24_tok24      act24 with ``act24_weight_grads="tokens24"``: the weight gradients 2:4 along permuted
                     tokens outside the 5 % densest hidden features (``references.act24_tokens``)
    act24_w24_tok24  2:4 activations, 2:4 weights on both FFN linears (S-STE, transposable, no MVUE) and the
                     token-dimension weight gradients in place of MVUE: all six FFN products sparse

The products run on cuSPARSELt (backend "cusparselt"; ``--smoke``: backend "torch" and the reference
activation products on the CPU). Before timing, each act24 variant's FFN outputs on the batch are compared
with the same model's on the reference products (dense products of the same pruned activations).

Timing (benchmarks ffn's GPT machinery, ``benchmarks/ffn/gpt.py``): each variant built and timed alone, the
median of ``reps`` steps after ``warmup`` steps; then PAIRED_VARIANTS built side by side and timed in
turns for ``rounds`` rounds, each turn after ``idle_s`` of idle GPU, the speed-up over dense_relu2 taken
per round (the GPU clock's drift cancels within a round). A variant's headline speed-up is the fastest
dense_relu2 time of the run (alone, or its median in the paired rounds) over the variant's paired median
(``conditions.headline``); the paired ratio, the unpaired one and the ratio against dense_gelu are kept
beside it. The dense relu2 step's achieved TFLOP/s counts the products' FLOPs
(``flops.gpt_config_flops_per_token``) over that fastest time; beside it the start-of-run dense matmul
rate (``conditions.matmul_probe``), for reading only: the step's attention, norms, softmax and AdamW are
not products, so its rate is not held to the 90 % rule. No CUDA graphs: the trainer refuses
``--cuda-graph`` with a squared-ReLU FFN, and benchmarks ffn's GPT step is timed eagerly too.
"""
from __future__ import annotations

import math

import torch

from benchmarks.ffn.gpt import Built, gpt_batch, new_gpt, paired_rounds, summarize, time_variant, training_step
from benchmarks.ffn.measure import Recorder
from benchmarks.ffn.settings import FULL, SMOKE, Settings
from benchmarks.ffn.targets import gpt_headline
from benchmarks.conditions import judged

GPT_VARIANTS = ("dense_gelu", "dense_relu2", "act24", "act24_as_trainer", "weights24_mvue", "act24_w24_mvue",
                "act24_tok24", "act24_w24_tok24")
PAIRED_VARIANTS = ("dense_relu2", "act24", "act24_w24_mvue", "act24_tok24", "act24_w24_tok24")
DENSE = "dense_relu2"  # the dense baseline of the same architecture
WEIGHTS24 = ("weights24_mvue", "act24_w24_mvue")  # 2:4 weights (S-STE + MVUE) on both FFN linears
TARGETS = {"act24_w24_mvue": 1.35}  # GPT step tokens/s at d_model 4096, against the fastest dense relu2
DEFAULTS = {"full": FULL["gpt"], "smoke": SMOKE["gpt"]}  # the same GPT as benchmarks ffn's GPT step


def gpt_settings(smoke: bool, gpt: dict | None, reps: int, warmup: int, rounds: int, idle_s: float) -> Settings:
    """benchmarks ffn's Settings for the GPT section (device, dtype, repetitions, backends; gpt None: a run
    without the GPT section, whose Recorder still takes these settings). No FFN grid, no time budget."""
    backend = "torch" if smoke else "cusparselt"
    return Settings(smoke=smoke, device=torch.device("cpu" if smoke else "cuda"), dtype=torch.bfloat16,
                    tokens=[], d_models=[], target=(0, 0), reps=reps, warmup=warmup, budget_s=math.inf,
                    graph=False, gpt=dict(gpt) if gpt else None,
                    backends={"cusparselt": backend, "cusparselt_auto": backend, "dense_products": backend},
                    rounds=rounds, idle_s=0.0 if smoke else idle_s)


def config_for(variant: str, g: dict):
    """The GPTConfig of a variant: gelu, relu2, or relu2 with 2:4 activations."""
    from sparsity_lab.lab.model import GPTConfig

    if variant not in GPT_VARIANTS:
        raise ValueError(f"variant must be one of {GPT_VARIANTS}, got {variant!r}")
    kind = "gelu" if variant == "dense_gelu" else "relu2"
    act = "2:4" if variant.startswith("act24") else "none"
    grads = "tokens24" if variant.endswith("_tok24") else "dense"
    return GPTConfig(vocab_size=256, context=g["context"], n_layer=g["n_layer"], n_head=g["n_head"],
                     d_model=g["d_model"], ffn_kind=kind, activation_sparsity=act, act24_weight_grads=grads,
                     bias=False, dropout=0.0)


def build_variant(variant: str, s: Settings) -> Built:
    """One variant, built as the trainer builds it, with its AdamW step (``ffn.gpt.training_step``)."""
    import sparsity_lab as sl
    from sparsity_lab.activation24 import configure_activation_sparsity, weight_selector
    from benchmarks.ffn.variants import method_for

    g = s.gpt
    model = new_gpt(config_for(variant, g), s)
    record: dict = {"ffn_kind": model.config.ffn_kind, "activation_sparsity": model.config.activation_sparsity}
    if variant in WEIGHTS24:  # S-STE + MVUE, transposable, on cuSPARSELt: ours_mvue of benchmarks ffn
        method = method_for("ours_mvue", s)
        sl.sparsify(model, method, select=weight_selector)
        record["method"] = method.describe()
        record["sparse_layers"] = len(sl.sparse_layers(model))
    elif variant == "act24_w24_tok24":  # S-STE without MVUE: the token-dimension products take the weight gradients
        method = sl.SSTE(transposable=True, backend=s.backends["cusparselt"])
        sl.sparsify(model, method, select=weight_selector)
        record["method"] = method.describe()
        record["sparse_layers"] = len(sl.sparse_layers(model))
    elif variant == "act24_as_trainer":  # the trainer's dense weights beside 2:4 activations
        # transposable: the cuSPARSELt backend checks every layer's mask form at set-up (as --transposable does)
        method = sl.Dense(track_flips=False, transposable=True, backend=s.backends["cusparselt"])
        sl.sparsify(model, method, select=weight_selector)
        record["method"] = method.describe()
        record["sparse_layers"] = len(sl.sparse_layers(model))
    if variant.startswith("act24"):
        mods = configure_activation_sparsity(model, s.backends["cusparselt"])
        record["activation_products"] = mods[0][1].backend.name
        record["act24_modules"] = len(mods)
        record["weight_grads"] = mods[0][1].weight_grads
        record["loss_check"] = loss_against_reference(model, s)
    step, last_loss = training_step(model, g, s)
    return Built(model, step, last_loss, record)


def loss_against_reference(model, s: Settings) -> dict:
    """One forward of the training batch with the model's activation products and one with the reference
    products: {"loss", "loss_reference", "ffn_out_rel_err"}, the last the largest over blocks of
    ||y - y_ref|| / ||y_ref|| for the FFN outputs y (a fast path that is fast because it is wrong would
    show there; the loss at initialisation hardly depends on the FFNs)."""
    from sparsity_lab.activation24 import act24_modules
    from sparsity_lab.backends import get_backend

    idx, targets = gpt_batch(s.gpt, s)  # the batch the training step runs on
    mods = [m for _, m in act24_modules(model)]

    def forward() -> tuple[float, list[torch.Tensor]]:
        outs: list[torch.Tensor] = []
        hooks = [m.register_forward_hook(lambda mod, args, y: outs.append(y.detach().float())) for m in mods]
        try:
            with torch.no_grad(), torch.autocast(s.device.type, dtype=s.dtype):
                return float(model(idx, targets)[1]), outs
        finally:
            for h in hooks:
                h.remove()
    fast, fast_outs = forward()
    saved = [m.backend for m in mods]
    try:
        for m in mods:
            m.backend = get_backend("torch")
        ref, ref_outs = forward()
    finally:
        for m, b in zip(mods, saved):
            m.backend = b
    errs = [float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(fast_outs, ref_outs)]
    return {"loss": fast, "loss_reference": ref, "ffn_out_rel_err": max(errs)}


def measure_gpt_step(s: Settings, rec: Recorder, probe: dict | None = None) -> dict:
    """The GPT section's record (stored as ``gpt_step``): config, per-variant times, paired rounds, headlines
    and the target. probe: the start-of-run matmul probe ({"tflops", ...}), shown beside dense's rate."""
    from sparsity_lab.flops import gpt_config_flops_per_token

    g = s.gpt
    tokens = g["batch"] * g["context"]
    dense_cfg = config_for(DENSE, g)
    print(f"GPT step: {g['n_layer']} layers, d_model {g['d_model']}, {tokens} tokens per step ...", flush=True)
    result = {"config": dict(g, vocab_size=256, ffn=dense_cfg.hidden), "tokens_per_step": tokens,
              "dense": DENSE, "reps": s.reps, "warmup": s.warmup, "rounds": s.rounds, "idle_s": s.idle_s,
              "backend": s.backends["cusparselt"], "notes": __doc__.split("\n\n", 1)[1].strip(), "variants": {}}
    for variant in GPT_VARIANTS:
        with rec.section(f"gpt {variant} alone"):
            result["variants"][variant] = time_variant(f"gpt {variant}", lambda v=variant: build_variant(v, s), s, rec)
    result["dense_flops_per_token"] = sum(gpt_config_flops_per_token(dense_cfg).values())
    summarize(result, DENSE)
    if s.rounds:
        with rec.section("gpt paired rounds"):
            paired, err = rec.attempt("gpt paired rounds", lambda: paired_rounds(
                {v: (lambda v=v: build_variant(v, s)) for v in PAIRED_VARIANTS}, DENSE, s))
        result["paired"] = paired if paired is not None else {"error": err}
    result["headline"] = headlines(result, probe)
    result["targets"] = judge(result, s.smoke)
    return result


def headlines(result: dict, probe: dict | None = None) -> dict:
    """Per variant other than dense relu2: ``ffn.targets.gpt_headline`` against the fastest dense relu2 of
    the run, and the ratio against dense gelu timed alone; the dense rate beside the matmul probe's."""
    gelu_ms = (result["variants"].get("dense_gelu") or {}).get("ms")
    out = {}
    for variant in result["variants"]:
        if variant == DENSE:
            continue
        speedup, extra = gpt_headline(result, variant, dense=DENSE)
        ms = extra.get("variant_ms")
        extra["vs_dense_gelu"] = gelu_ms / ms if gelu_ms and ms else None
        out[variant] = {"speedup": speedup, **extra}
    probe_tflops = (probe or {}).get("tflops")
    dense_tflops = next((h.get("dense_tflops") for h in out.values() if h.get("dense_tflops")), None)
    out["dense_rate"] = {"dense_tflops": dense_tflops, "matmul_probe_tflops": probe_tflops,
                         "fraction_of_probe": dense_tflops / probe_tflops if dense_tflops and probe_tflops else None,
                         "rule": "shown, not flagged: attention, norms, softmax and AdamW are not products"}
    return out


def judge(result: dict, smoke: bool) -> dict:
    """The GPT-step targets (TARGETS) from the headlines; a smoke run judges nothing (status "smoke")."""
    out = {}
    for variant, threshold in TARGETS.items():
        measured = (result["headline"].get(variant) or {}).get("speedup")
        verdict = ({"status": "not judged (smoke)", "met": None, "recorded": False} if smoke
                   else judged(measured, threshold, None))
        out[f"gpt_step_{variant}"] = {"description": f"GPT training step tokens/s, {variant}, d_model "
                                                     f"{result['config']['d_model']}, against the fastest dense "
                                                     f"relu2 in the run",
                                      "variant": variant, "threshold": threshold, "measured": measured, **verdict}
    return out


def format_gpt(gpt: dict) -> str:
    """The GPT section's rows: ms, tokens/s, speed-up over dense relu2 alone, the headline, the paired ratio."""
    def f(value, spec=".2f", suffix=""):
        return "-" if value is None else format(value, spec) + suffix
    cfg = gpt.get("config", {})
    lines = [f"GPT step ({cfg.get('n_layer')} layers, d_model {cfg.get('d_model')}, {gpt.get('tokens_per_step')} "
             f"tokens, AdamW, bf16 autocast, eager); speed-ups over dense relu2",
             f"  {'variant':<16} {'ms':>8} {'tokens/s':>11} {'x alone':>8} {'x fastest':>10} {'x paired [min, max]':>21}"
             f" {'x gelu':>7}  FFN output rel err vs reference products"]
    heads = gpt.get("headline", {})
    for variant, r in gpt.get("variants", {}).items():
        h = heads.get(variant, {})
        paired = (f"{h['paired_ratio']:.3f} [{h['paired_min']:.2f}, {h['paired_max']:.2f}]"
                  if h.get("paired_ratio") is not None else "-")
        check = (r.get("loss_check") or {}).get("ffn_out_rel_err")
        lines.append(f"  {variant:<16} {f(r.get('ms')):>8} {f(r.get('tokens_per_s'), ',.0f'):>11} "
                     f"{f(r.get('speedup_vs_dense'), '.3f'):>8} {f(h.get('speedup'), '.3f'):>10} {paired:>21} "
                     f"{f(h.get('vs_dense_gelu'), '.3f'):>7}  {f(check, '.1e')}"
                     + (f"  ({r['error'][:160]})" if r.get("error") else ""))
    if (gpt.get("paired") or {}).get("error"):
        lines.append(f"  paired rounds: {gpt['paired']['error'][:200]}")
    rate = heads.get("dense_rate") or {}
    dense = gpt.get("variants", {}).get(gpt.get("dense", DENSE), {})
    lines.append(f"  dense relu2: {f(dense.get('tflops'), '.0f')} TFLOP/s alone, "
                 f"{f(rate.get('dense_tflops'), '.0f')} TFLOP/s at the fastest dense relu2 of the run "
                 f"({f(rate.get('fraction_of_probe'), '.0%')} of the start-of-run matmul probe, "
                 f"{f(rate.get('matmul_probe_tflops'), '.0f')} TFLOP/s)")
    for t in gpt.get("targets", {}).values():
        lines.append(f"target {t['description']}: >= {t['threshold']}x, measured {f(t['measured'], '.3f', 'x')} "
                     f"-> {t['status']}")
    return "\n".join(lines)


def smoke_settings(gpt: dict | None = None) -> Settings:
    """Tiny CPU settings for tests and ``--smoke``."""
    return gpt_settings(True, dict(gpt or DEFAULTS["smoke"]), reps=1, warmup=0, rounds=1, idle_s=0.0)

