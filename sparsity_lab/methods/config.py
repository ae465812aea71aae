"""Training methods as small, frozen config objects.

A method says *what* a 2:4 layer does; the backend (``backend="torch"`` and later ones) says *how*
the products run. ``sparsify(model, method)`` hands one method to every converted layer. A config is
data: what it does in the layer is the handler registered for its type (``handlers.py``).

Common fields
    n, m                   the N:M pattern (2:4 runs on sparse tensor cores).
    transposable           one mask that is N:M along ``in`` (forward) and along ``out`` (input
                           gradient); otherwise a row-wise mask along ``in``.
    mask_refresh_interval  optimizer steps between mask computations (1 = every step). Values
                           are refreshed every step from the current dense weight.
    mvue                   weight gradient dW = MVUE(dZ^T) X, groups of 4 along the tokens.
    total_steps            planned optimizer steps (needed for the dense fine-tune switch).
    dense_finetune_at      fraction of total_steps after which the layer runs dense W (None: never).
    backend                "torch" (reference, CPU and GPU); later issues add faster ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from numbers import Real
from typing import ClassVar

from ..validation import check_nm


def _check_decay(decay: object) -> None:
    """lambda_W: a finite real number >= 0."""
    if isinstance(decay, bool) or not isinstance(decay, Real) or not math.isfinite(decay) or decay < 0:
        raise ValueError(f"decay must be a finite number >= 0, got {decay!r}")


@dataclass(frozen=True)
class SparsityMethod:
    n: int = 2
    m: int = 4
    transposable: bool = False
    mask_refresh_interval: int = 1
    mvue: bool = False
    total_steps: int | None = None
    dense_finetune_at: float | None = None
    backend: str = "torch"

    name: ClassVar[str] = "base"
    sparse_forward: ClassVar[bool] = True  # False for Dense: output uses the dense W
    soft_threshold: ClassVar[bool] = False  # S-STE: beta * S(W) instead of m * W

    def __post_init__(self) -> None:
        check_nm(self.n, self.m)
        for flag in ("transposable", "mvue"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if isinstance(self.mask_refresh_interval, bool) or not isinstance(self.mask_refresh_interval, int) \
                or self.mask_refresh_interval < 1:
            raise ValueError(f"mask_refresh_interval must be an int >= 1, got {self.mask_refresh_interval!r}")
        if self.total_steps is not None and (isinstance(self.total_steps, bool) or not isinstance(self.total_steps, int)
                                             or self.total_steps < 1):
            raise ValueError(f"total_steps must be a positive int or None, got {self.total_steps!r}")
        if self.dense_finetune_at is not None:
            if not isinstance(self.dense_finetune_at, Real) or not 0.0 < float(self.dense_finetune_at) <= 1.0:
                raise ValueError(f"dense_finetune_at must be in (0, 1] or None, got {self.dense_finetune_at!r}")
            if self.total_steps is None:
                raise ValueError(
                    f"{type(self).__name__}: dense_finetune_at={self.dense_finetune_at:.4g} needs total_steps "
                    "(the planned number of optimizer steps); pass total_steps=... or dense_finetune_at=None"
                )
        if self.mvue and self.m != 4:
            raise ValueError("mvue=True implements MVUE 2:4 (groups of 4 along the tokens); set m=4")


    # --- behaviour derived from the config -------------------------------------------------
    @property
    def decay_in_backward(self) -> float:
        """SR-STE's lambda_W, added to dW inside the backward pass (before clipping)."""
        return 0.0

    @property
    def decay_before_step(self) -> float:
        """Masked decay's lambda_W, added to dW after unscale/clipping, before the optimizer step
        (the optimizer reads it: AdamW puts it through its moments and normalisation)."""
        return 0.0

    @property
    def decay_after_step(self) -> float:
        """The decoupled variant's lambda_W: W -= lr * lambda_W * (1 - m) * W after the optimizer
        step (the optimizer never sees it)."""
        return 0.0

    @property
    def dense_finetune_step(self) -> int | None:
        """First optimizer step (0-based) that runs dense, or None."""
        if self.dense_finetune_at is None or self.total_steps is None:
            return None
        return int(round(self.dense_finetune_at * self.total_steps))

    def with_total_steps(self, total_steps: int) -> "SparsityMethod":
        return replace(self, total_steps=total_steps)

    def describe(self) -> str:
        parts = [f"{self.name} {self.n}:{self.m}", "transposable" if self.transposable else "row-wise"]
        if self.mask_refresh_interval != 1:
            parts.append(f"mask every {self.mask_refresh_interval} steps")
        if self.mvue:
            parts.append("MVUE dW")
        if self.decay_in_backward:
            parts.append(f"decay {self.decay_in_backward:g} in backward")
        if self.decay_before_step:
            parts.append(f"decay {self.decay_before_step:g} on gradients")
        if self.decay_after_step:
            parts.append(f"decay {self.decay_after_step:g} on weights")
        if self.dense_finetune_step is not None:
            parts.append(f"dense from step {self.dense_finetune_step}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Dense(SparsityMethod):
    """Plain dense training. The would-be N:M mask is still computed at the refresh interval so that
    the dense run gives the reference flip-rate curve (``track_flips=False`` turns that off)."""

    track_flips: bool = True
    name: ClassVar[str] = "dense"
    sparse_forward: ClassVar[bool] = False


@dataclass(frozen=True)
class STE(SparsityMethod):
    """Straight-through estimator: forward m(W) * W, the gradient reaches the dense W unchanged."""

    name: ClassVar[str] = "ste"


@dataclass(frozen=True)
class SRSTE(SparsityMethod):
    """SR-STE (Zhou et al. 2021, https://arxiv.org/abs/2102.04010): dW += decay * (1 - m) * W inside
    the backward pass. The paper's update is SGD, W <- W - lr * (dW + decay * (1 - m) * W), where
    adding the term to the gradient and to the weights are the same thing; under AdamW they are not
    (see MaskedDecay and MaskedDecayOnWeights). Here the term is part of dW, so gradient clipping
    scales it and AdamW normalises it."""

    decay: float = 2e-4
    name: ClassVar[str] = "srste"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_decay(self.decay)

    @property
    def decay_in_backward(self) -> float:
        return float(self.decay)


@dataclass(frozen=True)
class MaskedDecay(SparsityMethod):
    """Masked decay on gradients (Hu et al. 2024, https://arxiv.org/abs/2404.01847):
    g <- g + decay * (1 - m) * W after unscaling and gradient clipping, right before the optimizer
    step (``attach_optimizer`` places it there), so the term goes through AdamW's moments and is
    divided by their running RMS; and a dense fine-tune for the last 1/6 of training. Reference
    decays: GPT-2 124M 6e-5, 350M 2e-4. The paper contrasts it with the same term applied on the
    weights, decoupled from the optimizer: that is ``MaskedDecayOnWeights``."""

    decay: float = 6e-5
    dense_finetune_at: float | None = 5 / 6
    name: ClassVar[str] = "masked_decay"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_decay(self.decay)

    @property
    def decay_before_step(self) -> float:
        return float(self.decay)


@dataclass(frozen=True)
class MaskedDecayOnWeights(SparsityMethod):
    """Masked decay on the weights, decoupled from the optimizer: after every optimizer step
    W <- W - lr * decay * (1 - m) * W, with lr read from the weight's param group; AdamW never sees
    the term. This is how SR-STE's SGD update (Zhou et al. 2021) acts when it is carried over to
    AdamW the way AdamW carries over weight decay, and it is what Hu et al. 2024
    (https://arxiv.org/abs/2404.01847) compare masked decay on gradients with. Per step a pruned
    weight shrinks by the factor 1 - lr * decay, so at the same decay it is far weaker than the
    on-gradients term, which AdamW normalises to a step of about lr. Same dense fine-tune schedule
    as MaskedDecay. A step the GradScaler skips (inf/NaN gradients) applies no decay."""

    decay: float = 6e-5
    dense_finetune_at: float | None = 5 / 6
    name: ClassVar[str] = "masked_decay_weights"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_decay(self.decay)

    @property
    def decay_after_step(self) -> float:
        return float(self.decay)


@dataclass(frozen=True)
class SSTE(SparsityMethod):
    """S-STE (Hu, Zhu, Chen 2024): forward beta * S(W) with the continuous soft threshold S and a
    per-tensor beta computed once at conversion and frozen; identity gradient; no decay, no dense
    fine-tune. ``mvue=True`` adds the MVUE weight gradient of the paper's recipe."""

    name: ClassVar[str] = "sste"
    soft_threshold: ClassVar[bool] = True


METHODS: dict[str, type[SparsityMethod]] = {
    cls.name: cls for cls in (Dense, STE, SRSTE, MaskedDecay, MaskedDecayOnWeights, SSTE)
}


def method_from_name(name: str, **kwargs) -> SparsityMethod:
    """Build a method from its name ("dense", "ste", "srste", "masked_decay", "masked_decay_weights",
    "sste"); case, "-" and
    "_" are ignored, so the papers' spellings ("SR-STE", "S-STE", "MaskedDecay") work too."""
    def canonical(text: str) -> str:
        return text.lower().replace("-", "").replace("_", "")

    by_key = {canonical(key): cls for key, cls in METHODS.items()}
    by_key.update({canonical(cls.__name__): cls for cls in METHODS.values()})  # "MaskedDecayOnWeights"
    if not isinstance(name, str) or canonical(name) not in by_key:
        raise ValueError(f"unknown method {name!r}; choose one of {sorted(METHODS)}")
    return by_key[canonical(name)](**kwargs)
