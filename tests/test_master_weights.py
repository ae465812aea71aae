"""bf16 weights with float32 master weights (``sparsity_lab.lab.master_weights``): exact on the CPU."""
import copy

import pytest
import torch
from torch import nn

import sparsity_lab as sl
from sparsity_lab.lab.master_weights import MasterWeights, linear_weights, lower_linear_weights


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 8, bias=False))


def _grads(model: nn.Module, step: int) -> list[torch.Tensor]:
    """Gradients as a bf16 run gives them: bf16 for the lowered weights, float32 for the rest."""
    gen = torch.Generator().manual_seed(100 + step)
    low = {id(p) for p in linear_weights(model)}
    return [torch.randn(p.shape, generator=gen).to(torch.bfloat16 if id(p) in low else torch.float32)
            for p in model.parameters()]


def _float64_adamw(steps: int, device="cpu", **hyper) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """AdamW in float64 fed the same gradients for ``steps`` steps: each parameter's final value and the
    sum over the steps of its moves |w_t - w_{t-1}| (the yardstick of float32 rounding, see _rounding_bound)."""
    model = _model().double().to(device)
    opt = torch.optim.AdamW(model.parameters(), foreach=False, **hyper)
    moved = [torch.zeros_like(p) for p in model.parameters()]
    for step in range(steps):
        before = [p.detach().clone() for p in model.parameters()]
        for p, g in zip(model.parameters(), _grads(model, step)):
            p.grad = g.double().to(device)
        opt.step()
        for total, p, b in zip(moved, model.parameters(), before):
            total += (p.detach() - b).abs()
    return [p.detach() for p in model.parameters()], moved


def _rounding_bound(exact: torch.Tensor, moved: torch.Tensor, steps: int) -> torch.Tensor:
    """How far a float32 AdamW may end from the float64 one: each step rounds its few operations (decay,
    moments, the update, the subtraction) to within a few half-ulps of the weight and of the step's move;
    ``steps`` steps add up. 2 eps per step and unit of |w| + sum |move|: measured errors of PyTorch's
    float32 AdamW (foreach and loop) and of the fused kernel's reference are at most 0.6 eps of it."""
    return 2 * torch.finfo(torch.float32).eps * steps * (exact.abs() + moved)


def _step_both(model, wrapped, reference, ref_opt, step):
    for p, r, g in zip(model.parameters(), reference.parameters(), _grads(model, step)):
        p.grad, r.grad = g.clone(), g.float()  # the same gradient, exactly, in float32 for the reference
    wrapped.step()
    ref_opt.step()
    wrapped.zero_grad(set_to_none=True)
    ref_opt.zero_grad(set_to_none=True)


def test_masters_follow_float32_adamw_bit_for_bit_and_weights_are_them_rounded():
    model, reference = _model(), _model()
    opt = lower_linear_weights(model, torch.optim.AdamW, lr=1e-2, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    low = linear_weights(model)
    assert [p.dtype for p in low] == [torch.bfloat16, torch.bfloat16]
    assert model[1].weight.dtype == torch.float32 and model[0].bias.dtype == torch.float32  # not lowered
    for step in range(5):
        _step_both(model, opt, reference, ref_opt, step)
        for p, r in zip(model.parameters(), reference.parameters()):
            assert torch.equal(opt.master(p), r.detach())  # the master is what float32 training holds
            assert torch.equal(p.detach(), r.detach().to(p.dtype))  # the working weight: the master rounded


def test_the_scheduler_reaches_the_inner_optimizer():
    model, reference = _model(), _model()
    opt = lower_linear_weights(model, torch.optim.AdamW, lr=1e-2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + s)) for o in (opt, ref_opt)]
    for step in range(4):
        _step_both(model, opt, reference, ref_opt, step)
        for s in scheds:
            s.step()
    # the inner optimizer took the lr of the last step (1 / 4), the wrapper holds the next one (1 / 5)
    assert opt.inner.param_groups[0]["lr"] == pytest.approx(1e-2 / 4)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 / 5)
    for p, r in zip(model.parameters(), reference.parameters()):
        assert torch.equal(opt.master(p), r.detach())


