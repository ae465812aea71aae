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

All updates are in-place tensor operations on the device (no host sync), so a CUDA-graph step
replays them: the captured kernels read the scale buffers and write row 0 at fixed addresses, and
``advance`` runs eagerly between replays. The state (history, scales, update count) is a module's
buffers and extra state: it is in the layer's ``state_dict()`` and a resumed run continues exactly. The
extra state also records the recipe, so that a checkpoint is never loaded into a layer of another recipe
(that load is refused, naming ``set_fp8_recipe``).
"""
from __future__ import annotations

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
    """

    scaling: str = "delayed"
    history_len: int = 16
    amax_compute: str = "max"
    margin: int = 0
    grad_format: str = "e4m3"

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

    def format_of(self, tensor: str) -> str:
        """"e4m3" for X and S(W); ``grad_format`` for dZ and MVUE(dZ)."""
        return "e4m3" if tensor in ("x", "w") else self.grad_format


def _index(tensor: str) -> int:
    if tensor not in TENSORS:
        raise ValueError(f"tensor must be one of {TENSORS}, got {tensor!r}")
    return TENSORS.index(tensor)


_RECIPE_FIELDS = 5  # scaling, history_len, amax_compute, margin, grad_format


def encode_recipe(recipe: FP8Recipe) -> list[int]:
    """The recipe as ints (what the scaling state's extra state stores after the update count)."""
    return [SCALINGS.index(recipe.scaling), recipe.history_len, AMAX_COMPUTE.index(recipe.amax_compute),
            recipe.margin, FP8_GRAD_FORMATS.index(recipe.grad_format)]


def decode_recipe(codes) -> FP8Recipe:
    """The inverse of ``encode_recipe``."""
    scaling, history_len, amax_compute, margin, grad_format = (int(c) for c in codes)
    return FP8Recipe(scaling=SCALINGS[scaling], history_len=history_len, amax_compute=AMAX_COMPUTE[amax_compute],
                     margin=margin, grad_format=FP8_GRAD_FORMATS[grad_format])


def saved_recipe(state_dict, prefix: str) -> FP8Recipe | None:
    """The recipe a checkpoint's scaling state under ``prefix`` was saved with (None: not there, or a
    checkpoint from before recipes were saved)."""
    extra = state_dict.get(prefix + "_extra_state")
    if isinstance(extra, torch.Tensor) and extra.shape == (1 + _RECIPE_FIELDS,):
        return decode_recipe(extra[1:].tolist())
    return None


class FP8ScalingState(nn.Module):
    """Per-layer scaling state: buffers ``amax_history`` (L, 4), ``scale`` (4,), ``inv_scale`` (4,)
    (float32, columns in ``TENSORS`` order) and the host counter ``updates`` (extra state).

    ``scales_for(tensor, x)`` gives the (scale, inv_scale) to quantize ``x`` with; ``record(tensor, amax)``
    adds an observed amax to the step's row; ``advance()`` ends the optimizer step (see the module docstring).
    """

    updates = HostCounter(0)  # how many optimizer steps advanced the history (host int: no sync to read)

    def __init__(self, recipe: FP8Recipe | None = None, device=None) -> None:
        super().__init__()
        setattr(self, COUNTER_TENSOR, new_counter_tensor(1 + _RECIPE_FIELDS))  # the extra state, updated in place
        self.recipe = recipe if recipe is not None else FP8Recipe()
        if not isinstance(self.recipe, FP8Recipe):
            raise TypeError(f"recipe must be an FP8Recipe, got {type(self.recipe).__name__}")
        n = len(TENSORS)
        self.register_buffer("amax_history", torch.zeros(self.recipe.history_len, n, device=device))
        self.register_buffer("scale", torch.ones(n, device=device))
        self.register_buffer("inv_scale", torch.ones(n, device=device))
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

        return super()._apply(same_dtype, recurse)

    # --- what a quantization uses -------------------------------------------------------------------
    @property
    def uses_history(self) -> bool:
        """True when this step's scales come from the history (delayed scaling after its first update)."""
        return self.recipe.scaling == "delayed" and self.updates > 0

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
        hist = self.amax_history
        a = hist.amax(dim=0) if self.recipe.amax_compute == "max" else hist[0].clone()
        fmax = self.fp8_max
        usable = torch.isfinite(a) & (a > 0)
        safe = torch.where(usable, a, torch.ones_like(a))
        new_scale = safe / fmax * (2.0 ** self.recipe.margin)
        self.scale.copy_(torch.where(usable, new_scale, self.scale))
        self.inv_scale.copy_(1.0 / self.scale)
        if hist.shape[0] > 1:
            hist.copy_(torch.roll(hist, -1, dims=0))
        hist[0].zero_()
        self.updates += 1

    # --- checkpoints ---------------------------------------------------------------------------------
    def get_extra_state(self) -> torch.Tensor:
        """int64 (6,): the update count, then the recipe (``encode_recipe``): a checkpoint says which recipe
        its history and scales belong to, and a load into another recipe is refused instead of mixing them.
        The same tensor every time, kept current in place (``host_counters``)."""
        state = getattr(self, COUNTER_TENSOR)
        state[1:] = torch.tensor(encode_recipe(self.recipe), dtype=torch.int64)
        return state

    def set_extra_state(self, state) -> None:
        if not isinstance(state, torch.Tensor) or state.shape not in ((1,), (1 + _RECIPE_FIELDS,)):
            raise ValueError(f"FP8ScalingState extra state must be an int64 tensor of {1 + _RECIPE_FIELDS} elements "
                             f"(the update count and the recipe; 1 element in older checkpoints), got {state!r}")
        self.updates = int(state[0])

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

    def history_of(self, tensor: str) -> torch.Tensor:
        """The amaxes of the completed steps in the window, oldest first (rows 1..L-1; row 0 is the
        step under way). Zeros where fewer steps were recorded."""
        return self.amax_history[1:, _index(tensor)].clone()

    def extra_repr(self) -> str:
        r = self.recipe
        return (f"scaling={r.scaling}, history_len={r.history_len}, amax_compute={r.amax_compute}, "
                f"margin={r.margin}, grad_format={r.grad_format}, updates={self.updates}")


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
