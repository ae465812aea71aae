"""``python -m benchmarks act24-accuracy``: the accuracy of 2:4 activations, five lab runs per seed.

    python -m benchmarks.act24_accuracy --seeds 0 1 2 --device cuda

Each seed trains five settings of the lab GPT (``lab.trainer.Trainer``, the loop of ``sparsity-lab
train``) on the same bytes with the same trainer options:

    gelu       dense, y = W2 gelu(W1 x)
    relu2      dense, y = W2 relu(W1 x)^2: the dense twin of the two below
    act24      relu2 with 2:4 activations (``--activation-sparsity 2:4``, method dense, transposable)
    act24_ste  2:4 activations and 2:4 weights on both FFN linears (STE, transposable), both dense for the
               last tenth of the steps (``--dense-finetune-at 0.9``)
    act24_tok24  act24 with the FFN weight gradients 2:4 along permuted tokens (``--act24-weight-grads
               tokens24``, 5 % of the hidden features dense; ``references.act24_tokens``); its summary adds
               ``tokens24_dropped``: the share of A24 and dH that the token-dimension 2:4 drops, measured
               after training on the first validation batch (mean over blocks)

The defaults are the sizes of the first recording (one seed, run by hand): 4 layers, width 256, context
256, 32 sequences per step, 400 steps, validation every 100 steps on 10 batches. The 2:4 products run on
``--backend`` (default: cusparselt on a GPU, the torch reference on the CPU).

Writes ``act24_accuracy_<gpu or cpu>.json`` (``--out-dir``, ``--name``) with provenance:
    runs      the first seed's runs, {setting: {"summary", "evals"}} (the layout of the first recording,
              read by notebook 13): the summary of ``train`` (config and corpus included) and the
              validation rows with the natural sparsity of the squared ReLU (act_zero, act_le2)
    seeds     {seed: {setting: summary}} for every seed (final_val_loss, tokens/s, last act_zero/act_le2)
    verdicts  ``act24_verdicts.judge_act24``'s four verdicts, with their rules (not judged below 3 seeds or
              200 steps)
"""
from __future__ import annotations

import argparse
import gc
import shlex
import sys
import time
from dataclasses import dataclass
from sparsity_lab.lab.arguments import backend_name, existing_path, nonnegative_int, output_folder, positive_int

SETTINGS_ORDER = ("gelu", "relu2", "act24", "act24_ste", "act24_tok24")
DEFAULTS = {"layers": 4, "width": 256, "context": 256, "batch_size": 32, "steps": 400, "eval_interval": 100,
            "eval_batches": 10}
DENSE_FINETUNE_AT = 0.9  # act24_ste: the last tenth of the steps dense


@dataclass(frozen=True)
class Setting:
    ffn: str  # ffn_kind
    activation_sparsity: str
    method: str
    two_four: bool  # 2:4 activations or weights: the backend and transposable masks apply
    weight_grads: str = "dense"  # with 2:4 activations: GPTConfig.act24_weight_grads

    def method_options(self, backend: str) -> dict:
        if not self.two_four:
            return {}
        options = {"transposable": True, "backend": backend}
        if self.method != "dense":
            options["dense_finetune_at"] = DENSE_FINETUNE_AT
        return options