def test_state_dict_resumes_bit_for_bit():
    model, reference = _model(), _model()
    opt = lower_linear_weights(model, torch.optim.AdamW, lr=1e-2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    for step in range(2):
        _step_both(model, opt, reference, ref_opt, step)
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    resumed = _model(seed=1)  # other weights: everything must come from the state dicts
    resumed_opt = lower_linear_weights(resumed, torch.optim.AdamW, lr=1e-2)
    resumed.load_state_dict(saved_model)
    resumed_opt.load_state_dict(saved_opt)
    for step in range(2, 4):
        _step_both(model, opt, reference, ref_opt, step)
        for p, g in zip(resumed.parameters(), _grads(resumed, step)):
            p.grad = g.clone()
        resumed_opt.step()
    for p, q in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(p, q) and torch.equal(opt.master(p), resumed_opt.master(q))
    with pytest.raises(ValueError, match="not a MasterWeights state_dict"):
        resumed_opt.load_state_dict(torch.optim.AdamW(reference.parameters()).state_dict())


@pytest.mark.parametrize("fused_update", [False, True])
def test_a_parameter_without_gradient_is_left_alone(fused_update):
    model = _model()
    opt = lower_linear_weights(model, torch.optim.AdamW, fused_update=fused_update, lr=1e-2)
    before, master_before = model[2].weight.detach().clone(), opt.master(model[2].weight).clone()
    first = model[0].weight.detach().clone()
    for p, g in zip(model.parameters(), _grads(model, 0)):
        p.grad = g
    model[2].weight.grad = None
    opt.step()
    assert torch.equal(model[2].weight, before) and torch.equal(opt.master(model[2].weight), master_before)
    assert not torch.equal(model[0].weight, first)
    assert opt.master(model[2].weight) not in opt.inner.state  # no state made for it


def test_bad_input_is_named():
    model = _model()
    with pytest.raises(ValueError, match="dtype must be one of"):
        MasterWeights(model.parameters(), [model[0].weight], dtype=torch.float64)
    with pytest.raises(ValueError, match="not among params"):
        MasterWeights(model[0].parameters(), [model[2].weight])
    model[2].weight.data = model[2].weight.data.to(torch.bfloat16)
    with pytest.raises(ValueError, match="must be float32 now"):
        MasterWeights(model.parameters(), [model[2].weight])


def test_2to4_layers_train_on_their_bf16_weights():
    """S-STE + MVUE under bf16 autocast on the CPU: the hooks advance the layers, the masks are those of the
    bf16 weights, and the masked decay of MaskedDecay lands on the bf16 gradient."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.GELU(), nn.Linear(32, 16, bias=False))
    sl.sparsify(model, sl.SSTE(mvue=True, transposable=True), select="all")
    opt = lower_linear_weights(model, torch.optim.AdamW, lr=1e-2)
    sl.attach_optimizer(model, opt)
    x = torch.randn(64, 16)
    for _ in range(3):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        loss.backward()
        assert model[0].weight.grad.dtype == torch.bfloat16
        opt.step()
        opt.zero_grad(set_to_none=True)
    layer = model[0]
    assert layer.step == 3 and layer.weight.dtype == torch.bfloat16 and layer.beta.dtype == torch.float32
    layer.refresh_mask()
    assert torch.equal(layer.mask, layer.backend.mask(layer.weight.detach(), 2, 4, True))

    decayed = nn.Sequential(nn.Linear(16, 16, bias=False))
    sl.sparsify(decayed, sl.MaskedDecay(decay=0.5, total_steps=10), select="all")
    dopt = lower_linear_weights(decayed, torch.optim.SGD, lr=0.0)
    sl.attach_optimizer(decayed, dopt)
    w = decayed[0].weight
    w.grad = torch.zeros_like(w)
    dopt.step()  # the pre-hook adds 0.5 * (1 - m) * W to the bf16 gradient
    assert torch.equal(w.grad, (0.5 * (~decayed[0].mask) * w.detach()).to(torch.bfloat16))


# --- the fused update (kernel 20, through Triton's interpreter on the CPU) -------------------------------------
def _bf16_ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many bf16 values lie between a and b (both bf16, finite, of one sign per entry)."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


def test_fused_update_equals_float32_adamw_on_the_masters_then_cast():
    """The reference is plain PyTorch: AdamW over float32 weights fed the bf16 gradients, then the cast."""
    model, reference = _model(), _model()
    opt = lower_linear_weights(model, torch.optim.AdamW, fused_update=True, lr=1e-2, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    assert opt.fused_update
    low = {id(p) for p in linear_weights(model)}
    exact, moved = _float64_adamw(4, lr=1e-2, weight_decay=0.1)
    for step in range(4):
        _step_both(model, opt, reference, ref_opt, step)
        for p, r in zip(model.parameters(), reference.parameters()):
            if id(p) not in low:  # float32 parameters: the inner AdamW, as without the wrapper
                assert torch.equal(p.detach(), r.detach())
                continue
            master = opt.master(p)
            if step == 3:  # float32 rounding (PyTorch's own AdamW orders the operations otherwise)
                i = [id(q) for q in model.parameters()].index(id(p))
                bound = _rounding_bound(exact[i], moved[i], steps=4)
                assert bool(((master.double() - exact[i]).abs() <= bound).all())
                assert bool(((r.detach().double() - exact[i]).abs() <= bound).all())  # the bound is fair
            assert torch.equal(p.detach(), master.to(torch.bfloat16))  # the working weight: its master rounded
            assert int(_bf16_ulps_apart(p.detach(), r.detach().to(torch.bfloat16)).max()) <= 1
            state = opt.inner.state[master]  # the inner AdamW's state, as AdamW keeps it
            assert int(state["step"]) == step + 1 and state["exp_avg"].dtype == torch.float32
            assert torch.allclose(state["exp_avg_sq"], ref_opt.state[r]["exp_avg_sq"], rtol=1e-6, atol=0)


def test_fused_update_resumes_bit_for_bit_and_shares_the_state_format():
    def grads_into(model, step):
        for p, g in zip(model.parameters(), _grads(model, step)):
            p.grad = g.clone()

    model = _model()
    opt = lower_linear_weights(model, torch.optim.AdamW, fused_update=True, lr=1e-2)
    for step in range(2):
        grads_into(model, step)
        opt.step()
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    resumed = _model(seed=1)
    resumed_opt = lower_linear_weights(resumed, torch.optim.AdamW, fused_update=True, lr=1e-2)
    resumed.load_state_dict(saved_model)
    resumed_opt.load_state_dict(saved_opt)
    for step in range(2, 4):
        for m, o in ((model, opt), (resumed, resumed_opt)):
            grads_into(m, step)
            o.step()
    for p, q in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(p, q) and torch.equal(opt.master(p), resumed_opt.master(q))
    # the unfused update reads the same state: it continues from step 4, not from scratch
    plain = _model(seed=2)
    plain_opt = lower_linear_weights(plain, torch.optim.AdamW, fused_update=False, lr=1e-2)
    plain.load_state_dict(model.state_dict())
    plain_opt.load_state_dict(opt.state_dict())
    grads_into(plain, 4)
    plain_opt.step()
    assert int(plain_opt.inner.state[plain_opt.master(plain[0].weight)]["step"]) == 5


def test_fused_update_takes_the_masked_decay_in_its_pass(monkeypatch):
    """MaskedDecay with the fused update: the pre-hook hands the term to the optimizer (no pass of its own over the
    bf16 gradient) and the kernel adds decay * (1 - m) * W in float32: the reference's masters, bit for bit."""
    from sparsity_lab.backends.torch_reference import TorchBackend
    from sparsity_lab.references.adamw_master import adamw_master_step_
    from sparsity_lab.training_hooks import gradient_decay_now

    def decayed(seed=0):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.Linear(32, 16, bias=False))
        sl.sparsify(model, sl.MaskedDecay(decay=0.3, total_steps=10), select="all")
        return model

    passes = []
    real_pass = TorchBackend.masked_decay_
    monkeypatch.setattr(TorchBackend, "masked_decay_", lambda self, *a: passes.append(1) or real_pass(self, *a))
    hyper = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    model, plain = decayed(), decayed()
    opt = lower_linear_weights(model, torch.optim.AdamW, fused_update=True, **hyper)
    plain_opt = lower_linear_weights(plain, torch.optim.AdamW, fused_update=False, **hyper)
    for m, o in ((model, opt), (plain, plain_opt)):
        sl.attach_optimizer(m, o)
    layers = [model[0], model[1]]
    ref = [{"low": l.weight.detach().clone(), "master": opt.master(l.weight).clone(), "m": torch.zeros(l.weight.shape),
            "v": torch.zeros(l.weight.shape), "mask": l.mask.clone()} for l in layers]
    gen = torch.Generator().manual_seed(7)
    for step in range(1, 4):
        grads = [(torch.randn(l.weight.shape, generator=gen) * 1e-2).to(torch.bfloat16) for l in layers]
        for layer, q, g in zip(layers, plain, grads):
            layer.weight.grad, q.weight.grad = g.clone(), g.clone()
        assert gradient_decay_now(layers[0]) == pytest.approx(0.3)
        opt.step()
        assert not passes  # the fused update: no masked-decay pass
        assert all(torch.equal(layer.weight.grad, g) for layer, g in zip(layers, grads))  # the bf16 gradient untouched
        plain_opt.step()
        assert len(passes) == 2  # the unfused update: one pass per layer
        passes.clear()
        for r, g in zip(ref, grads):
            adamw_master_step_(r["low"], g, r["master"], r["m"], r["v"], step=step, lr=1e-2, beta1=0.9, beta2=0.95,
                               eps=1e-8, weight_decay=0.1, mask=r["mask"], decay=0.3)
        for layer, r in zip(layers, ref):
            assert torch.equal(opt.master(layer.weight), r["master"]) and torch.equal(layer.weight.detach(), r["low"])
    # against the unfused update, whose pass rounds the decayed gradient to bf16 before AdamW normalises it (the
    # masters then follow the reference fed that gradient): apart by a few hundredths of the three steps' moves of
    # lr each (3.4e-4 of 3e-2 measured), where a missing or misplaced decay moves pruned weights by up to lr a step
    for layer, q in zip(layers, plain):
        assert (opt.master(layer.weight) - plain_opt.master(q.weight)).abs().max().item() <= 3 * 1e-2 * 2**-5
    # a step on the same gradient again (no zero_grad) takes the term of that step's W (the unfused update, whose
    # gradient already holds the previous step's term, does not add it twice and keeps the old one)
    opt.step()
    for layer, r, g in zip(layers, ref, grads):
        adamw_master_step_(r["low"], g, r["master"], r["m"], r["v"], step=4, lr=1e-2, beta1=0.9, beta2=0.95,
                           eps=1e-8, weight_decay=0.1, mask=r["mask"], decay=0.3)
        assert torch.equal(opt.master(layer.weight), r["master"])
    assert all(layer.step == 4 for layer in layers)


