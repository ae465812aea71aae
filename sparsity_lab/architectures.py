"""Which linears of a known architecture are its MLP (feed-forward) linears.

``sparsify(model, method)`` with the default ``select`` looks here first: a Hugging Face model carries
``model.config.model_type``, and the table below names its MLP linears exactly (the generic name
pattern of ``sparsify.is_ffn_linear`` would miss BERT's second FFN linear, ``layer.N.output.dense``,
and cannot tell it from the attention's ``attention.output.dense``). Other models fall back to that
pattern; ``select=`` picks anything else. Pure Python: no ``transformers`` import.
"""
from __future__ import annotations

import copy
import re
from dataclasses import asdict
from typing import Callable

from torch import nn

from .layers import SparseLinear
from .methods.config import SparsityMethod
from .conv1d import SparseConv1D, is_conv1d

Selector = Callable[[str, nn.Module], bool]


def _names_ending(pattern: str) -> Selector:
    compiled = re.compile(pattern)
    return lambda name, module: bool(compiled.search(name))


_GATED_MLP = _names_ending(r"\.mlp\.(gate_proj|up_proj|down_proj)$")  # SwiGLU: down(silu(gate(x)) * up(x))

# model_type -> (what its MLP is, selector). Each entry is checked on a model built from its config.
ARCHITECTURES: dict[str, tuple[str, Selector]] = {
    "llama": ("SwiGLU mlp.gate_proj / up_proj / down_proj", _GATED_MLP),
    "mistral": ("SwiGLU mlp.gate_proj / up_proj / down_proj", _GATED_MLP),
    "qwen2": ("SwiGLU mlp.gate_proj / up_proj / down_proj", _GATED_MLP),
    "qwen3": ("SwiGLU mlp.gate_proj / up_proj / down_proj", _GATED_MLP),
    "gemma": ("GeGLU mlp.gate_proj / up_proj / down_proj", _GATED_MLP),
    "gpt2": ("Conv1D mlp.c_fc / mlp.c_proj (weight stored (in, out))", _names_ending(r"\.mlp\.(c_fc|c_proj)$")),
    "bert": ("intermediate.dense / output.dense (not attention.output.dense)",
             _names_ending(r"\.layer\.\d+\.(intermediate|output)\.dense$")),
    "roberta": ("intermediate.dense / output.dense (not attention.output.dense)",
                _names_ending(r"\.layer\.\d+\.(intermediate|output)\.dense$")),
    "opt": ("fc1 / fc2", _names_ending(r"\.layers\.\d+\.(fc1|fc2)$")),
}


def model_type(model: nn.Module) -> str | None:
    """The Hugging Face ``config.model_type`` of ``model``, or None for other models."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    return kind if isinstance(kind, str) else None


def architecture_selector(model: nn.Module) -> Selector | None:
    """The MLP selector of ``model``'s architecture, or None when the table does not know it."""
    entry = ARCHITECTURES.get(model_type(model) or "")
    return entry[1] if entry else None


def is_convertible(module: nn.Module) -> bool:
    """Modules ``sparsify`` can turn into a 2:4 layer: ``nn.Linear`` itself and GPT-2's Conv1D."""
    return type(module) is nn.Linear or is_conv1d(module)


def shape_of(module: nn.Module) -> tuple[int, int]:
    """(out_features, in_features) of a convertible module."""
    if is_conv1d(module):
        in_features, out_features = module.weight.shape
        return out_features, in_features
    return module.out_features, module.in_features


def to_sparse_layer(module: nn.Module, method: SparsityMethod) -> SparseLinear:
    """The 2:4 layer replacing ``module`` (a SparseConv1D for a Conv1D), in ``module``'s train/eval mode."""
    layer = SparseConv1D.from_conv1d(module, method) if is_conv1d(module) else SparseLinear.from_linear(module, method)
    return layer.train(module.training)


def record_recipe(model: nn.Module, method: SparsityMethod, names: list[str]) -> None:
    """On a Hugging Face model, add the method and the layers it converted to ``model.config`` (as
    ``config.sparsity_lab``), so ``save_pretrained`` puts them in config.json and
    ``sparsity_lab.integrations.hf.from_pretrained`` rebuilds the same sparse model.

    The recipe goes into a copy of the config that the model then holds (every submodule that held
    the old object gets the copy): a config object may be shared, by the caller or by a second model
    built from it, and writing into it would give that model this one's recipe."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return
    own = copy.deepcopy(config)
    for module in model.modules():
        if getattr(module, "config", None) is config:
            module.config = own
    recipe = getattr(own, "sparsity_lab", None) or {"groups": []}
    # format 2: save_pretrained stores S(W) as each layer's weight, the latent W beside it (hf_checkpoint.py)
    own.sparsity_lab = {**recipe, "format": 2,
                        "groups": [*recipe["groups"],
                                   {"method": method.name, "fields": asdict(method), "layers": list(names)}]}
