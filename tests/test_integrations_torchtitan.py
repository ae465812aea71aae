"""2:4 training in torchtitan 0.3, driven through torchtitan's own pieces on the CPU: its config parser, its
Llama 3 debug model (2 layers, causal SDPA attention) built from configs on the meta device with our converter, initialised by
its ``init_weights``; its optimizer and LR-scheduler containers, its checkpointer (save, then resume in a
fresh model) and, in 2 processes over gloo, its FSDP2 (``parallelize_llama``)."""
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

pytest.importorskip("torchtitan.protocols.model", reason="the integration needs torchtitan 0.3")

from sparsity_lab.integrations.torchtitan_train import install_compat  # noqa: E402

install_compat()  # torchtitan 0.3.0 imports a name torch 2.11 lacks: supplied as the launcher does

from torchtitan.components.checkpointer import CheckpointManager  # noqa: E402
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw  # noqa: E402
from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.models.common.attention import ScaledDotProductAttention  # noqa: E402
from torchtitan.models.llama3 import model_registry  # noqa: E402

import sparsity_lab as sl  # noqa: E402
from sparsity_lab.integrations import torchtitan as tt  # noqa: E402
from sparsity_lab.training_hooks import sparse_layers  # noqa: E402

STEPS, VOCAB = 4, 2048


def model_config(method=None):
    """torchtitan's Llama 3 debug model config (2 of its 6 layers), 2:4 when method is given."""
    config = model_registry("debugmodel").model
    config.layers = config.layers[:2]
    for layer in config.layers:  # flex attention has no backward on the CPU: causal SDPA (no masks)
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    if method is not None:
        config = tt.Sparsity24Converter.Config(method=method).build().convert(config)
    return config


def built(config, seed=0):
    """What torchtitan's trainer does: build on meta, verify the Module protocol, to_empty, init_weights."""
    with torch.device("meta"):
        model = config.build()
    model.verify_module_protocol()
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model.train()


def batch(i, rows=4, length=17):
    return torch.randint(0, VOCAB, (rows, length), generator=torch.Generator().manual_seed(i))


def optimizers_of(model):
    optimizers = default_adamw(lr=1e-3).build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=optimizers, training_steps=STEPS)
    return optimizers, schedulers


def train(model, optimizers, schedulers, steps, first=0, rows=slice(None), share=1, clip=True):
    """share: this process's part of a batch split over processes whose gradients are summed (FSDP2)."""
    losses = []
    for i in range(first, first + steps):
        x = batch(i)[rows]
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1).float(), x[:, 1:].flatten())
        (loss * share).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
        optimizers.step()
        schedulers.step()
        optimizers.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("method", [sl.SSTE(mvue=True), sl.SRSTE(transposable=True, mask_refresh_interval=2),
                                    sl.MaskedDecay(decay=1e-2, total_steps=STEPS, dense_finetune_at=0.75)], ids=lambda m: m.name)
def test_torchtitans_build_and_step_equal_sparsify_and_attach_optimizer(method):
    model = built(model_config(method))
    names = [name for name, _ in sparse_layers(model)]
    assert names == [f"layers.{i}.feed_forward.{w}" for i in range(2) for w in ("w1", "w2", "w3")]
    assert all(type(m) is not sl.SparseLinear and "attention" not in n for n, m in sparse_layers(model))
    seeds = [layer.mvue_seed for _, layer in sparse_layers(model)]
    optimizers, schedulers = optimizers_of(model)
    tt.attach([model], optimizers)
    losses = train(model, optimizers, schedulers, STEPS)
    assert all(layer.step == STEPS for _, layer in sparse_layers(model))

    # the dense debug model, same initial weights, made 2:4 by hand with the lab's own hooks
    reference = built(model_config())
    for name in names:  # torchtitan's Linear subclasses nn.Linear, which sparsify leaves alone: by hand
        parent, _, child = name.rpartition(".")
        setattr(reference.get_submodule(parent), child,
                sl.SparseLinear.from_linear(reference.get_submodule(name), method))
    fresh = built(model_config(method))  # ours again, before training
    for (_, a), (_, b), seed in zip(sparse_layers(fresh), sparse_layers(reference), seeds):
        assert torch.equal(a.weight, b.weight) and torch.equal(a.mask, b.mask) and torch.equal(a.beta, b.beta)
        assert a.counters() == {**b.counters(), "mvue_seed": a.mvue_seed}
        b.mvue_seed = seed  # the reference draws MVUE as the trained model did
    ref_opt, ref_sched = optimizers_of(reference)
    sl.attach_optimizer(reference, ref_opt.optimizers[0])
    assert losses == train(reference, ref_opt, ref_sched, STEPS)
    for (_, a), (_, b) in zip(sparse_layers(model), sparse_layers(reference)):
        assert torch.equal(a.mask, b.mask) and torch.equal(a.weight, b.weight) and a.counters() == b.counters()


