"""Command-line options shared by ``train``, ``compare`` and ``decay-search``, and their error policy.

Every option defaults to "not given" (argparse.SUPPRESS) and the dataclass defaults fill in, so a
command can tell what the user actually set (``train --resume`` refuses settings that would change
the resumed trajectory).
"""
from __future__ import annotations

import argparse
import functools
import math
import sys
from dataclasses import MISSING, fields, replace
from pathlib import Path

from ..backends import available_backends, get_backend
from .arguments import (backend_name, closed_fraction, command_errors, existing_path, fraction_or_none,
                        nonnegative_float, nonnegative_int, positive_float, positive_int)
from ..methods.config import METHODS
from .checkpoint import CheckpointError
from .data import load_corpus
from .model import ACT24_WEIGHT_GRADS, ACTIVATION_SPARSITY, ARCHS, FFN_KINDS, SPARSE_SELECTIONS, GPTConfig
from .structures import STRUCTURES
from .tokens import BPE_PREFIX, BYTES, DATA_FORMATS, require, tokenizer_spec, train_bpe, vocab_size
from .trainer import TrainConfig, TrainingDiverged

_MODEL_DEFAULTS = {f.name: f.default for f in fields(GPTConfig)}
_TRAIN_DEFAULTS = {f.name: f.default for f in fields(TrainConfig) if f.default is not MISSING}
S = argparse.SUPPRESS  # "not given": the dataclass default applies
HEAD_WIDTH = 64  # the width of one attention head in GPT-2 and nanoGPT (and in the default 384 / 6)

# option dest -> GPTConfig field
MODEL_OPTIONS = {"layers": "n_layer", "heads": "n_head", "width": "d_model", "context": "context",
                 "ffn": "ffn_kind", "ffn_hidden": "ffn_hidden",
                 "activation_sparsity": "activation_sparsity", "act24_weight_grads": "act24_weight_grads",
                 "act24_dense_fraction": "act24_dense_fraction", "model": "arch"}
# option dest -> TrainConfig field (same name)
TRAIN_OPTIONS = ("data", "data_max_bytes", "data_format", "text_field", "batch_size", "grad_accum", "steps", "lr",
                 "min_lr_ratio", "warmup_steps", "weight_decay", "grad_clip", "eval_interval", "eval_batches",
                 "seed", "device", "precision")
# speed and logging options (TrainConfig fields too; they leave the trajectory alone)
SPEED_OPTIONS = ("track_flips", "log_interval", "cuda_graph", "masks_in_graph", "bf16_weights", "compile")
TRAJECTORY_OPTIONS = (*MODEL_OPTIONS, *TRAIN_OPTIONS, "tokenizer", "select", "tokens", "transposable",
                      "mask_refresh_interval", "backend", "method", "decay", "mvue", "fp8_sim", "dense_finetune_at",
                      "bf16_weights")


