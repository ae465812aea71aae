"""CudaGraphStep: the device-seed path draws what eager mode draws (CPU, Triton interpreter), the mask
refresh it captures counts what an eager refresh counts (its device work run eagerly on the CPU), bad use
is refused with the reason, and on a GPU a graphed training run equals the eager one step for step."""
import copy
from dataclasses import replace

import pytest
import torch
from torch import nn

import sparsity_lab as sl
from sparsity_lab.backends.cusparselt.backend import CusparseltBackend
from sparsity_lab.backends.cusparselt.fp8_train import FP8Backend
from sparsity_lab.backends.torch_reference import TorchBackend
from sparsity_lab.backends.triton import TritonBackend
from sparsity_lab.graph_flips import GraphFlipCounts
from sparsity_lab.graph_layer import (after_graph_refresh, refresh_mask_in_graph, release_graph_flips,
                                      use_graph_flips)
from sparsity_lab.graph_step import (CudaGraphStep, eager_refresh_reason, fill_seeds, mask_refresh_plan, mvue_layers,
                                     refresh_mode, release_device_seeds, use_device_seeds)
from test_cusparselt_backend import FakeCusparselt, registry  # noqa: F401  (registry: a fixture)


def _mlp(backend: str, device, d: int = 64, seed: int = 0, **method) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(d, 2 * d, bias=False), nn.GELU(), nn.Linear(2 * d, d, bias=False)).to(device)
    sl.sparsify(model, sl.SSTE(**{"mvue": True, "transposable": True, "backend": backend, **method}), select="all")
    return model


def _train(model, batches, step_fn, lr=1e-2):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sl.attach_optimizer(model, opt)
    losses = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        losses.append(float(step_fn(model, x, y)))
        opt.step()
    return losses


def _loss(model, x, y):
    return (model(x) - y).float().square().mean()


def _eager_step(model, x, y):
    loss = _loss(model, x, y)
    loss.backward()
    return loss.detach()


@pytest.mark.triton
def test_device_seeds_draw_what_eager_draws():
    """Two copies of a model, one eager and one reading its MVUE seeds from device tensors that
    fill_seeds writes each step (run eagerly here: the interpreter cannot capture): the same losses,
    weights and draw counters, bit for bit."""
    eager = _mlp("triton", "cpu")
    seeded = copy.deepcopy(eager)  # the copy shares the process's backend object
    assert seeded[0].backend is eager[0].backend and seeded[0].mvue_seed == eager[0].mvue_seed
    layers = mvue_layers(seeded)
    use_device_seeds(layers, torch.device("cpu"))
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 64, generator=gen), torch.randn(32, 64, generator=gen)) for _ in range(3)]

    def seeded_step(model, x, y):
        fill_seeds(layers)
        return _eager_step(model, x, y)

    assert _train(eager, batches, _eager_step) == _train(seeded, batches, seeded_step)
    for a, b in zip(eager.parameters(), seeded.parameters()):
        assert torch.equal(a, b)
    assert [l.mvue_calls for _, l in sl.sparse_layers(eager)] == [l.mvue_calls for l in layers] == [3, 3]
    assert all(l.seed_source.uses == 3 for l in layers)
    release_device_seeds(layers)
    assert all(l.seed_source is None for l in layers)


@pytest.mark.triton
def test_a_wrong_seed_would_show():
    """The check above can fail: a device seed that is not the eager one changes the gradient."""
    eager = _mlp("triton", "cpu")
    seeded = copy.deepcopy(eager)
    layers = mvue_layers(seeded)
    use_device_seeds(layers, torch.device("cpu"))
    for layer in layers:
        layer.seed_source.tensor.fill_(12345)
    for model in (eager, seeded):
        for _, layer in sl.sparse_layers(model):
            layer.attached_optimizer = True  # products only here: no optimizer, no warning
    x, y = torch.randn(32, 64), torch.randn(32, 64)
    _eager_step(eager, x, y)
    _eager_step(seeded, x, y)
    assert not torch.equal(eager[0].weight.grad, seeded[0].weight.grad)


