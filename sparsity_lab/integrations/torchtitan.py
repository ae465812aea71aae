"""2:4 training in torchtitan 0.3: a model-config converter, a 2:4 linear torchtitan can build, shard and
checkpoint, and a trainer that hooks the layers into torchtitan's optimizer and metrics.

torchtitan 0.3 builds a model from a tree of configs (``Module.Config``) on the meta device, shards it
(FSDP2, ``fully_shard`` per block), moves it to the device and initialises it (``init_states``). Its
extension point is the job's ``--module``/``--config`` pair (a function returning ``Trainer.Config``)
and ``ModelConfigConverter``, which rewrites the model's config tree before the build. Here:

    torchrun --nproc-per-node 4 -m sparsity_lab.integrations.torchtitan_train \\
        --module sparsity_lab.integrations.torchtitan --config llama3_8b \\
        --sparsity24.method sste --sparsity24.mvue

``--config`` names any of torchtitan's ``llama3_*`` configs: this module offers each one with a
``[sparsity24]`` section (its fields below; ``--sparsity24.method dense`` gives the dense baseline
with the same trainer) and ``Sparsity24Trainer``, which

* swaps the feed-forward linears' configs (``layers.N.feed_forward.w1/w2/w3``) for ``SparseLinear24``'s
  (``Sparsity24Converter``), with the method's ``total_steps`` set to ``training.steps``;
* builds, shards and initialises the model as torchtitan does. ``SparseLinear24`` computes its mask
  and S-STE's beta in ``init_states``, from the full weight (all-gathered where FSDP2 sharded it),
  and keeps its mask sharded like the weight (``distributed.sharded_layer``);
* attaches the optimizer hooks to torchtitan's optimizers (``attach``: masked decay after gradient
  clipping and before the step, the step counters after it);
* adds ``sparsity/flip_rate`` and ``sparsity/dense_phase`` to every log of torchtitan's metrics
  processor (console, TensorBoard, W&B).

All sparse state (masks, beta, counters) is in the state dict and updated in place, so torchtitan's
checkpointer saves and resumes it (DCP, any world size). Refused, with the reason: tensor parallel
(the products' custom autograd function takes a whole weight; a row-sharded W2 also splits groups of
4 when its shard is not a multiple of 4), HSDP (``dp_replicate`` > 1: the mask follows a 1-D shard),
pipeline parallel, the SPMD-typed parameter backends (``spmd_types``, ``full_dtensor``: the
configs here set ``partial_dtensor``), activation checkpointing (a recomputed forward would redo each layer's per-step work:
mask refresh, MVUE draw, SR-STE's decay) and CUDA graphs (the layers decide on the host, every step).
"""
# no `from __future__ import annotations`: tyro (torchtitan's config parser) resolves the section's type hints

import math
import re
from dataclasses import dataclass, field, fields

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ..backends import get_backend
from ..distributed.sharded_layer import ShardedSparseLinear
from ..methods.config import SparsityMethod, method_from_name
from ..methods.flip_rate import overall_flip_rate
from ..methods.soft_threshold import soft_threshold, sste_beta
from ..training_hooks import attach_optimizer, sparse_layers
from ..validation import check_has_values

try:
    from torchtitan.models.common.linear import Linear
    from torchtitan.protocols.model import ModelConfigConverter
    from torchtitan.protocols.module import Module
    from torchtitan.trainer import Trainer
except ImportError as err:
    raise ImportError("sparsity_lab.integrations.torchtitan needs torchtitan 0.3 (its ModelConfigConverter and "
                      "Module protocols): pip install 'torchtitan>=0.3,<0.4'") from err

NAME = "sparsity24"  # the config section
FEED_FORWARD = re.compile(r"(^|\.)feed_forward\.(w1|w2|w3)$")  # Llama's w2(silu(w1 x) * w3 x)


@dataclass(kw_only=True, slots=True)
class Sparsity24Config:
    """The ``[sparsity24]`` section of a job (``--sparsity24.FIELD``)."""

    method: str = "ste"
    """dense, ste, srste, masked_decay, masked_decay_weights or sste"""
    mvue: bool = False
    """MVUE 2:4 weight gradient (S-STE's recipe)"""
    transposable: bool = False
    """one mask that is 2:4 for both W and W^T"""
    mask_refresh_interval: int = 1
    """optimizer steps between mask computations"""
    backend: str = "torch"
    """how the 2:4 products run: torch (reference), triton, cusparselt, ..."""
    decay: float | None = None
    """SR-STE's or masked decay's lambda_W (None: the method's default)"""
    dense_finetune_at: float | None = None
    """fraction of training.steps after which the layers run dense (None: the method's default)"""
    filter_fqns: list[str] = field(default_factory=list)
    """feed-forward linears to leave dense (substrings of their names)"""


