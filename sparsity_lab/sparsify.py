"""The one verb: ``sparsify(model, method)`` turns a model's chosen linears into SparseLinear.

Like ``torchao.quantize_``: it walks the model and swaps modules in place, driven by a small
method object; ``select`` picks the modules (by default the FFN/MLP linears of a transformer).

Whole-model reports: ``flip_report``, ``sparsity_summary`` and ``backend_report`` (which backend
runs each layer's products).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Iterable

from torch import nn

from .architectures import architecture_selector, is_convertible, record_recipe, shape_of, to_sparse_layer
from .hf_checkpoint import give_plain_loadable_save
from .methods.config import SparsityMethod
from .methods.flip_rate import overall_flip_rate
from .methods.handlers import method_handler
from .training_hooks import sparse_layers

# Names of feed-forward blocks in common transformer code (nanoGPT, HF GPT-2/BERT/Llama, timm).
FFN_NAME_PATTERN = re.compile(r"(^|\.)(mlp|ffn|feed_?forward|fc[12]|c_fc|intermediate|up_proj|down_proj|gate_proj)(\.|$)",
                              re.IGNORECASE)

Selector = Callable[[str, nn.Linear], bool]


def is_ffn_linear(name: str, module: nn.Linear) -> bool:
    """Default selector: a linear whose qualified name says it belongs to an FFN/MLP block."""
    return bool(FFN_NAME_PATTERN.search(name))


def module_selector(select: Selector | str | Iterable[str] | None, model: nn.Module | None = None) -> Selector:
    if select is None or select == "ffn":
        # a known architecture (Hugging Face config.model_type) names its MLP linears exactly
        return (architecture_selector(model) if model is not None else None) or is_ffn_linear
    if select == "all":
        return lambda name, module: True
    if callable(select):
        return select
    if isinstance(select, str):
        raise ValueError(f"select must be 'ffn', 'all', a callable or a list of module names, got {select!r}")
    names = set(select)
    return lambda name, module: name in names


def sparsify(model: nn.Module, method: SparsityMethod,
             select: Selector | str | Iterable[str] | None = None) -> nn.Module:
    """Replace the selected ``nn.Linear`` modules of ``model`` by ``SparseLinear`` (in place).

    method: a config object (``STE()``, ``SRSTE()``, ``MaskedDecay(total_steps=...)``, ``SSTE()``,
    ``Dense()`` for the dense reference with flip tracking). select: "ffn" (default: the MLP linears
    of a Hugging Face architecture listed in ``architectures.py``, else the FFN name
    pattern), "all", a list of qualified module names, or ``fn(name, module) -> bool``. GPT-2's
    ``Conv1D`` is converted too (to ``SparseConv1D``, with a new weight Parameter).
    A module used at several places of the model (the same ``nn.Linear`` object under several names) is
    converted once, and the one 2:4 layer takes every place; selecting any of its names selects it.
    Returns the model. Raises ValueError when nothing matches or a shape cannot take N:M.
    Create the optimizer afterwards and call ``attach_optimizer(model, optimizer)``.
    """
    if not isinstance(method, SparsityMethod):
        raise TypeError(f"method must be a SparsityMethod (e.g. sparsity_lab.STE()), got {type(method).__name__}")
    if isinstance(model, nn.parallel.DistributedDataParallel):
        raise TypeError("the model is already wrapped in DistributedDataParallel: call sparsify(model, method) on the "
                        "plain module first, then wrap it (sparsity_lab.distributed.data_parallel)")
    if select is not None and not isinstance(select, str) and not callable(select):
        select = list(select)  # a generator of names is read once, here
    chosen = module_selector(select, model)
    # a module used at several places (one nn.Linear object under two names) is one target: it is converted
    # once and the 2:4 layer replaces it at every place, so no use of its weight stays dense
    places: dict[int, list[str]] = {}
    for name, mod in model.named_modules(remove_duplicate=False):
        if is_convertible(mod):  # nn.Linear, or GPT-2's Conv1D
            places.setdefault(id(mod), []).append(name)
    modules = {id(mod): mod for _, mod in model.named_modules(remove_duplicate=False)}
    targets = [(names[0], modules[key]) for key, names in places.items()
               if any(chosen(name, modules[key]) for name in names)]
    already = [name for name, mod in sparse_layers(model) if chosen(name, mod)]
    if already and (not targets or isinstance(select, list)):
        raise ValueError(f"model is already sparsified: the selected module(s) {_names(already)} are SparseLinear "
                         f"already ({model.get_submodule(already[0]).method.describe()}); sparsify a fresh "
                         "model, or select only plain nn.Linear modules")
    if not targets:
        what = "the FFN/MLP name pattern (default select='ffn')" if select in (None, "ffn") else f"select={select!r}"
        raise ValueError(f"no nn.Linear matched {what}; pass select='all', a list of module names or a function")
    if isinstance(select, list):
        unknown = set(select) - {name for _, mod in targets for name in places[id(mod)]}
        if unknown:
            raise ValueError(f"select names modules that are not nn.Linear in the model: {sorted(unknown)}")
    # build every layer first: a shape error leaves the model untouched, not half converted
    layers = []
    for name, linear in targets:
        try:
            layers.append((name, to_sparse_layer(linear, method)))
        except ValueError as err:
            raise ValueError(f"cannot make {name!r} ({'x'.join(map(str, shape_of(linear)))}) "
                             f"{method.n}:{method.m}: {err}") from err
    for (_, linear), (_, layer) in zip(targets, layers):
        for place in places[id(linear)]:
            parent_name, _, child = place.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, layer)
    record_recipe(model, method, [name for name, _ in layers])
    give_plain_loadable_save(model)  # a Hugging Face model's save_pretrained writes the 2:4 weights
    return model


def _names(names: list[str], most: int = 4) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def flip_report(model: nn.Module, fresh_only: bool = False) -> dict[str, float]:
    """Latest flip rate per sparse layer and ``"overall"`` (flips summed / weights summed).

    Layers that have computed fewer than two masks report NaN and stay out of the overall.
    fresh_only=True also reports NaN for layers whose latest mask was not computed at the current
    step (call it after the forward pass and before ``optimizer.step()``): a log then holds flip
    rates only at mask computations (refresh interval > 1, dense fine-tune phase).
    """
    report: dict[str, float] = {}
    pairs = []
    for name, layer in sparse_layers(model):
        # fresh: the latest mask computation happened at the current step (and had a predecessor)
        fresh = layer.mask_updates >= 2 and layer.mask_step == layer.step
        stale = fresh_only and not fresh
        report[name] = math.nan if stale else layer.last_flip_rate
        if not math.isnan(report[name]):
            pairs.append((layer.last_flips, layer.mask.numel()))
    report["overall"] = overall_flip_rate(pairs)
    return report


def sparsity_summary(model: nn.Module) -> list[dict]:
    """One row per sparse layer: name, shape, method, density of its mask, dense phase, step."""
    rows = []
    for name, layer in sparse_layers(model):
        rows.append({
            "layer": name, "shape": tuple(layer.weight.shape), "method": layer.method.describe(),
            "density": float(layer.mask.float().mean()), "dense_now": layer.dense_now,
            "step": layer.step, "beta": float(layer.beta),
        })
    return rows


@dataclass
class LayerBackendRow:
    """One SparseLinear in :func:`backend_report`."""

    name: str
    out_features: int
    in_features: int
    requested: str  # method.backend
    running: str  # backend.name of what runs the products
    fallback_reason: str | None
    products: dict[str, str]

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def backend_report(model) -> list[LayerBackendRow]:
    """Which backend runs each SparseLinear, and per product whether it runs sparse (and why)."""
    from .backends.base import PRODUCTS
    from .backends.report import report_of

    rows = []
    for name, layer in sparse_layers(model):
        report = report_of(layer.backend)
        if layer.dense_now:
            products = {p: "dense W (dense phase of the method)" for p in PRODUCTS}
        else:
            products = report.product_plan(layer.out_features, layer.in_features,
                                           method_handler(layer.method).mvue(layer))
        rows.append(LayerBackendRow(name or "<model>", layer.out_features, layer.in_features, layer.method.backend,
                                    report.name, report.fallback_reason, products))
    return rows


def format_backend_report(rows: list[LayerBackendRow]) -> str:
    """The rows of :func:`backend_report` as text, one block per layer."""
    from .backends.cusparselt.auto import PRODUCTS

    lines = []
    for r in rows:
        head = f"{r.name} ({r.out_features}x{r.in_features}): asked {r.requested!r}, runs {r.running!r}"
        if r.fallback_reason:
            head += f" -- FALLBACK: {r.fallback_reason}"
        lines.append(head)
        lines.extend(f"    {p:<12} {r.products[p]}" for p in PRODUCTS)
    return "\n".join(lines)
