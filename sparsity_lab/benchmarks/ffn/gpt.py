"""A GPT training step (the lab's model, AdamW included) dense against 2:4: tokens/s (``NOTES["gpt_step"]``)."""
from __future__ import annotations

import statistics
import time

import torch

from .measure import Recorder, StatsWindow, _cleanup, median_ms
from ...lab.model import is_block_linear
from .schema import GPT_PAIRED_VARIANTS, GPT_VARIANTS
from .settings import Settings
from .variants import method_for, sparse_backend


# --- the GPT training step -------------------------------------------------------------------------------
def measure_gpt(s: Settings, rec: Recorder) -> dict:
    """Tokens/s of one GPT training step (AdamW included), dense against 2:4 FFNs, same model and batch."""
    from ...flops import gpt_config_flops_per_token, tflops
    from ...lab.model import GPTConfig

    g = s.gpt
    cfg = GPTConfig(vocab_size=256, context=g["context"], n_layer=g["n_layer"], n_head=g["n_head"],
                    d_model=g["d_model"], bias=False, dropout=0.0)
    tokens = g["batch"] * g["context"]
    print(f"GPT step: {g['n_layer']} layers, d_model {g['d_model']}, {tokens} tokens per step ...", flush=True)
    result = {"config": dict(g, vocab_size=256, ffn=cfg.hidden), "tokens_per_step": tokens, "variants": {}}
    for variant in GPT_VARIANTS:
        record, err = rec.attempt(f"gpt {variant}", lambda variant=variant: _gpt_variant(variant, cfg, g, s))
        result["variants"][variant] = record if record is not None else {"ms": None, "error": err}
        _cleanup(s.device)
    dense_ms = result["variants"]["dense"].get("ms")
    result["dense_flops_per_token"] = sum(gpt_config_flops_per_token(cfg).values())
    for record in result["variants"].values():
        ms = record.get("ms")
        record["tokens_per_s"] = tokens / ms * 1e3 if ms else None
        record["speedup_vs_dense"] = dense_ms / ms if dense_ms and ms else None
    if dense_ms:  # the products' FLOPs (flops.gpt_train_flops_per_token) over the dense step's time
        result["variants"]["dense"]["tflops"] = tflops(result["dense_flops_per_token"] * tokens, dense_ms)
    if s.rounds:
        paired, err = rec.attempt("gpt paired rounds", lambda: _gpt_paired(cfg, g, s))
        result["paired"] = paired if paired is not None else {"error": err}
    return result


def variant_selection(variant: str):
    """(the FFN variant whose method it uses, select for ``sparsify``): "<v>_all_linears" -> (v, every block
    linear); otherwise (variant, None: the FFN linears, sparsify's default)."""
    if variant.endswith("_all_linears"):
        return variant[: -len("_all_linears")], is_block_linear
    return variant, None


def _gpt_build(variant: str, cfg, g: dict, s: Settings):
    """(model, step, last_loss, record) of one GPT variant: AdamW, bf16 autocast, one fixed random batch."""
    import sparsity_lab as sl
    from ...lab.model import GPT

    cuda = s.device.type == "cuda"
    gen = torch.Generator(device=s.device).manual_seed(2)
    idx = torch.randint(0, 256, (g["batch"], g["context"]), device=s.device, generator=gen)
    targets = torch.randint(0, 256, (g["batch"], g["context"]), device=s.device, generator=gen)
    torch.manual_seed(0)
    with s.device:
        model = GPT(cfg)
    record: dict = {}
    if variant != "dense":
        base, select = variant_selection(variant)
        sl.sparsify(model, method_for(base, s), select=select)
        record["method"] = model.blocks[0].mlp.fc.method.describe()
        record["sparse_layers"] = len(sl.sparse_layers(model))
        record["select"] = "attention and FFN linears of every block" if select else "FFN linears"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if cuda else None)
    if variant != "dense":
        sl.attach_optimizer(model, opt)  # as training does: masked decay before, step counters after
    last_loss: list[torch.Tensor] = []

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(s.device.type, dtype=s.dtype):
            _, loss = model(idx, targets)
        loss.backward()
        opt.step()
        last_loss[:] = [loss.detach()]
    return model, step, last_loss, record


def _gpt_variant(variant: str, cfg, g: dict, s: Settings) -> dict:
    cuda = s.device.type == "cuda"
    model, step, last_loss, record = _gpt_build(variant, cfg, g, s)
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


def _gpt_paired(cfg, g: dict, s: Settings) -> dict:
    """GPT_PAIRED_VARIANTS built side by side and timed in turns, each turn after ``s.idle_s`` of idle GPU
    (NOTES["paired"]). The top-level speed-up keys are ours_mvue's (FFN linears 2:4); ``by_variant``
    holds every variant's."""
    import dataclasses

    built = {v: _gpt_build(v, cfg, g, s) for v in GPT_PAIRED_VARIANTS}
    try:
        for _, step, _, _ in built.values():
            median_ms(step, s)  # warm-up
        once = dataclasses.replace(s, warmup=0)
        round_ms: dict[str, list[float]] = {v: [] for v in built}
        names = list(built)
        for r in range(s.rounds):
            for v in names[r % len(names):] + names[:r % len(names)]:
                if s.idle_s and s.device.type == "cuda":
                    torch.cuda.synchronize()
                    time.sleep(s.idle_s)
                round_ms[v].append(median_ms(built[v][1], once))
    finally:
        built = None
        _cleanup(s.device)
    by_variant = {}
    for v in names:
        if v == "dense":
            continue
        ratios = [a / b for a, b in zip(round_ms["dense"], round_ms[v])]
        by_variant[v] = {"round_speedups": ratios, "speedup_vs_dense": statistics.median(ratios),
                         "speedup_min": min(ratios), "speedup_max": max(ratios),
                         "ms": statistics.median(round_ms[v])}
    return {"round_ms": round_ms, "idle_s_before_turn": s.idle_s, "dense_ms": statistics.median(round_ms["dense"]),
            **{k: by_variant["ours_mvue"][k] for k in ("round_speedups", "speedup_vs_dense", "speedup_min",
                                                       "speedup_max")},
            "by_variant": by_variant}
