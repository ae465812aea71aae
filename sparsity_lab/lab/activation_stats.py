"""How sparse squared-ReLU activations are on their own, per layer, during training.

For A = relu(H)^2 along the FFN's hidden dimension (groups of 4 consecutive units):
    zero_fraction       fraction of exact zeros of A          = mean(H <= 0)
    at_most_2_fraction  fraction of groups with <= 2 non-zeros (2:4 pruning removes nothing there)
Haziza et al. 2025 (https://arxiv.org/abs/2503.16672) report such figures per layer to argue that the
2:4 prune of a squared-ReLU activation costs little. Measured from H = fc(x), the up projection's
output (A != 0 exactly where H > 0), so the same hook serves the plain and the 2:4 FFN.

    tracker = ActivationSparsityTracker(model)   # hooks every block's mlp.fc
    tracker.armed = True                         # measure the next forward passes (training mode)
    loss.backward(); tracker.read()              # {"blocks.0.mlp": {"zero_fraction": .., ...}, ...}
"""
from __future__ import annotations

import torch
from torch import nn

GROUP = 4


def relu2_sparsity(h: torch.Tensor) -> torch.Tensor:
    """(zero_fraction, at_most_2_fraction) of relu(h)^2 along h's last dimension, as a float32
    tensor of 2 on h's device (no host sync)."""
    if h.shape[-1] % GROUP:
        raise ValueError(f"h must have a last dimension divisible by {GROUP}, got shape {tuple(h.shape)}")
    nz = (h.detach() > 0).reshape(-1, GROUP)
    zero = 1.0 - nz.float().mean()
    at_most_2 = (nz.sum(-1) <= 2).float().mean()
    return torch.stack([zero, at_most_2])


class ActivationSparsityTracker:
    """Forward hooks on the ``mlp.fc`` linears of a squared-ReLU model; averages while ``armed``."""

    def __init__(self, model: nn.Module) -> None:
        self.armed = False
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, int] = {}
        self._handles = []
        for name, mod in model.named_modules():
            if name.endswith("mlp.fc"):
                key = name[: -len(".fc")]
                self._handles.append(mod.register_forward_hook(self._hook(key)))
        if not self._handles:
            raise ValueError("no module named '...mlp.fc' in the model: nothing to measure")

    def _hook(self, key: str):
        def hook(module, inputs, output):
            if self.armed and module.training:
                stats = relu2_sparsity(output)
                self._sums[key] = self._sums[key] + stats if key in self._sums else stats
                self._counts[key] = self._counts.get(key, 0) + 1
        return hook

    def read(self, reset: bool = True) -> dict[str, dict[str, float]]:
        """Per layer: the mean of each statistic over the armed forward passes since the last read."""
        out = {}
        for key, total in self._sums.items():
            zero, at_most_2 = (total / self._counts[key]).tolist()
            out[key] = {"zero_fraction": zero, "at_most_2_fraction": at_most_2}
        if reset:
            self._sums, self._counts = {}, {}
        return out

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
