"""Integer counters kept on the host and, in place, in one int64 tensor that ``state_dict`` returns.

A layer's counters (optimizer steps, mask computations, MVUE draws, ...) drive its schedule, so they are
host ints: reading them costs no device sync. Checkpointers may take the state dict once and save that
same dict again and again (torchtitan's did), or load into its tensors in place (DCP does): a counter
tensor built afresh by each ``get_extra_state`` would be saved as it was when the dict was taken. So
every write to a counter also writes its element of one CPU tensor, created with the module and never
replaced, and ``get_extra_state`` returns that tensor itself.

    class Layer(nn.Module):
        step = HostCounter(0)
        calls = HostCounter(1)

        def __init__(self):
            super().__init__()
            self._counter_tensor = new_counter_tensor(2)
"""
from __future__ import annotations

import torch

COUNTER_TENSOR = "_counter_tensor"


def new_counter_tensor(n: int) -> torch.Tensor:
    """(n,) int64 zeros on the CPU (also inside a ``torch.device("meta")`` block: the counters are data)."""
    return torch.zeros(n, dtype=torch.int64, device="cpu")


class HostCounter:
    """A host int attribute whose every assignment is mirrored into ``obj._counter_tensor[index]``."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __set_name__(self, owner, name: str) -> None:
        self.slot = f"_{name}_count"

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return obj.__dict__[self.slot]

    def __set__(self, obj, value) -> None:
        value = int(value)
        obj.__dict__[self.slot] = value
        obj.__dict__[COUNTER_TENSOR][self.index] = value