def test_host_drawing_backend_is_refused():
    layers = mvue_layers(_mlp("torch", "cpu"))
    with pytest.raises(ValueError, match="reads_seed_from_device.*runs 'torch', which draws on the host"):
        use_device_seeds(layers, torch.device("cpu"))
    assert all(layer.seed_source is None for layer in layers)


def test_bad_arguments_and_no_gpu_are_named():
    model = _mlp("torch", "cpu")
    with pytest.raises(TypeError, match="loss_fn"):
        CudaGraphStep(model, "not callable")
    with pytest.raises(ValueError, match="warmup_steps"):
        CudaGraphStep(model, _loss, warmup_steps=0)
    with pytest.raises(TypeError, match="masks_in_graph"):
        CudaGraphStep(model, _loss, masks_in_graph="yes")
    step = CudaGraphStep(model, _loss)
    assert not step.masks_in_graph and step.mask_refresh is None and step.graph_refreshed == []  # eager by default
    assert CudaGraphStep(model, _loss, masks_in_graph=True).masks_in_graph
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            CudaGraphStep(model, _loss)(torch.randn(4, 64), torch.randn(4, 64))


# --- the mask refresh inside the graph: its host logic, and its device work run eagerly on the CPU -----
class _CapturableTorch(TorchBackend):
    """The reference backend declaring capturable mask kernels: the plan's rule without a GPU."""
    name = "torch_capturable"
    mask_refresh_capturable = True


def test_a_layer_in_its_dense_phase_gets_no_seed():
    """An eager step in the dense fine-tune phase draws no MVUE numbers, so the graph step writes no seed
    for that layer (its draw counter stays where an eager run leaves it)."""
    class DeviceSeedTorch(TorchBackend):
        reads_seed_from_device = True

        def device_seed_value(self, generator):
            return int(torch.randint(0, 2**31, (1,), generator=generator))

    model = _mlp("torch", "cpu", dense_finetune_at=0.5, total_steps=2)
    layers = mvue_layers(model)
    for layer in layers:
        layer.backend = DeviceSeedTorch()
    use_device_seeds(layers, torch.device("cpu"))
    layers[1].step = 1  # its dense phase
    fill_seeds(layers)
    assert [layer.mvue_calls for layer in layers] == [1, 0] and layers[0].seed_source.tensor.item() != 0


def test_backends_declare_whether_a_graph_can_capture_their_mask_refresh():
    assert TritonBackend.mask_refresh_capturable and CusparseltBackend.mask_refresh_capturable
    assert FP8Backend.mask_refresh_capturable
    assert not TorchBackend.mask_refresh_capturable  # its transposable solvers may run on the host


def test_graph_flip_counts_hand_over_snapshots_that_later_replays_leave_alone():
    counts = GraphFlipCounts("cpu")
    assert counts.take() is None  # nothing replayed yet
    for flips in (3, 5):  # two replays nobody read in between
        counts.record(torch.tensor(flips))
        counts.replayed()
    latest, since = counts.take()
    counts.record(torch.tensor(7))  # the next replay overwrites counts[0] and adds to counts[1] ...
    counts.replayed()
    assert (int(latest), int(since)) == (5, 8)  # ... but not what was taken
    assert [int(t) for t in counts.take()] == [7, 7]
    assert counts.take() is None
    counts.record(torch.tensor(2))
    counts.replayed()
    counts.discard()  # e.g. a checkpoint loaded: its counters replace these
    assert counts.take() is None
    counts.record(torch.tensor(1))
    counts.replayed()
    assert [int(t) for t in counts.take()] == [1, 1]