def test_a_nested_step_hands_the_masked_decay_over_once():
    """An optimizer class whose step calls super().step() runs the pre-hook at each level: the term still joins the
    update once (the reference's master after one step, bit for bit)."""
    from sparsity_lab.references.adamw_master import adamw_master_step_

    class Nested(MasterWeights):
        def step(self, closure=None):
            return super().step(closure)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32, bias=False))
    sl.sparsify(model, sl.MaskedDecay(decay=0.3, total_steps=10), select="all")
    opt = Nested(model.parameters(), linear_weights(model), fused_update=True, lr=1e-2, weight_decay=0.0)
    sl.attach_optimizer(model, opt)
    layer = model[0]
    low, master, mask = layer.weight.detach().clone(), opt.master(layer.weight).clone(), layer.mask.clone()
    g = (torch.randn(layer.weight.shape) * 1e-2).to(torch.bfloat16)
    layer.weight.grad = g.clone()
    opt.step()
    m, v = torch.zeros(master.shape), torch.zeros(master.shape)
    adamw_master_step_(low, g, master, m, v, step=1, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                       mask=mask, decay=0.3)
    assert torch.equal(opt.master(layer.weight), master) and layer.step == 1


def test_fused_update_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="fused_update=True: the fused update is AdamW's"):
        lower_linear_weights(_model(), torch.optim.SGD, fused_update=True, lr=1e-2)
    with pytest.raises(ValueError, match="fused_update=True: the fused update has no amsgrad"):
        lower_linear_weights(_model(), torch.optim.AdamW, fused_update=True, amsgrad=True)
    with pytest.raises(ValueError, match="fused_update must be None, True or False"):
        lower_linear_weights(_model(), torch.optim.AdamW, fused_update="yes")
    untouched = _model()
    with pytest.raises(ValueError, match="fused_update=True: the fused update writes bf16"):
        lower_linear_weights(untouched, torch.optim.AdamW, dtype=torch.float16, fused_update=True)
    assert untouched[0].weight.dtype == torch.float32  # refused before any weight was lowered
    assert not lower_linear_weights(_model(), torch.optim.AdamW).fused_update  # by default: only on CUDA


