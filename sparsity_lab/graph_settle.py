"""When a CUDA graph that holds host constants is captured again: after the new constants have settled.

A captured graph holds each host value a product takes (an FP8 2:4 product's ``alpha = s_a s_b`` with
``FP8Recipe(scale_in_product="host_alpha")``) as a constant, so a step whose constants moved cannot replay
it. In the recorded lab GPT step with every block linear FP8 2:4 (docs/measuring.md, the replayed FP8 row of
``results/step_profile_h200_cusparselt_fp8_row_major_dw.json``) a capture cost about one more eager step,
while an eager step ran only a little slower than a replay, and early in the run the power-of-two scales moved
every few steps (7 captures in 11 steps). So a graph step waits: it steps eagerly until the new constants have held for
``settle`` steps in a row, then captures them. Constants that come back to the ones the graph holds replay
it at once.

``settle=0`` captures at the first step with new constants (no waiting).
"""
from __future__ import annotations

from typing import Hashable

REPLAY, EAGER, CAPTURE = "replay", "eager", "capture"


class SettledConstants:
    """``decide(held, now)``: what a step does whose graph holds the constants ``held`` when the backends
    ask for ``now``: REPLAY (the same), EAGER (new ones that have not yet held for ``settle`` earlier steps
    in a row) or CAPTURE (new ones that have). ``waited`` counts the EAGER answers (a diagnostic)."""

    def __init__(self, settle: int) -> None:
        if isinstance(settle, bool) or not isinstance(settle, int) or settle < 0:
            raise ValueError(f"scale_settle_steps must be an int >= 0, got {settle!r}")
        self.settle = settle
        self.waited = 0
        self._pending: Hashable | None = None  # the new constants seen last, and for how many steps in a row
        self._seen = 0

    def decide(self, held: Hashable, now: Hashable) -> str:
        if now == held:
            self._pending, self._seen = None, 0
            return REPLAY
        if now != self._pending:
            self._pending, self._seen = now, 0
        if self._seen >= self.settle:
            self._pending, self._seen = None, 0
            return CAPTURE
        self._seen += 1
        self.waited += 1
        return EAGER
