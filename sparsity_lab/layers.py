"""SparseLinear: one 2:4 (N:M) linear layer for every training method.

Three products per training step, for Z = X W^T with W (out, in) and X (tokens, in):
    forward         Z  = X S(W)^T + b
    input gradient  dX = dZ S(W)
    weight gradient dW = dZ^T X          (or MVUE(dZ^T) X, groups of 4 along the tokens)
S(W) is m * W (STE family) or beta * soft_threshold(W) (S-STE). The gradient reaches the dense W
unchanged (straight-through); SR-STE adds decay * (1 - m) * W to it inside the backward, masked
decay adds it to the gradient before the optimizer step (``apply_masked_decay``) and the decoupled
variant subtracts lr * decay * (1 - m) * W from W after the step (``apply_decay_on_weights``).

State: the mask and beta are buffers; the integer counters (optimizer steps, when the mask was
computed, flip counts, the MVUE draw counter) are the module's extra state. Both are in
``state_dict()``, so a stopped run resumes exactly.

The products themselves (and the autograd Function that runs them) are in ``layer_products.py``.
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
from .backends.base import MvueSeed
from .custom_ops import compiled_sparse_linear, register_layer
from .graph_flips import GraphFlipCounts
from .layer_products import CallPlan, SparseLinearFn, compute_dtype
from .methods.config import STE, SparsityMethod
from .methods.soft_threshold import soft_threshold, sste_beta
from .validation import check_divisible, check_float_tensor, check_has_values

_COUNTERS = ("step", "mask_step", "mask_updates", "last_flips", "flips_total", "mvue_seed", "mvue_calls")
_RANK_STRIDE = 0x9E3779B97F4A7C15  # odd 64-bit constant: rank streams land far apart in seed space


def mvue_stream_seed(seed: int, rank: int, call: int) -> int:
    """Seed of MVUE draw ``call`` of a layer with ``seed`` on data-parallel ``rank``: a function of the
    three alone, so draws are reproducible, and distinct ranks draw independently (their average
    stays unbiased). Rank 0 gives the single-process seeds."""
    return ((seed + rank * _RANK_STRIDE) * 1_000_003 + call) % (2**63 - 1)


def _is_dtensor(tensor: torch.Tensor) -> bool:
    dtensor_module = sys.modules.get("torch.distributed.tensor")  # no DTensor exists before its import
    return dtensor_module is not None and isinstance(tensor, dtensor_module.DTensor)


class SparseLinear(nn.Linear):
    """A drop-in ``nn.Linear`` whose products use an N:M sparse weight.

    weight (out, in); in divisible by M (and out too for transposable masks). The method (see
    ``sparsity_lab.methods``) fixes the algorithm; ``method.backend`` fixes how products run.
    """

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
    def _setup(self, method: SparsityMethod) -> None:
        if not isinstance(method, SparsityMethod):
            raise TypeError(f"method must be a SparsityMethod (e.g. STE()), got {type(method).__name__}")
        if _is_dtensor(self.weight):
            raise TypeError("this linear's weight is already sharded (a DTensor, e.g. by fully_shard): call "
                            "sparsify(model, method) first, then sparsity_lab.distributed.fully_shard_sparse")
        # the mask and S-STE's frozen beta are computed from the values: none on meta, none from NaN
        check_has_values(self.weight, "weight", "SparseLinear (its mask and S-STE's beta come from the weights)")
        check_float_tensor(self.weight, "weight")
        check_divisible(self.in_features, method.m, "in_features", 1)
        if method.transposable:
            check_divisible(self.out_features, method.m, "out_features (transposable mask)", 0)
        self.method = method
        # the shared backend, or for a backend with per-layer state (FP8 scales and amax histories) this
        # layer's own, an nn.Module child: its state is then in state_dict() (under "backend.")
        self.backend = get_backend(method.backend).for_layer(self)
        self.op_key = register_layer(self)  # how the torch.compile custom ops find this layer
        self.attached_optimizer = False
        self._operand_cache: tuple[tuple, Any] | None = None
        self.prepare_count = 0  # how many operands were prepared (diagnostic, not saved)
        self._decayed_at_step = -1  # SR-STE: step whose backward already carries the decay
        self._pending_sum = self._pending_last = None  # flip counts still on the device
        # CUDA-graph step with the mask refresh inside the graph: the flips it counts on the device (None
        # otherwise; see use_graph_flips)
        self._graph_flips: GraphFlipCounts | None = None
        # CUDA-graph step (sparsity_lab.graph_step): the MVUE seed lives in this 0-d int64 device tensor,
        # written by the host before each replay; None in eager mode (see use_device_seed)
        self._device_seed: torch.Tensor | None = None
        self._device_seed_uses = 0  # forward calls that took _device_seed since use_device_seed
        self._last_flips = self._flips_total = 0
        # which process's MVUE stream to draw from; None: this process's torch.distributed rank (0 when
        # not distributed), so data-parallel ranks draw independently (not saved: it belongs to the process)
        self.mvue_rank: int | None = None
        for name in _COUNTERS:
            setattr(self, name, 0)
        self.mvue_seed = int(torch.randint(0, 2**62, (1,)).item())
        w = self.weight
        self.register_buffer("mask", torch.ones(w.shape, dtype=torch.bool, device=w.device))
        self.register_buffer("beta", torch.ones((), dtype=torch.float32, device=w.device))
        self.refresh_mask()
        if method.soft_threshold:
            # beta is computed once, here, and never updated (updating it makes it grow).
            with torch.no_grad():
                self.beta.copy_(sste_beta(w, soft_threshold(w, self.mask, method.n, method.m)))

    def __setstate__(self, state: dict) -> None:
        state.setdefault("_graph_flips", None)  # a layer pickled before CUDA-graph mask refreshes existed
        super().__setstate__(state)
        self.op_key = register_layer(self)  # a copy (deepcopy, pickle) is a layer of its own

    def counters(self) -> dict[str, int]:
        """The integer counters by name (what ``get_extra_state`` stores, as a dict)."""
        return {name: int(getattr(self, name)) for name in _COUNTERS}

    def get_extra_state(self) -> torch.Tensor:
        """The counters as one int64 tensor in ``_COUNTERS`` order: a tensor, so that tensor-only
        formats (safetensors, Hugging Face ``save_pretrained``) store it."""
        return torch.tensor([int(getattr(self, name)) for name in _COUNTERS], dtype=torch.int64)

    def set_extra_state(self, state: torch.Tensor | dict) -> None:
        if isinstance(state, torch.Tensor):  # the current format; a dict is what older checkpoints hold
            if state.shape != (len(_COUNTERS),):
                raise ValueError(f"SparseLinear extra state must hold {len(_COUNTERS)} counters {_COUNTERS}, "
                                 f"got a tensor of shape {tuple(state.shape)}")
            state = dict(zip(_COUNTERS, state.tolist()))
        missing = [name for name in _COUNTERS if name not in state]
        if missing:
            raise ValueError(f"SparseLinear extra state lacks counters {missing}; was it saved by SparseLinear?")
        self._pending_sum = self._pending_last = None  # the loaded counters replace any pending count
        if self._graph_flips is not None:
            self._graph_flips.discard()
        for name in _COUNTERS:
            setattr(self, name, int(state[name]))
        self._operand_cache = None

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
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

    # --- schedule ---------------------------------------------------------------------------
    @property
    def dense_now(self) -> bool:
        """True when the output uses the dense W: a Dense method, or the dense fine-tune phase."""
        start = self.method.dense_finetune_step
        return (not self.method.sparse_forward) or (start is not None and self.step >= start)

    @property
    def tracks_mask(self) -> bool:
        """Whether masks are still computed: sparse phases always, Dense when it tracks flips."""
        if not self.method.sparse_forward:
            return bool(getattr(self.method, "track_flips", False))
        return not self.dense_now

    def mask_due(self) -> bool:
        return self.tracks_mask and self.step - self.mask_step >= self.method.mask_refresh_interval

    @property
    def last_flip_rate(self) -> float:
        """Flip rate of the latest mask computation (NaN before the second one)."""
        return self.last_flips / self.mask.numel() if self.mask_updates >= 2 else math.nan

    @property
    def mask_is_fresh(self) -> bool:
        """True when the latest mask computation happened at the current step (and had a predecessor)."""
        return self.mask_updates >= 2 and self.mask_step == self.step

    @torch.no_grad()
    def refresh_mask(self) -> None:
        """Recompute the mask from the current weight and count the flips."""
        m = self.method
        new = self.backend.mask(self.weight.detach(), m.n, m.m, m.transposable)
        if self.mask_updates > 0:
            # counted on the device and read when someone asks (last_flips / flips_total): no host
            # sync in the training step, which would stall the queue of cuSPARSELt calls
            flips = self._count_flips(new)
            self._take_graph_flips()  # refreshes replayed in a CUDA graph came before this one
            self._pending_last = flips
            self._pending_sum = flips if self._pending_sum is None else self._pending_sum + flips
        self._set_mask(new)
        self.mask_step = self.step
        self.mask_updates += 1
        self._operand_cache = None

    # hooks that a sharded layer (sparsity_lab.distributed) overrides: the mask buffer may hold only
    # this process's part, while the products need the full mask
    def _count_flips(self, new: torch.Tensor) -> torch.Tensor:
        return self.backend.mask_flips(self.mask, new)

    def _set_mask(self, new: torch.Tensor) -> None:
        self.mask.copy_(new)

    def _mask_for_products(self) -> torch.Tensor:
        """The full mask the products of this forward use."""
        return self.mask

    def _settle_flips(self) -> None:
        self._take_graph_flips()
        if self._pending_sum is not None:
            total, last = torch.stack((self._pending_sum, self._pending_last)).tolist()  # one host sync
            self._flips_total += int(total)
            self._last_flips = int(last)
            self._pending_sum = self._pending_last = None

    def _take_graph_flips(self) -> None:
        """Fold the flips that CUDA-graph replays counted since the last look into the pending counts, as
        if each replay's refresh had been an eager ``refresh_mask`` (device tensors, no host sync)."""
        taken = self._graph_flips.take() if self._graph_flips is not None else None
        if taken is not None:
            latest, since = taken
            self._pending_last = latest
            self._pending_sum = since if self._pending_sum is None else self._pending_sum + since

    @property
    def last_flips(self) -> int:
        """Flips of the latest mask computation (0 before the second one)."""
        self._settle_flips()
        return self._last_flips

    @last_flips.setter
    def last_flips(self, value: int) -> None:
        self._settle_flips()
        self._last_flips = int(value)

    @property
    def flips_total(self) -> int:
        """Flips summed over every mask computation."""
        self._settle_flips()
        return self._flips_total

    @flips_total.setter
    def flips_total(self, value: int) -> None:
        self._settle_flips()
        self._flips_total = int(value)

    def refuse_plain_fully_shard(self) -> None:
        """Raise TypeError when FSDP2's plain ``fully_shard`` sharded this layer: it shards the weight (a
        DTensor between steps) but leaves the mask full-size and knows nothing of the sparse state, so
        masked decay would mix the two (``sparsity_lab.distributed.fully_shard_sparse`` shards both)."""
        if _is_dtensor(self.weight) and not _is_dtensor(self.mask):
            raise TypeError("this sparse layer was sharded by torch.distributed.fsdp.fully_shard, which shards its "
                            "weight but not its mask: shard a sparsified model with "
                            "sparsity_lab.distributed.fully_shard_sparse(model, blocks) instead of fully_shard")

    def advance_step(self) -> None:
        """Called after every optimizer step (``attach_optimizer`` does it)."""
        self.refuse_plain_fully_shard()
        self.step += 1
        self._operand_cache = None
        self.backend.advance_step()  # per-layer backend state (the FP8 amax history); nothing for most

    @torch.no_grad()
    def apply_masked_decay(self, grad_scale: float = 1.0) -> None:
        """grad += decay * (1 - m) * W, for methods that decay right before the optimizer step.

        grad_scale: the factor the gradients still carry (a fused optimizer under a GradScaler
        unscales inside its step), so that the decay is right once they are unscaled.
        """
        self.refuse_plain_fully_shard()
        decay = self.method.decay_before_step
        if decay and not self.dense_now and self.weight.grad is not None:
            self.backend.masked_decay_(self.weight.grad, self.weight, self.mask, decay * grad_scale)

    @torch.no_grad()
    def apply_decay_on_weights(self, lr: float) -> None:
        """W -= lr * decay * (1 - m) * W, for methods that decay the weights after the optimizer step
        (decoupled: the optimizer never sees the term). lr: the weight's param-group learning rate."""
        self.refuse_plain_fully_shard()
        decay = self.method.decay_after_step
        if decay and not self.dense_now:
            w = self.weight.detach()
            # in place, elementwise: w += (-lr * decay) * (1 - m) * w
            self.backend.masked_decay_(w, w, self.mask, -float(lr) * decay)
            self._operand_cache = None

    # --- products -----------------------------------------------------------------------------
    def sparse_weight(self) -> torch.Tensor:
        """The weight the products use now: m * W or beta * S(W) (dense W in a dense phase)."""
        if self.dense_now:
            return self.weight
        m = self.method
        beta = self.beta if m.soft_threshold else None
        return self.backend.sparse_weight(self.weight.detach(), self._mask_for_products(), beta, m.n, m.m)

    def _operand(self, dtype: torch.dtype, backward: bool = True) -> Any:
        # one prepared (pruned, and for hardware backends compressed) weight per optimizer step,
        # reused by every gradient-accumulation micro-step; rebuilt when W, the mask or beta change
        key = (self.step, self.weight._version, self.mask._version, self.beta._version, self.mask_updates,
               dtype, self.weight.device)
        if self._operand_cache is None or self._operand_cache[0] != key:
            self.prepare_count += 1
            m = self.method
            if self.dense_now:  # only reached for a backend with products_in_dense_phase
                operand = self.backend.prepare_dense(self.weight.detach(), dtype)
            else:
                operand = self.backend.prepare_masked(self.weight.detach(), self._mask_for_products(),
                                                      self.beta if m.soft_threshold else None,
                                                      m.n, m.m, dtype, backward=backward)
            self._operand_cache = (key, operand)
        return self._operand_cache[1]

    def clear_operand_cache(self) -> None:
        """Forget the prepared operand: the next forward prepares it again (a CUDA-graph capture must
        prepare it inside the graph, and the captured one must not serve a later eager call)."""
        self._operand_cache = None

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if not self.method.mvue:
            return None
        # counter-based: draw k of this layer is a function of (seed, k) alone, so resume is exact.
        # A CPU generator even for GPU tensors: a backend takes its kernel seed from it (or seeds a
        # device generator, see backends.torch_reference.generator_on) without a host-device sync.
        gen = torch.Generator()
        gen.manual_seed(mvue_stream_seed(self.mvue_seed, self._mvue_rank(), self.mvue_calls))
        self.mvue_calls += 1
        return gen

    def _mvue_rank(self) -> int:
        if self.mvue_rank is not None:
            return self.mvue_rank
        dist = torch.distributed
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    def _seed_for_backward(self, device: torch.device) -> MvueSeed | None:
        """What the backend draws MVUE from: this call's CPU generator (eager), or under a CUDA-graph
        step the device seed tensor that the step fills before each replay (``fill_device_seed``)."""
        if self._device_seed is None or not self.method.mvue:
            return self._generator(device)
        self._device_seed_uses += 1
        return self._device_seed

    # --- CUDA-graph mode: the mask refresh inside the graph (sparsity_lab.graph_step) -------------------
    @property
    def refreshes_mask_with_own_hooks(self) -> bool:
        """True when this class keeps SparseLinear's own mask refresh (``refresh_mask``, ``_count_flips``,
        ``_set_mask``): a sharded layer overrides them (collectives, a DTensor mask) and is refreshed eagerly."""
        cls = type(self)
        return all(getattr(cls, name) is getattr(SparseLinear, name)
                   for name in ("refresh_mask", "_count_flips", "_set_mask"))

    def use_graph_flips(self, device: torch.device) -> GraphFlipCounts:
        """Give the layer device flip counts for a mask refresh captured in a CUDA graph (kept, with what
        they counted, when the layer has them on ``device`` already)."""
        device = torch.device(device)
        if self._graph_flips is None or self._graph_flips.device != device:
            self._take_graph_flips()
            self._graph_flips = GraphFlipCounts(device)
        return self._graph_flips

    def release_graph_flips(self) -> None:
        """Back to eager refreshes only: what the replays counted joins the pending counts first."""
        self._take_graph_flips()
        self._graph_flips = None

    @torch.no_grad()
    def refresh_mask_in_graph(self) -> None:
        """The device work of ``refresh_mask`` for a CUDA-graph capture: the new mask from the weight into
        the mask buffer (in place) and its flips against the previous mask into the graph flip counts.
        The host counters are not touched here (a capture runs nothing); ``after_graph_refresh`` updates
        them after each replay. Needs ``use_graph_flips`` first and a previous mask (``mask_updates`` >= 1)."""
        if self._graph_flips is None:
            raise RuntimeError("refresh_mask_in_graph needs use_graph_flips(device) first")
        if self.mask_updates < 1:
            raise RuntimeError("refresh_mask_in_graph counts flips against the previous mask; this layer has "
                               "none yet (mask_updates 0): refresh it eagerly first")
        m = self.method
        new = self.backend.mask(self.weight.detach(), m.n, m.m, m.transposable)
        self._graph_flips.record(self._count_flips(new))
        self._set_mask(new)

    def after_graph_refresh(self) -> None:
        """Host bookkeeping after a replay that ran ``refresh_mask_in_graph``: the counters an eager
        ``refresh_mask`` would have advanced (no device work, no sync)."""
        self._graph_flips.replayed()
        self.mask_step = self.step
        self.mask_updates += 1
        self._operand_cache = None

    # --- CUDA-graph mode: the MVUE seed read on the device (sparsity_lab.graph_step) -------------------
    def use_device_seed(self, device: torch.device) -> None:
        """From now on the backward draws MVUE from a 0-d int64 seed tensor on ``device`` that
        ``fill_device_seed`` writes before each step (a CUDA graph replays the kernels that read it).
        Refused for a layer without MVUE and for a backend that draws on the host
        (``reads_seed_from_device`` False). Resets ``device_seed_uses``."""
        if not self.method.mvue:
            raise ValueError(f"use_device_seed is for MVUE layers; this layer's method is {self.method.describe()}")
        if not self.backend.reads_seed_from_device:
            raise ValueError(
                f"a CUDA-graph step needs every MVUE layer on a backend whose kernels read the MVUE seed on the "
                f"device (reads_seed_from_device: e.g. 'triton', 'cusparselt'); this layer runs "
                f"{self.backend.name!r}, which draws on the host")
        device = torch.device(device)
        if self._device_seed is None or self._device_seed.device != device:
            self._device_seed = torch.zeros((), dtype=torch.int64, device=device)
        self._device_seed_uses = 0

    def fill_device_seed(self) -> int:
        """Write the next MVUE draw's seed into the device seed tensor: the value the eager step would
        draw (the layer's counter-based generator for its next call; ``mvue_calls`` advances as in eager
        mode). Returns the value written."""
        if self._device_seed is None:
            raise RuntimeError("fill_device_seed needs use_device_seed(device) first")
        seed = self.backend.device_seed_value(self._generator(self._device_seed.device))
        self._device_seed.fill_(seed)
        return seed

    def release_device_seed(self) -> None:
        """Back to eager mode: the backward draws from a host generator again."""
        self._device_seed = None

    @property
    def device_seed(self) -> torch.Tensor | None:
        """The 0-d int64 device tensor the MVUE kernels read in CUDA-graph mode; None in eager mode."""
        return self._device_seed

    @property
    def device_seed_uses(self) -> int:
        """Forward calls that took the device seed since ``use_device_seed`` (one per captured step)."""
        return self._device_seed_uses

    def _backward_decay(self) -> float:
        """SR-STE's decay, once per optimizer step: with k gradient-accumulation micro-steps (each
        loss divided by k) the term keeps the size it has without accumulation. Under a
        GradScaler the term is added to the *scaled* gradient, so it shrinks by the loss scale:
        use bf16 autocast (no scaler) or MaskedDecay, whose decay lands after unscaling."""
        decay = self.method.decay_in_backward
        if not decay or self._decayed_at_step == self.step:
            return 0.0
        self._decayed_at_step = self.step
        return decay

    def call_plan(self, x: torch.Tensor, training: bool, grad_needed: bool,
                  dtype: torch.dtype | None = None) -> CallPlan | None:
        """The per-call work before the products: mask refresh when due (training), the operand,
        SR-STE's decay and the MVUE draw (grad_needed). None in a dense phase (plain F.linear), unless
        the backend runs its products there too (``Backend.products_in_dense_phase``: FP8).
        ``forward`` runs it, and under torch.compile the custom op of ``custom_ops.py`` does;
        ``layer_products`` runs the products of the plan. dtype: the products' dtype (default: as
        nn.Linear would, see ``layer_products.compute_dtype``)."""
        if training:
            if not self.attached_optimizer:
                warnings.warn(
                    "SparseLinear is training but no optimizer is attached, so masks are not "
                    "refreshed and schedules do not advance: call "
                    "sparsity_lab.attach_optimizer(model, optimizer)", stacklevel=3)
            if self.mask_due():
                self.refresh_mask()
        dense = self.dense_now
        if dense and not self.backend.products_in_dense_phase:
            return None
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"x must have shape (..., in_features={self.in_features}), got {tuple(x.shape)}")
        dtype = dtype or compute_dtype(x, self.weight)
        if dense:  # an FP8 backend in a dense phase: dense products in its format, dense dW, no decay
            return CallPlan(backend=self.backend, operand=self._operand(dtype, backward=grad_needed), dtype=dtype,
                            mask=self._mask_for_products(), decay=0.0, mvue=False, seed=None)
        return CallPlan(
            backend=self.backend, operand=self._operand(dtype, backward=grad_needed), dtype=dtype,
            mask=self._mask_for_products(),
            decay=self._backward_decay() if grad_needed else 0.0, mvue=self.method.mvue,
            seed=self._seed_for_backward(x.device) if grad_needed else None,
        )

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
