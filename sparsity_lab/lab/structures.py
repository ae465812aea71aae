"""The two seed systems that are not 2:4 methods, as lab methods: DYAD and block prune-and-regrow.

A 2:4 method is a ``SparsityMethod`` handed to ``sparsify``; these two change the FFN linears'
*structure* instead, so each is a small config object with the same few verbs the trainer uses:
``apply(model)`` swaps the FFN linears, ``controller(model, optimizer)`` returns what must run
during training (prune-and-regrow's schedule, whose state goes into the checkpoint) or None,
``describe()`` and ``ffn_flops_fraction`` (the FFN's multiply-adds relative to dense).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ..structures.dyad import DyadLinear, dyadify
from ..structures.prune_regrow import BlockSparseLinear, PruneRegrow, block_sparsify


@dataclass(frozen=True)
class DyadStructure:
    """FFN linears -> DYAD (variant it/ot/dt, n blocks): 2/n of the dense parameters and FLOPs."""

    n_blocks: int = 4
    variant: str = "it"
    total_steps: int | None = None
    name: ClassVar[str] = "dyad"

    def __post_init__(self) -> None:
        DyadLinear(self.n_blocks, self.n_blocks, self.n_blocks, self.variant)  # validates the arguments

    def apply(self, model: nn.Module) -> nn.Module:
        return dyadify(model, self.n_blocks, self.variant)

    def controller(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        return None

    @property
    def ffn_flops_fraction(self) -> float:
        return 2.0 / self.n_blocks

    def describe(self) -> str:
        return f"dyad-{self.variant.removeprefix('dyad-')} n={self.n_blocks} (2/n = {2 / self.n_blocks:.3g} of dense)"


@dataclass(frozen=True)
class PruneRegrowStructure:
    """FFN linears -> always-sparse b x b block weights (Dietrich et al. 2021) that prune the
    smallest-L1 live blocks and regrow as many at random every ``update_every`` steps.

    Defaults are ours: 90 % sparse, 16 x 16 blocks, an update every total_steps/50 steps, and the
    half-cosine pr(t) spread over the whole run (T = total_steps / update_every updates).
    """

    sparsity: float = 0.9
    block: int = 16
    update_every: int | None = None
    total_updates: int | None = None
    seed: int = 0
    total_steps: int | None = None
    name: ClassVar[str] = "prune_regrow"

    def __post_init__(self) -> None:
        BlockSparseLinear(self.block, self.block, sparsity=self.sparsity, block=self.block)  # validates
        for key in ("update_every", "total_updates"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{key} must be a positive int or None, got {value!r}")

    @property
    def schedule(self) -> tuple[int, int]:
        """(update_every, total_updates) with the defaults filled in from total_steps."""
        every = self.update_every or max(1, (self.total_steps or 1000) // 50)
        updates = self.total_updates or max(1, (self.total_steps or 1000) // every)
        return every, updates

    def apply(self, model: nn.Module) -> nn.Module:
        return block_sparsify(model, self.sparsity, self.block, seed=self.seed)

    def controller(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> PruneRegrow:
        every, updates = self.schedule
        return PruneRegrow(model, optimizer, update_every=every, total_updates=updates, seed=self.seed).attach()

    @property
    def ffn_flops_fraction(self) -> float:
        return 1.0 - self.sparsity

    def describe(self) -> str:
        every, updates = self.schedule
        return (f"prune_regrow {self.sparsity:.0%} sparse, {self.block}x{self.block} blocks, "
                f"update every {every} steps x {updates}")


STRUCTURES: dict[str, type] = {cls.name: cls for cls in (DyadStructure, PruneRegrowStructure)}


def structured_density(model: nn.Module) -> float:
    """Fraction of the structured FFN linears' dense weight count that is live (DYAD: parameters)."""
    live = total = 0
    for module in model.modules():
        if isinstance(module, BlockSparseLinear):
            live += int(module.block_mask.sum()) * module.block ** 2
            total += module.weight.numel()
        elif isinstance(module, DyadLinear):
            live += module.blocks_a.numel() + module.blocks_b.numel()
            total += module.in_features * module.out_features
    return live / total if total else float("nan")