def method_from_config(cfg: Sparsity24Config, total_steps: int) -> SparsityMethod:
    """The SparsityMethod of a ``[sparsity24]`` section for a job of ``total_steps`` steps."""
    options = {"mvue": cfg.mvue, "transposable": cfg.transposable,
               "mask_refresh_interval": cfg.mask_refresh_interval, "backend": cfg.backend}
    if cfg.decay is not None:
        options["decay"] = cfg.decay
    if cfg.dense_finetune_at is not None:
        options["dense_finetune_at"] = cfg.dense_finetune_at
    try:
        return method_from_name(cfg.method, total_steps=total_steps, **options)
    except TypeError as err:
        raise ValueError(f"sparsity24.method {cfg.method!r} does not take these options ({err})") from err


class SparseLinear24(ShardedSparseLinear, Module):
    """A 2:4 ``SparseLinear`` that follows torchtitan's ``Module`` protocol: built from its Config on the
    meta device, its mask and beta computed in ``init_states`` from the initialised weight."""

    @dataclass(kw_only=True, slots=True)
    class Config(Linear.Config):
        method: SparsityMethod

    def __init__(self, config: Config) -> None:
        nn.Linear.__init__(self, config.in_features, config.out_features, bias=config.bias)
        self._setup(config.method, from_values=False)

    def _init_self_parameters(self) -> None:
        Module._init_self_parameters(self)  # torchtitan's initialiser (param_init), then the sparse state
        self.start_from_weights()

    def parallelize(self, parallel_dims) -> None:
        if parallel_dims.tp_enabled:
            raise ValueError("tensor parallel is not supported for 2:4 layers: their products take the whole "
                             "weight, and a row-sharded w2 would split groups of 4 unless each shard holds a "
                             "multiple of 4 inputs; shard with FSDP2 (data_parallel_shard_degree) instead")
        Module.parallelize(self, parallel_dims)

    @torch.no_grad()
    def start_from_weights(self) -> None:
        """Counters at 0, the mask and S-STE's beta from the (full) weight as it is now, the mask kept as
        the weight is kept (sharded by FSDP2, or whole), the MVUE seed that of the first rank."""
        weight = self.weight
        full = weight.full_tensor() if isinstance(weight, DTensor) else weight  # collective when sharded
        check_has_values(full, "weight", "SparseLinear24 (its mask and S-STE's beta come from the weights)")
        self.backend = get_backend(self.method.backend).for_layer(self)  # per-layer state on the real device
        seed = self.mvue_seed
        if isinstance(weight, DTensor) and dist.is_initialized():
            shared = torch.tensor([seed], dtype=torch.int64, device=full.device)
            group = weight.device_mesh.get_group()
            dist.broadcast(shared, src=dist.get_global_rank(group, 0), group=group)
            seed = int(shared.item())
        self.set_extra_state({"step": 0, "mask_step": 0, "mask_updates": 0, "last_flips": 0, "flips_total": 0,
                              "mvue_seed": seed, "mvue_calls": 0})
        m = self.method
        mask = self.backend.mask(full.detach(), m.n, m.m, m.transposable)
        if isinstance(weight, DTensor):
            self.mask = distribute_tensor(mask, weight.device_mesh, weight.placements, src_data_rank=None)
        else:
            self.mask = mask.clone()
        self.beta = torch.ones((), dtype=torch.float32, device=full.device)
        if m.soft_threshold:
            self.beta.copy_(sste_beta(full, soft_threshold(full, mask, m.n, m.m)))
        self.mask_updates = 1
        self._operand_cache = None


class Sparsity24Converter(ModelConfigConverter):
    """Replace the feed-forward ``Linear.Config``s of a model config by ``SparseLinear24.Config``s."""

    @dataclass(kw_only=True, slots=True)
    class Config(ModelConfigConverter.Config):
        method: SparsityMethod
        filter_fqns: list[str] = field(default_factory=list)

    def __init__(self, config: Config, **kwargs) -> None:
        if not isinstance(config.method, SparsityMethod):
            raise TypeError(f"method must be a SparsityMethod, got {type(config.method).__name__}")
        self.config = config

    def convert(self, model_config):
        converted = []
        for fqn, linear, parent, attr in list(model_config.traverse(Linear.Config)):
            if not FEED_FORWARD.search(fqn) or any(f in fqn for f in self.config.filter_fqns):
                continue
            if isinstance(linear, SparseLinear24.Config):
                raise ValueError(f"{fqn} is a 2:4 layer already: convert a model config once")
            values = {f.name: getattr(linear, f.name) for f in fields(Linear.Config) if f.init}
            new = SparseLinear24.Config(**values, method=self.config.method)
            if isinstance(parent, list):
                parent[attr] = new
            else:
                setattr(parent, attr, new)
            converted.append(fqn)
        if not converted:
            raise ValueError("no feed-forward linear (layers.N.feed_forward.w1/w2/w3) in the model config"
                             + (f" outside filter_fqns={self.config.filter_fqns}" if self.config.filter_fqns else ""))
        return model_config


