"""SparseLinear: one 2:4 (N:M) linear layer for every training method.

Three products per training step, for Z = X W^T with W (out, in) and X (tokens, in):
    forward         Z  = X S(W)^T + b
    input gradient  dX = dZ S(W)
    weight gradient dW = dZ^T X          (or MVUE(dZ^T) X, groups of 4 along the tokens)
S(W) is m * W (STE family) or beta * soft_threshold(W) (S-STE). The gradient reaches the dense W
unchanged (straight-through); SR-STE adds decay * (1 - m) * W to it inside the backward, masked
decay adds it to the gradient before the optimizer step (``apply_masked_decay``) and the decoupled
variant subtracts lr * decay * (1 - m) * W from W after the step (``apply_decay_on_weights``).

What the method does is its registered handler's (``methods/handlers.py``): the layer asks
``method_handler(self.method)`` for the mask, S(W)'s beta, the decays, MVUE and the dense phase, and
never branches on the method's type. How the products run is the backend's (``self.backend``, which
for FP8 is a child module holding the layer's scaling state). The products themselves (and the autograd
Function that runs them) are in ``layer_products.py``; the step's prepared operand in
``operand_cache.py``; the flip counts, read lazily, in ``flip_counts.py``; the state a CUDA-graph step
adds in ``graph_layer.py``; the sharded mode in ``distributed/sharded_layer.py``; torch.compile's custom
ops in ``custom_ops.py``.

State: the mask and beta are buffers; the integer counters (optimizer steps, when the mask was
computed, flip counts, the MVUE draw counter) are the module's extra state: host ints mirrored in
place into one CPU tensor that ``state_dict()`` returns every time (``host_counters``), so a
checkpointer that took the state dict once still saves the current counters. All of it is updated in
place, so a stopped run resumes exactly.
"""
from __future__ import annotations

import math
import sys
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .backends import get_backend
from .custom_ops import compiled_sparse_linear, register_layer
from .flip_counts import FlipCounts
from .host_counters import COUNTER_TENSOR, HostCounter, new_counter_tensor
from .graph_flips import DeviceSeed
from .layer_products import CallPlan, SparseLinearFn, compute_dtype
from .methods.config import STE, SparsityMethod
from .methods.handlers import MethodHandler, method_handler
from .operand_cache import OperandCache
from .validation import check_divisible, check_float_tensor, check_has_values

_COUNTERS = ("step", "mask_step", "mask_updates", "last_flips", "flips_total", "mvue_seed", "mvue_calls")
_FLIP_COUNTERS = ("last_flips", "flips_total")  # read through the layer's FlipCounts
# a checkpoint that stores S(W) under "weight" for plain loaders (Hugging Face save_pretrained) keeps the
# dense latent W, which training continues from, under this name
LATENT_WEIGHT = "latent_weight"
_RANK_STRIDE = 0x9E3779B97F4A7C15  # odd 64-bit constant: rank streams land far apart in seed space


def mvue_stream_seed(seed: int, rank: int, call: int) -> int:
    """Seed of MVUE draw ``call`` of a layer with ``seed`` on data-parallel ``rank``: a function of the
    three alone, so draws are reproducible, and distinct ranks draw independently (their average
    stays unbiased). Rank 0 gives the single-process seeds."""
    return ((seed + rank * _RANK_STRIDE) * 1_000_003 + call) % (2**63 - 1)


def next_mvue_generator(layer: "SparseLinear") -> torch.Generator:
    """The CPU generator of ``layer``'s next MVUE draw; advances ``layer.mvue_calls``.

    Counter-based: draw k is a function of (seed, rank, k) alone, so resume is exact. A CPU generator
    even for GPU tensors: a backend takes its kernel seed from it (or seeds a device generator, see
    backends.torch_reference.generator_on) without a host-device sync. The rank is ``layer.mvue_rank``
    or, when None, this process's torch.distributed rank (0 when not distributed)."""
    rank = layer.mvue_rank
    if rank is None:
        dist = torch.distributed
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    gen = torch.Generator()
    gen.manual_seed(mvue_stream_seed(layer.mvue_seed, rank, layer.mvue_calls))
    layer.mvue_calls += 1
    return gen


