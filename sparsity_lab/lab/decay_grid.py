"""A grid of short runs that differ only in the decay factor lambda_W: what the decay slider shows.

Every run trains the same GPT from the same initial weights on the same batches with the same
schedule (one TrainConfig, one corpus); only the method's lambda_W changes. A dense run is added as
the reference: its would-be 2:4 masks give the flip rate of a healthy run (Hu et al. 2024).

    grid = run_decay_grid(base, decays=(0.0, 1e-2, 1e-1), method="srste")
    grid.runs[1e-2].flip_rate      # per step, NaN where no mask was computed
    grid.summary()                 # one row per run: final val loss, late flip rate, ...
    grid.tidy()                    # one row per (run, step): ready for pandas / plotting

lambda_W = 0 is STE itself for every method (the term vanishes). Masked-decay runs (on gradients,
``masked_decay``, or on weights, ``masked_decay_weights``) never switch to the dense fine-tune here,
so the grid shows the decay alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..methods.config import _check_decay
from .data import ByteCorpus
from .trainer import TrainConfig, Trainer, TrainingDiverged, config_corpus

DECAY_METHODS = ("srste", "masked_decay", "masked_decay_weights")
LATE_FRACTION = 0.1  # "late" = the last 10 % of the steps


@dataclass(frozen=True)
class RunCurve:
    """One run's per-step curves. steps, loss and flip_rate have one entry per optimizer step;
    val_steps and val_loss one per evaluation. NaN marks a flip rate that does not exist (step 1)."""

    label: str
    method: str
    decay: float | None  # None for the dense reference
    steps: tuple[int, ...]
    loss: tuple[float, ...]
    flip_rate: tuple[float, ...]
    val_steps: tuple[int, ...]
    val_loss: tuple[float, ...]
    status: str  # "ok" or "diverged: ..."

    @classmethod
    def from_history(cls, label: str, method: str, decay: float | None, history: list[dict],
                     status: str = "ok") -> "RunCurve":
        """From the trainer's logged rows (``Trainer.history`` or ``read_log``)."""
        def num(x):
            return math.nan if x is None else float(x)
        vals = [(r["step"], float(r["val_loss"])) for r in history if r.get("val_loss") is not None]
        return cls(label=label, method=method, decay=decay, steps=tuple(r["step"] for r in history),
                   loss=tuple(float(r["loss"]) for r in history),
                   flip_rate=tuple(num(r.get("flip_rate")) for r in history),
                   val_steps=tuple(s for s, _ in vals), val_loss=tuple(v for _, v in vals), status=status)

    def _late(self, values: tuple[float, ...]) -> float:
        tail = values[-max(1, math.ceil(LATE_FRACTION * len(values))):]
        finite = [v for v in tail if math.isfinite(v)]
        return sum(finite) / len(finite) if finite else math.nan

    @property
    def final_val_loss(self) -> float:
        return self.val_loss[-1] if self.val_loss else math.nan

    @property
    def late_flip_rate(self) -> float:
        """Mean flip rate over the last 10 % of the steps (a single step's flip rate is noisy)."""
        return self._late(self.flip_rate)

    @property
    def late_train_loss(self) -> float:
        """Mean training loss over the last 10 % of the steps."""
        return self._late(self.loss)


@dataclass(frozen=True)
class DecayGrid:
    """The runs of one grid: ``runs[decay]`` in ascending decay order and the ``dense`` reference."""

    method: str
    decays: tuple[float, ...]
    runs: dict[float, RunCurve]
    dense: RunCurve | None
    config: dict  # the shared TrainConfig, as a dict

    def curves(self) -> list[RunCurve]:
        return ([self.dense] if self.dense is not None else []) + [self.runs[d] for d in self.decays]

    def summary(self) -> list[dict]:
        """One row per run: label, method, decay, status, final val loss, late flip rate and training loss."""
        return [{"label": c.label, "method": c.method, "decay": c.decay, "status": c.status,
                 "final_val_loss": c.final_val_loss, "late_flip_rate": c.late_flip_rate,
                 "late_train_loss": c.late_train_loss} for c in self.curves()]

    def tidy(self) -> list[dict]:
        """One row per run and step: label, method, decay, step, loss, flip_rate, val_loss (NaN between
        evaluations)."""
        rows = []
        for c in self.curves():
            vals = dict(zip(c.val_steps, c.val_loss))
            rows += [{"label": c.label, "method": c.method, "decay": c.decay, "step": s, "loss": loss,
                      "flip_rate": flip, "val_loss": vals.get(s, math.nan)}
                     for s, loss, flip in zip(c.steps, c.loss, c.flip_rate)]
        return rows


