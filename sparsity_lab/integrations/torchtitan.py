"""2:4 training in a torchtitan job: a model converter for torchtitan 0.2's ``ModelConverter`` protocol.

torchtitan (https://github.com/pytorch/torchtitan) applies the converters named in ``model.converters``
to the model it builds and calls their ``post_optimizer_hook`` after every optimizer step (its float8
converter works the same way). Importing this module registers ours as ``sparsity24`` and is also a
custom config module that adds a ``[sparsity24]`` section, so a job turns 2:4 on from its config:

    torchrun ... -m torchtitan.train --job.custom_config_module sparsity_lab.integrations.torchtitan \\
        --model.converters sparsity24 --sparsity24.method sste --sparsity24.mvue

    convert(model)              the MLP linears (``layers.N.feed_forward.w1/w2/w3`` in torchtitan's Llama)
                                become SparseLinear. torchtitan builds the model on the meta device and
                                initialises it later (``init_weights``), while a 2:4 mask needs values: on a
                                meta model the swap runs right after ``init_weights``, before the optimizer
                                is built (the layers keep the Parameter objects, so the optimizer sees them)
    post_optimizer_hook(parts)  advances every sparse layer's step counter (mask refresh interval,
                                dense fine-tune switch), as ``attach_optimizer``'s post-hook does

What the protocol cannot carry, refused with the reason: masked decay on gradients (``masked_decay``)
must be added after clipping and *before* the step, and the protocol has no pre-step hook; the decoupled
decay on weights (``masked_decay_weights``) needs the step's learning rate, which the hook is not given.
Use ``attach_optimizer`` in your own loop for those. Sharded or split models (FSDP, tensor, context or
pipeline parallel) are refused too: the layers compute masks from whole weights
(``sparsity_lab.distributed`` shards them in the lab's own loop).

torchtitan 0.3 replaced this protocol by ``ModelConfigConverter`` (it rewrites the model's config tree
before the model is built); this module needs torchtitan 0.2 (tested with 0.2.2): see
docs/integrations.md#torchtitan.
"""
# no `from __future__ import annotations`: tyro (torchtitan's config parser) resolves the section's type hints

import re
from dataclasses import dataclass, field

from torch import nn

from ..methods.config import method_from_name
from .hf import restart_sparse_state
from ..sparsify import sparsify
from ..training_hooks import sparse_layers

try:
    from torchtitan.protocols.model_converter import _registry_model_converter_cls, register_model_converter
except ImportError as err:  # torchtitan 0.3 has no ModelConverter protocol; older/newer names differ
    try:
        import torchtitan  # noqa: F401
    except ImportError:
        raise ImportError("sparsity_lab.integrations.torchtitan needs torchtitan 0.2 (pip install "
                          "'torchtitan>=0.2,<0.3')") from err
    raise ImportError("sparsity_lab.integrations.torchtitan implements torchtitan 0.2's ModelConverter protocol "
                      "(torchtitan.protocols.model_converter), which this torchtitan does not have (0.3 replaced "
                      "it by ModelConfigConverter); install 'torchtitan>=0.2,<0.3'") from err

NAME = "sparsity24"  # in model.converters and as the config section
FEED_FORWARD = re.compile(r"(^|\.)feed_forward\.(w1|w2|w3)$")  # torchtitan's Llama: w2(silu(w1 x) * w3 x)


@dataclass
class Sparsity24Config:
    """The ``[sparsity24]`` section of a torchtitan job config."""

    method: str = "ste"
    """one of dense, ste, srste, sste (masked decay needs a pre-step hook: see the module docstring)"""
    mvue: bool = False
    """MVUE 2:4 weight gradient (S-STE's recipe)"""
    transposable: bool = False
    """one mask that is 2:4 for both W and W^T"""
    mask_refresh_interval: int = 1
    """optimizer steps between mask computations"""
    backend: str = "torch"
    """how the 2:4 products run: torch (reference), triton, cusparselt, ..."""
    decay: float | None = None
    """SR-STE's lambda_W (None: the method's default)"""
    dense_finetune_at: float | None = None
    """fraction of training.steps after which the layers run dense (None: never)"""
    filter_fqns: list[str] = field(default_factory=list)
    """MLP linears to leave dense (substrings of their names)"""


