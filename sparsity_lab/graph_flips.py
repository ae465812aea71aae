"""What a layer keeps on the device in a CUDA-graph step: the flip counts of a mask refresh captured in the
graph, held there until someone reads them, and the MVUE seed its captured backward reads (``DeviceSeed``).

A layer whose mask is refreshed inside a captured step (``CudaGraphStep``) counts its flips there:

    counts[0] = r_t                 flips of the latest in-graph refresh, r_t = ||m_t XOR m_{t-1}||_1
    counts[1] = sum_t r_t           flips summed over every in-graph refresh since this object was made

Every replay overwrites ``counts[0]`` and adds to ``counts[1]``: no host launch per step. The host marks
each replay (``replayed``); a reader takes what the replays since the last look added (``take``: two
0-d device tensors, snapshots made in stream order, so the next replay cannot change them), and the layer
folds them into its pending counts exactly as an eager refresh would (``flip_counts.FlipCounts.take_source``).
``taken`` (on the device) is how much of ``counts[1]`` was already handed over.
"""
from __future__ import annotations

import torch


class GraphFlipCounts:
    """The device-side flip counts of one layer's in-graph mask refresh (see the module docstring)."""

    def __init__(self, device: torch.device | str) -> None:
        self.counts = torch.zeros(2, dtype=torch.int64, device=device)
        self.taken = torch.zeros((), dtype=torch.int64, device=device)
        self.unread = False  # a replay refreshed the mask since the last take()

    @property
    def device(self) -> torch.device:
        return self.counts.device

    def record(self, flips: torch.Tensor) -> None:
        """Inside the captured step: ``flips`` (0-d int64, this refresh's count) becomes the latest and
        joins the running sum. Device work only (captured once, replayed every step)."""
        self.counts[0].copy_(flips)
        self.counts[1].add_(flips)

    def replayed(self) -> None:
        """The host's note after a replay that ran ``record``: there is something to take."""
        self.unread = True

    def take(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(flips of the latest in-graph refresh, flips summed over the in-graph refreshes since the
        previous take) as new 0-d device tensors, or None when no replay ran since. No host sync."""
        if not self.unread:
            return None
        latest = self.counts[0].clone()
        since = self.counts[1] - self.taken
        self.taken.copy_(self.counts[1])
        self.unread = False
        return latest, since

    def discard(self) -> None:
        """Forget what the replays counted so far (a loaded checkpoint replaces the layer's counters)."""
        self.taken.copy_(self.counts[1])
        self.unread = False


class DeviceSeed:
    """The MVUE seed of a layer's captured backward: ``tensor`` (0-d int64 on the device); ``uses``: the
    forward calls that took it since it was made (one per captured step)."""

    def __init__(self, device: torch.device) -> None:
        self.tensor = torch.zeros((), dtype=torch.int64, device=device)
        self.uses = 0

    def take(self) -> torch.Tensor:
        """What the layer's backward draws from (``SparseLinear.call_plan``)."""
        self.uses += 1
        return self.tensor
