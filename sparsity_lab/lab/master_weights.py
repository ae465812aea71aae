"""Low-precision weights for the products, float32 master weights in the optimizer.

Under bf16 autocast with float32 weights every step casts each linear weight to bf16 in the forward
(a read of 4 bytes and a write of 2 per weight, per step) and its bf16 gradient back to float32 in the
backward. With ``MasterWeights`` the model's linear weights *are* bf16: the products read them as they
are (autocast's cast is then a no-op), masks, S-STE's soft threshold, MVUE and the compression work on
those bf16 weights, and the gradients arrive in bf16. The optimizer keeps a float32 master copy of each
lowered weight and updates it: per step it copies the bf16 gradients into float32 master gradients, runs
the inner optimizer (AdamW, fused on CUDA) on the masters, and writes the masters back rounded to bf16
(two multi-tensor copies; the autocast casts are gone).

What is exact (``tests/test_master_weights.py``): the master weights follow the inner optimizer fed the
same gradients bit for bit (they are what a float32 run would hold given those gradients), the bf16
weights are always the masters rounded to nearest, and ``state_dict`` holds the masters with the inner
optimizer's state, so a resumed run continues bit for bit. Parameters that stay float32 (norms, the
position embedding) are stepped by the inner optimizer in place, as without the wrapper.

The wrapper is a ``torch.optim.Optimizer`` over the model's own parameters: schedulers change its
``param_groups`` (copied to the inner optimizer before every step) and ``attach_optimizer``'s hooks see
the model's weights (masked decay lands on the bf16 gradient before the step). A weight changed after
the step (``MaskedDecayOnWeights``'s decoupled decay) would be overwritten from its master at the next
step: ``lower_linear_weights`` refuses such a method.

The fused update (``fused_update``; on by default for AdamW with bf16 weights on CUDA): the three passes
above become one kernel pass (``sparsity_lab.kernels.adamw_master_``) that reads each bf16 gradient, the
master and the moments, and writes the master, the moments and the bf16 weight, 28 bytes per weight as
AdamW over float32 weights (the separate copies add 12). The moments and step counts stay the inner
AdamW's state (``inner.state``, same keys and dtypes), so ``state_dict`` and resuming are unchanged and a
run may switch between the two updates at a checkpoint. The fused update computes AdamW in float32 in
the order of PyTorch's fused kernel, not bit for bit as the inner ``AdamW`` does: the masters agree with
it to float32 rounding (``tests/test_master_weights.py``), and the bf16 weights are the masters rounded to
nearest, exactly. The float32 parameters (norms, position embedding) are still stepped by the inner one.

The fused update also takes the masked decay on gradients of the 2:4 layers (``MaskedDecay``): the optimizer
pre-hook of ``attach_optimizer`` hands it over (``defer_masked_decay``) instead of running its own pass over
the bf16 gradient, and the kernel adds decay * (1 - m) * W in float32 before the moments (where the pass
would have rounded the decayed gradient to bf16 first).

It also writes a 2:4 layer's next compressed operands where the layer asks (``write_operands``, on by default):
with a mask kept for several steps, the next forward's S(W) and S(W)^T come from the new bf16 weight alone, so
the pre-hook hands the mask and S-STE's beta over (``defer_operand``) and the weight's update runs kernel 26
(``sparsity_lab.kernels.adamw_master_prepare24_``), which writes them in the same pass; the post-hook puts them
into the layer's operand cache (``take_operand``). They are kernel 11's bytes of the same bf16 weight.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

LOW_DTYPES = (torch.bfloat16, torch.float16)
INTERPRETER_BLOCK = 1 << 16  # weights per program of the fused update on the CPU


def linear_weights(model: nn.Module) -> list[nn.Parameter]:
    """The ``weight`` of every ``nn.Linear`` (``SparseLinear`` included) of ``model``, each once (a weight
    tied to an embedding, like the lab GPT's head, counts once): what autocast casts at every step."""
    seen: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, nn.Linear) and isinstance(module.weight, nn.Parameter):
            seen.setdefault(id(module.weight), module.weight)
    return list(seen.values())


