"""A GPT training step (the lab's model, AdamW included) dense against 2:4: tokens/s (``NOTES["gpt_step"]``).

The machinery is shared with ``python -m benchmarks act24``'s GPT section (``benchmarks/act24_gpt.py``): a variant is a
builder, ``build() -> Built`` (the model and its training step on one fixed batch); ``time_variant`` times
one built alone, ``paired_rounds`` times several built side by side in turns, and ``summarize`` turns
the times into tokens/s and speed-ups over a named dense variant.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, NamedTuple

import torch
from torch import nn

from benchmarks.ffn.measure import Recorder, StatsWindow, _cleanup, median_ms
from sparsity_lab.lab.model import is_block_linear
from benchmarks.ffn.schema import GPT_PAIRED_VARIANTS, GPT_VARIANTS
from benchmarks.ffn.settings import Settings
from benchmarks.ffn.variants import method_for, sparse_backend


class Built(NamedTuple):
    """One GPT variant ready to time: ``step()`` runs one training step, ``last_loss`` holds its loss."""
    model: nn.Module
    step: Callable[[], None]
    last_loss: list
    record: dict


# --- the GPT training step -------------------------------------------------------------------------------
def measure_gpt(s: Settings, rec: Recorder) -> dict:
    """Tokens/s of one GPT training step (AdamW included), dense against 2:4 FFNs, same model and batch."""
    from sparsity_lab.flops import gpt_config_flops_per_token
    from sparsity_lab.lab.model import GPTConfig

    g = s.gpt
    cfg = GPTConfig(vocab_size=256, context=g["context"], n_layer=g["n_layer"], n_head=g["n_head"],
                    d_model=g["d_model"], bias=False, dropout=0.0)
    tokens = g["batch"] * g["context"]
    print(f"GPT step: {g['n_layer']} layers, d_model {g['d_model']}, {tokens} tokens per step ...", flush=True)
    result = {"config": dict(g, vocab_size=256, ffn=cfg.hidden), "tokens_per_step": tokens, "variants": {}}
    builders = {v: (lambda v=v: _gpt_build(v, cfg, g, s)) for v in GPT_VARIANTS}
    for variant in GPT_VARIANTS:
        result["variants"][variant] = time_variant(f"gpt {variant}", builders[variant], s, rec)
    result["dense_flops_per_token"] = sum(gpt_config_flops_per_token(cfg).values())
    summarize(result, "dense")
    if s.rounds:
        paired, err = rec.attempt("gpt paired rounds", lambda: _gpt_paired(cfg, g, s))
        result["paired"] = paired if paired is not None else {"error": err}
    return result


def time_variant(where: str, build: Callable[[], Built], s: Settings, rec: Recorder) -> dict:
    """The record of one variant built and timed alone ({"ms": None, "error"} when it failed)."""
    record, err = rec.attempt(where, lambda: _time_built(build, s))
    _cleanup(s.device)
    return record if record is not None else {"ms": None, "error": err}


def summarize(result: dict, dense: str) -> None:
    """Add tokens_per_s and speedup_vs_dense (over ``dense`` timed alone) to every variant of ``result``,
    and the dense variant's achieved TFLOP/s (``dense_flops_per_token`` times the tokens, over its ms)."""
    from sparsity_lab.flops import tflops

    tokens = result["tokens_per_step"]
    dense_ms = result["variants"][dense].get("ms")
    for record in result["variants"].values():
        ms = record.get("ms")
        record["tokens_per_s"] = tokens / ms * 1e3 if ms else None
        record["speedup_vs_dense"] = dense_ms / ms if dense_ms and ms else None
    if dense_ms:  # the products' FLOPs (flops.gpt_train_flops_per_token) over the dense step's time
        result["variants"][dense]["tflops"] = tflops(result["dense_flops_per_token"] * tokens, dense_ms)


def variant_selection(variant: str):
    """(the FFN variant whose method it uses, select for ``sparsify``): "<v>_all_linears" -> (v, every block
    linear); otherwise (variant, None: the FFN linears, sparsify's default)."""
    if variant.endswith("_all_linears"):
        return variant[: -len("_all_linears")], is_block_linear
    return variant, None


def new_gpt(cfg, s: Settings) -> nn.Module:
    """The lab GPT of ``cfg`` on the settings' device, the same initial weights for every variant (seed 0)."""
    from sparsity_lab.lab.model import GPT

    torch.manual_seed(0)
    with s.device:
        return GPT(cfg)


