"""Hugging Face models: save and load 2:4 sparse checkpoints, load dense weights into a sparse model.

    model = AutoModelForCausalLM.from_config(config)      # or .from_pretrained(dense checkpoint)
    sl.sparsify(model, sl.SSTE())                          # finds the MLP linears (architectures.py)
    ...train...
    model.save_pretrained("ckpt")                          # safetensors: S(W) as weight; W, masks, beta, counters
    model = sparsity_lab.integrations.hf.from_pretrained("ckpt")   # the same sparse model back

``sparsify`` records the method and the converted layers in ``model.config.sparsity_lab``, which
``save_pretrained`` writes to config.json, and gives the model a ``save_pretrained`` that stores each
sparse layer's ``weight`` as its forward uses it (``export.effective_weight``: m * W, beta *
soft_threshold(W), W in a dense phase) and the dense latent W under ``latent_weight``
(``sparsity_lab.hf_checkpoint``). The rest of the
sparse state (``mask``, ``beta``, the counters as ``_extra_state``, an FP8 backend's scales, amax
history and recipe under ``backend.scaling.``) is ordinary tensors of the state dict. So plain
``AutoModel*.from_pretrained`` of such a checkpoint gives the 2:4 model's outputs (transformers lists the
training tensors as unexpected keys), ``load_state_dict`` (the Trainer's resume) takes W back
(``SparseLinear`` reads ``latent_weight`` as its weight), and ``from_pretrained`` here rebuilds the sparse
model, every state tensor loaded or the checkpoint refused, from a local directory or a Hub repository id.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from ..layers import LATENT_WEIGHT, SparseLinear
from ..methods.config import method_from_name
from ..methods.handlers import method_handler
from ..sparsify import sparsify
from ..training_hooks import sparse_layers

SPARSE_STATE = ("mask", "beta", "_extra_state", LATENT_WEIGHT)  # per sparse layer, besides its weight and bias
RECIPE_FORMATS = (1, 2)  # 1: "weight" holds the latent W; 2: S(W), with W under "latent_weight"


def _sparse_state_key(key: str) -> bool:
    # a backend's per-layer state (FP8 scales, amax history) sits under the layer's "backend."
    return key.rpartition(".")[2] in SPARSE_STATE or ".backend." in f".{key}"


def read_safetensors(source: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of a ``.safetensors`` file, or of a directory's ``model.safetensors`` (or its shards
    listed in ``model.safetensors.index.json``)."""
    from safetensors.torch import load_file

    path = Path(source)
    if path.is_file():
        return load_file(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"source must be a .safetensors file or a directory holding model.safetensors "
                                f"(or its index), got {str(source)!r}")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(path / name))
    return state


@dataclass
class LoadReport:
    """What a load did; ``str(report)`` says it in a few lines."""

    source: str
    loaded: int = 0
    sparse_layers: list[str] = field(default_factory=list)
    restored: bool = False  # True: every state tensor of the sparse layers read from the checkpoint
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        k = len(self.sparse_layers)
        if self.restored:
            what = (f"sparse state of {k} layers (masks, beta, counters, FP8 scales and amax histories where the "
                    "backend keeps them) restored from the checkpoint (the tensors transformers listed as "
                    "UNEXPECTED when it loaded the plain weights, the latent W among them)")
        else:
            what = (f"dense checkpoint: masks of {k} sparse layers computed from the loaded weights, S-STE "
                    "beta recomputed from them, step counters reset to 0")
        lines = [f"sparsity_lab: loaded {self.loaded} tensors from {self.source}; {what}"]
        if self.missing:
            lines.append(f"  not in the checkpoint (left as they were): {self.missing}")
        if self.unexpected:
            lines.append(f"  in the checkpoint but not in the model (ignored): {self.unexpected}")
        return "\n".join(lines)


def sparse_layer_state(model: nn.Module, saved: Mapping[str, torch.Tensor],
                       latent: bool = True) -> dict[str, torch.Tensor]:
    """The tensors of ``saved`` that belong to ``model``'s sparse layers: every key of their state dicts
    (weight, bias, mask, beta, the counters, and whatever state their backends keep, e.g. FP8 scales and
    amax histories), and with ``latent`` the dense W under ``latent_weight`` (the layers load it as their
    weight). Raises ValueError when ``saved`` lacks one of them, or holds one under a sparse layer
    that the layer does not have (a load that would drop or invent state)."""
    layers = sparse_layers(model)
    expected = {f"{name}.{key}" for name, layer in layers for key in layer.state_dict(keep_vars=True)}
    if latent:
        expected |= {f"{name}.{LATENT_WEIGHT}" for name, _ in layers}
    prefixes = tuple(f"{name}." for name, _ in layers)
    found = {key for key in saved if key.startswith(prefixes)}
    absent, stray = sorted(expected - found), sorted(found - expected)
    if absent:
        raise ValueError(f"the checkpoint's config lists sparse layers but its tensors lack {len(absent)} of their "
                         f"state tensors, e.g. {absent[:4]}: it cannot restore them")
    if stray:
        raise ValueError(f"the checkpoint holds {len(stray)} state tensors of sparse layers that the rebuilt layers "
                         f"do not have, e.g. {stray[:4]} (saved with another backend or version?): loading would "
                         "drop them")
    return {key: saved[key] for key in sorted(expected)}