def test_decay_on_weights_after_the_step_is_refused():
    model = nn.Sequential(nn.Linear(16, 16, bias=False))
    sl.sparsify(model, sl.MaskedDecayOnWeights(decay=0.1, total_steps=10), select="all")
    with pytest.raises(ValueError, match="after the\\s+optimizer step"):
        lower_linear_weights(model, torch.optim.AdamW)


# --- the lab trainer's --bf16-weights and --compile ------------------------------------------------------------
def _trainer_config(**kw):
    from _lab_testing import tiny_config

    from sparsity_lab.lab import GPTConfig

    tiny = GPTConfig(n_layer=1, n_head=2, d_model=16, context=16)
    return tiny_config(tiny, **{"method": "sste", "method_options": {"mvue": True, "transposable": True},
                                "steps": 6, "eval_interval": 3, "eval_batches": 1, "precision": "bf16", **kw})


@pytest.fixture(scope="module")
def corpus():
    from sparsity_lab.lab import load_corpus

    return load_corpus(max_bytes=100_000)


def test_trainer_bf16_weights_resume_bit_for_bit(tmp_path, corpus):
    from _lab_testing import without_speed

    from sparsity_lab.lab import Trainer

    straight = Trainer(_trainer_config(bf16_weights=True), corpus=corpus)
    straight.run()
    assert isinstance(straight.optimizer, MasterWeights)
    assert straight.model.blocks[0].mlp.fc.weight.dtype == torch.bfloat16
    assert straight.model.blocks[0].ln1.weight.dtype == torch.float32
    ckpt = tmp_path / "ck.pt"
    first = Trainer(_trainer_config(bf16_weights=True, checkpoint_path=str(ckpt)), corpus=corpus)
    first.run(stop_at=3)
    first.close()
    resumed = Trainer.resume(ckpt, corpus=corpus)
    resumed.run()
    assert without_speed(resumed.history) == without_speed(straight.history[3:])
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))


