"""The torchtitan converter (torchtitan 0.2's ModelConverter protocol), driven as torchtitan's own trainer drives
it: its config parser, its Llama debug model (shrunk) built on the meta device, converters, to_empty, init_weights, its
optimizer and LR-scheduler containers with the post-optimizer hook, its loss and gradient clipping; on the CPU
in a one-process gloo group."""
import copy
import importlib
import re
import sys

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("torchtitan.protocols.model_converter", reason="the converter needs torchtitan 0.2")

from torchtitan.components.loss import cross_entropy_loss  # noqa: E402
from torchtitan.components.lr_scheduler import build_lr_schedulers  # noqa: E402
from torchtitan.components.optimizer import build_optimizers  # noqa: E402
from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.distributed import ParallelDims  # noqa: E402
from torchtitan.distributed.utils import clip_grad_norm_  # noqa: E402
from torchtitan.models.llama3 import Transformer, llama3_args  # noqa: E402
from torchtitan.protocols.model_converter import build_model_converters  # noqa: E402

import sparsity_lab as sl  # noqa: E402
from sparsity_lab.integrations import torchtitan as tt  # noqa: E402
from sparsity_lab.training_hooks import sparse_layers  # noqa: E402

STEPS = 4
ONE_PROCESS = dict(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)


@pytest.fixture(scope="module", autouse=True)
def gloo_group(tmp_path_factory):
    if dist.is_initialized():  # a group of the caller's: use it, leave it
        yield
        return
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def job_config(*options):
    return ConfigManager().parse_args(["--job.custom_config_module", "sparsity_lab.integrations.torchtitan",
                                       "--model.converters", "sparsity24", "--training.steps", str(STEPS),
                                       "--training.seq_len", "32", *options])


def debug_model(jc, on_meta):
    """torchtitan's Llama 3 debug model, shrunk to 2 layers of width 64 and 256 tokens (CI time)."""
    args = copy.deepcopy(llama3_args["debugmodel"])
    args.dim, args.n_layers, args.n_heads, args.vocab_size, args.multiple_of = 64, 2, 4, 256, 16
    args.update_from_config(jc)
    with torch.device("meta" if on_meta else "cpu"):
        return Transformer(args)


def initialise(model):
    """What torchtitan's trainer does after parallelize: to_empty, then init_weights under no_grad."""
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))


def train(model, jc, post_hook=None, attach=False):
    """torchtitan's step: loss (summed, over tokens), backward, clip, optimizers.step, schedulers.step."""
    pd = ParallelDims(**ONE_PROCESS)
    optimizers = build_optimizers([model], jc.optimizer, pd)
    schedulers = build_lr_schedulers(optimizers, jc.lr_scheduler, jc.training.steps)
    if post_hook is not None:  # as torchtitan.train.Trainer registers it
        optimizers.register_step_post_hook(lambda *args, **kwargs: post_hook([model]))
    if attach:
        sl.attach_optimizer(model, optimizers.optimizers[0])
    x = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(STEPS):
        loss = cross_entropy_loss(model(x[:, :-1]), x[:, 1:]) / x[:, 1:].numel()
        loss.backward()
        clip_grad_norm_(list(model.parameters()), jc.training.max_norm)
        optimizers.step()
        schedulers.step()
        optimizers.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("options", [["--sparsity24.method", "sste", "--sparsity24.mvue"],
                                     ["--sparsity24.method", "srste", "--sparsity24.transposable",
                                      "--sparsity24.mask_refresh_interval", "2"]])