def gpt_batch(g: dict, s: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx, targets), each (batch, context) random bytes: the one fixed batch every variant trains on."""
    gen = torch.Generator(device=s.device).manual_seed(2)
    idx = torch.randint(0, 256, (g["batch"], g["context"]), device=s.device, generator=gen)
    targets = torch.randint(0, 256, (g["batch"], g["context"]), device=s.device, generator=gen)
    return idx, targets


def training_step(model: nn.Module, g: dict, s: Settings) -> tuple[Callable[[], None], list]:
    """(step, last_loss): one AdamW step (fused on CUDA) under bf16 autocast on one fixed random batch of
    ``g["batch"]`` x ``g["context"]`` bytes, hooked as the trainer hooks it: ``attach_optimizer`` when the
    model has 2:4 layers (masked decay before the step, step counters after), the activation schedule
    when it has 2:4 activations (``Act24MLP``'s step counters)."""
    import sparsity_lab as sl
    from sparsity_lab.activation24 import act24_modules, attach_activation_schedule

    cuda = s.device.type == "cuda"
    idx, targets = gpt_batch(g, s)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if cuda else None)
    if sl.sparse_layers(model):
        sl.attach_optimizer(model, opt)
    if act24_modules(model):
        attach_activation_schedule(model, opt)
    last_loss: list[torch.Tensor] = []

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(s.device.type, dtype=s.dtype):
            _, loss = model(idx, targets)
        loss.backward()
        opt.step()
        last_loss[:] = [loss.detach()]
    return step, last_loss


def _gpt_build(variant: str, cfg, g: dict, s: Settings) -> Built:
    """One benchmarks ffn GPT variant: dense, or ``sparsify`` with the variant's method (AdamW, bf16 autocast)."""
    import sparsity_lab as sl

    model = new_gpt(cfg, s)
    record: dict = {}
    if variant != "dense":
        base, select = variant_selection(variant)
        sl.sparsify(model, method_for(base, s), select=select)
        record["method"] = model.blocks[0].mlp.fc.method.describe()
        record["sparse_layers"] = len(sl.sparse_layers(model))
        record["select"] = "attention and FFN linears of every block" if select else "FFN linears"
    step, last_loss = training_step(model, g, s)
    return Built(model, step, last_loss, record)


def _time_built(build: Callable[[], Built], s: Settings) -> dict:
    cuda = s.device.type == "cuda"
    model, step, last_loss, record = build()
    backend = sparse_backend(model)
    window = StatsWindow(backend) if backend is not None else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    try:
        record["ms"] = median_ms(step, s)
        record["loss_after"] = float(last_loss[0])
        if window is not None:
            record["backend"] = backend.name
            record["stats_per_step"] = window.per_step(s.warmup + s.reps)
        if cuda:
            record["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        return record
    finally:
        model = step = None  # release the model and its optimizer state before the next variant
        last_loss.clear()


def paired_rounds(builders: dict[str, Callable[[], Built]], dense: str, s: Settings) -> dict:
    """The variants of ``builders`` built side by side and timed in turns, ``s.rounds`` rounds, the order
    rotated every round, each turn after ``s.idle_s`` of idle GPU (NOTES["paired"]); per variant the
    speed-up over ``dense`` within each round and their median: {"round_ms", "idle_s_before_turn",
    "dense_ms", "by_variant": {variant: {"round_speedups", "speedup_vs_dense", "speedup_min",
    "speedup_max", "ms"}}}."""
    import dataclasses

    if dense not in builders:
        raise ValueError(f"dense must be one of the builders {sorted(builders)}, got {dense!r}")
    built = {v: build() for v, build in builders.items()}
    try:
        for b in built.values():
            median_ms(b.step, s)  # warm-up
        once = dataclasses.replace(s, warmup=0)
        round_ms: dict[str, list[float]] = {v: [] for v in built}
        names = list(built)
        for r in range(s.rounds):
            for v in names[r % len(names):] + names[:r % len(names)]:
                if s.idle_s and s.device.type == "cuda":
                    torch.cuda.synchronize()
                    time.sleep(s.idle_s)
                round_ms[v].append(median_ms(built[v].step, once))
    finally:
        built = None
        _cleanup(s.device)
    by_variant = {}
    for v in names:
        if v == dense:
            continue
        ratios = [a / b for a, b in zip(round_ms[dense], round_ms[v])]
        by_variant[v] = {"round_speedups": ratios, "speedup_vs_dense": statistics.median(ratios),
                         "speedup_min": min(ratios), "speedup_max": max(ratios),
                         "ms": statistics.median(round_ms[v])}
    return {"round_ms": round_ms, "idle_s_before_turn": s.idle_s, "dense_ms": statistics.median(round_ms[dense]),
            "by_variant": by_variant}


def _gpt_paired(cfg, g: dict, s: Settings) -> dict:
    """GPT_PAIRED_VARIANTS built side by side and timed in turns (``paired_rounds``). The top-level
    speed-up keys are ours_mvue's (FFN linears 2:4); ``by_variant`` holds every variant's."""
    out = paired_rounds({v: (lambda v=v: _gpt_build(v, cfg, g, s)) for v in GPT_PAIRED_VARIANTS}, "dense", s)
    mvue = out["by_variant"]["ours_mvue"]
    return {**{k: out[k] for k in ("round_ms", "idle_s_before_turn", "dense_ms")},
            **{k: mvue[k] for k in ("round_speedups", "speedup_vs_dense", "speedup_min", "speedup_max")},
            "by_variant": out["by_variant"]}