def adopt_saved_fp8_recipes(model: nn.Module, saved: Mapping[str, torch.Tensor]) -> None:
    """Give each FP8 layer of ``model`` the FP8 recipe its scaling state was saved with (config.json does
    not record it: ``set_fp8_recipe`` may have changed it after ``sparsify``)."""
    from ..backends.cusparselt.fp8_train import FP8Backend
    from ..methods.fp8_scaling import saved_recipe

    for name, module in model.named_modules():
        if isinstance(module, FP8Backend):
            recipe = saved_recipe(saved, f"{name}.scaling.")
            if recipe is not None and recipe != module.scaling.recipe:
                module.set_recipe(recipe)


@torch.no_grad()
def restart_sparse_state(layer: SparseLinear) -> None:
    """Make ``layer``'s sparse state that of a fresh conversion of its current weight: counters 0
    (the MVUE seed kept), mask recomputed from W (no flip counted), the method's state recomputed from
    both (S-STE's beta: ``MethodHandler.init_state``), an FP8 backend's scales and amax history fresh (same
    recipe)."""
    from ..backends.cusparselt.fp8_train import FP8Backend

    if isinstance(layer.backend, FP8Backend):
        layer.backend.set_recipe(layer.backend.scaling.recipe)
    layer.set_extra_state({"step": 0, "mask_step": 0, "mask_updates": 0, "last_flips": 0, "flips_total": 0,
                           "mvue_seed": layer.mvue_seed, "mvue_calls": 0})
    layer.refresh_mask()
    method_handler(layer.method).init_state(layer)


def load_dense_checkpoint(model: nn.Module, source: str | os.PathLike | Mapping[str, torch.Tensor],
                          verbose: bool = True) -> LoadReport:
    """Load dense weights (a state dict, a .safetensors file or a Hugging Face directory) into a
    sparsified ``model`` and restart its sparse state from them (see ``restart_sparse_state``).

    Raises ValueError when the source holds sparse state (load that with ``model.load_state_dict``
    or ``from_pretrained``) or lacks the weight of a sparse layer. Prints the report when verbose.
    """
    layers = sparse_layers(model)
    if not layers:
        raise ValueError("model has no sparse layers: call sparsity_lab.sparsify(model, method) first")
    if isinstance(source, Mapping):
        state, where = dict(source), "a state dict"
    else:
        state, where = read_safetensors(source), str(source)
    sparse_keys = sorted(key for key in state if _sparse_state_key(key))
    if sparse_keys:
        raise ValueError(f"source holds sparse state ({sparse_keys[:3]}...), not a dense checkpoint: use "
                         "sparsity_lab.integrations.hf.from_pretrained or model.load_state_dict")
    result = model.load_state_dict(state, strict=False)
    # a tied weight (GPT-2's lm_head is the embedding) is loaded through its twin: not missing
    own = model.state_dict(keep_vars=True)
    loaded_storage = {own[key].data_ptr() for key in state if key in own}
    missing = [key for key in result.missing_keys
               if not _sparse_state_key(key) and own[key].data_ptr() not in loaded_storage]
    unloaded = [name for name, _ in layers if f"{name}.weight" in missing]
    if unloaded:
        raise ValueError(f"source lacks the weights of sparse layers {unloaded}; is it this model's checkpoint?")
    for _, layer in layers:
        restart_sparse_state(layer)
    report = LoadReport(source=where, loaded=len(state) - len(result.unexpected_keys),
                        sparse_layers=[name for name, _ in layers], missing=missing,
                        unexpected=list(result.unexpected_keys))
    if verbose:
        print(report)
    return report


HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "force_download")
CHECKPOINT_FILES = ["config.json", "*.safetensors", "model.safetensors.index.json", "generation_config.json"]


