"""A GPT training step (the lab's model, AdamW included) dense against 2:4: tokens/s (``NOTES["gpt_step"]``)."""
from __future__ import annotations

import statistics

import torch

from .measure import Recorder, StatsWindow, _cleanup, median_ms
from .schema import GPT_VARIANTS
from .settings import Settings
from .variants import method_for, sparse_backend


# --- the GPT training step -------------------------------------------------------------------------------
def measure_gpt(s: Settings, rec: Recorder) -> dict:
    """Tokens/s of one GPT training step (AdamW included), dense against 2:4 FFNs, same model and batch."""
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
    for record in result["variants"].values():
        ms = record.get("ms")
        record["tokens_per_s"] = tokens / ms * 1e3 if ms else None
        record["speedup_vs_dense"] = dense_ms / ms if dense_ms and ms else None
    if s.rounds:
        paired, err = rec.attempt("gpt paired rounds", lambda: _gpt_paired(cfg, g, s))
        result["paired"] = paired if paired is not None else {"error": err}
    return result


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
        sl.sparsify(model, method_for(variant, s))  # default select: the FFN linears mlp.fc, mlp.proj
        record["method"] = model.blocks[0].mlp.fc.method.describe()
        record["sparse_layers"] = len(sl.sparse_layers(model))
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
    """Dense and ours_mvue GPT steps built side by side and timed in turns (NOTES["paired"])."""
    import dataclasses

    built = {v: _gpt_build(v, cfg, g, s) for v in ("dense", "ours_mvue")}
    try:
        for _, step, _, _ in built.values():
            median_ms(step, s)  # warm-up
        once = dataclasses.replace(s, warmup=0)
        round_ms: dict[str, list[float]] = {v: [] for v in built}
        for r in range(s.rounds):
            order = list(built)[r % 2:] + list(built)[:r % 2]
            for v in order:
                round_ms[v].append(median_ms(built[v][1], once))
    finally:
        built = None
        _cleanup(s.device)
    ratios = [a / b for a, b in zip(round_ms["dense"], round_ms["ours_mvue"])]
    return {"round_ms": round_ms, "round_speedups": ratios, "speedup_vs_dense": statistics.median(ratios),
            "speedup_min": min(ratios), "speedup_max": max(ratios)}
