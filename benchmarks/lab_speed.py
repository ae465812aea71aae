"""``python -m benchmarks lab-speed``: tokens/s of the lab's own training loop, dense against 2:4.

What a researcher sees first is ``sparsity-lab train``; this runs that loop (``lab.trainer.Trainer``:
data sampling, AdamW, clipping, the non-finite check, logging every ``--log-interval`` steps) for a few
dozen steps per variant and width, and reports the median tokens/s of the logged rows after the first
``--skip-steps`` (algorithm searches, compiles, the graph capture). The lab GPT: 4 layers, 16 heads,
context 1024, batch 8, bf16 autocast, widths 2048 and 4096 by default.

Variants (``VARIANTS``; "graph" ones use ``--cuda-graph``, i.e. ``CudaGraphStep``):

  dense, dense_graph                  the plain GPT (no masks: ``track_flips`` off)
  dense_track_flips                   dense with its would-be 2:4 masks computed every step (what the
                                      dense run of ``compare`` pays for its flip-rate curve)
  sste_mvue, sste_mvue_graph          S-STE + MVUE, transposable masks, backend cusparselt, mask every step
  sste_mvue_refresh40_graph           the same with a mask refresh interval of 40 (its flip rate recorded)
  dense_fp8_graph, sste_mvue_fp8_graph the FP8 recipe on dense FP8 tensor cores ("fp8_dense") and on FP8
                                      2:4 sparse ones ("cusparselt_fp8"), graphed; ratios against the
                                      bfloat16 dense runs and FP8 2:4 against dense FP8
  sste_mvue_graph_eager_masks         sste_mvue_graph with its masks refreshed eagerly before each replay
                                      (``--no-masks-in-graph``, the default of ``--cuda-graph``)
  sste_mvue_graph_masks_in_graph      ... and inside the graph (``--masks-in-graph``): with a graphed run of
                                      each kind, ``ratios`` gives ``masks_in_graph_speedup`` (each record's
                                      ``masks_in_graph`` says which kind it is)

Each run starts after ``--idle-s`` seconds of idle GPU, with the GPU's clocks and power sampled per run
(``conditions.ConditionSampler``), and a dense matmul probe at the start and the end of the whole
benchmark. Ratios: each 2:4 variant against dense in the same mode (eager or graph), and the headline
against the fastest dense of the run (``conditions.headline``). Writes results/lab_speed_h100.json.
``--smoke``: CPU, a tiny model, backend "torch" (graph variants recorded as errors): the plumbing only.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import traceback
from typing import NamedTuple

import torch

from benchmarks.conditions import ConditionSampler, format_conditions, headline, matmul_probe
from sparsity_lab.lab.arguments import backend_name, nonnegative_float, nonnegative_int, output_folder, positive_int


class Variant(NamedTuple):
    method: str
    options: dict
    graph: bool  # --cuda-graph
    track: bool  # --track-flips (dense)
    masks_in_graph: bool = False  # with graph: True is --masks-in-graph


SSTE_MVUE = {"mvue": True, "transposable": True}
VARIANTS = {
    "dense": Variant("dense", {}, False, False),
    "dense_graph": Variant("dense", {}, True, False),
    "dense_track_flips": Variant("dense", {}, False, True),
    "sste_mvue": Variant("sste", SSTE_MVUE, False, False),
    "sste_mvue_graph": Variant("sste", SSTE_MVUE, True, False),
    "sste_mvue_graph_eager_masks": Variant("sste", SSTE_MVUE, True, False, masks_in_graph=False),
    "sste_mvue_graph_masks_in_graph": Variant("sste", SSTE_MVUE, True, False, masks_in_graph=True),
    "sste_mvue_refresh40_graph": Variant("sste", {**SSTE_MVUE, "mask_refresh_interval": 40}, True, False),
    # FP8 training (E4M3 products, delayed per-tensor scaling): its own backends whatever --backend says
    "dense_fp8_graph": Variant("dense", {"backend": "fp8_dense"}, True, False),
    "sste_mvue_fp8_graph": Variant("sste", {**SSTE_MVUE, "backend": "cusparselt_fp8"}, True, False),
}
DEFAULT_VARIANTS = ("dense", "sste_mvue", "dense_graph", "sste_mvue_graph", "sste_mvue_refresh40_graph")
MODEL = dict(n_layer=4, n_head=16, context=1024)
SMOKE_MODEL = dict(n_layer=1, n_head=2, context=32)


def run_variant(name: str, width: int, args, corpus, sampler: ConditionSampler) -> dict:
    """One training run of ``name`` at ``width``: its rows' median tokens/s after the skipped steps."""
    from sparsity_lab.lab.model import GPTConfig
    from sparsity_lab.lab.trainer import TrainConfig, Trainer, graph_step_report

    method, options, graph, track, masks_in_graph = VARIANTS[name]
    options = dict(options)
    if method != "dense" and "backend" not in options:
        options["backend"] = args.backend
    model = GPTConfig(d_model=width, **(SMOKE_MODEL if args.smoke else MODEL))
    cfg = TrainConfig(method=method, method_options=options, model=model, batch_size=args.batch, steps=args.steps,
                      warmup_steps=1, eval_interval=10**6, eval_batches=1, log_interval=args.log_interval,
                      device="cpu" if args.smoke else "cuda", progress=False, track_flips=track, cuda_graph=graph,
                      masks_in_graph=masks_in_graph, seed=0)
    record: dict = {"variant": name, "width": width, "method": method, "method_options": options,
                    "cuda_graph": graph, "track_flips": track, "masks_in_graph": masks_in_graph}
    trainer = None
    try:
        if not args.smoke:
            torch.cuda.synchronize()
            time.sleep(args.idle_s)  # every run starts from the same idle GPU state
        with sampler.section(f"{name} d{width}"):
            t0 = time.monotonic()
            trainer = Trainer(cfg, corpus=corpus)
            trainer.run()
            record["wall_s"] = time.monotonic() - t0
        rows = [r for r in trainer.history if r["step"] > args.skip_steps]
        speeds = [r["tokens_per_s"] for r in rows]
        record.update(tokens_per_step=cfg.tokens_per_step, params=trainer.model.num_params(),
                      rows_timed=len(rows), tokens_per_s=statistics.median(speeds) if speeds else None,
                      tokens_per_s_rows=speeds, loss_last=trainer.history[-1]["loss"],
                      val_loss=trainer.history[-1]["val_loss"])
        flips = [r["flip_rate"] for r in trainer.history if r.get("flip_rate") is not None]
        record["flip_rates_logged"] = flips
        if trainer.layers:  # flips per mask computation, over every computation of the run
            layers = [layer for _, layer in trainer.layers]
            computed = sum(max(0, layer.mask_updates - 1) * layer.mask.numel() for layer in layers)
            record["mask_updates_per_layer"] = layers[0].mask_updates
            record["flip_rate_per_refresh"] = (sum(layer.flips_total for layer in layers) / computed
                                               if computed else None)
        if trainer.graph_step is not None:  # captures, eager steps, where the masks were refreshed
            record["graph_captures"] = trainer.graph_step.recaptures
            record["graph_step"] = graph_step_report(trainer.graph_step)
    except Exception as err:  # noqa: BLE001 - recorded, the benchmark goes on
        record["error"] = f"{type(err).__name__}: {err}"[:1000]
        text = traceback.format_exc()  # the head names the first failing call of a chained error
        record["traceback"] = text if len(text) <= 6000 else text[:3000] + "\n...\n" + text[-3000:]
        print(f"  error in {name} d{width}: {record['error'][:200]}", flush=True)
    finally:
        if trainer is not None:
            trainer.close()
        trainer = None
        gc.collect()  # a reference cycle must not keep this run's GPU memory into the next
        if not args.smoke:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            # what this run left behind for the next (a later run of one process once ran out of memory)
            record["cuda_gib_left_allocated"] = torch.cuda.memory_allocated() / 2**30
            record["cuda_gib_left_reserved"] = torch.cuda.memory_reserved() / 2**30
            record["cuda_gib_peak"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
    return record


def ratios(records: list[dict]) -> dict:
    """Per width: each 2:4 variant against dense in the same mode, and against the fastest dense."""
    out: dict = {}
    for width in sorted({r["width"] for r in records}):
        at = {r["variant"]: r for r in records if r["width"] == width}

        def ms_per_step(v: str) -> float | None:  # tokens/s -> ms per step (conditions.headline takes times)
            r = at.get(v) or {}
            return r["tokens_per_step"] / r["tokens_per_s"] * 1e3 if r.get("tokens_per_s") else None
        # the bfloat16 dense runs: the FP8 variants are judged against them too (dense_fp8_graph beside)
        dense = {"eager": ms_per_step("dense"), "graph": ms_per_step("dense_graph")}
        width_out = {}
        for v in at:
            if v.startswith("dense"):
                continue
            same_mode = "graph" if VARIANTS[v][2] else "eager"
            h = headline(dense, ms_per_step(v))
            width_out[v] = {"speedup_vs_fastest_dense": h["speedup"], "fastest_dense": h["dense_source"],
                            "speedup_vs_dense_same_mode": h["against"][same_mode],
                            "speedup_vs_dense_other_mode": h["against"]["graph" if same_mode == "eager" else "eager"]}
        if at.get("dense_track_flips", {}).get("tokens_per_s") and dense["eager"]:
            width_out["dense_track_flips_cost"] = 1 - ms_per_step("dense") / ms_per_step("dense_track_flips")
        fp8_24, fp8_dense = ms_per_step("sste_mvue_fp8_graph"), ms_per_step("dense_fp8_graph")
        if fp8_24 and fp8_dense:  # FP8 2:4 against the dense FP8 recipe, both graphed
            width_out["fp8_24_vs_dense_fp8_graph"] = fp8_dense / fp8_24
        if fp8_dense and dense["graph"]:
            width_out["dense_fp8_vs_dense_graph"] = dense["graph"] / fp8_dense
        # the graphed S-STE + MVUE runs (mask every step) by where their masks were refreshed (the records
        # say it: "sste_mvue_graph" refreshed them inside the graph until that stopped being the default)
        graphed = [v for v, r in at.items() if v.startswith("sste_mvue_graph") and r.get("tokens_per_s")]
        in_graph = next((ms_per_step(v) for v in graphed if at[v].get("masks_in_graph")), None)
        eager_masks = next((ms_per_step(v) for v in graphed if at[v].get("masks_in_graph") is False), None)
        if in_graph and eager_masks:  # > 1: refreshing the masks inside the graph is faster
            width_out["masks_in_graph_speedup"] = eager_masks / in_graph
        out[str(width)] = width_out
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--widths", type=positive_int, nargs="+", default=None, help="model widths (default 2048 4096)")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma-separated, from {list(VARIANTS)}")
    p.add_argument("--steps", type=positive_int, default=40, help="optimizer steps per run")
    p.add_argument("--skip-steps", type=nonnegative_int, default=10, help="steps left out of the median (warm-up)")
    p.add_argument("--log-interval", type=positive_int, default=5)
    p.add_argument("--batch", type=positive_int, default=8)
    p.add_argument("--backend", type=backend_name, default="cusparselt",
                   help="backend of the 2:4 runs (default cusparselt)")
    p.add_argument("--idle-s", type=nonnegative_float, default=2.0, help="idle GPU seconds before each run")
    p.add_argument("--out-dir", type=output_folder, default=None)
    p.add_argument("--name", default=None, help="JSON name (default lab_speed_h100; lab_speed_smoke)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, backend torch: the plumbing only")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks lab-speed", description=__doc__.split("\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


