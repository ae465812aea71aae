"""The pre-training loop: a GPT (or the Hugging Face Llama, lab/llama.py) on bytes, made 2:4 by ``sparsify``,
trained with AdamW.

One optimizer step:
    for each of grad_accum micro-batches:  loss = model(x, y) / grad_accum; loss.backward()
    clip_grad_norm_(params, grad_clip)
    optimizer.step()     <- attach_optimizer's pre-hook adds masked decay here (after clipping),
                            its post-hook advances the layers' step counters (mask refresh
                            interval, dense fine-tune switch)
    scheduler.step()     <- linear warm-up, then cosine down to min_lr_ratio * lr
Products run under bf16 autocast on a GPU and in fp32 on the CPU (``precision="auto"``).

The dense run is the plain GPT (``nn.Linear`` everywhere), timed as fast as dense can run. With
``track_flips=True`` (``--track-flips``; ``compare`` asks for it, its claims need the curve) it goes
through ``sparsify`` with ``Dense()`` instead, which keeps the products dense but computes the would-be
2:4 mask every step: the reference flip-rate curve, at the price of that mask's kernels.

Host syncs: one per step, the non-finite check before the update (a step must not be applied when
its loss or gradient norm is NaN/Inf, so the host has to know first); the loss and gradient norm
logged come from that same read. Everything else that reads the device (the flip counts, the
evaluation) runs only on the steps that are logged: every ``log_interval`` steps, at an evaluation and
at the last step. ``tokens_per_s`` of a row counts the steps since the previous row over the wall time
between the two checks.

``cuda_graph=True`` (``--cuda-graph``): forward and backward replayed by ``CudaGraphStep`` after its
eager warm-up steps (one micro-batch per step; the optimizer, clipping and hooks run eagerly). Masks are
refreshed eagerly before each replay when due; ``masks_in_graph=True`` (``--masks-in-graph``) refreshes
those due every step inside the graph instead (slightly slower for the lab's steps on the H100, much faster
for steps of a millisecond or less; ``graph_step.py``).
The summary's ``cuda_graph`` entry says which.

Two more options cut the step's non-product work: ``bf16_weights=True`` (``--bf16-weights``) holds the
linear weights in bf16, what the products read, with float32 master weights in the optimizer
(``master_weights.py``: no per-step weight casts under autocast; masks, S-STE and MVUE work on the bf16
weights; needs bf16 autocast), and ``compile=True`` (``--compile``) runs the training forward through
``torch.compile`` (Inductor fuses the norms, residual adds, activations and casts; each 2:4 layer is one
custom op, ``custom_ops.py``). The model, its checkpoint and the evaluation stay the uncompiled module.

Resume is exact: the checkpoint holds model (masks, beta and counters included), optimizer,
scheduler, the data sampler's generator and the torch RNG states, and a resumed run follows the
same loss sequence bit for bit (on the CPU; GPU kernels may not be bitwise deterministic). A run
killed at any moment (SIGKILL included, also while saving) resumes from its last complete
checkpoint to the same weights, masks, optimizer, RNG and log rows as an uninterrupted run
(``tests/test_fault_injection.py``): checkpoints are written atomically with a digest, and the
log's rows past the checkpoint are dropped on resume.

Non-finite values: when the loss or the gradient norm of a step is NaN/Inf the step is *not*
applied (no optimizer update, no decay, no counter advance, gradients dropped) and the run
stops with ``TrainingDiverged`` naming the step; weights, optimizer, step counters and the last
checkpoint are those of the step before (the failed step's forward may have refreshed a due
mask, from those finite weights). Weights never become non-finite, so neither do masks or beta.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..backends import get_backend
from ..activation24 import attach_activation_schedule, configure_activation_sparsity, weight_selector
from .activation_stats import ActivationSparsityTracker
from ..methods.config import SparsityMethod, method_from_name
from ..sparsify import flip_report, sparsify, sparsity_summary
from ..training_hooks import attach_optimizer, sparse_layers
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .data import DEFAULT_MAX_BYTES, BatchSampler, ByteCorpus, load_corpus
from .model import GPTConfig, sparse_selector
from .models import build_model
from .runlog import RunLog, clean_row
from .structures import STRUCTURES, structured_density

# Settings that do not change the trajectory: a resumed run may set them anew.
RUN_ONLY_FIELDS = ("log_path", "checkpoint_path", "checkpoint_interval", "progress")


def graph_step_report(step) -> dict:
    """What a CudaGraphStep did: captures and eager steps (those for new host scales also on their own), and
    where it refreshed the masks (and why not in the graph, per layer)."""
    return {"captures": step.recaptures, "eager_steps": step.eager_steps, "scale_recaptures": step.scale_recaptures,
            "scale_eager_steps": step.scale_eager_steps, "masks_in_graph": step.masks_in_graph,
            "mask_refresh": step.mask_refresh, "eager_refresh_reasons": step.eager_refresh_reasons}


class TrainingDiverged(RuntimeError):
    """The loss or the gradient became NaN or infinite; the step was not applied."""


@dataclass
class TrainConfig:
    method: str = "ste"
    method_options: dict = field(default_factory=dict)  # e.g. {"decay": 6e-5, "mvue": True}
    model: GPTConfig = field(default_factory=GPTConfig)
    data: str | None = None  # None: the standard library's .py files
    data_max_bytes: int = DEFAULT_MAX_BYTES
    tokenizer: str | None = None  # a tokenizers .json file (tokens.py); None: bytes (model.vocab_size 256)
    data_format: str = "text"  # "text": files read as text; "datasets": Hugging Face datasets (local files)
    text_field: str = "text"  # with data_format "datasets": the column holding the text
    batch_size: int = 16
    grad_accum: int = 1
    steps: int = 1000  # optimizer steps planned (the schedule and the dense fine-tune switch use it)
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 1.0  # 0 turns clipping off
    eval_interval: int = 100
    eval_batches: int = 10
    eval_at: tuple = ()  # extra steps to evaluate at (e.g. the dense fine-tune switch)
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU) | bf16 | fp32
    log_path: str | None = None
    checkpoint_path: str | None = None
    checkpoint_interval: int = 0  # 0: a checkpoint at the end only (when checkpoint_path is set)
    progress: bool = True
    track_flips: bool = False  # dense only: compute the would-be 2:4 mask every step (the flip-rate curve)
    log_interval: int = 1  # steps between logged rows (an evaluation step and the last step are logged too)
    cuda_graph: bool = False  # forward + backward through CudaGraphStep (a CUDA GPU, grad_accum 1)
    masks_in_graph: bool = False  # with cuda_graph: masks due every step refreshed inside the graph
    select: str = "ffn"  # which linears are 2:4: "ffn" or "all_linears" (attention projections too)
    bf16_weights: bool = False  # linear weights in bf16, float32 masters in the optimizer (bf16 autocast)
    compile: bool = False  # the training forward through torch.compile

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):
            self.model = GPTConfig(**self.model)
        self.betas, self.eval_at = tuple(self.betas), tuple(int(s) for s in self.eval_at)
        for name in ("batch_size", "grad_accum", "steps", "eval_interval", "eval_batches", "log_interval"):
            _positive_int(name, getattr(self, name))
        for name in ("warmup_steps", "checkpoint_interval", "data_max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"need lr > 0 and 0 <= min_lr_ratio <= 1, got lr={self.lr!r}, "
                             f"min_lr_ratio={self.min_lr_ratio!r}")
        if not self.grad_clip >= 0 or not self.weight_decay >= 0:
            raise ValueError(f"grad_clip and weight_decay must be >= 0, got {self.grad_clip!r}, {self.weight_decay!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be 'auto', 'bf16' or 'fp32', got {self.precision!r}")
        sparse_selector(self.select)  # ValueError naming the choices
        if self.cuda_graph and (self.model.ffn_kind == "relu2" or self.model.activation_sparsity != "none"):
            raise ValueError("cuda_graph does not run with --ffn relu2 or 2:4 activations: their measurements and "
                             "schedules run Python code in the forward, which a replay skips")
        if not isinstance(self.masks_in_graph, bool):
            raise ValueError(f"masks_in_graph must be True or False, got {self.masks_in_graph!r}")
        if self.masks_in_graph and not self.cuda_graph:
            raise ValueError("masks_in_graph=True (--masks-in-graph) is an option of the CUDA-graph step: "
                             "add --cuda-graph, or drop it")
        for name in ("bf16_weights", "compile"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.bf16_weights and self.precision == "fp32":
            raise ValueError("bf16_weights=True (--bf16-weights) runs the products in bf16 under autocast: it needs "
                             "precision 'bf16' or 'auto' on a GPU, got precision 'fp32'")
        if self.compile and self.cuda_graph:
            raise ValueError("compile=True (--compile) and cuda_graph=True (--cuda-graph) do not combine (the compiled "
                             "2:4 layers keep host-side state that a replay skips): choose one")
        if self.cuda_graph and self.grad_accum != 1:
            raise ValueError(f"cuda_graph needs grad_accum 1 (a replay overwrites the gradients), got "
                             f"grad_accum={self.grad_accum}")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.grad_accum * self.model.context

    def to_dict(self) -> dict:
        d = asdict(self)
        d["betas"], d["eval_at"] = list(self.betas), list(self.eval_at)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {sorted(unknown)}")
        if "track_flips" not in d and str(d.get("method", "")).lower() == "dense":
            d = {**d, "track_flips": True}  # saved before the option: those dense runs tracked flips
        return cls(**d)


def config_corpus(cfg: TrainConfig) -> ByteCorpus:
    """The corpus a config names (data, cap, tokenizer, format); each split holds a window of the context."""
    return load_corpus(cfg.data, cfg.data_max_bytes, min_split_bytes=cfg.model.context + 1, tokenizer=cfg.tokenizer,
                       data_format=cfg.data_format, text_field=cfg.text_field)


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def build_method(name: str, options: dict, total_steps: int):
    """The method object for a run of total_steps optimizer steps (clear errors for bad names/options):
    a 2:4 ``SparsityMethod``, or one of the structures (``dyad``, ``prune_regrow``)."""
    key = name.lower().replace("-", "_")
    try:
        if key in STRUCTURES:
            return STRUCTURES[key](total_steps=total_steps, **options)
        return method_from_name(name, total_steps=total_steps, **options)
    except TypeError as err:  # an option the method's dataclass does not have
        raise ValueError(f"method {name!r} does not take option(s) {sorted(options)}: {err}") from err


def run_method(cfg: TrainConfig):
    """The method object of a run's configuration: its method, options and planned steps (dense: with
    ``track_flips``). Two configurations train alike only if they give equal method objects."""
    options = dict(cfg.method_options)
    if cfg.method.lower() == "dense":
        options.setdefault("track_flips", cfg.track_flips)
    elif cfg.track_flips:
        raise ValueError(f"track_flips is an option of the dense run (a 2:4 method always tracks its masks' "
                         f"flips), got it with method {cfg.method!r}")
    return build_method(cfg.method, options, cfg.steps)


class WarmupCosine:
    """lr factor at step s: (s + 1) / warmup during warm-up, then cosine from 1 to min_ratio at total.

    A callable object (not a lambda) so that LambdaLR's state_dict stores it as plain numbers.
    """

    def __init__(self, warmup: int, total: int, min_ratio: float) -> None:
        self.warmup, self.total, self.min_ratio = warmup, total, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA GPU is available; use device='cpu' or 'auto'")
    return torch.device(name)


class Trainer:
    """Builds model, data, optimizer and schedule from a TrainConfig and trains.

        trainer = Trainer(TrainConfig(method="sste", steps=2000))
        summary = trainer.run()            # or run(stop_at=500) to stop early
        trainer = Trainer.resume("runs/x/checkpoint.pt"); trainer.run()

    ``history`` holds the logged rows (the same as the JSONL log) of this process.
    """

    def __init__(self, config: TrainConfig, corpus: ByteCorpus | None = None) -> None:
        self.config = cfg = config
        self.device = resolve_device(cfg.device)
        use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and self.device.type == "cuda")
        self.autocast_dtype = torch.bfloat16 if use_bf16 else None
        self.corpus = corpus if corpus is not None else config_corpus(cfg)
        if self.corpus.vocab_size != cfg.model.vocab_size:
            raise ValueError(f"the model's vocabulary ({cfg.model.vocab_size}) is not the data's "
                             f"({self.corpus.vocab_size} tokens, tokenizer {self.corpus.tokenizer or 'bytes'}): "
                             "set model.vocab_size to the tokenizer's size")

        is_dense = cfg.method.lower() == "dense"
        self.method = run_method(cfg)
        self.is_24 = isinstance(self.method, SparsityMethod)
        act24 = cfg.model.activation_sparsity != "none"
        if act24 and not self.is_24:
            raise ValueError(f"activation sparsity {cfg.model.activation_sparsity} combines with the 2:4 weight methods "
                             f"(dense included), not with the structure {cfg.method!r}")
        if self.is_24:
            cfg.model.check_nm(self.method.m, self.method.transposable)
        if cfg.bf16_weights and self.autocast_dtype != torch.bfloat16:
            raise ValueError(f"bf16_weights=True (--bf16-weights) needs bf16 autocast: this run on {self.device.type} "
                             "computes in float32; add --precision bf16")
        if cfg.cuda_graph and self.device.type != "cuda":
            raise ValueError(f"cuda_graph needs a CUDA GPU (this run is on {self.device.type}); drop --cuda-graph")
        torch.manual_seed(cfg.seed)  # the same initial weights for every method
        model = build_model(cfg.model).to(self.device)  # on the device first: masks are computed there
        # the plain dense model unless its flips are asked for (then Dense() computes the would-be masks),
        # its activations are 2:4 (the products of Act24MLP run through sparsify) or its backend runs
        # dense products in a format of its own (FP8: a dense FP8 run)
        self.plain_dense = (is_dense and not self.method.track_flips and not act24
                            and not (self.is_24 and get_backend(self.method.backend).products_in_dense_phase))
        if self.plain_dense:
            self.model = model
        else:
            # with 2:4 activations: 2:4 weights on both FFN linears (Act24MLP runs proj's products itself);
            # --select all_linears: every block linear of the GPT; else the Llama's MLP linears from the
            # Hugging Face selector table, the GPT's from the FFN names
            if act24:
                select = weight_selector
            elif cfg.select != "ffn":
                select = sparse_selector(cfg.select)
            else:
                select = getattr(model, "mlp_selector", None)
            self.model = sparsify(model, self.method, select=select) if self.is_24 else self.method.apply(model)
        self.layers = sparse_layers(self.model)
        if act24:
            configure_activation_sparsity(self.model, self.method.backend, cfg.steps, self.method.dense_finetune_at,
                                          weight_grads=cfg.model.act24_weight_grads,
                                          dense_fraction=cfg.model.act24_dense_fraction, token_seed=cfg.seed)
        # natural sparsity of squared-ReLU activations, measured at the evaluation steps
        self.act_tracker = ActivationSparsityTracker(self.model) if cfg.model.ffn_kind == "relu2" else None

        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        if cfg.bf16_weights:  # after sparsify: the masks and S-STE's beta came from the float32 weights
            from .master_weights import lower_linear_weights
            self.optimizer = lower_linear_weights(self.model, torch.optim.AdamW, param_groups=groups, lr=cfg.lr,
                                                  betas=cfg.betas)
        else:
            self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)
        # what the training steps call (the model itself is what is saved and evaluated)
        self.forward_model = torch.compile(self.model) if cfg.compile else self.model
        self.hooks = attach_optimizer(self.model, self.optimizer) if self.is_24 and not self.plain_dense else None
        self.act_hook = attach_activation_schedule(self.model, self.optimizer) if act24 else None
        # prune-and-regrow's schedule (None for 2:4 methods and DYAD); its state is checkpointed
        self.controller = None if self.is_24 else self.method.controller(self.model, self.optimizer)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, WarmupCosine(cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio))

        self.sampler = BatchSampler(self.corpus.train, cfg.batch_size, cfg.model.context, seed=cfg.seed)
        # fixed validation windows: every evaluation scores the same bytes
        val = BatchSampler(self.corpus.val, cfg.batch_size, cfg.model.context, seed=cfg.seed + 1)
        self.val_batches = [val.sample(self.device) for _ in range(cfg.eval_batches)]

        self.step = 0
        self.history: list[dict] = []
        self.log = RunLog(cfg.log_path)
        self.graph_step = None
        if cfg.cuda_graph:
            from ..graph_step import CudaGraphStep
            self.graph_step = CudaGraphStep(self.model, self._graph_loss, masks_in_graph=cfg.masks_in_graph)
        self._last_check = None  # host clock at the previous step's non-finite check
        self._since_row, self._row_seconds = 0, 0.0  # steps since the last logged row, and their seconds

    # --- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "config": self.config.to_dict(),
            "corpus": self.corpus.describe(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "controller": self.controller.state_dict() if self.controller is not None else None,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
        }

    def save(self, path: str | Path | None = None) -> Path:
        path = path or self.config.checkpoint_path
        if path is None:
            raise ValueError("no checkpoint path: pass one or set TrainConfig.checkpoint_path")
        self.log.flush()
        return save_checkpoint(path, self.state_dict())

    def load_state_dict(self, state: dict) -> None:
        self._check_same_method(state["config"])
        if state["corpus"]["sha256"] != self.corpus.fingerprint:
            raise CheckpointError(f"the data differ from the checkpoint's: {self.corpus.source!r} has sha256 "
                                  f"{self.corpus.fingerprint[:12]}..., the run was trained on {state['corpus']['source']!r} "
                                  f"with sha256 {state['corpus']['sha256'][:12]}... (a changed, truncated or corrupted "
                                  "data file); restore the data or start a new run")
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.sampler.load_state_dict(state["sampler"])
            if self.controller is not None:
                self.controller.load_state_dict(state["controller"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise CheckpointError(f"checkpoint does not fit this run: {str(err).splitlines()[0][:300]}") from err
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.step = int(state["step"])
        self.log.truncate_after(self.step)

    def _check_same_method(self, saved_config: dict) -> None:
        """Refuse a checkpoint trained with another method, other method options or another schedule of
        the method: its masks, beta and counters mean something else here (S-STE's frozen beta, say,
        would silently become what an STE run saved)."""
        try:
            saved = run_method(TrainConfig.from_dict(saved_config))
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"checkpoint holds an unusable config: {err}") from err
        if saved != self.method:
            raise CheckpointError(
                f"checkpoint does not fit this run: it was trained with method {saved_config['method']!r}, options "
                f"{saved_config['method_options']} ({saved.describe()}), this run has method {self.config.method!r}, "
                f"options {self.config.method_options} ({self.method.describe()}); resume it with Trainer.resume "
                "(which takes the checkpoint's settings), or start a new run")

    @classmethod
    def resume(cls, path: str | Path, corpus: ByteCorpus | None = None, **run_options) -> "Trainer":
        """A trainer at the checkpoint's step, with the checkpoint's settings.

        run_options may change only the settings that leave the trajectory alone (log and
        checkpoint paths, checkpoint interval, progress bar). ``path`` may also be the DCP directory
        of a run across processes (``train --parallel``), continued here on one process.
        """
        bad = set(run_options) - set(RUN_ONLY_FIELDS)
        if bad:
            raise ValueError(f"resume takes the run's settings from the checkpoint; only {RUN_ONLY_FIELDS} "
                             f"may be changed, got {sorted(bad)}")
        if Path(path).is_dir():  # the DCP checkpoint of a run across processes, continued on this one
            from .dcp_state import read_dcp_extra, restore_from_dcp
            extra = read_dcp_extra(path)
            trainer = cls(TrainConfig.from_dict({**extra["config"], **run_options}), corpus)
            restore_from_dcp(trainer, trainer.model, path, extra, no_dist=True)
            return trainer
        state = load_checkpoint(path)
        try:
            config = TrainConfig.from_dict({**state["config"], **run_options})
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"checkpoint {str(path)!r} holds an unusable config: {err}") from err
        trainer = cls(config, corpus)
        trainer.load_state_dict(state)
        return trainer

    # --- one step ------------------------------------------------------------------------------
    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _graph_loss(self, model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss CudaGraphStep captures (autocast without its weight cache, PyTorch's rule for graphs)."""
        if self.autocast_dtype is None:
            _, loss = model(x, y)
        else:
            with torch.autocast(self.device.type, dtype=self.autocast_dtype, cache_enabled=False):
                _, loss = model(x, y)
        return loss

    def _log_due(self, step: int) -> bool:
        """Whether optimizer step ``step`` (1-based) gets a logged row."""
        cfg = self.config
        return (step % cfg.log_interval == 0 or step == cfg.steps or step % cfg.eval_interval == 0
                or step in cfg.eval_at)

    def train_step(self) -> dict | None:
        """One optimizer step (grad_accum micro-batches). Returns the logged row, or None on a step that
        is not logged (``log_interval``)."""
        cfg, model = self.config, self.model
        model.train()
        if self._last_check is None:
            self._last_check = time.perf_counter()
        lr = self.optimizer.param_groups[0]["lr"]
        log = self._log_due(self.step + 1)
        if self.act_tracker is not None:
            self.act_tracker.armed = self._eval_due(self.step + 1)
        if self.graph_step is not None:
            x, y = self.sampler.sample(self.device)
            loss_sum = self.graph_step(x, y).detach().float()
        else:
            loss_sum = torch.zeros((), device=self.device)
            for _ in range(cfg.grad_accum):
                x, y = self.sampler.sample(self.device)
                with self._autocast():
                    _, loss = self.forward_model(x, y)
                (loss / cfg.grad_accum).backward()
                loss_sum += loss.detach()
        masks = self._mask_stats() if log else None  # the masks and phase this step's products used
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        # the one host sync of a step: nothing is updated before the host knows both are finite
        loss_value, norm_value = self._stop_if_not_finite(loss_sum / cfg.grad_accum, grad_norm)
        now = time.perf_counter()
        seconds, self._last_check = now - self._last_check, now
        self.optimizer.step()  # masked decay (pre-hook), then the update, then counters (post-hook)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self._since_row += 1
        self._row_seconds += seconds
        if not log:
            return None
        row = {"step": self.step, "tokens": self.step * cfg.tokens_per_step, "loss": loss_value,
               "val_loss": None, "lr": lr, "grad_norm": norm_value}
        row.update(masks)
        row.update(self._activation_stats())
        # the steps since the last row over the time between the checks that bound them
        row["tokens_per_s"] = self._since_row * cfg.tokens_per_step / max(self._row_seconds, 1e-9)
        self._since_row, self._row_seconds = 0, 0.0
        return clean_row(row)

    def _stop_if_not_finite(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> tuple[float, float]:
        """(loss, grad norm) as floats; TrainingDiverged, with the step not applied, when either is NaN/Inf.
        (clip_grad_norm_'s total norm is non-finite exactly when some gradient entry is.)"""
        loss_value, norm_value = torch.stack([loss.detach().float(), grad_norm.detach().float().to(loss.device)]).tolist()
        if math.isfinite(loss_value) and math.isfinite(norm_value):
            return loss_value, norm_value
        self.optimizer.zero_grad(set_to_none=True)
        what = (f"the training loss became {loss_value}" if not math.isfinite(loss_value)
                else f"the gradient norm became {norm_value} (a NaN/Inf gradient)")
        raise TrainingDiverged(f"{self.config.method}: {what} at step {self.step + 1}; that step was not applied "
                               f"(weights, optimizer and step counters are those after step {self.step}). "
                               "Resume from the last checkpoint with a lower --lr, or check the data")

    def _mask_stats(self) -> dict:
        """Called between backward and optimizer step: flip rates of the masks computed for this
        step (null where none was), mean beta, and the density of the weights the products used."""
        if self.plain_dense:  # the plain dense GPT: no masks computed (track_flips=False)
            return {"flip_rate": math.nan, "beta": math.nan, "density": 1.0, "dense_phase": True}
        if not self.layers:  # DYAD / prune-and-regrow: no 2:4 masks, only the live fraction
            return {"flip_rate": math.nan, "beta": math.nan, "density": structured_density(self.model),
                    "dense_phase": False}
        report = flip_report(self.model, fresh_only=True)  # NaN where no mask was computed this step
        flips = {f"flip/{name}": report[name] for name, _ in self.layers}
        rows = sparsity_summary(self.model)
        sizes = [layer.weight.numel() for _, layer in self.layers]
        used = [1.0 if r["dense_now"] else r["density"] for r in rows]
        return {"flip_rate": report["overall"], **flips,
                "beta": sum(r["beta"] for r in rows) / len(rows),
                "density": sum(u * s for u, s in zip(used, sizes)) / sum(sizes),
                "dense_phase": all(r["dense_now"] for r in rows)}

    def _activation_stats(self) -> dict:
        """Squared-ReLU activations at a measured step: per layer and mean, the fraction of zeros
        (``act_zero``) and of groups of 4 with at most 2 non-zeros (``act_le2``)."""
        if self.act_tracker is None or not self.act_tracker.armed:
            return {}
        self.act_tracker.armed = False
        stats = self.act_tracker.read()
        if not stats:
            return {}
        row = {}
        for name, s in stats.items():
            row[f"act_zero/{name}"], row[f"act_le2/{name}"] = s["zero_fraction"], s["at_most_2_fraction"]
        row["act_zero"] = sum(s["zero_fraction"] for s in stats.values()) / len(stats)
        row["act_le2"] = sum(s["at_most_2_fraction"] for s in stats.values()) / len(stats)
        return row

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean cross-entropy (nats per byte) on the fixed validation windows."""
        for _, layer in self.layers:
            # the mask the next step would compute from these same weights: evaluate with it
            if layer.mask_due():
                layer.refresh_mask()
        self.model.eval()
        total = torch.zeros((), device=self.device)
        for x, y in self.val_batches:
            with self._autocast():
                _, loss = self.model(x, y)
            total += loss
        self.model.train()
        return (total / len(self.val_batches)).item()

    def _eval_due(self, step: int | None = None) -> bool:
        cfg, step = self.config, self.step if step is None else step
        return step % cfg.eval_interval == 0 or step == cfg.steps or step in cfg.eval_at

    # --- the loop ----------------------------------------------------------------------------------
    def run(self, stop_at: int | None = None) -> dict:
        """Train from the current step to ``stop_at`` (default: the planned steps). Returns summary()."""
        cfg = self.config
        if stop_at is not None and self.step >= cfg.steps:
            raise ValueError(f"stop_at={stop_at!r}: the run is already at its last planned step ({cfg.steps})")
        if stop_at is not None and (isinstance(stop_at, bool) or not isinstance(stop_at, int)
                                    or not self.step < stop_at <= cfg.steps):
            raise ValueError(f"stop_at must be a step after the current one and at most the planned steps, i.e. "
                             f"an int in [{self.step + 1}, {cfg.steps}], got {stop_at!r}")
        end = cfg.steps if stop_at is None else stop_at
        bar = tqdm(total=cfg.steps, initial=self.step, disable=not cfg.progress, desc=cfg.method,
                   dynamic_ncols=True, leave=False)
        try:
            while self.step < end:
                row = self.train_step()
                bar.update(1)
                if row is None:  # a step between logged rows (log_interval)
                    continue
                if self._eval_due():
                    row["val_loss"] = self.evaluate()
                self.history.append(row)
                self.log.write(row)
                flip = row["flip_rate"]
                bar.set_postfix(loss=f"{row['loss']:.3f}", flip="-" if flip is None else f"{flip:.2e}",
                                tok_s=f"{row['tokens_per_s']:.3g}", refresh=False)
                if cfg.checkpoint_path and cfg.checkpoint_interval and self.step % cfg.checkpoint_interval == 0:
                    self.save()
            if cfg.checkpoint_path and self.step == end:
                self.save()
        finally:
            bar.close()
            self.log.flush()
        return self.summary()

    def describe(self) -> str:
        """The method's description, and the FFN's 2:4 activations when the model has them."""
        text = self.method.describe()
        if self.config.model.activation_sparsity != "none":
            text += f"; {self.config.model.activation_sparsity} activations (squared ReLU, down projection)"
            if self.config.model.act24_weight_grads != "dense":
                text += (f", weight gradients {self.config.model.act24_weight_grads} "
                         f"({self.config.model.act24_dense_fraction:g} of features dense)")
        return text

    def summary(self) -> dict:
        vals = [r for r in self.history if r["val_loss"] is not None]
        speeds = sorted(r["tokens_per_s"] for r in self.history)
        out = {
            "method": self.config.method, "describe": self.describe(), "step": self.step,
            "tokens": self.step * self.config.tokens_per_step,
            "final_val_loss": vals[-1]["val_loss"] if vals else None,
            "median_tokens_per_s": speeds[len(speeds) // 2] if speeds else None,
            "params": self.model.num_params(),
        }
        if self.graph_step is not None:
            out["cuda_graph"] = graph_step_report(self.graph_step)
        return out

    def close(self) -> None:
        self.log.close()
        if self.hooks is not None:
            self.hooks.remove()
        if self.graph_step is not None:  # the graph, its memory pool and static tensors go now
            self.graph_step.release()
            self.graph_step = None
