"""After training: an inference model whose 2:4 linears hold their sparse weight once, and the
``compressed-tensors`` sparse-2:4 checkpoint format.

    served = sl.export(model)                       # a copy; the trained model is left as it is
    served(x)                                       # = model.eval()(x)
    sl.save_compressed_tensors(served, "ckpt")      # model.safetensors + config.json's quantization_config

``export`` replaces every ``SparseLinear`` by a ``Sparse24Linear`` built from the weight the trained
layer's eval forward uses, S(W) = m * W (beta * soft_threshold(W) for S-STE):
* on a CUDA GPU where cuSPARSELt runs (compute capability >= 8.0, bfloat16/float16 weights, shapes
  cuSPARSELt accepts) S(W) is compressed once, at export, and every call is one cuSPARSELt product
  (the project's direct binding with a cached plan, ``backends/cusparselt/direct.py``);
* anywhere else (the CPU) the layer keeps S(W) dense, zeros included, and runs ``F.linear``: the same
  outputs, no speed-up. ``export`` says so with an ``ExportFallbackWarning`` naming the reason.
A layer in its dense phase (``Dense``, or masked decay's dense fine-tune) is not 2:4 any more: it
becomes a plain ``nn.Linear``. ``exported.export_report`` lists what each layer became.

``served(x)`` equals ``model.eval()(x)`` except for layers trained on a backend whose products carry a
number format of their own (the FP8 backends: "fp8_reference", "cusparselt_fp8", "fp8_dense",
"torch_fp8sim", ...): their exported products keep the weights' dtype and drop the FP8 rounding of X and
S(W), so the outputs differ by that rounding; ``export`` says so in an ``ExportNumericsWarning`` and in
the report's ``numerics`` entry of each such layer.
"""
from __future__ import annotations

import copy
import json
import os
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .layers import SparseLinear
from .masks import is_nm
from .training_hooks import sparse_layers


class ExportFallbackWarning(UserWarning):
    """Exported 2:4 layers run dense products (no cuSPARSELt here); the outputs are the same."""


class ExportNumericsWarning(UserWarning):
    """Exported layers compute differently from the trained model's eval forward: layers trained on an FP8
    backend (whose products round their operands to FP8) export the same S(W) with products in the weights'
    dtype, without that rounding."""


def _cusparselt_problem(weight: torch.Tensor) -> str | None:
    """Why S(W) cannot be a cuSPARSELt operand here, or None."""
    if not weight.is_cuda:
        return f"the weights are on {weight.device.type}, and cuSPARSELt runs on CUDA GPUs"
    from .backends.cusparselt.ops import sparse_shape_problem, unavailable_reason

    return unavailable_reason(weight.device) or sparse_shape_problem(*weight.shape, weight.dtype)


