"""A SparseLinear whose mask lives sharded like its weight under FSDP2 (``fully_shard``).

FSDP2 keeps each parameter as a DTensor sharded along dim 0 (rows of W, the ``out`` dim) and
all-gathers the full W right before the owning block's forward and again before its backward. This
layer follows the same life cycle for its sparse state:

* the mask buffer is a DTensor with the weight's mesh and placements, so each rank stores only its
  rows (per-rank mask memory = full mask / world size, like the weight);
* inside the forward, where FSDP2 has put the full W in place, a due mask is computed from the
  full W (identical to one process: the rank holds the same all-gathered W as everyone else) and
  the rank keeps its part; a mask that is not due is all-gathered from the parts;
* flips are counted on the rank's part in the forward and summed over the ranks once per step, all
  layers in one ``all_reduce`` after the optimizer step (``sum_flips_over_ranks``, which
  ``attach_optimizer``'s hook calls), so a flip count means what it means on one process. Not in the
  forward: a collective there, even an asynchronous one, queues on the communicator FSDP2 uses, so
  the next block's prefetched all-gather waits for this layer's mask (profiled in torchtitan: see
  docs/distributed.md);
* masked decay runs in the optimizer's pre-step hook on the sharded gradient, with the rank's part
  of the mask and of W (the decay is elementwise, so the parts give exactly the full update); the
  decay on the weights (``MaskedDecayOnWeights``) likewise after the step, on the rank's rows of W;
* S-STE's beta (one scalar, computed from the full W when ``sparsify`` ran, before sharding) is
  replicated.

The products' operand (m * W or beta * S(W), compressed by hardware backends) is built from the full
W in the forward. By default the autograd graph holds it (and the full mask) until the backward needs
it ("keep"); with ``recompute_operands = True`` both are dropped after the forward and rebuilt in the
backward from the re-gathered W and the gathered mask parts ("recompute": no full-size sparse state
between forward and backward, one more mask all-gather and preparation per layer and step). It is
never cached across forwards (a cache would keep every layer's full-size operand alive all step).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from ..layers import SparseLinear
from ..methods.handlers import method_handler


class ShardedSparseLinear(SparseLinear):
    """SparseLinear after ``fully_shard``: see the module docstring. Made by ``fully_shard_sparse``."""

    _full_mask: torch.Tensor | None = None

    @property
    def mask_is_sharded(self) -> bool:
        return isinstance(self.mask, DTensor)

    def shard_mask_like_weight(self) -> None:
        """Replace the full mask buffer by a DTensor sharded as the (already sharded) weight is."""
        weight = self.weight
        if not isinstance(weight, DTensor):
            raise TypeError(f"{type(self).__name__}.shard_mask_like_weight needs the weight sharded by "
                            "fully_shard first (got a plain tensor)")
        if self.mask_is_sharded:
            return
        # every rank holds the same full mask (computed from the same full W): take the local part, no traffic
        self.mask = distribute_tensor(self.mask, weight.device_mesh, weight.placements, src_data_rank=None)

    def _local_part(self, full: torch.Tensor) -> torch.Tensor:
        return distribute_tensor(full, self.mask.device_mesh, self.mask.placements, src_data_rank=None).to_local()

    def _full_weight_in_forward(self) -> torch.Tensor:
        weight = self.weight
        if isinstance(weight, DTensor):
            raise RuntimeError("a sharded layer's mask is computed inside the forward of its fully_shard'ed "
                               "module, where FSDP2 has all-gathered the weight; call the model, not "
                               "refresh_mask() directly")
        return weight

    # --- the hooks SparseLinear calls ------------------------------------------------------
    @torch.no_grad()
    def refresh_mask(self) -> None:
        if self.mask_is_sharded:
            self._full_weight_in_forward()
        super().refresh_mask()

    def _replace_mask(self, new: torch.Tensor, count: bool) -> torch.Tensor | None:
        if not self.mask_is_sharded:
            return super()._replace_mask(new, count)
        local = self._local_part(new)
        if count:  # this rank's rows; summed over the ranks after the optimizer step (sum_flips_over_ranks)
            flips = self.backend.mask_flips(self.mask.to_local(), local).to(torch.int64)
            self._rank_flips = flips if self._rank_flips is None else self._rank_flips + flips
        self.mask.to_local().copy_(local)
        self._full_mask = new  # the products of this forward use it
        return None  # counted here: refresh_mask adds nothing

    _rank_flips: torch.Tensor | None = None  # flips of this rank's rows not yet summed over the ranks

    @staticmethod
    @torch.no_grad()
    def sum_flips_over_ranks(layers: list) -> None:
        """Sum every sharded layer's pending flip count over the ranks, one ``all_reduce`` per process
        group for all of them, and add the sums to the layers' counts. Every rank calls it at the same
        point (after each optimizer step), so it is collective-safe; a layer with nothing pending
        takes part with 0 (its counts do not change)."""
        by_group: dict = {}
        for layer in layers:
            if isinstance(layer, ShardedSparseLinear) and layer.mask_is_sharded:
                by_group.setdefault(layer.mask.device_mesh.get_group(), []).append(layer)
        for group, members in by_group.items():
            device = members[0].mask.to_local().device
            pending = [m._rank_flips if m._rank_flips is not None else torch.zeros((), dtype=torch.int64,
                                                                                   device=device)
                       for m in members]
            had = [m._rank_flips is not None for m in members]
            if not any(had):  # the same on every rank: the masks follow one schedule
                continue
            sums = torch.stack(pending)
            dist.all_reduce(sums, group=group)
            for k, (m, counted) in enumerate(zip(members, had)):
                m._rank_flips = None
                if counted:
                    m.flip_counts.add(sums[k])

    def _mask_for_products(self) -> torch.Tensor:
        if not self.mask_is_sharded:
            return super()._mask_for_products()
        if self._full_mask is None:  # not refreshed in this forward: gather the parts
            self._full_mask = self.mask.full_tensor()
        return self._full_mask

    refresh_in_next_forward = False  # set by an evaluation that wants the due mask (``DistributedTrainer``)
    recompute_operands = False  # True: drop operand and full mask after the forward, rebuild them in the backward

    def _after_forward(self, plan) -> None:
        if not (self.mask_is_sharded and self.recompute_operands):
            return
        dtype = plan.dtype
        plan.operand = plan.mask = None

        def rebuild():
            # in the backward FSDP2 has all-gathered W again (unchanged since the forward); the mask
            # parts have not changed either: gather them (one byte per weight) and prepare again
            self._full_weight_in_forward()
            self._full_mask = self.mask.full_tensor()
            try:
                return self.operand_cache.get(self, dtype, backward=True), self._full_mask
            finally:
                self._full_mask = None
                self.operand_cache.clear()

        plan.rebuild = rebuild

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.refresh_in_next_forward:
            self.refresh_in_next_forward = False
            if self.mask_due():
                self.refresh_mask()
        try:
            return super().forward(x)
        finally:
            if self.mask_is_sharded:
                # the autograd graph holds what the backward needs; nothing full-size outlives the forward
                self._full_mask = None
                self.operand_cache.clear()

    @torch.no_grad()
    def apply_masked_decay(self, grad_scale: float = 1.0) -> None:
        if not self.mask_is_sharded:
            return super().apply_masked_decay(grad_scale)
        weight = self.weight
        if not self.dense_now and weight.grad is not None:
            # the rank's parts of the gradient, of W and of the mask (the decays are elementwise)
            method_handler(self.method).decay_gradient_(self, weight.grad.to_local(), weight.to_local(),
                                                        self.mask.to_local(), grad_scale)

    @torch.no_grad()
    def apply_decay_on_weights(self, lr: float) -> None:
        if not self.mask_is_sharded:
            return super().apply_decay_on_weights(lr)
        if not self.dense_now:
            w = self.weight.to_local()  # the rank's rows, updated in place like the whole W on one process
            method_handler(self.method).decay_weight_(self, w, self.mask.to_local(), lr)
            self.operand_cache.clear()

    def sparse_weight(self) -> torch.Tensor:
        if self.mask_is_sharded and isinstance(self.weight, DTensor):
            raise RuntimeError("the sparse weight of a sharded layer exists only inside its forward (the full "
                               "W is all-gathered there); for a look at it, gather the state with "
                               "torch.distributed.checkpoint.state_dict.get_model_state_dict(..., "
                               "options=StateDictOptions(full_state_dict=True))")
        return super().sparse_weight()