class TrainState:
    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


def checkpointer(model, optimizers, schedulers, folder):
    config = CheckpointManager.Config(enable=True, folder="checkpoint", interval=2)
    return config.build(dataloader=None, model_parts=[model], optimizers=optimizers, lr_schedulers=schedulers,
                        states={"train_state": TrainState()}, sd_adapter=None, base_folder=str(folder))


def test_torchtitans_checkpointer_resumes_the_sparse_state_exactly(tmp_path, gloo_one):
    """Saved at step 2 by torchtitan's CheckpointManager, loaded into a fresh model: steps 3-4 give the same
    losses, masks and counters (the counters saved are those of step 2, not of step 0)."""
    method = sl.SSTE(mvue=True, mask_refresh_interval=2)
    model = built(model_config(method))
    optimizers, schedulers = optimizers_of(model)
    tt.attach([model], optimizers)
    saver = checkpointer(model, optimizers, schedulers, tmp_path)
    train(model, optimizers, schedulers, 2)
    at_save = [layer.counters() for _, layer in sparse_layers(model)]
    assert saver.save(curr_step=2)
    saver.maybe_wait_for_staging()
    later = train(model, optimizers, schedulers, 2, first=2)

    resumed = built(model_config(method), seed=7)  # other weights, masks and seeds: all must come back
    opt2, sched2 = optimizers_of(resumed)
    tt.attach([resumed], opt2)
    assert checkpointer(resumed, opt2, sched2, tmp_path).load(step=2)
    assert [layer.counters() for _, layer in sparse_layers(resumed)] == at_save
    assert at_save[0]["step"] == 2 and at_save[0]["mvue_calls"] == 2
    assert train(resumed, opt2, sched2, 2, first=2) == later
    for (_, a), (_, b) in zip(sparse_layers(model), sparse_layers(resumed)):
        assert torch.equal(a.mask, b.mask) and torch.equal(a.weight, b.weight) and a.counters() == b.counters()


def test_the_job_config_section_and_the_metrics():
    config = ConfigManager().parse_args(["--module", "sparsity_lab.integrations.torchtitan", "--config",
                                         "llama3_debugmodel", "--sparsity24.method", "masked_decay",
                                         "--sparsity24.decay", "0.01", "--training.steps", "12"])
    assert isinstance(config, tt.Sparsity24Trainer.Config) and config.activation_checkpoint is None
    assert config.training.disable_cuda_graphs
    method = tt.method_from_config(config.sparsity24, config.training.steps)
    assert method.name == "masked_decay" and method.decay == 0.01 and method.dense_finetune_step == 10
    with pytest.raises(ValueError, match="sparsity24.method 'sste' does not take these options"):
        tt.method_from_config(tt.Sparsity24Config(method="sste", decay=0.1), 10)

    model = built(model_config(sl.STE()))
    optimizers, schedulers = optimizers_of(model)
    tt.attach([model], optimizers)
    assert tt.sparsity_metrics([model]) == {"sparsity/dense_phase": 0.0}  # one mask each: no flips yet
    train(model, optimizers, schedulers, 2)
    metrics = tt.sparsity_metrics([model])
    assert 0 < metrics["sparsity/flip_rate"] < 0.5 and metrics["sparsity/dense_phase"] == 0.0


def test_what_the_layers_do_not_support_is_refused():
    class Dims:
        tp_enabled, pp_enabled, dp_replicate_enabled = True, False, False

    with pytest.raises(ValueError, match="this job enables tensor parallel"):
        tt.check_parallelism(Dims())
    layer = built(model_config(sl.STE())).layers["0"].feed_forward.w1
    with pytest.raises(ValueError, match="tensor parallel is not supported for 2:4 layers"):
        layer.parallelize(Dims())
    config = model_config(sl.STE())
    with pytest.raises(ValueError, match="is a 2:4 layer already"):
        tt.Sparsity24Converter.Config(method=sl.STE()).build().convert(config)
    cfg = ConfigManager().parse_args(["--module", "sparsity_lab.integrations.torchtitan", "--config",
                                      "llama3_debugmodel"])
    cfg.training.disable_cuda_graphs = False
    with pytest.raises(ValueError, match="run with --training.disable_cuda_graphs"):
        tt.Sparsity24Trainer(cfg)


def test_torchtitan_0_2_gets_a_clear_import_error(monkeypatch):
    import importlib

    monkeypatch.setitem(sys.modules, "torchtitan.protocols.model", None)  # 0.2 has no such module
    monkeypatch.delitem(sys.modules, "sparsity_lab.integrations.torchtitan")
    with pytest.raises(ImportError, match=r"needs torchtitan 0.3 .*pip install 'torchtitan>=0.3,<0.4'"):
        importlib.import_module("sparsity_lab.integrations.torchtitan")