def test_converter_in_torchtitans_flow_equals_sparsify_and_attach_optimizer(options):
    jc = job_config(*options)
    converters = build_model_converters(jc, ParallelDims(**ONE_PROCESS))
    model = debug_model(jc, on_meta=True)
    converters.convert(model)
    assert not sparse_layers(model)  # on the meta device: nothing to compute a mask from yet
    initialise(model)
    names = [name for name, _ in sparse_layers(model)]
    assert names == [f"layers.{i}.feed_forward.{w}" for i in range(2) for w in ("w1", "w2", "w3")]
    attention = [m for n, m in model.named_modules() if re.search(r"\.attention\.w[qkvo]$", n)]
    assert len(attention) == 8 and all(type(m) is torch.nn.Linear for m in attention)  # attention stays dense
    losses = train(model, jc, post_hook=converters.post_optimizer_hook)
    assert all(layer.step == STEPS for _, layer in sparse_layers(model))  # the post-optimizer hook ran

    # the same model and step made 2:4 by hand, with the lab's own optimizer hooks
    reference = debug_model(jc, on_meta=False)
    initialise(reference)
    method = converters.converters[0].method
    sl.sparsify(reference, method, select=lambda name, m: tt.FEED_FORWARD.search(name) is not None)
    assert losses == train(reference, jc, attach=True)
    for (_, a), (_, b) in zip(sparse_layers(model), sparse_layers(reference)):
        assert torch.equal(a.mask, b.mask) and torch.equal(a.weight, b.weight) and a.counters() == b.counters()
    assert losses[-1] < losses[0]


def test_filter_fqns_and_a_real_model_converted_at_once():
    jc = job_config("--sparsity24.filter_fqns", "layers.0.")
    model = debug_model(jc, on_meta=False)
    build_model_converters(jc, ParallelDims(**ONE_PROCESS)).convert(model)
    names = [name for name, _ in sparse_layers(model)]
    assert len(names) == 3 and not any(n.startswith("layers.0.") for n in names)
    before = sparse_layers(model)[0][1].mask.clone()
    initialise(model)  # new weights: the masks restart from them
    layer = sparse_layers(model)[0][1]
    assert layer.step == 0 and not torch.equal(before, layer.mask)
    assert torch.equal(layer.mask, sl.nm_mask(layer.weight.detach(), 2, 4))


@pytest.mark.parametrize("options,message", [
    (["--sparsity24.method", "masked_decay"], "has a post-step hook only"),
    (["--sparsity24.method", "masked_decay_weights"], "needs the step's learning rate"),
    (["--sparsity24.method", "sgd"], "unknown method 'sgd'"),
])
def test_what_the_protocol_cannot_carry_is_refused(options, message):
    with pytest.raises(ValueError, match=message):
        build_model_converters(job_config(*options), ParallelDims(**ONE_PROCESS))


def test_sharded_jobs_are_refused():
    sharded = ParallelDims(**{**ONE_PROCESS, "dp_shard": 2, "world_size": 2})
    with pytest.raises(ValueError, match=r"runs on one process; this job enables \['fsdp'"):
        build_model_converters(job_config(), sharded)


def test_torchtitan_0_3_gets_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchtitan.protocols.model_converter", None)  # 0.3 has no such module
    monkeypatch.delitem(sys.modules, "sparsity_lab.integrations.torchtitan")
    with pytest.raises(ImportError, match="0.3 replaced it by ModelConfigConverter"):
        importlib.import_module("sparsity_lab.integrations.torchtitan")


def test_the_recorders_24_check_sees_a_layer_that_is_not_24():
    """torchtitan_record's per-step check: passes on the converted model, fails when a mask keeps 3 of 4."""
    from benchmarks.torchtitan_record import check_24

    jc = job_config("--sparsity24.method", "sste", "--sparsity24.mvue")
    model = debug_model(jc, on_meta=True)
    build_model_converters(jc, ParallelDims(**ONE_PROCESS)).convert(model)
    initialise(model)
    good = check_24([model])
    assert good == {"layers": 6, "masks_exactly_2_of_4": True, "max_nonzeros_per_4_in_used_weight": 2, "dense_now": []}
    _, layer = sparse_layers(model)[0]
    with torch.no_grad():
        layer.mask[0, :4] = 1  # 4 of 4 kept in one group
    bad = check_24([model])
    assert not bad["masks_exactly_2_of_4"]
    assert check_24([torch.nn.Linear(4, 4)])["masks_exactly_2_of_4"] is None  # nothing to check