def record_refresh(layer: "SparseLinear", flips: torch.Tensor | None) -> None:
    """The host side of a mask refresh of ``layer``: its flips (a 0-d device tensor, or None for a first
    mask or a layer that counts its own) joined to the flip counts, ``mask_step`` and ``mask_updates``
    advanced, the prepared operand forgotten. The flips stay on the device until someone reads them
    (``last_flips`` / ``flips_total``): a host sync in the step would stall the queue of cuSPARSELt calls."""
    if flips is not None:
        layer.flip_counts.add(flips)
    layer.mask_step = layer.step
    layer.mask_updates += 1
    layer.operand_cache.clear()


def refreshes_mask_with_own_hooks(layer: "SparseLinear") -> bool:
    """True when the layer's class keeps SparseLinear's own mask refresh (``refresh_mask``, ``_replace_mask``):
    a sharded layer overrides them (collectives, a DTensor mask)."""
    cls = type(layer)
    return all(getattr(cls, name) is getattr(SparseLinear, name) for name in ("refresh_mask", "_replace_mask"))


def backend_refreshes(layer: "SparseLinear") -> bool:
    """True when a mask refresh of ``layer`` is its backend's to run (``backend_refresh``), which may do it in
    fewer passes: the layer keeps SparseLinear's own refresh and its method the backend's mask rule (a method
    handler that overrides ``mask`` computes its masks itself)."""
    return refreshes_mask_with_own_hooks(layer) and type(method_handler(layer.method)).mask is MethodHandler.mask


def backend_refresh(layer: "SparseLinear", count: bool, request: tuple[torch.dtype, bool] | None = None
                    ) -> tuple[torch.Tensor | None, Any]:
    """The device work of a refresh of a layer that ``backend_refreshes``: ``(flips, operand)``. The new mask is
    written into ``layer.mask`` and its flips counted (``count``: a 0-d device tensor, else None) by
    ``Backend.refresh_mask_``; with ``request`` = (the products' dtype, whether the input gradient follows)
    also this step's operand for the new mask, by ``Backend.refresh_and_prepare`` (else operand None). The
    host counters are left alone."""
    m, weight = layer.method, layer.weight.detach()
    if request is None:
        return layer.backend.refresh_mask_(weight, layer.mask, m.n, m.m, m.transposable, count=count), None
    dtype, backward = request
    return layer.backend.refresh_and_prepare(weight, layer.mask, method_handler(m).beta(layer), m.n, m.m,
                                             m.transposable, dtype, backward=backward, count=count)


@torch.no_grad()
def refresh_mask_and_operand(layer: "SparseLinear", dtype: torch.dtype, backward: bool) -> None:
    """``layer.refresh_mask()`` followed by this step's operand in ``dtype``, which the operand cache then
    serves, from one backend call (``Backend.refresh_and_prepare``: on cuSPARSELt one pass over W, kernel 21)
    where ``backend_refreshes``; otherwise ``refresh_mask()`` alone (the operand is prepared when the products
    ask for it). The mask, flips, counters and operand are the separate calls'. backward: the input gradient
    will be asked for."""
    if not backend_refreshes(layer):
        layer.refresh_mask()
        return
    flips, operand = backend_refresh(layer, layer.mask_updates > 0, (dtype, backward))
    record_refresh(layer, flips)
    layer.operand_cache.put(layer, dtype, operand, backward=backward)


def _is_dtensor(tensor: torch.Tensor) -> bool:
    dtensor_module = sys.modules.get("torch.distributed.tensor")  # no DTensor exists before its import
    return dtensor_module is not None and isinstance(tensor, dtensor_module.DTensor)


