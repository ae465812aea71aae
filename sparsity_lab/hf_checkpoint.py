"""A sparsified Hugging Face model's ``save_pretrained``: the weights plain loaders read are the 2:4 model's.

``sparsify`` gives a Hugging Face model (one whose config records ``sparsity_lab``) a ``save_pretrained``
of its own (``PlainLoadableSave``): each sparse layer's ``weight`` is stored as its forward uses it
(``export.effective_weight``: m * W, beta * soft_threshold(W), W in a dense phase), so plain
``AutoModel*.from_pretrained``, lm-eval and dense servers compute what the 2:4 model computes; the dense
latent W that training continues from goes under ``latent_weight``, which plain loaders list as unused
and ``SparseLinear`` loads as its weight (``integrations.hf.from_pretrained``, the Trainer's resume).
"""
from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from .conv1d import SparseConv1D
from .export import effective_weight
from .layers import LATENT_WEIGHT
from .training_hooks import sparse_layers


def plain_loadable_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (``model``'s state dict) with each sparse layer's ``weight`` replaced by the weight its
    forward uses (``effective_weight``, in the state dict's layout: (in, out) for GPT-2's Conv1D) and the
    dense latent W it held moved to ``latent_weight``, right beside it."""
    layers = {f"{name}.weight": (name, layer) for name, layer in sparse_layers(model)}
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key not in layers:
            out[key] = value
            continue
        name, layer = layers[key]
        weight = effective_weight(layer).detach()
        if isinstance(layer, SparseConv1D):
            weight = weight.t()
        if weight.untyped_storage().data_ptr() == value.untyped_storage().data_ptr():
            weight = weight.clone()  # a dense phase: W itself, stored twice (safetensors wants one name a tensor)
        out[f"{name}.{LATENT_WEIGHT}"] = value
        out[key] = weight.contiguous()
    return out


class PlainLoadableSave:
    """A sparsified Hugging Face model's ``save_pretrained`` (``sparsify`` puts one on the model): the
    class's own, given ``plain_loadable_state`` of the state dict (the one passed, else the model's).
    A model without sparse layers (``export``'s copy) saves as it is."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, save_directory, *args, **kwargs):
        save = type(self.model).save_pretrained
        call = inspect.signature(save).bind(self.model, save_directory, *args, **kwargs)
        if call.arguments.get("push_to_hub"):
            # the shards may need a fix after they are written (keep_latents_beside_weights): push after it
            raise ValueError("save_pretrained(..., push_to_hub=True) of a sparsified model: call "
                             "model.push_to_hub(repo_id), which saves through the same path, or upload the directory")
        state = call.arguments.get("state_dict")
        state = self.model.state_dict() if state is None else state
        call.arguments["state_dict"] = plain_loadable_state(self.model, state)
        result = save(*call.args, **call.kwargs)
        if call.arguments.get("is_main_process", True):
            keep_latents_beside_weights(save_directory)
        return result


def keep_latents_beside_weights(directory: str | os.PathLike) -> None:
    """In a sharded checkpoint, move each ``latent_weight`` into the shard of its layer's ``weight``:
    the Trainer's resume loads shard by shard, and a layer must see both at once (a shard holding only
    S(W) loaded after W would leave S(W) as the weight to train on)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    index_path = Path(directory) / "model.safetensors.index.json"
    if not index_path.is_file():
        return
    index = json.loads(index_path.read_text())
    where = index["weight_map"]
    suffix = f".{LATENT_WEIGHT}"
    moves = {key: where[key[: -len(suffix)] + ".weight"] for key in where
             if key.endswith(suffix) and where.get(key[: -len(suffix)] + ".weight", where[key]) != where[key]}
    if not moves:
        return
    for target in sorted(set(moves.values())):  # one shard in memory at a time, plus the tensors moved in
        tensors = load_file(Path(directory) / target)
        for key in (k for k, t in moves.items() if t == target):
            with safe_open(Path(directory) / where[key], framework="pt") as source:
                tensors[key] = source.get_tensor(key)
        save_file(tensors, Path(directory) / target, metadata={"format": "pt"})
    for source in sorted({where[key] for key in moves}):
        tensors = {k: v for k, v in load_file(Path(directory) / source).items() if k not in moves}
        if tensors:
            save_file(tensors, Path(directory) / source, metadata={"format": "pt"})
        else:  # it held latents only
            (Path(directory) / source).unlink()
    where.update(moves)
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def give_plain_loadable_save(model: nn.Module) -> None:
    """On a Hugging Face model whose config records ``sparsity_lab``, make ``model.save_pretrained`` write
    S(W) as each sparse layer's weight (``PlainLoadableSave``): an attribute of this model alone, so
    copies (``copy.deepcopy``) keep it and other models are untouched."""
    recorded = getattr(getattr(model, "config", None), "sparsity_lab", None) is not None
    if recorded and hasattr(type(model), "save_pretrained") and \
            not isinstance(vars(model).get("save_pretrained"), PlainLoadableSave):
        model.save_pretrained = PlainLoadableSave(model)
