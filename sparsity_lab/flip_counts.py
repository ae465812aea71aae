"""A layer's mask flip counts, kept on the device until someone reads them.

Each mask refresh counts its flips r_t = ||m_t XOR m_{t-1}||_1 as a 0-d device tensor (``add``): reading it
on the host would sync the training step and stall the queue of cuSPARSELt calls. The counts are settled
(one host sync) when ``last`` or ``total`` is read. A CUDA-graph step that refreshes masks inside its graph
counts there (``graph_flips.GraphFlipCounts``) and attaches that as ``source``: its replays' counts join
the pending ones first, as if each had been an eager refresh.
"""
from __future__ import annotations

import torch

MIRROR_AT = (3, 4)  # where last and total sit in a layer's counter tensor (layers._COUNTERS order)

class FlipCounts:
    """``last``: flips of the latest mask computation (0 before the second one); ``total``: flips summed
    over every mask computation. Both host ints once settled; pending counts are device tensors."""

    def __init__(self, mirror: torch.Tensor | None = None) -> None:
        # mirror: the layer's counter tensor (host_counters); last and total are written at MIRROR_AT
        self.mirror = mirror
        self._last = self._total = 0
        self._pending_sum: torch.Tensor | None = None
        self._pending_last: torch.Tensor | None = None
        self.source = None  # a GraphFlipCounts while a CUDA graph refreshes the mask (graph_layer.py)

    def add(self, flips: torch.Tensor) -> None:
        """One eager refresh's count (0-d device tensor); in-graph refreshes before it come first."""
        self.take_source()
        self._pending(flips, flips)

    def take_source(self) -> None:
        """Fold what the source's replays counted since the last look into the pending counts."""
        taken = self.source.take() if self.source is not None else None
        if taken is not None:
            self._pending(*taken)

    def _pending(self, latest: torch.Tensor, since: torch.Tensor) -> None:
        self._pending_last = latest
        self._pending_sum = since if self._pending_sum is None else self._pending_sum + since

    def settle(self) -> None:
        """Read the pending device counts into the host ints (one host sync, none when nothing is pending)."""
        self.take_source()
        if self._pending_sum is not None:
            total, last = torch.stack((self._pending_sum, self._pending_last)).tolist()
            self._pending_sum = self._pending_last = None
            self._set(int(last), self._total + int(total))

    @property
    def last(self) -> int:
        self.settle()
        return self._last

    @property
    def total(self) -> int:
        self.settle()
        return self._total

    def load(self, last: int, total: int) -> None:
        """Counts from a checkpoint: they replace everything pending, the source's unread replays included."""
        self._pending_sum = self._pending_last = None
        if self.source is not None:
            self.source.discard()
        self._set(int(last), int(total))

    def _set(self, last: int, total: int) -> None:
        self._last, self._total = last, total
        if self.mirror is not None:  # in place: a state dict taken earlier sees the current counts
            self.mirror[MIRROR_AT[0]], self.mirror[MIRROR_AT[1]] = last, total