def check_sparse24(sparse_weight: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Raise ValueError unless ``mask`` is a bool (out, in) 2:4 mask (exactly 2 kept in every group of 4
    along ``in``) of ``sparse_weight``'s shape and ``sparse_weight`` is zero outside it: then the layer
    computes with exactly the values its checkpoint keeps (``compressed_tensors_state``)."""
    if not isinstance(sparse_weight, torch.Tensor) or sparse_weight.dim() != 2 or \
            not sparse_weight.dtype.is_floating_point:
        raise ValueError(f"sparse_weight must be a 2-D floating-point tensor (out, in), got "
                         f"{_describe(sparse_weight)}")
    out_features, in_features = sparse_weight.shape
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != sparse_weight.shape:
        raise ValueError(f"mask must be a bool tensor of sparse_weight's shape {tuple(sparse_weight.shape)}, got "
                         f"{_describe(mask)}")
    if in_features % 4 or not is_nm(mask, 2, 4):
        raise ValueError(f"mask must keep exactly 2 entries in every group of 4 along in_features={in_features} "
                         "(a 2:4 mask, e.g. sparsity_lab.nm_mask(weight, 2, 4)); this one does not")
    if bool(sparse_weight.detach()[~mask].ne(0).any()):
        raise ValueError("sparse_weight has non-zero values outside mask: S(W) is not 2:4, and the layer would "
                         "compute with values its checkpoint drops; pass sparse_weight * mask")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (out_features,)):
        raise ValueError(f"bias must be None or a tensor of shape ({out_features},), got {_describe(bias)}")


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__


class Sparse24Linear(nn.Module):
    """Inference-only 2:4 linear: Z = X S(W)^T + b with S(W) (out, in) fixed at export.

    kernel "cusparselt": S(W) compressed once (buffer ``compressed``, about 9/16 of the dense bytes
    for 16-bit weights); kernel "dense": S(W) kept dense in buffer ``weight`` (CPU fallback).
    ``mask`` (out, in) bool is kept for checkpoints (``save_compressed_tensors``). The constructor refuses
    a mask that is not 2:4 or of another shape, and an S(W) with values outside the mask
    (``check_sparse24``): the checkpoint stores only the kept values.
    """

    def __init__(self, sparse_weight: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor | None,
                 kernel: str) -> None:
        super().__init__()
        if kernel not in ("cusparselt", "dense"):
            raise ValueError(f"kernel must be 'cusparselt' or 'dense', got {kernel!r}")
        check_sparse24(sparse_weight, mask, bias)
        self.out_features, self.in_features = sparse_weight.shape
        self.kernel = kernel
        self.register_buffer("mask", mask.detach().clone())
        self.register_buffer("bias", bias.detach().clone() if bias is not None else None)
        if kernel == "dense":
            self.register_buffer("weight", sparse_weight.detach().clone())
            return
        from .backends.cusparselt.backend import CusparseltBackend

        self._backend = CusparseltBackend()
        self._operand = self._backend.prepare(sparse_weight.detach().contiguous())
        self._backend.compress_operand(self._operand, transposed=False, want_other=False)
        self._operand._weight = None  # the dense copy goes: only the compressed form stays
        self.register_buffer("compressed", self._operand.compressed)

    def dense_weight(self) -> torch.Tensor:
        """S(W) (out, in) as stored by the dense kernel. A cuSPARSELt layer keeps only cuSPARSELt's
        compressed bytes, whose metadata layout is the library's own: it raises."""
        if self.kernel == "dense":
            return self.weight
        raise NotImplementedError("a cuSPARSELt layer keeps only the compressed weight; export with kernel='dense' "
                                  "to read S(W) back")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must have shape (..., in_features={self.in_features}), got {tuple(x.shape)}")
        x2 = x.reshape(-1, self.in_features)
        if self.kernel == "dense":
            z = F.linear(x2.to(self.weight.dtype), self.weight, self.bias)
        else:
            z = self._backend.linear(x2.to(self._operand.dtype), self._operand, self.bias)
        return z.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}"


def effective_weight(layer: SparseLinear, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The weight ``layer``'s eval forward uses, in ``dtype`` (default: the layer's): S(W) = m * W or
    beta * soft_threshold(W), the dense W in a dense phase. What ``export`` serves, and what a Hugging
    Face ``save_pretrained`` of a sparsified model stores as the layer's weight."""
    with torch.no_grad():
        return layer.sparse_weight().to(dtype or layer.weight.dtype)


