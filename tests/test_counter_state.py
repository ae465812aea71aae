"""The counters of the sparse state (steps, mask computations, MVUE draws; FP8 scaling updates) live in
one tensor per module that is updated in place: a state dict taken once (as checkpointers that cache it
do) holds the current counters, and a checkpoint loaded into that dict in place restores them."""
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

import sparsity_lab as sl
from sparsity_lab.methods.fp8_scaling import FP8ScalingState

CONTROLLING = [0, 1, 2, 5, 6]  # step, mask_step, mask_updates, mvue_seed, mvue_calls (flips: diagnostics)


def trained(steps, method=None):
    torch.manual_seed(0)
    model = sl.sparsify(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)),
                        method or sl.SSTE(mvue=True, mask_refresh_interval=2), select="all")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sl.attach_optimizer(model, opt)
    return model, opt


def step(model, opt, n):
    for i in range(n):
        model(torch.randn(8, 16, generator=torch.Generator().manual_seed(i))).square().mean().backward()
        opt.step()
        opt.zero_grad()


def test_a_state_dict_taken_once_follows_the_counters():
    model, opt = trained(0)
    cached = model.state_dict()  # what torchtitan's checkpointer kept and saved at every interval
    step(model, opt, 5)
    for name, layer in sl.sparse_layers(model):
        now = [layer.counters()[k] for k in ("step", "mask_step", "mask_updates", "mvue_seed", "mvue_calls")]
        assert cached[f"{name}._extra_state"][CONTROLLING].tolist() == now == [5, 4, 3, layer.mvue_seed, 5]
    fresh = model.state_dict()  # taking it again reads the flip counts into the same tensor
    for name, layer in sl.sparse_layers(model):
        assert fresh[f"{name}._extra_state"] is cached[f"{name}._extra_state"]
        assert cached[f"{name}._extra_state"].tolist() == list(layer.counters().values())


def test_a_checkpoint_loaded_in_place_restores_the_counters(tmp_path):
    model, opt = trained(0)
    step(model, opt, 3)
    dcp.save(model.state_dict(), checkpoint_id=str(tmp_path), no_dist=True)
    saved = [layer.counters() for _, layer in sl.sparse_layers(model)]
    step(model, opt, 2)
    state = model.state_dict()
    dcp.load(state, checkpoint_id=str(tmp_path), no_dist=True)  # into the state dict's own tensors
    model.load_state_dict(state)
    assert [layer.counters() for _, layer in sl.sparse_layers(model)] == saved


def test_fp8_scaling_updates_follow_in_place():
    scaling = FP8ScalingState()
    cached = scaling.state_dict()
    scaling.advance()
    scaling.advance()
    assert cached["_extra_state"][0].item() == 2  # the update count, then the recipe
    scaling.load_state_dict({**scaling.state_dict(), "_extra_state": torch.tensor([7])})  # an older checkpoint
    assert scaling.updates == 7 and cached["_extra_state"][0].item() == 7


def test_counters_survive_a_copy_and_stay_on_the_cpu():
    import copy

    model, opt = trained(0)
    step(model, opt, 2)
    twin = copy.deepcopy(model).to(torch.float64)
    for (_, a), (_, b) in zip(sl.sparse_layers(model), sl.sparse_layers(twin)):
        assert a.counters() == b.counters() and b.get_extra_state() is not a.get_extra_state()
        assert b.get_extra_state().device.type == "cpu" and b.get_extra_state().dtype == torch.int64
