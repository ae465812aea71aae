"""CudaGraphStep: the device-seed path draws what eager mode draws (CPU, Triton interpreter), bad use
is refused with the reason, and on a GPU a graphed training run equals the eager one step for step."""
import copy

import pytest
import torch
from torch import nn

import sparsity_lab as sl
from sparsity_lab.graph_step import CudaGraphStep, fill_seeds, mvue_layers, release_device_seeds, use_device_seeds


def _mlp(backend: str, device, d: int = 64, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(d, 2 * d, bias=False), nn.GELU(), nn.Linear(2 * d, d, bias=False)).to(device)
    sl.sparsify(model, sl.SSTE(mvue=True, transposable=True, backend=backend), select="all")
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
    assert all(l.device_seed_uses == 3 for l in layers)
    release_device_seeds(layers)
    assert all(l.device_seed is None for l in layers)


@pytest.mark.triton
def test_a_wrong_seed_would_show():
    """The check above can fail: a device seed that is not the eager one changes the gradient."""
    eager = _mlp("triton", "cpu")
    seeded = copy.deepcopy(eager)
    layers = mvue_layers(seeded)
    use_device_seeds(layers, torch.device("cpu"))
    for layer in layers:
        layer.device_seed.fill_(12345)
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
    assert all(layer.device_seed is None for layer in layers)


def test_bad_arguments_and_no_gpu_are_named():
    model = _mlp("torch", "cpu")
    with pytest.raises(TypeError, match="loss_fn"):
        CudaGraphStep(model, "not callable")
    with pytest.raises(ValueError, match="warmup_steps"):
        CudaGraphStep(model, _loss, warmup_steps=0)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            CudaGraphStep(model, _loss)(torch.randn(4, 64), torch.randn(4, 64))


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
    losses.append(float(step(x, y)))
    assert step.recaptures == 2
    assert all(torch.isfinite(torch.tensor(losses)))