def test_the_plan_names_why_a_layer_is_refreshed_eagerly():
    model = _mlp("torch", "cpu")
    assert set(mask_refresh_plan(model).values()) == {"masks_in_graph=False"}  # the default
    plan = mask_refresh_plan(model, masks_in_graph=True)
    assert list(plan) == ["0", "2"] and all("backend 'torch'" in reason for reason in plan.values())
    assert refresh_mode(plan) == "eager"
    first, second = (layer for _, layer in sl.sparse_layers(model))
    for layer in (first, second):
        layer.backend = _CapturableTorch()
    in_graph = mask_refresh_plan(model, masks_in_graph=True)
    assert in_graph == {"0": None, "2": None} and refresh_mode(in_graph) == "graph"
    assert set(mask_refresh_plan(model, masks_in_graph=False).values()) == {"masks_in_graph=False"}
    second.method = replace(second.method, mask_refresh_interval=3)
    plan = mask_refresh_plan(model, masks_in_graph=True)
    assert plan["0"] is None and "mask_refresh_interval 3" in plan["2"] and refresh_mode(plan) == "mixed"
    second.method = replace(second.method, mask_refresh_interval=1, dense_finetune_at=0.5, total_steps=2)
    second.step = 1  # the dense fine-tune phase: no mask computed, so not in the plan
    assert mask_refresh_plan(model, masks_in_graph=True) == {"0": None}
    first.mask_updates = 0
    assert "no previous mask" in eager_refresh_reason(first, masks_in_graph=True)
    first.mask_updates = 1

    class OwnFlipCount(sl.SparseLinear):  # as a sharded layer: its own hooks (collectives) stay eager
        def _replace_mask(self, new, count):
            return super()._replace_mask(new, count)
    first.__class__ = OwnFlipCount
    assert "OwnFlipCount overrides the mask refresh" in eager_refresh_reason(first, masks_in_graph=True)
    first.__class__ = sl.SparseLinear
    first.method = replace(first.method, m=8, mvue=False)
    assert "2:8 masks" in eager_refresh_reason(first, masks_in_graph=True)
    first.method = replace(first.method, m=4, dense_finetune_at=0.5, total_steps=2)
    first.step = 1  # both layers in the dense phase now
    assert mask_refresh_plan(model, masks_in_graph=True) == {} and refresh_mode({}) == "none"


def _replay_refresh(layers):
    """What a replay of a graph holding the refresh does, run eagerly: the captured device work, then
    the host's bookkeeping (CudaGraphStep.__call__ does the same around ``graph.replay()``)."""
    for layer in layers:
        refresh_mask_in_graph(layer)
    for layer in layers:
        after_graph_refresh(layer)


def _flip_state(model):
    return [(l.mask_updates, l.mask_step, l.last_flips, l.flips_total,
             l.last_flip_rate if l.mask_updates >= 2 else None)  # NaN before the second mask: never == itself
            for _, l in sl.sparse_layers(model)]


@pytest.mark.parametrize("schedule", ["EGGGGGGG", "EGGEEGGE", "EEGGGGGG"])
@pytest.mark.parametrize("reads", [(), (0, 2, 3, 6), tuple(range(8))])
def test_refresh_in_the_graph_counts_what_an_eager_refresh_counts(schedule, reads):
    """Eight steps of two copies: one refreshes every mask eagerly (in its forward), the other runs the
    in-graph refresh's device work and bookkeeping on the steps marked G (eager on E; the first step has
    no refresh due, the mask comes from sparsify), with the counters read after the steps in ``reads``
    only (a read settles the device counts; unread replays pile up).
    Masks, losses and every counter identical, and flips on most steps (a lost refresh would show)."""
    eager = _mlp("torch", "cpu", mvue=False)
    graphed = copy.deepcopy(eager)
    layers = [layer for _, layer in sl.sparse_layers(graphed)]
    for layer in layers:
        use_graph_flips(layer, torch.device("cpu"))
    opts = [torch.optim.SGD(m.parameters(), lr=1.0) for m in (eager, graphed)]
    for model, opt in zip((eager, graphed), opts):
        sl.attach_optimizer(model, opt)
    gen = torch.Generator().manual_seed(2)
    flips_per_step = []
    for k, mode in enumerate(schedule):
        x, y = torch.randn(32, 64, generator=gen), torch.randn(32, 64, generator=gen)
        if mode == "G":
            assert all(layer.mask_due() for layer in layers)
            _replay_refresh(layers)  # the forward below finds the masks fresh
        losses = []
        for model, opt in zip((eager, graphed), opts):
            opt.zero_grad(set_to_none=True)
            losses.append(float(_eager_step(model, x, y)))
            opt.step()
        assert losses[0] == losses[1]
        for (_, a), b in zip(sl.sparse_layers(eager), layers):
            assert torch.equal(a.mask, b.mask)
        if k in reads:
            assert _flip_state(graphed) == _flip_state(eager)
        flips_per_step.append(eager[0].last_flips)
    assert _flip_state(graphed) == _flip_state(eager)
    assert eager[0].mask_updates == len(schedule) and sum(f > 0 for f in flips_per_step) >= len(schedule) - 2