def _migrate_pickled(state: dict) -> None:
    """A layer pickled before its flip counts, operand cache and CUDA-graph seed moved into their own
    objects: the same state in the current attributes."""
    counts = FlipCounts()
    counts.load(state.pop("_last_flips", 0), state.pop("_flips_total", 0))
    counts._pending_sum, counts._pending_last = state.pop("_pending_sum", None), state.pop("_pending_last", None)
    counts.source = state.pop("_graph_flips", None)
    state["flip_counts"] = counts
    cache = state["operand_cache"] = OperandCache()
    cache.entry, cache.prepare_count = state.pop("_operand_cache", None), state.pop("prepare_count", 0)
    device_seed, uses = state.pop("_device_seed", None), state.pop("_device_seed_uses", 0)
    state["seed_source"] = None
    if device_seed is not None:
        source = state["seed_source"] = DeviceSeed(device_seed.device)
        source.tensor, source.uses = device_seed, uses


class SparseLinear(nn.Linear):
    """A drop-in ``nn.Linear`` whose products use an N:M sparse weight.

    weight (out, in); in divisible by M (and out too for transposable masks). The method (see
    ``sparsity_lab.methods``) fixes the algorithm; ``method.backend`` fixes how products run.
    """

    # the counters of the extra state, in _COUNTERS order (last_flips and flips_total: the FlipCounts)
    step = HostCounter(0)
    mask_step = HostCounter(1)
    mask_updates = HostCounter(2)
    mvue_seed = HostCounter(5)
    mvue_calls = HostCounter(6)

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 method: SparsityMethod | None = None, device=None, dtype=None) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._setup(method if method is not None else STE())

    @classmethod
    def from_linear(cls, linear: nn.Linear, method: SparsityMethod) -> "SparseLinear":
        """Wrap an existing linear; the new layer shares its Parameter objects."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.weight = linear.weight
        layer.bias = linear.bias
        layer._setup(method)
        return layer

    # --- set-up ---------------------------------------------------------------------------
    def _setup(self, method: SparsityMethod, from_values: bool = True) -> None:
        """from_values=False: a layer built before its weights hold values (on the meta device, as
        torchtitan builds models); its mask and beta are computed later (``integrations.torchtitan``)."""
        if not isinstance(method, SparsityMethod):
            raise TypeError(f"method must be a SparsityMethod (e.g. STE()), got {type(method).__name__}")
        handler = method_handler(method)  # a config type without a registered handler is refused here
        if _is_dtensor(self.weight):
            raise TypeError("this linear's weight is already sharded (a DTensor, e.g. by fully_shard): call "
                            "sparsify(model, method) first, then sparsity_lab.distributed.fully_shard_sparse")
        # the mask and S-STE's frozen beta are computed from the values: none on meta, none from NaN
        if from_values:
            check_has_values(self.weight, "weight", "SparseLinear (its mask and S-STE's beta come from the weights)")
        check_float_tensor(self.weight, "weight", allow_meta=not from_values)
        check_divisible(self.in_features, method.m, "in_features", 1)
        if method.transposable:
            check_divisible(self.out_features, method.m, "out_features (transposable mask)", 0)
        self.method = method
        # the shared backend, or for a backend with per-layer state (FP8 scales and amax histories) this
        # layer's own, an nn.Module child: its state is then in state_dict() (under "backend.")
        self.backend = get_backend(method.backend).for_layer(self)
        self.op_key = register_layer(self)  # how the torch.compile custom ops find this layer
        self.attached_optimizer = False
        self.operand_cache = OperandCache()
        setattr(self, COUNTER_TENSOR, new_counter_tensor(len(_COUNTERS)))
        self.flip_counts = FlipCounts(mirror=getattr(self, COUNTER_TENSOR))
        # where the backward's MVUE seed comes from: None, the host generator (next_mvue_generator); under a
        # CUDA-graph step a graph_layer.DeviceSeed
        self.seed_source = None
        self._decayed_at_step = -1  # the step whose backward already carries the backward decay (SR-STE)
        # which process's MVUE stream to draw from; None: this process's torch.distributed rank (0 when
        # not distributed), so data-parallel ranks draw independently (not saved: it belongs to the process)
        self.mvue_rank: int | None = None
        for name in _COUNTERS:
            if name not in _FLIP_COUNTERS:
                setattr(self, name, 0)
        self.mvue_seed = int(torch.randint(0, 2**62, (1,), device="cpu").item())
        w = self.weight
        self.register_buffer("mask", torch.ones(w.shape, dtype=torch.bool, device=w.device))
        self.register_buffer("beta", torch.ones((), dtype=torch.float32, device=w.device))
        if not from_values:
            return
        self.refresh_mask()
        handler.init_state(self)  # S-STE's beta: computed once, here, and never updated

    def __setstate__(self, state: dict) -> None:
        if "flip_counts" not in state:
            _migrate_pickled(state)
        plain = {}
        if COUNTER_TENSOR not in state:  # pickled before the counters were mirrored into a tensor
            state[COUNTER_TENSOR] = new_counter_tensor(len(_COUNTERS))
            plain = {name: state.pop(name) for name in _COUNTERS if name in state and name not in _FLIP_COUNTERS}
        state["flip_counts"].mirror = state[COUNTER_TENSOR]
        super().__setstate__(state)
        for name, value in plain.items():
            setattr(self, name, value)
        self.flip_counts.load(self.flip_counts.last, self.flip_counts.total)  # into the tensor too
        self.op_key = register_layer(self)  # a copy (deepcopy, pickle) is a layer of its own

    def counters(self) -> dict[str, int]:
        """The integer counters by name (what ``get_extra_state`` stores, as a dict)."""
        return {name: int(getattr(self, name)) for name in _COUNTERS}

    def get_extra_state(self) -> torch.Tensor:
        """The counters as one int64 tensor in ``_COUNTERS`` order: a tensor, so that tensor-only
        formats (safetensors, Hugging Face ``save_pretrained``) store it. Always the same tensor,
        kept current in place (flip counts still on the device are read into it here)."""
        self.flip_counts.settle()
        return getattr(self, COUNTER_TENSOR)

    def set_extra_state(self, state: torch.Tensor | dict) -> None:
        if isinstance(state, torch.Tensor):  # the current format; a dict is what older checkpoints hold
            if state.shape != (len(_COUNTERS),):
                raise ValueError(f"SparseLinear extra state must hold {len(_COUNTERS)} counters {_COUNTERS}, "
                                 f"got a tensor of shape {tuple(state.shape)}")
            state = dict(zip(_COUNTERS, state.tolist()))
        missing = [name for name in _COUNTERS if name not in state]
        if missing:
            raise ValueError(f"SparseLinear extra state lacks counters {missing}; was it saved by SparseLinear?")
        self.flip_counts.load(state["last_flips"], state["flips_total"])  # replaces any pending count
        for name in _COUNTERS:
            if name not in _FLIP_COUNTERS:
                setattr(self, name, int(state[name]))
        self.operand_cache.clear()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        latent = state_dict.pop(prefix + LATENT_WEIGHT, None)
        if latent is not None:  # the file's "weight" is S(W), for plain loaders: train on from W
            state_dict[prefix + "weight"] = latent
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        # a checkpoint of a backend with per-layer state (FP8: "backend.scaling.*") loaded into a layer whose
        # backend keeps none: the weights, mask and counters load; that state has nowhere to go, said here
        if "backend" in self._modules:
            return
        state_keys = [k for k in unexpected_keys if k.startswith(prefix + "backend.")]
        if state_keys:
            for k in state_keys:
                unexpected_keys.remove(k)
            warnings.warn(f"{prefix or 'the layer'}: the checkpoint holds backend state {sorted(state_keys)} (saved "
                          f"by a backend with per-layer state, e.g. an FP8 backend's scales and amax history), but "
                          f"this layer runs backend {self.backend.name!r}, which keeps none: that state is ignored",
                          UserWarning, stacklevel=4)

    # --- schedule and flips -------------------------------------------------------------------
    @property
    def dense_now(self) -> bool:
        """True when the output uses the dense W: a Dense method, or the dense fine-tune phase."""
        return method_handler(self.method).dense(self)

    def mask_due(self) -> bool:
        """Whether the method still computes masks and ``mask_refresh_interval`` steps have passed."""
        return (method_handler(self.method).tracks_mask(self)
                and self.step - self.mask_step >= self.method.mask_refresh_interval)

    @property
    def last_flips(self) -> int:
        """Flips of the latest mask computation (0 before the second one)."""
        return self.flip_counts.last

    @property
    def flips_total(self) -> int:
        """Flips summed over every mask computation."""
        return self.flip_counts.total

    @property
    def last_flip_rate(self) -> float:
        """Flip rate of the latest mask computation (NaN before the second one)."""
        return self.last_flips / self.mask.numel() if self.mask_updates >= 2 else math.nan

    # --- the mask -------------------------------------------------------------------------------
    @torch.no_grad()
    def refresh_mask(self) -> None:
        """Recompute the mask from the current weight (the method's rule) and count the flips."""
        count = self.mask_updates > 0
        if backend_refreshes(self):  # the backend's calls, which it may fuse (Backend.refresh_mask_)
            flips = backend_refresh(self, count)[0]
        else:
            flips = self._replace_mask(method_handler(self.method).mask(self, self.weight.detach()), count)
        record_refresh(self, flips)

    # hooks that a sharded layer (sparsity_lab.distributed) overrides: the mask buffer may hold only
    # this process's part, while the products need the full mask
    def _replace_mask(self, new: torch.Tensor, count: bool) -> torch.Tensor | None:
        """Store the full mask ``new``; with ``count``, first its flips against the stored one (0-d device tensor),
        returned for ``refresh_mask`` to add (a sharded layer adds its own, summed over processes, and returns None)."""
        flips = self.backend.mask_flips(self.mask, new) if count else None
        self.mask.copy_(new)
        return flips

    def _mask_for_products(self) -> torch.Tensor:
        """The full mask the products of this forward use."""
        return self.mask

    def refuse_plain_fully_shard(self) -> None:
        """Raise TypeError when FSDP2's plain ``fully_shard`` sharded this layer: it shards the weight (a
        DTensor between steps) but leaves the mask full-size and knows nothing of the sparse state, so
        masked decay would mix the two (``sparsity_lab.distributed.fully_shard_sparse`` shards both)."""
        if _is_dtensor(self.weight) and not _is_dtensor(self.mask):
            raise TypeError("this sparse layer was sharded by torch.distributed.fsdp.fully_shard, which shards its "
                            "weight but not its mask: shard a sparsified model with "
                            "sparsity_lab.distributed.fully_shard_sparse(model, blocks) instead of fully_shard")

    # --- the optimizer step ---------------------------------------------------------------------
    def advance_step(self) -> None:
        """Called after every optimizer step (``attach_optimizer`` does it)."""
        self.refuse_plain_fully_shard()
        self.step += 1
        self.operand_cache.clear()
        self.backend.advance_step()  # per-layer backend state (the FP8 amax history); nothing for most

    @torch.no_grad()
    def apply_masked_decay(self, grad_scale: float = 1.0) -> None:
        """The method's term on the gradient right before the optimizer step (masked decay:
        grad += decay * (1 - m) * W); nothing in a dense phase or without a gradient.

        grad_scale: the factor the gradients still carry (a fused optimizer under a GradScaler
        unscales inside its step), so that the decay is right once they are unscaled.
        """
        self.refuse_plain_fully_shard()
        if not self.dense_now and self.weight.grad is not None:
            method_handler(self.method).decay_gradient_(self, self.weight.grad, self.weight, self.mask, grad_scale)

    @torch.no_grad()
    def apply_decay_on_weights(self, lr: float) -> None:
        """The method's term on the weights after the optimizer step (the decoupled masked decay:
        W -= lr * decay * (1 - m) * W; the optimizer never sees it). lr: the weight's param-group
        learning rate. Nothing in a dense phase."""
        self.refuse_plain_fully_shard()
        if not self.dense_now:
            w = self.weight.detach()
            version = w._version
            method_handler(self.method).decay_weight_(self, w, self.mask, lr)
            if w._version != version:
                self.operand_cache.clear()

    # --- products -----------------------------------------------------------------------------
    def sparse_weight(self) -> torch.Tensor:
        """The weight the products use now: m * W or beta * S(W) (dense W in a dense phase)."""
        if self.dense_now:
            return self.weight
        m = self.method
        return self.backend.sparse_weight(self.weight.detach(), self._mask_for_products(),
                                          method_handler(m).beta(self), m.n, m.m)

    def call_plan(self, x: torch.Tensor, training: bool, grad_needed: bool,
                  dtype: torch.dtype | None = None) -> CallPlan | None:
        """The per-call work before the products: mask refresh when due (training), the operand,
        the method's backward decay (once per optimizer step) and the MVUE draw (grad_needed). None in a
        dense phase (plain F.linear), unless the backend runs its products there too
        (``Backend.products_in_dense_phase``: FP8).
        ``forward`` runs it, and under torch.compile the custom op of ``custom_ops.py`` does;
        ``layer_products`` runs the products of the plan. dtype: the products' dtype (default: as
        nn.Linear would, see ``layer_products.compute_dtype``)."""
        refresh = False
        if training:
            if not self.attached_optimizer:
                warnings.warn(
                    "SparseLinear is training but no optimizer is attached, so masks are not "
                    "refreshed and schedules do not advance: call "
                    "sparsity_lab.attach_optimizer(model, optimizer)", stacklevel=3)
            refresh = self.mask_due()
        dense = self.dense_now
        if dense and not self.backend.products_in_dense_phase:
            if refresh:
                self.refresh_mask()
            return None
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"x must have shape (..., in_features={self.in_features}), got {tuple(x.shape)}")
        dtype = dtype or compute_dtype(x, self.weight)
        if refresh and dense:  # the dense phase's operand is the dense W: nothing to prepare with the mask
            self.refresh_mask()
        elif refresh:  # the new mask and this step's operand, from one backend call where it can
            refresh_mask_and_operand(self, dtype, backward=grad_needed)
        operand = self.operand_cache.get(self, dtype, backward=grad_needed)
        if dense:  # an FP8 backend in a dense phase: dense products in its format, dense dW, no decay
            return CallPlan(backend=self.backend, operand=operand, dtype=dtype, mask=self._mask_for_products(),
                            decay=0.0, mvue=False, seed=None)
        mask = self._mask_for_products()
        handler = method_handler(self.method)
        decay = 0.0
        if grad_needed and self._decayed_at_step != self.step:
            # once per optimizer step: with k gradient-accumulation micro-steps (each loss divided by k) the
            # term keeps the size it has without accumulation. Under a GradScaler it is added to the
            # *scaled* gradient, so it shrinks by the loss scale: use bf16 autocast (no scaler) or
            # MaskedDecay, whose decay lands after unscaling
            decay = handler.backward_decay(self)
            if decay:
                self._decayed_at_step = self.step
        mvue = handler.mvue(self)
        seed = None
        if grad_needed and mvue:
            seed = self.seed_source.take() if self.seed_source is not None else next_mvue_generator(self)
        return CallPlan(backend=self.backend, operand=operand, dtype=dtype, mask=mask, decay=decay, mvue=mvue,
                        seed=seed)

    def _after_forward(self, plan: CallPlan) -> None:
        """Hook for a sharded layer: may drop what the backward can rebuild (``plan.rebuild``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            # torch.compile: the per-call work and the products run inside one custom op, so Dynamo
            # traces no host-side counters (no graph break, no recompilation per step)
            return compiled_sparse_linear(self, x)
        grad_enabled = torch.is_grad_enabled()
        grad_needed = grad_enabled and self.weight.requires_grad
        plan = self.call_plan(x, self.training and grad_enabled, grad_needed)
        if plan is None:
            return F.linear(x, self.weight, self.bias)
        out = SparseLinearFn.apply(x, self.weight, self.bias, plan)
        if grad_needed:
            self._after_forward(plan)
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, method={self.method.describe()}, backend={self.backend.name}"
