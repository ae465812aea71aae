"""FSDP2's plain ``fully_shard`` on a sparsified model is refused with a message naming
``fully_shard_sparse`` (it shards the weight but not the mask: masked decay failed inside the step with
"mixed torch.Tensor and DTensor"), at ``attach_optimizer`` and at the first step of a loop without it;
``fully_shard_sparse`` trains. One process in a gloo group, on the CPU."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

import sparsity_lab as sl
from sparsity_lab.distributed import fully_shard_sparse
from sparsity_lab.training_hooks import apply_decay_on_weights, apply_masked_decay, advance_step

fsdp = pytest.importorskip("torch.distributed.fsdp")


@pytest.fixture(scope="module", autouse=True)
def gloo_group(tmp_path_factory):
    if dist.is_initialized():  # a group of the caller's: use it, leave it
        yield
        return
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


def sparse_model(method):
    torch.manual_seed(0)
    return sl.sparsify(Blocks(), method, select="all")


def plain_fully_shard(model):
    for block in model.blocks:
        fsdp.fully_shard(block)
    return fsdp.fully_shard(model)


METHODS = [sl.MaskedDecay(decay=1e-2, total_steps=10), sl.MaskedDecayOnWeights(decay=1e-1, total_steps=10), sl.STE()]


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_attach_optimizer_refuses_a_plain_fully_shard(method):
    model = plain_fully_shard(sparse_model(method))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with pytest.raises(TypeError, match="sharded by torch.distributed.fsdp.fully_shard.*fully_shard_sparse"):
        sl.attach_optimizer(model, opt)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_a_loop_without_attach_optimizer_is_refused_at_its_first_step(method):
    model = plain_fully_shard(sparse_model(method))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with pytest.warns(UserWarning, match="no optimizer is attached"):
        model(torch.randn(8, 16)).square().mean().backward()
    for step_part in (apply_masked_decay, lambda m: apply_decay_on_weights(m, 1e-2), advance_step):
        with pytest.raises(TypeError, match="fully_shard_sparse"):
            step_part(model)
    opt.zero_grad()


def test_fully_shard_sparse_trains():
    model = fully_shard_sparse(sparse_model(sl.MaskedDecay(decay=1e-2, total_steps=10)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sl.attach_optimizer(model, opt)
    for _ in range(2):
        model(torch.randn(8, 16)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    assert all(layer.step == 2 for _, layer in sl.sparse_layers(model))


def test_flip_counts_are_summed_once_a_step_with_no_collective_in_the_forward(monkeypatch):
    """A collective in a layer's forward queues on FSDP2's communicator between its prefetched all-gathers:
    the sharded layers count flips on their rows and sum all layers in one all-reduce after the step."""
    model = fully_shard_sparse(sparse_model(sl.STE()))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-1)
    sl.attach_optimizer(model, opt)
    calls = []
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(tuple(tensor.shape))
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", counting)
    layers = [layer for _, layer in sl.sparse_layers(model)]
    for step in range(3):
        calls.clear()
        model(torch.randn(8, 16)).square().mean().backward()
        assert calls == []  # nothing in the forward or the backward
        opt.step()
        opt.zero_grad()
        # the first mask has nothing to flip against; from the second on, one all-reduce for the four layers
        assert calls == ([] if step == 0 else [(len(layers),)])
    assert all(layer.flips_total >= layer.last_flips >= 0 for layer in layers)
    assert sum(layer.flips_total for layer in layers) > 0  # lr 0.1 moves masks: the sums reached the counts
