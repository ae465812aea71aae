"""Structured dynamic sparse pre-training (Dietrich et al. 2021): always-sparse block weights
that periodically prune and regrow.

* ``BlockSparseLinear``: W (out, in) tiled into b x b blocks; a bool block mask (out/b, in/b)
  keeps a fixed number of live blocks (default 10 %, i.e. 90 % sparse). Forward uses
  ``W * expand(mask)``, so dead weights get no gradient and stay exactly zero.
* ``PruneRegrow``: every ``update_every`` optimizer steps (update t = 0, 1, ..., T-1) each layer
  prunes the fraction pr(t) = 0.25 * (1 + cos(pi * t / T)) of its live blocks with the smallest
  L1 norm (a half-cosine from 0.5 towards 0) and regrows as many at uniformly random dead
  positions (not the ones just pruned, unless there are too few others). Pruned and regrown
  weights and their AdamW moments are set to zero, so the live-block count never changes.
The block masks are layer buffers and the schedule (update index, step counter, RNG state) is in
``PruneRegrow.state_dict()``: a checkpoint of both resumes exactly.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..sparsify import module_selector

BLOCK_SIZES = (1, 4, 8, 16)


class BlockSparseLinear(nn.Linear):
    """nn.Linear with a b x b block mask; ``sparsity`` is the fraction of dead blocks."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, sparsity: float = 0.9,
                 block: int = 16, generator: torch.Generator | None = None, device=None, dtype=None) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._setup(sparsity, block, generator)

    @classmethod
    def from_linear(cls, linear: nn.Linear, sparsity: float = 0.9, block: int = 16,
                    generator: torch.Generator | None = None) -> "BlockSparseLinear":
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.weight, layer.bias = linear.weight, linear.bias
        layer._setup(sparsity, block, generator)
        return layer

    def _setup(self, sparsity: float, block: int, generator: torch.Generator | None) -> None:
        if block not in BLOCK_SIZES:
            raise ValueError(f"block must be one of {BLOCK_SIZES}, got {block!r}")
        if not 0.0 <= sparsity < 1.0:
            raise ValueError(f"sparsity must be in [0, 1), got {sparsity!r}")
        for name, size in (("in_features", self.in_features), ("out_features", self.out_features)):
            if size % block:
                raise ValueError(f"{name}={size} is not divisible by block={block}")
        self.block, self.sparsity = block, float(sparsity)
        grid = (self.out_features // block, self.in_features // block)
        total = grid[0] * grid[1]
        live = max(1, round((1.0 - sparsity) * total))
        order = torch.randperm(total, generator=generator)
        mask = torch.zeros(total, dtype=torch.bool)
        mask[order[:live]] = True
        self.register_buffer("block_mask", mask.reshape(grid).to(self.weight.device))
        with torch.no_grad():
            self.weight.mul_(self.weight_mask())

    @property
    def live_blocks(self) -> int:
        return int(self.block_mask.sum())

    def weight_mask(self) -> torch.Tensor:
        """(out, in) bool: the block mask expanded to weights."""
        b = self.block
        return self.block_mask.repeat_interleave(b, 0).repeat_interleave(b, 1)

    def block_l1(self) -> torch.Tensor:
        """(out/b, in/b): L1 norm of each block of W."""
        b = self.block
        o, i = self.block_mask.shape
        return self.weight.detach().abs().reshape(o, b, i, b).sum(dim=(1, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight * self.weight_mask(), self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, block={self.block}, sparsity={self.sparsity:g}"


def block_sparsify(model: nn.Module, sparsity: float = 0.9, block: int = 16, select=None,
                   seed: int = 0) -> nn.Module:
    """Replace the selected nn.Linear modules (default: FFN linears) by BlockSparseLinear, in place."""
    chosen = module_selector(select)
    gen = torch.Generator().manual_seed(seed)
    targets = [(name, mod) for name, mod in model.named_modules() if type(mod) is nn.Linear and chosen(name, mod)]
    if not targets:
        raise ValueError(f"no nn.Linear matched select={select!r}")
    for name, linear in targets:
        try:
            layer = BlockSparseLinear.from_linear(linear, sparsity, block, gen)
        except ValueError as err:
            raise ValueError(f"cannot make {name!r} block-sparse: {err}") from err
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
    return model


def prune_fraction(t: int, total_updates: int, initial: float = 0.5) -> float:
    """pr(t) = initial/2 * (1 + cos(pi * t / T)): half-cosine decay from ``initial`` to 0."""
    return 0.5 * initial * (1.0 + math.cos(math.pi * min(t, total_updates) / total_updates))


class PruneRegrow:
    """The prune-and-regrow schedule for every BlockSparseLinear of a model.

    Call ``step()`` after each optimizer step (``attach()`` registers it as a post-hook);
    every ``update_every`` steps it runs one update while t < total_updates.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, update_every: int = 100,
                 total_updates: int = 10, initial_fraction: float = 0.5, seed: int = 0) -> None:
        self.layers = [m for m in model.modules() if isinstance(m, BlockSparseLinear)]
        if not self.layers:
            raise ValueError("model has no BlockSparseLinear layers: call block_sparsify(model) first")
        if update_every < 1 or total_updates < 1:
            raise ValueError(f"update_every and total_updates must be >= 1, got {update_every}, {total_updates}")
        self.optimizer = optimizer
        self.update_every, self.total_updates = update_every, total_updates
        self.initial_fraction = initial_fraction
        self.updates_done = 0
        self.steps = 0
        self.generator = torch.Generator().manual_seed(seed)
        self.history: list[dict] = []

    def attach(self) -> "PruneRegrow":
        self.optimizer.register_step_post_hook(lambda opt, args, kwargs: self.step())
        return self

    def step(self) -> None:
        self.steps += 1
        if self.steps % self.update_every == 0 and self.updates_done < self.total_updates:
            self.update()

    @torch.no_grad()
    def update(self) -> dict:
        """One prune-and-regrow update of every layer; returns what changed."""
        fraction = prune_fraction(self.updates_done, self.total_updates, self.initial_fraction)
        changed = 0
        for layer in self.layers:
            changed += self._update_layer(layer, fraction)
        record = {"update": self.updates_done, "step": self.steps, "prune_fraction": fraction,
                  "blocks_moved": changed}
        self.history.append(record)
        self.updates_done += 1
        return record

    def _update_layer(self, layer: BlockSparseLinear, fraction: float) -> int:
        mask = layer.block_mask.view(-1)
        live = mask.nonzero().squeeze(1)
        k = int(math.floor(fraction * live.numel()))
        if k == 0:
            return 0
        norms = layer.block_l1().view(-1)[live]
        pruned = live[torch.sort(norms.cpu(), stable=True).indices[:k].to(live.device)]
        was_dead = (~mask).nonzero().squeeze(1)
        candidates = was_dead if was_dead.numel() >= k else torch.cat([was_dead, pruned])
        pick = torch.randperm(candidates.numel(), generator=self.generator)[:k].to(candidates.device)
        regrown = candidates[pick]
        mask[pruned] = False
        mask[regrown] = True
        # zero the weights and AdamW moments of every block that changed state
        changed = torch.zeros_like(mask)
        changed[pruned] = True
        changed[regrown] = True
        b = layer.block
        zero = changed.view_as(layer.block_mask).repeat_interleave(b, 0).repeat_interleave(b, 1)
        layer.weight.masked_fill_(zero, 0.0)
        state = self.optimizer.state.get(layer.weight, {})
        for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"):
            if isinstance(state.get(key), torch.Tensor):
                state[key].masked_fill_(zero, 0.0)
        return int(k)

    def state_dict(self) -> dict:
        return {"updates_done": self.updates_done, "steps": self.steps,
                "generator": self.generator.get_state(), "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.updates_done, self.steps = int(state["updates_done"]), int(state["steps"])
        self.generator.set_state(state["generator"])
        self.history = list(state["history"])