# how a legend or a printed line names a method (the keys are the CLI's --method names)
METHOD_NAMES = {"ste": "STE", "srste": "SR-STE", "masked_decay": "masked decay",
                "masked_decay_weights": "masked decay on weights"}


def method_name(method: str) -> str:
    """The reader's name of ``method``: 'SR-STE' for 'srste'; a method without one keeps its key."""
    return METHOD_NAMES.get(method, method)


def decay_label(method: str, decay: float) -> str:
    """'STE (decay 0)' for 0, else e.g. 'SR-STE, lambda_W = 1e-02'."""
    return "STE (decay 0)" if decay == 0 else f"{method_name(method)}, lambda_W = {decay:.0e}"


def _train(cfg: TrainConfig, corpus: ByteCorpus) -> tuple[list[dict], str]:
    trainer = Trainer(cfg, corpus=corpus)
    status = "ok"
    try:
        trainer.run()
    except TrainingDiverged as err:  # keep the rows logged before the loss blew up
        status = f"diverged: {err}"
    finally:
        trainer.close()
    return trainer.history, status


def run_decay_grid(base: TrainConfig, decays, method: str = "srste", corpus: ByteCorpus | None = None,
                   common: dict | None = None, dense_reference: bool = True) -> DecayGrid:
    """Train one run per lambda_W in ``decays`` (and a dense reference) with ``base``'s settings.

    base: model, data, schedule, seed (its method, log and checkpoint paths are replaced).
    decays: lambda_W values >= 0 (0 = STE); sorted, duplicates removed.
    method: "srste" (term added to dW in the backward, before clipping), "masked_decay" (added to the
        gradient after clipping, before the optimizer step: AdamW normalises it) or
        "masked_decay_weights" (W -= lr * term after the step: AdamW never sees it); no dense
        fine-tune here.
    common: 2:4 options for every sparse run (e.g. {"transposable": True}).
    A run whose loss becomes NaN/inf keeps its rows up to there and status "diverged: ...".
    """
    if method not in DECAY_METHODS:
        raise ValueError(f"method must be one of {DECAY_METHODS}, got {method!r}")
    if isinstance(decays, (str, bytes)) or not hasattr(decays, "__iter__"):
        raise ValueError(f"decays must be a list of numbers >= 0, got {decays!r}")
    decays = list(decays)
    for d in decays:
        _check_decay(d)
    decays = tuple(sorted({float(d) for d in decays}))
    if not decays:
        raise ValueError("decays must hold at least one lambda_W value")
    common = dict(common or {})
    corpus = corpus if corpus is not None else config_corpus(base)
    base = replace(base, log_path=None, checkpoint_path=None, checkpoint_interval=0)
    dense = None
    if dense_reference:
        history, status = _train(replace(base, method="dense", method_options=common, track_flips=True), corpus)
        dense = RunCurve.from_history("dense reference", "dense", None, history, status)
    runs = {}
    for d in decays:
        options = {**common, "decay": d}
        if method.startswith("masked_decay"):
            options["dense_finetune_at"] = None
        history, status = _train(replace(base, method=method, method_options=options), corpus)
        runs[d] = RunCurve.from_history(decay_label(method, d), method, d, history, status)
    return DecayGrid(method=method, decays=decays, runs=runs, dense=dense, config=base.to_dict())