def export(model: nn.Module, kernel: str = "auto", dtype: torch.dtype | None = None,
           inplace: bool = False) -> nn.Module:
    """An eval-mode inference copy of ``model`` with each SparseLinear replaced (see the module docstring).

    kernel: "auto" (cuSPARSELt where it runs, else dense with an ExportFallbackWarning), "cusparselt"
    (raise where it cannot run) or "dense". dtype: the exported weights' dtype (default: the layer's).
    inplace: convert ``model`` itself instead of a deep copy.
    """
    if kernel not in ("auto", "cusparselt", "dense"):
        raise ValueError(f"kernel must be 'auto', 'cusparselt' or 'dense', got {kernel!r}")
    if not sparse_layers(model):
        raise ValueError("model has no SparseLinear layers: nothing to export (call sparsity_lab.sparsify first)")
    exported = model if inplace else copy.deepcopy(model)
    report, fallbacks, fp8_dropped = [], {}, {}
    for name, layer in sparse_layers(exported):
        if layer.dense_now:
            new: nn.Module = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                                       device=layer.weight.device, dtype=dtype or layer.weight.dtype)
            with torch.no_grad():
                new.weight.copy_(effective_weight(layer))  # W itself in a dense phase
                if layer.bias is not None:
                    new.bias.copy_(layer.bias)
            report.append({"layer": name, "became": "nn.Linear", "why": "dense phase: the weight is not 2:4"})
        else:
            if (layer.method.n, layer.method.m) != (2, 4):
                raise ValueError(f"{name}: S(W) is not 2:4 (a {layer.method.n}:{layer.method.m} mask); only 2:4 "
                                 "layers export")
            weight = effective_weight(layer, dtype)
            problem = _cusparselt_problem(weight) if kernel != "dense" else "kernel='dense' was asked for"
            if problem is not None and kernel == "cusparselt":
                raise RuntimeError(f"{name}: cuSPARSELt cannot run this layer: {problem}")
            chosen = "dense" if problem else "cusparselt"
            try:
                new = Sparse24Linear(weight, layer.mask,
                                     layer.bias.to(weight.dtype) if layer.bias is not None else None, chosen)
            except ValueError as err:
                raise ValueError(f"{name}: {err}; only 2:4 layers export") from err
            if problem and kernel == "auto":
                fallbacks[name] = problem
            new.from_conv1d = type(layer).__name__ == "SparseConv1D"  # GPT-2: checkpoints keep W (in, out)
            report.append({"layer": name, "became": f"Sparse24Linear ({chosen})", "why": problem or "2:4 on cuSPARSELt"})
        if layer.backend.products_in_dense_phase:  # products in a number format of their own (FP8)
            fp8_dropped[name] = layer.backend.name
            report[-1]["numerics"] = f"the FP8 rounding of backend {layer.backend.name!r} dropped"
        parent_name, _, child = name.rpartition(".")
        parent = exported.get_submodule(parent_name) if parent_name else exported
        setattr(parent, child, new)
    if fp8_dropped:
        backends = sorted(set(fp8_dropped.values()))
        warnings.warn(f"export: {len(fp8_dropped)} layers trained on FP8 backend(s) {backends} run their exported "
                      f"products without FP8 rounding (the FP8 numerics are dropped): outputs differ from the "
                      f"trained model's eval forward by that rounding", ExportNumericsWarning, stacklevel=2)
    if fallbacks:
        reasons = sorted(set(fallbacks.values()))
        warnings.warn(f"export: {len(fallbacks)} 2:4 layers run dense products with S(W) stored dense (same outputs, "
                      f"no speed-up): {'; '.join(reasons)}", ExportFallbackWarning, stacklevel=2)
    exported.export_report = report
    config = getattr(exported, "config", None)
    if getattr(config, "sparsity_lab", None) is not None:
        # an inference model holds S(W) as plain weights: its save_pretrained is a dense checkpoint that
        # transformers, lm-eval and dense servers load as they are, with no training recipe to restore
        config.sparsity_lab = None
    return exported.eval()


def _pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """bool (rows, cols) -> uint8 (rows, ceil(cols / 8)); bit i of byte j is column 8 j + i (little-endian
    bit order, as ``numpy.packbits(..., bitorder="little")`` writes it)."""
    rows, cols = mask.shape
    padded = F.pad(mask.to(torch.uint8), (0, (-cols) % 8)).reshape(rows, -1, 8)
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=mask.device)
    return (padded * weights).sum(-1, dtype=torch.uint8)