def token_count(text) -> float:
    """A token budget: a finite number >= 1 (1e6 and 1000000 alike)."""
    value = positive_float(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a token count >= 1, got {text!r}")
    return value


def dead_fraction(text) -> float:
    """prune_regrow's share of dead blocks, in [0, 1)."""
    value = closed_fraction(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text!r}")
    return value


def method_name(text) -> str:
    """A method of METHODS or a structure (spelled as ``method_from_name`` accepts it)."""
    def canonical(name: str) -> str:
        return name.lower().replace("-", "").replace("_", "")

    known = {canonical(n) for n in (*METHODS, *(cls.__name__ for cls in METHODS.values()), *STRUCTURES)}
    if canonical(str(text)) not in known:
        raise argparse.ArgumentTypeError(f"unknown method {text!r}; expected one of "
                                         f"{sorted(METHODS)} or the structures {sorted(STRUCTURES)}")
    return text


def default_heads(width: int) -> int:
    """Attention heads for a model of width ``width`` when --heads is not given.

    Heads of width HEAD_WIDTH where the width allows it (384 -> 6, 128 -> 2, 64 -> 1); otherwise the
    largest divisor of the width below width / HEAD_WIDTH, and at least 1 (so any width works).
    """
    target = max(1, width // HEAD_WIDTH)
    return next(h for h in range(target, 0, -1) if width % h == 0)


def model_options(args: argparse.Namespace) -> dict:
    """GPTConfig fields from the options; the head count follows the width unless --heads is given."""
    a = vars(args)
    kw = {field: a[opt] for opt, field in MODEL_OPTIONS.items() if opt in a}
    width = kw.get("d_model", _MODEL_DEFAULTS["d_model"])
    if not isinstance(width, int) or width < 1:
        raise ValueError(f"--width must be a positive integer, got {width!r}")
    if kw.get("arch") == "llama" and "ffn_kind" not in kw:
        kw["ffn_kind"] = "swiglu"  # Llama's MLP
    if "n_head" not in kw:
        kw["n_head"] = default_heads(width)
    elif kw["n_head"] < 1:
        raise ValueError(f"--heads must be a positive integer, got {kw['n_head']}")
    elif width % kw["n_head"]:
        divisors = [h for h in range(1, min(width, 64) + 1) if width % h == 0]
        raise ValueError(f"--heads {kw['n_head']} does not divide --width {width} (each head gets width/heads "
                         f"dimensions): choose one of {divisors}, or leave --heads out "
                         f"(default for width {width}: {default_heads(width)})")
    return kw


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Model, data, optimisation and 2:4 options (every command that trains)."""
    d, t = _MODEL_DEFAULTS, _TRAIN_DEFAULTS
    g = parser.add_argument_group("model (a GPT, or a Llama, on bytes)")
    g.add_argument("--model", choices=ARCHS, default=S, help="gpt: the lab's GPT; llama: Hugging Face "
                   "transformers' LlamaForCausalLM with these sizes, 2:4 on mlp.gate/up/down_proj (needs the "
                   "hf extra: pip install -e \".[hf]\"; default gpt)")
    g.add_argument("--layers", type=positive_int, default=S, help=f"transformer blocks (default {d['n_layer']})")
    g.add_argument("--heads", type=positive_int, default=S,
                   help=f"attention heads, must divide --width (default: heads "
                   f"of width {HEAD_WIDTH}, i.e. the largest divisor of the width that is at most width/{HEAD_WIDTH}, "
                   f"at least 1: {default_heads(d['d_model'])} at width {d['d_model']}, 2 at 128, 1 at 64)")
    g.add_argument("--width", type=positive_int, default=S,
                   help=f"model width d, divisible by 4 for 2:4 (default {d['d_model']})")
    g.add_argument("--context", type=positive_int, default=S, help=f"context length in bytes (default {d['context']})")
    g.add_argument("--ffn", choices=FFN_KINDS, default=S, help=f"FFN kind (default {d['ffn_kind']}; "
                   "swiglu with --model llama)")
    g.add_argument("--ffn-hidden", type=positive_int, default=S,
                   help="FFN hidden width (default 4d for gelu and relu2, "
                   "8d/3 rounded up to 16 for gated kinds)")
    g.add_argument("--activation-sparsity", choices=ACTIVATION_SPARSITY, default=S,
                   help="2:4: prune the squared-ReLU activation (needs --ffn relu2) to 2:4 along the hidden "
                   "dimension and multiply it as the sparse operand of the down projection; --method then puts "
                   "2:4 weights on both FFN linears (dense = activation sparsity alone), and "
                   "--dense-finetune-at switches both to dense for the last steps (default none)")
    g.add_argument("--act24-weight-grads", choices=ACT24_WEIGHT_GRADS, default=S,
                   help="with --activation-sparsity 2:4: the FFN weight gradients dense (exact, default) or tokens24: "
                   "2:4 along a random permutation of the tokens, the --act24-dense-fraction most active hidden "
                   "features kept exact")
    g.add_argument("--act24-dense-fraction", type=closed_fraction, default=S,
                   help=f"with --act24-weight-grads tokens24: share of hidden features whose weight gradients stay "
                   f"dense (default {d['act24_dense_fraction']})")
    g = parser.add_argument_group("data")
    g.add_argument("--data", metavar="PATH", type=existing_path, default=S,
                   help="a text file or folder (default: the Python "
                   "standard library's own .py files, no download)")
    g.add_argument("--data-max-bytes", type=positive_int, default=S,
                   help=f"cap on the corpus size (default {t['data_max_bytes']})")
    g.add_argument("--tokenizer", type=tokenizer_spec, default=S, metavar="bytes|bpe:VOCAB|FILE.json",
                   help="bytes (default: vocabulary 256), a tokenizers .json file, or bpe:VOCAB: a byte-level BPE "
                   "of at most VOCAB tokens trained on the training split and saved as OUT/tokenizer.json "
                   "(needs the data extra: pip install \"sparsity-lab[data]\")")
    g.add_argument("--data-format", choices=DATA_FORMATS, default=S,
                   help="text (default): --data's files read as text; datasets: read with Hugging Face datasets "
                   "(.jsonl/.json/.csv/.parquet/.txt files or a save_to_disk folder; the data extra)")
    g.add_argument("--text-field", default=S, metavar="COLUMN",
                   help="with --data-format datasets: the column holding the text (default text)")
    g = parser.add_argument_group("training")
    g.add_argument("--batch-size", type=positive_int, default=S,
                   help=f"sequences per micro-batch (default {t['batch_size']})")
    g.add_argument("--grad-accum", type=positive_int, default=S,
                   help=f"micro-batches per optimizer step (default {t['grad_accum']})")
    budget = g.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=positive_int, default=S, help=f"optimizer steps (default {t['steps']})")
    budget.add_argument("--tokens", type=token_count, default=S, help="token budget instead of --steps (steps = "
                        "ceil(tokens / (batch * grad_accum * context)))")
    g.add_argument("--lr", type=positive_float, default=S, help=f"peak AdamW learning rate (default {t['lr']})")
    g.add_argument("--min-lr-ratio", type=closed_fraction, default=S,
                   help=f"cosine floor as a fraction of lr (default {t['min_lr_ratio']})")
    g.add_argument("--warmup-steps", type=nonnegative_int, default=S,
                   help="linear warm-up steps (default 5%% of the steps)")
    g.add_argument("--weight-decay", type=nonnegative_float, default=S,
                   help=f"AdamW weight decay on matrices (default {t['weight_decay']})")
    g.add_argument("--grad-clip", type=nonnegative_float, default=S,
                   help=f"gradient norm clip, 0 = off (default {t['grad_clip']})")
    g.add_argument("--eval-interval", type=positive_int, default=S,
                   help=f"steps between validations (default {t['eval_interval']})")
    g.add_argument("--eval-batches", type=positive_int, default=S,
                   help=f"validation batches (default {t['eval_batches']})")
    g.add_argument("--seed", type=nonnegative_int, default=S,
                   help=f"seed for weights and batches (default {t['seed']})")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default=S, help="default auto")
    g.add_argument("--precision", choices=("auto", "bf16", "fp32"), default=S,
                   help="auto: bf16 autocast on a GPU, fp32 on the CPU")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = parser.add_argument_group("speed and logging")
    g.add_argument("--log-interval", type=positive_int, default=S, help="steps between logged rows (default 1); the "
                   "rows' device reads (flip counts) run only on those steps")
    g.add_argument("--cuda-graph", action="store_true", default=S, help="replay each step's forward and "
                   "backward from a CUDA graph (CudaGraphStep; a CUDA GPU, --grad-accum 1)")
    g.add_argument("--masks-in-graph", action=argparse.BooleanOptionalAction, default=S, help="with --cuda-graph: "
                   "refresh the masks that are due every step inside the graph, or (the default, "
                   "--no-masks-in-graph) eagerly before each replay: as fast or faster for the lab's steps on the H100; "
                   "inside is much faster for steps of a millisecond or less")
    g.add_argument("--bf16-weights", action="store_true", default=S, help="hold the linear weights in bf16 (what the "
                   "products read: no per-step weight casts) with float32 master weights in the optimizer; masks, "
                   "S-STE and MVUE work on the bf16 weights (needs bf16 autocast: a GPU or --precision bf16)")
    g.add_argument("--compile", action="store_true", default=S, help="run the training forward through "
                   "torch.compile (fuses norms, residual adds, activations and casts; each 2:4 layer stays one custom op)")
    g.add_argument("--track-flips", action="store_true", default=S, help="dense only: compute the would-be "
                   "2:4 masks every step for the reference flip-rate curve (slower; off by default)")
    g = parser.add_argument_group("2:4")
    g.add_argument("--transposable", action="store_true", default=S, help="transposable 2:4 masks (2:4 along "
                   "in and out: the input gradient can be sparse too)")
    g.add_argument("--mask-refresh-interval", type=positive_int, default=S, help="optimizer steps between mask "
                   "computations (default 1: every step)")
    g.add_argument("--backend", type=backend_name, default=S,
                   help=f"how the 2:4 products run: one of {available_backends()} "
                   "(default torch, the reference)")
    g.add_argument("--select", choices=SPARSE_SELECTIONS, default=S, help="which linears are 2:4: ffn (the FFN's, "
                   "default) or all_linears (every linear of a block: attention qkv and proj too)")


def add_method_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("method")
    g.add_argument("--method", type=method_name, default=S, help=f"one of {sorted(METHODS)}, or the structures "
                   f"{sorted(STRUCTURES)} (default ste)")
    g.add_argument("--decay", type=nonnegative_float, default=S, help="lambda_W for srste (default 2e-4), masked_decay "
                   "and masked_decay_weights (default 6e-5, the GPT-2 124M reference); see "
                   "`sparsity-lab decay-search`")
    g.add_argument("--mvue", action="store_true", default=S, help="MVUE 2:4 weight gradient (S-STE's recipe)")
    g.add_argument("--fp8-sim", action="store_true", default=S, help="simulate FP8 products (E4M3 forward, "
                   "E5M2 gradients, per-tensor scales) around --backend: numerics only, not faster")
    g.add_argument("--dyad-blocks", type=positive_int, default=S, help="dyad: number of blocks n (default 4)")
    g.add_argument("--dyad-variant", choices=("it", "ot", "dt"), default=S, help="dyad: which side is "
                   "permuted (default it)")
    g.add_argument("--sparsity", type=dead_fraction, default=S,
                   help="prune_regrow: fraction of dead blocks (default 0.9)")
    g.add_argument("--block-size", type=int, choices=(1, 4, 8, 16), default=S, help="prune_regrow: block size "
                   "(default 16)")
    g.add_argument("--regrow-every", type=positive_int, default=S, help="prune_regrow: steps between updates "
                   "(default steps/50)")
    g.add_argument("--dense-finetune-at", type=fraction_or_none, default=S, help="fraction of the steps after "
                   "which the layers run dense ('none' = never; masked_decay defaults to 5/6)")


def given(args: argparse.Namespace, *names: str) -> list[str]:
    """The options among names that the user set."""
    return [n for n in names if n in vars(args)]


def common_method_options(args: argparse.Namespace) -> dict:
    opts = {}
    if "transposable" in vars(args):
        opts["transposable"] = True
    if "mask_refresh_interval" in vars(args):
        opts["mask_refresh_interval"] = args.mask_refresh_interval
    if "backend" in vars(args):
        opts["backend"] = args.backend
    return opts


def config_from_args(args: argparse.Namespace, **overrides) -> TrainConfig:
    """A TrainConfig from the parsed options; overrides win (e.g. method, method_options, paths)."""
    a = vars(args)
    model = GPTConfig(**model_options(args))
    if model.arch == "llama":  # a missing extra is a one-line error before any data is read
        from .llama import require_transformers
        try:
            require_transformers()
        except ImportError as err:
            raise ValueError(f"--model llama: {err}") from None
    kw = {name: a[name] for name in TRAIN_OPTIONS + SPEED_OPTIONS + ("select",) if name in a}
    spec = a.get("tokenizer", BYTES)
    if spec.startswith(BPE_PREFIX):
        raise ValueError(f"--tokenizer {spec}: train it first (resolve_tokenizer), then pass its file")
    if spec != BYTES:  # the model's vocabulary is the tokenizer's
        kw["tokenizer"] = str(Path(spec).resolve())
        model = replace(model, vocab_size=vocab_size(spec))
    if "tokens" in a:
        if not a["tokens"] >= 1:
            raise ValueError(f"--tokens must be >= 1, got {a['tokens']!r}")
        per_step = kw.get("batch_size", _TRAIN_DEFAULTS["batch_size"]) * kw.get("grad_accum", 1) * model.context
        kw["steps"] = max(1, math.ceil(a["tokens"] / per_step))
    steps = kw.get("steps", _TRAIN_DEFAULTS["steps"])
    kw.setdefault("warmup_steps", max(1, round(0.05 * steps)))
    kw["progress"] = not a.get("no_progress", False)
    kw.update(overrides)
    return TrainConfig(model=model, **kw)


def check_data_options(args: argparse.Namespace, out: str | None = "OUT") -> None:
    """The data and tokenizer options' packages and places, before any work (ValueError naming the option).
    out: where a trained tokenizer would be saved (None: nowhere, so bpe:VOCAB is refused)."""
    a = vars(args)
    spec = a.get("tokenizer", BYTES)
    if spec != BYTES:
        require("tokenizers", f"--tokenizer {spec}")
    if spec.startswith(BPE_PREFIX) and out is None:
        raise ValueError(f"--tokenizer {spec} saves the trained tokenizer in --out: give --out (or a tokenizer file)")
    if spec.startswith(BPE_PREFIX) and a.get("parallel", "none") != "none":
        raise ValueError(f"--tokenizer {spec} with --parallel: train the tokenizer once first (e.g. a one-process run "
                         "with --stop-at 1) and pass its OUT/tokenizer.json")
    if a.get("data_format", "text") == "datasets":
        require("datasets", "--data-format datasets")
        if "data" not in a:
            raise ValueError("--data-format datasets reads --data: give a file or folder")
    elif a.get("text_field", "text") != "text":  # (the default, as a resolved config writes it, is harmless)
        raise ValueError("--text-field goes with --data-format datasets")


def resolve_tokenizer(args: argparse.Namespace, out: str | Path) -> None:
    """--tokenizer bpe:VOCAB: train a byte-level BPE on the training split of --data and save it as
    OUT/tokenizer.json; args.tokenizer then names that file (as if it had been given)."""
    spec = vars(args).get("tokenizer", BYTES)
    if not spec.startswith(BPE_PREFIX):
        return
    a = vars(args)
    corpus = load_corpus(a.get("data"), a.get("data_max_bytes", _TRAIN_DEFAULTS["data_max_bytes"]),
                         data_format=a.get("data_format", "text"), text_field=a.get("text_field", "text"))
    text = bytes(corpus.train.numpy().tobytes()).decode("utf-8", errors="replace")
    path = train_bpe(text, int(spec[len(BPE_PREFIX):]), Path(out) / "tokenizer.json")
    print(f"trained a byte-level BPE of {vocab_size(path):,} tokens on the training split: {path}")
    args.tokenizer = str(path)


def resolved_from_config(config: TrainConfig) -> dict:
    """{option dest: value} of what a run resolved (head count, warm-up, steps from a token budget, method
    options), for the options that map onto its TrainConfig (the resolved config file of a run)."""
    out = {opt: getattr(config.model, field) for opt, field in MODEL_OPTIONS.items()}
    out.update({name: getattr(config, name) for name in (*TRAIN_OPTIONS, *SPEED_OPTIONS, "select")})
    out["tokenizer"] = config.tokenizer or BYTES
    out["method"] = config.method
    opts = config.method_options
    for name in ("decay", "dense_finetune_at", "mask_refresh_interval", "backend"):
        if name in opts:
            out[name] = opts[name]
    for flag in ("transposable", "mvue"):
        out[flag] = bool(opts.get(flag, False))
    return {k: v for k, v in out.items() if v is not None}


def cli_errors(command: str):
    """Turn user errors into one clear line on stderr and exit status 2 (no traceback).

    A --backend that cannot be created here (triton not installed, no GPU and no interpreter) is
    such an error too: it is created first, before any data is read or model built.
    """
    def wrap(fn):
        guarded = command_errors(command, (CheckpointError, TrainingDiverged))(fn)

        @functools.wraps(fn)
        def run(args):
            backend = vars(args).get("backend")
            if isinstance(backend, str) and backend in available_backends():
                try:
                    get_backend(backend)
                except RuntimeError as err:
                    print(f"sparsity-lab {command}: error: --backend {backend}: {err}", file=sys.stderr)
                    return 2
            return guarded(args)
        return run
    return wrap