@dataclass
class JobConfig:
    """Merged into torchtitan's JobConfig by ``--job.custom_config_module sparsity_lab.integrations.torchtitan``."""

    sparsity24: Sparsity24Config = field(default_factory=Sparsity24Config)


def method_from_config(cfg: Sparsity24Config, total_steps: int):
    """The SparsityMethod for a job of ``total_steps`` steps; ValueError for what the protocol cannot carry."""
    options = {"mvue": cfg.mvue, "transposable": cfg.transposable,
               "mask_refresh_interval": cfg.mask_refresh_interval, "backend": cfg.backend}
    if cfg.decay is not None:
        options["decay"] = cfg.decay
    if cfg.dense_finetune_at is not None:
        options["dense_finetune_at"] = cfg.dense_finetune_at
    try:
        method = method_from_name(cfg.method, total_steps=total_steps, **options)
    except TypeError as err:
        raise ValueError(f"sparsity24.method {cfg.method!r} does not take these options ({err})") from err
    if method.decay_before_step:
        raise ValueError(f"sparsity24.method {cfg.method!r}: masked decay on gradients is added after clipping and "
                         "before the optimizer step; torchtitan's ModelConverter protocol has a post-step hook "
                         "only. Use ste, srste or sste here, or attach_optimizer in your own loop")
    if method.decay_after_step:
        raise ValueError(f"sparsity24.method {cfg.method!r}: the decay on weights needs the step's learning rate, "
                         "which torchtitan's post_optimizer_hook is not given. Use ste, srste or sste here, or "
                         "attach_optimizer in your own loop")
    return method


class Sparsity24Converter:
    """torchtitan 0.2 ``ModelConverter``: 2:4 MLP linears, step counters advanced after each step."""

    def __init__(self, job_config, parallel_dims) -> None:
        cfg = getattr(job_config, NAME, None)
        if cfg is None:
            raise ValueError(f"model.converters names {NAME!r} but the job config has no [{NAME}] section: add "
                             "--job.custom_config_module sparsity_lab.integrations.torchtitan")
        split = {name: getattr(parallel_dims, f"{name}_enabled", False)
                 for name in ("fsdp", "tp", "cp", "pp", "ep", "dp_replicate")}
        on = [name for name, enabled in split.items() if enabled]
        if on:
            raise ValueError(f"the {NAME} converter runs on one process; this job enables {on} parallelism, which "
                             "would shard or replicate the 2:4 layers without their masks (see docs/distributed.md "
                             "for the lab's DDP/FSDP2 support)")
        self.method = method_from_config(cfg, job_config.training.steps)
        self.filter_fqns = list(cfg.filter_fqns)

    def _select(self, name: str, module: nn.Module) -> bool:
        return bool(FEED_FORWARD.search(name)) and not any(f in name for f in self.filter_fqns)

    def _sparsify(self, model: nn.Module) -> None:
        sparsify(model, self.method, select=self._select)
        for _, layer in sparse_layers(model):
            layer.attached_optimizer = True  # post_optimizer_hook advances the counters

    def convert(self, model: nn.Module) -> None:
        """Make the MLP linears 2:4: now when the weights hold values, else right after ``init_weights``.
        A later ``init_weights`` (new values) restarts the layers' sparse state from the new weights."""
        on_meta = any(p.is_meta for p in model.parameters())
        if not on_meta:
            self._sparsify(model)
        init_weights = getattr(model, "init_weights", None)
        if init_weights is None:
            if on_meta:
                raise ValueError(f"the {NAME} converter got a model on the meta device without init_weights(): "
                                 "a 2:4 mask needs the weights' values")
            return

        def init_then_sparsify(*args, **kwargs):
            result = init_weights(*args, **kwargs)
            layers = sparse_layers(model)
            if not layers:
                self._sparsify(model)
            for _, layer in layers:
                restart_sparse_state(layer)  # masks (and S-STE's beta) from the new weights, counters at 0
            return result

        model.init_weights = init_then_sparsify

    def post_optimizer_hook(self, model: nn.Module | list[nn.Module]) -> None:
        for part in model if isinstance(model, list) else [model]:
            for _, layer in sparse_layers(part):
                layer.advance_step()


if NAME not in _registry_model_converter_cls:
    register_model_converter(Sparsity24Converter, NAME)