@pytest.mark.triton
def test_in_graph_refresh_prepares_the_operand_the_forward_uses(registry, monkeypatch):
    """On cuSPARSELt (products by a CPU stand-in, the Triton kernels in the interpreter) the captured refresh
    writes the mask, its flips and both compressed operands in one pass (kernel 21), in the dtype the eager
    steps used, and the layer's forward takes that operand instead of preparing one. Run eagerly here in the
    order a capture and its replay run it: three steps equal an eager copy's to the bit."""
    from sparsity_lab.backends.cusparselt import operand

    monkeypatch.setattr(operand, "_triton_device", lambda t: True)
    backend = CusparseltBackend(ops=FakeCusparselt())
    registry.register_backend("cusparselt_cpu", lambda: backend)
    eager = _mlp("cusparselt_cpu", "cpu").to(torch.bfloat16)
    graphed = copy.deepcopy(eager)
    layers = [layer for _, layer in sl.sparse_layers(graphed)]
    for layer in layers:
        use_graph_flips(layer, torch.device("cpu"))
    opts = [torch.optim.SGD(m.parameters(), lr=1.0) for m in (eager, graphed)]
    for model, opt in zip((eager, graphed), opts):
        sl.attach_optimizer(model, opt)
    gen = torch.Generator().manual_seed(4)
    for k in range(3):
        x, y = (torch.randn(32, 64, generator=gen).to(torch.bfloat16) for _ in range(2))
        in_graph = k > 0  # step 0 has no refresh due (the mask comes from sparsify)
        if in_graph:  # the capture: the refresh first, then the forward finds the mask fresh
            mask_steps = [l.mask_step for l in layers]
            prepared = [l.operand_cache.prepare_count for l in layers]
            fused = backend.stats["fused_refreshes"]
            assert [l.operand_cache.last_request for l in layers] == [(torch.bfloat16, True)] * 2
            for layer in layers:
                refresh_mask_in_graph(layer, layer.operand_cache.last_request)
                layer.mask_step = layer.step
        losses = []
        for model, opt in zip((eager, graphed), opts):
            opt.zero_grad(set_to_none=True)
            losses.append(_eager_step(model, x, y))
        if in_graph:  # one preparation per layer, the refresh's: the forward prepared nothing more
            assert [l.operand_cache.prepare_count for l in layers] == [p + 1 for p in prepared]
            assert backend.stats["fused_refreshes"] == fused + 4  # two layers, in the graph and in the eager copy
            for layer, mask_step in zip(layers, mask_steps):
                layer.mask_step = mask_step
                after_graph_refresh(layer)  # the replay's bookkeeping
        assert torch.equal(losses[0], losses[1]), k
        for opt in opts:
            opt.step()
        for (_, a), b in zip(sl.sparse_layers(eager), layers):
            assert torch.equal(a.mask, b.mask) and torch.equal(a.weight, b.weight), k
    assert _flip_state(graphed) == _flip_state(eager) and eager[0].flips_total > 0


def test_in_graph_refresh_needs_its_counts_and_a_previous_mask():
    layer = sl.sparse_layers(_mlp("torch", "cpu"))[0][1]
    with pytest.raises(RuntimeError, match="use_graph_flips"):
        refresh_mask_in_graph(layer)
    use_graph_flips(layer, torch.device("cpu"))
    layer.mask_updates = 0
    with pytest.raises(RuntimeError, match="mask_updates 0"):
        refresh_mask_in_graph(layer)