def check_lowerable(model: nn.Module) -> None:
    """ValueError when a 2:4 layer changes its weight after the optimizer step (its master would undo it)."""
    from ..training_hooks import sparse_layers

    late = [name for name, layer in sparse_layers(model) if layer.method.decay_after_step]
    if late:
        raise ValueError(f"bf16 weights with float32 master weights: layers {late[:3]} decay their weights after the "
                         "optimizer step (masked_decay_weights), which the master copy would overwrite; use "
                         "masked_decay (decay on the gradient) or float32 weights")


class MasterWeights(torch.optim.Optimizer):
    """``optimizer_class`` over float32 masters of the parameters in ``lower``, which are cast to ``dtype``.

    params: the model's parameters or param groups (as for any optimizer). lower: the parameters to hold
    in ``dtype`` (each must be in ``params``; float32 now: its value becomes the master). Every other
    parameter is stepped in place. defaults: the inner optimizer's keyword arguments (lr, betas, fused, ...).
    fused_update: update the lowered weights with one kernel pass (``sparsity_lab.kernels.adamw_master_``)
    instead of copy, inner step, copy; None (default): where it applies (AdamW, bf16, CUDA tensors, no
    amsgrad / maximize / capturable / differentiable); True where it does not is refused, naming why.
    write_operands: under the fused update, write the next compressed operands of the 2:4 weights handed over by
    ``defer_operand`` in the same pass (kernel 26); False leaves them to the layers' forwards (kernel 11).
    """

    def __init__(self, params, lower: Iterable[torch.Tensor], dtype: torch.dtype = torch.bfloat16,
                 optimizer_class: type = torch.optim.AdamW, fused_update: bool | None = None,
                 write_operands: bool = True, **defaults) -> None:
        if not isinstance(write_operands, bool):
            raise ValueError(f"write_operands must be True or False, got {write_operands!r}")
        if dtype not in LOW_DTYPES:
            raise ValueError(f"dtype must be one of {LOW_DTYPES}, got {dtype!r}")
        super().__init__(params, defaults)
        mine = {id(p) for g in self.param_groups for p in g["params"]}
        lower = list(lower)
        strangers = [tuple(p.shape) for p in lower if id(p) not in mine]
        if strangers:
            raise ValueError(f"lower: {len(strangers)} tensor(s) (shapes {strangers[:3]}) are not among params")
        bad = [tuple(p.shape) for p in lower if p.dtype != torch.float32]
        if bad:
            raise ValueError(f"lower: the parameters to hold in {dtype} must be float32 now (their value becomes the "
                             f"master), got {len(bad)} of another dtype (shapes {bad[:3]})")
        self.low_dtype = dtype
        self.fused_update = self._choose_fused(fused_update, optimizer_class, lower)  # before anything changes
        self._master: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for p in lower:
                if id(p) not in self._master:
                    self._master[id(p)] = p.detach().clone()
                    p.data = p.data.to(dtype)  # the same Parameter object: modules and hooks keep it
        self.inner = optimizer_class([self._inner_group(g) for g in self.param_groups], **defaults)
        self._pairs = [(p, self._master[id(p)]) for g in self.param_groups for p in g["params"] if id(p) in self._master]
        self._steps: dict[int, int] = {}  # id(master) -> its AdamW step count, a host mirror of state["step"]
        # per param group, its lowered (working weight, master) pairs: what one fused launch serves
        self._group_pairs = [[(p, self._master[id(p)]) for p in g["params"] if id(p) in self._master]
                             for g in self.param_groups]
        self._masked_decays: dict[int, tuple[torch.Tensor, float]] = {}  # id(weight) -> this step's (mask, decay)
        self.write_operands = write_operands
        self._operand_requests: dict[int, tuple] = {}  # id(weight) -> this step's (mask, beta)
        self._operands: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(weight) -> (S(W), S(W)^T) written

    def _choose_fused(self, fused_update, optimizer_class: type, lower: list) -> bool:
        """Whether the lowered weights take the fused update; ValueError for True where it cannot."""
        if fused_update not in (None, True, False):
            raise ValueError(f"fused_update must be None, True or False, got {fused_update!r}")
        on_cuda = bool(lower) and all(p.device.type == "cuda" for p in lower)
        if fused_update is None:  # by default only on CUDA (on the CPU the kernel runs in Triton's slow interpreter)
            return on_cuda and not self._fused_refusal(optimizer_class, on_cuda)
        why_not = self._fused_refusal(optimizer_class, on_cuda) if fused_update else ""
        if why_not:
            raise ValueError(f"fused_update=True: {why_not}")
        return fused_update

    def _fused_refusal(self, optimizer_class: type, on_cuda: bool) -> str:
        """Why the fused update cannot serve this optimizer ("" when it can)."""
        if optimizer_class is not torch.optim.AdamW:
            return f"the fused update is AdamW's; optimizer_class is {optimizer_class.__name__}"
        if self.low_dtype != torch.bfloat16:
            return f"the fused update writes bf16 weights; dtype is {self.low_dtype}"
        if not on_cuda:
            from sparsity_lab.kernels._common import is_interpreted  # imports triton: only off CUDA
            from sparsity_lab.kernels.adamw_master import _adamw_master_kernel

            if not is_interpreted(_adamw_master_kernel):
                return "the lowered weights are not on CUDA (the kernel runs on the CPU only under TRITON_INTERPRET=1)"
        for g in self.param_groups:
            for flag in ("amsgrad", "maximize", "capturable", "differentiable"):
                if g.get(flag):
                    return f"the fused update has no {flag} (a param group sets it)"
            if isinstance(g.get("lr"), torch.Tensor):
                return "the fused update takes the learning rate as a number, not a tensor"
        return ""

    def _inner_group(self, group: dict) -> dict:
        return {**{k: v for k, v in group.items() if k != "params"},
                "params": [self._master.get(id(p), p) for p in group["params"]]}

    def takes_masked_decay(self, param: torch.Tensor) -> bool:
        """Whether this optimizer's update adds a masked decay for ``param`` itself (``defer_masked_decay``):
        True for a lowered weight under the fused update."""
        return bool(self.fused_update) and id(param) in self._master

    def defer_masked_decay(self, param: torch.Tensor, mask: torch.Tensor, decay: float) -> None:
        """Add ``decay * (1 - mask) * param`` to ``param``'s gradient inside the next step's fused update, in
        float32 (``adamw_master_``'s ``masked_decays``); ``attach_optimizer``'s pre-hook calls it in place of
        the masked-decay pass over the bf16 gradient."""
        if not self.takes_masked_decay(param):
            raise ValueError("defer_masked_decay: param is not a lowered weight under the fused update "
                             "(takes_masked_decay(param) is False)")
        self._masked_decays[id(param)] = (mask, float(decay))

    def takes_operand(self, param: torch.Tensor) -> bool:
        """Whether this optimizer's update can write ``param``'s next compressed 2:4 operands (``defer_operand``):
        a lowered bf16 weight under the fused update, with ``write_operands`` on."""
        return self.write_operands and self.takes_masked_decay(param)

    def defer_operand(self, param: torch.Tensor, mask: torch.Tensor, beta: torch.Tensor | None) -> None:
        """Write S(W) and S(W)^T of ``param``'s new bf16 weight in cuSPARSELt's layout inside the next step's fused
        update (kernel 26; mask: bool, transposable 2:4; beta: S-STE's scale or None for m * W); ``take_operand``
        returns them after the step. The weight must be 2-D with sizes multiples of 64 (the caller checks)."""
        if not self.takes_operand(param):
            raise ValueError("defer_operand: param is not a lowered weight under the fused update with "
                             "write_operands on (takes_operand(param) is False)")
        self._operand_requests[id(param)] = (mask, beta)

    def take_operand(self, param: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(S(W), S(W)^T) that the latest step wrote for ``param`` (``defer_operand``), once; else None."""
        return self._operands.pop(id(param), None)

    def master(self, param: torch.Tensor) -> torch.Tensor:
        """The float32 master of a lowered parameter (the parameter itself for one kept in float32)."""
        return self._master.get(id(param), param)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group, inner in zip(self.param_groups, self.inner.param_groups):
            inner.update({k: v for k, v in group.items() if k != "params"})  # a scheduler's lr, ...
        if self.fused_update:
            self._operands.clear()  # operands not taken after an earlier step are stale now
            try:
                self._fused_lowered_step()
            finally:
                self._masked_decays.clear()  # handed over for this step only
                self._operand_requests.clear()
            self.inner.step()  # the float32 parameters; the lowered masters have no gradient there
            return loss
        lows, masters = [], []
        for p, m in self._pairs:
            if p.grad is None:
                m.grad = None  # no gradient this step: the inner optimizer skips it, as it would p
                continue
            if m.grad is None or m.grad.shape != p.grad.shape:
                m.grad = torch.empty_like(m)
            lows.append(p.grad)
            masters.append(m.grad)
        if lows:
            torch._foreach_copy_(masters, lows)  # bf16 -> float32 is exact
        self.inner.step()
        updated = [(p, m) for p, m in self._pairs if m.grad is not None]
        if updated:
            torch._foreach_copy_([p.data for p, _ in updated], [m for _, m in updated])  # round to nearest
        return loss

    def _adamw_state(self, master: torch.Tensor, group: dict) -> dict:
        """The inner AdamW's state of ``master``, created as AdamW creates it (step 0, zero moments)."""
        state = self.inner.state[master]
        if not state:
            on_device = group.get("fused") or group.get("capturable")
            state["step"] = (torch.zeros((), dtype=torch.float32, device=master.device) if on_device
                             else torch.tensor(0.0, dtype=torch.float32))
            state["exp_avg"] = torch.zeros_like(master, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(master, memory_format=torch.preserve_format)
        if id(master) not in self._steps:  # after a load: read once (one host sync), then counted here
            self._steps[id(master)] = int(state["step"].item())
        return state

    def _fused_lowered_step(self) -> None:
        """AdamW on the lowered masters of each param group: one kernel pass (a launch per weight) per group
        and step count (one in a plain run), the step tensors advanced with one foreach add."""
        from sparsity_lab.kernels.adamw_master import adamw_master_

        for pairs, group in zip(self._group_pairs, self.inner.param_groups):
            live = [(p, m) for p, m in pairs if p.grad is not None]
            if not live:
                continue
            states = [self._adamw_state(m, group) for _, m in live]
            torch._foreach_add_([st["step"] for st in states], 1.0)
            by_step: dict[int, list] = {}
            for (p, m), st in zip(live, states):
                self._steps[id(m)] += 1
                m.grad = None  # the inner step must skip it
                by_step.setdefault(self._steps[id(m)], []).append((p, m, st))
            beta1, beta2 = group["betas"]
            # the interpreter (CPU) pays per program: few large blocks there; the GPU's default elsewhere
            longest = max(p.numel() for p, _ in live)
            block = ({"block": min(INTERPRETER_BLOCK, max(16, 1 << (longest - 1).bit_length()))}
                     if live[0][0].device.type == "cpu" else {})
            for step, items in by_step.items():
                items = self._update_writing_operands(items, step, group)
                if not items:
                    continue
                decays = {i: self._masked_decays[id(p)] for i, (p, _, _) in enumerate(items)
                          if id(p) in self._masked_decays}
                adamw_master_([p.data for p, _, _ in items], [p.grad for p, _, _ in items], [m for _, m, _ in items],
                              [st["exp_avg"] for _, _, st in items], [st["exp_avg_sq"] for _, _, st in items],
                              step=step, lr=float(group["lr"]), beta1=float(beta1), beta2=float(beta2),
                              eps=float(group["eps"]), weight_decay=float(group["weight_decay"]),
                              masked_decays=decays or None, **block)

    def _update_writing_operands(self, items: list, step: int, group: dict) -> list:
        """Kernel 26 for the weights among ``items`` ((weight, master, state) of one step count) that asked for their
        operands (``defer_operand``), each with its masked decay if handed over; returns the others."""
        from sparsity_lab.kernels.adamw_prepare24 import adamw_master_prepare24_

        rest = []
        beta1, beta2 = group["betas"]
        for p, m, st in items:
            request = self._operand_requests.get(id(p))
            if request is None:
                rest.append((p, m, st))
                continue
            mask, beta = request
            decay = self._masked_decays.get(id(p), (None, None))[1]
            self._operands[id(p)] = adamw_master_prepare24_(
                p.data, p.grad, m, st["exp_avg"], st["exp_avg_sq"], mask, beta, step=step, lr=float(group["lr"]),
                beta1=float(beta1), beta2=float(beta2), eps=float(group["eps"]),
                weight_decay=float(group["weight_decay"]), decay=decay)
        return rest

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        self.inner.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        """The inner optimizer's state and the masters, in the order of the lowered parameters."""
        return {"inner": self.inner.state_dict(), "masters": [m.detach().clone() for _, m in self._pairs],
                "low_dtype": str(self.low_dtype), "param_groups": [
                    {k: v for k, v in g.items() if k != "params"} for g in self.param_groups]}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"inner", "masters", "low_dtype", "param_groups"}:
            raise ValueError(f"not a MasterWeights state_dict (keys {sorted(state)}): was it saved by a plain "
                             "optimizer? A run with bf16 master weights resumes only from one that had them")
        if state["low_dtype"] != str(self.low_dtype) or len(state["masters"]) != len(self._pairs):
            raise ValueError(f"MasterWeights state_dict holds {len(state['masters'])} {state['low_dtype']} masters, "
                             f"this optimizer {len(self._pairs)} {self.low_dtype} ones")
        if len(state["param_groups"]) != len(self.param_groups):
            raise ValueError(f"MasterWeights state_dict has {len(state['param_groups'])} param groups, this optimizer "
                             f"{len(self.param_groups)}")
        with torch.no_grad():
            for (p, m), saved in zip(self._pairs, state["masters"]):
                if saved.shape != m.shape:
                    raise ValueError(f"MasterWeights state_dict: a master of shape {tuple(saved.shape)} for a "
                                     f"parameter of shape {tuple(m.shape)}")
                m.copy_(saved)
                p.copy_(m)  # the working weight is the master rounded, whatever the model's state_dict held
        for group, saved in zip(self.param_groups, state["param_groups"]):
            group.update(saved)
        self.inner.load_state_dict(state["inner"])
        self._steps.clear()  # the step counts are read again from the loaded state


def lower_linear_weights(model: nn.Module, optimizer_class: type = torch.optim.AdamW,
                         dtype: torch.dtype = torch.bfloat16, param_groups=None, fused_update: bool | None = None,
                         write_operands: bool = True, **defaults) -> MasterWeights:
    """``MasterWeights`` for ``model``: its linear weights (``linear_weights``) held in ``dtype`` from now on.

    Call after ``sparsify`` (masks and S-STE's beta come from the float32 weights) and before
    ``attach_optimizer``. param_groups: the optimizer's groups (default: ``model.parameters()``).
    fused_update, write_operands: as ``MasterWeights``'s."""
    check_lowerable(model)
    from ..training_hooks import sparse_layers

    opt = MasterWeights(param_groups if param_groups is not None else model.parameters(), linear_weights(model),
                        dtype=dtype, optimizer_class=optimizer_class, fused_update=fused_update,
                        write_operands=write_operands, **defaults)
    for _, layer in sparse_layers(model):
        layer.operand_cache.clear()  # prepared from the float32 weight, if any was
    return opt
