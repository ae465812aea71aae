"""``SparsityCallback``: 2:4 training inside ``transformers.Trainer`` in one line.

    sl.sparsify(model, sl.MaskedDecay(decay=6e-5, total_steps=max_steps))
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[SparsityCallback()])

At the start of training it attaches the optimizer hooks (``sparsity_lab.attach_optimizer``: masked
decay after the Trainer's gradient clipping and before each step, the layers' step counters after
it) to the optimizer the Trainer built; it removes them at the end. Before every optimizer step it
reads the flip rate of the masks that step computed, and at each logging step it adds to the
Trainer's logs
    flip_rate        mean over the steps since the last log of the overall flip rate
                     r_t = sum_layers ||m_t xor m_{t-1}||_1 / sum_layers D_layer (D: the layer's weight
                     count), over the steps that computed masks
    sparse_dense_phase  1.0 once every sparse layer runs its dense fine-tune, else 0.0
Reporters that come before this callback in the Trainer's list (``report_to`` integrations) were
already called with that log; ``trainer.state.log_history`` and later callbacks (the progress
printer) carry the values.
"""
from __future__ import annotations

import math

from transformers import TrainerCallback

from ..sparsify import flip_report
from ..training_hooks import attach_optimizer, sparse_layers


class SparsityCallback(TrainerCallback):
    """Attach sparsity_lab's optimizer hooks to a Trainer's optimizer and log the flip rate."""

    def __init__(self) -> None:
        self._handle = None
        self._rates: list[float] = []

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if model is None or optimizer is None:
            raise ValueError("SparsityCallback needs the Trainer's model and optimizer at on_train_begin")
        if not sparse_layers(model):
            raise ValueError("the Trainer's model has no sparse layers: call sparsity_lab.sparsify(model, method) "
                             "before building the Trainer")
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