def test_a_loaded_checkpoint_replaces_the_counts_of_unread_replays():
    model = _mlp("torch", "cpu", mvue=False)
    saved = copy.deepcopy(model.state_dict())
    layers = [layer for _, layer in sl.sparse_layers(model)]
    for layer in layers:
        use_graph_flips(layer, torch.device("cpu"))
        layer.weight.data.normal_()  # new weights: the next refresh flips
        layer.step += 1
    _replay_refresh(layers)
    model.load_state_dict(saved)
    assert [(l.mask_updates, l.last_flips, l.flips_total) for l in layers] == [(1, 0, 0), (1, 0, 0)]
    for layer in layers:
        layer.weight.data.normal_()
        layer.step += 1
    _replay_refresh(layers)  # counted again from here
    assert all(l.mask_updates == 2 and l.flips_total == l.last_flips > 0 for l in layers)


@pytest.mark.parametrize("with_graph_flips", [False, True])
def test_a_layer_pickled_in_the_older_layout_still_counts(with_graph_flips):
    """Pickled when the flip counts, the operand cache and the device seed were plain attributes of the
    layer (and, older still, before it had graph flip counts): it unpickles with its counts and counts on."""
    import pickle
    layer = sl.sparse_layers(_mlp("torch", "cpu"))[0][1]
    state = layer.__getstate__()
    for name in ("flip_counts", "operand_cache", "seed_source"):
        del state[name]
    state.update(_last_flips=3, _flips_total=7, _pending_sum=None, _pending_last=None, _operand_cache=None,
                 prepare_count=2, _device_seed=None, _device_seed_uses=0)
    if with_graph_flips:
        state["_graph_flips"] = None
    old = sl.SparseLinear.__new__(sl.SparseLinear)
    old.__setstate__(pickle.loads(pickle.dumps(state)))
    assert (old.last_flips, old.flips_total, old.operand_cache.prepare_count) == (3, 7, 2)
    old.weight.data.normal_()
    old.refresh_mask()
    assert old.flips_total == 7 + old.last_flips and old.last_flips > 0


def test_release_hands_unread_replays_to_the_eager_counts():
    model = _mlp("torch", "cpu", mvue=False)
    layer = sl.sparse_layers(model)[0][1]
    use_graph_flips(layer, torch.device("cpu"))
    layer.weight.data.normal_()
    layer.step += 1
    _replay_refresh([layer])
    first = int((layer.mask ^ layer.backend.mask(layer.weight, 2, 4, True)).sum())  # 0: the refresh ran
    release_graph_flips(layer)
    assert first == 0 and layer.last_flips == layer.flips_total > 0 and layer.mask_updates == 2


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cusparselt", "triton"])
def test_graphed_training_equals_eager_on_gpu(backend):
    """Ten steps (three eager warm-up, one capture, replays) against ten eager steps: the same losses
    and weights, and the same MVUE draw counters (a resumed run continues identically)."""
    eager = _mlp(backend, "cuda", d=256).to(torch.bfloat16)
    graphed = copy.deepcopy(eager)
    gen = torch.Generator(device="cuda").manual_seed(3)
    batches = [(torch.randn(512, 256, device="cuda", generator=gen).to(torch.bfloat16),
                torch.randn(512, 256, device="cuda", generator=gen).to(torch.bfloat16)) for _ in range(10)]
    step = CudaGraphStep(graphed, _loss, warmup_steps=3)
    want = _train(eager, batches, _eager_step)
    got = _train(graphed, batches, lambda model, x, y: step(x, y))
    assert step.recaptures == 1 and step.graph is not None
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-3, atol=1e-5)
    for a, b in zip(eager.parameters(), graphed.parameters()):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-3)
    assert [l.mvue_calls for _, l in sl.sparse_layers(eager)] == [l.mvue_calls for _, l in sl.sparse_layers(graphed)]
    assert [l.mask_updates for _, l in sl.sparse_layers(eager)] == [l.mask_updates for _, l in sl.sparse_layers(graphed)]
    assert [l.flips_total for _, l in sl.sparse_layers(eager)] == [l.flips_total for _, l in sl.sparse_layers(graphed)]


