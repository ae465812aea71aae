"""A training step's forward and backward captured once in a CUDA graph and replayed every step.

Why: in eager mode every 2:4 layer launches its mask, flip-count, soft-threshold, MVUE and compression
kernels from Python (and each ``torch._cslt_sparse_mm`` call builds a plan on the host; the backend's
direct binding, ``backends/cusparselt/direct.py``, caches it), so small and medium layers are
host-bound (docs/measuring.md, ``results/cusparselt_NOTES.md``). A replay launches the whole captured step at once;
under it the ``cusparselt_auto`` policy times its candidate products in CUDA graphs too (``graph_timing``).

What stays exact: a replay draws the MVUE numbers eager mode would draw. Each MVUE layer reads its
seed from a 0-d int64 device tensor that the host writes before every replay with the value the
eager step would have used (the layer's counter-based generator advances as in eager mode), so the
draw counters in a checkpoint are the ones an eager run would save. On the H100, ten graphed steps
matched ten eager steps with the masks refreshed eagerly before each replay (losses within 1e-3
relative, weights within bf16 rounding; the draw counters, mask updates and flip counts identical);
``tests/test_graph_step.py`` checks the same, masks bit for bit included, with the masks refreshed
inside the graph. The prepared operands (soft threshold, compression) are rebuilt inside the graph
from the current weights.

Where the masks are refreshed (``masks_in_graph``, default False: on the H100 the lab's graphed step ran
a little slower with its masks refreshed inside the graph than eagerly before each replay, at widths 1024
and 2048, and the same at 4096 (``results/lab_speed_h100_masks_in_graph*.json``); but a step of a millisecond
or less cannot hide the host work of an eager refresh: the graphed FFN step at 4096 tokens x d_model 1024 ran
much faster refreshed inside (``results/ffn_small_shapes_h100*.json``; both in docs/measuring.md), so pass
``masks_in_graph=True`` for small steps; ``mask_refresh`` says which mode a
capture uses, ``eager_refresh_reasons`` why a layer is left out). A layer whose mask is due every step
(``mask_refresh_interval`` 1, a phase that tracks masks) on a backend whose mask and flip-count kernels
run on the device alone (``Backend.mask_refresh_capturable``: "triton", "cusparselt", "cusparselt_auto",
the FP8 backends), with the backend's mask rule (a method handler's own rule only when it declares
``own_mask_capturable``) and SparseLinear's own refresh (not a sharded layer), is refreshed *inside* the
graph (``graph_layer.py``): at the start of the captured step its new mask is computed from the weight into its mask
buffer, and its flips r_t = ||m_t XOR m_{t-1}||_1 are counted into a static device buffer that also
keeps their running sum (``graph_flips.py``); on a backend that writes the mask and the operand in one pass
(``Backend.fuses_refresh_and_prepare``: cuSPARSELt's kernel 21) the operand is prepared there too, in the
dtype its eager steps used, and the layer's forward reuses it. After a replay the host only advances the layer's
Python counters (``mask_step``, ``mask_updates``); ``last_flips`` / ``flips_total`` read the device
counts when asked (one host sync), the values an eager refresh gives. Every other layer that tracks
masks is refreshed eagerly before each replay when due: a mask due only every k > 1 steps would need
a conditional node in the graph (a replay runs every kernel it holds), so an interval > 1 stays eager.
A replay whose in-graph masks are not due (the layers' step did not advance, e.g. a GradScaler skipped
the optimizer step) runs as an eager step instead (``eager_steps`` counts every eager step).

Usage::

    step = CudaGraphStep(model, loss_fn)      # loss_fn(model, *inputs) -> scalar loss
    for x, y in batches:
        loss = step(x, y)                     # forward + backward; grads in p.grad
        optimizer.step()                      # eager (attach_optimizer's hooks run as usual)

Limits (each raises or is documented): CUDA tensors only; the inputs keep their shapes and dtypes
(a new shape takes one eager step, where its decisions and searches run, then recaptures); every
SparseLinear runs once per step; one micro-step per optimizer step (a replay overwrites the
gradients, it does not add to them); MVUE needs a backend whose kernels read the seed on the device
(``Backend.reads_seed_from_device``: "triton", "cusparselt", "cusparselt_auto", the FP8 backends;
the reference backend draws on the host). Under autocast, use
``torch.autocast(..., cache_enabled=False)`` inside ``loss_fn`` (PyTorch's rule for graphs). A change
of phase (the dense fine-tune switch) or of the set of layers refreshed inside the graph recaptures.
``recaptures`` counts captures.

Host constants: a product that takes a host value (an FP8 2:4 product with
``FP8Recipe(scale_in_product="host_alpha")`` takes ``alpha = s_a s_b`` as a host float) holds it in a
captured graph as a constant. Before each replay the step asks every layer's backend for those values
(``Backend.graph_constants``). When one changed since the capture (a power-of-two scale that moved), the
step runs eagerly until the new values have held for ``scale_settle_steps`` steps in a row, then captures
them (``graph_settle.py`` says why: early in a run the scales move every few steps, and a capture costs
about an eager step); values that come back to the captured ones replay at once. ``scale_recaptures``
counts those captures (also in ``recaptures``), ``scale_eager_steps`` the eager steps spent waiting (also
in ``eager_steps``). ``scale_settle_steps=0`` recaptures at the first step with new values.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from .graph_layer import (after_graph_refresh, fill_device_seed, mask_rule_capturable, refresh_mask_in_graph,
                          release_device_seed, release_graph_flips, use_device_seed, use_graph_flips)
from .graph_settle import CAPTURE, EAGER, SettledConstants
from .layers import SparseLinear, refreshes_mask_with_own_hooks
from .methods.handlers import method_handler
from .training_hooks import sparse_layers
from .backends.report import measures_products  # the interface only: no backend is named here


def mvue_layers(model: nn.Module) -> list[SparseLinear]:
    return [layer for _, layer in sparse_layers(model) if method_handler(layer.method).mvue(layer)]


def fill_seeds(layers: list[SparseLinear]) -> None:
    """Write each MVUE layer's seed for this step into its device seed tensor: the value the eager
    step would draw (the layer's generator for its next call, advancing ``mvue_calls`` as eager does).
    A layer in a dense phase draws nothing in an eager step, so it gets no seed (its count stays)."""
    for layer in layers:
        if not layer.dense_now:
            fill_device_seed(layer)


def use_device_seeds(layers: list[SparseLinear], device: torch.device) -> None:
    """Give every MVUE layer a device seed tensor (CUDA-graph mode). Checks every layer before changing
    any: a layer whose backend draws on the host (``reads_seed_from_device`` False) is refused."""
    host = [layer for layer in layers if not layer.backend.reads_seed_from_device]
    if host:
        use_device_seed(host[0], device)  # raises, naming the backend
    for layer in layers:
        use_device_seed(layer, device)


def release_device_seeds(layers: list[SparseLinear]) -> None:
    """Back to eager mode: the layers draw from their host generators again."""
    for layer in layers:
        release_device_seed(layer)


def refresh_due_masks(model: nn.Module, skip: Iterable[SparseLinear] = ()) -> None:
    """Recompute the masks that are due now, eagerly (so the captured step never contains it).
    skip: layers left alone (their refresh is inside the graph)."""
    skipped = {id(layer) for layer in skip}
    with torch.no_grad():
        for _, layer in sparse_layers(model):
            if id(layer) not in skipped and layer.mask_due():
                layer.refresh_mask()


def eager_refresh_reason(layer: SparseLinear, masks_in_graph: bool = False) -> str | None:
    """None when CudaGraphStep can refresh this layer's mask inside its graph (see the module
    docstring), else why the layer is refreshed eagerly before each replay. Asked of layers that
    track their mask now (the method handler's ``tracks_mask``)."""
    m = layer.method
    if not masks_in_graph:
        return "masks_in_graph=False"
    if m.mask_refresh_interval != 1:
        return (f"mask_refresh_interval {m.mask_refresh_interval}: due on some steps only, and a replay runs "
                "every kernel it holds")
    if not layer.backend.mask_refresh_capturable:
        return f"backend {layer.backend.name!r} computes masks with host work (not capturable)"
    if (m.n, m.m) != (2, 4):
        return f"{m.n}:{m.m} masks: the capturable mask kernels are 2:4"
    if not mask_rule_capturable(layer):
        return (f"method handler {type(method_handler(m)).__name__} computes its own masks (not declared "
                "capturable: own_mask_capturable)")
    if not refreshes_mask_with_own_hooks(layer):
        return f"{type(layer).__name__} overrides the mask refresh (a sharded mask)"
    if layer.mask_updates < 1:
        return "no previous mask to count flips against yet"
    return None


def mask_refresh_plan(model: nn.Module, masks_in_graph: bool = False) -> dict[str, str | None]:
    """{layer name: None (refreshed inside the graph) or the reason it is refreshed eagerly} for every
    SparseLinear that tracks its mask now (a layer in a dense phase computes none and is left out)."""
    return {name: eager_refresh_reason(layer, masks_in_graph)
            for name, layer in sparse_layers(model) if method_handler(layer.method).tracks_mask(layer)}


def refresh_mode(plan: dict[str, str | None]) -> str:
    """"graph" (every tracked mask inside the graph), "eager" (none), "mixed", or "none" (no layer
    tracks its mask, e.g. after the dense fine-tune switch)."""
    if not plan:
        return "none"
    inside = sum(reason is None for reason in plan.values())
    return "graph" if inside == len(plan) else "eager" if inside == 0 else "mixed"


class graph_timing:
    """``with graph_timing(model):`` the auto policy of every 2:4 layer's backend times the products it
    has not decided yet replayed from a CUDA graph (a graphed step pays the kernels, not the host's
    launches: eager timings undervalue the sparse path); the previous timing mode comes back on exit.
    CudaGraphStep wraps its eager steps (where the decisions are made) in it."""

    def __init__(self, model: nn.Module) -> None:
        self.backends = {id(layer.backend): layer.backend for _, layer in sparse_layers(model)
                         if measures_products(layer.backend)}
        self._saved: dict[int, str] = {}

    def __enter__(self):
        for key, backend in self.backends.items():
            self._saved[key] = backend.timing
            backend.timing = "graph"
        return self

    def __exit__(self, *exc):
        for key, backend in self.backends.items():
            backend.timing = self._saved[key]


class CudaGraphStep:
    """``loss = step(*inputs)``: forward + backward of ``loss_fn(model, *inputs)``, replayed from a
    CUDA graph after ``warmup_steps`` eager steps (see the module docstring).

    model: on a CUDA device. loss_fn(model, *inputs) -> 0-d loss (call ``.backward()`` not inside it).
    warmup_steps: eager steps on a side stream first (Triton compiles, cuSPARSELt algorithm searches,
    allocations, the auto policy's measurements; PyTorch asks for warm-up before capture).
    masks_in_graph: refresh the masks that are due every step inside the graph (True), or all masks
    eagerly before each replay (False, the default: measured as fast or faster, see the module docstring). Which layers qualify: ``eager_refresh_reason``.
    scale_settle_steps: after a host constant the graph holds has changed, eager steps until the new values
    have held this many steps in a row, then a capture (``graph_settle.py``); 0 recaptures at once.
    The returned loss is a tensor the next replay overwrites: ``.item()`` or ``.clone()`` it to keep it.

    After a capture: ``mask_refresh`` ("graph", "eager", "mixed" or "none"), ``eager_refresh_reasons``
    ({layer: why it is refreshed eagerly}), ``graph_refreshed`` (the layer names refreshed in the graph).
    """

    def __init__(self, model: nn.Module, loss_fn: Callable[..., torch.Tensor], warmup_steps: int = 3,
                 masks_in_graph: bool = False, scale_settle_steps: int = 4) -> None:
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable (loss_fn(model, *inputs) -> loss), got {type(loss_fn).__name__}")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
            raise ValueError(f"warmup_steps must be an int >= 1, got {warmup_steps!r}")
        if not isinstance(masks_in_graph, bool):
            raise TypeError(f"masks_in_graph must be True or False, got {masks_in_graph!r}")
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # DDP's and FSDP2's gradient collectives run from autograd hooks that a replay would skip
            raise RuntimeError("CudaGraphStep does not support data-parallel training (DDP or FSDP2) across "
                               f"{dist.get_world_size()} processes: step eagerly under torchrun")
        self.model, self.loss_fn, self.warmup_steps = model, loss_fn, warmup_steps
        self.masks_in_graph = masks_in_graph
        self.steps = 0
        self.recaptures = 0
        self.scale_recaptures = 0  # captures because a backend's host constants changed (module docstring)
        self._settle = SettledConstants(scale_settle_steps)  # raises on a bad value, naming the argument
        self._constants: tuple = ()  # the backends' host constants the latest capture holds
        self._side: torch.cuda.Stream | None = None  # the eager steps' stream (``_eager``)
        self.eager_steps = 0  # warm-up, a new state's first step, a step whose in-graph masks were not due
        self._layers = dict(sparse_layers(model))
        self._plan: dict[str, str | None] | None = None  # the latest capture's mask_refresh_plan
        self._graph_refresh: list[SparseLinear] = []  # the layers whose refresh the graph holds
        self.graph: torch.cuda.CUDAGraph | None = None
        self._key = None
        self._static_inputs: tuple[torch.Tensor, ...] = ()
        self._static_loss: torch.Tensor | None = None
        self._static_grads: list[tuple[nn.Parameter, torch.Tensor]] = []
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._mvue = mvue_layers(model)
        self._seen_key = None  # the state of the last eager step (a new state gets one before capture)

    # --- checks ---------------------------------------------------------------------------------------
    def _check_inputs(self, inputs: tuple) -> torch.device:
        if not torch.cuda.is_available():
            raise RuntimeError("CudaGraphStep needs a CUDA GPU (torch.cuda.is_available() is False); "
                               "train eagerly on this machine")
        if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
            raise TypeError("the step's inputs must be one or more tensors")
        devices = {t.device for t in inputs} | {p.device for p in self._params}
        if len(devices) != 1 or next(iter(devices)).type != "cuda":
            raise ValueError(f"the inputs and the model must be on one CUDA device, got {sorted(map(str, devices))}")
        return next(iter(devices))

    def _state_key(self, inputs: tuple, plan: dict[str, str | None]) -> tuple:
        """What the captured graph depends on: the inputs' shapes and dtypes, each layer's phase and
        which layers it refreshes."""
        phases = tuple(layer.dense_now for layer in self._layers.values())
        inside = tuple(name for name, reason in plan.items() if reason is None)
        return tuple((tuple(t.shape), t.dtype) for t in inputs), phases, inside

    @property
    def scale_eager_steps(self) -> int:
        """Eager steps run while new host constants settled (module docstring); also in ``eager_steps``."""
        return self._settle.waited

    # --- which mode is in use -------------------------------------------------------------------------
    @property
    def mask_refresh(self) -> str | None:
        """Where the latest capture refreshes the masks: "graph", "eager", "mixed" or "none" (no layer
        tracks its mask); None before the first capture."""
        return None if self._plan is None else refresh_mode(self._plan)

    @property
    def eager_refresh_reasons(self) -> dict[str, str]:
        """{layer name: why it is refreshed eagerly before each replay} of the latest capture."""
        return {name: reason for name, reason in (self._plan or {}).items() if reason is not None}

    @property
    def graph_refreshed(self) -> list[str]:
        """Names of the layers whose mask refresh and flip count the latest capture holds."""
        return [name for name, reason in (self._plan or {}).items() if reason is None]

    # --- the step -------------------------------------------------------------------------------------
    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        device = self._check_inputs(inputs)
        self.steps += 1
        plan = mask_refresh_plan(self.model, self.masks_in_graph)
        key = self._state_key(inputs, plan)
        if self.steps <= self.warmup_steps or (key != self._key and key != self._seen_key):
            # warm-up, or a state (shapes, phase) not stepped yet: one eager step first, so the auto
            # policy's measurements and the algorithm searches never run inside a capture
            self._seen_key = key
            return self._eager(inputs)
        if not all(self._layers[name].mask_due() for name, reason in plan.items() if reason is None):
            # the graph would refresh a mask an eager step leaves alone now (its step did not advance)
            return self._eager(inputs)
        if self.graph is None or key != self._key:
            self._capture(inputs, device, key, plan)
        else:  # a host alpha the graph holds may have changed: wait for the new ones to settle (module docstring)
            action = self._settle.decide(self._constants, self._graph_constants())
            if action == EAGER:
                return self._eager(inputs)
            if action == CAPTURE:
                self.scale_recaptures += 1
                self._capture(inputs, device, key, plan)
        for static, given in zip(self._static_inputs, inputs):
            static.copy_(given)
        refresh_due_masks(self.model, skip=self._graph_refresh)
        fill_seeds(self._mvue)
        self.graph.replay()
        for layer in self._graph_refresh:  # Python counters only: the flips stay on the device until read
            after_graph_refresh(layer)
        for p, grad in self._static_grads:  # a zero_grad(set_to_none=True) between steps must not lose them
            p.grad = grad
        return self._static_loss

    def _eager(self, inputs: tuple) -> torch.Tensor:
        self.eager_steps += 1
        if any(layer.seed_source is not None for layer in self._mvue):
            # after a capture the layers read their seed on the device: write this step's draw, or the
            # eager step would reuse the last replay's seed and fall one draw behind an eager run
            fill_seeds(self._mvue)
        if self._side is None:
            # one side stream for every eager step: the caching allocator keeps freed blocks per stream, so a new
            # stream each step would allocate the whole step afresh and leave the old streams' blocks unused
            self._side = torch.cuda.Stream()
        side = self._side
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), graph_timing(self.model):
            loss = self.loss_fn(self.model, *inputs)
            loss.backward()
        torch.cuda.current_stream().wait_stream(side)
        return loss.detach()

    def _graph_constants(self) -> tuple:
        """Every layer's backend's host constants (``Backend.graph_constants``), in layer order."""
        return tuple(layer.backend.graph_constants() for layer in self._layers.values())

    def _capture(self, inputs: tuple, device: torch.device, key: tuple, plan: dict[str, str | None]) -> None:
        self.graph = None  # free the previous graph's memory pool first
        self._constants = self._graph_constants()
        self._graph_refresh = []
        torch.cuda.synchronize()
        use_device_seeds(self._mvue, device)
        inside = [self._layers[name] for name, reason in plan.items() if reason is None]
        for layer in inside:
            use_graph_flips(layer, device)  # static counts, allocated outside the graph's pool
        refresh_due_masks(self.model, skip=inside)  # the others' refresh for this step; the graph's runs in the replay
        self._static_inputs = tuple(t.detach().clone() for t in inputs)
        for _, layer in sparse_layers(self.model):
            layer.operand_cache.clear()  # the operand must be prepared inside the graph
            layer.operand_in_graph = True  # and the optimizer need not write it (optimizer_operands.operand_request)
        for p in self._params:
            p.grad = None  # the backward allocates the gradients in the graph's pool
        graph = torch.cuda.CUDAGraph()
        mask_steps = [layer.mask_step for layer in inside]
        # the operand each layer's eager steps prepared: with it, a backend that writes mask and operand in one
        # pass (Backend.fuses_refresh_and_prepare) prepares it with the in-graph refresh
        requests = [layer.operand_cache.last_request for layer in inside]
        try:
            with torch.cuda.graph(graph), graph_timing(self.model):
                for layer, request in zip(inside, requests):
                    refresh_mask_in_graph(layer, request)
                    layer.mask_step = layer.step  # captured: the forward below must not refresh it again
                loss = self.loss_fn(self.model, *self._static_inputs)
                loss.backward()
        finally:  # nothing ran yet: the replay's after_graph_refresh advances the counters
            for layer, mask_step in zip(inside, mask_steps):
                layer.mask_step = mask_step
        twice = [layer for layer in self._mvue if not layer.dense_now and layer.seed_source.uses != 1]
        if twice:
            raise RuntimeError(f"{len(twice)} MVUE layer(s) ran {twice[0].seed_source.uses} times in one captured "
                               "step; CudaGraphStep supports each SparseLinear running once per step")
        for _, layer in sparse_layers(self.model):
            layer.operand_cache.clear()  # the captured operand's cache key must not serve an eager call
        self.graph, self._key, self._static_loss = graph, key, loss.detach()
        self._graph_refresh, self._plan = inside, dict(plan)
        self._static_grads = [(p, p.grad) for p in self._params if p.grad is not None]
        self.recaptures += 1

    def release(self) -> None:
        """Drop the graph and go back to eager mode (the layers draw MVUE seeds on the host again; the
        flips counted in the graph join the layers' counts)."""
        self.graph = None
        self._graph_refresh = []
        release_device_seeds(self._mvue)
        for layer in self._layers.values():
            release_graph_flips(layer)
        for _, layer in sparse_layers(self.model):
            layer.operand_in_graph = False