def check_arguments(args: argparse.Namespace) -> None:
    """--variants from VARIANTS (ValueError naming it), checked before any work."""
    bad = [v.strip() for v in args.variants.split(",") if v.strip() and v.strip() not in VARIANTS]
    if bad or not args.variants.strip(","):
        raise ValueError(f"--variants: unknown {bad}; choose from {list(VARIANTS)}")


def run(args: argparse.Namespace) -> int:
    from sparsity_lab.lab.data import load_corpus
    from sparsity_lab.provenance import write_result

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    problems = ([f"--variants: unknown {bad}; choose from {list(VARIANTS)}"] if bad else [])
    problems += [f"--{k.replace('_', '-')} must be >= 1, got {getattr(args, k)}"
                 for k in ("steps", "log_interval", "batch") if getattr(args, k) < 1]
    if args.skip_steps < 0 or args.skip_steps >= args.steps:
        problems.append(f"--skip-steps must be in [0, --steps), got {args.skip_steps}")
    if problems:
        print("benchmarks lab-speed: " + "; ".join(problems), file=sys.stderr)
        return 2
    if args.smoke:
        args.widths = args.widths or [64]
        args.backend, args.idle_s = "torch", 0.0
    elif not torch.cuda.is_available():
        print("benchmarks lab-speed needs a CUDA GPU; --smoke runs the plumbing on the CPU", file=sys.stderr)
        return 2
    widths = args.widths or [2048, 4096]
    corpus = load_corpus(None, 200_000 if args.smoke else 20_000_000, min_split_bytes=MODEL["context"] + 1)
    sampler = ConditionSampler(False if args.smoke else None).start()
    device = "cpu" if args.smoke else "cuda"
    records, probes = [], {}
    try:
        with sampler.section("matmul probe (start)"):
            probes["start"] = matmul_probe(8192, max(widths), 4 * max(widths), device, label="start")
        for width in widths:
            for name in variants:
                print(f"{name} at width {width} ...", flush=True)
                records.append(run_variant(name, width, args, corpus, sampler))
                if args.out_dir:  # what is measured so far survives a killed run
                    write_result((args.name or "lab_speed") + "_partial", {"records": records}, directory=args.out_dir)
        with sampler.section("matmul probe (end)"):
            probes["end"] = matmul_probe(8192, max(widths), 4 * max(widths), device, label="end")
    finally:
        sampler.stop()
    result = {"smoke": args.smoke, "model": {**(SMOKE_MODEL if args.smoke else MODEL), "batch": args.batch,
                                             "widths": widths},
              "steps": args.steps, "skip_steps": args.skip_steps, "log_interval": args.log_interval,
              "idle_s": args.idle_s, "backend": args.backend, "records": records, "ratios": ratios(records),
              "matmul_probe": probes, "conditions": sampler.summary(),
              "notes": {"tokens_per_s": "median over the logged rows after skip_steps; a row's tokens/s is its "
                                        "steps' tokens over the wall time between the non-finite checks that "
                                        "bound them (one host sync per step)",
                        "masks_in_graph_speedup": "ms per step of the graphed S-STE + MVUE run with its masks "
                                                  "refreshed eagerly before each replay / the one refreshing "
                                                  "them inside the graph (records' masks_in_graph)",
                        "flip_rate_per_refresh": "flips over every mask computation of the run / (computations "
                                                 "after the first x mask size): early training, a few dozen "
                                                 "steps, so higher than later in a run"}}
    name = args.name or ("lab_speed_smoke" if args.smoke else "lab_speed_h100")
    path = write_result(name, result, directory=args.out_dir)
    print(format_conditions(result["conditions"]))
    for r in records:
        tps = r.get("tokens_per_s")
        print(f"  d{r['width']:<5} {r['variant']:<28} {'error' if tps is None else f'{tps:>10,.0f} tokens/s'}"
              + (f"  flip/refresh {r['flip_rate_per_refresh']:.2e}" if r.get("flip_rate_per_refresh") else ""))
    for width, per in result["ratios"].items():
        for key, what in (("fp8_24_vs_dense_fp8_graph", "FP8 2:4 against dense FP8 (graph)"),
                          ("dense_fp8_vs_dense_graph", "dense FP8 against dense bf16 (graph)")):
            if per.get(key):
                print(f"  d{width:<5} {what}: {per[key]:.2f}x")
        if per.get("masks_in_graph_speedup"):
            print(f"  d{width:<5} masks refreshed inside the graph: {per['masks_in_graph_speedup']:.3f}x the "
                  "speed of refreshing them eagerly before each replay")
        for v, x in per.items():
            if isinstance(x, dict) and x["speedup_vs_fastest_dense"] is not None:
                same = x["speedup_vs_dense_same_mode"]
                print(f"  d{width:<5} {v:<28} {x['speedup_vs_fastest_dense']:.2f}x of the fastest dense "
                      f"({x['fastest_dense']}); same mode {'-' if same is None else format(same, '.2f')}x")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