SETTINGS = {
    "gelu": Setting("gelu", "none", "dense", False),
    "relu2": Setting("relu2", "none", "dense", False),
    "act24": Setting("relu2", "2:4", "dense", True),
    "act24_ste": Setting("relu2", "2:4", "ste", True),
    "act24_tok24": Setting("relu2", "2:4", "dense", True, "tokens24"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    parser.add_argument("--seeds", type=nonnegative_int, nargs="+", default=[0, 1, 2], help="seeds (default 0 1 2; a "
                        "verdict needs at least 3)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: cuda when a GPU is present (default)")
    parser.add_argument("--backend", type=backend_name, default=None,
                        help="products of the 2:4 settings (default: cusparselt "
                        "on a GPU, torch on the CPU)")
    parser.add_argument("--layers", type=positive_int, default=d["layers"],
                        help=f"transformer blocks (default {d['layers']})")
    parser.add_argument("--width", type=positive_int, default=d["width"],
                        help=f"d_model, divisible by 4 (default {d['width']})")
    parser.add_argument("--heads", type=positive_int, default=None, help="attention heads (default: heads of width 64)")
    parser.add_argument("--context", type=positive_int, default=d["context"],
                        help=f"bytes per sequence (default {d['context']})")
    parser.add_argument("--batch-size", type=positive_int, default=d["batch_size"],
                        help=f"sequences per step (default {d['batch_size']})")
    parser.add_argument("--steps", type=positive_int, default=d["steps"],
                        help=f"optimizer steps (default {d['steps']})")
    parser.add_argument("--eval-interval", type=positive_int, default=d["eval_interval"],
                        help=f"steps between validations (default {d['eval_interval']})")
    parser.add_argument("--eval-batches", type=positive_int, default=d["eval_batches"],
                        help=f"validation batches (default {d['eval_batches']})")
    parser.add_argument("--data", metavar="PATH", type=existing_path, default=None,
                        help="text file or folder (default: the Python "
                        "standard library's .py files)")
    parser.add_argument("--data-max-bytes", type=positive_int, default=None,
                        help="cap on the corpus (default: train's)")
    parser.add_argument("--out-dir", type=output_folder, default=None, help="folder of the JSON (default results/)")
    parser.add_argument("--name", default=None, help="JSON name without .json (default act24_accuracy_<gpu or cpu>)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def check_args(args: argparse.Namespace) -> None:
    """ValueError naming the flag for input the runs cannot take."""
    for flag in ("layers", "width", "context", "batch_size", "steps", "eval_interval", "eval_batches"):
        value = getattr(args, flag)
        if value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be a positive integer, got {value}")
    if args.width % 4:
        raise ValueError(f"--width must be divisible by 4 (2:4 groups along the FFN's dimensions), got {args.width}")
    if args.heads is not None and (args.heads < 1 or args.width % args.heads):
        raise ValueError(f"--heads must be a positive divisor of --width {args.width}, got {args.heads}")
    if any(s < 0 for s in args.seeds) or len(set(args.seeds)) != len(args.seeds):
        raise ValueError(f"--seeds must be distinct integers >= 0, got {args.seeds}")
    if args.data_max_bytes is not None and args.data_max_bytes < 1:
        raise ValueError(f"--data-max-bytes must be a positive integer, got {args.data_max_bytes}")
    if args.name is not None and (not args.name or "/" in args.name or args.name.endswith(".json")):
        raise ValueError(f"--name must be a file name without folder or .json, got {args.name!r}")


def check_backend(backend: str) -> None:
    """ValueError naming --backend when it is unknown or cannot run here (before any training)."""
    from sparsity_lab.backends import available_backends, get_backend

    if backend not in available_backends():
        raise ValueError(f"--backend must be one of {available_backends()}, got {backend!r}")
    try:
        get_backend(backend)
    except RuntimeError as err:
        raise ValueError(f"--backend {backend}: {err}") from None


def device_tag(device) -> str:
    """'h100' for an 'NVIDIA H100 80GB HBM3', 'cpu' on the CPU (the result file's suffix)."""
    import torch

    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).split()
    return name[1].lower() if len(name) > 1 else "gpu"


def train_config(setting: str, seed: int, args: argparse.Namespace, device: str, backend: str):
    """The TrainConfig of one run: ``sparsity-lab train``'s defaults with the sizes of ``args``."""
    from sparsity_lab.lab.model import GPTConfig
    from sparsity_lab.lab.options import default_heads
    from sparsity_lab.lab.trainer import TrainConfig

    s = SETTINGS[setting]
    model = GPTConfig(n_layer=args.layers, n_head=args.heads or default_heads(args.width), d_model=args.width,
                      context=args.context, ffn_kind=s.ffn, activation_sparsity=s.activation_sparsity,
                      act24_weight_grads=s.weight_grads)
    extra = {} if args.data_max_bytes is None else {"data_max_bytes": args.data_max_bytes}
    return TrainConfig(method=s.method, method_options=s.method_options(backend), model=model, data=args.data,
                       batch_size=args.batch_size, steps=args.steps, warmup_steps=max(1, round(0.05 * args.steps)),
                       eval_interval=args.eval_interval, eval_batches=args.eval_batches, seed=seed, device=device,
                       progress=False, **extra)


def one_run(config, corpus) -> dict:
    """Train one setting: {"summary": train's summary (config, corpus, wall_s), "evals": validation rows}."""
    import torch

    from sparsity_lab.lab.trainer import Trainer

    start = time.perf_counter()
    trainer = Trainer(config, corpus=corpus)
    try:
        summary = trainer.run()
        summary.update(config=trainer.config.to_dict(), corpus=trainer.corpus.describe(),
                       wall_s=time.perf_counter() - start)
        evals = [{k: v for k, v in row.items() if k in ("step", "loss", "val_loss") or k.startswith("act_")}
                 for row in trainer.history if row.get("val_loss") is not None]
        if config.model.act24_weight_grads == "tokens24":
            summary["tokens24_dropped"] = tokens24_dropped_after(trainer)
    finally:
        trainer.close()
        del trainer
        gc.collect()  # this run's model and optimizer go before the next one is built
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {"summary": summary, "evals": evals}


def tokens24_dropped_after(trainer) -> dict:
    """The share of A24 (for dW2) and dH (for dW1) that the token-dimension 2:4 drops, on the trained model:
    one forward and backward of the first validation batch (eval mode, no optimizer step, gradients
    cleared after), ``Act24MLP.record_dropped`` on. {"dW2_mass", "dW1_mass", "dW2_count", "dW1_count"}: means
    over the blocks of ``tokens24_dropped``'s mass_fraction and count_fraction, and ``per_block``."""
    import statistics

    from sparsity_lab.activation24 import act24_modules

    mods = act24_modules(trainer.model)
    x, y = trainer.val_batches[0]
    trainer.model.eval()
    try:
        for _, m in mods:
            m.record_dropped, m.last_dropped = True, {}
        with trainer._autocast():
            _, loss = trainer.model(x, y)
        loss.backward()
    finally:
        trainer.model.zero_grad(set_to_none=True)
        trainer.model.train()
        for _, m in mods:
            m.record_dropped = False
    per_block = {name: dict(m.last_dropped) for name, m in mods}
    out = {f"{w}_{k}": statistics.fmean(d[w][f"{k}_fraction"] for d in per_block.values())
           for w in ("dW2", "dW1") for k in ("mass", "count")}
    return {**out, "per_block": per_block}


def seed_summary(run: dict) -> dict:
    """What ``seeds`` keeps of a run: the final loss, speed, and the last measured activation sparsity."""
    s = run["summary"]
    out = {k: s[k] for k in ("describe", "step", "tokens", "final_val_loss", "median_tokens_per_s", "wall_s")}
    last = run["evals"][-1] if run["evals"] else {}
    for key in ("act_zero", "act_le2"):
        if key in last:
            out[key] = last[key]
    if "tokens24_dropped" in s:
        out["tokens24_dropped"] = {k: v for k, v in s["tokens24_dropped"].items() if k != "per_block"}
    return out


def record(args: argparse.Namespace) -> dict:
    """Every setting at every seed; the payload of the JSON (without provenance)."""
    from tqdm.auto import tqdm

    from sparsity_lab.lab.data import load_corpus
    from sparsity_lab.lab.trainer import TrainConfig, resolve_device
    from benchmarks.act24_verdicts import MIN_SEEDS, MIN_STEPS, judge_act24

    device = resolve_device(args.device)
    backend = args.backend or ("cusparselt" if device.type == "cuda" else "torch")
    check_backend(backend)
    max_bytes = args.data_max_bytes or TrainConfig.data_max_bytes
    corpus = load_corpus(args.data, max_bytes, min_split_bytes=args.context + 1)
    runs, seeds = {}, {}
    jobs = [(seed, setting) for seed in args.seeds for setting in SETTINGS_ORDER]
    bar = tqdm(jobs, desc="act24 accuracy", disable=args.no_progress, dynamic_ncols=True)
    for seed, setting in bar:
        bar.set_postfix_str(f"seed {seed} {setting}")
        run = one_run(train_config(setting, seed, args, device.type, backend), corpus)
        if seed == args.seeds[0]:
            runs[setting] = run
        seeds.setdefault(str(seed), {})[setting] = seed_summary(run)
    bar.close()
    finals = {seed: {k: v["final_val_loss"] for k, v in per.items()} for seed, per in seeds.items()}
    return {
        "settings": {"seeds": list(args.seeds), "runs_seed": args.seeds[0], "device": device.type, "backend": backend,
                     **{k: getattr(args, k) for k in DEFAULTS}, "heads": args.heads, "data": args.data,
                     "data_max_bytes": max_bytes, "dense_finetune_at": DENSE_FINETUNE_AT,
                     "variants": {k: {"ffn": s.ffn, "activation_sparsity": s.activation_sparsity, "method": s.method,
                                      "weight_grads": s.weight_grads,
                                      "method_options": s.method_options(backend)} for k, s in SETTINGS.items()},
                     "min_seeds_for_a_verdict": MIN_SEEDS, "min_steps_for_a_verdict": MIN_STEPS},
        "runs": runs,
        "seeds": seeds,
        "verdicts": judge_act24(finals, steps=args.steps),
    }


def command_line(args: argparse.Namespace, device: str, backend: str) -> str:
    """The command that repeats this run, every size spelled out."""
    parts = ["python", "-m", "benchmarks", "act24-accuracy", "--seeds", *map(str, args.seeds), "--device", device,
             "--backend", backend]
    for key in DEFAULTS:
        parts += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    for key in ("heads", "data", "data_max_bytes"):
        if getattr(args, key) is not None:
            parts += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    return shlex.join(parts)


def format_result(result: dict) -> str:
    from sparsity_lab.lab.flip_bands import verdict_lines

    lines = []
    for seed, per in result["seeds"].items():
        lines.append(f"seed {seed}: " + ", ".join(f"{k} {v['final_val_loss']:.4f}" for k, v in per.items()))
        drop = (per.get("act24_tok24") or {}).get("tokens24_dropped")
        if drop:
            lines.append(f"  act24_tok24 after training: dropped mass dW2 {drop['dW2_mass']:.2%}, "
                         f"dW1 {drop['dW1_mass']:.2%} (non-zeros dropped {drop['dW2_count']:.2%}, "
                         f"{drop['dW1_count']:.2%})")
    lines.append(verdict_lines(result["verdicts"]))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import torch

    from sparsity_lab.lab.trainer import TrainingDiverged
    from sparsity_lab.provenance import write_result

    try:
        check_args(args)
        if args.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA GPU is available here; use --device cpu")
        result = record(args)
    except (ValueError, OSError, TrainingDiverged) as err:  # OSError names its path (--data)
        print(f"python -m benchmarks act24-accuracy: error: {err}", file=sys.stderr)
        return 2
    print(format_result(result))
    s = result["settings"]
    name = args.name or f"act24_accuracy_{device_tag(torch.device(s['device']))}"
    path = write_result(name, result, command=command_line(args, s["device"], s["backend"]), directory=args.out_dir)
    print("wrote", path)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.act24_accuracy",
                                     description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
