"""GPT-2's ``Conv1D`` as a 2:4 layer: the same linear map, its weight stored (in, out).

Hugging Face's ``transformers.pytorch_utils.Conv1D`` computes y = x W + b with W of shape (in, out),
the transpose of ``nn.Linear``'s (out, in). ``SparseConv1D`` is a ``SparseLinear`` holding W^T, so the
2:4 groups run along ``in`` exactly as for any linear; its ``state_dict`` writes the weight and mask
back in Conv1D's (in, out) layout and reads them from it, so a dense GPT-2 checkpoint loads into it and
what it saves loads into a dense GPT-2. Recognised by class name: no ``transformers`` import.
"""
from __future__ import annotations

import torch
from torch import nn

from .layers import SparseLinear
from .methods.config import SparsityMethod

_TRANSPOSED = ("weight", "mask")  # the (out, in) tensors kept (in, out) in the checkpoint


def is_conv1d(module: nn.Module) -> bool:
    """True for transformers' Conv1D (weight (nx, nf) = (in, out), bias (nf,))."""
    return (type(module).__name__ == "Conv1D" and type(module).__module__.startswith("transformers")
            and isinstance(getattr(module, "weight", None), torch.Tensor) and module.weight.dim() == 2)


def _to_conv1d_layout(module, state_dict, prefix, local_metadata) -> None:
    for name in _TRANSPOSED:
        key = prefix + name
        if key in state_dict:
            state_dict[key] = state_dict[key].t().contiguous()


def _from_conv1d_layout(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                        error_msgs) -> None:
    expected = (module.in_features, module.out_features)  # Conv1D layout
    for name in _TRANSPOSED:
        key = prefix + name
        value = state_dict.get(key)
        if value is None:
            continue
        if tuple(value.shape) != expected:
            error_msgs.append(f"{key}: a Conv1D-layout tensor of shape (in, out) = {expected} was expected "
                              f"(SparseConv1D checkpoints keep GPT-2's layout), got {tuple(value.shape)}")
            state_dict.pop(key)
            continue
        state_dict[key] = value.t()


class SparseConv1D(SparseLinear):
    """A ``SparseLinear`` made from a Conv1D: weight (out, in) inside, (in, out) in ``state_dict``."""

    @classmethod
    def from_conv1d(cls, conv: nn.Module, method: SparsityMethod) -> "SparseConv1D":
        """A new layer holding a transposed copy of ``conv.weight`` (a new Parameter: build the
        optimizer after ``sparsify``) and ``conv``'s bias Parameter."""
        in_features, out_features = conv.weight.shape
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = in_features, out_features
        layer.weight = nn.Parameter(conv.weight.detach().t().contiguous(), requires_grad=conv.weight.requires_grad)
        layer.bias = conv.bias
        layer._setup(method)
        layer.register_state_dict_post_hook(_to_conv1d_layout)
        layer.register_load_state_dict_pre_hook(_from_conv1d_layout)
        return layer
