"""``SparsityCallback``: 2:4 training inside ``transformers.Trainer``.

    sl.sparsify(model, sl.MaskedDecay(decay=6e-5, total_steps=max_steps))
    trainer = Trainer(model=model, args=args, train_dataset=ds)
    SparsityCallback().add_to(trainer)

At the start of training it attaches the optimizer hooks (``sparsity_lab.attach_optimizer``: masked
decay after the Trainer's gradient clipping and before each step, the layers' step counters after
it) to the optimizer the Trainer built; it removes them at the end. A method whose schedule counts
steps (``total_steps``, for the dense fine-tune switch) that names another count than the Trainer's
``max_steps`` is given the Trainer's, with a warning. Before every optimizer step it reads the flip
rate of the masks that step computed, and at each logging step it adds to the Trainer's logs
    flip_rate        mean over the steps since the last log of the overall flip rate
                     r_t = sum_layers ||m_t xor m_{t-1}||_1 / sum_layers D_layer (D: the layer's weight
                     count), over the steps that computed masks
    sparse_dense_phase  1.0 once every sparse layer runs its dense fine-tune, else 0.0

Why ``add_to(trainer)`` and not ``Trainer(callbacks=[...])``: the Trainer calls its ``report_to``
integrations (TensorBoard, W&B, ...) before the callbacks passed to it, each with the log as it is then,
so fields added by a later callback reach none of them. ``add_to`` puts the callback before the
reporters. Passed in ``callbacks=[...]`` while reporters are on, it refuses to start (it would lose
the fields silently); with ``report_to="none"`` either way works.
"""
from __future__ import annotations

import math
import warnings

from transformers import TrainerCallback

from ..sparsify import flip_report
from ..training_hooks import attach_optimizer, sparse_layers


def _is_reporter(callback) -> bool:
    from transformers.integrations import integration_utils

    return isinstance(callback, tuple(integration_utils.INTEGRATION_TO_CALLBACK.values()))


class SparsityCallback(TrainerCallback):
    """Attach sparsity_lab's optimizer hooks to a Trainer's optimizer and log the flip rate."""

    def __init__(self) -> None:
        self._handle = None
        self._rates: list[float] = []
        self._before_reporters = False

    def add_to(self, trainer) -> "SparsityCallback":
        """Put this callback in ``trainer``'s list before its reporting integrations (moved there if
        it is in the list already), so every ``report_to`` backend receives its fields. Returns self."""
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
        first_reporter = next((i for i, cb in enumerate(callbacks) if _is_reporter(cb)), len(callbacks))
        callbacks.insert(first_reporter, self)
        self._before_reporters = True
        return self

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if model is None or optimizer is None:
            raise ValueError("SparsityCallback needs the Trainer's model and optimizer at on_train_begin")
        if not sparse_layers(model):
            raise ValueError("the Trainer's model has no sparse layers: call sparsity_lab.sparsify(model, method) "
                             "before building the Trainer")
        if args.report_to and not self._before_reporters:
            raise ValueError(f"SparsityCallback was passed in Trainer(callbacks=[...]) while report_to={args.report_to}: "
                             "the Trainer calls those reporters before such callbacks, so flip_rate and "
                             "sparse_dense_phase would reach none of them. Build the Trainer without it and call "
                             "SparsityCallback().add_to(trainer)")
        _match_total_steps(model, state.max_steps)
        # accelerate wraps the optimizer; its step calls the wrapped torch optimizer's step, whose hooks run
        inner = getattr(optimizer, "optimizer", optimizer)
        self._handle = attach_optimizer(model, inner)
        self._model = model
        self._rates = []

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        # after the forward passes of this step (masks computed) and before the update
        rate = flip_report(self._model, fresh_only=True)["overall"]
        if not math.isnan(rate):
            self._rates.append(rate)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs or self._handle is None:
            return  # evaluation logs and the final summary carry no flip rate
        extra = {"sparse_dense_phase": float(all(layer.dense_now for _, layer in sparse_layers(self._model)))}
        if self._rates:
            extra["flip_rate"] = sum(self._rates) / len(self._rates)
            self._rates = []
        logs.update(extra)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(extra)  # the Trainer stored a copy of logs before the callbacks ran

    def on_train_end(self, args, state, control, **kwargs):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def _match_total_steps(model, max_steps: int) -> None:
    """Give every layer whose method schedules by ``total_steps`` the Trainer's ``max_steps`` (warning
    once per differing count), and record the change in the model's recipe (``config.sparsity_lab``)."""
    changed: dict[int, list[str]] = {}
    for name, layer in sparse_layers(model):
        method = layer.method
        if method.dense_finetune_at is None or method.total_steps in (None, max_steps):
            continue
        changed.setdefault(method.total_steps, []).append(name)
        layer.method = method.with_total_steps(max_steps)
    for old, names in changed.items():
        after = model.get_submodule(names[0]).method.dense_finetune_step
        warnings.warn(f"{len(names)} sparse layers were made with total_steps={old}, but the Trainer runs "
                      f"max_steps={max_steps}: they now use total_steps={max_steps} (dense fine-tune from step "
                      f"{after}). Pass total_steps=args.max_steps to the method to silence this", UserWarning,
                      stacklevel=3)
    recipe = getattr(getattr(model, "config", None), "sparsity_lab", None)
    if changed and recipe:
        for group in recipe["groups"]:
            fields = group["fields"]
            if fields.get("dense_finetune_at") is not None and fields.get("total_steps") is not None:
                fields["total_steps"] = max_steps