@pytest.mark.gpu
def test_a_new_shape_after_a_capture_draws_what_eager_draws():
    """Captured steps, then one eager step on a new shape (before its capture), then a replay of the
    new shape: MVUE draws, losses and weights as in an all-eager run (the eager step in between
    must write its own seed, not reuse the last replay's)."""
    eager = _mlp("triton", "cuda", d=256).to(torch.bfloat16)
    graphed = copy.deepcopy(eager)
    gen = torch.Generator(device="cuda").manual_seed(5)

    def batch(tokens):
        return (torch.randn(tokens, 256, device="cuda", generator=gen).to(torch.bfloat16),
                torch.randn(tokens, 256, device="cuda", generator=gen).to(torch.bfloat16))
    batches = [batch(512) for _ in range(4)] + [batch(256) for _ in range(3)]
    step = CudaGraphStep(graphed, _loss, warmup_steps=2)
    want = _train(eager, batches, _eager_step)
    got = _train(graphed, batches, lambda model, x, y: step(x, y))
    assert step.recaptures == 2
    assert [l.mvue_calls for _, l in sl.sparse_layers(eager)] == [l.mvue_calls for _, l in sl.sparse_layers(graphed)]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-3, atol=1e-5)
    for a, b in zip(eager.parameters(), graphed.parameters()):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-3)


@pytest.mark.gpu
def test_auto_under_graph_step_times_in_graphs_and_steps_eagerly_on_a_new_shape():
    model = _mlp("cusparselt_auto", "cuda", d=256).to(torch.bfloat16)
    step = CudaGraphStep(model, _loss, warmup_steps=2)
    gen = torch.Generator(device="cuda").manual_seed(4)

    def batch(tokens):
        return (torch.randn(tokens, 256, device="cuda", generator=gen).to(torch.bfloat16),
                torch.randn(tokens, 256, device="cuda", generator=gen).to(torch.bfloat16))
    losses = _train(model, [batch(512) for _ in range(4)], lambda m, x, y: step(x, y))
    assert step.recaptures == 1
    backend = sl.sparse_layers(model)[0][1].backend
    assert backend.timing == "eager"  # restored after each step
    graph_timed = [d for d in backend.summary()["decisions"] if d["timing"] == "graph" and d["n"] in (256, 512)]
    assert graph_timed and all("in a CUDA graph" in d["reason"] for d in graph_timed)
    x, y = batch(256)  # a new shape: one eager step (decisions, searches), then a capture
    losses.append(float(step(x, y)))
    assert step.recaptures == 1
    for _, layer in sl.sparse_layers(model):  # what the attached optimizer's step does to the layers:
        layer.advance_step()                  # the masks are due again (else the call runs eagerly)
    losses.append(float(step(x, y)))
    assert step.recaptures == 2
    assert all(torch.isfinite(torch.tensor(losses)))


# --- GPU: the mask refresh inside the graph against eager training ---------------------------------
def _layers(model):
    return [layer for _, layer in sl.sparse_layers(model)]


def _counters(model):
    return [(l.mask_updates, l.mask_step, l.last_flips, l.flips_total) for l in _layers(model)]