def test_trainer_options_are_checked():
    from sparsity_lab.lab import Trainer

    with pytest.raises(ValueError, match="bf16_weights=True .* precision 'fp32'"):
        _trainer_config(bf16_weights=True, precision="fp32")
    with pytest.raises(ValueError, match="--precision bf16"):
        Trainer(_trainer_config(bf16_weights=True, precision="auto"))  # the CPU computes in float32
    with pytest.raises(ValueError, match="compile=True .* cuda_graph=True"):
        _trainer_config(compile=True, cuda_graph=True)
    with pytest.raises(ValueError, match="compile must be True or False"):
        _trainer_config(compile="yes")


def test_trainer_compile_runs_the_forward_compiled(monkeypatch, corpus):
    """--compile: the training forward goes through torch.compile (aot_eager here: no C++ build), the
    evaluation and the checkpoint through the model itself, and the run follows the eager one."""
    import functools

    from sparsity_lab.lab import Trainer

    compiled = []
    real = torch.compile

    def compile_(model, **kw):
        compiled.append(model)
        return real(model, **{**kw, "backend": "aot_eager"})
    monkeypatch.setattr(torch, "compile", functools.wraps(real)(compile_))
    eager = Trainer(_trainer_config(steps=3, bf16_weights=True), corpus=corpus)
    eager.run()
    trainer = Trainer(_trainer_config(steps=3, compile=True, bf16_weights=True), corpus=corpus)
    trainer.run()
    assert compiled == [trainer.model] and trainer.forward_model is not trainer.model
    assert not any(k.startswith("_orig_mod") for k in trainer.state_dict()["model"])
    for a, b in zip(eager.history, trainer.history):
        assert a["loss"] == pytest.approx(b["loss"], rel=2e-2)


