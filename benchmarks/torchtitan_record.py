"""Run torchtitan 0.3's trainer with the 2:4 layers and record what it logged: losses, tokens/s, memory,
flip rate, step times, 2:4 checks, with the run's provenance, as JSON. Run from the clone's root (the
benchmarks are not installed):

    SPARSITY_LAB_RECORD=results/run.json torchrun --standalone --nproc-per-node 4 -m benchmarks.torchtitan_train \\
        --module benchmarks.torchtitan_record --config llama3_debugmodel \\
        --sparsity24.method sste --sparsity24.mvue --training.steps 300 --metrics.log_freq 1

The arguments are torchtitan's; ``--config`` names any ``llama3_*`` config (as in
``sparsity_lab.integrations.torchtitan``, whose trainer this one extends); ``--sparsity24.method dense``
is the dense baseline through the same trainer. Around each ``train_step`` it

- times the step (the device synchronised before and after; the first steps include warm-up),
- keeps every metric torchtitan's metrics processor logs (``metrics.log_freq = 1`` for every step):
  loss, ``throughput(tps)`` (tokens/s per device), ``memory/max_reserved(GiB)``, ``sparsity/flip_rate``, ...
- checks every 2:4 layer after the optimizer step: its mask keeps exactly 2 of every 4 weights along the
  input dimension (the mask of this rank's rows under FSDP2),

and rank 0 writes them to ``$SPARSITY_LAB_RECORD``. With ``$SPARSITY_LAB_PROFILE_STEPS=FIRST:COUNT`` it also
runs steps FIRST .. FIRST+COUNT-1 under torch.profiler and records rank 0's GPU time per step by kind of
work (``benchmarks.step_categories``, NCCL's kernels as ``communication``) and its 25 longest kernels.
Kernels of different streams overlap (FSDP2's all-gathers run beside the products), so the parts can
sum to more than the step.

Beside torchtitan's ``llama3_*`` configs it offers ``llama3_sized``: a Llama 3 whose sizes come from
``$SPARSITY_LAB_TITAN_MODEL`` (``dim=2048,layers=8,heads=16,vocab=8192``; those are the defaults), with
causal SDPA attention (no compilation), reading a local JSON-lines text file through the dataset
``jsonl_text`` (``--dataloader.dataset_path FILE.jsonl``, one ``{"text": ...}`` document a line) and a
tokenizer folder (``--hf_assets_path``). ``python -m benchmarks torchtitan-gpus`` prepares both and runs it.
"""
import dataclasses
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor
from torchtitan.tools import utils as titan_utils  # its device_module read at each use (the CPU smoke run swaps it)

from benchmarks.torchtitan_gpus import PROFILE_ENV, profile_window
from sparsity_lab.integrations import torchtitan as tt
from sparsity_lab.provenance import provenance
from sparsity_lab.training_hooks import sparse_layers

RECORD_ENV = "SPARSITY_LAB_RECORD"
MODEL_ENV = "SPARSITY_LAB_TITAN_MODEL"
DEFAULT_SIZES = {"dim": 2048, "layers": 8, "heads": 16, "vocab": 8192}
JSONL_DATASET = "jsonl_text"


def nonzeros_per_group(weight: torch.Tensor, m: int = 4) -> torch.Tensor:
    """(out, in) -> (out, in/m) count of non-zeros in each group of m consecutive inputs."""
    return (weight.detach() != 0).reshape(weight.shape[0], -1, m).sum(-1)


def check_24(model_parts) -> dict:
    """The 2:4 state of every 2:4 layer of the model parts now (this rank's part of a sharded mask)."""
    layers = [(name, layer) for part in model_parts for name, layer in sparse_layers(part)]
    if not layers:
        return {"layers": 0, "masks_exactly_2_of_4": None, "dense_now": []}
    local = [layer.mask.to_local() if isinstance(layer.mask, DTensor) else layer.mask for _, layer in layers]
    return {"layers": len(layers), "masks_exactly_2_of_4": all(bool((nonzeros_per_group(m) == 2).all()) for m in local),
            "dense_now": [name for name, layer in layers if layer.dense_now]}