def _train_checked(model, batches, step_fn, lr=0.1, reads=(), skip_updates=()):
    """``_train``, checking after every step (before the update) that each mask refreshed in that step
    is the mask its backend computes from the weights the step used, and after the 1-based steps in
    ``reads`` that ``last_flips`` counts the flips of that refresh. Steps in ``skip_updates`` skip the
    optimizer step (as a GradScaler does on inf), so the layers' step does not advance.
    Returns (losses, {step: counters read})."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sl.attach_optimizer(model, opt)
    losses, seen = [], {}
    for k, (x, y) in enumerate(batches, start=1):
        before = [(l.mask.clone(), l.mask_updates) for l in _layers(model)]
        opt.zero_grad(set_to_none=True)
        losses.append(float(step_fn(model, x, y)))
        for layer, (old, updates) in zip(_layers(model), before):
            if layer.mask_updates > updates:  # refreshed in this step
                m = layer.method
                assert torch.equal(layer.mask, layer.backend.mask(layer.weight.detach(), m.n, m.m, m.transposable))
                if k in reads:
                    assert layer.last_flips == int((layer.mask ^ old).sum())
        if k in reads:
            seen[k] = _counters(model)
        if k not in skip_updates:
            opt.step()
    return losses, seen


def _graphed_against_eager(backend, steps=10, in_graph=True, skip_updates=(), reads=(4, 5, 10), **method):
    """(eager model, graphed model, CudaGraphStep, eager reads, graphed reads), after ``steps`` steps of
    each (three eager warm-up steps under the graph step), with the losses and weights checked equal."""
    eager = _mlp(backend, "cuda", d=256, **method).to(torch.bfloat16)
    graphed = copy.deepcopy(eager)
    gen = torch.Generator(device="cuda").manual_seed(7)
    batches = [(torch.randn(512, 256, device="cuda", generator=gen).to(torch.bfloat16),
                torch.randn(512, 256, device="cuda", generator=gen).to(torch.bfloat16)) for _ in range(steps)]
    step = CudaGraphStep(graphed, _loss, warmup_steps=3, masks_in_graph=in_graph)
    want, want_seen = _train_checked(eager, batches, _eager_step, reads=reads, skip_updates=skip_updates)
    got, got_seen = _train_checked(graphed, batches, lambda model, x, y: step(x, y), reads=reads,
                                   skip_updates=skip_updates)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-3, atol=1e-5)
    for a, b in zip(eager.parameters(), graphed.parameters()):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-3)
    return eager, graphed, step, want_seen, got_seen


def _same_masks_and_counters(eager, graphed, want_seen, got_seen):
    assert got_seen == want_seen  # read after the first replay, the next one, and after five unread replays
    for a, b in zip(_layers(eager), _layers(graphed)):
        assert torch.equal(a.mask, b.mask)
        assert a.counters() == b.counters()  # mask_updates, mask_step, last_flips, flips_total, MVUE draws
    assert sum(l.flips_total for l in _layers(eager)) > 0  # masks moved: a refresh left out would show


# CUTLASS's products (and kernel 24's refresh in CUTLASS's layout) need a Hopper GPU
_CUTLASS = pytest.param("cutlass", marks=pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)), reason="needs a Hopper GPU (sm_90)"))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cusparselt", _CUTLASS])
@pytest.mark.parametrize("interval,in_graph,mode", [(1, True, "graph"), (3, True, "eager"), (1, False, "eager")])
def test_mask_refresh_under_the_graph_equals_eager_on_gpu(backend, interval, in_graph, mode):
    """S-STE + MVUE, ten steps: masks due every step refreshed inside the graph (interval 1), or eagerly
    before each replay (interval 3, and masks_in_graph=False): the same losses and weights as ten eager
    steps, the same masks bit for bit, the same mask updates, last flips and flip totals."""
    start = _mlp(backend, "cuda", d=256, mask_refresh_interval=interval)
    start_masks = [l.mask.clone() for l in _layers(start)]
    eager, graphed, step, want_seen, got_seen = _graphed_against_eager(backend, in_graph=in_graph,
                                                                       mask_refresh_interval=interval)
    assert step.recaptures == 1 and step.eager_steps == 3 and step.mask_refresh == mode
    assert step.graph_refreshed == (["0", "2"] if mode == "graph" else [])
    if mode == "eager":
        assert set(step.eager_refresh_reasons) == {"0", "2"}
    _same_masks_and_counters(eager, graphed, want_seen, got_seen)
    assert all(l.mask_updates == 1 + 9 // interval for l in _layers(graphed))
    assert any(not torch.equal(s, l.mask) for s, l in zip(start_masks, _layers(graphed)))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cusparselt"])
def test_a_step_whose_in_graph_masks_are_not_due_runs_eagerly_on_gpu(backend):
    """An optimizer step skipped after a replay (the layers' step does not advance): the next call's masks
    are not due, an eager step leaves them alone, so the graph step steps eagerly instead of replaying."""
    eager, graphed, step, want_seen, got_seen = _graphed_against_eager(backend, skip_updates=(5,), reads=(4, 5, 6, 10))
    assert step.recaptures == 1 and step.eager_steps == 4 and step.mask_refresh == "graph"
    _same_masks_and_counters(eager, graphed, want_seen, got_seen)
    assert all(l.mask_updates == 9 for l in _layers(graphed))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cusparselt", _CUTLASS])
def test_the_in_graph_refresh_writes_mask_and_operand_in_one_pass_on_gpu(backend):
    """The capture of a step that refreshes the masks inside the graph: each layer's refresh is one kernel 21
    (cuSPARSELt) or kernel 24 (CUTLASS) call that also writes the operand, which the captured forward takes (no
    kernel 11 or 22 captured); eager steps before it do the same in their forwards. (The results equal eager
    mode: test_mask_refresh_under_the_graph_equals_eager_on_gpu.)"""
    model = _mlp(backend, "cuda", d=256).to(torch.bfloat16)
    backend = model[0].backend
    step = CudaGraphStep(model, _loss, warmup_steps=3, masks_in_graph=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sl.attach_optimizer(model, opt)
    gen = torch.Generator(device="cuda").manual_seed(5)
    deltas = []
    for _ in range(5):
        x, y = (torch.randn(512, 256, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
        before = (backend.stats["fused_refreshes"], backend.stats["fused_prepares"])
        opt.zero_grad(set_to_none=True)
        step(x, y)
        opt.step()
        deltas.append((backend.stats["fused_refreshes"] - before[0], backend.stats["fused_prepares"] - before[1]))
    assert step.recaptures == 1 and step.mask_refresh == "graph"
    # step 1: no refresh due, kernel 11 / 22 prepares; 2-3: eager refreshes with the operand; 4: the capture; 5: a replay
    assert deltas == [(0, 2), (2, 0), (2, 0), (2, 0), (0, 0)], deltas


@pytest.mark.gpu
def test_the_dense_finetune_switch_recaptures_without_the_refresh_on_gpu():
    """Dense fine-tune from step 5 of 10: the first graph refreshes the masks inside, the switch takes
    one eager step and a new capture that refreshes none; counters and weights as in eager training."""
    eager, graphed, step, want_seen, got_seen = _graphed_against_eager(
        "triton", reads=(4, 5, 8, 10), dense_finetune_at=0.5, total_steps=10)
    assert step.recaptures == 2 and step.eager_steps == 4 and step.mask_refresh == "none"
    _same_masks_and_counters(eager, graphed, want_seen, got_seen)
    assert all(l.mask_updates == 5 and l.dense_now for l in _layers(graphed))


@pytest.mark.gpu
def test_eager_steps_share_one_side_stream_and_reuse_the_cached_memory_on_gpu():
    """Eager steps of a CudaGraphStep (its warm-up here) run on one side stream: the caching allocator keeps freed
    blocks per stream, so a stream per step would allocate every step afresh and the reserved memory would grow
    by a step's worth each time (a cudaMalloc per tensor, and a free-all-and-retry once the card fills)."""
    model = _mlp("triton", "cuda", d=256).to(torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(4096, 256, device="cuda", generator=gen).to(torch.bfloat16)
    y = torch.randn(4096, 256, device="cuda", generator=gen).to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    sl.attach_optimizer(model, opt)
    step = CudaGraphStep(model, _loss, warmup_steps=8)
    reserved, streams = [], set()
    for _ in range(8):
        opt.zero_grad(set_to_none=True)
        step(x, y)
        opt.step()
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
        streams.add(step._side.stream_id)
    assert step.eager_steps == 8 and len(streams) == 1
    assert reserved[-1] == reserved[1], reserved  # from the second step on, every block comes from the cache