def test_cli_flags_reach_the_config():
    from sparsity_lab.lab.cli import build_parser
    from sparsity_lab.lab.options import config_from_args

    args = build_parser("train").parse_args(["train", "--bf16-weights", "--compile", "--precision", "bf16"])
    cfg = config_from_args(args)
    assert cfg.bf16_weights and cfg.compile
    assert not config_from_args(build_parser("train").parse_args(["train"])).bf16_weights


@pytest.mark.gpu
def test_cuda_fused_adamw_masters_match_float32_training_and_2to4_layers_run():
    """On the GPU: with the unfused update the masters under the fused AdamW follow a float32 fused AdamW fed the
    same gradients bit for bit; the fused update (the default on CUDA) follows it to float32 rounding, its bf16
    weights the masters rounded; and S-STE + MVUE on the cusparselt backend trains on the bf16 weights."""
    model, fused_model, reference = _model().cuda(), _model().cuda(), _model().cuda()
    opt = lower_linear_weights(model, torch.optim.AdamW, fused_update=False, lr=1e-2, fused=True)
    fused_opt = lower_linear_weights(fused_model, torch.optim.AdamW, lr=1e-2, fused=True)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, fused=True)
    assert fused_opt.fused_update and not opt.fused_update
    for step in range(3):
        for p, q, r, g in zip(model.parameters(), fused_model.parameters(), reference.parameters(),
                              _grads(model, step)):
            p.grad, q.grad, r.grad = g.cuda(), g.cuda(), g.float().cuda()
        opt.step()
        fused_opt.step()
        ref_opt.step()
    exact, moved = _float64_adamw(3, device="cuda", lr=1e-2)
    lowered = {id(q) for q in linear_weights(fused_model)}
    for p, q, r, e, mv in zip(model.parameters(), fused_model.parameters(), reference.parameters(), exact, moved):
        assert torch.equal(opt.master(p), r.detach()) and torch.equal(p.detach(), r.detach().to(p.dtype))
        if id(q) not in lowered:  # float32 parameters: PyTorch's fused AdamW in both
            assert torch.equal(q.detach(), r.detach())
            continue
        # the kernel rounds in another order than PyTorch's fused AdamW: it is held to float32 rounding of
        # float64 AdamW (PyTorch's fused CUDA AdamW itself was seen up to about 2x this bound on an H200)
        bound = _rounding_bound(e, mv, steps=3)
        assert bool(((fused_opt.master(q).double() - e).abs() <= bound).all())
        assert torch.equal(q.detach(), fused_opt.master(q).to(q.dtype))

    torch.manual_seed(0)
    ffn = nn.Sequential(nn.Linear(256, 1024, bias=False), nn.GELU(), nn.Linear(1024, 256, bias=False)).cuda()
    sl.sparsify(ffn, sl.SSTE(mvue=True, transposable=True, backend="cusparselt"), select="all")
    opt = lower_linear_weights(ffn, torch.optim.AdamW, lr=1e-3, fused=True)
    sl.attach_optimizer(ffn, opt)
    x = torch.randn(512, 256, device="cuda")
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = ffn(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert torch.isfinite(loss) and ffn[0].step == 3 and ffn[0].weight.dtype == torch.bfloat16