class RecordingTrainer(tt.Sparsity24Trainer):
    """``Sparsity24Trainer`` recording each step's metrics, time and the layers' 2:4 state."""

    @dataclass(kw_only=True, slots=True)
    class Config(tt.Sparsity24Trainer.Config):
        pass

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.record = {"metrics": {}, "step_s": {}, "checks": {}, "before_training": check_24(self.model_parts)}
        log = self.metrics_processor.logger.log

        def keep(metrics, step):
            self.record["metrics"][step] = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
            return log(metrics, step)

        self.metrics_processor.logger.log = keep

    def train_step(self, data_iterator):
        window = profile_window(os.environ.get(PROFILE_ENV, ""))
        if window and self.step == window[0]:
            self.profiler = start_profiler()
        titan_utils.device_module.synchronize()
        start = time.perf_counter()
        super().train_step(data_iterator)
        titan_utils.device_module.synchronize()
        self.record["step_s"][self.step] = time.perf_counter() - start
        self.record["checks"][self.step] = check_24(self.model_parts)
        if window and self.step == window[0] + window[1] - 1 and getattr(self, "profiler", None) is not None:
            self.profiler.stop()
            self.record["profile"] = profile_summary(self.profiler, window)
            self.profiler = None

    def train(self):
        super().train()
        self.write_record()

    def write_record(self) -> None:
        path = os.environ.get(RECORD_ENV)
        if not path or torch.distributed.get_rank() != 0:
            return
        import torchtitan

        rec, config = self.record, self.config
        steps = sorted(rec["step_s"])
        times = [rec["step_s"][s] for s in steps][2:]  # steps 1-2: warm-up
        metrics = [rec["metrics"][s] for s in sorted(rec["metrics"])]
        tps = [m["throughput(tps)"] for m in metrics[2:] if "throughput(tps)" in m]
        out = {
            "provenance": provenance(" ".join(sys.argv)),
            "torchtitan": torchtitan.__version__,
            "world_size": torch.distributed.get_world_size(),
            "sparsity24": dataclasses.asdict(config.sparsity24),
            "steps": config.training.steps,
            "tokens_per_step_per_device": config.training.local_batch_size * config.training.seq_len,
            "losses": [m.get("loss_metrics/global_avg_loss") for m in metrics],
            "median_tokens_per_s_per_device_after_2": statistics.median(tps) if tps else None,
            "max_reserved_gib": max((m.get("memory/max_reserved(GiB)", 0.0) for m in metrics), default=None),
            "median_step_s_after_2": statistics.median(times) if times else None,
            "metrics": metrics,
            "step_s": [rec["step_s"][s] for s in steps],
            "sparse_layers": [name for part in self.model_parts for name, _ in sparse_layers(part)],
            "check_before_training": rec["before_training"],
            "two_four_every_step": all(c["masks_exactly_2_of_4"] is not False for c in rec["checks"].values()),
            "profile": rec.get("profile"),
        }
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(out, f, indent=1, default=str)


def start_profiler():
    """A running torch.profiler recording the GPU's kernels (the CPU's operators on a CPU run)."""
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU
    prof = profile(activities=[activity])
    prof.start()
    return prof


def profile_summary(prof, window: tuple[int, int]) -> dict:
    """{ms per step by category, the 25 longest kernels (name, ms per step, calls per step)} of a stopped
    profiler that ran ``window[1]`` steps."""
    from benchmarks.step_categories import breakdown
    from benchmarks.step_profile import kernel_rows

    count = window[1]
    rows = kernel_rows(prof, count, cuda=torch.cuda.is_available())
    comm = [(n, ms) for n, ms, _ in rows if "nccl" in n.lower()]
    parts = breakdown((n, ms) for n, ms, _ in rows if "nccl" not in n.lower())
    parts["communication"] = sum(ms for _, ms in comm)
    return {"steps": list(range(window[0], window[0] + count)), "ms_per_step_by_category": parts,
            "longest_kernels": [{"name": n[:160], "ms_per_step": ms, "calls_per_step": c} for n, ms, c in rows[:25]]}