def checkpoint_dir(path: str | os.PathLike, **hub_kwargs) -> Path:
    """The local directory of a checkpoint: ``path`` itself when it is a directory, else ``path`` read
    as a Hugging Face Hub repository id (``"org/name"``), whose config and safetensors files are
    fetched into (or found in) the Hub cache. hub_kwargs: ``revision``, ``token``, ``cache_dir``,
    ``local_files_only``, ``force_download``, as ``huggingface_hub.snapshot_download`` takes them."""
    local = Path(path)
    if local.is_dir():
        return local
    if local.exists():
        raise ValueError(f"path must be a checkpoint directory or a Hub repository id, got the file {str(path)!r}")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=str(path), allow_patterns=CHECKPOINT_FILES, **hub_kwargs))
    except Exception as err:  # HFValidationError, RepositoryNotFoundError, offline: say both readings
        raise OSError(f"{str(path)!r} is neither a local checkpoint directory nor a Hub repository that could be "
                      f"fetched ({type(err).__name__}: {err})") from err


def model_class_of(config, model_class=None):
    """``model_class``, else the class the checkpoint names first in ``config.architectures`` (a BERT
    masked-LM checkpoint gives ``BertForMaskedLM``), else ``AutoModelForCausalLM``."""
    import transformers

    if model_class is not None:
        return model_class
    names = getattr(config, "architectures", None) or []
    if not names:
        return transformers.AutoModelForCausalLM
    found = getattr(transformers, names[0], None)
    if found is None or not hasattr(found, "from_pretrained"):
        raise ValueError(f"the checkpoint's config.architectures names {names[0]!r}, which this transformers "
                         f"({transformers.__version__}) does not have: pass model_class=")
    return found


@contextmanager
def quiet_transformers(quiet: bool):
    """transformers' loading output (progress bars, the load report, warnings) off while ``quiet``."""
    if not quiet:
        yield
        return
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def from_pretrained(path: str | os.PathLike, model_class=None, method=None, select=None, verbose: bool = True,
                    **kwargs) -> nn.Module:
    """A sparse model from a Hugging Face checkpoint: a local directory or a Hub repository id.

    A checkpoint saved from a sparsified model (config.json has ``sparsity_lab``) comes back with the
    same methods, layers and state (the latent weights, masks, beta, counters, FP8 scales); a checkpoint
    whose sparse state is incomplete is refused. A dense checkpoint needs ``method`` (and
    optionally ``select``): it is loaded by transformers, then sparsified, masks computed from the
    loaded weights. model_class: a transformers class with ``from_pretrained`` (default: the first of
    the checkpoint's ``config.architectures``, else ``AutoModelForCausalLM``); kwargs go to its
    ``from_pretrained`` (``revision``, ``token``, ``cache_dir``, ``local_files_only``,
    ``force_download`` also to the Hub download). verbose: print what it did; False also silences
    transformers' own loading output.
    """
    import transformers

    path = checkpoint_dir(path, **{key: kwargs[key] for key in HUB_KWARGS if key in kwargs})
    with quiet_transformers(not verbose):
        config = transformers.AutoConfig.from_pretrained(path)
    model_class = model_class_of(config, model_class)
    recipe = getattr(config, "sparsity_lab", None)
    if recipe is None and method is None:
        raise ValueError(f"{str(path)!r} is a dense checkpoint (its config.json has no 'sparsity_lab'): pass "
                         "method=, e.g. sparsity_lab.SSTE(), to sparsify it")
    if recipe is not None and (method is not None or select is not None):
        raise ValueError("the checkpoint records its own methods and layers (config.sparsity_lab); "
                         "do not pass method= or select=")
    with quiet_transformers(not verbose):
        model = model_class.from_pretrained(path, **kwargs)  # dense weights; sparse tensors are not its own
    model.config.sparsity_lab = None  # sparsify below records the groups again
    if recipe is None:
        sparsify(model, method, select)
        report = LoadReport(source=str(path), loaded=len(read_safetensors(path)),
                            sparse_layers=[name for name, _ in sparse_layers(model)])
    else:
        if recipe.get("format") not in RECIPE_FORMATS:
            raise ValueError(f"config.sparsity_lab has format {recipe.get('format')!r}; this version reads formats "
                             f"{RECIPE_FORMATS}")
        for group in recipe["groups"]:
            sparsify(model, method_from_name(group["method"], **group["fields"]), group["layers"])
        saved = read_safetensors(path)
        adopt_saved_fp8_recipes(model, saved)
        state = sparse_layer_state(model, saved, latent=recipe["format"] >= 2)
        model.load_state_dict(state, strict=False)
        report = LoadReport(source=str(path), loaded=len(state), sparse_layers=[n for n, _ in sparse_layers(model)],
                            restored=True)
    if verbose:
        print(report)
    return model
