"""FP8 scaling recipes for training: per-tensor scales, current or delayed (an amax history).

One layer quantizes four tensors per step, each with its own per-tensor scale (``TENSORS``):
X (forward input), S(W) (the 2:4 weight), dZ (output gradient) and MVUE(dZ) (the weight gradient's
2:4 operand: MVUE rescales the values it keeps, so its range differs from dZ's). The convention is
``sparsity_lab.fp8``'s: ``scale = amax / fp8_max`` (what ``torch._scaled_mm`` takes), ``q = fp8(x / scale)``.

Two ways to pick ``amax``:

* current scaling: amax of the tensor being quantized (two passes over it: amax, then cast);
* delayed scaling, the recipe of NVIDIA Transformer Engine's ``DelayedScaling``
  (https://nvidia.github.io/TransformerEngine/api/common.html): amax from a history of the last L
  recorded amaxes, ``max`` over the window or the ``most_recent`` one, with a ``margin``:
  ``scale = amax / fp8_max * 2**margin``. One pass (the cast records this tensor's amax).
  The history has TE's layout, shape (L, tensors): row 0 collects the amax of the step under way;
  at the update the amax is read from the window (row 0 included), the rows roll by -1 (row 0 goes
  last, the oldest is dropped) and row 0 is zeroed. An amax that is 0 or not finite keeps the
  previous scale (TE does the same). Before the first update there is no history: those steps use
  current scaling (TE starts from scale 1 instead, which would flush small gradients to zero).

When the history advances (a choice, stated here because it matters under gradient accumulation):
once per **optimizer step** (``SparseLinear.advance_step``), not per micro-step. Every micro-step of
a step quantizes with the same scales and row 0 takes the max over the micro-steps, so k micro-steps
of B/k rows each leave exactly the history (and scales) that one step over all B rows leaves; and
the weight, which changes only at the optimizer step, enters the history once per step, not k times.
TE's documentation describes the rotation after each pass instead. A forward under
``torch.no_grad()`` (evaluation) uses the scales but records nothing: the FP8 backends record the amaxes
of X and S(W) when the forward's backward runs (``fp8_train``).

Values that are not finite, one policy for both recipes and every step: an entry that is +-inf or NaN
quantizes to NaN (``references.fp8.quantize_with_inv_scale`` and the cast kernels), never to the
saturated +-fp8_max that the clamp gives finite values beyond the scale's range. An overflow upstream
thus stays visible downstream (NaN outputs, then a non-finite loss or gradient norm that stops the
step). With current scaling, and on the first step, the tensor's amax is itself not finite, its scale
too, and every product with the tensor is NaN; with delayed scaling the NaN stays in the entries the
bad values reach. Such an amax in the history keeps the previous scale (below).

Where the scales are applied (``FP8Recipe.scale_in_product``). A product of FP8 operands returns
``D = (s_a s_b) (q_a q_b)``. With "pass" (the default, correct on every engine) the scales live on the
device only; cuSPARSELt on the H100 multiplies the 2:4 product by them in a pass of its own after the
product (``kernels/scale_product.py``). With "host_alpha" (delayed scaling only) the product takes
``alpha = s_a s_b`` as a host float (cuSPARSELt's scalar alpha, applied inside the product). For that the
host must know every scale without a device sync, so the recipe changes in two ways:

* power-of-two scales: ``scale = 2**ceil(log2(amax / fp8_max)) * 2**margin`` (``pow2_scale``), so that
  ``s_a s_b`` is exact in float32, ``inv_scale = 1 / scale`` too, and a scale changes only when the
  window's amax crosses a power of two (a CUDA graph holding alpha as a constant is recaptured then, once
  the new scales have settled: ``CudaGraphStep.scale_settle_steps``, ``scale_recaptures``);
* a lag of one step: with ``D_k`` the scales that the k-th ``advance`` computes from the window that
  ends with step k-1's amaxes (steps counted from 0), step t quantizes with

      s_t = D_{t-1} = pow2_scale(max(a_{t-1-L}, ..., a_{t-2}))   for t >= 2   (L = history_len; "max")
      s_t = current scaling (the tensor's own amax, the product's scale applied by the pass)  for t < 2

  ``advance`` k keeps ``D_k`` in the buffer ``next_scale`` and copies it device->host (``non_blocking``,
  into pinned memory, an event recorded); ``advance`` k+1 reads that copy (waiting on its event, which
  follows the previous step's work: the host may queue one whole step ahead of the GPU, never waits for
  the step it has just queued, and no device-wide sync runs) as the host exponents of step k+1, and moves
  ``next_scale`` into ``scale``. The
  scale that quantizes an operand (``scale``, on the device) and the alpha the product gets
  (``host_alpha``, from ``host_exponents``) are the same power of two, exactly, so
  ``D = alpha (q(X) q(W))`` is the product of the dequantized operands. On the CPU the copy is a plain
  clone: the same arithmetic, which the CPU tests check step by step against a plain-PyTorch loop.

All updates are in-place tensor operations on the device (no host sync), so a CUDA-graph step
replays them: the captured kernels read the scale buffers and write row 0 at fixed addresses, and
``advance`` runs eagerly between replays. The state (history, scales, update count) is a module's
buffers and extra state: it is in the layer's ``state_dict()`` and a resumed run continues exactly. The
extra state also records the recipe, so that a checkpoint is never loaded into a layer of another recipe
(that load is refused, naming ``set_fp8_recipe``), and, with "host_alpha", the host exponents of the scales
in use and the buffer ``next_scale``: a resumed run continues with the same alphas (the one copy in flight
is not saved; the first ``advance`` after a load reads ``next_scale`` with one sync instead).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from ..references.fp8 import AMAX_FLOOR, amax as amax_of, fp8_format, quantize_with_inv_scale
from ..host_counters import COUNTER_TENSOR, HostCounter, new_counter_tensor

TENSORS = ("x", "w", "dz", "dz_mvue")
SCALINGS = ("delayed", "current")
AMAX_COMPUTE = ("max", "most_recent")
FP8_GRAD_FORMATS = ("e4m3", "e5m2")
SCALE_IN_PRODUCT = ("pass", "host_alpha")
NO_EXPONENT = -(2 ** 31)  # the extra state's mark for "no host scale yet"


@dataclass(frozen=True)
class FP8Recipe:
    """How a layer's FP8 operands are scaled and formatted.

    scaling: "delayed" (amax history) or "current" (each tensor's own amax).
    history_len: L, rows of the amax history (delayed scaling; TE's default is 1024, ours 16: the
        lab's runs are a few hundred steps long and the window must be able to forget a spike).
    amax_compute: "max" over the window or the "most_recent" amax.
    margin: scale = amax / fp8_max * 2**margin (headroom against growth between updates).
    grad_format: FP8 format of dZ and MVUE(dZ): "e4m3" (what cuSPARSELt multiplies) or "e5m2"
        (the hybrid recipe; the dense and reference products take it, the sparse one refuses it).
    scale_in_product: "pass" (scales on the device; the 2:4 product is scaled by a pass after it) or
        "host_alpha" (power-of-two scales read by the host one step late, given to the 2:4 product as its
        scalar alpha; delayed scaling only; see the module docstring). The default is "pass": it is the
        recipe every engine computes unchanged, while "host_alpha" changes the scales (powers of two,
        one step older) and is honoured only where cuSPARSELt applies a scalar alpha to an FP8 product
        (checked per product shape; where not, the pass runs, with a warning).
    """

    scaling: str = "delayed"
    history_len: int = 16
    amax_compute: str = "max"
    margin: int = 0
    grad_format: str = "e4m3"
    scale_in_product: str = "pass"

    def __post_init__(self) -> None:
        if self.scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {SCALINGS}, got {self.scaling!r}")
        if isinstance(self.history_len, bool) or not isinstance(self.history_len, int) or self.history_len < 1:
            raise ValueError(f"history_len must be an int >= 1, got {self.history_len!r}")
        if self.amax_compute not in AMAX_COMPUTE:
            raise ValueError(f"amax_compute must be one of {AMAX_COMPUTE}, got {self.amax_compute!r}")
        if isinstance(self.margin, bool) or not isinstance(self.margin, int) or self.margin < 0:
            raise ValueError(f"margin must be an int >= 0, got {self.margin!r}")
        fp8_format(self.grad_format)
        if self.scale_in_product not in SCALE_IN_PRODUCT:
            raise ValueError(f"scale_in_product must be one of {SCALE_IN_PRODUCT}, got {self.scale_in_product!r}")
        if self.scale_in_product == "host_alpha" and self.scaling != "delayed":
            raise ValueError("scale_in_product='host_alpha' needs scaling='delayed' (current scaling knows a scale "
                             "only on the device, after the tensor's amax): use scale_in_product='pass'")

    @property
    def lag(self) -> int:
        """Steps between the end of the window a scale comes from and the step that uses it, minus one:
        0 ("pass": the scales of step t come from the amaxes up to t-1), 1 ("host_alpha": up to t-2)."""
        return 1 if self.scale_in_product == "host_alpha" else 0

    def format_of(self, tensor: str) -> str:
        """"e4m3" for X and S(W); ``grad_format`` for dZ and MVUE(dZ)."""
        return "e4m3" if tensor in ("x", "w") else self.grad_format


def _index(tensor: str) -> int:
    if tensor not in TENSORS:
        raise ValueError(f"tensor must be one of {TENSORS}, got {tensor!r}")
    return TENSORS.index(tensor)


_RECIPE_FIELDS = 6  # scaling, history_len, amax_compute, margin, grad_format, scale_in_product
_OLD_RECIPE_FIELDS = 5  # checkpoints from before scale_in_product (always "pass")
_EXTRA = 1 + _RECIPE_FIELDS + len(TENSORS)  # update count, recipe, host exponents of the scales in use
_EXTRA_SIZES = (1, 1 + _OLD_RECIPE_FIELDS, _EXTRA)  # what older checkpoints hold, then this version


def encode_recipe(recipe: FP8Recipe) -> list[int]:
    """The recipe as ints (what the scaling state's extra state stores after the update count)."""
    return [SCALINGS.index(recipe.scaling), recipe.history_len, AMAX_COMPUTE.index(recipe.amax_compute),
            recipe.margin, FP8_GRAD_FORMATS.index(recipe.grad_format), SCALE_IN_PRODUCT.index(recipe.scale_in_product)]


def decode_recipe(codes) -> FP8Recipe:
    """The inverse of ``encode_recipe`` (5 codes: a checkpoint from before ``scale_in_product``, "pass")."""
    codes = [int(c) for c in codes]
    scaling, history_len, amax_compute, margin, grad_format = codes[:_OLD_RECIPE_FIELDS]
    in_product = SCALE_IN_PRODUCT[codes[_OLD_RECIPE_FIELDS]] if len(codes) > _OLD_RECIPE_FIELDS else "pass"
    return FP8Recipe(scaling=SCALINGS[scaling], history_len=history_len, amax_compute=AMAX_COMPUTE[amax_compute],
                     margin=margin, grad_format=FP8_GRAD_FORMATS[grad_format], scale_in_product=in_product)


def saved_recipe(state_dict, prefix: str) -> FP8Recipe | None:
    """The recipe a checkpoint's scaling state under ``prefix`` was saved with (None: not there, or a
    checkpoint from before recipes were saved)."""
    extra = state_dict.get(prefix + "_extra_state")
    if isinstance(extra, torch.Tensor) and extra.dim() == 1 and extra.shape[0] in _EXTRA_SIZES[1:]:
        return decode_recipe(extra[1:1 + min(_RECIPE_FIELDS, extra.shape[0] - 1)].tolist())
    return None


def pow2_scale(a: torch.Tensor, fp8_max: torch.Tensor, margin: int) -> torch.Tensor:
    """2**ceil(log2(a / fp8_max)) * 2**margin, elementwise, exactly (``frexp``: a / fp8_max = m 2**e with
    m in [0.5, 1); the power of two at or above it is 2**(e-1) when m == 0.5, else 2**e). ``a`` > 0, finite."""
    mantissa, exponent = torch.frexp(a / fp8_max)
    exponent = exponent - (mantissa == 0.5).to(exponent.dtype) + margin
    return torch.ldexp(torch.ones_like(a), exponent)


def exponent_of(scale: float) -> int:
    """e with scale == 2**e (a power-of-two scale, float32 normal); ValueError otherwise."""
    mantissa, exponent = math.frexp(scale)
    if mantissa != 0.5:
        raise ValueError(f"scale {scale!r} is not a power of two (host_alpha scales must be)")
    return exponent - 1


def _one_launch(history: torch.Tensor) -> bool:
    """Where ``advance`` runs kernel 25 (one launch) instead of its PyTorch operations: CUDA tensors (tests
    widen it to the CPU interpreter)."""
    return history.is_cuda


class FP8ScalingState(nn.Module):
    """Per-layer scaling state: buffers ``amax_history`` (L, 4), ``scale`` (4,), ``inv_scale`` (4,)
    (float32, columns in ``TENSORS`` order) and the host counter ``updates`` (extra state); with
    ``scale_in_product="host_alpha"`` also the buffer ``next_scale`` (4,) and the host exponents of ``scale``
    (``host_exponents``, in the extra state).

    ``scales_for(tensor, x)`` gives the (scale, inv_scale) to quantize ``x`` with; ``record(tensor, amax)``
    adds an observed amax to the step's row; ``advance()`` ends the optimizer step (see the module docstring);
    ``host_alpha(a, b)`` is s_a s_b as a host float where the recipe holds the scales on the host.
    """

    updates = HostCounter(0)  # how many optimizer steps advanced the history (host int: no sync to read)

    def __init__(self, recipe: FP8Recipe | None = None, device=None) -> None:
        super().__init__()
        setattr(self, COUNTER_TENSOR, new_counter_tensor(_EXTRA))  # the extra state, updated in place
        self.recipe = recipe if recipe is not None else FP8Recipe()
        if not isinstance(self.recipe, FP8Recipe):
            raise TypeError(f"recipe must be an FP8Recipe, got {type(self.recipe).__name__}")
        n = len(TENSORS)
        self.register_buffer("amax_history", torch.zeros(self.recipe.history_len, n, device=device))
        self.register_buffer("scale", torch.ones(n, device=device))
        self.register_buffer("inv_scale", torch.ones(n, device=device))
        if self.recipe.lag:  # D_k, the scales the host reads one step later (module docstring)
            self.register_buffer("next_scale", torch.ones(n, device=device))
        self._host_exponents: tuple[int, ...] | None = None
        self._pending = None  # (host copy of next_scale, its CUDA event or None) sent by the latest advance
        self._pinned: torch.Tensor | None = None
        self._set_host_exponents(None)
        # each column's largest FP8 value (a buffer, so that it sits on the state's device: no copy per update)
        self.register_buffer("fp8_max", torch.tensor([fp8_format(self.recipe.format_of(t))[1] for t in TENSORS],
                                                     device=device), persistent=False)
        self.updates = 0

    def _apply(self, fn, recurse=True):
        # follow .to(device) but stay float32 under model.to(torch.bfloat16): scales and amaxes rounded
        # to bfloat16 would move every quantization grid
        def same_dtype(t):
            moved = fn(t)
            return moved if moved.dtype == t.dtype else t.to(device=moved.device)

        self._pending, self._pinned = None, None  # a copy from the old device: read next_scale again instead
        return super()._apply(same_dtype, recurse)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_pending"] = state["_pinned"] = None  # a copy in flight (and its event) is transport, not state
        return state

    # --- what a quantization uses -------------------------------------------------------------------
    @property
    def uses_history(self) -> bool:
        """True when this step's scales come from the history (delayed scaling after its first update;
        after the second with "host_alpha", whose scales are one step older)."""
        return self.recipe.scaling == "delayed" and self.updates > self.recipe.lag

    @property
    def host_exponents(self) -> tuple[int, ...] | None:
        """(e_x, e_w, e_dz, e_g) with ``scale == 2**e`` on the host, while this step's scales come from the
        history under "host_alpha"; else None (the scales are on the device only)."""
        return self._host_exponents if self.uses_history else None

    def host_exponent(self, tensor: str) -> int | None:
        """The host exponent of ``tensor``'s scale in use now (None: the scale is on the device only)."""
        exps = self.host_exponents
        return None if exps is None else exps[_index(tensor)]

    def host_alpha(self, a: str, b: str) -> float | None:
        """s_a s_b as a host float (exact: a power of two), or None where the scales are on the device only."""
        exps = self.host_exponents
        return None if exps is None else math.ldexp(1.0, exps[_index(a)] + exps[_index(b)])

    def scales_for(self, tensor: str, x: torch.Tensor, observed_amax: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(scale, inv_scale, amax) for quantizing ``x`` as ``tensor``: the history's scales (delayed),
        else the scales of x's own amax (``observed_amax`` if the caller has it). ``amax`` is x's amax
        when it was computed here (current scaling), else None (the cast kernel returns it)."""
        i = _index(tensor)
        if self.uses_history:
            return self.scale[i], self.inv_scale[i], None
        a = amax_of(x) if observed_amax is None else observed_amax.float()
        fmax = fp8_format(self.recipe.format_of(tensor))[1]
        a = a.clamp_min(AMAX_FLOOR)
        return a / fmax, fmax / a, a

    def record(self, tensor: str, amax: torch.Tensor) -> None:
        """Row 0 (this optimizer step) <- max(row 0, amax), in place on the device."""
        i = _index(tensor)
        slot = self.amax_history[0, i:i + 1]
        torch.maximum(slot, amax.detach().float().reshape(1).to(slot.device), out=slot)

    # --- the optimizer step -------------------------------------------------------------------------
    @torch.no_grad()
    def advance(self) -> None:
        """End of an optimizer step: new scales from the history, then roll it (TE's update)."""
        if self.recipe.lag and self.updates >= 1:  # host_alpha: the scales the previous advance sent
            self._receive_next_scale()
        if _one_launch(self.amax_history):  # kernel 25: the same update in one launch, not two dozen
            from sparsity_lab.kernels import fp8_scale_update_
            fp8_scale_update_(self.amax_history, self.fp8_max, self.scale, self.inv_scale,
                              self.next_scale if self.recipe.lag else None,
                              most_recent=self.recipe.amax_compute == "most_recent", margin=self.recipe.margin)
        else:
            self._advance_ops()
        if self.recipe.lag:
            self._send_next_scale()
        self.updates += 1

    def _advance_ops(self) -> None:
        """``advance``'s device work in PyTorch operations: the reference kernel 25 is tested against."""
        hist = self.amax_history
        a = hist.amax(dim=0) if self.recipe.amax_compute == "max" else hist[0].clone()
        fmax = self.fp8_max
        usable = torch.isfinite(a) & (a > 0)
        safe = torch.where(usable, a, torch.ones_like(a))
        if self.recipe.lag:  # host_alpha: the step to come uses D_k-1 (next_scale), the host has read it
            self.scale.copy_(self.next_scale)
            self.inv_scale.copy_(1.0 / self.scale)  # exact: a power of two
            new_scale = pow2_scale(safe, fmax, self.recipe.margin)
            self.next_scale.copy_(torch.where(usable, new_scale, self.next_scale))
        else:
            new_scale = safe / fmax * (2.0 ** self.recipe.margin)
            self.scale.copy_(torch.where(usable, new_scale, self.scale))
            self.inv_scale.copy_(1.0 / self.scale)
        if hist.shape[0] > 1:
            hist.copy_(torch.roll(hist, -1, dims=0))
        hist[0].zero_()

    # --- the host copy of the scales (host_alpha) -------------------------------------------------------
    def _send_next_scale(self) -> None:
        """Start the device->host copy of next_scale (pinned memory, non_blocking, an event after it)."""
        if self.next_scale.is_cuda:
            if self._pinned is None:
                self._pinned = torch.empty(self.next_scale.shape, dtype=torch.float32, pin_memory=True)
            self._pinned.copy_(self.next_scale, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._pending = (self._pinned, event)
        else:  # the CPU: the same values, copied at once
            self._pending = (self.next_scale.clone(), None)

    def _receive_next_scale(self) -> None:
        """Host exponents <- the copy the previous advance sent (its event waited on: the previous step's work), or
        next_scale read now (one sync) when that copy is gone (a load, a move, a deep copy)."""
        if self._pending is None:
            values = self.next_scale.tolist()
        else:
            host, event = self._pending
            if event is not None:
                event.synchronize()
            values = host.tolist()
        self._pending = None
        self._set_host_exponents(tuple(exponent_of(v) for v in values))

    def _set_host_exponents(self, exps: tuple[int, ...] | None) -> None:
        self._host_exponents = exps
        slots = getattr(self, COUNTER_TENSOR)[1 + _RECIPE_FIELDS:]
        slots.copy_(torch.tensor(exps if exps is not None else [NO_EXPONENT] * len(TENSORS), dtype=torch.int64))

    # --- checkpoints ---------------------------------------------------------------------------------
    def get_extra_state(self) -> torch.Tensor:
        """int64 (11,): the update count, the recipe (``encode_recipe``: a checkpoint says which recipe its
        history and scales belong to, and a load into another recipe is refused instead of mixing them),
        then the host exponents of the scales in use (``NO_EXPONENT`` where there are none).
        The same tensor every time, kept current in place (``host_counters``)."""
        state = getattr(self, COUNTER_TENSOR)
        state[1:1 + _RECIPE_FIELDS] = torch.tensor(encode_recipe(self.recipe), dtype=torch.int64)
        return state

    def set_extra_state(self, state) -> None:
        if not isinstance(state, torch.Tensor) or state.dim() != 1 or state.shape[0] not in _EXTRA_SIZES:
            raise ValueError(f"FP8ScalingState extra state must be an int64 tensor of {_EXTRA} elements (the update "
                             f"count, the recipe, the host exponents; {_EXTRA_SIZES[:2]} elements in older "
                             f"checkpoints), got {state!r}")
        self.updates = int(state[0])
        exps = state[1 + _RECIPE_FIELDS:].tolist() if state.shape[0] == _EXTRA else []
        self._pending = None
        self._set_host_exponents(tuple(exps) if exps and NO_EXPONENT not in exps else None)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        # a checkpoint saved by a backend without scaling state (e.g. "cusparselt", "torch") loaded into an
        # FP8 layer: none of this state's keys are there. The state starts fresh (current scaling for the
        # first step, then the history), said in a warning, instead of failing the whole load.
        own = [prefix + name for name in ("amax_history", "scale", "inv_scale", "_extra_state")]
        if not any(k in state_dict for k in own):
            warnings.warn(f"{prefix}*: the checkpoint holds no FP8 scaling state (saved by a backend without one?); "
                          f"this layer's scales and amax history start fresh ({self.extra_repr()})",
                          UserWarning, stacklevel=4)
            return
        saved = saved_recipe(state_dict, prefix)
        if saved is not None and saved != self.recipe:
            error_msgs.append(f"{prefix}*: the checkpoint's FP8 scales and amax history belong to {saved}, this layer "
                              f"runs {self.recipe}: give the model that recipe before loading "
                              f"(sparsity_lab.backends.cusparselt.fp8_train.set_fp8_recipe(model, {saved}))")
            return
        if prefix + "amax_history" in state_dict:
            history = state_dict[prefix + "amax_history"]
            if history.shape != self.amax_history.shape:
                error_msgs.append(f"{prefix}amax_history: the checkpoint's history has shape {tuple(history.shape)}, "
                                  f"this layer's recipe {tuple(self.amax_history.shape)} (history_len, tensors): load "
                                  f"it into a layer with FP8Recipe(history_len={history.shape[0]}) (set_fp8_recipe)")
                return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        exps = self.host_exponents
        if exps is None and self.uses_history and self.recipe.lag:
            error_msgs.append(f"{prefix}_extra_state: the checkpoint holds no host exponents for the scales in use "
                              f"after {self.updates} updates of {self.recipe}")
        elif exps is not None and [math.ldexp(1.0, e) for e in exps] != self.scale.tolist():  # one sync, at load
            error_msgs.append(f"{prefix}_extra_state: the host exponents {list(exps)} are not those of the "
                              f"checkpoint's scales {self.scale.tolist()}")

    def history_of(self, tensor: str) -> torch.Tensor:
        """The amaxes of the completed steps in the window, oldest first (rows 1..L-1; row 0 is the
        step under way). Zeros where fewer steps were recorded."""
        return self.amax_history[1:, _index(tensor)].clone()

    def extra_repr(self) -> str:
        r = self.recipe
        return (f"scaling={r.scaling}, history_len={r.history_len}, amax_compute={r.amax_compute}, "
                f"margin={r.margin}, grad_format={r.grad_format}, scale_in_product={r.scale_in_product}, "
                f"updates={self.updates}")


def quantize_reference(state: FP8ScalingState, tensor: str, x: torch.Tensor, record: bool = True
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) of ``x`` as ``tensor`` under ``state``'s recipe, in plain PyTorch; records x's amax
    unless ``record`` is False.

    The GPU backends do the same with the Triton cast kernel (``kernels/fp8_cast.py``, bit for bit
    equal); this is the reference they are tested against."""
    scale, inv_scale, a = state.scales_for(tensor, x)
    q = quantize_with_inv_scale(x, inv_scale, state.recipe.format_of(tensor))
    if record:
        state.record(tensor, a if a is not None else amax_of(x))
    return q, scale