def _offer_llama3_configs() -> list[str]:
    """Each ``llama3_*`` config of ``integrations.torchtitan``, built by ``RecordingTrainer``."""
    names = []
    for name in tt.LLAMA3_CONFIGS:
        def offered(_make=getattr(tt, name)):
            config = _make()
            values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
            return RecordingTrainer.Config(**values)

        offered.__name__ = offered.__qualname__ = name
        globals()[name] = offered
        names.append(name)
    return names


LLAMA3_CONFIGS = _offer_llama3_configs()


def parse_sizes(text: str) -> dict[str, int]:
    """``"dim=2048,layers=8"`` -> DEFAULT_SIZES with those replaced (``$SPARSITY_LAB_TITAN_MODEL``)."""
    sizes = dict(DEFAULT_SIZES)
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        if key not in sizes or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"{MODEL_ENV}: expected KEY=POSITIVE_INT with KEY in {', '.join(sizes)}, got {item!r}")
        sizes[key] = int(value)
    if sizes["dim"] % sizes["heads"] or (sizes["dim"] // sizes["heads"]) % 2:
        raise ValueError(f"{MODEL_ENV}: dim ({sizes['dim']}) must be heads ({sizes['heads']}) times an even head size")
    return sizes


def sized_model(dim: int, layers: int, heads: int, vocab: int):
    """torchtitan's Llama 3 model config at these sizes (its initialisers, FFN hidden 8/3 dim rounded up to
    256), every layer's attention causal SDPA: flash attention without compilation, over the whole packed
    sequence (documents are not masked from each other; RoPE positions restart at each document)."""
    from torchtitan.models import llama3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm, compute_ffn_hidden_dim
    from torchtitan.models.common.attention import ScaledDotProductAttention

    layer_configs = llama3._build_llama3_layers(
        n_layers=layers, dim=dim, n_heads=heads, hidden_dim=compute_ffn_hidden_dim(dim, multiple_of=256),
        rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len=131072, theta=500000, scaling="llama"),
        fuse_qkv=True, attn_backend="flex")
    for layer in layer_configs:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return llama3.Llama3Model.Config(
        dim=dim, vocab_size=vocab,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=llama3._output_linear_init(dim)),
        layers=layer_configs)


def read_jsonl_text(path: str):
    """A ``datasets.Dataset`` of the ``text`` field of each line of a JSON-lines file (read in memory: no
    dataset builder, cache or hub involved)."""
    import json

    from datasets import Dataset

    if not path or not os.path.isfile(path):
        raise FileNotFoundError(f"--dataloader.dataset_path {path!r}: dataset {JSONL_DATASET!r} reads a JSON-lines "
                                "file (one {\"text\": ...} a line)")
    with open(path, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    if not texts:
        raise ValueError(f"--dataloader.dataset_path {path!r} holds no documents")
    return Dataset.from_dict({"text": texts})


def _register_jsonl_dataset() -> None:
    """Add ``jsonl_text`` to torchtitan's table of text datasets (its documented extension point)."""
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets import text_datasets

    text_datasets.DATASETS[JSONL_DATASET] = DatasetConfig(path="", loader=read_jsonl_text,
                                                          sample_processor=lambda sample: sample["text"])


def llama3_sized():
    """``llama3_debugmodel``'s job (optimizer, schedule, logging) with the model of ``$SPARSITY_LAB_TITAN_MODEL``,
    the ``jsonl_text`` dataset and an unchunked cross-entropy; validation and checkpoints off."""
    from torchtitan.components.loss import CrossEntropyLoss

    sizes = parse_sizes(os.environ.get(MODEL_ENV, ""))
    config = globals()["llama3_debugmodel"]()
    config.model_spec.model = sized_model(**sizes)
    config.model_spec.flavor = "sized(" + ",".join(f"{k}={v}" for k, v in sizes.items()) + ")"
    # the whole logits at once (small at these vocabularies): the debug config's ChunkedLossWrapper crashed in
    # backward (SIGSEGV) with torch 2.11 on the CPU, and chunking saves little here
    config.loss = CrossEntropyLoss.Config(global_vocab_size=sizes["vocab"])
    config.dataloader.dataset = JSONL_DATASET
    config.validator.enable = False
    config.checkpoint.enable = False
    return config


_register_jsonl_dataset()