@pytest.fixture
def gloo_one(tmp_path_factory):
    """A one-process gloo group (torchtitan's checkpointer saves collectively)."""
    if dist.is_initialized():
        yield
        return
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _fsdp_rank(rank, world, store, out):
    """One rank: torchtitan's FSDP2 (parallelize_llama, shard degree 2) over the 2:4 debug model."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import parallel_dims as parallel_dims_module
    from torchtitan.models.llama3 import parallelize_llama

    parallel_dims_module.device_type = "cpu"  # torchtitan picks "cuda" on a machine without accelerators
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    parallelism = ParallelismConfig(spmd_backend="partial_dtensor", data_parallel_shard_degree=world)
    dims = ParallelDims.from_config(parallelism, world)
    tt.check_parallelism(dims)
    with torch.device("meta"):
        model = model_config(sl.SRSTE(mask_refresh_interval=2)).build()
    parallelize_llama(model, parallel_dims=dims, training=TrainingConfig(mixed_precision_param="float32"),
                      parallelism=parallelism, compile_config=CompileConfig(), ac_config=None,
                      dump_folder=str(out))
    for module in model.modules():  # torchtitan sums the ranks' gradients; gloo has no pre-scaled sum
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    initial = {name: p.full_tensor() for name, p in model.named_parameters()}  # DTensor init: its own draws
    initial_masks = {name: layer.mask.full_tensor() for name, layer in sparse_layers(model)}
    optimizers, schedulers = optimizers_of(model)
    tt.attach([model], optimizers)
    half = slice(rank * 2, rank * 2 + 2)  # each rank half of the batch
    losses = train(model, optimizers, schedulers, STEPS, rows=half, share=1 / world, clip=False)
    layer = model.layers["0"].feed_forward.w2
    assert isinstance(layer.mask, DTensor) and layer.mask.to_local().shape[0] == layer.out_features // world
    state = {name: {"mask": layer.mask.full_tensor(), "weight": layer.weight.full_tensor(),
                    "counters": layer.counters(), "flips": layer.flips_total}
             for name, layer in sparse_layers(model)}
    if rank == 0:
        torch.save({"losses": losses, "state": state, "initial": initial, "initial_masks": initial_masks},
                   out / "rank0.pt")
    dist.destroy_process_group()


def test_two_processes_with_torchtitans_fsdp2_train_as_one(tmp_path):
    """2 processes (gloo, CPU), torchtitan's FSDP2 over the 2:4 model, each rank half of every batch: the
    initial masks are those one process computes from the same weights, and after training the weights, masks
    and counters are those of one process on the whole batch (float32, to rounding)."""
    mp.spawn(_fsdp_rank, args=(2, str(tmp_path / "store"), tmp_path), nprocs=2, join=True)
    got = torch.load(tmp_path / "rank0.pt")
    model = built(model_config(sl.SRSTE(mask_refresh_interval=2)))
    with torch.no_grad():  # the sharded run's initial weights; the sparse state restarted from them
        for name, p in model.named_parameters():
            p.copy_(got["initial"][name])
        for name, layer in sparse_layers(model):
            layer.start_from_weights()
            assert torch.equal(layer.mask, got["initial_masks"][name]), name  # the sharded init's mask
    optimizers, schedulers = optimizers_of(model)
    tt.attach([model], optimizers)
    losses = train(model, optimizers, schedulers, STEPS, clip=False)
    for name, layer in sparse_layers(model):
        ranked = got["state"][name]
        # the same training to rounding: AdamW turns a rounding-size gradient into a step of size lr, so a
        # few weights near a tie of their group of 4 land on the other side
        agree = (ranked["mask"] == layer.mask).float().mean().item()
        assert agree > 0.995, (name, agree)
        torch.testing.assert_close(ranked["weight"], layer.weight.detach(), rtol=0, atol=5 * 1e-3)
        schedule = ("step", "mask_step", "mask_updates", "mvue_calls")
        assert [ranked["counters"][k] for k in schedule] == [layer.counters()[k] for k in schedule], name
        assert abs(ranked["flips"] - layer.flips_total) <= 0.01 * layer.mask.numel(), name
    assert len(got["losses"]) == len(losses) == STEPS


def test_the_recorder_parses_and_checks_24():
    """torchtitan_record: its configs parse to RecordingTrainer's, and its 2:4 check fails a 3-of-4 mask."""
    from benchmarks import torchtitan_record as rec

    config = ConfigManager().parse_args(["--module", "benchmarks.torchtitan_record", "--config",
                                         "llama3_debugmodel", "--sparsity24.method", "dense"])
    assert isinstance(config, rec.RecordingTrainer.Config) and config.sparsity24.method == "dense"
    model = built(model_config(sl.STE()))
    assert rec.check_24([model]) == {"layers": 6, "masks_exactly_2_of_4": True, "dense_now": []}
    with torch.no_grad():
        model.layers["0"].feed_forward.w1.mask[0, :4] = True
    assert rec.check_24([model])["masks_exactly_2_of_4"] is False