def compressed_tensors_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict in the sparse-24-bitmask layout: for each exported 2:4 layer ``L``,
    ``L.compressed`` (out, in/2) the kept values row by row, ``L.bitmask`` the packed mask,
    ``L.shape`` (2, 1) int64, instead of ``L.weight``; every other tensor as it is."""
    layers = {name: mod for name, mod in model.named_modules() if isinstance(mod, Sparse24Linear)}
    if not layers:
        raise ValueError("model has no Sparse24Linear layers: call sparsity_lab.export(model) first")
    conv1d = [name for name, layer in layers.items() if getattr(layer, "from_conv1d", False)]
    if conv1d:
        raise ValueError(f"layers {conv1d} were GPT-2 Conv1D modules, whose checkpoints store W as (in, out): their "
                         "2:4 groups run down the columns there, and sparse-24-bitmask holds groups along rows only")
    state = {}
    for key, value in model.state_dict().items():
        owner, _, leaf = key.rpartition(".")
        if owner in layers and leaf in ("weight", "mask", "compressed"):
            continue
        state[key] = value.detach().contiguous().cpu()
    state = _without_aliases(state, _tie_targets(model))
    for name, layer in layers.items():
        weight, mask = layer.dense_weight().detach().cpu(), layer.mask.cpu()
        state[f"{name}.compressed"] = weight[mask].reshape(weight.shape[0], weight.shape[1] // 2).contiguous()
        state[f"{name}.bitmask"] = _pack_bits(mask)
        state[f"{name}.shape"] = torch.tensor(list(weight.shape)).reshape(-1, 1)
    return state


def _tie_targets(model: nn.Module) -> set[str]:
    """State-dict keys that a Hugging Face model ties to another weight when it loads (its
    ``_tied_weights_keys``: a list of names in transformers 4, a {target: source} dict in 5)."""
    targets = set()
    for prefix, module in model.named_modules():
        keys = getattr(module, "_tied_weights_keys", None) or ()
        targets.update(f"{prefix}.{key}" if prefix else key for key in keys)
    return targets


def _without_aliases(state: dict[str, torch.Tensor], tie_targets: set[str]) -> dict[str, torch.Tensor]:
    """``state`` with one name per shared tensor (safetensors refuses two names for one storage: tied
    embeddings). Of the names of one tensor the kept one is not a tie target (the loader ties those
    back); a tensor that only overlaps another's storage is copied."""
    groups: dict[tuple, list[str]] = {}
    for key, value in state.items():
        where = (value.device, value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape),
                 value.stride(), value.dtype)
        groups.setdefault(where, []).append(key)
    out, storages = {}, set()
    for names in groups.values():
        keep = next((n for n in names if n not in tie_targets), names[0])
        value = state[keep]
        storage = (value.device, value.untyped_storage().data_ptr())
        out[keep] = value.clone() if storage in storages else value
        storages.add(storage)
    return {key: out[key] for key in state if key in out}


def save_compressed_tensors(model: nn.Module, path: str | os.PathLike) -> Path:
    """Write ``model`` (from ``export(..., kernel="dense")`` or any export on the CPU) as a
    ``compressed-tensors`` sparse-24-bitmask checkpoint: ``model.safetensors`` and, for a Hugging Face
    model, its config.json with ``quantization_config`` = {"quant_method": "compressed-tensors",
    "sparsity_config": {"format": "sparse-24-bitmask", "sparsity_structure": "2:4", "targets": [...]}}.
    That format is read by compressed-tensors up to 0.14 (later releases dropped it)."""
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    state = compressed_tensors_state(model)
    targets = sorted(name for name, mod in model.named_modules() if isinstance(mod, Sparse24Linear))
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    sparsity_config = {"format": "sparse-24-bitmask", "sparsity_structure": "2:4", "targets": targets,
                       "ignore": [], "global_sparsity": None, "registry_requires_subclass": False}
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        data = config.to_dict()
        data.pop("sparsity_lab", None)  # the exported model is no training checkpoint
        data["quantization_config"] = {"quant_method": "compressed-tensors", "sparsity_config": sparsity_config}
        (out / "config.json").write_text(json.dumps(data, indent=2, default=str))
    else:
        (out / "sparsity_config.json").write_text(json.dumps(sparsity_config, indent=2))
    return out