def check_parallelism(parallel_dims) -> None:
    """Refuse the parallelisms the 2:4 layers do not support (see the module docstring)."""
    refused = {"tp": "tensor parallel", "pp": "pipeline parallel", "dp_replicate": "HSDP (dp_replicate > 1)"}
    on = [what for name, what in refused.items() if getattr(parallel_dims, f"{name}_enabled", False)]
    if on:
        raise ValueError(f"2:4 layers in torchtitan run with FSDP2, context and expert parallel; this job enables "
                         f"{', '.join(on)}, which is not supported (see sparsity_lab/integrations/torchtitan.py)")


def attach(model_parts: list[nn.Module], optimizers) -> list:
    """Attach the lab's optimizer hooks (``attach_optimizer``) to the optimizer of torchtitan's
    ``OptimizersContainer`` that holds each model part's 2:4 weights. Returns the handles."""
    handles = []
    for part in model_parts:
        layers = sparse_layers(part)
        if not layers:
            continue
        weights = {id(layer.weight) for _, layer in layers}
        holders = [opt for opt in optimizers.optimizers
                   if weights & {id(p) for group in opt.param_groups for p in group["params"]}]
        if len(holders) != 1:
            raise ValueError(f"the 2:4 weights of a model part are spread over {len(holders)} optimizers; put them "
                             "in one param group of optimizer.param_groups")
        handles.append(attach_optimizer(part, holders[0]))
    return handles


def sparsity_metrics(model_parts: list[nn.Module]) -> dict[str, float]:
    """``sparsity/flip_rate`` (of the latest mask computation, over every 2:4 layer; absent before the
    second) and ``sparsity/dense_phase`` (1.0 once every 2:4 layer runs dense)."""
    layers = [layer for part in model_parts for _, layer in sparse_layers(part)]
    if not layers:
        return {}
    out = {"sparsity/dense_phase": float(all(layer.dense_now for layer in layers))}
    rate = overall_flip_rate([(layer.last_flips, layer.mask.numel()) for layer in layers
                              if not math.isnan(layer.last_flip_rate)])
    if not math.isnan(rate):
        out["sparsity/flip_rate"] = rate
    return out


class Sparsity24Trainer(Trainer):
    """torchtitan's Trainer with the ``[sparsity24]`` section: see the module docstring."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        sparsity24: Sparsity24Config = field(default_factory=Sparsity24Config)

    def __init__(self, config: Config) -> None:
        if config.activation_checkpoint is not None:
            raise ValueError("activation checkpointing recomputes the forward, and with it each 2:4 layer's "
                             "per-step work; leave it off (these configs set activation_checkpoint=None)")
        if not config.training.disable_cuda_graphs:
            raise ValueError("the 2:4 layers decide on the host every step (mask refresh, MVUE seed), which a "
                             "CUDA graph cannot replay: run with --training.disable_cuda_graphs")
        if config.parallelism.spmd_backend != "partial_dtensor":
            raise ValueError(f"parallelism.spmd_backend={config.parallelism.spmd_backend!r}: the 2:4 layers run under "
                             "FSDP2 over plain parameters: --parallelism.spmd_backend partial_dtensor (these "
                             "configs set it)")
        cfg = config.sparsity24
        if cfg.method != "dense":
            method = method_from_config(cfg, config.training.steps)
            converter = Sparsity24Converter.Config(method=method, filter_fqns=list(cfg.filter_fqns)).build()
            config.model_spec.model = converter.convert(config.model_spec.model)
        super().__init__(config)
        check_parallelism(self.parallel_dims)
        self.sparsity_handles = attach(self.model_parts, self.optimizers)
        log = self.metrics_processor.log

        def log_with_sparsity(step, *args, extra_metrics=None, **kwargs):
            extra = {**(extra_metrics or {}), **sparsity_metrics(self.model_parts)}
            return log(step, *args, extra_metrics=extra, **kwargs)

        self.metrics_processor.log = log_with_sparsity


def sparse24(trainer_config: Trainer.Config) -> Sparsity24Trainer.Config:
    """A torchtitan ``Trainer.Config`` as a ``Sparsity24Trainer.Config`` (a ``[sparsity24]`` section added),
    with activation checkpointing and CUDA graphs off (see the module docstring)."""
    values = {f.name: getattr(trainer_config, f.name) for f in fields(trainer_config) if f.init}
    values.update(activation_checkpoint=None)
    config = Sparsity24Trainer.Config(**values)
    config.training.disable_cuda_graphs = True
    config.parallelism.spmd_backend = "partial_dtensor"
    return config


def _offer_llama3_configs() -> list[str]:
    """Each of torchtitan's ``llama3_*`` config functions, here with the ``[sparsity24]`` section."""
    from torchtitan.models.llama3 import config_registry

    names = [name for name in dir(config_registry) if name.startswith("llama3_")
             and callable(getattr(config_registry, name))]
    for name in names:
        def offered(_make=getattr(config_registry, name)):
            return sparse24(_make())

        offered.__name__ = offered.__qualname__ = name
        offered.__doc__ = f"torchtitan's {name} with a [sparsity24] section (Sparsity24Trainer)."
        globals()[name] = offered
    return names


LLAMA3_CONFIGS = _offer_llama3_configs()
